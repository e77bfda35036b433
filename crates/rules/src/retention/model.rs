//! What a retention plan is made of: the tags read, how instances use
//! revisions, the configuration, and the plan with every reason.

use std::{collections::BTreeMap, fmt};

use semver::Version;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::*;
use crate::{RulesError, channel::Channel, package::PackageType, tag::ArtifactKind};

/// What the registry holds under one tag.
#[derive(Debug, Clone, PartialEq)]
pub struct RepositoryTag {
    pub name: String,
    /// `sha256:<hex>` of the manifest the tag points to.
    pub digest: String,
    pub metadata: ManifestMetadata,
}

/// What is known of a tag's manifest annotations (only version tags need it).
pub use crate::annotations::ManifestMetadata;

/// How an instance uses a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RevisionUse {
    Installed,
    Installing,
    /// `initFrom.version`.
    Pinned,
    /// Where a failed or running upgrade of the instance goes back to.
    RollbackTarget,
}

/// A revision some instance uses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstalledRevision {
    pub tag: String,
    /// The recorded digest, when known: kept even if the tag was re-pointed.
    pub digest: Option<String>,
    /// The instance, e.g. `tenant ns/name`.
    pub instance: String,
    pub usage: RevisionUse,
}

impl InstalledRevision {
    /// Whether this revision is the manifest `digest` (recorded digest) or
    /// one of its `tags` (by tag): the one test of "is it used".
    pub fn uses(&self, digest: &str, tags: &[impl AsRef<str>]) -> bool {
        self.digest.as_deref() == Some(digest) || tags.iter().any(|tag| tag.as_ref() == self.tag)
    }
}

/// What instances use, or that it could not be learnt.
#[derive(Debug, Clone, PartialEq)]
pub enum Usage {
    Known(Vec<InstalledRevision>),
    /// Lifecycle unreachable or not running: executing needs an acknowledgement.
    Unknown,
}

/// The retention settings of a purge.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    pub(super) framework: Version,
    pub(super) pins: Vec<(String, glob::Pattern)>,
}

impl RetentionConfig {
    /// `pinned`: tag glob patterns (`*`, `?`, `[…]`) never deleted.
    pub fn new(framework: Version, pinned: &[String]) -> Result<Self, RulesError> {
        let pins = pinned
            .iter()
            .map(|p| {
                glob::Pattern::new(p)
                    .map(|compiled| (p.clone(), compiled))
                    .map_err(|e| RulesError::Pattern { pattern: p.clone(), problem: e.to_string() })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { framework, pins })
    }

    pub fn framework(&self) -> &Version {
        &self.framework
    }

    /// A hash of the inputs a plan takes besides the repository and usage
    /// (framework version, pins, in a canonical order): a plan whose
    /// fingerprint differs from the fresh inputs' is stale, even when the
    /// tags did not move.
    pub fn fingerprint(&self) -> String {
        let mut pins: Vec<&str> = self.pins.iter().map(|(p, _)| p.as_str()).collect();
        pins.sort_unstable();
        pins.dedup();
        let input = json!({"schema": 1, "framework": self.framework.to_string(), "pins": pins});
        format!("sha256:{}", hex::encode(Sha256::digest(canonical(&input).as_bytes())))
    }
}

/// Why a tag is kept. Each reason names what makes it true, so it can be checked.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeepReason {
    /// First of the view of `channel` on framework `framework` (`None`: the
    /// configured framework).
    ChannelHead {
        channel: Channel,
        framework: Option<Version>,
    },
    /// A waypoint of that view.
    Waypoint {
        channel: Channel,
        framework: Option<Version>,
        minimum: Option<Version>,
    },
    /// The newest revision of its type in that view (type-aware view).
    TypeInView {
        channel: Channel,
        framework: Option<Version>,
        package_type: PackageType,
    },
    /// The newest revision of its type in the whole repository.
    NewestOfType(PackageType),
    Used {
        instance: String,
        usage: RevisionUse,
    },
    Pinned {
        pattern: String,
    },
    /// An artifact whose subject digest is kept (`of`: a kept tag of it).
    Artifact {
        kind: ArtifactKind,
        of: String,
    },
    /// Shares its digest with the kept tag `of`: deleting one deletes both.
    Alias {
        of: String,
    },
    /// Not a version with Vynil metadata nor a recognised artifact.
    Unmanaged,
}

/// Why a tag is deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteReason {
    /// A version no consumer could be shown and nothing uses.
    Superseded,
    /// An artifact whose subject digest is not kept.
    OrphanedArtifact { kind: ArtifactKind, subject: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Keep(Vec<KeepReason>),
    Delete(DeleteReason),
}

