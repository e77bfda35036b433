//! Property tests of the rules (10 000 cases each; `PROPTEST_CASES` overrides).

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use std::collections::{BTreeSet, HashMap};

use common::*;
use proptest::prelude::*;
use semver::Version;
use vynil_rules::{
    Channel, InstallQuery, KnownRevisions, Package, PackageContent, PackageType, RetentionConfig,
    RetentionPlan, ScanFilter, Tag, Versions, ViewBuilder, Viewer, compute_view, merge_packages,
    plan_retention,
    retention::{
        Decision, InstalledRevision, KeepReason, ManifestMetadata, RepositoryTag, RevisionUse, Usage,
    },
    scan::RepositoryOutcome,
    select_install,
    view::Role,
};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(10_000);
    ProptestConfig { cases, ..ProptestConfig::default() }
}

fn version_text() -> impl Strategy<Value = String> {
    (
        0u64..3,
        0u64..3,
        0u64..2,
        prop_oneof![4 => Just(""), 1 => Just("-alpha.1"), 1 => Just("-beta.1"), 1 => Just("-rc.1")],
    )
        .prop_map(|(a, b, c, pre)| format!("{a}.{b}.{c}{pre}"))
}

fn kind_name() -> impl Strategy<Value = &'static str> {
    prop_oneof![3 => Just("tenant"), 2 => Just("service"), 1 => Just("system")]
}

/// A generated repository tag before digests are assigned.
#[derive(Debug, Clone)]
enum Spec {
    Version {
        tag: String,
        kind: &'static str,
        min: Option<String>,
        vynil: Option<&'static str>,
        annotated: bool,
    },
    Noise(&'static str),
    Artifact {
        subject: usize,
        suffix: &'static str,
    },
}

fn spec() -> impl Strategy<Value = Spec> {
    let version = (
        version_text(),
        prop::bool::weighted(0.1),
        kind_name(),
        prop::option::weighted(0.5, version_text()),
        prop::option::weighted(0.25, prop_oneof![Just("0.7.0"), Just("0.8.0"), Just("0.9.0")]),
        prop::bool::weighted(0.9),
    )
        .prop_map(|(tag, v, kind, min, vynil, annotated)| Spec::Version {
            tag: if v { format!("v{tag}") } else { tag },
            kind,
            min,
            vynil,
            annotated,
        });
    prop_oneof![
        8 => version,
        1 => prop_oneof![Just("latest"), Just("4.0"), Just("trivy--x")].prop_map(Spec::Noise),
        2 => (0usize..8, prop_oneof![Just("sig"), Just("att"), Just("sbom"), Just("")]).prop_map(|(subject, suffix)| Spec::Artifact { subject, suffix }),
    ]
}

/// A repository: unique tag names, digests drawn from a small pool so that
/// aliases happen, plus usage and pins.
#[derive(Debug, Clone)]
struct Case {
    tags: Vec<RepositoryTag>,
    usage: Usage,
    pins: Vec<String>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec((spec(), 0usize..8, prop::bool::weighted(0.75)), 0..14),
        prop::option::weighted(0.8, prop::collection::vec((0usize..14, prop::bool::ANY, 0u8..3), 0..3)),
        prop::collection::vec(
            prop_oneof![Just("1.*".to_string()), Just("0.?.0".to_string()), Just("latest".to_string())],
            0..2,
        ),
    )
        .prop_map(|(specs, used, pins)| {
            let mut tags: Vec<RepositoryTag> = Vec::new();
            for (index, (spec, pool, shared)) in specs.into_iter().enumerate() {
                // Mostly a digest of its own; sometimes one from the shared pool.
                let digest_label = if shared { format!("own-{index}") } else { format!("pool-{pool}") };
                let tag = match spec {
                    Spec::Version { tag, kind, min, vynil, annotated } => {
                        let mut t = vynil_tag(&tag, &digest_label, kind, min.as_deref(), vynil);
                        if !annotated {
                            t.metadata = ManifestMetadata::NotVynil;
                        }
                        t
                    }
                    Spec::Noise(name) => plain_tag(name, &digest_label),
                    Spec::Artifact { subject, suffix } => {
                        let subject = if subject % 2 == 0 {
                            format!("own-{subject}")
                        } else {
                            format!("pool-{subject}")
                        };
                        artifact_tag(&subject, suffix, &format!("art-{index}"))
                    }
                };
                if !tags.iter().any(|t| t.name == tag.name) {
                    tags.push(tag);
                }
            }
            let usage = match used {
                None => Usage::Unknown,
                Some(picks) => Usage::Known(
                    picks
                        .into_iter()
                        .filter_map(|(i, by_digest, u)| {
                            let tag = tags.get(i % tags.len().max(1))?;
                            Some(InstalledRevision {
                                tag: if by_digest { "re-pointed".into() } else { tag.name.clone() },
                                digest: by_digest.then(|| tag.digest.clone()),
                                instance: format!("tenant ns/app-{i}"),
                                usage: [
                                    RevisionUse::Installed,
                                    RevisionUse::Installing,
                                    RevisionUse::Pinned,
                                    RevisionUse::RollbackTarget,
                                ][u as usize],
                            })
                        })
                        .collect(),
                ),
            };
            Case { tags, usage, pins }
        })
}

fn plan(case: &Case) -> RetentionPlan<'_> {
    let config = RetentionConfig::new(framework("0.8.0"), &case.pins).unwrap();
    plan_retention(&case.tags, &case.usage, &config).unwrap()
}

fn contents(case: &Case) -> HashMap<String, PackageContent> {
    case.tags
        .iter()
        .filter_map(|t| match &t.metadata {
            ManifestMetadata::Vynil(c) if Tag::parse(&t.name).is_some() => {
                Some((t.name.clone(), (**c).clone()))
            }
            _ => None,
        })
        .collect()
}

/// Breakpoints re-derived here: the configured framework and every requirement value.
fn breakpoints(case: &Case) -> BTreeSet<Version> {
    let mut set: BTreeSet<Version> =
        contents(case).values().flat_map(|c| c.vynil_versions().collect::<Vec<_>>()).collect();
    set.insert(framework("0.8.0"));
    set
}

fn view_of(case: &Case, channel: Channel, fw: &Version) -> vynil_rules::View {
    let contents = contents(case);
    let viewer = Viewer { channel, framework: fw.clone() };
    compute_view(case.tags.iter().map(|t| t.name.as_str()), &viewer, true, |tag| contents.get(tag.as_str()))
}

fn kept_tags<'a>(plan: &RetentionPlan<'a>) -> BTreeSet<&'a str> {
    plan.kept().map(|e| e.tag).collect()
}

