//! Which revision an instance installs, and which one deletes it.
//!
//! **Install** is upstream's strict filter (`docs/upstream-vynil.md` §5.4): same category and
//! name, same type as the instance kind, a minimum previous version the
//! installed tag satisfies (true when either does not parse), a framework
//! version that satisfies every `vynil_version`; newest first. When nothing
//! matches, [`NoMatch`] says which criterion excluded the last candidates.
//!
//! **Cleanup** (upstream #12 C) is a decision, in order: the revision recorded
//! at install time if its tag still resolves to the recorded digest; else the
//! strict catalog lookup (which the type-aware view makes succeed after a type
//! change); else no hot error loop but `[E_PACKAGE_GONE]`/`[E_JUKEBOX_GONE]`
//! naming what is missing and the two ways out; and only when the instance
//! carries `vynil.solidite.fr/delete-without-package: "true"`, a best-effort
//! delete of the recorded children without package hooks. An outage (registry
//! or catalog unreachable) is never read as "gone": the answer is to retry.

use std::fmt;

use semver::Version;

use crate::{
    channel::{framework_shortfall, runs_on},
    package::{Package, PackageType},
    tag::Tag,
    upgrade::withheld::Withheld,
};

/// The annotation that asks for a delete without package hooks (an admin's
/// confirmation, recorded by lifecycle where tenants cannot write, is what
/// allows it).
pub const DELETE_WITHOUT_PACKAGE: &str = "vynil.solidite.fr/delete-without-package";

/// What an instance asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallQuery<'a> {
    pub jukebox: &'a str,
    pub category: &'a str,
    pub name: &'a str,
    pub package_type: PackageType,
    /// `status.tag`; `None` or empty for a fresh install.
    pub installed_tag: Option<&'a str>,
    pub framework: &'a Version,
    /// `vynil.solidite.fr/hold-upgrades: "true"`: an installed instance keeps
    /// its installed revision (option changes still apply); a fresh install
    /// is not held.
    pub hold_upgrades: bool,
    /// Tags quarantined for this instance after an upgrade to them failed
    /// ([`crate::upgrade`]): never selected, whatever else holds.
    pub quarantined: &'a [String],
    /// Revisions the JukeBox holds back (recalled, too young,
    /// [`crate::upgrade::withheld`]): never selected, but for the installed
    /// one when its withholding lets an instance keep it.
    pub withheld: &'a [Withheld],
}

impl<'a> InstallQuery<'a> {
    /// A fresh install of `category/name` as `package_type` from `jukebox`:
    /// nothing installed, held or quarantined.
    pub fn of(
        jukebox: &'a str,
        category: &'a str,
        name: &'a str,
        package_type: PackageType,
        framework: &'a Version,
    ) -> Self {
        InstallQuery {
            jukebox,
            category,
            name,
            package_type,
            installed_tag: None,
            framework,
            hold_upgrades: false,
            quarantined: &[],
            withheld: &[],
        }
    }

    /// Whether `tag` is quarantined for this instance (the same tag: `v1.0.0`
    /// and `1.0.0` are two revisions).
    pub fn is_quarantined(&self, tag: &str) -> bool {
        self.quarantined.iter().any(|q| q == tag)
    }
}

/// The criterion that excluded the last candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exclusion {
    Jukebox,
    CategoryName,
    Type,
    MinimumVersion,
    FrameworkVersion,
    /// Upgrades are held and the installed revision is not listed.
    Held,
    /// Every remaining revision is quarantined for this instance.
    Quarantined,
    /// Every remaining revision is recalled or too young.
    Withheld,
}

impl Exclusion {
    const ALL: [Exclusion; 8] = [
        Exclusion::Jukebox,
        Exclusion::CategoryName,
        Exclusion::Type,
        Exclusion::MinimumVersion,
        Exclusion::FrameworkVersion,
        Exclusion::Held,
        Exclusion::Quarantined,
        Exclusion::Withheld,
    ];

    /// The exclusion `text` names ([`Exclusion::as_str`], as the catalog answers it).
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Exclusion::Jukebox => "jukebox",
            Exclusion::CategoryName => "category+name",
            Exclusion::Type => "type",
            Exclusion::MinimumVersion => "minimum version",
            Exclusion::FrameworkVersion => "framework version",
            Exclusion::Held => "held",
            Exclusion::Quarantined => "quarantined",
            Exclusion::Withheld => "withheld",
        }
    }
}

