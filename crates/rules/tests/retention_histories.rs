//! Exact keep/delete sets, with every reason, for the histories that matter.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use common::*;
use vynil_rules::{
    RetentionConfig, RetentionPlan, plan_retention,
    retention::{InstalledRevision, RevisionUse, Usage},
};

fn plan<'a>(
    tags: &'a [vynil_rules::retention::RepositoryTag],
    usage: &Usage,
    pins: &[&str],
) -> RetentionPlan<'a> {
    let pins: Vec<String> = pins.iter().map(|p| p.to_string()).collect();
    let config = RetentionConfig::new(framework("0.8.0"), &pins).unwrap();
    plan_retention(tags, usage, &config).unwrap()
}

/// `(tag, kept, reasons)` in plan order.
fn summary(plan: &RetentionPlan) -> Vec<(String, bool, Vec<String>)> {
    plan.entries.iter().map(|e| (e.tag.to_string(), e.is_kept(), e.reasons())).collect()
}

fn row(tag: &str, kept: bool, reasons: &[&str]) -> (String, bool, Vec<String>) {
    (tag.to_string(), kept, reasons.iter().map(|r| r.to_string()).collect())
}

#[test]
fn the_think_ollama_history_keeps_the_last_tenant_revision() {
    let tags = [
        vynil_tag("0.1.5", "a", "tenant", None, None),
        vynil_tag("0.1.8", "b", "tenant", Some("0.1.0"), None),
        vynil_tag("0.1.9", "c", "service", Some("0.1.8"), None),
        vynil_tag("0.1.10", "d", "service", None, None),
    ];
    let plan = plan(&tags, &Usage::Known(vec![]), &[]);
    assert_eq!(
        summary(&plan),
        [
            row(
                "0.1.10",
                true,
                &["head of stable", "head of beta", "head of alpha", "last service revision"]
            ),
            row("0.1.9", false, &["superseded"]),
            row(
                "0.1.8",
                true,
                &[
                    "newest tenant revision shown to stable",
                    "newest tenant revision shown to beta",
                    "newest tenant revision shown to alpha",
                    "last tenant revision",
                ]
            ),
            row("0.1.5", false, &["superseded"]),
        ]
    );
    assert!(!plan.usage_unknown);
}

#[test]
fn a_channel_history_keeps_each_head_and_the_shared_waypoint() {
    let tags = [
        vynil_tag("2.0.0-alpha.1", "a", "tenant", Some("1.0.0"), None),
        vynil_tag("1.2.0-beta.2", "b", "tenant", Some("1.0.0"), None),
        vynil_tag("1.2.0-beta.1", "c", "tenant", Some("1.0.0"), None),
        vynil_tag("1.1.0", "d", "tenant", Some("1.0.0"), None),
        vynil_tag("1.1.0-rc.1", "e", "tenant", Some("1.0.0"), None),
        vynil_tag("1.0.0", "f", "tenant", None, None),
        vynil_tag("0.9.0", "g", "tenant", None, None),
    ];
    let plan = plan(&tags, &Usage::Known(vec![]), &[]);
    assert_eq!(
        summary(&plan),
        [
            row("2.0.0-alpha.1", true, &["head of alpha", "last tenant revision"]),
            row("1.2.0-beta.2", true, &["head of beta"]),
            row("1.2.0-beta.1", false, &["superseded"]),
            row("1.1.0", true, &["head of stable"]),
            row("1.1.0-rc.1", false, &["superseded"]),
            row(
                "1.0.0",
                true,
                &[
                    "waypoint reachable from any version (stable)",
                    "waypoint reachable from any version (beta)",
                    "waypoint reachable from any version (alpha)",
                ]
            ),
            row("0.9.0", false, &["superseded"]),
        ]
    );
}

