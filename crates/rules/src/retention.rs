//! Which tags of one repository a purge keeps, each with every reason, and
//! which it deletes (upstream #12 A; `docs/purger.md`).
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
    package::PackageType,
    tag::{ArtifactKind, ArtifactTag, Tag},
    view::{FactsReader, KnownRevisions, RevisionFacts, Role, Versions, Viewer},
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

/// What a tag is to the plan. A version is named by its place in the
/// repository's [`Versions`] (newest first), so versions compare as numbers.
enum Class {
    Version(usize),
    VersionWithoutVynil(usize),
    Artifact(ArtifactTag),
    Other,
}

impl Class {
    fn version(&self) -> Option<usize> {
        match self {
            Class::Version(place) | Class::VersionWithoutVynil(place) => Some(*place),
            _ => None,
        }
    }
}

/// What the plan reads of each tag, read in one sweep over the input. A
/// tag's name, digest and metadata each live in their own allocations:
/// reading them in one pass lets the CPU wait on all of a tag's loads at once
/// (read in separate passes, each pass waited on its own; the planner spent a
/// third of its time waiting on memory).
struct Sweep {
    versions: Vec<(Tag, usize)>,
    others: Vec<usize>,
    digests: Vec<ReadDigest>,
    /// What the descent and the fingerprint read of each version with Vynil
    /// metadata (a [`Class::Version`]), parsed once.
    facts: Vec<Option<RevisionFacts>>,
}

/// A digest as the plan compares and hashes it.
#[derive(Clone, Copy)]
struct ReadDigest {
    /// Its last 16 bytes: registry digests are SHA-256, so their ends
    /// already tell them apart.
    end: u128,
    /// A lowercase `sha256:` digest's 32 bytes.
    raw: Option<[u8; 32]>,
}

impl ReadDigest {
    fn of(digest: &str) -> Self {
        let end = match digest.as_bytes().last_chunk::<16>() {
            Some(end) => *end,
            // Shorter: its bytes at the end, zeros before them.
            None => {
                let mut end = [0u8; 16];
                end[16 - digest.len()..].copy_from_slice(digest.as_bytes());
                end
            }
        };
        Self { end: u128::from_be_bytes(end), raw: digest.strip_prefix("sha256:").and_then(lowercase_hex_32) }
    }
}

impl Sweep {
    fn of(tags: &[RepositoryTag]) -> Self {
        let mut sweep = Sweep {
            versions: Vec::with_capacity(tags.len()),
            others: Vec::new(),
            digests: Vec::with_capacity(tags.len()),
            facts: Vec::with_capacity(tags.len()),
        };
        let mut reader = FactsReader::default();
        for (at, tag) in tags.iter().enumerate() {
            let version = Tag::parse(&tag.name);
            sweep.digests.push(ReadDigest::of(&tag.digest));
            sweep.facts.push(match (&version, &tag.metadata) {
                (Some(_), ManifestMetadata::Vynil(content)) => {
                    Some(reader.read(content.package_type(), &content.requirements))
                }
                _ => None,
            });
            match version {
                Some(version) => sweep.versions.push((version, at)),
                None => sweep.others.push(at),
            }
        }
        sweep
    }
}

/// A tag's metadata as text: a total order where the metadata has none.
fn metadata_text(tag: &RepositoryTag) -> String {
    serde_json::to_string(&tag.metadata).unwrap_or_default()
}

/// The repository's versions, sorted once.
struct Parsed {
    versions: Versions,
    /// The place in `versions` of each tag that is one (a name listed twice
    /// shares its place).
    places: Vec<Option<usize>>,
    /// Every tag's position in the plan's order: versions newest first, then
    /// the other tags by name; ties broken by digest, so that the fingerprint
    /// reads the inputs in an order that does not depend on theirs.
    order: Vec<usize>,
}

