//! What the surfaces (CLI, web page) show of a JukeBox's catalog, computed
//! here so that neither re-implements waypoints: each revision's roles, and
//! the upgrade path from an installed version.
//!
//! **Roles** are the view's own ([`crate::view::Role`]), recomputed over the
//! revisions the catalog holds for one repository with the JukeBox's viewer,
//! plus "newest of its type" wherever a revision is the newest of its type
//! (the head is, when no other revision shares its type above it). A revision
//! the descent did not keep (a catalog from an older scan) has no role.
//!
//! **Upgrade path**: from an installed tag, the revision install selection
//! picks ([`crate::select_install`], upstream's strict filter), then the one it
//! picks from there, until it picks the same revision again: each step is a
//! Job the lifecycle would run, in order. When the first step cannot be
//! taken, the path is empty and says why (the selection's own [`NoMatch`]).

use std::collections::{BTreeMap, BTreeSet};

use semver::Version;

use crate::{
    package::{Package, PackageType},
    selection::{InstallQuery, NoMatch, select_install},
    signature::{Verdict, VerifyMode},
    tag::Tag,
    upgrade::withheld::{Withheld, Withholding},
    view::{Role, Versions, Viewer, view_of_versions},
};

/// A role of one revision in its JukeBox's catalog.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CatalogRole {
    /// The newest revision of its channel a consumer may install.
    Head,
    /// A migration step, with the minimum it needs (`None`: reachable from anything).
    Waypoint { minimum: Option<Version> },
    /// The newest revision of this type in the catalog.
    NewestOfType(PackageType),
    /// An operator recalled it ([`crate::upgrade::withheld`]).
    Recalled { reason: String, move_away: bool },
    /// It fails the JukeBox's signature policy ([`crate::signature`]):
    /// never selected under `enforce`, marked under `warn`.
    Unverified { verdict: Verdict, enforced: bool },
    /// Its verified digest is also these other version tags' (a re-tag:
    /// [`crate::signature::same_verified_digest`]).
    SameDigest { tags: Vec<String> },
}

impl CatalogRole {
    /// "head", "waypoint (min 2.0.0)", "newest tenant revision".
    pub fn describe(&self) -> String {
        match self {
            CatalogRole::Head => "head".into(),
            CatalogRole::Waypoint { minimum: Some(min) } => format!("waypoint (min {min})"),
            CatalogRole::Waypoint { minimum: None } => "waypoint (no minimum)".into(),
            CatalogRole::NewestOfType(t) => format!("newest {t} revision"),
            CatalogRole::Recalled { reason, .. } if reason.is_empty() => "recalled".into(),
            CatalogRole::Recalled { reason, .. } => format!("recalled: {reason}"),
            CatalogRole::Unverified { verdict, enforced: true } => format!("refused: {}", verdict.describe()),
            CatalogRole::Unverified { verdict, enforced: false } => {
                format!("unverified: {}", verdict.describe())
            }
            CatalogRole::SameDigest { tags } => {
                format!(
                    "the same signed bytes as {}: a re-tag, make sure it is the version you mean",
                    tags.join(", ")
                )
            }
        }
    }
}

/// The roles of each of `packages` (same order), as `viewer` sees them.
pub fn roles(packages: &[Package], viewer: &Viewer) -> Vec<Vec<CatalogRole>> {
    let mut repositories: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    for (i, p) in packages.iter().enumerate() {
        repositories.entry((p.registry.as_str(), p.image.as_str())).or_default().push(i);
    }
    let mut out = vec![Vec::new(); packages.len()];
    for members in repositories.values() {
        let tags = members.iter().map(|&i| packages[i].tag.as_str());
        let versions = Versions::parse(tags);
        let view = view_of_versions(&versions, viewer, true, |tag| {
            members.iter().map(|&i| &packages[i]).find(|p| p.tag == tag.as_str()).map(|p| &p.content)
        });
        let mut types_seen = BTreeSet::new();
        for tag in versions.as_slice() {
            for &i in members.iter().filter(|&&i| packages[i].tag == tag.as_str()) {
                let mut found: Vec<CatalogRole> = view
                    .entries
                    .iter()
                    .filter(|e| e.tag == *tag)
                    .map(|e| match &e.role {
                        Role::Head => CatalogRole::Head,
                        Role::Waypoint { minimum } => CatalogRole::Waypoint { minimum: minimum.clone() },
                        Role::NewestOfType(t) => CatalogRole::NewestOfType(*t),
                    })
                    .collect();
                let package_type = packages[i].package_type();
                if types_seen.insert(package_type)
                    && !found.contains(&CatalogRole::NewestOfType(package_type))
                {
                    found.push(CatalogRole::NewestOfType(package_type));
                }
                out[i] = found;
            }
        }
    }
    out
}

