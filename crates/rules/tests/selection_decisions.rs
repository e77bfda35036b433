//! Install and cleanup selection as decisions, with the words a human reads.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use common::*;
use vynil_rules::{
    InstallQuery, Package, PackageContent, PackageType, ScanFilter, select_cleanup, select_install,
    selection::{
        CatalogState, CleanupDecision, CleanupQuery, Exclusion, Origins, RecordedCheck, RecordedRevision,
    },
};

fn query<'a>(installed: Option<&'a str>, framework: &'a semver::Version) -> InstallQuery<'a> {
    InstallQuery {
        jukebox: "box",
        category: "think",
        name: "ollama",
        package_type: PackageType::Tenant,
        installed_tag: installed,
        framework,
        hold_upgrades: false,
        quarantined: &[],
        withheld: &[],
    }
}

#[test]
fn each_exclusion_is_named_with_what_to_do() {
    let fw = framework("0.8.0");
    let cases: Vec<(Vec<Package>, Exclusion, &str)> = vec![
        (vec![], Exclusion::CategoryName, "no package think/ollama in JukeBox box"),
        (
            vec![
                package("0.1.10", "service", None, None),
                package("0.1.9", "service", None, None),
                package("1.0.0", "system", None, None),
            ],
            Exclusion::Type,
            "no tenant revision of think/ollama (only service: 0.1.10, 0.1.9; system: 1.0.0)",
        ),
        (
            vec![package("2.0.0", "tenant", Some("1.5.0"), None)],
            Exclusion::MinimumVersion,
            "no tenant revision of think/ollama can upgrade from installed 1.0.0: 2.0.0 needs ≥ 1.5.0",
        ),
        (
            vec![package("2.0.0", "tenant", None, Some("0.9.0"))],
            Exclusion::FrameworkVersion,
            "every tenant revision of think/ollama needs a newer vynil than 0.8.0 (2.0.0 needs vynil 0.9.0): upgrade vynil first",
        ),
    ];
    for (catalog, excluded_by, reason) in cases {
        let no_match = select_install(&catalog, &query(Some("1.0.0"), &fw)).unwrap_err();
        assert_eq!(no_match.excluded_by, excluded_by);
        assert_eq!(no_match.reason, reason);
    }
}

#[test]
fn install_picks_the_newest_whatever_the_list_order() {
    let fw = framework("0.8.0");
    let catalog = [
        package("1.0.0", "tenant", None, None),
        package("1.10.0", "tenant", None, None),
        package("1.9.0", "tenant", None, None),
    ];
    assert_eq!(select_install(&catalog, &query(None, &fw)).unwrap().tag, "1.10.0");
}

#[test]
fn a_prerelease_framework_does_not_satisfy_its_release() {
    let fw = framework("0.7.8-alpha.4");
    let catalog = [package("2.0.0", "tenant", None, Some("0.7.8")), package("1.0.0", "tenant", None, None)];
    assert_eq!(select_install(&catalog, &query(None, &fw)).unwrap().tag, "1.0.0");
}

fn recorded() -> RecordedRevision {
    RecordedRevision {
        registry: "registry.example".into(),
        image: "think/ollama".into(),
        tag: "0.1.8".into(),
        digest: digest("b"),
        package_type: PackageType::Tenant,
    }
}

struct Scenario<'a> {
    name: &'a str,
    recorded: Option<RecordedCheck>,
    catalog: CatalogState<'a>,
    has_children: bool,
    delete_without_package: bool,
    expect: fn(&CleanupDecision) -> bool,
}

