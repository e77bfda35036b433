//! The gRPC face of the catalog; every answer comes from the rules crate over
//! the in-process snapshot. Errors become `Status` codes here only.

use std::{pin::Pin, sync::Arc};
use vynil_proto::convert::{
    package_to_proto, package_type, proto_type, signature_to_proto, verify_mode_to_proto,
};
use vynil_runtime::{Classify, Failure, Shutdown, ToStatus};

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};
use vynil_proto::catalog::v1::{
    self as pb, CatalogChange, Channel as ProtoChannel, GetCatalogRequest, GetCatalogResponse,
    GetUpgradePathRequest, JukeboxSummary, ListJukeboxesRequest, ListJukeboxesResponse, NoMatch,
    ResolveCleanupRequest, ResolveCleanupResponse, ResolveInstallRequest, ResolveInstallResponse,
    WatchCatalogRequest, catalog_server::Catalog as CatalogApi, resolve_cleanup_response::Decision,
    resolve_install_response::Outcome,
};
use vynil_rules::{
    Channel, InstallQuery, PackageType,
    catalog::CatalogRole,
    selection::{CatalogState, CleanupDecision, RecordedCheck, RecordedRevision},
    upgrade::withheld::{Withheld, Withholding},
};

use crate::{CatalogError, catalog::Catalog};

impl Classify for CatalogError {
    fn failure(&self) -> Failure {
        match self {
            CatalogError::Unavailable(_) => Failure::Transient,
            CatalogError::InvalidArgument(_) => Failure::BadInput,
            CatalogError::Serve(e) => e.failure(),
        }
    }
}

fn no_match_to_proto(no_match: vynil_rules::NoMatch) -> NoMatch {
    NoMatch { excluded_by: no_match.excluded_by.as_str().into(), reason: no_match.reason }
}

fn role_to_proto(role: &CatalogRole) -> pb::RevisionRole {
    let (kind, minimum, package_type) = match role {
        CatalogRole::Head => (pb::RoleKind::Head, String::new(), None),
        CatalogRole::Waypoint { minimum } => {
            (pb::RoleKind::Waypoint, minimum.as_ref().map(ToString::to_string).unwrap_or_default(), None)
        }
        CatalogRole::NewestOfType(t) => (pb::RoleKind::NewestOfType, String::new(), Some(*t)),
        CatalogRole::Recalled { .. } => (pb::RoleKind::Recalled, String::new(), None),
        CatalogRole::Unverified { .. } => (pb::RoleKind::Unverified, String::new(), None),
        CatalogRole::SameDigest { .. } => (pb::RoleKind::SameDigest, String::new(), None),
    };
    let (reason, move_away, enforced) = match role {
        CatalogRole::Recalled { reason, move_away } => (reason.clone(), *move_away, false),
        CatalogRole::Unverified { verdict, enforced } => (verdict.describe(), false, *enforced),
        CatalogRole::SameDigest { tags } => (tags.join(", "), false, false),
        _ => (String::new(), false, false),
    };
    pb::RevisionRole {
        kind: kind as i32,
        minimum,
        r#type: package_type.map(proto_type).unwrap_or_default(),
        description: role.describe(),
        reason,
        move_away,
        enforced,
    }
}

fn withheld_to_proto(withheld: &Withheld) -> pb::WithheldRevision {
    let description = withheld.describe();
    let (why, reason, move_away, selectable_at) = match &withheld.why {
        Withholding::Recalled { reason, move_away } => {
            (pb::Withholding::Recalled, reason.clone(), *move_away, String::new())
        }
        Withholding::TooYoung { selectable_at, .. } => {
            // None: never (its age cannot be counted); the description says so.
            let at = selectable_at.map(|t| t.to_string()).unwrap_or_default();
            (pb::Withholding::TooYoung, String::new(), false, at)
        }
        Withholding::Unverified { verdict } => {
            (pb::Withholding::Unverified, verdict.describe(), false, String::new())
        }
    };
    pb::WithheldRevision {
        tag: withheld.tag.clone(),
        why: why as i32,
        reason,
        move_away,
        selectable_at,
        description,
    }
}

impl From<CatalogError> for Status {
    fn from(error: CatalogError) -> Self {
        error.to_status()
    }
}