#[test]
fn a_revision_needing_a_future_framework_keeps_what_todays_framework_installs() {
    let tags = [
        vynil_tag("3.0.0", "a", "tenant", Some("2.0.0"), Some("0.9.0")),
        vynil_tag("2.1.0", "b", "tenant", Some("2.0.0"), None),
        vynil_tag("2.0.0", "c", "tenant", None, None),
        vynil_tag("1.0.0", "d", "tenant", None, None),
    ];
    let plan = plan(&tags, &Usage::Known(vec![]), &[]);
    assert_eq!(plan.breakpoints, [framework("0.8.0"), framework("0.9.0")]);
    assert_eq!(
        summary(&plan),
        [
            row(
                "3.0.0",
                true,
                &[
                    "head of stable on vynil 0.9.0",
                    "head of beta on vynil 0.9.0",
                    "head of alpha on vynil 0.9.0",
                    "last tenant revision",
                ]
            ),
            row("2.1.0", true, &["head of stable", "head of beta", "head of alpha"]),
            row(
                "2.0.0",
                true,
                &[
                    "waypoint reachable from any version (stable)",
                    "waypoint reachable from any version (beta)",
                    "waypoint reachable from any version (alpha)",
                ]
            ),
            row("1.0.0", false, &["superseded"]),
        ]
    );
}

#[test]
fn noise_tags_are_kept_as_aliases_artifacts_or_unmanaged_and_orphans_go() {
    let hex = |label: &str| digest(label).trim_start_matches("sha256:").to_string();
    let tags = [
        vynil_tag("1.2.0", "one-two", "tenant", Some("1.0.0"), None),
        vynil_tag("1.1.0", "one-one", "tenant", Some("1.0.0"), None),
        vynil_tag("1.0.0", "one-zero", "tenant", None, None),
        vynil_tag("0.9.0", "zero-nine", "tenant", None, None),
        plain_tag("latest", "one-two"),
        plain_tag("4.0", "four"),
        plain_tag("trivy--x", "trivy"),
        artifact_tag("one-two", "sig", "sig-12"),
        artifact_tag("one-two", "sbom", "sbom-12"),
        artifact_tag("one-one", "sig", "sig-11"),
        artifact_tag("latest-elsewhere", "att", "att-x"),
        // cosign v3's bundles on a registry without the referrers API: the
        // referrers tag schema's index, `sha256-<hex>` (#67 item 6).
        artifact_tag("one-two", "", "referrers-12"),
        artifact_tag("one-one", "", "referrers-11"),
    ];
    let plan = plan(&tags, &Usage::Known(vec![]), &[]);
    let sig = |label: &str, suffix: &str| format!("sha256-{}.{suffix}", hex(label));
    let mut expected = vec![
        row("1.2.0", true, &["head of stable", "head of beta", "head of alpha", "last tenant revision"]),
        row("1.1.0", false, &["superseded"]),
        row(
            "1.0.0",
            true,
            &[
                "waypoint reachable from any version (stable)",
                "waypoint reachable from any version (beta)",
                "waypoint reachable from any version (alpha)",
            ],
        ),
        row("0.9.0", false, &["superseded"]),
        row("4.0", true, &["unmanaged"]),
        row("latest", true, &["alias of 1.2.0 (same digest)"]),
        row(
            &sig("latest-elsewhere", "att"),
            false,
            &[&format!("orphaned attestation of {}", digest("latest-elsewhere"))],
        ),
        row(
            &format!("sha256-{}", hex("one-one")),
            false,
            &[&format!("orphaned referrers index of {}", digest("one-one"))],
        ),
        row(&sig("one-one", "sig"), false, &[&format!("orphaned signature of {}", digest("one-one"))]),
        row(&format!("sha256-{}", hex("one-two")), true, &["referrers index of 1.2.0"]),
        row(&sig("one-two", "sbom"), true, &["SBOM of 1.2.0"]),
        row(&sig("one-two", "sig"), true, &["signature of 1.2.0"]),
        row("trivy--x", true, &["unmanaged"]),
    ];
    // Non-version tags are listed by name.
    expected[4..].sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(summary(&plan), expected);

    // One DELETE per digest, subjects before orphaned artifacts.
    let deletions = plan.deletions();
    let order: Vec<(bool, Vec<String>)> =
        deletions.iter().map(|d| (d.artifacts_only, d.tags.clone())).collect();
    assert_eq!(order.len(), 5);
    assert!(order[..2].iter().all(|(artifacts, _)| !artifacts));
    assert!(order[2..].iter().all(|(artifacts, _)| *artifacts));
}