/// Why no revision matched, for a human.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoMatch {
    pub excluded_by: Exclusion,
    pub reason: String,
}

impl fmt::Display for NoMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl NoMatch {
    pub fn jukebox_missing(jukebox: &str) -> Self {
        NoMatch {
            excluded_by: Exclusion::Jukebox,
            reason: format!("JukeBox {jukebox} is missing from the catalog"),
        }
    }
}

/// Upstream's `is_min_version_ok`: true when the installed tag or the minimum
/// does not parse, else installed ≥ minimum.
pub fn reachable_from(installed_tag: Option<&str>, package: &Package) -> bool {
    let Some(installed) = installed_tag.and_then(Tag::parse) else {
        return true;
    };
    match package.content.minimum_previous_version() {
        Some(minimum) => installed.version().cmp_precedence(&minimum) != std::cmp::Ordering::Less,
        None => true,
    }
}

/// The newest revision `query` may install from `packages` (a JukeBox's list).
pub fn select_install<'p>(packages: &'p [Package], query: &InstallQuery) -> Result<&'p Package, NoMatch> {
    let subject = format!("{}/{}", query.category, query.name);
    let mut same_name: Vec<&Package> =
        packages.iter().filter(|p| p.category() == query.category && p.name() == query.name).collect();
    if same_name.is_empty() {
        return Err(NoMatch {
            excluded_by: Exclusion::CategoryName,
            reason: format!("no package {subject} in JukeBox {}", query.jukebox),
        });
    }
    // Newest first; a stable sort keeps list order among equal tags.
    same_name.sort_by(|a, b| Tag::parse(&b.tag).cmp(&Tag::parse(&a.tag)));

    let of_type: Vec<&Package> =
        same_name.iter().copied().filter(|p| p.package_type() == query.package_type).collect();
    if of_type.is_empty() {
        return Err(NoMatch {
            excluded_by: Exclusion::Type,
            reason: format!(
                "no {} revision of {subject} (only {})",
                query.package_type,
                describe_by_type(&same_name)
            ),
        });
    }
    let installed = query.installed_tag.filter(|t| !t.is_empty());
    if let Some(held) = installed.filter(|_| query.hold_upgrades) {
        return of_type.iter().copied().find(|p| p.tag == held).ok_or_else(|| NoMatch {
            excluded_by: Exclusion::Held,
            reason: format!(
                "upgrades are held at {held} (vynil.solidite.fr/hold-upgrades) and JukeBox {} lists no {} revision {held} of {subject}",
                query.jukebox, query.package_type
            ),
        });
    }
    let allowed = not_quarantined(&of_type, query, &subject)?;
    let allowed = not_withheld(&allowed, query, installed, &subject)?;
    let reachable: Vec<&Package> = allowed.iter().copied().filter(|p| reachable_from(installed, p)).collect();
    if reachable.is_empty() {
        let needs: Vec<String> = allowed
            .iter()
            .filter_map(|p| p.content.minimum_previous_version().map(|m| format!("{} needs ≥ {m}", p.tag)))
            .collect();
        return Err(NoMatch {
            excluded_by: Exclusion::MinimumVersion,
            reason: format!(
                "no {} revision of {subject} can upgrade from installed {}: {}",
                query.package_type,
                installed.unwrap_or_default(),
                needs.join(", ")
            ),
        });
    }
    if let Some(found) = reachable.iter().copied().find(|p| runs_on(&p.content, query.framework)) {
        return Ok(found);
    }
    let needs: Vec<String> = reachable
        .iter()
        .filter_map(|p| {
            framework_shortfall(&p.content, query.framework).map(|v| format!("{} needs vynil {v}", p.tag))
        })
        .collect();
    Err(NoMatch {
        excluded_by: Exclusion::FrameworkVersion,
        reason: format!(
            "every {} revision of {subject} needs a newer vynil than {} ({}): upgrade vynil first",
            query.package_type,
            query.framework,
            needs.join(", ")
        ),
    })
}

