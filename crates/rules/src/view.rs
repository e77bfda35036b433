//! What a consumer may be shown of one repository: the waypoint descent and the
//! type-aware view (`docs/upstream-vynil.md` §3.6, §3.10; `docs/architecture.md`, principle 1).
//!
//! **Waypoints** (upstream's *code* semantics): walk the version tags admitted
//! by the channel, newest first. Stop at a tag without Vynil annotations. Skip a
//! revision whose `vynil_version` exceeds the framework. Skip a revision whose
//! minimum is ≥ the last kept minimum (redundant inside the current epoch).
//! Keep every other revision, and stop right after keeping one without a
//! minimum (it is reachable from anything).
//! `4.0.0(min 3.0.0), 3.5.0(min 2.0.0), 3.0.0(min 2.0.0), 2.5.0, 1.5.0` →
//! `[4.0.0, 3.5.0, 2.5.0]`.
//!
//! *Erratum of upstream's docs*: `docs/concepts.md` lists `1.5` too; its code
//! never visits `1.5` (the descent stops at `2.5`, which is reachable from
//! `1.5` anyway). We follow the code.
//!
//! **Type-aware view** (upstream #12 B): after the waypoints, keep descending,
//! skipping tags without annotations and revisions the framework cannot run,
//! and add the newest revision of every package `type` not yet represented.
//! `0.1.10(service), 0.1.9(service), 0.1.8(tenant)` → `[0.1.10, 0.1.8]`.
//! Without it the tenant revision is invisible, so an installed TenantInstance
//! can no longer find the package that deletes it: upstream #12's zombie.
//! With a single type in the repository the view equals upstream's.
//!
//! The descent is a sans-I/O state machine ([`ViewBuilder`]): it says which
//! tag's metadata it needs next, so the scanner reads only those manifests, and
//! [`compute_view`] runs it against metadata already at hand.

use std::borrow::Cow;

use semver::Version;

use crate::{
    channel::{Channel, runs_on, satisfies},
    package::{PackageContent, PackageType, Requirement},
    tag::Tag,
};

/// What the descent needs to know of a revision: implemented by the package
/// content itself, and by [`RevisionFacts`], its pre-parsed summary for callers
/// that compute many views of the same repository.
pub trait Revision {
    fn package_type(&self) -> PackageType;
    /// The first valid `minimum_previous_version` (borrowed where it is
    /// already parsed: most steps of a descent only compare it).
    fn minimum(&self) -> Option<Cow<'_, Version>>;
    fn runs_on(&self, framework: &Version) -> bool;
}

impl Revision for PackageContent {
    fn package_type(&self) -> PackageType {
        self.metadata.package_type
    }

    fn minimum(&self) -> Option<Cow<'_, Version>> {
        self.minimum_previous_version().map(Cow::Owned)
    }

    fn runs_on(&self, framework: &Version) -> bool {
        runs_on(self, framework)
    }
}

/// A revision's type, minimum and framework requirements, parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionFacts {
    pub package_type: PackageType,
    pub minimum: Option<Version>,
    pub vynil_versions: Vec<Version>,
}

impl RevisionFacts {
    pub fn of(content: &PackageContent) -> Self {
        Self::new(content.package_type(), &content.requirements)
    }

    /// The facts of a revision of `package_type` with these requirements.
    pub fn new(package_type: PackageType, requirements: &[Requirement]) -> Self {
        FactsReader::default().read(package_type, requirements)
    }
}

/// Reads the facts of many revisions of one repository, parsing each
/// requirement text once while it repeats: a minimum is its epoch's first
/// version, required by every revision of the epoch, and a framework
/// requirement changes as rarely (parsing each anew was 4% of a plan).
#[derive(Debug, Default)]
pub(crate) struct FactsReader<'a> {
    minimum: LastVersion<'a>,
    vynil: LastVersion<'a>,
}

impl<'a> FactsReader<'a> {
    pub(crate) fn read(
        &mut self,
        package_type: PackageType,
        requirements: &'a [Requirement],
    ) -> RevisionFacts {
        RevisionFacts {
            package_type,
            minimum: Requirement::minimum_previous_version_by(requirements, |text| self.minimum.read(text)),
            vynil_versions: Requirement::vynil_versions_by(requirements, |text| self.vynil.read(text))
                .collect(),
        }
    }
}