#[test]
fn cleanup_decides_in_order_recorded_then_catalog_then_gone_then_authorised_delete() {
    let fw = framework("0.8.0");
    let type_changed =
        [package("0.1.10", "service", None, None), package("0.1.8", "tenant", Some("0.1.0"), None)];
    let service_only = [package("0.1.10", "service", None, None)];
    let rec = recorded();
    let scenarios = [
        Scenario {
            name: "the recorded revision still resolves: it is used",
            recorded: Some(RecordedCheck::Resolves),
            catalog: CatalogState::Loaded(&service_only),
            has_children: true,
            delete_without_package: false,
            expect: |d| matches!(d, CleanupDecision::UseRecorded(r) if r.tag == "0.1.8"),
        },
        Scenario {
            name: "after a type change the type-aware catalog still has the tenant revision",
            recorded: Some(RecordedCheck::Gone),
            catalog: CatalogState::Loaded(&type_changed),
            has_children: true,
            delete_without_package: false,
            expect: |d| matches!(d, CleanupDecision::UseCatalog(p) if p.tag == "0.1.8"),
        },
        Scenario {
            name: "nothing anywhere and children recorded: package gone, no hot loop",
            recorded: Some(RecordedCheck::Gone),
            catalog: CatalogState::Loaded(&service_only),
            has_children: true,
            delete_without_package: false,
            expect: |d| matches!(d, CleanupDecision::Gone(g) if g.code == "E_PACKAGE_GONE"),
        },
        Scenario {
            name: "nothing anywhere and no children: nothing to delete",
            recorded: None,
            catalog: CatalogState::Loaded(&service_only),
            has_children: false,
            delete_without_package: false,
            expect: |d| matches!(d, CleanupDecision::NothingToDelete),
        },
        Scenario {
            name: "the annotation authorises a delete without package hooks",
            recorded: Some(RecordedCheck::Gone),
            catalog: CatalogState::Loaded(&service_only),
            has_children: true,
            delete_without_package: true,
            expect: |d| matches!(d, CleanupDecision::DeleteWithoutPackage { warning } if warning.contains("no package hooks ran")),
        },
        Scenario {
            name: "the annotation never skips hooks when a package exists",
            recorded: Some(RecordedCheck::Resolves),
            catalog: CatalogState::Loaded(&service_only),
            has_children: true,
            delete_without_package: true,
            expect: |d| matches!(d, CleanupDecision::UseRecorded(_)),
        },
        Scenario {
            name: "a missing jukebox is E_JUKEBOX_GONE, not a silent finalizer removal",
            recorded: None,
            catalog: CatalogState::JukeboxMissing,
            has_children: true,
            delete_without_package: false,
            expect: |d| matches!(d, CleanupDecision::Gone(g) if g.code == "E_JUKEBOX_GONE"),
        },
        Scenario {
            name: "an unreachable catalog is retried, never read as gone",
            recorded: None,
            catalog: CatalogState::Unavailable,
            has_children: true,
            delete_without_package: true,
            expect: |d| matches!(d, CleanupDecision::Retry { .. }),
        },
        Scenario {
            name: "an unreachable registry is retried when the catalog has nothing either",
            recorded: Some(RecordedCheck::Unknown("connection refused".into())),
            catalog: CatalogState::Loaded(&service_only),
            has_children: true,
            delete_without_package: true,
            expect: |d| matches!(d, CleanupDecision::Retry { why } if why.contains("connection refused")),
        },
    ];
    for scenario in scenarios {
        let query = CleanupQuery {
            origins: &Origins::Scanned,
            install: query(Some("0.1.8"), &fw),
            recorded: scenario.recorded.clone().map(|check| (&rec, check)),
            catalog: scenario.catalog,
            has_children: scenario.has_children,
            delete_without_package: scenario.delete_without_package,
            listed_before: &[],
        };
        let decision = select_cleanup(&query);
        assert!((scenario.expect)(&decision), "{}: got {decision:?}", scenario.name);
    }
}

#[test]
fn the_package_gone_condition_names_the_code_what_is_missing_and_both_ways_out() {
    let fw = framework("0.8.0");
    let service_only = [package("0.1.10", "service", None, None)];
    let query = CleanupQuery {
        origins: &Origins::Scanned,
        install: query(Some("0.1.8"), &fw),
        recorded: None,
        catalog: CatalogState::Loaded(&service_only),
        has_children: true,
        delete_without_package: false,
        listed_before: &[],
    };
    let CleanupDecision::Gone(gone) = select_cleanup(&query) else { panic!("expected gone") };
    let message = gone.condition_message();
    assert!(
        message.starts_with("[E_PACKAGE_GONE] no tenant revision of think/ollama in JukeBox box"),
        "{message}"
    );
    assert!(message.contains("only service: 0.1.10"), "{message}");
    assert!(
        message.contains("publish or restore a tenant revision of think/ollama (e.g. the installed 0.1.8)"),
        "{message}"
    );
    // The second way out is an admin's confirmation, never the tenant-writable annotation alone.
    assert!(
        message.contains("confirm deleting them without package hooks (AllowDeleteWithoutPackage"),
        "{message}"
    );
    assert!(message.contains("the annotation alone deletes nothing"), "{message}");
}

