//! The checkable behaviours of the reference (`docs/upstream-vynil.md` §9) that
//! belong to the rules, one test each, named after what they show.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use std::collections::HashMap;

use common::*;
use vynil_rules::{
    Channel, InstallQuery, Package, PackageContent, PackageType, RetentionConfig, ScanFilter, Tag, Viewer,
    compute_view, merge_packages, plan_retention, repositories_for, retention::Usage,
    scan::RepositoryOutcome, select_install, selection::Exclusion,
};

/// `(tag, type, min, vynil)`; type "-" = a manifest without Vynil annotations.
type Row<'a> = (&'a str, &'a str, Option<&'a str>, Option<&'a str>);

fn view(rows: &[Row], channel: Channel, framework_version: &str) -> Vec<String> {
    let contents: HashMap<&str, PackageContent> = rows
        .iter()
        .filter(|r| r.1 != "-")
        .map(|(tag, kind, min, vynil)| (*tag, content(kind, *min, *vynil)))
        .collect();
    let viewer = Viewer { channel, framework: framework(framework_version) };
    compute_view(rows.iter().map(|r| r.0), &viewer, true, |tag: &Tag| contents.get(tag.as_str()))
        .tags()
        .into_iter()
        .map(String::from)
        .collect()
}

fn stable(rows: &[Row]) -> Vec<String> {
    view(rows, Channel::Stable, "0.8.0")
}

#[test]
fn item_1_waypoints_follow_upstreams_code_not_its_docs() {
    let rows = [
        ("4.0.0", "tenant", Some("3.0.0"), None),
        ("3.5.0", "tenant", Some("2.0.0"), None),
        ("3.0.0", "tenant", Some("2.0.0"), None),
        ("2.5.0", "tenant", None, None),
        ("1.5.0", "tenant", None, None),
    ];
    assert_eq!(stable(&rows), ["4.0.0", "3.5.0", "2.5.0"], "the docs' extra 1.5.0 is an erratum");
}

#[test]
fn item_2_a_chain_of_minima_keeps_every_step() {
    let rows = [
        ("4.0.0", "tenant", Some("3.0.0"), None),
        ("3.0.0", "tenant", Some("2.0.0"), None),
        ("2.0.0", "tenant", Some("1.0.0"), None),
        ("1.0.0", "tenant", None, None),
    ];
    assert_eq!(stable(&rows), ["4.0.0", "3.0.0", "2.0.0", "1.0.0"]);
}

#[test]
fn item_3_without_minima_only_the_newest_is_shown() {
    let rows =
        [("1.2.0", "tenant", None, None), ("1.1.0", "tenant", None, None), ("1.0.0", "tenant", None, None)];
    assert_eq!(stable(&rows), ["1.2.0"]);
}

#[test]
fn item_4_stable_drops_alpha_and_beta_but_keeps_release_candidates() {
    let rows = [
        ("1.3.0-alpha.1", "tenant", None, None),
        ("1.2.0-beta.1", "tenant", None, None),
        ("1.1.0-rc.1", "tenant", None, None),
        ("1.0.0", "tenant", None, None),
    ];
    assert_eq!(view(&rows, Channel::Stable, "0.8.0"), ["1.1.0-rc.1"]);
    assert_eq!(view(&rows, Channel::Beta, "0.8.0"), ["1.2.0-beta.1"]);
    assert_eq!(view(&rows, Channel::Alpha, "0.8.0"), ["1.3.0-alpha.1"]);
}

#[test]
fn item_5_signatures_latest_scan_caches_and_non_semver_tags_never_appear() {
    let sig = format!("{}.sig", digest("x").replacen(':', "-", 1));
    let rows = [
        (sig.as_str(), "tenant", None, None),
        ("latest", "tenant", None, None),
        ("trivy--x", "tenant", None, None),
        ("4.0", "tenant", None, None),
        ("01.0.0", "tenant", None, None),
        ("1.0.0", "tenant", None, None),
    ];
    assert_eq!(stable(&rows), ["1.0.0"]);
}