/// The last version text read, and what it reads as.
#[derive(Debug, Default)]
struct LastVersion<'a>(Option<(&'a str, Option<Version>)>);

impl<'a> LastVersion<'a> {
    fn read(&mut self, text: &'a str) -> Option<Version> {
        match &self.0 {
            Some((last, version)) if *last == text => version.clone(),
            _ => {
                let version = Tag::version_of(text);
                self.0 = Some((text, version.clone()));
                version
            }
        }
    }
}

impl Revision for RevisionFacts {
    fn package_type(&self) -> PackageType {
        self.package_type
    }

    fn minimum(&self) -> Option<Cow<'_, Version>> {
        self.minimum.as_ref().map(Cow::Borrowed)
    }

    fn runs_on(&self, framework: &Version) -> bool {
        satisfies(self.vynil_versions.iter(), framework)
    }
}

/// Who looks: a channel and the framework version it runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Viewer {
    pub channel: Channel,
    pub framework: Version,
}

/// Why a revision is in a view.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// The newest revision the viewer may install.
    Head,
    /// A migration step: the minimum it needs, or `None` when it needs none
    /// (the descent stops after it).
    Waypoint { minimum: Option<Version> },
    /// The newest revision of a type the waypoints did not represent.
    NewestOfType(PackageType),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewEntry {
    pub tag: Tag,
    pub role: Role,
    pub package_type: PackageType,
}

/// The revisions shown to one viewer, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct View {
    pub entries: Vec<ViewEntry>,
    /// How many tags' metadata the descent needed.
    pub lookups: usize,
}

impl View {
    pub fn tags(&self) -> Vec<&str> {
        self.entries.iter().map(|e| e.tag.as_str()).collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waypoints,
    Types,
    Done,
}

/// The version tags of a repository, parsed and sorted newest first once and
/// shared by every view computed over them.
#[derive(Debug, Clone, Default)]
pub struct Versions {
    newest_first: Vec<Tag>,
    /// [`Channel::narrowest_admitting`] of each, found once for every view.
    maturity: Vec<Channel>,
}

impl Versions {
    /// `tags`: every tag of the repository (non-versions are ignored).
    pub fn parse<'a>(tags: impl IntoIterator<Item = &'a str>) -> Self {
        Self::from_tags(tags.into_iter().filter_map(Tag::parse).collect())
    }

    /// The same from tags already parsed.
    pub fn from_tags(mut tags: Vec<Tag>) -> Self {
        tags.sort_by(|a, b| b.cmp(a));
        tags.dedup();
        Self::from_newest_first(tags)
    }

    /// From tags already sorted newest first without duplicates (a caller
    /// that sorted them with more in hand: sorting again, even sorted input,
    /// and comparing neighbours cost the planner a twentieth of its time).
    pub(crate) fn from_newest_first(tags: Vec<Tag>) -> Self {
        debug_assert!(tags.windows(2).all(|pair| pair[0] > pair[1]), "versions not sorted newest first");
        let maturity = tags.iter().map(|tag| Channel::narrowest_admitting(tag.as_str())).collect();
        Self { newest_first: tags, maturity }
    }

    pub fn as_slice(&self) -> &[Tag] {
        &self.newest_first
    }

    /// Whether a viewer on `channel` may be shown the version at `at`.
    fn admits(&self, at: usize, channel: Channel) -> bool {
        self.maturity.get(at).is_some_and(|narrowest| *narrowest <= channel)
    }
}

/// The descent as a state machine: call [`ViewBuilder::next_needed`], look the
/// tag's metadata up, [`ViewBuilder::provide`] it, repeat until `None`.
#[derive(Debug, Clone)]
pub struct ViewBuilder<'v> {
    viewer: Viewer,
    type_aware: bool,
    versions: &'v Versions,
    /// The position in `versions` of the next tag to ask about: one the
    /// viewer's channel admits, or the end.
    position: usize,
    phase: Phase,
    last_minimum: Option<Version>,
    types: TypeSet,
    /// The revisions kept so far, by position: a caller that has the
    /// versions at hand ([`KnownRevisions`]) needs no copy of their tags.
    shown: Vec<Shown>,
    lookups: usize,
}