#[test]
fn scan_filters_have_one_or_two_non_empty_segments() {
    let table = [
        ("db", Ok(("db", None))),
        ("db/pg", Ok(("db", Some("pg")))),
        ("", Err("empty segment")),
        ("db/", Err("empty segment")),
        ("/pg", Err("empty segment")),
        ("a/b/c", Err("more than two segments")),
        ("db/p g", Err("whitespace")),
    ];
    for (raw, expected) in table {
        match (ScanFilter::parse(raw), expected) {
            (Ok(f), Ok((category, name))) => {
                assert_eq!(f.category, category);
                assert_eq!(f.name.as_deref(), name);
                assert_eq!(f.to_string(), raw);
            }
            (Err(e), Err(fragment)) => assert!(e.to_string().contains(fragment), "{raw:?}: {e}"),
            (got, _) => panic!("{raw:?}: unexpected {got:?}"),
        }
    }
}

#[test]
fn held_upgrades_keep_the_installed_revision_and_a_fresh_install_is_not_held() {
    let framework = semver::Version::new(0, 8, 0);
    let catalog = [
        Package::new(
            "r",
            "think/ollama",
            "2.0.0",
            PackageContent::minimal("think", "ollama", PackageType::Tenant),
        ),
        Package::new(
            "r",
            "think/ollama",
            "1.0.0",
            PackageContent::minimal("think", "ollama", PackageType::Tenant),
        ),
    ];
    let held = InstallQuery { hold_upgrades: true, ..query(Some("1.0.0"), &framework) };
    assert_eq!(select_install(&catalog, &held).unwrap().tag, "1.0.0");
    let fresh = InstallQuery { hold_upgrades: true, ..query(None, &framework) };
    assert_eq!(select_install(&catalog, &fresh).unwrap().tag, "2.0.0");
    let gone = InstallQuery { hold_upgrades: true, ..query(Some("0.9.0"), &framework) };
    let no_match = select_install(&catalog, &gone).unwrap_err();
    assert_eq!(no_match.excluded_by, Exclusion::Held);
    assert!(no_match.reason.contains("held at 0.9.0"), "{}", no_match.reason);
}

#[test]
fn a_quarantined_revision_is_skipped_and_when_nothing_else_remains_nothing_matches_naming_it() {
    let framework = semver::Version::new(0, 8, 0);
    let revision = |tag| {
        Package::new(
            "r",
            "think/ollama",
            tag,
            PackageContent::minimal("think", "ollama", PackageType::Tenant),
        )
    };
    let catalog = [revision("0.3.0"), revision("0.2.0")];
    let quarantined = ["0.3.0".to_string(), "v0.2.0".to_string()];
    let asked = InstallQuery { quarantined: &quarantined, ..query(Some("0.2.0"), &framework) };
    assert_eq!(select_install(&catalog, &asked).unwrap().tag, "0.2.0");
    // A newer revision than the quarantined one is offered again.
    let newer = [revision("0.3.1"), revision("0.3.0"), revision("0.2.0")];
    assert_eq!(select_install(&newer, &asked).unwrap().tag, "0.3.1");
    let only = [revision("0.3.0")];
    let no_match = select_install(&only, &asked).unwrap_err();
    assert_eq!(no_match.excluded_by, Exclusion::Quarantined);
    assert!(no_match.reason.contains("quarantined for this instance (0.3.0, v0.2.0)"), "{}", no_match.reason);
}