fn sort_versions(tags: &[RepositoryTag], mut found: Vec<(Tag, usize)>, mut others: Vec<usize>) -> Parsed {
    // Equal tags (a name listed twice) are next to each other, by digest.
    // A name listed twice with one digest and two metadata is ordered by its
    // metadata (found by the fuzzer: the fingerprint, which reads both,
    // followed the input order). Ties that far are rare: the text is made
    // only for them.
    let same = |x: usize, y: usize| {
        tags[x]
            .digest
            .cmp(&tags[y].digest)
            .then_with(|| metadata_text(&tags[x]).cmp(&metadata_text(&tags[y])))
    };
    found.sort_unstable_by(|(a, x), (b, y)| b.cmp(a).then_with(|| same(*x, *y)));
    others.sort_unstable_by(|&a, &b| tags[a].name.cmp(&tags[b].name).then_with(|| same(a, b)));
    let mut places = vec![None; tags.len()];
    let mut order = Vec::with_capacity(tags.len());
    let mut place = 0;
    for (i, (tag, at)) in found.iter().enumerate() {
        if i > 0 && found.get(i - 1).is_some_and(|(previous, _)| previous != tag) {
            place += 1;
        }
        places[*at] = Some(place);
        order.push(*at);
    }
    order.extend(others);
    // The versions, each once, in the buffer they were sorted in.
    found.dedup_by(|(a, _), (b, _)| a == b);
    let unique = found.into_iter().map(|(tag, _)| tag).collect();
    Parsed { versions: Versions::from_newest_first(unique), places, order }
}

/// Plans the retention of one repository.
pub fn plan_retention<'a>(
    tags: &'a [RepositoryTag],
    usage: &Usage,
    config: &RetentionConfig,
) -> Result<RetentionPlan<'a>, RulesError> {
    // Each tag is read once and classified once; reasons are kept by
    // position, so nothing below looks a tag up by name but the views.
    let Sweep { versions, others, digests: read_digests, facts } = Sweep::of(tags);
    let parsed = sort_versions(tags, versions, others);
    // Hashed while the tags are still in cache (hashed after the views, each
    // name was read from memory again).
    let fingerprint = fingerprint(tags, &parsed, &facts, &read_digests, usage, config);
    let Parsed { versions, places, order } = parsed;
    let classes: Vec<Class> = tags.iter().zip(&places).map(|(tag, place)| classify(tag, *place)).collect();
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
    let breakpoints = breakpoints(config.framework(), facts.iter().flatten());
    let mut reasons: Reasons = vec![Vec::new(); tags.len()];
    add_view_reasons(&versions, &classes, &order, &facts, &breakpoints, config.framework(), &mut reasons);
    add_newest_of_each_type(&classes, &order, &facts, &mut reasons);
    for (tag, entry) in tags.iter().zip(reasons.iter_mut()) {
        if let Usage::Known(used) = usage {
            for revision in used {
                if revision.uses(&tag.digest, std::slice::from_ref(&tag.name)) {
                    entry.push(KeepReason::Used {
                        instance: revision.instance.clone(),
                        usage: revision.usage,
                    });
                }
            }
        }
        for (pattern, compiled) in &config.pins {
            if compiled.matches(&tag.name) {
                entry.push(KeepReason::Pinned { pattern: pattern.clone() });
            }
        }
    }
    let digests = Digests::new(tags, &read_digests, &classes);
    add_digest_reasons(tags, &classes, &digests, &mut reasons);
    // What is neither managed nor an artifact is kept: as the alias of a kept
    // digest when it is one (more telling), else as unmanaged.
    for (entry, class) in reasons.iter_mut().zip(&classes) {
        if entry.is_empty() && matches!(class, Class::VersionWithoutVynil(_) | Class::Other) {
            entry.push(KeepReason::Unmanaged);
        }
    }
    add_digest_reasons(tags, &classes, &digests, &mut reasons);

    // A name listed twice is planned once, as its first entry: the versions
    // by their place, the others (sorted by name) by their names.
    let same_name = |a: usize, b: usize| match (places[a], places[b]) {
        (Some(x), Some(y)) => x == y,
        (None, None) => tags[a].name == tags[b].name,
        _ => false,
    };
    let mut entries: Vec<PlanEntry> = Vec::with_capacity(order.len());
    let mut previous: Option<usize> = None;
    for &at in &order {
        if previous.is_some_and(|p| same_name(p, at)) {
            continue;
        }
        previous = Some(at);
        let (tag, class) = (&tags[at], &classes[at]);
        let mut kept = std::mem::take(&mut reasons[at]);
        kept.sort_unstable();
        kept.dedup();
        let decision = match (kept.is_empty(), class) {
            (false, _) => Decision::Keep(kept),
            (true, Class::Artifact(a)) => {
                Decision::Delete(DeleteReason::OrphanedArtifact { kind: a.kind, subject: a.subject.clone() })
            }
            (true, _) => Decision::Delete(DeleteReason::Superseded),
        };
        entries.push(PlanEntry { tag: &tag.name, digest: &tag.digest, decision });
    }

    Ok(RetentionPlan { fingerprint, entries, usage_unknown: matches!(usage, Usage::Unknown), breakpoints })
}