/// A revision a view shows, by its position in [`Versions::as_slice`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shown {
    pub(crate) position: usize,
    pub(crate) role: Role,
    pub(crate) package_type: PackageType,
}

/// The package types a view shows so far: a descent asks at every step.
#[derive(Debug, Clone, Copy, Default)]
struct TypeSet(u8);

impl TypeSet {
    fn bit(package_type: PackageType) -> u8 {
        1 << package_type as u8
    }

    fn insert(&mut self, package_type: PackageType) {
        self.0 |= Self::bit(package_type);
    }

    fn contains(self, package_type: PackageType) -> bool {
        self.0 & Self::bit(package_type) != 0
    }

    fn is_empty(self) -> bool {
        self.0 == 0
    }

    fn is_complete(self) -> bool {
        self.0.count_ones() as usize == PackageType::ALL.len()
    }
}

impl<'v> ViewBuilder<'v> {
    pub fn new(versions: &'v Versions, viewer: Viewer, type_aware: bool) -> Self {
        let mut builder = Self {
            viewer,
            type_aware,
            versions,
            position: 0,
            phase: Phase::Waypoints,
            last_minimum: None,
            types: TypeSet::default(),
            shown: Vec::new(),
            lookups: 0,
        };
        builder.skip_to_admitted();
        builder
    }

    /// Moves past the versions the channel does not admit; done at the end.
    fn skip_to_admitted(&mut self) {
        let end = self.versions.newest_first.len();
        while self.position < end && !self.versions.admits(self.position, self.viewer.channel) {
            self.position += 1;
        }
        if self.position >= end {
            self.phase = Phase::Done;
        }
    }