#[test]
fn a_recorded_revision_resolves_only_while_its_tag_points_at_the_recorded_digest() {
    assert_eq!(RecordedCheck::from_head(Some("sha256:a"), Some("sha256:a")), RecordedCheck::Resolves);
    assert_eq!(RecordedCheck::from_head(Some("sha256:a"), Some("sha256:b")), RecordedCheck::Gone, "retagged");
    assert_eq!(RecordedCheck::from_head(Some("sha256:a"), None), RecordedCheck::Gone);
    assert_eq!(
        RecordedCheck::from_head(None, Some("sha256:b")),
        RecordedCheck::Resolves,
        "no digest recorded"
    );
    assert_eq!(RecordedCheck::from_head(None, None), RecordedCheck::Gone);
}

/// The cleanup of an instance on 0.1.8 with children whose recorded
/// `revision` still resolves, under `origins`, the catalog listing `scanned`.
fn cleanup_of_resolving(
    origins: &Origins,
    revision: &RecordedRevision,
    scanned: &[Package],
    fw: &semver::Version,
) -> CleanupDecision {
    select_cleanup(&CleanupQuery {
        origins,
        install: query(Some("0.1.8"), fw),
        recorded: Some((revision, RecordedCheck::Resolves)),
        catalog: CatalogState::Loaded(scanned),
        has_children: true,
        delete_without_package: false,
        listed_before: &[],
    })
}

/// `status.package` is writable by whoever may patch the instance's status:
/// a revision recorded there runs its delete hooks (as the cluster-admin
/// agent) only when it comes from one of the JukeBox's sources.
#[test]
fn a_recorded_revision_from_elsewhere_never_runs_its_delete_hooks() {
    let fw = framework("0.8.0");
    let scanned = [package("0.1.10", "service", None, None)];
    let ours = recorded();
    let foreign = RecordedRevision { registry: "evil.example".into(), image: "x/root".into(), ..recorded() };
    let beside = RecordedRevision { image: "think-evil/ollama".into(), ..recorded() };
    let list = Origins::Repositories(vec!["registry.example/think/ollama".into()]);
    let project = Origins::Project { registry: "Registry.Example".into(), project: "think".into() };
    let cases = [
        (&list, &ours, true),
        (&list, &foreign, false),
        (&list, &beside, false),
        (&project, &ours, true),
        (&project, &beside, false),
        (&project, &foreign, false),
        // Scanned sources: a repository its scans list, whatever tag is shown today.
        (&Origins::Scanned, &ours, true),
        (&Origins::Scanned, &foreign, false),
    ];
    for (origins, revision, admitted) in cases {
        let decision = cleanup_of_resolving(origins, revision, &scanned, &fw);
        if admitted {
            assert!(
                matches!(&decision, CleanupDecision::UseRecorded(r) if r == revision),
                "{origins:?}: {decision:?}"
            );
        } else {
            let CleanupDecision::Gone(gone) = &decision else {
                panic!("{origins:?} {revision:?}: {decision:?}")
            };
            assert_eq!(gone.code, "E_REVISION_NOT_FROM_JUKEBOX");
            assert!(gone.condition_message().contains(&revision.image), "{}", gone.condition_message());
        }
    }
    // The catalog away: the origin cannot be checked, so retry (never run it, never call it gone).
    let query = CleanupQuery {
        origins: &list,
        install: query(Some("0.1.8"), &fw),
        recorded: Some((&foreign, RecordedCheck::Resolves)),
        catalog: CatalogState::Unavailable,
        has_children: true,
        delete_without_package: false,
        listed_before: &[],
    };
    assert!(matches!(select_cleanup(&query), CleanupDecision::Retry { .. }));
}