proptest! {
    #![proptest_config(config())]

    /// (a) Nothing any consumer could be shown or uses is ever deleted.
    #[test]
    fn nothing_shown_used_pinned_shared_or_unmanaged_is_ever_deleted(case in case()) {
        let plan = plan(&case);
        let kept = kept_tags(&plan);
        for fw in breakpoints(&case) {
            for channel in Channel::ALL {
                for tag in view_of(&case, channel, &fw).tags() {
                    prop_assert!(kept.contains(tag), "{tag} shown to {channel} on {fw} was deleted");
                }
            }
        }
        let contents = contents(&case);
        for package_type in PackageType::ALL {
            let newest = contents.iter().filter(|(_, c)| c.package_type() == package_type).map(|(t, _)| Tag::parse(t).unwrap()).max();
            if let Some(newest) = newest {
                prop_assert!(kept.contains(newest.as_str()), "last {package_type} revision {newest} deleted");
            }
        }
        if let Usage::Known(used) = &case.usage {
            for revision in used {
                for tag in case.tags.iter().filter(|t| t.name == revision.tag || Some(&t.digest) == revision.digest.as_ref()) {
                    prop_assert!(kept.contains(tag.name.as_str()), "{} used by {} deleted", tag.name, revision.instance);
                }
            }
        }
        let kept_digests: BTreeSet<&str> = plan.kept().map(|e| e.digest).collect();
        for entry in plan.deleted() {
            prop_assert!(!kept_digests.contains(entry.digest), "{} shares a kept digest", entry.tag);
            let pinned = case.pins.iter().any(|p| glob::Pattern::new(p).unwrap().matches(entry.tag));
            prop_assert!(!pinned, "{} is pinned", entry.tag);
            let managed = contents.contains_key(entry.tag) || vynil_rules::ArtifactTag::parse(entry.tag).is_some();
            prop_assert!(managed, "unmanaged {} deleted", entry.tag);
        }
        prop_assert_eq!(plan.entries.len(), case.tags.len());
    }

    /// (b) Every reason given holds, and a tag without a reason is deleted.
    #[test]
    fn every_reason_holds_and_a_tag_without_reason_is_deleted(case in case()) {
        let plan = plan(&case);
        let configured = framework("0.8.0");
        let by_name: HashMap<&str, &RepositoryTag> = case.tags.iter().map(|t| (t.name.as_str(), t)).collect();
        let kept = kept_tags(&plan);
        let contents = contents(&case);
        for entry in &plan.entries {
            let Decision::Keep(reasons) = &entry.decision else { continue };
            prop_assert!(!reasons.is_empty(), "{} kept without reason", entry.tag);
            prop_assert!(reasons.windows(2).all(|w| w[0] < w[1]), "{}: a reason twice or out of order: {:?}", entry.tag, reasons);
            for reason in reasons {
                let holds = match reason {
                    KeepReason::ChannelHead { channel, framework } => {
                        let fw = framework.clone().unwrap_or_else(|| configured.clone());
                        view_of(&case, *channel, &fw).entries.first().is_some_and(|e| e.tag.as_str() == entry.tag && e.role == Role::Head)
                    }
                    KeepReason::Waypoint { channel, framework, minimum } => {
                        let fw = framework.clone().unwrap_or_else(|| configured.clone());
                        view_of(&case, *channel, &fw).entries.iter().any(|e| e.tag.as_str() == entry.tag && e.role == Role::Waypoint { minimum: minimum.clone() })
                    }
                    KeepReason::TypeInView { channel, framework, package_type } => {
                        let fw = framework.clone().unwrap_or_else(|| configured.clone());
                        view_of(&case, *channel, &fw).entries.iter().any(|e| e.tag.as_str() == entry.tag && e.role == Role::NewestOfType(*package_type))
                    }
                    KeepReason::NewestOfType(package_type) => {
                        contents.get(entry.tag).is_some_and(|c| c.package_type() == *package_type)
                            && contents.iter().filter(|(_, c)| c.package_type() == *package_type).all(|(t, _)| Tag::parse(t) <= Tag::parse(entry.tag))
                    }
                    KeepReason::Used { instance, .. } => match &case.usage {
                        Usage::Known(used) => used.iter().any(|r| &r.instance == instance && (r.tag == entry.tag || r.digest.as_deref() == Some(entry.digest))),
                        Usage::Unknown => false,
                    },
                    KeepReason::Pinned { pattern } => case.pins.contains(pattern) && glob::Pattern::new(pattern).unwrap().matches(entry.tag),
                    KeepReason::Artifact { kind, of } => {
                        let artifact = vynil_rules::ArtifactTag::parse(entry.tag);
                        artifact.is_some_and(|a| a.kind == *kind && by_name.get(of.as_str()).is_some_and(|t| t.digest == a.subject)) && kept.contains(of.as_str())
                    }
                    KeepReason::Alias { of } => by_name.get(of.as_str()).is_some_and(|t| t.digest == entry.digest) && kept.contains(of.as_str()) && of != entry.tag,
                    KeepReason::Unmanaged => !contents.contains_key(entry.tag) && vynil_rules::ArtifactTag::parse(entry.tag).is_none(),
                };
                prop_assert!(holds, "{}: reason {:?} does not hold", entry.tag, reason);
            }
        }
    }

    /// (c) The fingerprint ignores input order and sees every change.
    #[test]
    fn the_fingerprint_ignores_order_and_sees_every_change(case in case(), seed in any::<u64>(), change in 0u8..6) {
        let base = plan(&case).fingerprint;
        let mut shuffled = case.clone();
        shuffled.tags.reverse();
        let len = shuffled.tags.len();
        if len > 0 { shuffled.tags.rotate_left(seed as usize % len); }
        if let Usage::Known(used) = &mut shuffled.usage { used.reverse(); }
        shuffled.pins.reverse();
        prop_assert_eq!(&plan(&shuffled).fingerprint, &base);

        let mut changed = case.clone();
        let target = (seed as usize) % len.max(1);
        match change {
            0 if len > 0 => changed.tags[target].digest = digest("changed"),
            1 if len > 0 => changed.tags[target].name.push_str("-x"),
            2 if len > 0 => changed.tags[target].metadata = match &changed.tags[target].metadata {
                ManifestMetadata::Vynil(_) => ManifestMetadata::NotVynil,
                _ => ManifestMetadata::Vynil(Box::new(content("system", Some("9.9.9"), None))),
            },
            3 => changed.usage = match &case.usage {
                Usage::Unknown => Usage::Known(vec![]),
                Usage::Known(used) => {
                    let mut more = used.clone();
                    more.push(InstalledRevision { tag: "x".into(), digest: None, instance: "tenant a/b".into(), usage: RevisionUse::Installed });
                    Usage::Known(more)
                }
            },
            4 => changed.pins.push("new-pin-*".into()),
            _ => changed.tags.push(plain_tag("added-since", "added")),
        }
        prop_assert_ne!(plan(&changed).fingerprint, base);
    }

    /// (d) Without a type change the type-aware view is upstream's view.
    #[test]
    fn with_a_single_type_the_type_aware_view_equals_the_plain_view(case in case(), channel_index in 0usize..3) {
        let single: HashMap<String, PackageContent> = contents(&case)
            .into_iter()
            .map(|(t, mut c)| { c.metadata.package_type = PackageType::Tenant; (t, c) })
            .collect();
        let viewer = Viewer { channel: Channel::ALL[channel_index], framework: framework("0.8.0") };
        let names = || case.tags.iter().map(|t| t.name.as_str());
        let typed = compute_view(names(), &viewer, true, |t| single.get(t.as_str()));
        let plain = compute_view(names(), &viewer, false, |t| single.get(t.as_str()));
        prop_assert_eq!(typed.tags(), plain.tags());
    }

    /// The planner's descent, which looks only at the revisions of the types
    /// still missing, is the step-wise descent: the same entries and the same
    /// count of tags asked, for every viewer.
    #[test]
    fn a_descent_over_known_revisions_is_the_step_wise_descent(case in case()) {
        let contents = contents(&case);
        let versions = Versions::parse(case.tags.iter().map(|t| t.name.as_str()));
        let known = KnownRevisions::new(
            &versions,
            versions.as_slice().iter().map(|t| contents.get(t.as_str())).collect(),
        );
        let mut frameworks = breakpoints(&case);
        frameworks.insert(framework("0.7.5"));
        for fw in frameworks {
            for channel in Channel::ALL {
                let indexed = known.view(Viewer { channel, framework: fw.clone() });
                prop_assert_eq!(indexed, view_of(&case, channel, &fw), "{} on {}", channel, fw);
            }
        }
    }

    /// (i) An exported index gives every consumer, whatever its channel and
    /// framework version, exactly the view a direct scan gives it.
    #[test]
    fn an_exported_index_gives_every_consumer_its_direct_view(
        case in case(),
        channel_index in 0usize..3,
        fw in prop_oneof![Just("0.1.0"), Just("0.7.0"), Just("0.7.5"), Just("0.8.0"), Just("0.8.9"), Just("0.9.0"), Just("2.0.0")],
    ) {
        let repository = ("r.example".to_string(), "db/pg".to_string());
        let exported = vynil_rules::index::exported(&repository, &case.tags).unwrap();
        let viewer = Viewer { channel: Channel::ALL[channel_index], framework: framework(fw) };
        let unannotated = vec![(repository.clone(), exported.unannotated)];
        let files = vec![(("db".to_string(), "pg".to_string()), vynil_rules::index::IndexFile::Read(exported.packages))];
        let outcomes = vynil_rules::index::index_outcomes(&[], None, &files, &unannotated, &viewer);
        let consumed: Vec<String> = match outcomes.first() {
            Some((_, RepositoryOutcome::Scanned(found))) => found.iter().map(|p| p.tag.clone()).collect(),
            Some((_, RepositoryOutcome::Failed)) => panic!("an index of readable files failed"),
            None => Vec::new(),
        };
        let direct: Vec<String> = view_of(&case, viewer.channel, &viewer.framework).tags().into_iter().map(String::from).collect();
        prop_assert_eq!(consumed, direct);
    }

    /// (g) What a catalog answers for a channel is exactly the rules' view of
    /// that channel, or a refusal; never a filter of another channel's view.
    /// The catalog holds only the scanned channel's view, and no other view
    /// can be computed from it (a narrower view may hold a release the wider
    /// one skipped): so it answers exactly when the channel asked is the
    /// scanned one (or none is asked), with the view computed from every
    /// tag, and refuses, naming both channels, exactly otherwise — even
    /// when filtering what it holds would happen to look right.
    #[test]
    fn a_catalog_answers_a_channel_with_its_exact_view_or_refuses(
        case in case(),
        scanned in 0usize..3,
        asked in prop::option::of(0usize..3),
    ) {
        let fw = framework("0.8.0");
        let (scanned, asked) = (Channel::ALL[scanned], asked.map(|a| Channel::ALL[a]));
        let contents = contents(&case);
        let stored: Vec<Package> = view_of(&case, scanned, &fw)
            .tags()
            .into_iter()
            .map(|tag| Package::new("reg", "r/x", tag, contents[tag].clone()))
            .collect();
        let wanted = asked.unwrap_or(scanned);
        match vynil_rules::catalog_view(&stored, scanned, asked) {
            Ok(answer) => {
                prop_assert_eq!(wanted, scanned, "answered {:?} from a {:?} scan", wanted, scanned);
                // The oracle: the asked channel's view of the whole repository.
                let answered: Vec<&str> = answer.iter().map(|p| p.tag.as_str()).collect();
                let expected = view_of(&case, wanted, &fw);
                prop_assert_eq!(answered, expected.tags());
            }
            Err(refusal) => {
                prop_assert_ne!(wanted, scanned, "refused the scanned channel: {}", refusal);
                prop_assert_eq!(
                    refusal,
                    vynil_rules::RulesError::ChannelNotScanned { asked: wanted, scanned }
                );
            }
        }
    }

    /// (o) A purge never leaves a kept revision without its signature (nor
    /// any other artifact): each `sha256-<digest>.sig|att|sbom` whose subject
    /// is the digest of a kept tag is kept, so a verified revision the plan
    /// keeps stays verified after the purge.
    #[test]
    fn every_artifact_of_a_kept_digest_is_kept(case in case()) {
        let plan = plan(&case);
        let kept = kept_tags(&plan);
        let kept_digests: BTreeSet<&str> =
            case.tags.iter().filter(|t| kept.contains(t.name.as_str())).map(|t| t.digest.as_str()).collect();
        for tag in &case.tags {
            if let Some(artifact) = vynil_rules::ArtifactTag::parse(&tag.name)
                && kept_digests.contains(artifact.subject.as_str())
            {
                prop_assert!(kept.contains(tag.name.as_str()), "{} of the kept {} is deleted", tag.name, artifact.subject);
            }
        }
    }

    /// (n) A skipped revision (one a policy refuses) is as if it were not
    /// listed: the descent skipping some tags gives the view of the tags
    /// without them, so the scanner's view under an enforced signature
    /// policy is the one the catalog computes over the verified revisions.
    #[test]
    fn a_skipped_revision_is_as_if_it_were_not_listed(
        case in case(),
        refused in prop::collection::btree_set(0usize..14, 0..5),
        channel in 0usize..3,
    ) {
        let fw = framework("0.8.0");
        let viewer = Viewer { channel: Channel::ALL[channel], framework: fw.clone() };
        let contents = contents(&case);
        let refused: BTreeSet<&str> = refused.iter().filter_map(|i| case.tags.get(*i)).map(|t| t.name.as_str()).collect();
        let versions = Versions::parse(case.tags.iter().map(|t| t.name.as_str()));
        let mut builder = ViewBuilder::new(&versions, viewer.clone(), true);
        while let Some(tag) = builder.next_needed() {
            if refused.contains(tag.as_str()) {
                builder.skip();
            } else {
                builder.provide(contents.get(tag.as_str()));
            }
        }
        let skipped = builder.finish();
        let kept = case.tags.iter().map(|t| t.name.as_str()).filter(|t| !refused.contains(t));
        let without = compute_view(kept, &viewer, true, |tag| contents.get(tag.as_str()));
        prop_assert_eq!(skipped.tags(), without.tags());
        let roles = |v: &vynil_rules::View| v.entries.iter().map(|e| format!("{:?}", e.role)).collect::<Vec<_>>();
        prop_assert_eq!(roles(&skipped), roles(&without));
    }

    /// (h) The upgrade path is install selection applied again and again:
    /// each step is what selection picks from the step before, strictly
    /// newer, and the last step is where selection stays. Every revision of
    /// a scanned catalog has a role, and the head is the first of them.
    #[test]
    fn an_upgrade_path_is_selection_repeated_and_every_catalog_revision_has_a_role(
        case in case(),
        from in prop::option::of(0usize..14),
        kind in kind_name(),
    ) {
        let fw = framework("0.8.0");
        let contents = contents(&case);
        let stored: Vec<Package> = view_of(&case, Channel::Stable, &fw)
            .tags()
            .into_iter()
            .map(|tag| Package::new("reg", "r/x", tag, contents[tag].clone()))
            .collect();
        let viewer = Viewer { channel: Channel::Stable, framework: fw.clone() };
        let roles = vynil_rules::catalog::roles(&stored, &viewer);
        for (package, roles) in stored.iter().zip(&roles) {
            prop_assert!(!roles.is_empty(), "{} has no role", package.tag);
        }
        if let Some(first) = roles.first() {
            prop_assert_eq!(first.first(), Some(&vynil_rules::catalog::CatalogRole::Head));
        }
        let installed = from.and_then(|i| case.tags.get(i)).map(|t| t.name.as_str());
        let query = InstallQuery {
            jukebox: "box",
            category: "think",
            name: "ollama",
            package_type: common::kind(kind),
            installed_tag: installed,
            framework: &fw,
            hold_upgrades: false,
            quarantined: &[],
            withheld: &[],
        };
        let path = vynil_rules::catalog::upgrade_path(&stored, &query);
        let mut current = installed.map(String::from);
        for step in &path.steps {
            let asked = InstallQuery { installed_tag: current.as_deref(), ..query.clone() };
            let picked = select_install(&stored, &asked).unwrap();
            prop_assert_eq!(&picked.tag, &step.tag);
            if let Some(previous) = current.as_deref().and_then(Tag::parse) {
                prop_assert!(Tag::parse(&step.tag).unwrap() > previous);
            }
            current = Some(step.tag.clone());
        }
        let asked = InstallQuery { installed_tag: current.as_deref(), ..query.clone() };
        match select_install(&stored, &asked) {
            Ok(stay) if !path.steps.is_empty() || installed.is_some_and(|t| Tag::parse(t).is_some()) => {
                let (stay, last) = (Tag::parse(&stay.tag), current.as_deref().and_then(Tag::parse));
                prop_assert!(stay <= last, "selection would go on from {:?}", current);
            }
            Ok(_) => prop_assert!(!path.steps.is_empty(), "a fresh install has a first step"),
            // From the last step nothing matches (its own minimum is above
            // it, say): the path ends there.
            Err(_) if !path.steps.is_empty() => prop_assert!(path.blocked.is_none()),
            Err(no_match) => prop_assert_eq!(path.blocked, Some(no_match)),
        }
    }

    /// (i) A quarantined revision is never selected, and quarantine is the
    /// only difference it makes: selecting with some tags quarantined is
    /// selecting from the catalog without them (but for why nothing matched).
    #[test]
    fn a_quarantined_revision_is_never_selected(
        case in case(),
        from in prop::option::of(0usize..14),
        quarantine in prop::collection::vec(0usize..14, 0..4),
        kind in kind_name(),
    ) {
        let fw = framework("0.8.0");
        let contents = contents(&case);
        let stored: Vec<Package> = view_of(&case, Channel::Stable, &fw)
            .tags()
            .into_iter()
            .map(|tag| Package::new("reg", "r/x", tag, contents[tag].clone()))
            .collect();
        let quarantined: Vec<String> =
            quarantine.iter().filter_map(|i| stored.get(*i)).map(|p| p.tag.clone()).collect();
        let installed = from.and_then(|i| case.tags.get(i)).map(|t| t.name.as_str());
        let query = InstallQuery {
            jukebox: "box",
            category: "think",
            name: "ollama",
            package_type: common::kind(kind),
            installed_tag: installed,
            framework: &fw,
            hold_upgrades: false,
            quarantined: &quarantined,
            withheld: &[],
        };
        let without: Vec<Package> =
            stored.iter().filter(|p| !query.is_quarantined(&p.tag)).cloned().collect();
        let plain = InstallQuery { quarantined: &[], ..query.clone() };
        match (select_install(&stored, &query), select_install(&without, &plain)) {
            (Ok(picked), Ok(expected)) => {
                prop_assert!(!quarantined.contains(&picked.tag), "{} is quarantined", picked.tag);
                prop_assert_eq!(&picked.tag, &expected.tag);
            }
            (Err(_), Err(_)) => {}
            (got, expected) => prop_assert!(false, "{:?} vs {:?}", got.map(|p| &p.tag), expected.map(|p| &p.tag)),
        }
    }

    /// (l) A recalled, too young or (under `enforce`) unverified revision is
    /// never selected — but the installed one, which a recall without
    /// move-away, its age or its signature lets an instance keep — and withholding is the only difference it makes:
    /// selecting with revisions withheld is selecting from the catalog
    /// without them (but for why nothing matched).
    #[test]
    fn a_recalled_too_young_or_unverified_revision_is_never_selected(
        case in case(),
        from in prop::option::of(0usize..14),
        recall in prop::collection::vec((0usize..14, any::<bool>()), 0..4),
        ages in prop::collection::vec(prop::option::of(0i64..200), 14),
        minimum in prop::option::of(0i64..150),
        verified in prop::collection::vec(prop::option::of(any::<bool>()), 14),
        enforce in any::<bool>(),
        kind in kind_name(),
    ) {
        use vynil_rules::signature::{Verdict, VerifyMode};
        use vynil_rules::upgrade::withheld::{Holds, Recall, withheld};
        let now: jiff::Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
        let fw = framework("0.8.0");
        let contents = contents(&case);
        let stored: Vec<Package> = view_of(&case, Channel::Stable, &fw)
            .tags()
            .into_iter()
            .enumerate()
            .map(|(i, tag)| {
                let mut p = Package::new("reg", "r/x", tag, contents[tag].clone());
                p.first_seen = ages[i].map(|h| (now - jiff::SignedDuration::from_hours(h)).to_string());
                p.signature = verified[i].map(|ok| match ok {
                    true => Verdict::Verified { key: "k".into(), reference: "reg/r/x".into() },
                    false => Verdict::UntrustedKey,
                });
                p
            })
            .collect();
        let recalls: Vec<Recall> = recall
            .iter()
            .filter_map(|(i, away)| stored.get(*i).map(|p| (p, away)))
            .map(|(p, away)| Recall { tag: p.tag.clone(), reason: "bad".into(), move_away: *away })
            .collect();
        let holds = Holds {
            recalls: &recalls,
            minimum_age: minimum.map(jiff::SignedDuration::from_hours),
            verify: enforce.then_some(VerifyMode::Enforce),
        };
        let held = withheld(&stored, holds, now);
        if enforce {
            let unverified = stored.iter().filter(|p| !p.signature.as_ref().is_some_and(Verdict::is_verified));
            for p in unverified {
                prop_assert!(held.iter().any(|w| w.holds(p)), "{} is not verified", p.tag);
            }
        }
        let installed = from.and_then(|i| case.tags.get(i)).map(|t| t.name.as_str());
        let query = InstallQuery {
            installed_tag: installed,
            withheld: &held,
            ..InstallQuery::of("box", "think", "ollama", common::kind(kind), &fw)
        };
        let kept = |p: &Package| {
            installed == Some(p.tag.as_str())
                && held.iter().filter(|w| w.holds(p)).all(|w| w.keeps_installed())
        };
        let withheld_tag = |p: &Package| held.iter().any(|w| w.holds(p)) && !kept(p);
        let without: Vec<Package> = stored.iter().filter(|p| !withheld_tag(p)).cloned().collect();
        let plain = InstallQuery { withheld: &[], ..query.clone() };
        match (select_install(&stored, &query), select_install(&without, &plain)) {
            (Ok(picked), Ok(expected)) => {
                prop_assert!(!withheld_tag(picked), "{} is withheld: {:?}", picked.tag, held);
                prop_assert_eq!(&picked.tag, &expected.tag);
            }
            (Err(_), Err(_)) => {}
            (got, expected) => prop_assert!(false, "{:?} vs {:?}", got.map(|p| &p.tag), expected.map(|p| &p.tag)),
        }
    }

    /// (e) A merge never loses an entry outside its filter, nor one of a failed repository.
    #[test]
    fn a_merge_never_loses_an_entry_outside_the_filter(
        previous in prop::collection::vec((0usize..3, 0usize..3, 0u64..3), 0..10),
        found in prop::collection::vec((0usize..3, 0usize..3, 0u64..3), 0..6),
        failed in prop::collection::vec(prop::bool::ANY, 9),
        filter_kind in 0usize..3,
    ) {
        let categories = ["db", "apps", "mon"];
        let names = ["a", "b", "c"];
        let make = |(c, n, v): (usize, usize, u64)| {
            Package::new("reg", &format!("{}/{}", categories[c], names[n]), &format!("{v}.0.0"), content_of(categories[c], names[n], "tenant", None, None))
        };
        let previous: Vec<Package> = previous.into_iter().map(make).collect();
        let filter = match filter_kind {
            0 => None,
            1 => Some(ScanFilter::parse("db").unwrap()),
            _ => Some(ScanFilter::parse("db/a").unwrap()),
        };
        let mut outcomes: Vec<((String, String), RepositoryOutcome)> = Vec::new();
        for (index, (c, n)) in (0..3).flat_map(|c| (0..3).map(move |n| (c, n))).enumerate() {
            let repository = ("reg".to_string(), format!("{}/{}", categories[c], names[n]));
            let selected = filter.as_ref().is_none_or(|f| f.category == categories[c] && f.name.as_deref().is_none_or(|x| x == names[n]));
            if !selected { continue; }
            let outcome = if failed[index] {
                RepositoryOutcome::Failed
            } else {
                RepositoryOutcome::Scanned(found.iter().filter(|(fc, fnm, _)| *fc == c && *fnm == n).map(|x| make(*x)).collect())
            };
            outcomes.push((repository, outcome));
        }
        let merged = merge_packages(&previous, filter.as_ref(), &outcomes);
        for p in &previous {
            let outside = filter.as_ref().is_some_and(|f| !f.matches(p));
            let repo_failed = outcomes.iter().any(|((_, image), o)| image == &p.image && matches!(o, RepositoryOutcome::Failed));
            if outside || repo_failed {
                prop_assert!(merged.contains(p), "{}:{} lost", p.image, p.tag);
            }
        }
    }

    /// (e') A repository-scoped merge replaces exactly that repository's
    /// entries by its new view (none of them when its scan failed) and
    /// leaves every other entry, in order.
    #[test]
    fn a_repository_scoped_merge_touches_only_its_repository(
        previous in prop::collection::vec((0usize..3, 0usize..3, 0u64..3), 0..12),
        found in prop::collection::vec(0u64..4, 0..5),
        scanned in (0usize..3, 0usize..3),
        failed in prop::bool::ANY,
    ) {
        let categories = ["db", "apps", "mon"];
        let names = ["a", "b", "c"];
        let make = |(c, n, v): (usize, usize, u64)| {
            Package::new("reg", &format!("{}/{}", categories[c], names[n]), &format!("{v}.0.0"), content_of(categories[c], names[n], "tenant", None, None))
        };
        let previous: Vec<Package> = previous.into_iter().map(make).collect();
        let repository = ("reg".to_string(), format!("{}/{}", categories[scanned.0], names[scanned.1]));
        let view: Vec<Package> = found.iter().map(|v| make((scanned.0, scanned.1, *v))).collect();
        let outcome = if failed { RepositoryOutcome::Failed } else { RepositoryOutcome::Scanned(view.clone()) };
        let scope = vynil_rules::ScanScope::Repository(repository.clone());
        let merged = vynil_rules::merge_scoped(&previous, &scope, &[(repository.clone(), outcome)]);
        let ours = |p: &Package| p.registry == repository.0 && p.image == repository.1;
        let others = |list: &[Package]| list.iter().filter(|p| !ours(p)).cloned().collect::<Vec<_>>();
        prop_assert_eq!(others(&merged), others(&previous));
        let mine: Vec<Package> = merged.iter().filter(|p| ours(p)).cloned().collect();
        if failed {
            prop_assert_eq!(mine, previous.iter().filter(|p| ours(p)).cloned().collect::<Vec<_>>());
        } else {
            prop_assert_eq!(mine, view);
        }
    }

    /// (f) No parser panics, whatever the input.
    #[test]
    fn no_parser_panics_on_arbitrary_strings(raw in any::<String>(), json in "[\\[\\]{}\":,a-z0-9. ]{0,40}") {
        let _ = Tag::parse(&raw);
        let _ = vynil_rules::ArtifactTag::parse(&raw);
        let _ = ScanFilter::parse(&raw);
        for text in [&raw, &json] {
            let _ = vynil_rules::parse_annotations(|key| match key {
                vynil_rules::annotations::METADATA | vynil_rules::annotations::REQUIREMENTS
                | vynil_rules::annotations::OPTIONS | vynil_rules::annotations::RECOMMANDATIONS
                | vynil_rules::annotations::VALUE_SCRIPT => Some(text.as_str()),
                _ => None,
            });
            if let Ok(value) = serde_json::from_str::<serde_json::Value>(text) {
                let _ = vynil_rules::Requirement::from_value(&value);
            }
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// Every way of writing a Docker Hub repository is one identity, so a
    /// purge plan made under an alias sees the same usage and exclusions.
    #[test]
    fn every_alias_of_a_repository_is_one_identity(
        namespace in proptest::option::of("[a-z0-9]{1,8}"),
        name in "[a-z0-9][a-z0-9._-]{0,10}[a-z0-9]",
        host in prop::sample::select(vec!["docker.io", "index.docker.io", "registry-1.docker.io", "DOCKER.IO", "https://index.docker.io/"]),
        other in "[a-z]{1,8}\\.example(:[0-9]{2,4})?",
    ) {
        use vynil_rules::repository::{canonical, listed, same};
        let short = match &namespace { Some(ns) => format!("{ns}/{name}"), None => name.clone() };
        let full = match &namespace { Some(ns) => format!("{ns}/{name}"), None => format!("library/{name}") };
        prop_assert!(same((host, &short), ("docker.io", &full)));
        let entry = format!("{}/{}", host, short);
        prop_assert!(listed(&[entry], "docker.io", &full));
        prop_assert_eq!(canonical(&other.to_uppercase(), &short), canonical(&other, &short));
        prop_assert!(!same((&other, &short), ("docker.io", &short)), "another registry is another repository");
        // Issue #66 item 3: a trailing dot and HTTPS's default port are the
        // same host; another port is another registry.
        let (name, port) = other.split_once(':').map_or((other.as_str(), None), |(n, p)| (n, Some(p)));
        let with_port = |n: &str| port.map_or(n.to_string(), |p| format!("{n}:{p}"));
        let dotted = with_port(&format!("{name}."));
        prop_assert!(same((&dotted, &short), (&other, &short)), "a trailing dot");
        if port.is_none() {
            let default = format!("{name}:443");
            prop_assert!(same((&default, &short), (&other, &short)), "the default port");
            let spelled = format!("https://{name}.:443/v2/");
            prop_assert!(same((&spelled, &short), (&other, &short)));
            let elsewhere = format!("{name}:5000");
            prop_assert!(!same((&elsewhere, &short), (&other, &short)), "another port");
        }
        if !host.contains('/') {
            let dotted = format!("{host}.");
            prop_assert!(same((&dotted, &short), ("docker.io", &full)));
        }
    }
}

/// Maintenance windows and freezes (`vynil_rules::upgrade::window`).
mod windows {
    use jiff::{SignedDuration, Timestamp, ToSpan, civil::Date, tz::TimeZone};
    use proptest::prelude::*;
    use vynil_rules::upgrade::window::{Freeze, UpgradeGate, Window, next_open, upgrade_gate};

    /// Zones with DST of an hour (both hemispheres), of half an hour, and none.
    const ZONES: [&str; 5] =
        ["Europe/Paris", "America/New_York", "Australia/Sydney", "Australia/Lord_Howe", "UTC"];

    fn config() -> ProptestConfig {
        let cases: u32 = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(10_000);
        // Each case asks the cron library many times: a tenth of the others' cases.
        ProptestConfig { cases: (cases / 10).max(1), ..ProptestConfig::default() }
    }

    fn window() -> impl Strategy<Value = Window> {
        let schedule = prop_oneof![
            (0u32..60, 0u32..24).prop_map(|(m, h)| format!("{m} {h} * * *")),
            (0u32..24, 0u32..7).prop_map(|(h, d)| format!("0 {h} * * {d}")),
            (1u32..6).prop_map(|n| format!("0 */{n} * * *")),
            (1u32..29, 0u32..24).prop_map(|(day, h)| format!("30 {h} {day} * *")),
        ];
        (schedule, 0usize..ZONES.len(), prop_oneof![Just("30m"), Just("1h"), Just("4h"), Just("26h")])
            .prop_map(|(s, z, d)| Window::parse(&s, ZONES[z], d).unwrap())
    }

    fn instant() -> impl Strategy<Value = Timestamp> {
        // 2026 and 2027, to the second.
        (1_767_225_600i64..1_830_297_600).prop_map(|s| Timestamp::from_second(s).unwrap())
    }

    fn freeze() -> impl Strategy<Value = Freeze> {
        (instant(), 1i64..(30 * 86_400)).prop_map(|(from, length)| Freeze {
            from,
            until: from.checked_add(SignedDuration::from_secs(length)).unwrap(),
            reason: String::new(),
        })
    }

    proptest! {
        #![proptest_config(config())]

        /// (j) The gate is monotone in time: from any moment, the next time
        /// it opens is the same as seen from any later moment before it (no
        /// window skipped as time passes), it is open then, and closed in between.
        #[test]
        fn the_window_gate_is_monotone_in_time(
            windows in prop::collection::vec(window(), 0..3),
            freezes in prop::collection::vec(freeze(), 0..2),
            now in instant(),
            step in 0.0f64..1.0,
        ) {
            let windows = [windows];
            let Some(opens) = next_open(&windows, &freezes, now) else { return Ok(()) };
            prop_assert!(opens >= now);
            prop_assert_eq!(upgrade_gate(&windows, &freezes, opens), UpgradeGate::Open);
            let span = opens.as_second() - now.as_second();
            let later = Timestamp::from_second(now.as_second() + (span as f64 * step) as i64).unwrap();
            prop_assert_eq!(next_open(&windows, &freezes, later), Some(opens));
            if later < opens {
                let waits = matches!(upgrade_gate(&windows, &freezes, later), UpgradeGate::Wait { until: Some(u), .. } if u == opens);
                prop_assert!(waits, "closed before it opens, saying when");
            }
        }

        /// (k) A window at a fixed local time opens exactly once on each
        /// local day it is scheduled, DST days included (none skipped, none doubled).
        #[test]
        fn a_fixed_time_window_opens_once_a_local_day_through_dst(
            minute in 0u32..60,
            hour in 0u32..24,
            zone in 0usize..ZONES.len(),
            // Any day of 2026–2027, and often a DST day of one of the zones.
            day in prop_oneof![
                3 => 0i32..730,
                2 => prop::sample::select(vec![66, 87, 94, 276, 297, 304, 437, 451, 458, 640, 668, 675]),
            ],
        ) {
            let window = Window::parse(&format!("{minute} {hour} * * *"), ZONES[zone], "1h").unwrap();
            let tz = TimeZone::get(ZONES[zone]).unwrap_or(TimeZone::UTC);
            let date = Date::new(2026, 1, 1).unwrap().checked_add(day.days()).unwrap();
            let start = date.to_zoned(tz.clone()).unwrap().timestamp();
            let end = date.tomorrow().unwrap().to_zoned(tz).unwrap().timestamp();
            let mut count = 0;
            let mut after = start.checked_sub(SignedDuration::from_secs(1)).unwrap();
            while let Some(next) = window.next_opening(after).filter(|n| *n < end) {
                count += 1;
                after = next;
            }
            prop_assert_eq!(count, 1, "{} {:02}:{:02} in {}", date, hour, minute, ZONES[zone]);
        }
    }
}

/// Waves (`vynil_rules::upgrade::waves`).
mod waves {
    use std::collections::BTreeMap;

    use jiff::{SignedDuration, Timestamp};
    use proptest::prelude::*;
    use vynil_rules::upgrade::waves::{Member, Wave, WaveGate, wave_gate, wave_of};

    const TAGS: [&str; 3] = ["0.1.0", "0.2.0", "0.3.0"];

    /// An instance: its wave label (or none), the tag it runs, hours since it
    /// was installed, whether 0.3.0 is quarantined for it, whether its Job
    /// for 0.3.0 started.
    type Drawn = (Option<u8>, usize, i64, bool, bool);

    fn drawn() -> impl Strategy<Value = Drawn> {
        (prop::option::of(0u8..3), 0usize..3, 0i64..6, prop::bool::weighted(0.1), prop::bool::weighted(0.2))
    }

    /// Waves of these soak and patience hours.
    fn waves(hours: &[(i64, i64)]) -> Vec<Wave> {
        hours
            .iter()
            .enumerate()
            .map(|(i, (soak, patience))| {
                let selector = BTreeMap::from([("wave".to_string(), i.to_string())]);
                let (soak, patience) =
                    (SignedDuration::from_hours(*soak), SignedDuration::from_hours(*patience));
                Wave { name: format!("w{i}"), selector, soak, patience }
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

        /// (l) The wave order is a function of (namespace) labels alone, so
        /// the gate does not depend on the order instances are listed in; it
        /// never opens while an instance of an earlier wave failed to upgrade
        /// to the revision, or started to and is not there yet, nor while one
        /// that never started it is within its wave's patience; and it is
        /// monotone in time.
        #[test]
        fn the_wave_gate_follows_labels_alone_and_is_monotone_in_time(
            hours in prop::collection::vec((0i64..4, 0i64..8), 0..3),
            fleet in prop::collection::vec(drawn(), 0..8),
            mine in 0usize..4,
            shift in 0usize..8,
            later in 0i64..10,
            available_hours_ago in 0i64..10,
        ) {
            let waves = waves(&hours);
            // An instance's wave is one of the listed ones or the rest after them.
            let mine = mine.min(waves.len());
            let now: Timestamp = "2026-12-05T12:00:00Z".parse().unwrap();
            let available = now - SignedDuration::from_hours(available_hours_ago);
            let labels: Vec<BTreeMap<String, String>> = fleet
                .iter()
                .map(|(wave, ..)| wave.map(|w| BTreeMap::from([("wave".to_string(), w.to_string())])).unwrap_or_default())
                .collect();
            let names: Vec<String> = (0..fleet.len()).map(|i| format!("i{i}")).collect();
            let failed = ["0.3.0".to_string()];
            let members: Vec<Member> = fleet
                .iter()
                .enumerate()
                .map(|(i, (_, tag, hours, quarantined, started))| Member {
                    name: &names[i],
                    labels: &labels[i],
                    installed: Some(TAGS[*tag]),
                    installed_at: Some(now - SignedDuration::from_hours(*hours)),
                    started: started.then_some("0.3.0"),
                    quarantined: if *quarantined { &failed } else { &[] },
                })
                .collect();
            let gate = wave_gate(&waves, mine, "0.3.0", &members, available, now);
            let mut rotated = members.clone();
            if !rotated.is_empty() {
                let by = shift % rotated.len();
                rotated.rotate_left(by);
            }
            prop_assert_eq!(&wave_gate(&waves, mine, "0.3.0", &rotated, available, now), &gate);
            let earlier = |m: &Member| wave_of(&waves, m.labels) < mine;
            let patient = |m: &Member| available + waves[wave_of(&waves, m.labels)].patience > now;
            let blocking = members.iter().filter(|m| earlier(m)).any(|m| {
                let behind = m.installed != Some("0.3.0");
                !m.quarantined.is_empty() || (behind && (m.started == Some("0.3.0") || patient(m)))
            });
            if blocking {
                prop_assert!(!matches!(gate, WaveGate::Open { .. }), "{:?}", gate);
            }
            if let WaveGate::Open { skipped } = &gate {
                // Only never-started members are skipped, each named once.
                for m in members.iter().filter(|m| earlier(m) && m.installed != Some("0.3.0")) {
                    prop_assert_eq!(skipped.iter().filter(|s| s.starts_with(&format!("{} ", m.name))).count(), 1);
                }
                let after = now + SignedDuration::from_hours(later);
                prop_assert_eq!(&wave_gate(&waves, mine, "0.3.0", &members, available, after), &gate);
            }
            // A soak or patience that ends is over: the gate then opens or waits for a later wave.
            if let WaveGate::Wait { until: Some(until), .. } = &gate {
                prop_assert_ne!(&wave_gate(&waves, mine, "0.3.0", &members, available, *until), &gate);
            }
        }
    }
}

/// Signatures (`vynil_rules::signature`).
mod signatures {
    use base64::Engine as _;
    use p256::ecdsa::{SigningKey, signature::Signer as _};
    use p256::pkcs8::EncodePublicKey as _;
    use proptest::prelude::*;
    use vynil_rules::signature::{Evidence, Keyring, SignedPayload, Verdict, simple_signing_payload, verify};

    fn config() -> ProptestConfig {
        let cases: u32 = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(10_000);
        // Each case signs and verifies (ECDSA): a hundredth of the others' cases.
        ProptestConfig { cases: (cases / 100).max(16), ..ProptestConfig::default() }
    }

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_slice(&[seed.max(1); 32]).unwrap()
    }

    fn pem(key: &SigningKey) -> String {
        key.verifying_key().to_public_key_pem(Default::default()).unwrap()
    }

    fn digest(n: u8) -> String {
        format!("sha256:{}", hex::encode([n; 32]))
    }

    /// An in-toto Statement naming `digest(named)` (cosign's signature
    /// predicate, or SLSA provenance), and `signer`'s DER signature of its PAE.
    fn statement_signed(signer: u8, named: u8, sign: bool) -> (Vec<u8>, Vec<u8>) {
        use vynil_rules::signature::bundle::{IN_TOTO_PAYLOAD_TYPE, SIGN_PREDICATE_TYPE, pae};
        let predicate = if sign { SIGN_PREDICATE_TYPE } else { "https://slsa.dev/provenance/v1" };
        let statement = serde_json::to_vec(&serde_json::json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"digest": {"sha256": hex::encode([named; 32])}}],
            "predicateType": predicate,
            "predicate": {},
        }))
        .unwrap();
        let signature: p256::ecdsa::Signature = key(signer).sign(&pae(IN_TOTO_PAYLOAD_TYPE, &statement));
        (statement, signature.to_der().as_bytes().to_vec())
    }

    /// A keyed bundle of `statement` with the signature `sig`.
    fn bundle_of(statement: &[u8], sig: &[u8]) -> Vec<u8> {
        use vynil_rules::signature::bundle::{BUNDLE_MEDIA_TYPES, IN_TOTO_PAYLOAD_TYPE};
        let b64 = base64::engine::general_purpose::STANDARD;
        serde_json::to_vec(&serde_json::json!({
            "mediaType": BUNDLE_MEDIA_TYPES[0],
            "verificationMaterial": {"publicKey": {"hint": ""}},
            "dsseEnvelope": {
                "payload": b64.encode(statement),
                "payloadType": IN_TOTO_PAYLOAD_TYPE,
                "signatures": [{"sig": b64.encode(sig)}],
            },
        }))
        .unwrap()
    }

    proptest! {
        #![proptest_config(config())]

        /// (m) A revision is verified exactly when some layer is a trusted
        /// key's signature of a payload naming its digest; flipping any byte
        /// of a payload or a signature never makes it verified, and the order
        /// of the layers changes nothing.
        #[test]
        fn only_an_intact_trusted_signature_of_the_digest_verifies(
            layers in prop::collection::vec((1u8..4, 0u8..3), 0..4),
            trusted in prop::collection::btree_set(1u8..4, 0..3),
            subject in 0u8..3,
            flip in prop::option::of((any::<prop::sample::Index>(), any::<bool>(), 1u8..=255)),
        ) {
            let evidence = Evidence {
                layers: layers
                    .iter()
                    .map(|(signer, named)| {
                        let payload = simple_signing_payload("reg/r/x", &digest(*named));
                        let signature: p256::ecdsa::Signature = key(*signer).sign(&payload);
                        SignedPayload {
                            payload,
                            signature: base64::engine::general_purpose::STANDARD.encode(signature.to_der()),
                        }
                    })
                    .collect(),
                ..Evidence::default()
            };
            let pems: Vec<(String, String)> = trusted.iter().map(|k| (format!("k{k}"), pem(&key(*k)))).collect();
            let keys = Keyring::parse(pems.iter().map(|(n, p)| (n.as_str(), p.as_str()))).unwrap();
            let expected = layers.iter().any(|(signer, named)| trusted.contains(signer) && *named == subject);
            let verdict = verify(&digest(subject), Some(&evidence), &keys);
            prop_assert_eq!(verdict.is_verified(), expected, "{:?}", verdict);
            let mut reversed = evidence.clone();
            reversed.layers.reverse();
            prop_assert_eq!(verify(&digest(subject), Some(&reversed), &keys).is_verified(), expected);
            if let (Some((at, in_payload, xor)), false) = (flip, evidence.layers.is_empty()) {
                let mut changed = evidence.clone();
                let layer = &mut changed.layers[at.index(evidence.layers.len())];
                if in_payload {
                    let i = at.index(layer.payload.len());
                    layer.payload[i] ^= xor;
                } else {
                    let mut bytes = base64::engine::general_purpose::STANDARD.decode(&layer.signature).unwrap();
                    let i = at.index(bytes.len());
                    bytes[i] ^= xor;
                    layer.signature = base64::engine::general_purpose::STANDARD.encode(bytes);
                }
                let others_verify = changed.layers.iter().any(|l| {
                    verify(&digest(subject), Some(&Evidence { layers: vec![l.clone()], problems: vec![], ..Default::default() }), &keys)
                        .is_verified()
                });
                let verdict = verify(&digest(subject), Some(&changed), &keys);
                prop_assert_eq!(verdict.is_verified(), others_verify, "{:?}", verdict);
                // The changed layer alone never verifies.
                let alone = Evidence { layers: vec![changed.layers[at.index(evidence.layers.len())].clone()], problems: vec![], ..Default::default() };
                let alone = verify(&digest(subject), Some(&alone), &keys);
                prop_assert!(!matches!(alone, Verdict::Verified { .. }), "{:?}", alone);
            }
        }

        /// (m, bundles) The same of Sigstore bundles: verified exactly when
        /// some bundle is a trusted key's DSSE signature of a Statement with
        /// cosign's signature predicate naming the digest (an attestation
        /// never counts); a byte flipped in a signed Statement or in a
        /// signature never verifies.
        #[test]
        fn only_an_intact_trusted_bundle_of_the_digest_verifies(
            bundles in prop::collection::vec((1u8..4, 0u8..3, any::<bool>()), 0..4),
            trusted in prop::collection::btree_set(1u8..4, 0..3),
            subject in 0u8..3,
            flip in prop::option::of((any::<prop::sample::Index>(), any::<bool>(), 1u8..=255)),
        ) {
            let pems: Vec<(String, String)> = trusted.iter().map(|k| (format!("k{k}"), pem(&key(*k)))).collect();
            let keys = Keyring::parse(pems.iter().map(|(n, p)| (n.as_str(), p.as_str()))).unwrap();
            let made: Vec<(Vec<u8>, Vec<u8>)> =
                bundles.iter().map(|(signer, named, sign)| statement_signed(*signer, *named, *sign)).collect();
            let evidence = |made: &[(Vec<u8>, Vec<u8>)]| Evidence {
                bundles: made.iter().map(|(statement, sig)| bundle_of(statement, sig)).collect(),
                ..Evidence::default()
            };
            let expected =
                bundles.iter().any(|(signer, named, sign)| trusted.contains(signer) && *named == subject && *sign);
            let verdict = verify(&digest(subject), Some(&evidence(&made)), &keys);
            prop_assert_eq!(verdict.is_verified(), expected, "{:?}", verdict);
            if let (Some((at, in_statement, xor)), false) = (flip, made.is_empty()) {
                let mut changed = made[at.index(made.len())].clone();
                let bytes = if in_statement { &mut changed.0 } else { &mut changed.1 };
                let i = at.index(bytes.len());
                bytes[i] ^= xor;
                let alone = verify(&digest(subject), Some(&evidence(&[changed])), &keys);
                prop_assert!(!alone.is_verified(), "{:?}", alone);
            }
        }
    }
}

