//! Which tags of one repository a purge keeps, each with every reason, and
//! which it deletes (upstream #12 A; DESIGN "Retention").
//!
//! The contract is "delete the complement of what any consumer could be
//! shown": keep the union of the type-aware views for every channel and every
//! framework breakpoint (the configured version and each distinct
//! `vynil_version` requirement value of the repository), the newest revision of
//! each type, every revision an instance installed, is installing or pins, the
//! configured pins, the artifacts of every kept digest, and every tag sharing a
//! kept digest (deletion is by digest). When in doubt, keep: a tag that is
//! neither a version with Vynil metadata nor a recognised artifact is
//! "unmanaged" and never deleted. A version whose metadata could not be read
//! makes the plan fail rather than guess.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt,
};

use semver::Version;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{
    RulesError,
    channel::Channel,
    package::{PackageContent, PackageType},
    tag::{ArtifactKind, ArtifactTag, Tag},
    view::{RevisionFacts, Role, Versions, Viewer, view_of_versions},
};

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
    pub fn uses(&self, digest: &str, tags: &[String]) -> bool {
        self.digest.as_deref() == Some(digest) || tags.contains(&self.tag)
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
    framework: Version,
    pins: Vec<(String, glob::Pattern)>,
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanEntry {
    pub tag: String,
    pub digest: String,
    pub decision: Decision,
}

impl PlanEntry {
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
pub struct RetentionPlan {
    /// Version tags newest first, then the other tags by name.
    pub entries: Vec<PlanEntry>,
    /// Hash of every input: changes when any tag, digest, metadata, usage or
    /// setting changes; independent of input order.
    pub fingerprint: String,
    pub usage_unknown: bool,
    /// The framework versions views were computed for.
    pub breakpoints: Vec<Version>,
}

impl RetentionPlan {
    pub fn kept(&self) -> impl Iterator<Item = &PlanEntry> {
        self.entries.iter().filter(|e| e.is_kept())
    }

    pub fn deleted(&self) -> impl Iterator<Item = &PlanEntry> {
        self.entries.iter().filter(|e| !e.is_kept())
    }

    /// The DELETEs to send: one per digest, subjects before orphaned artifacts.
    pub fn deletions(&self) -> Vec<DigestDeletion> {
        let mut by_digest: BTreeMap<&str, (Vec<String>, bool)> = BTreeMap::new();
        for entry in self.deleted() {
            let artifact = matches!(entry.decision, Decision::Delete(DeleteReason::OrphanedArtifact { .. }));
            let slot = by_digest.entry(&entry.digest).or_insert((Vec::new(), true));
            slot.0.push(entry.tag.clone());
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

enum Class<'a> {
    Version(Tag, &'a PackageContent),
    VersionWithoutVynil(Tag),
    Artifact(ArtifactTag),
    Other,
}

impl Class<'_> {
    fn version(&self) -> Option<&Tag> {
        match self {
            Class::Version(tag, _) | Class::VersionWithoutVynil(tag) => Some(tag),
            _ => None,
        }
    }
}

/// Plans the retention of one repository.
pub fn plan_retention(
    tags: &[RepositoryTag],
    usage: &Usage,
    config: &RetentionConfig,
) -> Result<RetentionPlan, RulesError> {
    // Each tag is classified (its name parsed) once; reasons are kept by
    // position, so nothing below looks a tag up by name but the views.
    let classes: Vec<Class> = tags.iter().map(classify).collect();
    let unreadable: Vec<String> = tags
        .iter()
        .zip(&classes)
        .filter_map(|(t, c)| match (&t.metadata, c) {
            (ManifestMetadata::Malformed(why), Class::VersionWithoutVynil(_)) => {
                Some(format!("{}: {why}", t.name))
            }
            _ => None,
        })
        .collect();
    if !unreadable.is_empty() {
        return Err(RulesError::UnreadableMetadata(unreadable.join("; ")));
    }
    let breakpoints = breakpoints(
        config.framework(),
        classes.iter().filter_map(|c| match c {
            Class::Version(_, content) => Some(*content),
            _ => None,
        }),
    );

    // What the descent and the fingerprint read of each revision, parsed once.
    let facts: Vec<Option<RevisionFacts>> = classes
        .iter()
        .map(|c| match c {
            Class::Version(_, content) => Some(RevisionFacts::of(content)),
            _ => None,
        })
        .collect();
    let mut reasons: Reasons = vec![BTreeSet::new(); tags.len()];
    add_view_reasons(&classes, &facts, &breakpoints, config.framework(), &mut reasons);
    add_newest_of_each_type(&classes, &mut reasons);
    for (tag, entry) in tags.iter().zip(reasons.iter_mut()) {
        if let Usage::Known(used) = usage {
            for revision in used {
                if revision.uses(&tag.digest, std::slice::from_ref(&tag.name)) {
                    entry.insert(KeepReason::Used {
                        instance: revision.instance.clone(),
                        usage: revision.usage,
                    });
                }
            }
        }
        for (pattern, compiled) in &config.pins {
            if compiled.matches(&tag.name) {
                entry.insert(KeepReason::Pinned { pattern: pattern.clone() });
            }
        }
    }
    let digests = Digests::new(tags, &classes);
    add_digest_reasons(tags, &classes, &digests, &mut reasons);
    // What is neither managed nor an artifact is kept: as the alias of a kept
    // digest when it is one (more telling), else as unmanaged.
    for (entry, class) in reasons.iter_mut().zip(&classes) {
        if entry.is_empty() && matches!(class, Class::VersionWithoutVynil(_) | Class::Other) {
            entry.insert(KeepReason::Unmanaged);
        }
    }
    add_digest_reasons(tags, &classes, &digests, &mut reasons);

    let mut entries: Vec<(Option<&Tag>, PlanEntry)> = tags
        .iter()
        .zip(&classes)
        .zip(reasons)
        .map(|((tag, class), kept)| {
            let decision = match (kept.is_empty(), class) {
                (false, _) => Decision::Keep(kept.into_iter().collect()),
                (true, Class::Artifact(a)) => Decision::Delete(DeleteReason::OrphanedArtifact {
                    kind: a.kind,
                    subject: a.subject.clone(),
                }),
                (true, _) => Decision::Delete(DeleteReason::Superseded),
            };
            let entry = PlanEntry { tag: tag.name.clone(), digest: tag.digest.clone(), decision };
            (class.version(), entry)
        })
        .collect();
    entries.sort_by(|(va, a), (vb, b)| match (va, vb) {
        (Some(x), Some(y)) => y.cmp(x),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.tag.cmp(&b.tag),
    });
    entries.dedup_by(|(_, a), (_, b)| a.tag == b.tag);

    Ok(RetentionPlan {
        entries: entries.into_iter().map(|(_, e)| e).collect(),
        fingerprint: fingerprint(tags, &facts, usage, config),
        usage_unknown: matches!(usage, Usage::Unknown),
        breakpoints,
    })
}

/// The reasons of each tag, by its position in the input.
type Reasons = Vec<BTreeSet<KeepReason>>;

fn classify(tag: &RepositoryTag) -> Class<'_> {
    if let Some(version) = Tag::parse(&tag.name) {
        return match &tag.metadata {
            ManifestMetadata::Vynil(content) => Class::Version(version, content),
            _ => Class::VersionWithoutVynil(version),
        };
    }
    match ArtifactTag::parse(&tag.name) {
        Some(artifact) => Class::Artifact(artifact),
        None => Class::Other,
    }
}

/// The configured framework and every distinct `vynil_version` requirement.
fn breakpoints<'a>(configured: &Version, contents: impl Iterator<Item = &'a PackageContent>) -> Vec<Version> {
    let mut set: BTreeSet<Version> = contents.flat_map(|c| c.vynil_versions()).collect();
    set.insert(configured.clone());
    set.into_iter().collect()
}

fn add_view_reasons(
    classes: &[Class],
    tag_facts: &[Option<RevisionFacts>],
    breakpoints: &[Version],
    configured: &Version,
    reasons: &mut Reasons,
) {
    // The configured framework first; other breakpoints add a reason only
    // where the configured one gave none of that kind for that channel.
    let mut order: Vec<&Version> = vec![configured];
    order.extend(breakpoints.iter().filter(|b| *b != configured));
    // Each version with the position of its tag, newest first; the facts of
    // the descent in the same order, found by the tag's own address.
    let mut indexed: Vec<(&Tag, usize)> =
        classes.iter().enumerate().filter_map(|(at, c)| c.version().map(|tag| (tag, at))).collect();
    indexed.sort_by(|(a, _), (b, _)| b.cmp(a));
    indexed.dedup_by(|(a, _), (b, _)| a == b);
    let versions = Versions::from_tags(indexed.iter().map(|(tag, _)| (*tag).clone()).collect());
    let facts: Vec<Option<&RevisionFacts>> =
        indexed.iter().map(|(_, at)| tag_facts.get(*at).and_then(Option::as_ref)).collect();
    for framework in order {
        for channel in Channel::ALL {
            let viewer = Viewer { channel, framework: framework.clone() };
            let view = view_of_versions(&versions, &viewer, true, |tag| {
                versions.index_of(tag).and_then(|i| facts.get(i).copied().flatten())
            });
            for entry in view.entries {
                let Some(at) = versions.index_of(&entry.tag).and_then(|i| indexed.get(i)).map(|(_, at)| *at)
                else {
                    continue;
                };
                let framework = (framework != configured).then(|| framework.clone());
                let reason = match entry.role {
                    Role::Head => KeepReason::ChannelHead { channel, framework },
                    Role::Waypoint { minimum } => KeepReason::Waypoint { channel, framework, minimum },
                    Role::NewestOfType(package_type) => {
                        KeepReason::TypeInView { channel, framework, package_type }
                    }
                };
                let set = &mut reasons[at];
                if is_configured(&reason) || !set.iter().any(|r| same_kind(r, &reason)) {
                    set.insert(reason);
                }
            }
        }
    }
}

fn is_configured(reason: &KeepReason) -> bool {
    match reason {
        KeepReason::ChannelHead { framework, .. }
        | KeepReason::Waypoint { framework, .. }
        | KeepReason::TypeInView { framework, .. } => framework.is_none(),
        _ => true,
    }
}

fn same_kind(a: &KeepReason, b: &KeepReason) -> bool {
    match (a, b) {
        (KeepReason::ChannelHead { channel: x, .. }, KeepReason::ChannelHead { channel: y, .. })
        | (KeepReason::Waypoint { channel: x, .. }, KeepReason::Waypoint { channel: y, .. })
        | (KeepReason::TypeInView { channel: x, .. }, KeepReason::TypeInView { channel: y, .. }) => x == y,
        _ => false,
    }
}

fn add_newest_of_each_type(classes: &[Class], reasons: &mut Reasons) {
    let mut newest: BTreeMap<PackageType, (usize, &Tag)> = BTreeMap::new();
    for (at, class) in classes.iter().enumerate() {
        if let Class::Version(tag, content) = class {
            let slot = newest.entry(content.package_type()).or_insert((at, tag));
            if tag > slot.1 {
                *slot = (at, tag);
            }
        }
    }
    for (package_type, (at, _)) in newest {
        reasons[at].insert(KeepReason::NewestOfType(package_type));
    }
}

/// A word-at-a-time hash (rustc's Fx): SipHash over each 71-byte digest was
/// an eighth of the planning time. Digests are the registry's SHA-256, so
/// flooding one bucket would need colliding content; it would only cost time.
#[derive(Clone, Copy, Default)]
struct BuildFx;

struct Fx(u64);

impl std::hash::BuildHasher for BuildFx {
    type Hasher = Fx;
    fn build_hasher(&self) -> Fx {
        Fx(0)
    }
}

impl std::hash::Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
}

/// Each tag's digest as a small number, and each artifact's subject digest
/// when some tag has it: digests are hashed once, not once per pass.
struct Digests {
    count: usize,
    of_tag: Vec<usize>,
    subject: Vec<Option<usize>>,
}

impl Digests {
    fn new(tags: &[RepositoryTag], classes: &[Class]) -> Self {
        let mut ids: HashMap<&str, usize, BuildFx> = HashMap::with_capacity_and_hasher(tags.len(), BuildFx);
        let of_tag = tags
            .iter()
            .map(|t| {
                let next = ids.len();
                *ids.entry(t.digest.as_str()).or_insert(next)
            })
            .collect();
        let subject = classes
            .iter()
            .map(|c| match c {
                Class::Artifact(artifact) => ids.get(artifact.subject.as_str()).copied(),
                _ => None,
            })
            .collect();
        Self { count: ids.len(), of_tag, subject }
    }
}

/// Deletion is by digest: a tag sharing a kept digest is kept, and so is an
/// artifact of a kept digest. Repeated until nothing changes, since keeping an
/// artifact keeps its own digest (and its artifacts) in turn.
fn add_digest_reasons(tags: &[RepositoryTag], classes: &[Class], digests: &Digests, reasons: &mut Reasons) {
    loop {
        // The first kept tag (by name) of each kept digest names it in reasons.
        let mut namer: Vec<Option<usize>> = vec![None; digests.count];
        for (at, kept) in reasons.iter().enumerate() {
            if kept.is_empty() {
                continue;
            }
            let slot = &mut namer[digests.of_tag[at]];
            match slot {
                Some(first) if tags[*first].name <= tags[at].name => {}
                _ => *slot = Some(at),
            }
        }
        let mut added = false;
        for (at, class) in classes.iter().enumerate() {
            if !reasons[at].is_empty() {
                continue;
            }
            let reason = if let Some(of) = namer[digests.of_tag[at]] {
                Some(KeepReason::Alias { of: tags[of].name.clone() })
            } else if let (Class::Artifact(artifact), Some(subject)) = (class, digests.subject[at]) {
                namer[subject]
                    .map(|of| KeepReason::Artifact { kind: artifact.kind, of: tags[of].name.clone() })
            } else {
                None
            };
            if let Some(reason) = reason {
                reasons[at].insert(reason);
                added = true;
            }
        }
        if !added {
            return;
        }
    }
}

/// A tag as a stored plan recorded it.
#[derive(Debug, Clone, Copy)]
pub struct PlannedTag<'a> {
    pub tag: &'a str,
    pub digest: &'a str,
    pub keep: bool,
}

