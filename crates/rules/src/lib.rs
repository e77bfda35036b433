//! Every rule of Vynil package handling, in one pure crate.
//!
//! # Why one crate
//!
//! A package `think/ollama` was installed as `tenant`, then republished as
//! `service`. A registry purge, blind to package types, deleted the last
//! `tenant` revision; the scan, which stops at the first version without a
//! minimum, would not have shown it anyway; on delete the operator looked for a
//! `tenant` revision, found none, and looped forever with its finalizer in
//! place (upstream #12). Each piece was written in good faith where it looked
//! local: the bug was two copies of the same rules drifting apart. So the
//! scanner, the purger, the catalog and lifecycle all call this crate and none
//! re-implements any part of it. The purge contract is literally "delete the
//! complement of what any consumer could be shown".
//!
//! This crate does no I/O and no async; its normal dependency tree holds no
//! tokio, tonic, kube, redis, reqwest, hyper or oci-client (a test checks).
//!
//! # The rules
//!
//! - [`annotations`]: package content from `fr.solidite.vynil.*` annotations,
//!   in upstream's exact JSON shapes; the record type is [`Package`].
//! - [`tag`]: strict SemVer tags (optional `v` kept), precedence order, and
//!   cosign artifact tags.
//! - [`channel`]: maturity as upstream's substring test (`1.1.0-rc.1` is
//!   stable), and the framework-version check (`--vynil-version`).
//! - [`view`]: the waypoint descent (upstream's code semantics, with its docs'
//!   erratum recorded) and the type-aware view of upstream #12 B, as a sans-I/O
//!   state machine so the scanner reads only the manifests it needs.
//! - [`retention`]: the keep/delete plan of a repository with every reason and a
//!   fingerprint (upstream #12 A).
//! - [`selection`]: install selection (upstream's strict filter) and cleanup
//!   selection as a decision (upstream #12 C).
//! - [`scan`]: partial-scan filters and the status merge (upstream #9).
//! - [`index`]: what an exported index holds, and a consumer's view of one.
//! - [`catalog`]: each revision's roles and the upgrade path, for the surfaces.
//! - [`install`]: the options check and hash, requirements and
//!   recommendations against cluster facts, and the re-run fingerprint.
//! - [`signature`]: cosign signatures against a JukeBox's trusted keys.
//! - [`upgrade`]: a failed upgrade's quarantine and whether it rolls back on
//!   its own.

pub mod annotations;
pub mod catalog;
pub mod channel;
pub mod index;
pub mod install;
pub mod jukebox;
pub mod package;
pub mod repository;
pub mod retention;
pub mod scan;
pub mod selection;
pub mod signature;
pub mod tag;
pub mod upgrade;
pub mod view;

#[cfg(test)]
mod testing;

pub use annotations::{ManifestMetadata, parse_annotations};
pub use channel::{Channel, runs_on};
pub use package::{Package, PackageContent, PackageMeta, PackageType, Requirement};
pub use retention::{RetentionConfig, RetentionPlan, plan_retention};
pub use scan::{ScanFilter, ScanScope, merge_packages, merge_scoped, repositories_for};
pub use selection::{CleanupDecision, InstallQuery, NoMatch, select_cleanup, select_install};
pub use tag::{ArtifactTag, Tag};
pub use view::{
    KnownRevisions, Versions, View, ViewBuilder, Viewer, catalog_view, compute_view, view_of_versions,
};

/// Every way input to the rules can be wrong. Each names what was wrong and
/// what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RulesError {
    #[error("annotation `{key}` is malformed: {problem}; republish the package with a valid `{key}`")]
    Annotation { key: String, problem: String },
    #[error("partial scan filter {filter:?} {problem}: use `<category>` or `<category>/<name>`")]
    ScanFilter { filter: String, problem: String },
    #[error("retention pattern {pattern:?} is invalid: {problem}")]
    Pattern { pattern: String, problem: String },
    #[error(
        "cannot plan retention: the metadata of some versions could not be read ({0}); fix the registry or exclude the repository, nothing is deleted on a guess"
    )]
    UnreadableMetadata(String),
    #[error(
        "this JukeBox is scanned for the {scanned} channel, and the {asked} view cannot be derived from the {scanned} view (a view is not a filter: the {asked} view may hold releases the {scanned} waypoints skip); ask without a channel, or use a JukeBox whose spec.maturity is {asked}"
    )]
    ChannelNotScanned { asked: Channel, scanned: Channel },
    #[error("upgrade {field} {value:?} is invalid: {problem}; {hint}")]
    UpgradePolicy { field: &'static str, value: String, problem: String, hint: &'static str },
    #[error("trusted signing key {name:?}: {problem}")]
    SigningKey { name: String, problem: String },
    #[error(
        "trusted root: {problem}; give Sigstore's trusted_root.json (application/vnd.dev.sigstore.trustedroot+json;version=0.1), e.g. `cosign trusted-root create` or the public-good instance's, read offline"
    )]
    TrustedRoot { problem: String },
    #[error("trusted identity {name:?}: {problem}")]
    Identity { name: String, problem: String },
    #[error("required attestation {predicate_type:?}: {problem}")]
    Attestation { predicate_type: String, problem: String },
}

impl vynil_failure::Classify for RulesError {
    fn failure(&self) -> vynil_failure::Failure {
        use vynil_failure::Failure;
        match self {
            RulesError::ScanFilter { .. }
            | RulesError::Pattern { .. }
            | RulesError::ChannelNotScanned { .. }
            | RulesError::UpgradePolicy { .. }
            | RulesError::SigningKey { .. }
            | RulesError::TrustedRoot { .. }
            | RulesError::Identity { .. }
            | RulesError::Attestation { .. } => Failure::BadInput,
            // A package's published annotations, or metadata the registry did not give.
            RulesError::Annotation { .. } => Failure::Refused,
            RulesError::UnreadableMetadata(_) => Failure::Transient,
        }
    }
}

#[cfg(test)]
mod failure_tests {
    use vynil_failure::{Classify, Failure};

    use super::RulesError;

    #[test]
    fn a_bad_filter_is_bad_input_unread_metadata_transient() {
        let filter = RulesError::ScanFilter { filter: "a/b/c".into(), problem: "has 3 segments".into() };
        assert_eq!(filter.failure(), Failure::BadInput);
        assert_eq!(RulesError::UnreadableMetadata("503".into()).failure(), Failure::Transient);
    }
}