/// The revisions of `of_type` not quarantined for the instance; none left is no match.
fn not_quarantined<'p>(
    of_type: &[&'p Package],
    query: &InstallQuery,
    subject: &str,
) -> Result<Vec<&'p Package>, NoMatch> {
    let allowed: Vec<&Package> = of_type.iter().copied().filter(|p| !query.is_quarantined(&p.tag)).collect();
    if allowed.is_empty() {
        return Err(NoMatch {
            excluded_by: Exclusion::Quarantined,
            reason: format!(
                "every {} revision of {subject} is quarantined for this instance ({}) after an upgrade to it failed: publish a newer revision, or have an operator clear the quarantine (`vynilctl instance clear-quarantine`)",
                query.package_type,
                query.quarantined.join(", ")
            ),
        });
    }
    Ok(allowed)
}

/// The revisions of `allowed` the JukeBox does not hold back from the
/// instance (its installed revision stays when its withholding lets it);
/// none left is no match, naming each.
fn not_withheld<'p>(
    allowed: &[&'p Package],
    query: &InstallQuery,
    installed: Option<&str>,
    subject: &str,
) -> Result<Vec<&'p Package>, NoMatch> {
    let held = |p: &Package| {
        query
            .withheld
            .iter()
            .find(|w| w.holds(p) && !(installed == Some(w.tag.as_str()) && w.keeps_installed()))
    };
    let kept: Vec<&Package> = allowed.iter().copied().filter(|p| held(p).is_none()).collect();
    if kept.is_empty() {
        let why: Vec<String> = allowed.iter().filter_map(|p| held(p)).map(Withheld::describe).collect();
        return Err(NoMatch {
            excluded_by: Exclusion::Withheld,
            reason: format!(
                "no {} revision of {subject} is selectable yet: {}",
                query.package_type,
                why.join("; ")
            ),
        });
    }
    Ok(kept)
}

/// "service: 0.1.10, 0.1.9; system: 1.0.0"
fn describe_by_type(packages: &[&Package]) -> String {
    PackageType::ALL
        .iter()
        .filter_map(|t| {
            let tags: Vec<&str> =
                packages.iter().filter(|p| p.package_type() == *t).map(|p| p.tag.as_str()).collect();
            (!tags.is_empty()).then(|| format!("{t}: {}", tags.join(", ")))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// What lifecycle recorded at install time (`status.package`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRevision {
    pub registry: String,
    pub image: String,
    pub tag: String,
    pub digest: String,
    pub package_type: PackageType,
}

/// Whether the recorded tag still points at the recorded digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordedCheck {
    Resolves,
    /// The tag is gone or points elsewhere.
    Gone,
    /// The registry could not be asked (outage): not the same as gone.
    Unknown(String),
}

impl RecordedCheck {
    /// What a registry HEAD of the recorded revision says — of its digest
    /// (what every agent Job pulls), of its tag when none is recorded:
    /// `found` is the digest it answered (`None`: gone). It must be the
    /// recorded digest; with none recorded, the tag existing is enough.
    pub fn from_head(recorded_digest: Option<&str>, found: Option<&str>) -> Self {
        match (recorded_digest, found) {
            (_, None) => RecordedCheck::Gone,
            (Some(recorded), Some(found)) if recorded != found => RecordedCheck::Gone,
            _ => RecordedCheck::Resolves,
        }
    }
}

/// What the catalog knows of the instance's JukeBox.
#[derive(Debug, Clone, Copy)]
pub enum CatalogState<'a> {
    Loaded(&'a [Package]),
    JukeboxMissing,
    /// The catalog could not answer: not the same as missing.
    Unavailable,
}

#[derive(Debug, Clone)]
pub struct CleanupQuery<'a> {
    pub install: InstallQuery<'a>,
    pub recorded: Option<(&'a RecordedRevision, RecordedCheck)>,
    /// Where the JukeBox's revisions may come from: a recorded revision (in
    /// the instance's status, which a tenant may write) runs its delete
    /// hooks as the cluster-admin agent only when it comes from there.
    pub origins: &'a Origins,
    pub catalog: CatalogState<'a>,
    /// `have_child()`: status records something to delete.
    pub has_children: bool,
    /// The repositories lifecycle credited an install of this instance
    /// from, in its own record (entries as [`crate::repository::entry`]
    /// writes them): a package the catalog lists elsewhere now is still the
    /// instance's own there.
    pub listed_before: &'a [String],
    /// The instance carries [`DELETE_WITHOUT_PACKAGE`] = `"true"` and an
    /// admin's confirmation of its recorded children still holds.
    pub delete_without_package: bool,
}

/// Where a JukeBox's revisions may come from, read off its `spec.source`.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origins {
    /// `list`: exactly these `registry/repository` entries.
    Repositories(Vec<String>),
    /// `harbor`, `gitlab`: any repository under `<registry>/<project>/`.
    Project { registry: String, project: String },
    /// `script`, `http`, `s3`, `layout`: the repositories its scans list
    /// (those in the JukeBox's packages, whatever their tags: the recorded
    /// revision itself need not be in today's view).
    #[default]
    Scanned,
}