#[derive(Debug, Clone)]
pub struct CatalogService {
    catalog: Arc<Catalog>,
    /// Ends `WatchCatalog` streams, so the server's drain can finish.
    shutdown: Shutdown,
}

impl CatalogService {
    pub fn new(catalog: Arc<Catalog>, shutdown: Shutdown) -> Self {
        Self { catalog, shutdown }
    }
}

type ChangeStream = Pin<Box<dyn Stream<Item = Result<CatalogChange, Status>> + Send>>;

#[tonic::async_trait]
impl CatalogApi for CatalogService {
    async fn list_jukeboxes(
        &self,
        request: Request<ListJukeboxesRequest>,
    ) -> Result<Response<ListJukeboxesResponse>, Status> {
        let request = request.into_inner();
        let (entries, next_page_token) =
            vynil_runtime::pages::page(self.catalog.entries()?, request.page_size, &request.page_token)?;
        let jukeboxes = entries
            .into_iter()
            .map(|e| JukeboxSummary {
                name: e.jukebox.clone(),
                package_count: e.packages.len() as u32,
                pull_secret: e.pull_secret.clone().unwrap_or_default(),
                last_change_time: e.last_change_time.clone().unwrap_or_default(),
                conditions: e
                    .conditions
                    .iter()
                    .map(|c| pb::Condition {
                        r#type: format!("{:?}", c.condition_type),
                        status: format!("{:?}", c.status),
                        message: c.message.clone(),
                        last_transition_time: c.last_transition_time.clone().unwrap_or_default(),
                        generation: c.generation,
                    })
                    .collect(),
                content_hash: e.hash.clone(),
            })
            .collect();
        let skipped = self
            .catalog
            .skipped()
            .await
            .into_iter()
            .map(|s| pb::SkippedSource { source: s.source, problem: s.problem })
            .collect();
        Ok(Response::new(ListJukeboxesResponse { jukeboxes, skipped, next_page_token }))
    }