/// The roles of each of `packages` (same order) under the signature policy
/// `verify`: under `enforce`, the roles are those of the verified revisions
/// alone (an unverified one is no head), and each revision failing the
/// policy has the role [`CatalogRole::Unverified`].
pub fn roles_under(
    packages: &[Package],
    viewer: &Viewer,
    verify: Option<VerifyMode>,
) -> Vec<Vec<CatalogRole>> {
    let Some(mode) = verify else { return roles(packages, viewer) };
    let verdict = |p: &Package| p.signature.clone().unwrap_or(Verdict::Unsigned);
    let enforced = mode == VerifyMode::Enforce;
    let mut out = if enforced {
        let kept: Vec<usize> = (0..packages.len()).filter(|&i| verdict(&packages[i]).is_verified()).collect();
        let subset: Vec<Package> = kept.iter().map(|&i| packages[i].clone()).collect();
        let mut out = vec![Vec::new(); packages.len()];
        for (roles, i) in roles(&subset, viewer).into_iter().zip(kept) {
            out[i] = roles;
        }
        out
    } else {
        roles(packages, viewer)
    };
    for (package, roles) in packages.iter().zip(out.iter_mut()) {
        let verdict = verdict(package);
        if !verdict.is_verified() {
            roles.push(CatalogRole::Unverified { verdict, enforced });
        }
        let same = crate::signature::same_verified_digest(packages, package);
        if !same.is_empty() {
            roles.push(CatalogRole::SameDigest { tags: same.into_iter().map(String::from).collect() });
        }
    }
    out
}

/// `roles` (of `packages`, same order) with each recalled revision's recall.
pub fn with_recalls(
    mut roles: Vec<Vec<CatalogRole>>,
    packages: &[Package],
    recalls: &[crate::upgrade::withheld::Recall],
) -> Vec<Vec<CatalogRole>> {
    for (package, roles) in packages.iter().zip(roles.iter_mut()) {
        if let Some(recall) = recalls.iter().find(|r| r.tag == package.tag) {
            roles.push(CatalogRole::Recalled { reason: recall.reason.clone(), move_away: recall.move_away });
        }
    }
    roles
}

/// The revisions an installed instance goes through, in order, up to the
/// newest it can reach; `blocked` says why it cannot go (further).
#[derive(Debug, Clone, PartialEq)]
pub struct UpgradePath<'p> {
    pub steps: Vec<&'p Package>,
    /// Why the path is empty (nothing matches from the installed tag).
    pub blocked: Option<NoMatch>,
}

impl UpgradePath<'_> {
    /// The newest revision reached, when the path has any step.
    pub fn last(&self) -> Option<&Package> {
        self.steps.last().copied()
    }
}

/// The path from `query.installed_tag` (a fresh install when `None`) through
/// `packages`.
pub fn upgrade_path<'p>(packages: &'p [Package], query: &InstallQuery) -> UpgradePath<'p> {
    let mut steps: Vec<&Package> = Vec::new();
    let mut current: Option<String> = query.installed_tag.filter(|t| !t.is_empty()).map(String::from);
    // Each step moves to a strictly newer tag, so the path is at most as
    // long as the list; the bound keeps a malformed list from looping.
    for _ in 0..=packages.len() {
        let asked = InstallQuery { installed_tag: current.as_deref(), ..query.clone() };
        match select_install(packages, &asked) {
            Ok(next) => {
                let newer = match (current.as_deref().and_then(Tag::parse), Tag::parse(&next.tag)) {
                    (Some(from), Some(to)) => to > from,
                    (None, _) => true,
                    (Some(_), None) => false,
                };
                if !newer {
                    break;
                }
                current = Some(next.tag.clone());
                steps.push(next);
            }
            Err(no_match) => {
                if steps.is_empty() {
                    return UpgradePath { steps, blocked: Some(no_match) };
                }
                break;
            }
        }
    }
    UpgradePath { steps, blocked: None }
}