#[test]
fn a_version_pushed_without_annotations_is_unmanaged_and_ends_the_descent_as_the_scan_does() {
    let tags = [
        vynil_tag("2.0.0", "a", "tenant", Some("1.0.0"), None),
        plain_tag("1.5.0", "b"),
        vynil_tag("1.0.0", "c", "tenant", None, None),
        vynil_tag("0.5.0", "d", "service", None, None),
    ];
    let plan = plan(&tags, &Usage::Known(vec![]), &[]);
    assert_eq!(
        summary(&plan),
        [
            row("2.0.0", true, &["head of stable", "head of beta", "head of alpha", "last tenant revision"]),
            row("1.5.0", true, &["unmanaged"]),
            row("1.0.0", false, &["superseded"]),
            row(
                "0.5.0",
                true,
                &[
                    "newest service revision shown to stable",
                    "newest service revision shown to beta",
                    "newest service revision shown to alpha",
                    "last service revision",
                ]
            ),
        ]
    );
}

#[test]
fn installed_installing_pinned_and_rollback_target_revisions_are_kept_with_who_uses_them() {
    let tags = [
        vynil_tag("3.0.0", "a", "tenant", None, None),
        vynil_tag("2.0.0", "b", "tenant", None, None),
        vynil_tag("1.0.0", "c", "tenant", None, None),
        vynil_tag("0.9.0", "d", "tenant", None, None),
        vynil_tag("0.8.0", "e", "tenant", None, None),
        vynil_tag("0.7.0", "f", "tenant", None, None),
    ];
    let used = |tag: &str, digest: Option<String>, instance: &str, usage| InstalledRevision {
        tag: tag.into(),
        digest,
        instance: instance.into(),
        usage,
    };
    let usage = Usage::Known(vec![
        used("2.0.0", None, "tenant apps/one", RevisionUse::Installed),
        used("gone-tag", Some(digest("c")), "tenant apps/two", RevisionUse::Installing),
        used("0.9.0", None, "service apps/three", RevisionUse::Pinned),
        used("0.7.0", None, "tenant apps/four", RevisionUse::RollbackTarget),
    ]);
    let plan = plan(&tags, &usage, &["0.8.*"]);
    let reasons = |tag: &str| plan.entries.iter().find(|e| e.tag == tag).unwrap().reasons();
    assert_eq!(reasons("2.0.0"), ["installed by tenant apps/one"]);
    assert_eq!(reasons("1.0.0"), ["being installed by tenant apps/two"], "matched by recorded digest");
    assert_eq!(reasons("0.9.0"), ["pinned by service apps/three (initFrom.version)"]);
    assert_eq!(reasons("0.8.0"), ["pinned (retention pattern 0.8.*)"]);
    assert_eq!(reasons("0.7.0"), ["rollback target of tenant apps/four"]);
    assert_eq!(plan.deleted().count(), 0);
}

#[test]
fn unknown_usage_is_said_in_the_plan_and_changes_its_fingerprint() {
    let tags = [vynil_tag("1.0.0", "a", "tenant", None, None), vynil_tag("0.9.0", "b", "tenant", None, None)];
    let unknown = plan(&tags, &Usage::Unknown, &[]);
    let known = plan(&tags, &Usage::Known(vec![]), &[]);
    assert!(unknown.usage_unknown);
    assert_ne!(unknown.fingerprint, known.fingerprint);
}