/// A deletion as a stored plan recorded it.
#[derive(Debug, Clone, Copy)]
pub struct PlannedDeletion<'a> {
    pub digest: &'a str,
    pub tags: &'a [String],
}

/// What changed in repository `name` since its plan was made, from a fresh
/// read of its tags and of usage: a tag re-pointed, a kept tag gone, a tag
/// pushed, a revision to delete now used. A tag the plan deletes may be gone
/// (deleted by an earlier run of the same plan). Empty: the plan still holds
/// as far as the repository and usage go (its retention inputs are compared
/// by [`RetentionConfig::fingerprint`]).
pub fn changes_since_planning(
    name: &str,
    planned: &[PlannedTag<'_>],
    deletions: &[PlannedDeletion<'_>],
    fresh: &[RepositoryTag],
    usage: &Usage,
) -> Vec<String> {
    let now: HashMap<&str, &str> = fresh.iter().map(|t| (t.name.as_str(), t.digest.as_str())).collect();
    let mut changes = Vec::new();
    for entry in planned {
        match now.get(entry.tag) {
            Some(digest) if *digest != entry.digest => {
                changes.push(format!("{} now points to {digest} (planned {})", entry.tag, entry.digest))
            }
            None if entry.keep => changes.push(format!("{name}: kept tag {} disappeared", entry.tag)),
            _ => {}
        }
    }
    for tag in fresh {
        if !planned.iter().any(|p| p.tag == tag.name) {
            changes.push(format!("{name}: {} was pushed since planning", tag.name));
        }
    }
    if let Usage::Known(used) = usage {
        for deletion in deletions {
            for revision in used.iter().filter(|r| r.uses(deletion.digest, deletion.tags)) {
                changes.push(format!("{} is now used by {}", revision.tag, revision.instance));
            }
        }
    }
    changes
}

/// The fingerprint of a plan over several repositories (`(name, fingerprint)`
/// in plan order); a single repository's plan keeps its own.
pub fn combined_fingerprint<'a>(parts: &[(&'a str, &'a str)]) -> String {
    match parts {
        [(_, single)] => single.to_string(),
        many => {
            let mut hasher = Sha256::new();
            for (name, fingerprint) in many {
                hasher.update(format!("{name}\0{fingerprint}\n").as_bytes());
            }
            format!("sha256:{}", hex::encode(hasher.finalize()))
        }
    }
}

/// Hash of a canonical form of every input: sorted lists, and each tag's
/// metadata as serialised by its type (a fixed field order).
/// The plan's inputs hashed in one pass, in an order-free form: every tag's
/// name, digest and the metadata the plan reads (type, minimum, framework
/// requirements), usage, framework and pins; each field length-prefixed, so
/// no two inputs share an encoding. (Serialising each revision to canonical
/// JSON first made the fingerprint 60% of the planning time.)
fn fingerprint(
    tags: &[RepositoryTag],
    facts: &[Option<RevisionFacts>],
    usage: &Usage,
    config: &RetentionConfig,
) -> String {
    use std::fmt::Write as _;
    let mut hasher = Sha256::new();
    let mut field = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    let mut text = String::new();
    let mut version = |field: &mut dyn FnMut(&[u8]), v: Option<&Version>| {
        text.clear();
        if let Some(v) = v {
            let _ = write!(text, "{v}");
        }
        field(text.as_bytes());
    };
    field(b"vynil retention plan, fingerprint schema 2");
    version(&mut field, Some(&config.framework));
    let mut pins: Vec<&str> = config.pins.iter().map(|(p, _)| p.as_str()).collect();
    pins.sort_unstable();
    pins.dedup();
    field(&(pins.len() as u64).to_le_bytes());
    for pin in pins {
        field(pin.as_bytes());
    }
    let mut order: Vec<usize> = (0..tags.len()).collect();
    order.sort_unstable_by(|&a, &b| {
        (tags[a].name.as_str(), tags[a].digest.as_str())
            .cmp(&(tags[b].name.as_str(), tags[b].digest.as_str()))
    });
    field(&(order.len() as u64).to_le_bytes());
    for at in order {
        let tag = &tags[at];
        field(tag.name.as_bytes());
        field(tag.digest.as_bytes());
        match (&tag.metadata, facts.get(at).and_then(Option::as_ref)) {
            (ManifestMetadata::Vynil(_), Some(facts)) => {
                field(b"vynil");
                field(facts.package_type.as_str().as_bytes());
                version(&mut field, facts.minimum.as_ref());
                field(&(facts.vynil_versions.len() as u64).to_le_bytes());
                for requirement in &facts.vynil_versions {
                    version(&mut field, Some(requirement));
                }
            }
            // Not a version: its metadata decides nothing but that it has some.
            (ManifestMetadata::Vynil(_), None) => field(b"vynil, not a version"),
            (ManifestMetadata::NotVynil, _) => field(b"not-vynil"),
            (ManifestMetadata::Malformed(_), _) => field(b"unreadable"),
        }
    }
    match usage {
        Usage::Unknown => field(b"usage unknown"),
        Usage::Known(used) => {
            let mut used: Vec<(&str, &str, &str, RevisionUse)> = used
                .iter()
                .map(|r| (r.tag.as_str(), r.digest.as_deref().unwrap_or(""), r.instance.as_str(), r.usage))
                .collect();
            used.sort_unstable();
            field(&(used.len() as u64).to_le_bytes());
            for (tag, digest, instance, usage) in used {
                field(tag.as_bytes());
                field(digest.as_bytes());
                field(instance.as_bytes());
                field(format!("{usage:?}").as_bytes());
            }
        }
    }
    format!("sha256:{}", hex::encode(hasher.finalize()))
}

/// JSON text with object keys sorted at every depth, whatever map order
/// serde_json was built with.
pub(crate) fn canonical(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let body: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical(&map[k])))
                .collect();
            format!("{{{}}}", body.join(","))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(canonical).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

fn version_suffix(framework: &Option<Version>) -> String {
    framework.as_ref().map(|v| format!(" on vynil {v}")).unwrap_or_default()
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