#[test]
fn item_6_a_revision_needing_a_newer_framework_is_skipped_for_the_next_lower() {
    let rows = [("2.0.0", "tenant", None, Some("9.0.0")), ("1.0.0", "tenant", None, None)];
    assert_eq!(stable(&rows), ["1.0.0"]);
    assert_eq!(view(&rows, Channel::Stable, "9.0.0"), ["2.0.0"]);
}

#[test]
fn item_7_the_descent_stops_at_the_first_tag_without_vynil_annotations() {
    let rows = [
        ("3.0.0", "tenant", Some("2.0.0"), None),
        ("2.5.0", "-", None, None),
        ("2.0.0", "tenant", None, None),
    ];
    assert_eq!(stable(&rows), ["3.0.0"]);
}

fn install(catalog: &[Package], kind: PackageType, installed: Option<&str>) -> Result<String, String> {
    let framework = framework("0.8.0");
    let query = InstallQuery {
        jukebox: "box",
        category: "think",
        name: "ollama",
        package_type: kind,
        installed_tag: installed,
        framework: &framework,
        hold_upgrades: false,
        quarantined: &[],
        withheld: &[],
    };
    select_install(catalog, &query).map(|p| p.tag.clone()).map_err(|e| e.reason)
}

#[test]
fn item_8_each_upgrade_goes_through_the_next_reachable_waypoint() {
    let catalog = [
        package("4.0.0", "tenant", Some("3.0.0"), None),
        package("3.5.0", "tenant", Some("2.0.0"), None),
        package("2.5.0", "tenant", None, None),
    ];
    let table = [
        (Some("1.0.0"), "2.5.0"),
        (Some("2.5.0"), "3.5.0"),
        (Some("3.5.0"), "4.0.0"),
        (None, "4.0.0"),
        (Some(""), "4.0.0"),
    ];
    for (installed, expected) in table {
        assert_eq!(
            install(&catalog, PackageType::Tenant, installed).unwrap(),
            expected,
            "from {installed:?}"
        );
    }
}

#[test]
fn item_9_a_tenant_instance_never_selects_a_service_package() {
    let catalog = [package("0.1.10", "service", None, None)];
    let framework = framework("0.8.0");
    let query = InstallQuery {
        jukebox: "box",
        category: "think",
        name: "ollama",
        package_type: PackageType::Tenant,
        installed_tag: Some("0.1.8"),
        framework: &framework,
        hold_upgrades: false,
        quarantined: &[],
        withheld: &[],
    };
    let no_match = select_install(&catalog, &query).unwrap_err();
    assert_eq!(no_match.excluded_by, Exclusion::Type);
    assert_eq!(no_match.reason, "no tenant revision of think/ollama (only service: 0.1.10)");
}

fn entry(category: &str, name: &str, tag: &str) -> Package {
    Package::new("reg", &format!("{category}/{name}"), tag, content_of(category, name, "tenant", None, None))
}

fn repo(image: &str) -> (String, String) {
    ("reg".to_string(), image.to_string())
}

fn tags_of(packages: &[Package]) -> Vec<String> {
    packages.iter().map(|p| format!("{}:{}", p.image, p.tag)).collect()
}

#[test]
fn item_10_a_partial_scan_replaces_only_what_its_filter_names() {
    let previous =
        [entry("db", "pg", "1.0.0"), entry("db", "mysql", "1.0.0"), entry("monitoring", "prom", "1.0.0")];

    let pg = ScanFilter::parse("db/pg").unwrap();
    assert_eq!(repositories_for(&previous, &pg), [repo("db/pg")]);
    let merged = merge_packages(
        &previous,
        Some(&pg),
        &[(repo("db/pg"), RepositoryOutcome::Scanned(vec![entry("db", "pg", "2.0.0")]))],
    );
    assert_eq!(tags_of(&merged), ["db/mysql:1.0.0", "monitoring/prom:1.0.0", "db/pg:2.0.0"]);

    let db = ScanFilter::parse("db").unwrap();
    assert_eq!(repositories_for(&previous, &db), [repo("db/pg"), repo("db/mysql")]);
    let outcomes = [
        (repo("db/pg"), RepositoryOutcome::Scanned(vec![entry("db", "pg", "2.0.0")])),
        (repo("db/mysql"), RepositoryOutcome::Scanned(vec![entry("db", "mysql", "2.0.0")])),
    ];
    let merged = merge_packages(&previous, Some(&db), &outcomes);
    assert_eq!(tags_of(&merged), ["monitoring/prom:1.0.0", "db/pg:2.0.0", "db/mysql:2.0.0"]);
}