#[test]
fn unreadable_metadata_of_a_version_refuses_the_plan_instead_of_guessing() {
    let mut broken = plain_tag("1.0.0", "a");
    broken.metadata = vynil_rules::retention::ManifestMetadata::Malformed("HTTP 500".into());
    let config = RetentionConfig::new(framework("0.8.0"), &[]).unwrap();
    let error = plan_retention(&[broken], &Usage::Known(vec![]), &config).unwrap_err();
    assert!(error.to_string().contains("1.0.0: HTTP 500"), "{error}");
}

#[test]
fn an_invalid_pin_pattern_is_a_clear_error() {
    let error = RetentionConfig::new(framework("0.8.0"), &["[1.0".to_string()]).unwrap_err();
    assert!(error.to_string().contains("retention pattern \"[1.0\" is invalid"), "{error}");
}

#[test]
fn the_config_fingerprint_follows_pins_and_framework_but_not_their_order() {
    let v = |s: &str| semver::Version::parse(s).unwrap();
    let pins = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let fingerprint = |fw: &str, p: &[&str]| RetentionConfig::new(v(fw), &pins(p)).unwrap().fingerprint();
    assert_eq!(fingerprint("0.8.0", &["1.*", "latest"]), fingerprint("0.8.0", &["latest", "1.*"]));
    assert_ne!(fingerprint("0.8.0", &["1.*", "latest"]), fingerprint("0.8.0", &["1.*"]));
    assert_ne!(fingerprint("0.8.0", &["1.*"]), fingerprint("0.9.0", &["1.*"]));
}

#[test]
fn a_stored_plan_is_stale_when_its_repository_or_usage_moved_but_not_for_its_own_deletions() {
    use vynil_rules::retention::{PlannedDeletion, PlannedTag, changes_since_planning};
    let (a, b) = (digest("a"), digest("b"));
    let planned = [
        PlannedTag { tag: "2.0.0", digest: &b, keep: true },
        PlannedTag { tag: "1.0.0", digest: &a, keep: false },
    ];
    let old_tags = vec!["1.0.0".to_string()];
    let deletions = [PlannedDeletion { digest: &a, tags: &old_tags }];
    let nobody = Usage::Known(vec![]);
    let changes = |fresh: &[(&str, &str)], usage: &Usage| {
        let fresh: Vec<_> = fresh.iter().map(|(name, label)| plain_tag(name, label)).collect();
        changes_since_planning("r/x", &planned, &deletions, &fresh, usage)
    };
    assert!(changes(&[("2.0.0", "b"), ("1.0.0", "a")], &nobody).is_empty());
    assert!(changes(&[("2.0.0", "b")], &nobody).is_empty(), "deleted by an earlier run of the plan");
    assert_eq!(changes(&[("1.0.0", "a")], &nobody), ["r/x: kept tag 2.0.0 disappeared"]);
    assert_eq!(
        changes(&[("2.0.0", "b"), ("1.0.0", "a"), ("3.0.0", "c")], &nobody),
        ["r/x: 3.0.0 was pushed since planning"]
    );
    let moved = changes(&[("2.0.0", "c"), ("1.0.0", "a")], &nobody);
    assert_eq!(moved.len(), 1);
    assert!(moved[0].starts_with("2.0.0 now points to"), "{moved:?}");
    let used = Usage::Known(vec![InstalledRevision {
        tag: "1.0.0".into(),
        digest: None,
        instance: "tenant ns/app".into(),
        usage: RevisionUse::Installed,
    }]);
    assert_eq!(changes(&[("2.0.0", "b"), ("1.0.0", "a")], &used), ["1.0.0 is now used by tenant ns/app"]);
}

#[test]
fn a_plan_over_several_repositories_has_one_order_sensitive_fingerprint() {
    use vynil_rules::retention::combined_fingerprint;
    assert_eq!(combined_fingerprint(&[("r/a", "sha256:1")]), "sha256:1", "one repository keeps its own");
    let both = combined_fingerprint(&[("r/a", "sha256:1"), ("r/b", "sha256:2")]);
    assert!(both.starts_with("sha256:") && both != "sha256:1");
    assert_ne!(both, combined_fingerprint(&[("r/a", "sha256:1"), ("r/b", "sha256:3")]));
}