    /// The tag whose metadata is needed next; `None` once the view is complete.
    pub fn next_needed(&self) -> Option<&'v Tag> {
        match self.phase {
            Phase::Done => None,
            _ => self.versions.newest_first.get(self.position),
        }
    }

    /// The tags the descent may need next, in order, at most `n`, starting
    /// with [`ViewBuilder::next_needed`]: what a caller can read ahead (each
    /// is needed unless the view completes first). Empty once it is complete.
    pub fn upcoming(&self, n: usize) -> impl Iterator<Item = &'v Tag> + '_ {
        let versions = self.versions;
        let start = if self.phase == Phase::Done { versions.newest_first.len() } else { self.position };
        (start..versions.newest_first.len())
            .filter(move |at| versions.admits(*at, self.viewer.channel))
            .take(n)
            .filter_map(move |at| versions.newest_first.get(at))
    }

    /// The metadata of [`ViewBuilder::next_needed`]: `None` when the manifest
    /// carries no Vynil annotations.
    pub fn provide(&mut self, content: Option<&impl Revision>) {
        if self.next_needed().is_none() {
            return;
        }
        let at = self.position;
        self.lookups += 1;
        self.position += 1;
        match (self.phase, content) {
            (Phase::Done, _) => {}
            (Phase::Waypoints, None) => self.end_waypoints(),
            (Phase::Waypoints, Some(content)) => self.waypoint_step(at, content),
            (Phase::Types, None) => {}
            (Phase::Types, Some(content)) => self.type_step(at, content),
        }
        self.skip_to_admitted();
    }

    /// [`ViewBuilder::next_needed`] is not part of this view: the descent
    /// goes on as if it were not listed (a revision a policy refuses, such
    /// as an unverified one under an enforced signature policy, is no reason
    /// to end the waypoints as a tag without a package is).
    pub fn skip(&mut self) {
        if self.next_needed().is_none() {
            return;
        }
        self.lookups += 1;
        self.position += 1;
        self.skip_to_admitted();
    }

    fn waypoint_step(&mut self, at: usize, content: &impl Revision) {
        if !content.runs_on(&self.viewer.framework) {
            return;
        }
        let minimum = content.minimum();
        if let (Some(last), Some(min)) = (&self.last_minimum, &minimum)
            && min.cmp_precedence(last) != std::cmp::Ordering::Less
        {
            return;
        }
        let minimum = minimum.map(Cow::into_owned);
        let role =
            if self.shown.is_empty() { Role::Head } else { Role::Waypoint { minimum: minimum.clone() } };
        self.keep(at, role, content.package_type());
        match minimum {
            Some(min) => self.last_minimum = Some(min),
            None => self.end_waypoints(),
        }
    }

    /// The type-aware phase adds types *other than* those the waypoints show:
    /// when they show nothing (the newest tag has no annotations, or needs a
    /// newer framework all the way down), the view stays upstream's (empty).
    fn end_waypoints(&mut self) {
        let other_types_missing = !self.types.is_empty() && !self.types.is_complete();
        self.phase = if self.type_aware && other_types_missing { Phase::Types } else { Phase::Done };
    }

    /// The type-aware rule: a revision is kept when its type is not shown yet
    /// and it runs on the viewer's framework.
    fn shows_another_type(&self, content: &impl Revision) -> Option<PackageType> {
        let package_type = content.package_type();
        (!self.types.contains(package_type) && content.runs_on(&self.viewer.framework))
            .then_some(package_type)
    }

    fn type_step(&mut self, at: usize, content: &impl Revision) {
        if let Some(package_type) = self.shows_another_type(content) {
            self.keep(at, Role::NewestOfType(package_type), package_type);
            if self.types.is_complete() {
                self.phase = Phase::Done;
            }
        }
    }

    /// Runs the type-aware phase to its end at once from `known`: for each
    /// type still missing, the first remaining candidate of that type the rule
    /// ([`ViewBuilder::shows_another_type`]) keeps. That is what the steps
    /// find, one tag at a time: keeping one type never changes whether
    /// another is kept. `lookups` counts the tags the steps would have asked.
    fn complete_types<R: Revision>(&mut self, known: &KnownRevisions<'v, '_, R>) {
        if self.phase != Phase::Types {
            return;
        }
        let (versions, channel) = (self.versions, self.viewer.channel);
        let mut found: Vec<(usize, PackageType)> = Vec::new();
        let mut missing = 0;
        for package_type in PackageType::ALL.into_iter().filter(|t| !self.types.contains(*t)) {
            missing += 1;
            let of_type = &known.by_type[package_type as usize];
            let start = of_type.partition_point(|at| *at < self.position);
            let first = of_type[start..].iter().copied().find(|at| {
                versions.admits(*at, channel)
                    && known.revision(*at).is_some_and(|r| self.shows_another_type(r).is_some())
            });
            found.extend(first.map(|at| (at, package_type)));
        }
        found.sort_unstable();
        let end = match found.last() {
            Some((last, _)) if found.len() == missing => last + 1,
            _ => versions.newest_first.len(),
        };
        let asked = versions.maturity.get(self.position..end).unwrap_or_default();
        self.lookups += asked.iter().filter(|narrowest| **narrowest <= channel).count();
        self.position = end;
        self.phase = Phase::Done;
        for (at, package_type) in found {
            self.keep(at, Role::NewestOfType(package_type), package_type);
        }
    }

    fn keep(&mut self, position: usize, role: Role, package_type: PackageType) {
        self.types.insert(package_type);
        self.shown.push(Shown { position, role, package_type });
    }

    pub fn finish(self) -> View {
        let versions = self.versions;
        let entries = self
            .shown
            .into_iter()
            .filter_map(|Shown { position, role, package_type }| {
                let tag = versions.newest_first.get(position)?.clone();
                Some(ViewEntry { tag, role, package_type })
            })
            .collect();
        View { entries, lookups: self.lookups }
    }
}