/// The reasons of each tag, by its position in the input: a few for a kept
/// tag, none for most, put in order once for the plan (a set per tag,
/// built and taken apart again, was 3% of a plan's profile).
type Reasons = Vec<Vec<KeepReason>>;

fn classify(tag: &RepositoryTag, place: Option<usize>) -> Class {
    if let Some(place) = place {
        return match &tag.metadata {
            ManifestMetadata::Vynil(_) => Class::Version(place),
            _ => Class::VersionWithoutVynil(place),
        };
    }
    match ArtifactTag::parse(&tag.name) {
        Some(artifact) => Class::Artifact(artifact),
        None => Class::Other,
    }
}

/// The configured framework and every distinct `vynil_version` requirement.
fn breakpoints<'a>(configured: &Version, revisions: impl Iterator<Item = &'a RevisionFacts>) -> Vec<Version> {
    let mut set: BTreeSet<Version> = revisions.flat_map(|r| r.vynil_versions.iter().cloned()).collect();
    set.insert(configured.clone());
    set.into_iter().collect()
}

fn add_view_reasons(
    versions: &Versions,
    classes: &[Class],
    newest_first: &[usize],
    tag_facts: &[Option<RevisionFacts>],
    breakpoints: &[Version],
    configured: &Version,
    reasons: &mut Reasons,
) {
    // The configured framework first; other breakpoints add a reason only
    // where the configured one gave none of that kind for that channel.
    let mut order: Vec<&Version> = vec![configured];
    order.extend(breakpoints.iter().filter(|b| *b != configured));
    // The position of the first tag of each version (the one its reasons go
    // to), and the facts of the descent by version, found by the tag's own
    // address.
    let mut indexed: Vec<usize> = Vec::with_capacity(versions.as_slice().len());
    for &at in newest_first {
        if classes[at].version() == Some(indexed.len()) {
            indexed.push(at);
        }
    }
    let known = KnownRevisions::new(
        versions,
        indexed.iter().map(|at| tag_facts.get(*at).and_then(Option::as_ref)).collect(),
    );
    for channel in Channel::ALL {
        for framework in &order {
            for shown in known.shown(Viewer { channel, framework: (*framework).clone() }) {
                let Some(&at) = indexed.get(shown.position) else {
                    continue;
                };
                let framework = (*framework != configured).then(|| (*framework).clone());
                let reason = match shown.role {
                    Role::Head => KeepReason::ChannelHead { channel, framework },
                    Role::Waypoint { minimum } => KeepReason::Waypoint { channel, framework, minimum },
                    Role::NewestOfType(package_type) => {
                        KeepReason::TypeInView { channel, framework, package_type }
                    }
                };
                let set = &mut reasons[at];
                if is_configured(&reason) || !set.iter().any(|r| same_kind(r, &reason)) {
                    set.push(reason);
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

fn add_newest_of_each_type(
    classes: &[Class],
    order: &[usize],
    facts: &[Option<RevisionFacts>],
    reasons: &mut Reasons,
) {
    // In the plan's order, versions newest first: the first of each type is
    // the newest, and of a name listed twice the reason goes to the entry the
    // plan keeps (the first), whatever the input order.
    let mut newest: [Option<usize>; PackageType::ALL.len()] = [None; PackageType::ALL.len()];
    for &at in order {
        if let (Some(Class::Version(..)), Some(Some(revision))) = (classes.get(at), facts.get(at)) {
            newest[revision.package_type as usize].get_or_insert(at);
        }
    }
    for (package_type, at) in PackageType::ALL.into_iter().zip(newest) {
        if let Some(at) = at {
            reasons[at].push(KeepReason::NewestOfType(package_type));
        }
    }
}

/// Each tag's digest as a small number, and each artifact's subject digest
/// when some tag has it: digests are compared once, not once per pass.
struct Digests {
    count: usize,
    of_tag: Vec<usize>,
    subject: Vec<Option<usize>>,
}

impl Digests {
    /// Numbered by sorting on each digest's last 16 bytes, then its whole
    /// text: registry digests are SHA-256, so their ends already tell them
    /// apart and equal digests meet side by side. (A hash map over the 71-byte
    /// texts was a tenth of the planning time.)
    fn new(tags: &[RepositoryTag], read: &[ReadDigest], classes: &[Class]) -> Self {
        let whole = |(key, at): &(u128, usize)| (*key, tags[*at].digest.as_str());
        let mut sorted: Vec<(u128, usize)> = read.iter().map(|d| d.end).zip(0..).collect();
        sorted.sort_unstable_by(|a, b| whole(a).cmp(&whole(b)));
        let mut of_tag = vec![0; tags.len()];
        let mut count = 0;
        for (i, entry) in sorted.iter().enumerate() {
            if i == 0 || sorted.get(i - 1).map(whole) != Some(whole(entry)) {
                count += 1;
            }
            of_tag[entry.1] = count - 1;
        }
        let subject = classes
            .iter()
            .map(|c| match c {
                Class::Artifact(artifact) => {
                    let wanted = (ReadDigest::of(&artifact.subject).end, artifact.subject.as_str());
                    let found = sorted.binary_search_by(|probe| whole(probe).cmp(&wanted)).ok();
                    found.map(|i| of_tag[sorted[i].1])
                }
                _ => None,
            })
            .collect();
        Self { count, of_tag, subject }
    }
}

/// Deletion is by digest: a tag sharing a kept digest is kept, and so is an
/// artifact of a kept digest. Repeated until nothing changes, since keeping an
/// artifact keeps its own digest (and its artifacts) in turn.
fn add_digest_reasons(tags: &[RepositoryTag], classes: &[Class], digests: &Digests, reasons: &mut Reasons) {
    // No digest shared and no artifact of a tag's digest: nothing to add.
    if digests.count == tags.len() && digests.subject.iter().all(Option::is_none) {
        return;
    }
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
                reasons[at].push(reason);
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

/// The plan's inputs hashed in one pass, in an order-free form: every tag's
/// name, digest and the metadata the plan reads (type, minimum, framework
/// requirements), usage, framework and pins, written by [`Encoding`] so that
/// no two inputs share an encoding. (Serialising each revision to canonical
/// JSON first made the fingerprint 60% of the planning time; hashing each
/// field by its own `update` with a digest's 71 hex characters, a quarter.)
fn fingerprint(
    tags: &[RepositoryTag],
    Parsed { versions, places, order }: &Parsed,
    facts: &[Option<RevisionFacts>],
    digests: &[ReadDigest],
    usage: &Usage,
    config: &RetentionConfig,
) -> String {
    let mut out = Encoding::default();
    out.field(b"vynil retention plan, fingerprint schema 4");
    out.version(Some(&config.framework));
    let mut pins: Vec<&str> = config.pins.iter().map(|(p, _)| p.as_str()).collect();
    pins.sort_unstable();
    pins.dedup();
    out.number(pins.len() as u64);
    for pin in pins {
        out.field(pin.as_bytes());
    }
    out.number(order.len() as u64);
    for &at in order {
        let tag = &tags[at];
        // A version's name is read from its parsed copy: the copies were
        // made one after the other, so they share cache lines, where the
        // names listed sit among the rest of their tags.
        let name = match places[at].and_then(|place| versions.as_slice().get(place)) {
            Some(version) => version.as_str(),
            None => &tag.name,
        };
        out.field(name.as_bytes());
        match digests.get(at).and_then(|d| d.raw.as_ref()) {
            Some(raw) => out.sha256(raw),
            None => out.text_digest(&tag.digest),
        }
        // What the metadata is, in one byte (the type's, for a revision).
        match (&tag.metadata, facts.get(at).and_then(Option::as_ref)) {
            (ManifestMetadata::Vynil(_), Some(facts)) => {
                out.mark(match facts.package_type {
                    PackageType::Tenant => 3,
                    PackageType::Service => 4,
                    PackageType::System => 5,
                });
                out.version(facts.minimum.as_ref());
                out.number(facts.vynil_versions.len() as u64);
                for requirement in &facts.vynil_versions {
                    out.version(Some(requirement));
                }
            }
            // Not a version: its metadata decides nothing but that it has some.
            (ManifestMetadata::Vynil(_), None) => out.mark(2),
            (ManifestMetadata::NotVynil, _) => out.mark(1),
            (ManifestMetadata::Malformed(_), _) => out.mark(0),
        }
    }
    match usage {
        Usage::Unknown => out.field(b"usage unknown"),
        Usage::Known(used) => {
            let mut used: Vec<(&str, &str, &str, RevisionUse)> = used
                .iter()
                .map(|r| (r.tag.as_str(), r.digest.as_deref().unwrap_or(""), r.instance.as_str(), r.usage))
                .collect();
            used.sort_unstable();
            out.field(b"usage known");
            out.number(used.len() as u64);
            for (tag, digest, instance, usage) in used {
                out.field(tag.as_bytes());
                out.digest(digest);
                out.field(instance.as_bytes());
                out.field(format!("{usage:?}").as_bytes());
            }
        }
    }
    out.finish()
}

/// A prefix-free encoding fed to SHA-256 in whole buffers: numbers as LEB128
/// varints, byte strings after their length, a lowercase `sha256:` digest as
/// its 32 bytes (marked, so it cannot read as another string), a version as
/// its numbers and, unless it is a release, its pre-release and build texts.
struct Encoding {
    hasher: Sha256,
    buffer: Vec<u8>,
}

impl Default for Encoding {
    fn default() -> Self {
        Self { hasher: Sha256::new(), buffer: Vec::with_capacity(Self::FLUSH_AT + 256) }
    }
}

impl Encoding {
    const FLUSH_AT: usize = 8192;

    fn number(&mut self, mut n: u64) {
        while n >= 0x80 {
            self.buffer.push((n as u8 & 0x7f) | 0x80);
            n >>= 7;
        }
        self.buffer.push(n as u8);
    }

    fn field(&mut self, bytes: &[u8]) {
        self.number(bytes.len() as u64);
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= Self::FLUSH_AT {
            self.hasher.update(&self.buffer);
            self.buffer.clear();
        }
    }

    fn digest(&mut self, digest: &str) {
        match digest.strip_prefix("sha256:").and_then(lowercase_hex_32) {
            Some(raw) => self.sha256(&raw),
            None => self.text_digest(digest),
        }
    }

    /// One of a few alternatives, where the position says which are possible.
    fn mark(&mut self, byte: u8) {
        self.buffer.push(byte);
    }

    /// A lowercase `sha256:` digest, as its 32 bytes.
    fn sha256(&mut self, raw: &[u8; 32]) {
        self.mark(1);
        self.buffer.extend_from_slice(raw);
    }

    /// Any other digest text.
    fn text_digest(&mut self, digest: &str) {
        self.mark(0);
        self.field(digest.as_bytes());
    }

    /// A version: `0` for none, `2` and its numbers for a release (most
    /// minimums), `1`, its numbers and both texts for any other.
    fn version(&mut self, version: Option<&Version>) {
        let Some(v) = version else {
            return self.mark(0);
        };
        let release = v.pre.is_empty() && v.build.is_empty();
        self.mark(if release { 2 } else { 1 });
        self.number(v.major);
        self.number(v.minor);
        self.number(v.patch);
        if !release {
            self.field(v.pre.as_str().as_bytes());
            self.field(v.build.as_str().as_bytes());
        }
    }

    fn finish(mut self) -> String {
        self.hasher.update(&self.buffer);
        format!("sha256:{}", hex::encode(self.hasher.finalize()))
    }
}

/// The 32 bytes of 64 lowercase hex digits; `None` for anything else (upper
/// case included, so that two spellings never meet in one encoding).
/// Eight digits at a time in a `u64` (SWAR), checked by spelling the values
/// back and comparing, once at the end: every digest of every plan is
/// decoded, and a table lookup per digit was a twentieth of the planning.
fn lowercase_hex_32(hex: &str) -> Option<[u8; 32]> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let bytes: &[u8; 64] = hex.as_bytes().try_into().ok()?;
    let mut raw = [0u8; 32];
    let mut wrong = 0;
    for (out, eight) in raw.as_chunks_mut::<4>().0.iter_mut().zip(bytes.as_chunks::<8>().0) {
        let x = u64::from_le_bytes(*eight);
        // What each byte is worth if it is a digit: its low four bits, plus
        // 9 for a letter (bit 6). At most 24: no byte carries into the next.
        let nibbles = (x & (0x0f * ONES)) + ((x >> 6) & ONES) * 9;
        // Those values spelled in lowercase (from 10, `a` is `0` + 10 +
        // 0x27): only a lowercase digit spells back as itself, given values
        // under 16 (`g`..`o` would too: they are worth 16..24).
        let letter = ((nibbles + 6 * ONES) >> 4) & ONES;
        let spelled = nibbles + 0x30 * ONES + letter * 0x27;
        wrong |= (x ^ spelled) | ((nibbles + 0x70 * ONES) & (0x80 * ONES));
        // Pairs (high, low) into bytes, then the four bytes side by side.
        let pairs = ((nibbles & 0x00ff_00ff_00ff_00ff) << 4) | ((nibbles >> 8) & 0x00ff_00ff_00ff_00ff);
        let packed = (pairs | (pairs >> 8)) & 0x0000_ffff_0000_ffff;
        let packed = (packed | (packed >> 16)) as u32;
        *out = packed.to_le_bytes();
    }
    (wrong == 0).then_some(raw)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What `lowercase_hex_32` must answer, one digit at a time.
    fn reference(hex: &str) -> Option<[u8; 32]> {
        let lowercase = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let decoded = hex::decode(hex).ok()?;
        lowercase.then(|| decoded.try_into().ok()).flatten()
    }

    #[test]
    fn a_field_is_encoded_as_its_length_and_every_one_of_its_bytes() {
        for length in 0..40u8 {
            let bytes: Vec<u8> = (0..length).map(|i| i.wrapping_mul(37).wrapping_add(length)).collect();
            let mut out = Encoding::default();
            out.mark(0xee);
            out.field(&bytes);
            out.mark(0xff);
            let expected: Vec<u8> = [vec![0xee, length], bytes, vec![0xff]].concat();
            assert_eq!(out.buffer, expected, "a field of {length} bytes");
        }
    }

    #[test]
    fn a_digest_decodes_as_its_bytes_and_any_other_digit_is_refused() {
        let base: String = (0..64).map(|i| char::from(b"0123456789abcdef"[(i * 7 + 3) % 16])).collect();
        assert_eq!(lowercase_hex_32(&base), reference(&base));
        assert!(lowercase_hex_32(&base).is_some());
        // Every byte value at every position.
        for position in 0..64 {
            for byte in 0..=255u8 {
                let mut bytes = base.clone().into_bytes();
                bytes[position] = byte;
                let Ok(text) = String::from_utf8(bytes) else { continue };
                assert_eq!(lowercase_hex_32(&text), reference(&text), "{text:?}");
            }
        }
        for wrong in ["", "ab", &base[1..], &format!("{base}0"), &base.to_uppercase()] {
            assert_eq!(lowercase_hex_32(wrong), None, "{wrong:?}");
        }
    }
}
