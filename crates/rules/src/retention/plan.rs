//! Planning one repository: parse and sort its tags, then keep the union of
//! what any consumer could be shown (every view, breakpoint, type, usage,
//! pin, artifact and alias), and delete the complement by digest.

use std::collections::BTreeSet;

use semver::Version;

use super::*;
use crate::{
    RulesError,
    channel::Channel,
    package::PackageType,
    tag::{ArtifactTag, Tag},
    view::{FactsReader, KnownRevisions, RevisionFacts, Role, Versions, Viewer},
};

/// What a tag is to the plan. A version is named by its place in the
/// repository's [`Versions`] (newest first), so versions compare as numbers.
pub(super) enum Class {
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
pub(super) struct Sweep {
    versions: Vec<(Tag, usize)>,
    others: Vec<usize>,
    digests: Vec<ReadDigest>,
    /// What the descent and the fingerprint read of each version with Vynil
    /// metadata (a [`Class::Version`]), parsed once.
    facts: Vec<Option<RevisionFacts>>,
}

/// A digest as the plan compares and hashes it.
#[derive(Clone, Copy)]
pub(super) struct ReadDigest {
    /// Its last 16 bytes: registry digests are SHA-256, so their ends
    /// already tell them apart.
    pub(super) end: u128,
    /// A lowercase `sha256:` digest's 32 bytes.
    pub(super) raw: Option<[u8; 32]>,
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
pub(super) fn metadata_text(tag: &RepositoryTag) -> String {
    serde_json::to_string(&tag.metadata).unwrap_or_default()
}

/// The repository's versions, sorted once.
pub(super) struct Parsed {
    pub(super) versions: Versions,
    /// The place in `versions` of each tag that is one (a name listed twice
    /// shares its place).
    pub(super) places: Vec<Option<usize>>,
    /// Every tag's position in the plan's order: versions newest first, then
    /// the other tags by name; ties broken by digest, so that the fingerprint
    /// reads the inputs in an order that does not depend on theirs.
    pub(super) order: Vec<usize>,
}

pub(super) fn sort_versions(
    tags: &[RepositoryTag],
    mut found: Vec<(Tag, usize)>,
    mut others: Vec<usize>,
) -> Parsed {
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
    refuse_unreadable(tags, &classes)?;
    let breakpoints = breakpoints(config.framework(), facts.iter().flatten());
    let mut reasons: Reasons = vec![Vec::new(); tags.len()];
    add_view_reasons(&versions, &classes, &order, &facts, &breakpoints, config.framework(), &mut reasons);
    add_newest_of_each_type(&classes, &order, &facts, &mut reasons);
    add_used_and_pinned(tags, usage, config, &mut reasons);
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
    let entries = decide(tags, &classes, &places, &order, reasons);
    Ok(RetentionPlan { fingerprint, entries, usage_unknown: matches!(usage, Usage::Unknown), breakpoints })
}

/// Versions whose metadata the registry did not give: nothing is deleted on a guess.
fn refuse_unreadable(tags: &[RepositoryTag], classes: &[Class]) -> Result<(), RulesError> {
    let unreadable: Vec<String> = tags
        .iter()
        .zip(classes)
        .filter_map(|(t, c)| match (&t.metadata, c) {
            (ManifestMetadata::Malformed(why), Class::VersionWithoutVynil(_)) => {
                Some(format!("{}: {why}", t.name))
            }
            _ => None,
        })
        .collect();
    if unreadable.is_empty() { Ok(()) } else { Err(RulesError::UnreadableMetadata(unreadable.join("; "))) }
}

/// Tags an instance uses (when usage is known) and tags a pin matches.
fn add_used_and_pinned(
    tags: &[RepositoryTag],
    usage: &Usage,
    config: &RetentionConfig,
    reasons: &mut Reasons,
) {
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
}

/// Each name's decision, in the plan's order: kept with its reasons, else
/// deleted as an orphaned artifact or as superseded.
fn decide<'a>(
    tags: &'a [RepositoryTag],
    classes: &[Class],
    places: &[Option<usize>],
    order: &[usize],
    mut reasons: Reasons,
) -> Vec<PlanEntry<'a>> {
    // A name listed twice is planned once, as its first entry: the versions
    // by their place, the others (sorted by name) by their names.
    let same_name = |a: usize, b: usize| match (places[a], places[b]) {
        (Some(x), Some(y)) => x == y,
        (None, None) => tags[a].name == tags[b].name,
        _ => false,
    };
    let mut entries: Vec<PlanEntry> = Vec::with_capacity(order.len());
    let mut previous: Option<usize> = None;
    for &at in order {
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
    entries
}

/// The reasons of each tag, by its position in the input: a few for a kept
/// tag, none for most, put in order once for the plan (a set per tag,
/// built and taken apart again, was 3% of a plan's profile).
pub(super) type Reasons = Vec<Vec<KeepReason>>;

pub(super) fn classify(tag: &RepositoryTag, place: Option<usize>) -> Class {
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
pub(super) fn breakpoints<'a>(
    configured: &Version,
    revisions: impl Iterator<Item = &'a RevisionFacts>,
) -> Vec<Version> {
    let mut set: BTreeSet<Version> = revisions.flat_map(|r| r.vynil_versions.iter().cloned()).collect();
    set.insert(configured.clone());
    set.into_iter().collect()
}

pub(super) fn add_view_reasons(
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

pub(super) fn is_configured(reason: &KeepReason) -> bool {
    match reason {
        KeepReason::ChannelHead { framework, .. }
        | KeepReason::Waypoint { framework, .. }
        | KeepReason::TypeInView { framework, .. } => framework.is_none(),
        _ => true,
    }
}

pub(super) fn same_kind(a: &KeepReason, b: &KeepReason) -> bool {
    match (a, b) {
        (KeepReason::ChannelHead { channel: x, .. }, KeepReason::ChannelHead { channel: y, .. })
        | (KeepReason::Waypoint { channel: x, .. }, KeepReason::Waypoint { channel: y, .. })
        | (KeepReason::TypeInView { channel: x, .. }, KeepReason::TypeInView { channel: y, .. }) => x == y,
        _ => false,
    }
}

pub(super) fn add_newest_of_each_type(
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
pub(super) struct Digests {
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
pub(super) fn add_digest_reasons(
    tags: &[RepositoryTag],
    classes: &[Class],
    digests: &Digests,
    reasons: &mut Reasons,
) {
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