/// Every policy duration and time computation fails closed
/// (`vynil_rules::upgrade`): whatever a policy writes, an overflow holds, and
/// a gate answers within a bounded number of steps.
mod fail_closed {
    use std::collections::BTreeMap;

    use jiff::{SignedDuration, Timestamp, tz::TimeZone};
    use proptest::prelude::*;
    use vynil_rules::{
        Package, PackageContent, PackageType,
        upgrade::{
            LONGEST_DURATION,
            waves::{Member, Wave, WaveGate, wave_gate},
            window::{Freeze, Search, Window, search},
            withheld::{Holds, withheld},
        },
    };

    /// A duration in seconds: minutes to days, around the bound, or far past what a date holds.
    fn seconds() -> impl Strategy<Value = i64> {
        let bound = LONGEST_DURATION.as_secs();
        prop_oneof![1i64..86_400 * 3, (bound - 5)..(bound + 5), 1i64..(i64::MAX / 4)]
    }

    /// Schedules of every frequency, from every second to once in four years.
    fn schedule() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("* * * * * *".to_string()),
            (0u32..60).prop_map(|s| format!("{s} * * * * *")),
            Just("* * * * *".to_string()),
            (1u32..30).prop_map(|n| format!("*/{n} * * * *")),
            (0u32..60, 0u32..24).prop_map(|(m, h)| format!("{m} {h} * * *")),
            (0u32..24, 0u32..7).prop_map(|(h, d)| format!("0 {h} * * {d}")),
            Just("0 0 29 2 *".to_string()),
        ]
    }

    /// 2026–2027, or the last years a date can hold.
    fn instant() -> impl Strategy<Value = Timestamp> {
        let end = Timestamp::MAX.as_second();
        prop_oneof![
            4 => 1_767_225_600i64..1_830_297_600,
            1 => (end - 86_400 * 800)..end,
        ]
        .prop_map(|s| Timestamp::from_second(s).unwrap())
    }

    /// The oracle: whether `window` (`schedule` in UTC, `length` s) holds
    /// `at`, from the last opening at or before it (the product looks forward).
    fn inside(schedule: &str, length: i64, at: Timestamp) -> bool {
        let parser = croner::parser::CronParser::builder().seconds(croner::parser::Seconds::Optional).build();
        let cron = parser.parse(schedule).unwrap();
        let zoned = at.to_zoned(TimeZone::UTC);
        cron.find_previous_occurrence(&zoned, true).is_ok_and(|last| {
            i128::from(last.timestamp().as_second()) + i128::from(length) > i128::from(at.as_second())
        })
    }

    fn config() -> ProptestConfig {
        let cases: u32 = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(10_000);
        ProptestConfig { cases: (cases / 10).max(1), ..ProptestConfig::default() }
    }

    proptest! {
        #![proptest_config(config())]

        /// (m) A window's duration is refused past its bound; the gate never
        /// opens where no window of every set holds, or inside a freeze; and
        /// one set's next opening is found within two steps a freeze and two
        /// more, whatever its schedule's frequency.
        #[test]
        fn a_window_never_opens_earlier_than_its_policy_allows_and_answers_in_bounded_steps(
            windows in prop::collection::vec((schedule(), seconds()), 1..3),
            narrowing in prop::collection::vec((schedule(), seconds()), 0..2),
            freezes in prop::collection::vec((instant(), 1i64..(40 * 86_400)), 0..2),
            now in instant(),
            fraction in 0.0f64..1.0,
        ) {
            let parse = |(s, length): &(String, i64)| (Window::parse(s, "UTC", &format!("{length}s")), s.clone(), *length);
            let mut sets = Vec::new();
            let mut written = Vec::new();
            for set in [&windows, &narrowing] {
                let mut parsed = Vec::new();
                for (window, schedule, length) in set.iter().map(parse) {
                    prop_assert_eq!(window.is_ok(), length <= LONGEST_DURATION.as_secs(), "{} for {}s", schedule, length);
                    if let Ok(window) = window {
                        parsed.push(window);
                        written.push((sets.len(), schedule, length));
                    }
                }
                sets.push(parsed);
            }
            let freezes: Vec<Freeze> = freezes
                .iter()
                .filter_map(|(from, length)| Some(Freeze { from: *from, until: from.checked_add(SignedDuration::from_secs(*length)).ok()?, reason: String::new() }))
                .collect();
            let allowed = |at: Timestamp| {
                !freezes.iter().any(|f| f.from <= at && at < f.until)
                    && (0..sets.len()).all(|set| {
                        sets[set].is_empty() || written.iter().filter(|(s, ..)| *s == set).any(|(_, schedule, length)| inside(schedule, *length, at))
                    })
            };
            let found = search(&sets, &freezes, now);
            if sets[1].is_empty() {
                prop_assert_ne!(found, Search::GaveUp, "one set never gives up");
                if let Search::Opens { steps, .. } = found {
                    prop_assert!(steps <= 2 * freezes.len() + 2, "{} steps", steps);
                }
            }
            if let Search::Opens { at, .. } = found {
                prop_assert!(at >= now && allowed(at), "opens at {} where the policy does not allow it", at);
                let span = at.as_second() - now.as_second();
                let before = Timestamp::from_second(now.as_second() + (span as f64 * fraction) as i64).unwrap();
                if before < at {
                    // Closed before: a window of one set may hold `before` and
                    // another's not; the gate is closed unless every set holds it.
                    prop_assert!(!allowed(before), "open at {} before the opening found, {}", before, at);
                }
            }
        }

        /// (n) A minimum age of any length holds a revision until its first
        /// sighting plus that age, counted without overflow: never sooner.
        #[test]
        fn a_minimum_age_of_any_length_never_lets_a_revision_through_sooner(
            age in seconds(),
            seen_hours_ago in prop::option::of(0i64..100_000),
            now in instant(),
        ) {
            let mut package = Package::new("r", "i", "1.0.0", PackageContent::minimal("c", "n", PackageType::Tenant));
            package.first_seen = seen_hours_ago.and_then(|h| now.checked_sub(SignedDuration::from_hours(h)).ok()).map(|t| t.to_string());
            let seen = package.first_seen.as_deref().map_or(now, |t| t.parse().unwrap());
            let holds = Holds { minimum_age: Some(SignedDuration::from_secs(age)), ..Holds::default() };
            let held = !withheld(std::slice::from_ref(&package), holds, now).is_empty();
            let old_enough = i128::from(now.as_second()) - i128::from(seen.as_second()) >= i128::from(age);
            prop_assert!(held || old_enough, "{}s since the first sighting, minimum age {}s", now.as_second() - seen.as_second(), age);
        }

        /// (o) A soak of any length keeps the next wave waiting until the
        /// earlier wave's last install plus that soak: never sooner.
        #[test]
        fn a_soak_of_any_length_never_opens_the_next_wave_sooner(
            soak in seconds(),
            installed_hours_ago in prop::collection::vec(0i64..100_000, 1..4),
            now in instant(),
        ) {
            let selector = BTreeMap::from([("wave".to_string(), "canary".to_string())]);
            let soak = SignedDuration::from_secs(soak);
            let waves = [Wave { name: "canary".into(), selector: selector.clone(), soak, patience: SignedDuration::ZERO }];
            let soak = soak.as_secs();
            let names: Vec<String> = (0..installed_hours_ago.len()).map(|i| format!("c{i}")).collect();
            let at: Vec<Timestamp> = installed_hours_ago.iter().map(|h| now.checked_sub(SignedDuration::from_hours(*h)).unwrap_or(now)).collect();
            let members: Vec<Member> = names
                .iter()
                .zip(&at)
                .map(|(name, at)| Member { name, labels: &selector, installed: Some("2.0.0"), installed_at: Some(*at), started: None, quarantined: &[] })
                .collect();
            let last = at.iter().max().unwrap();
            let soaked = i128::from(now.as_second()) - i128::from(last.as_second()) >= i128::from(soak);
            if matches!(wave_gate(&waves, 1, "2.0.0", &members, now, now), WaveGate::Open { .. }) {
                prop_assert!(soaked, "open {}s after the last install, soak {}s", now.as_second() - last.as_second(), soak);
            }
        }
    }
}