/// What the withheld revisions kept from one instance, for `Explain`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeldBack {
    /// Withheld revisions newer than the one selected, newest first.
    pub newer: Vec<Withheld>,
    /// The instance runs a recalled revision: the recall, and the revision
    /// moving away would install (`None`: none is selectable).
    pub running_recalled: Option<(Withheld, Option<String>)>,
}

/// What `query.withheld` kept from the instance `query` describes, which
/// selection gave `selected` (the instance's package and type in `packages`).
pub fn held_back(packages: &[Package], query: &InstallQuery, selected: &Package) -> HeldBack {
    let floor = Tag::parse(&selected.tag);
    let mut newer: Vec<(Option<Tag>, Withheld)> = packages
        .iter()
        .filter(|p| p.is_of(query.category, query.name, query.package_type))
        .filter_map(|p| {
            let tag = Tag::parse(&p.tag);
            let above = match (&tag, &floor) {
                (Some(tag), Some(floor)) => tag > floor,
                _ => false,
            };
            let held = query.withheld.iter().find(|w| w.holds(p));
            held.filter(|_| above).map(|w| (tag, w.clone()))
        })
        .collect();
    newer.sort_by(|a, b| b.0.cmp(&a.0));
    newer.dedup_by(|a, b| a.1.tag == b.1.tag);
    let installed = query.installed_tag.filter(|t| !t.is_empty());
    let running_recalled = installed
        .and_then(|tag| query.withheld.iter().find(|w| w.tag == tag && w.is_recall()))
        .map(|recall| {
            let mut moved: Vec<Withheld> = query.withheld.to_vec();
            for w in moved.iter_mut().filter(|w| w.tag == recall.tag) {
                w.why = Withholding::Recalled { reason: String::new(), move_away: true };
            }
            let away = InstallQuery { withheld: &moved, ..query.clone() };
            (recall.clone(), select_install(packages, &away).ok().map(|p| p.tag.clone()))
        });
    HeldBack { newer: newer.into_iter().map(|(_, w)| w).collect(), running_recalled }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Channel, testing::content};

    fn package(tag: &str, kind: &str, min: Option<&str>) -> Package {
        Package::new("r.example", "think/ollama", tag, content(kind, min, None))
    }

    fn viewer() -> Viewer {
        Viewer { channel: Channel::Stable, framework: Version::new(0, 7, 7) }
    }

    fn query<'a>(installed: Option<&'a str>, framework: &'a Version) -> InstallQuery<'a> {
        InstallQuery {
            installed_tag: installed,
            ..InstallQuery::of("box", "think", "ollama", PackageType::Tenant, framework)
        }
    }

    #[test]
    fn waypoints_carry_their_minimum_and_a_type_change_shows_the_newest_of_each_type() {
        let packages = vec![
            package("4.0.0", "service", Some("3.0.0")),
            package("3.5.0", "tenant", Some("2.0.0")),
            package("2.5.0", "tenant", None),
        ];
        let roles = roles(&packages, &viewer());
        assert_eq!(roles[0], vec![CatalogRole::Head, CatalogRole::NewestOfType(PackageType::Service)]);
        assert_eq!(
            roles[1],
            vec![
                CatalogRole::Waypoint { minimum: Some(Version::new(2, 0, 0)) },
                CatalogRole::NewestOfType(PackageType::Tenant)
            ]
        );
        assert_eq!(roles[2], vec![CatalogRole::Waypoint { minimum: None }]);
    }

    #[test]
    fn under_enforce_an_unverified_revision_is_no_head_and_says_why() {
        let signed = |mut p: Package, ok: bool| {
            p.signature = Some(match ok {
                true => {
                    Verdict::Verified { key: "release".into(), reference: "r.example/think/ollama".into() }
                }
                false => Verdict::UntrustedKey,
            });
            p
        };
        let packages = vec![
            signed(package("3.0.0", "tenant", None), false),
            signed(package("2.0.0", "tenant", None), true),
            package("1.5.0", "tenant", None),
        ];
        let enforced = roles_under(&packages, &viewer(), Some(VerifyMode::Enforce));
        let refused = CatalogRole::Unverified { verdict: Verdict::UntrustedKey, enforced: true };
        assert_eq!(enforced[0], vec![refused.clone()]);
        assert_eq!(enforced[1], vec![CatalogRole::Head, CatalogRole::NewestOfType(PackageType::Tenant)]);
        assert_eq!(refused.describe(), "refused: signed by an untrusted key");
        assert!(matches!(&enforced[2][..], [CatalogRole::Unverified { verdict: Verdict::Unsigned, .. }]));
        let warned = roles_under(&packages, &viewer(), Some(VerifyMode::Warn));
        assert_eq!(warned[0][0], CatalogRole::Head, "warn only marks");
        assert!(
            warned[0].contains(&CatalogRole::Unverified { verdict: Verdict::UntrustedKey, enforced: false })
        );
        assert_eq!(roles_under(&packages, &viewer(), None), roles(&packages, &viewer()));
    }

    #[test]
    fn the_path_goes_through_each_waypoint_in_order() {
        let packages = vec![
            package("4.0.0", "tenant", Some("3.0.0")),
            package("3.5.0", "tenant", Some("2.0.0")),
            package("2.5.0", "tenant", None),
        ];
        let framework = Version::new(0, 7, 7);
        let path = upgrade_path(&packages, &query(Some("1.0.0"), &framework));
        let tags: Vec<&str> = path.steps.iter().map(|p| p.tag.as_str()).collect();
        assert_eq!(tags, ["2.5.0", "3.5.0", "4.0.0"]);
        assert!(path.blocked.is_none());
    }

    #[test]
    fn an_instance_at_the_newest_revision_has_an_empty_path_and_no_block() {
        let packages = vec![package("1.0.0", "tenant", None)];
        let framework = Version::new(0, 7, 7);
        let path = upgrade_path(&packages, &query(Some("1.0.0"), &framework));
        assert!(path.steps.is_empty() && path.blocked.is_none(), "{path:?}");
    }

    #[test]
    fn a_type_change_blocks_the_path_with_the_selections_reason() {
        let packages = vec![package("0.1.10", "service", None)];
        let framework = Version::new(0, 7, 7);
        let path = upgrade_path(&packages, &query(Some("0.1.8"), &framework));
        let blocked = path.blocked.unwrap();
        assert_eq!(blocked.excluded_by, crate::selection::Exclusion::Type);
        assert!(blocked.reason.contains("only service: 0.1.10"), "{}", blocked.reason);
    }

    #[test]
    fn item_8_a_verified_digest_under_two_version_tags_has_the_same_digest_role() {
        let content = crate::PackageContent::minimal("apps", "web", PackageType::Tenant);
        let signed = Verdict::Verified { key: "release".into(), reference: "r.example/apps/web".into() };
        let packages: Vec<Package> =
            [("0.9.0", "sha256:old"), ("0.2.0", "sha256:new"), ("0.1.0", "sha256:old")]
                .into_iter()
                .map(|(tag, digest)| {
                    let mut p =
                        Package::new("r.example", "apps/web", tag, content.clone()).with_digest(digest);
                    p.signature = Some(signed.clone());
                    p
                })
                .collect();
        let roles = roles_under(&packages, &viewer(), Some(VerifyMode::Enforce));
        assert!(roles[0].contains(&CatalogRole::SameDigest { tags: vec!["0.1.0".into()] }), "{:?}", roles[0]);
        assert!(roles[1].iter().all(|r| !matches!(r, CatalogRole::SameDigest { .. })), "{:?}", roles[1]);
        assert!(CatalogRole::SameDigest { tags: vec!["0.1.0".into()] }.describe().contains("re-tag"));
    }
}