fn same_registry(a: &str, b: &str) -> bool {
    a.trim_end_matches('/').eq_ignore_ascii_case(b.trim_end_matches('/'))
}

impl Origins {
    /// Whether `recorded` comes from this JukeBox (`scanned`: its packages).
    pub fn admit(&self, recorded: &RecordedRevision, scanned: &[Package]) -> bool {
        let image = recorded.image.trim_matches('/');
        match self {
            Origins::Repositories(entries) => entries.iter().any(|entry| {
                entry.trim_end_matches('/').split_once('/').is_some_and(|(registry, repository)| {
                    same_registry(registry, &recorded.registry) && repository == image
                })
            }),
            Origins::Project { registry, project } => {
                let project = project.trim_matches('/');
                same_registry(registry, &recorded.registry)
                    && image.strip_prefix(project).is_some_and(|rest| rest.starts_with('/'))
            }
            Origins::Scanned => {
                scanned.iter().any(|p| same_registry(&p.registry, &recorded.registry) && p.image == image)
            }
        }
    }
}

/// Whether `recorded` lies in a repository where the catalog lists the
/// instance's own package (`listed`: `(registry, repository)`; any type: a
/// revision installed before a type change is in the same repository).
/// `status.package` is tenant-writable: no other registry is ever asked
/// about it, and no other image run for it.
pub fn is_own_repository(recorded: &RecordedRevision, listed: &[(&str, &str)]) -> bool {
    listed.iter().any(|listed| crate::repository::same(*listed, (&recorded.registry, &recorded.image)))
}

/// Whether `recorded` is a revision of the instance's own package: of its
/// type, in a repository where `scanned` lists its category/name, or where
/// lifecycle credited an install of it before (`listed_before`).
fn is_own_package(
    recorded: &RecordedRevision,
    install: &InstallQuery,
    scanned: &[Package],
    listed_before: &[String],
) -> bool {
    let listed: Vec<(&str, &str)> = scanned
        .iter()
        .filter(|p| p.category() == install.category && p.name() == install.name)
        .map(|p| (p.registry.as_str(), p.image.as_str()))
        .collect();
    recorded.package_type == install.package_type
        && (is_own_repository(recorded, &listed)
            || crate::repository::listed(listed_before, &recorded.registry, &recorded.image))
}

/// Which revision's hooks delete the instance, or why none can.
#[derive(Debug, Clone, PartialEq)]
pub enum CleanupDecision {
    /// Run the delete Job from the recorded revision.
    UseRecorded(RecordedRevision),
    /// Run the delete Job from this catalog revision.
    UseCatalog(Box<Package>),
    /// No package and nothing recorded to delete: remove the finalizer.
    NothingToDelete,
    /// No package: a condition, a Warning event, a requeue with backoff.
    Gone(PackageGone),
    /// Authorised: delete the recorded children without package hooks.
    DeleteWithoutPackage { warning: String },
    /// Something could not be asked; try again later.
    Retry { why: String },
}

/// `[E_PACKAGE_GONE]` / `[E_JUKEBOX_GONE]` and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageGone {
    pub code: &'static str,
    pub missing: String,
    pub why: String,
    pub ways_out: Vec<String>,
}

impl PackageGone {
    /// The condition message: the code in brackets first, upstream's style.
    pub fn condition_message(&self) -> String {
        format!("[{}] {}: {}. Ways out: {}", self.code, self.missing, self.why, self.ways_out.join("; or "))
    }
}