/// One tag's decision, borrowing the tag's name and digest from the input:
/// a caller keeps what it stores (copying both for every tag was a tenth of
/// the planning time, and the purger copied them again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanEntry<'a> {
    pub tag: &'a str,
    pub digest: &'a str,
    pub decision: Decision,
}

impl PlanEntry<'_> {
    pub fn is_kept(&self) -> bool {
        matches!(self.decision, Decision::Keep(_))
    }

    /// Human-readable reasons, e.g. `["head of beta", "signature of 1.2.0"]`.
    pub fn reasons(&self) -> Vec<String> {
        match &self.decision {
            Decision::Keep(reasons) => reasons.iter().map(ToString::to_string).collect(),
            Decision::Delete(reason) => vec![reason.to_string()],
        }
    }
}

/// One registry DELETE: a digest and every tag it removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestDeletion {
    pub digest: String,
    pub tags: Vec<String>,
    /// Only artifact tags: deleted after the subjects.
    pub artifacts_only: bool,
}

/// The retention plan of one repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionPlan<'a> {
    /// Version tags newest first, then the other tags by name.
    pub entries: Vec<PlanEntry<'a>>,
    /// Hash of every input: changes when any tag, digest, metadata, usage or
    /// setting changes; independent of input order.
    pub fingerprint: String,
    pub usage_unknown: bool,
    /// The framework versions views were computed for.
    pub breakpoints: Vec<Version>,
}

impl<'a> RetentionPlan<'a> {
    pub fn kept(&self) -> impl Iterator<Item = &PlanEntry<'a>> {
        self.entries.iter().filter(|e| e.is_kept())
    }

    pub fn deleted(&self) -> impl Iterator<Item = &PlanEntry<'a>> {
        self.entries.iter().filter(|e| !e.is_kept())
    }

    /// The DELETEs to send: one per digest, subjects before orphaned artifacts.
    pub fn deletions(&self) -> Vec<DigestDeletion> {
        let mut by_digest: BTreeMap<&str, (Vec<String>, bool)> = BTreeMap::new();
        for entry in self.deleted() {
            let artifact = matches!(entry.decision, Decision::Delete(DeleteReason::OrphanedArtifact { .. }));
            let slot = by_digest.entry(entry.digest).or_insert((Vec::new(), true));
            slot.0.push(entry.tag.to_string());
            slot.1 &= artifact;
        }
        let mut deletions: Vec<DigestDeletion> = by_digest
            .into_iter()
            .map(|(digest, (tags, artifacts_only))| DigestDeletion {
                digest: digest.to_string(),
                tags,
                artifacts_only,
            })
            .collect();
        deletions.sort_by_key(|d| d.artifacts_only);
        deletions
    }
}

impl fmt::Display for KeepReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeepReason::ChannelHead { channel, framework } => {
                write!(f, "head of {channel}{}", version_suffix(framework))
            }
            KeepReason::Waypoint { channel, framework, minimum: Some(min) } => {
                write!(f, "waypoint min {min} ({channel}{})", version_suffix(framework))
            }
            KeepReason::Waypoint { channel, framework, minimum: None } => {
                write!(f, "waypoint reachable from any version ({channel}{})", version_suffix(framework))
            }
            KeepReason::TypeInView { channel, framework, package_type } => {
                write!(f, "newest {package_type} revision shown to {channel}{}", version_suffix(framework))
            }
            KeepReason::NewestOfType(package_type) => write!(f, "last {package_type} revision"),
            KeepReason::Used { instance, usage: RevisionUse::Installed } => {
                write!(f, "installed by {instance}")
            }
            KeepReason::Used { instance, usage: RevisionUse::Installing } => {
                write!(f, "being installed by {instance}")
            }
            KeepReason::Used { instance, usage: RevisionUse::Pinned } => {
                write!(f, "pinned by {instance} (initFrom.version)")
            }
            KeepReason::Used { instance, usage: RevisionUse::RollbackTarget } => {
                write!(f, "rollback target of {instance}")
            }
            KeepReason::Pinned { pattern } => write!(f, "pinned (retention pattern {pattern})"),
            KeepReason::Artifact { kind, of } => write!(f, "{} of {of}", kind.noun()),
            KeepReason::Alias { of } => write!(f, "alias of {of} (same digest)"),
            KeepReason::Unmanaged => f.write_str("unmanaged"),
        }
    }
}

impl fmt::Display for DeleteReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeleteReason::Superseded => f.write_str("superseded"),
            DeleteReason::OrphanedArtifact { kind, subject } => {
                write!(f, "orphaned {} of {subject}", kind.noun())
            }
        }
    }
}