    async fn get_catalog(
        &self,
        request: Request<GetCatalogRequest>,
    ) -> Result<Response<GetCatalogResponse>, Status> {
        let request = request.into_inner();
        let entry = self
            .catalog
            .entry(&request.jukebox)?
            .ok_or_else(|| Status::not_found(format!("no JukeBox {:?} in the catalog", request.jukebox)))?;
        let wanted_type = (request.r#type != 0).then(|| package_type(request.r#type)).transpose()?;
        let channel = match ProtoChannel::try_from(request.channel) {
            Ok(ProtoChannel::Beta) => Some(Channel::Beta),
            Ok(ProtoChannel::Alpha) => Some(Channel::Alpha),
            Ok(ProtoChannel::Stable) => Some(Channel::Stable),
            _ => None,
        };
        let view = vynil_rules::catalog_view(&entry.packages, entry.channel, channel).map_err(|e| {
            Status::new(vynil_runtime::code(e.failure()), format!("JukeBox {:?}: {e}", request.jukebox))
        })?;
        if !request.if_none_match.is_empty() && request.if_none_match == entry.hash {
            return Ok(Response::new(GetCatalogResponse {
                jukebox: entry.jukebox.clone(),
                content_hash: entry.hash.clone(),
                packages: Vec::new(),
                not_modified: true,
                next_page_token: String::new(),
                pull_secret: entry.pull_secret.clone().unwrap_or_default(),
            }));
        }
        // Roles are computed over whole repositories, before the filters, for
        // the entry's own channel: the only one `catalog_view` answers.
        let matching: Vec<_> = view
            .iter()
            .zip(entry.roles())
            .filter(|(p, _)| request.category.is_empty() || p.category() == request.category)
            .filter(|(p, _)| request.name.is_empty() || p.name() == request.name)
            .filter(|(p, _)| wanted_type.is_none_or(|t| p.package_type() == t))
            .collect();
        // Only the page is converted (a catalog holds hundreds of packages).
        let (page, next_page_token) =
            vynil_runtime::pages::page(matching, request.page_size, &request.page_token)?;
        let packages = page
            .into_iter()
            .map(|(p, roles)| pb::Package {
                roles: roles.iter().map(role_to_proto).collect(),
                ..package_to_proto(p)
            })
            .collect();
        Ok(Response::new(GetCatalogResponse {
            jukebox: entry.jukebox.clone(),
            content_hash: entry.hash.clone(),
            packages,
            not_modified: false,
            next_page_token,
            pull_secret: entry.pull_secret.clone().unwrap_or_default(),
        }))
    }

    async fn resolve_install(
        &self,
        request: Request<ResolveInstallRequest>,
    ) -> Result<Response<ResolveInstallResponse>, Status> {
        let request = request.into_inner();
        let package_type = package_type(request.r#type)?;
        let entry = self.catalog.entry(&request.jukebox)?;
        let pull_secret = entry.as_ref().and_then(|e| e.pull_secret.clone()).unwrap_or_default();
        let upgrade_policy = entry.as_ref().and_then(|e| e.upgrade_policy.as_ref()).map(policy_to_proto);
        let Some(entry) = entry else {
            let outcome = Outcome::NoMatch(NoMatch {
                excluded_by: "jukebox".into(),
                reason: vynil_rules::NoMatch::jukebox_missing(&request.jukebox).reason,
            });
            return Ok(Response::new(ResolveInstallResponse {
                outcome: Some(outcome),
                pull_secret,
                upgrade_policy,
                ..ResolveInstallResponse::default()
            }));
        };
        let withheld = match withheld_of(&entry, &request.minimum_age) {
            Ok(withheld) => withheld,
            Err(no_match) => {
                return Ok(Response::new(ResolveInstallResponse {
                    outcome: Some(Outcome::NoMatch(no_match)),
                    pull_secret,
                    upgrade_policy,
                    ..ResolveInstallResponse::default()
                }));
            }
        };
        let query = InstallQuery {
            installed_tag: Some(request.installed_tag.as_str()).filter(|t| !t.is_empty()),
            hold_upgrades: request.hold_upgrades,
            quarantined: &request.quarantined_tags,
            withheld: &withheld,
            ..InstallQuery::of(
                &request.jukebox,
                &request.category,
                &request.name,
                package_type,
                &self.catalog.framework,
            )
        };
        let recalled = withheld.iter().filter(|w| w.is_recall()).map(withheld_to_proto).collect();
        let mut response = ResolveInstallResponse {
            pull_secret,
            upgrade_policy,
            recalled,
            verify_mode: verify_mode_to_proto(entry.verify_mode()) as i32,
            ..Default::default()
        };
        match vynil_rules::select_install(&entry.packages, &query) {
            Ok(package) => {
                let held = vynil_rules::catalog::held_back(&entry.packages, &query, package);
                response.withheld = held.newer.iter().map(withheld_to_proto).collect();
                if let Some((recall, away)) = held.running_recalled {
                    response.running_recalled = Some(withheld_to_proto(&recall));
                    response.move_away_to = away.unwrap_or_default();
                }
                response.outcome = Some(Outcome::Package(package_to_proto(package)));
            }
            Err(no_match) => response.outcome = Some(Outcome::NoMatch(no_match_to_proto(no_match))),
        }
        Ok(Response::new(response))
    }

    async fn resolve_cleanup(
        &self,
        request: Request<ResolveCleanupRequest>,
    ) -> Result<Response<ResolveCleanupResponse>, Status> {
        let request = request.into_inner();
        let package_type = package_type(request.r#type)?;
        let entry = self.catalog.entry(&request.jukebox);
        let catalog = match &entry {
            Ok(Some(entry)) => CatalogState::Loaded(&entry.packages),
            Ok(None) => CatalogState::JukeboxMissing,
            Err(_) => CatalogState::Unavailable,
        };
        let (recorded, check) = recorded_and_check(&request, package_type)?;
        let (scanned, framework) = (vynil_rules::selection::Origins::Scanned, &self.catalog.framework);
        let origins = match &entry {
            Ok(Some(entry)) => &entry.origins,
            _ => &scanned,
        };
        let query = vynil_rules::selection::CleanupQuery {
            origins,
            listed_before: &request.listed_before,
            install: InstallQuery {
                installed_tag: Some(request.installed_tag.as_str()).filter(|t| !t.is_empty()),
                ..InstallQuery::of(
                    &request.jukebox,
                    &request.category,
                    &request.name,
                    package_type,
                    framework,
                )
            },
            recorded: recorded.as_ref().map(|r| (r, check.clone())),
            catalog,
            has_children: request.children > 0,
            delete_without_package: request.delete_without_package_allowed,
        };
        let decision = match vynil_rules::select_cleanup(&query) {
            CleanupDecision::UseRecorded(r) => Decision::UsePackage(pb::Package {
                signature: entry.as_ref().ok().and_then(|e| listed_signature(e.as_deref()?, &r)),
                registry: r.registry,
                image: r.image,
                tag: r.tag,
                digest: r.digest,
                ..pb::Package::default()
            }),
            CleanupDecision::UseCatalog(package) => Decision::UsePackage(package_to_proto(&package)),
            CleanupDecision::Gone(gone) => Decision::Gone(pb::PackageGone {
                message: gone.condition_message(),
                code: gone.code.to_string(),
                missing: gone.missing,
                why: gone.why,
                ways_out: gone.ways_out,
            }),
            CleanupDecision::DeleteWithoutPackage { warning } => {
                Decision::DeleteWithoutPackage(pb::DeleteWithoutPackage { warning })
            }
            CleanupDecision::NothingToDelete => Decision::NothingToDelete(pb::NothingToDelete {}),
            CleanupDecision::Retry { why } => return Err(Status::unavailable(why)),
        };
        let (pull_secret, verify_mode) = match &entry {
            Ok(Some(entry)) => (entry.pull_secret.clone().unwrap_or_default(), entry.verify_mode()),
            _ => (String::new(), None),
        };
        let verify_mode = verify_mode_to_proto(verify_mode) as i32;
        Ok(Response::new(ResolveCleanupResponse { decision: Some(decision), pull_secret, verify_mode }))
    }

    async fn watch_catalog(
        &self,
        request: Request<WatchCatalogRequest>,
    ) -> Result<Response<ChangeStream>, Status> {
        let wanted = request.into_inner().jukeboxes;
        let changes = tokio_stream::wrappers::BroadcastStream::new(self.catalog.subscribe());
        let stream = changes.take_until(self.shutdown.signaled()).filter_map(move |change| {
            let keep = change.ok().filter(|c| wanted.is_empty() || wanted.contains(&c.jukebox));
            async move {
                keep.map(|c| {
                    Ok(CatalogChange {
                        removed: c.hash.is_none(),
                        content_hash: c.hash.unwrap_or_default(),
                        jukebox: c.jukebox,
                    })
                })
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_upgrade_path(
        &self,
        request: Request<GetUpgradePathRequest>,
    ) -> Result<Response<pb::UpgradePath>, Status> {
        let request = request.into_inner();
        let package_type = package_type(request.r#type)?;
        let entry = self
            .catalog
            .entry(&request.jukebox)?
            .ok_or_else(|| Status::not_found(format!("no JukeBox {:?} in the catalog", request.jukebox)))?;
        // The path lifecycle would take: never through a recalled or too young revision.
        let withheld = withheld_of(&entry, "").map_err(|e| Status::failed_precondition(e.reason))?;
        let query = InstallQuery {
            installed_tag: Some(request.from_tag.as_str()).filter(|t| !t.is_empty()),
            withheld: &withheld,
            ..InstallQuery::of(
                &request.jukebox,
                &request.category,
                &request.name,
                package_type,
                &self.catalog.framework,
            )
        };
        let path = vynil_rules::catalog::upgrade_path(&entry.packages, &query);
        Ok(Response::new(pb::UpgradePath {
            to_tag: path.last().map(|p| p.tag.clone()).unwrap_or_default(),
            steps: path.steps.into_iter().map(package_to_proto).collect(),
            blocked: path.blocked.map(no_match_to_proto),
        }))
    }
}

/// The signature verdict `entry` lists for the recorded revision `r` (same
/// repository, tag and digest), when it lists it.
fn listed_signature(
    entry: &vynil_store::package_cache::Entry,
    r: &vynil_rules::selection::RecordedRevision,
) -> Option<pb::Signature> {
    let same = |p: &&vynil_rules::Package| {
        (p.registry.as_str(), p.image.as_str(), p.tag.as_str()) == (&r.registry, &r.image, &r.tag)
            && p.digest.as_deref() == Some(r.digest.as_str())
    };
    entry.packages.iter().find(same)?.signature.as_ref().map(signature_to_proto)
}

/// What `entry` holds back from an instance whose own minimum age is
/// `own_age` (as written; empty: none), now. A minimum age that does not
/// parse holds everything back, saying what to fix.
fn withheld_of(entry: &vynil_store::package_cache::Entry, own_age: &str) -> Result<Vec<Withheld>, NoMatch> {
    use vynil_rules::upgrade::withheld::{Holds, parse_minimum_age, stricter_age, withheld};
    let jukebox_age = entry.upgrade_policy.as_ref().and_then(|p| p.minimum_age.as_deref());
    let age = stricter_age(jukebox_age, Some(own_age).filter(|a| !a.is_empty()))
        .map(parse_minimum_age)
        .transpose()
        .map_err(|e| NoMatch { excluded_by: "upgrade policy".into(), reason: e.to_string() })?;
    let recalls = vynil_crds::RecalledRevision::rules(&entry.recalls);
    let holds = Holds { recalls: &recalls, minimum_age: age, verify: entry.verify_mode() };
    Ok(withheld(&entry.packages, holds, jiff::Timestamp::now()))
}

/// A JukeBox's upgrade policy as written (lifecycle checks it).
fn policy_to_proto(policy: &vynil_crds::UpgradePolicy) -> pb::UpgradePolicy {
    pb::UpgradePolicy {
        windows: policy
            .windows
            .iter()
            .map(|w| pb::MaintenanceWindow {
                schedule: w.schedule.clone(),
                zone: w.zone.clone(),
                duration: w.duration.clone(),
            })
            .collect(),
        freezes: policy
            .freezes
            .iter()
            .map(|f| pb::UpgradeFreeze {
                from: f.from.clone(),
                until: f.until.clone(),
                reason: f.reason.clone(),
            })
            .collect(),
        manual_approval: policy.manual(),
        minimum_age: policy.minimum_age.clone().unwrap_or_default(),
        waves: policy
            .waves
            .iter()
            .map(|w| pb::UpgradeWave {
                name: w.name.clone(),
                selector: w.selector.clone().into_iter().collect(),
                soak: w.soak.clone(),
                namespaces: w.namespaces.clone().into_iter().collect(),
                patience: w.patience.clone().unwrap_or_default(),
            })
            .collect(),
    }
}

/// The recorded revision of a cleanup request and what the caller's
/// registry check said of it (one is required with the other).
fn recorded_and_check(
    request: &ResolveCleanupRequest,
    package_type: PackageType,
) -> Result<(Option<RecordedRevision>, RecordedCheck), Status> {
    let recorded = request.recorded.as_ref().map(|r| recorded_revision(r, package_type));
    let check = match pb::RecordedCheck::try_from(request.recorded_check) {
        Ok(pb::RecordedCheck::Resolves) => RecordedCheck::Resolves,
        Ok(pb::RecordedCheck::Gone) => RecordedCheck::Gone,
        Ok(pb::RecordedCheck::Unknown) => RecordedCheck::Unknown(request.recorded_check_problem.clone()),
        Ok(pb::RecordedCheck::Unspecified) | Err(_) if recorded.is_some() => {
            return Err(Status::invalid_argument(
                "a recorded revision needs its recorded_check (RESOLVES, GONE or UNKNOWN): \
                 check the recorded revision's digest in the registry first",
            ));
        }
        _ => RecordedCheck::Unknown("no recorded revision".into()),
    };
    Ok((recorded, check))
}

/// What lifecycle recorded, its type `default` when unspecified.
fn recorded_revision(r: &pb::RecordedRevision, default: PackageType) -> RecordedRevision {
    RecordedRevision {
        registry: r.registry.clone(),
        image: r.image.clone(),
        tag: r.tag.clone(),
        digest: r.digest.clone(),
        package_type: package_type(r.r#type).unwrap_or(default),
    }
}