/// The recorded revision is not one of the instance's own package from its
/// JukeBox: its image is never run.
fn not_from_jukebox(install: &InstallQuery, recorded: &RecordedRevision) -> CleanupDecision {
    let subject = format!("{}/{}", install.category, install.name);
    CleanupDecision::Gone(PackageGone {
        code: "E_REVISION_NOT_FROM_JUKEBOX",
        missing: format!(
            "the revision recorded in status ({}/{}:{}, {}) is not a {} revision of {subject} from a source of JukeBox {}",
            recorded.registry,
            recorded.image,
            recorded.tag,
            recorded.package_type,
            install.package_type,
            install.jukebox
        ),
        why: "its delete hooks would run that image as the agent's ServiceAccount, so it is not run".into(),
        ways_out: vec![
            format!("correct status.package to the revision of {subject} that was installed, or add its repository to the JukeBox's source"),
            "an administrator may delete the recorded children without package hooks (AllowDeleteWithoutPackage)".into(),
        ],
    })
}

pub fn select_cleanup(query: &CleanupQuery) -> CleanupDecision {
    let install = &query.install;
    let subject = format!("{}/{}", install.category, install.name);
    let mut outage = None;
    if let Some((recorded, check)) = &query.recorded {
        match check {
            RecordedCheck::Resolves => match query.catalog {
                CatalogState::Loaded(packages)
                    if query.origins.admit(recorded, packages)
                        && is_own_package(recorded, install, packages, query.listed_before) =>
                {
                    return CleanupDecision::UseRecorded((*recorded).clone());
                }
                CatalogState::Loaded(_) => return not_from_jukebox(install, recorded),
                CatalogState::Unavailable => {
                    return CleanupDecision::Retry {
                        why: "the catalog is unavailable: the recorded revision's origin cannot be checked"
                            .into(),
                    };
                }
                // Unprovable without its JukeBox: the catalog's answer below (E_JUKEBOX_GONE).
                CatalogState::JukeboxMissing => {}
            },
            RecordedCheck::Gone => {}
            RecordedCheck::Unknown(why) => {
                outage = Some(format!("cannot check recorded {}:{}: {why}", recorded.image, recorded.tag))
            }
        }
    }
    let (code, why) = match query.catalog {
        CatalogState::Unavailable => {
            return CleanupDecision::Retry {
                why: outage.unwrap_or_else(|| "the catalog is unavailable".into()),
            };
        }
        // A recalled, too young or quarantined revision still deletes what it installed.
        CatalogState::Loaded(packages) => match select_install(
            packages,
            &InstallQuery { withheld: &[], quarantined: &[], ..install.clone() },
        ) {
            Ok(package) => return CleanupDecision::UseCatalog(Box::new(package.clone())),
            Err(no_match) => ("E_PACKAGE_GONE", no_match.reason),
        },
        CatalogState::JukeboxMissing => ("E_JUKEBOX_GONE", NoMatch::jukebox_missing(install.jukebox).reason),
    };
    if let Some(why) = outage {
        return CleanupDecision::Retry { why };
    }
    if !query.has_children {
        return CleanupDecision::NothingToDelete;
    }
    if query.delete_without_package {
        return CleanupDecision::DeleteWithoutPackage {
            warning: format!(
                "deleting the recorded children of this {} instance of {subject} without its package: no package hooks ran, so anything the package created indirectly (PVCs of operators, external state) may remain",
                install.package_type
            ),
        };
    }
    CleanupDecision::Gone(PackageGone {
        code,
        missing: format!(
            "no {} revision of {subject} in JukeBox {} can delete this instance",
            install.package_type, install.jukebox
        ),
        why,
        ways_out: vec![
            format!(
                "publish or restore a {} revision of {subject} (e.g. the installed {}) and rescan the JukeBox",
                install.package_type,
                install.installed_tag.unwrap_or("tag")
            ),
            format!(
                "have an admin review the recorded children (Explain) and confirm deleting them without package hooks (AllowDeleteWithoutPackage, `vynilctl instance allow-delete-without-package`, which sets {DELETE_WITHOUT_PACKAGE}); the annotation alone deletes nothing"
            ),
        ],
    })
}