#[test]
fn the_fingerprint_tells_apart_digests_that_differ_only_in_their_spelling() {
    // A digest is hashed as its 32 bytes when it is lowercase hex: an upper
    // case spelling, another algorithm or a malformed text must still give
    // another fingerprint, not read as the same bytes.
    let lower = vynil_rules::retention::RepositoryTag {
        digest: format!("sha256:{}", "0123456789abcdef".repeat(4)),
        ..plain_tag("1.0.0", "a")
    };
    let fingerprint = |digest: String| {
        plan(&[vynil_rules::retention::RepositoryTag { digest, ..lower.clone() }], &Usage::Known(vec![]), &[])
            .fingerprint
    };
    let hex = lower.digest.trim_start_matches("sha256:").to_string();
    let spellings = [
        lower.digest.clone(),
        format!("sha256:{}", hex.to_uppercase()),
        format!("sha512:{hex}"),
        format!("sha256:{}", &hex[..63]),
        hex.clone(),
    ];
    let prints: std::collections::BTreeSet<String> = spellings.iter().cloned().map(fingerprint).collect();
    assert_eq!(prints.len(), spellings.len(), "{spellings:?}");
}

#[test]
fn digests_sharing_their_last_characters_are_still_two_digests() {
    // Digests are told apart by their ends first: a superseded revision whose
    // digest ends like the head's is not the head's alias.
    let end = "0123456789abcdef";
    let with = |name: &str, start: char| vynil_rules::retention::RepositoryTag {
        digest: format!("sha256:{}{end}", start.to_string().repeat(48)),
        ..vynil_tag(name, "unused", "tenant", None, None)
    };
    let tags = [with("1.0.0", 'a'), with("0.9.0", 'b')];
    let plan = plan(&tags, &Usage::Known(vec![]), &[]);
    let deleted: Vec<&str> = plan.deleted().map(|e| e.tag).collect();
    assert_eq!(deleted, ["0.9.0"]);
}

#[test]
fn a_name_listed_twice_is_planned_alike_in_any_input_order() {
    // A merged listing can name a tag twice with two digests: the plan and
    // its fingerprint must not depend on which came first.
    let tags = [
        vynil_tag("1.0.0", "b", "tenant", None, None),
        vynil_tag("1.0.0", "a", "tenant", None, None),
        vynil_tag("0.9.0", "c", "tenant", None, None),
        plain_tag("latest", "e"),
        plain_tag("latest", "d"),
    ];
    let forward = plan(&tags, &Usage::Known(vec![]), &[]);
    let mut reversed = tags.to_vec();
    reversed.reverse();
    let backward = plan(&reversed, &Usage::Known(vec![]), &[]);
    assert_eq!(forward.fingerprint, backward.fingerprint);
    assert_eq!(forward.entries, backward.entries);
    let names: Vec<&str> = forward.entries.iter().map(|e| e.tag).collect();
    assert_eq!(names, ["1.0.0", "0.9.0", "latest"], "each name is planned once");
}

#[test]
fn a_name_listed_twice_with_one_digest_and_two_metadata_is_fingerprinted_alike_in_any_order() {
    // Found by the fuzzer (fuzz/regressions/retention): the fingerprint reads
    // both listings, and read them in input order.
    let tags = [
        plain_tag("latest", "a"),
        vynil_rules::retention::RepositoryTag {
            metadata: vynil_rules::retention::ManifestMetadata::Malformed("unreadable".into()),
            ..plain_tag("latest", "a")
        },
    ];
    let forward = plan(&tags, &Usage::Known(vec![]), &[]);
    let mut reversed = tags.to_vec();
    reversed.reverse();
    assert_eq!(forward.fingerprint, plan(&reversed, &Usage::Known(vec![]), &[]).fingerprint);
}