#[test]
fn item_11_a_partial_filter_matching_nothing_reads_nothing_and_changes_nothing() {
    let previous = [entry("db", "pg", "1.0.0")];
    let filter = ScanFilter::parse("apps/x").unwrap();
    let repositories = repositories_for(&previous, &filter);
    assert!(repositories.is_empty(), "no fallback to a full scan (upstream #9)");
    assert_eq!(merge_packages(&previous, Some(&filter), &[]), previous);
}

#[test]
fn item_12_a_failed_repository_keeps_its_previous_entries() {
    let previous = [entry("db", "pg", "1.0.0"), entry("db", "mysql", "1.0.0")];
    let outcomes = [
        (repo("db/pg"), RepositoryOutcome::Failed),
        (repo("db/mysql"), RepositoryOutcome::Scanned(vec![entry("db", "mysql", "2.0.0")])),
    ];
    assert_eq!(tags_of(&merge_packages(&previous, None, &outcomes)), ["db/pg:1.0.0", "db/mysql:2.0.0"]);
    let db = ScanFilter::parse("db").unwrap();
    assert_eq!(tags_of(&merge_packages(&previous, Some(&db), &outcomes)), ["db/pg:1.0.0", "db/mysql:2.0.0"]);
}

#[test]
fn item_26_the_catalogue_shows_the_newest_revision_of_each_type() {
    let rows = [
        ("0.1.10", "service", None, None),
        ("0.1.9", "service", Some("0.1.8"), None),
        ("0.1.8", "tenant", Some("0.1.0"), None),
    ];
    assert_eq!(stable(&rows), ["0.1.10", "0.1.8"]);
    let single_type = [("0.1.10", "tenant", None, None), ("0.1.9", "tenant", Some("0.1.8"), None)];
    assert_eq!(stable(&single_type), ["0.1.10"], "identical to upstream without a type change");
}

#[test]
fn item_27_a_purge_keeps_heads_waypoints_each_types_newest_and_their_artifacts() {
    let tags = [
        vynil_tag("2.0.0-beta.1", "beta", "service", Some("1.0.0"), None),
        vynil_tag("1.1.0", "head", "service", Some("1.0.0"), None),
        vynil_tag("1.0.5", "skipped", "service", Some("1.0.0"), None),
        vynil_tag("1.0.0", "waypoint", "service", None, None),
        vynil_tag("0.9.0", "tenant", "tenant", None, None),
        vynil_tag("0.8.0", "old", "tenant", None, None),
        artifact_tag("head", "sig", "s1"),
        artifact_tag("waypoint", "att", "s2"),
        artifact_tag("tenant", "sbom", "s3"),
        artifact_tag("old", "sig", "s4"),
    ];
    let config = RetentionConfig::new(framework("0.8.0"), &[]).unwrap();
    let plan = plan_retention(&tags, &Usage::Known(vec![]), &config).unwrap();
    let deleted: Vec<&str> = plan.deleted().map(|e| e.tag).collect();
    let old_sig = format!("{}.sig", digest("old").replacen(':', "-", 1));
    assert_eq!(deleted, ["1.0.5", "0.8.0", old_sig.as_str()]);
    assert_eq!(plan.kept().count(), 7);
}

#[test]
fn force_scan_true_or_empty_is_a_full_scan_and_any_other_value_a_validated_filter() {
    for full in ["true", "", " true ", "  "] {
        assert_eq!(ScanFilter::from_request(full).unwrap(), None, "{full:?}");
    }
    let partial = ScanFilter::from_request(" db/pg ").unwrap().unwrap();
    assert_eq!((partial.category.as_str(), partial.name.as_deref()), ("db", Some("pg")));
    for bad in ["a/b/c", "/x", "a b"] {
        assert!(ScanFilter::from_request(bad).is_err(), "{bad:?}");
    }
}