/// Every revision of a repository at hand, each type's listed newest first,
/// for a caller computing many type-aware views of one repository (the
/// planner computes one per channel and framework breakpoint). The waypoints
/// are walked step by step as [`ViewBuilder`] walks them; the type-aware phase
/// then looks only at the revisions of the types still missing, where the
/// steps ask about every older tag (in a repository whose only tenant
/// revisions are its oldest, 700 of 1 000 tags per view: a seventh of the
/// planning time).
#[derive(Debug, Clone)]
pub struct KnownRevisions<'v, 'r, R> {
    versions: &'v Versions,
    revisions: Vec<Option<&'r R>>,
    /// The positions in `versions` of the revisions of each type, ascending.
    by_type: [Vec<usize>; PackageType::ALL.len()],
}

impl<'v, 'r, R: Revision> KnownRevisions<'v, 'r, R> {
    /// `revisions`: the metadata of each of `versions` by its position in
    /// [`Versions::as_slice`], `None` for a tag without Vynil annotations.
    pub fn new(versions: &'v Versions, revisions: Vec<Option<&'r R>>) -> Self {
        let mut by_type: [Vec<usize>; PackageType::ALL.len()] = Default::default();
        for (at, revision) in revisions.iter().enumerate().take(versions.newest_first.len()) {
            if let Some(revision) = revision {
                by_type[revision.package_type() as usize].push(at);
            }
        }
        Self { versions, revisions, by_type }
    }

    fn revision(&self, at: usize) -> Option<&'r R> {
        self.revisions.get(at).copied().flatten()
    }

    /// The type-aware view `viewer` is shown: the same as
    /// [`view_of_versions`] with these revisions.
    pub fn view(&self, viewer: Viewer) -> View {
        self.descend(viewer).finish()
    }

    /// The revisions of that view by position, without a copy of their tags
    /// (the planner computes nine views per repository).
    pub(crate) fn shown(&self, viewer: Viewer) -> Vec<Shown> {
        self.descend(viewer).shown
    }

    fn descend(&self, viewer: Viewer) -> ViewBuilder<'v> {
        let mut builder = ViewBuilder::new(self.versions, viewer, true);
        while builder.phase == Phase::Waypoints {
            let content = self.revision(builder.position);
            builder.provide(content);
        }
        builder.complete_types(self);
        builder
    }
}

/// Runs the descent over `versions` against metadata at hand (`lookup`
/// answers `None` for a tag without Vynil annotations).
pub fn view_of_versions<'c, R: Revision + 'c>(
    versions: &Versions,
    viewer: &Viewer,
    type_aware: bool,
    mut lookup: impl FnMut(&Tag) -> Option<&'c R>,
) -> View {
    let mut builder = ViewBuilder::new(versions, viewer.clone(), type_aware);
    while let Some(tag) = builder.next_needed() {
        let content = lookup(tag);
        builder.provide(content);
    }
    builder.finish()
}

/// [`view_of_versions`] over raw tag names.
pub fn compute_view<'a, 'c, R: Revision + 'c>(
    tags: impl IntoIterator<Item = &'a str>,
    viewer: &Viewer,
    type_aware: bool,
    lookup: impl FnMut(&Tag) -> Option<&'c R>,
) -> View {
    view_of_versions(&Versions::parse(tags), viewer, type_aware, lookup)
}