/// #65 item 5, the attack: a tenant writes `status.package` naming another
/// package of the same JukeBox (a repository it lists), or its own
/// repository with another type, so that deleting its instance runs that
/// package's delete hooks as the cluster-admin agent. A recorded revision is
/// admitted only as the instance's own package: a repository where the
/// catalog lists its category/name, of the instance's type.
#[test]
fn a_recorded_revision_of_another_package_of_the_jukebox_never_runs_its_delete_hooks() {
    let fw = framework("0.8.0");
    let root = Package::new(
        "registry.example",
        "apps/root",
        "1.0.0",
        content_of("apps", "root", "tenant", None, None),
    );
    let scanned = [package("0.1.10", "service", None, None), package("0.1.8", "tenant", None, None), root];
    let list = Origins::Repositories(vec![
        "registry.example/think/ollama".into(),
        "registry.example/apps/root".into(),
    ]);
    let other_package = RecordedRevision { image: "apps/root".into(), tag: "1.0.0".into(), ..recorded() };
    let other_type = RecordedRevision { package_type: PackageType::System, ..recorded() };
    for origins in [&list, &Origins::Scanned] {
        for (revision, admitted) in [(&recorded(), true), (&other_package, false), (&other_type, false)] {
            let decision = cleanup_of_resolving(origins, revision, &scanned, &fw);
            let used = matches!(&decision, CleanupDecision::UseRecorded(r) if r == revision);
            assert_eq!(used, admitted, "{origins:?} {revision:?}: {decision:?}");
            if !admitted {
                let CleanupDecision::Gone(gone) = &decision else { panic!("{decision:?}") };
                assert_eq!(gone.code, "E_REVISION_NOT_FROM_JUKEBOX");
                assert!(
                    gone.missing.contains("think/ollama"),
                    "names the instance's package: {}",
                    gone.missing
                );
            }
        }
    }
    // Before any registry is asked: only the own package's repository.
    let listed = [("registry.example", "think/ollama")];
    assert!(vynil_rules::selection::is_own_repository(&recorded(), &listed));
    assert!(vynil_rules::selection::is_own_repository(
        &RecordedRevision { registry: "REGISTRY.example".into(), ..recorded() },
        &listed
    ));
    assert!(!vynil_rules::selection::is_own_repository(&other_package, &listed));
    let elsewhere = RecordedRevision { registry: "127.0.0.1:9".into(), ..recorded() };
    assert!(!vynil_rules::selection::is_own_repository(&elsewhere, &listed));
}

/// The catalog answers an exclusion as text; each reads back as itself.
#[test]
fn an_exclusion_reads_back_from_its_text() {
    let all = [
        Exclusion::Jukebox,
        Exclusion::CategoryName,
        Exclusion::Type,
        Exclusion::MinimumVersion,
        Exclusion::FrameworkVersion,
        Exclusion::Held,
        Exclusion::Quarantined,
        Exclusion::Withheld,
    ];
    for exclusion in all {
        assert_eq!(Exclusion::parse(exclusion.as_str()), Some(exclusion));
    }
    assert_eq!(Exclusion::parse("gone"), None);
}

/// #65 item 5: a package moved to another repository of its JukeBox (the
/// catalog lists it only there now) keeps its installs' delete hooks: the
/// recorded revision is the instance's own package where lifecycle's record
/// says it credited an install, never merely where a status says.
#[test]
fn item_5_a_package_moved_to_another_repository_keeps_the_recorded_revision_lifecycle_credited() {
    let fw = framework("0.8.0");
    let moved = [Package::new(
        "registry.example",
        "think/ollama-next",
        "0.2.0",
        PackageContent::minimal("think", "ollama", PackageType::Tenant),
    )];
    let origins = Origins::Repositories(vec![
        "registry.example/think/ollama".into(),
        "registry.example/think/ollama-next".into(),
    ]);
    let revision = recorded();
    let cleanup = |listed_before: &[String]| {
        select_cleanup(&CleanupQuery {
            origins: &origins,
            install: query(Some("0.1.8"), &fw),
            recorded: Some((&revision, RecordedCheck::Resolves)),
            catalog: CatalogState::Loaded(&moved),
            has_children: true,
            delete_without_package: false,
            listed_before,
        })
    };
    assert!(!matches!(cleanup(&[]), CleanupDecision::UseRecorded(_)), "unknown history: not trusted");
    let credited = [vynil_rules::repository::entry("registry.example", "think/ollama")];
    assert!(matches!(cleanup(&credited), CleanupDecision::UseRecorded(r) if r.image == "think/ollama"));
    let elsewhere = [vynil_rules::repository::entry("registry.example", "think/other")];
    assert!(!matches!(cleanup(&elsewhere), CleanupDecision::UseRecorded(_)), "only where it was credited");
}