/// What a JukeBox's catalog may answer for `asked`, given the `packages` its
/// scans keep for the JukeBox's own channel (`scanned`): exactly that view, or
/// a refusal. A view is not a filter of a wider one: the stable view of a
/// repository can hold a stable release that the alpha view skipped (not a
/// waypoint there), and a wider view holds tags the narrower scan never read.
/// So only the scanned channel has an answer.
pub fn catalog_view(
    packages: &[crate::Package],
    scanned: Channel,
    asked: Option<Channel>,
) -> Result<&[crate::Package], crate::RulesError> {
    match asked {
        None => Ok(packages),
        Some(asked) if asked == scanned => Ok(packages),
        Some(asked) => Err(crate::RulesError::ChannelNotScanned { asked, scanned }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::testing::content;

    /// `(tag, type, min, vynil)`; type "-" = no Vynil annotations.
    type Row<'a> = (&'a str, &'a str, Option<&'a str>, Option<&'a str>);

    fn view_of(rows: &[Row], channel: Channel, framework: &str, type_aware: bool) -> Vec<String> {
        let contents: HashMap<&str, PackageContent> = rows
            .iter()
            .filter(|(_, kind, _, _)| *kind != "-")
            .map(|(tag, kind, min, vynil)| (*tag, content(kind, *min, *vynil)))
            .collect();
        let viewer = Viewer { channel, framework: Version::parse(framework).unwrap() };
        compute_view(rows.iter().map(|r| r.0), &viewer, type_aware, |tag| contents.get(tag.as_str()))
            .tags()
            .into_iter()
            .map(String::from)
            .collect()
    }

    fn stable(rows: &[Row]) -> Vec<String> {
        view_of(rows, Channel::Stable, "0.8.0", true)
    }

    #[test]
    fn the_type_aware_view_adds_the_newest_revision_of_each_other_type() {
        let rows = [
            ("0.1.10", "service", None, None),
            ("0.1.9", "service", Some("0.1.8"), None),
            ("0.1.8", "tenant", Some("0.1.0"), None),
            ("0.1.5", "tenant", None, None),
        ];
        assert_eq!(stable(&rows), ["0.1.10", "0.1.8"]);
        assert_eq!(view_of(&rows, Channel::Stable, "0.8.0", false), ["0.1.10"], "upstream today");
    }

    #[test]
    fn the_type_aware_view_skips_unannotated_tags_and_future_frameworks() {
        let rows = [
            ("0.2.0", "service", None, None),
            ("0.1.9", "-", None, None),
            ("0.1.8", "tenant", None, Some("9.0.0")),
            ("0.1.7", "tenant", None, None),
            ("0.1.6", "system", None, None),
            ("0.1.5", "system", None, None),
        ];
        assert_eq!(stable(&rows), ["0.2.0", "0.1.7", "0.1.6"]);
    }

    #[test]
    fn the_type_aware_view_adds_nothing_when_the_waypoints_show_nothing() {
        let rows =
            [("1.1.0", "-", None, None), ("1.0.0", "tenant", None, None), ("0.9.0", "service", None, None)];
        assert!(stable(&rows).is_empty(), "as upstream: the newest tag has no annotations");
    }

    #[test]
    fn the_builder_asks_only_for_the_tags_it_needs() {
        let rows: Vec<Row> = vec![
            ("3.0.0", "tenant", None, None),
            ("2.0.0", "tenant", None, None),
            ("1.0.0", "tenant", None, None),
        ];
        let contents: HashMap<&str, PackageContent> =
            rows.iter().map(|(tag, kind, min, v)| (*tag, content(kind, *min, *v))).collect();
        let viewer = Viewer { channel: Channel::Stable, framework: Version::new(0, 8, 0) };
        let plain = compute_view(rows.iter().map(|r| r.0), &viewer, false, |t| contents.get(t.as_str()));
        assert_eq!(plain.lookups, 1, "upstream stops after a revision without minimum");
        let typed = compute_view(rows.iter().map(|r| r.0), &viewer, true, |t| contents.get(t.as_str()));
        assert_eq!(typed.lookups, 3, "looking for other types reads the rest once");
        assert_eq!(typed.tags(), ["3.0.0"]);
    }

    #[test]
    fn roles_say_why_each_revision_is_shown() {
        let rows = [
            ("4.0.0", "service", Some("3.0.0"), None),
            ("3.5.0", "service", Some("2.0.0"), None),
            ("2.5.0", "service", None, None),
            ("2.0.0", "tenant", None, None),
        ];
        let contents: HashMap<&str, PackageContent> =
            rows.iter().map(|(tag, kind, min, v)| (*tag, content(kind, *min, *v))).collect();
        let viewer = Viewer { channel: Channel::Stable, framework: Version::new(0, 8, 0) };
        let view = compute_view(rows.iter().map(|r| r.0), &viewer, true, |t| contents.get(t.as_str()));
        let roles: Vec<Role> = view.entries.into_iter().map(|e| e.role).collect();
        assert_eq!(
            roles,
            [
                Role::Head,
                Role::Waypoint { minimum: Some(Version::new(2, 0, 0)) },
                Role::Waypoint { minimum: None },
                Role::NewestOfType(PackageType::Tenant),
            ]
        );
    }
}
