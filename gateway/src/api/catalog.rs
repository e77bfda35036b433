//! JukeBoxes, their catalogs (with each revision's roles) and upgrade paths.

use axum::{
    Json,
    extract::{Path, Query, State, rejection::QueryRejection},
    response::{IntoResponse, Response},
};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use vynil_proto::catalog::v1 as pb;

use super::{App, Ctx, Errors, PageQuery, check_subdomain, failed, non_empty, query};
use crate::{downstream::Service, error::ApiError};

/// A package type, as in `fr.solidite.vynil.metadata`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PackageType {
    Tenant,
    Service,
    System,
}

impl PackageType {
    pub fn from_proto(value: i32) -> Option<Self> {
        match pb::PackageType::try_from(value) {
            Ok(pb::PackageType::Tenant) => Some(Self::Tenant),
            Ok(pb::PackageType::Service) => Some(Self::Service),
            Ok(pb::PackageType::System) => Some(Self::System),
            _ => None,
        }
    }

    pub fn to_proto(self) -> i32 {
        (match self {
            Self::Tenant => pb::PackageType::Tenant,
            Self::Service => pb::PackageType::Service,
            Self::System => pb::PackageType::System,
        }) as i32
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Condition {
    #[serde(rename = "type")]
    pub condition_type: String,
    pub status: String,
    pub message: String,
    pub last_transition_time: Option<String>,
}

impl From<pb::Condition> for Condition {
    fn from(c: pb::Condition) -> Self {
        Self {
            condition_type: c.r#type,
            status: c.status,
            message: c.message,
            last_transition_time: non_empty(c.last_transition_time),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Jukebox {
    pub name: String,
    pub package_count: u32,
    pub pull_secret: Option<String>,
    /// When the scanner last changed its packages or its Updated condition.
    pub last_change_time: Option<String>,
    pub conditions: Vec<Condition>,
    pub content_hash: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SkippedSource {
    pub source: String,
    pub problem: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JukeboxList {
    pub items: Vec<Jukebox>,
    /// JukeBox sources that could not be read, with what is wrong.
    pub skipped: Vec<SkippedSource>,
    pub next_page_token: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RoleKind {
    Head,
    Waypoint,
    NewestOfType,
    /// An operator recalled it: never installed or upgraded to (`reason`).
    Recalled,
    /// It fails the JukeBox's signature policy (`reason`: the verdict):
    /// never installed or upgraded to when `enforced`, marked otherwise.
    Unverified,
    /// Its verified digest is also other version tags' (`reason`: those
    /// tags): a re-tag, perhaps of an old signed revision as a new version.
    SameDigest,
}

/// A revision's signature verdict under its JukeBox's `spec.verify`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SignatureVerdict {
    Verified,
    Unsigned,
    UntrustedKey,
    DigestMismatch,
    Malformed,
    /// Signed for another repository, and the JukeBox requires the signed reference.
    ReferenceMismatch,
    /// Verified, but without an attestation the JukeBox requires (`predicate_type`).
    Unattested,
}

/// What the scanner found of a revision's cosign signature.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Signature {
    pub verdict: SignatureVerdict,
    /// `verified`: the trusted key that signed it, and the signed payload's
    /// `docker-reference` (`reference_mismatch`: the reference only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// `unattested`: the attestation required (its predicate type, and builder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicate_type: Option<String>,
    /// In words: "verified by release", "signed by an untrusted key".
    pub description: String,
}

impl Signature {
    fn from_proto(s: pb::Signature) -> Option<Self> {
        let verdict = match pb::SignatureVerdict::try_from(s.verdict).ok()? {
            pb::SignatureVerdict::Verified => SignatureVerdict::Verified,
            pb::SignatureVerdict::Unsigned => SignatureVerdict::Unsigned,
            pb::SignatureVerdict::UntrustedKey => SignatureVerdict::UntrustedKey,
            pb::SignatureVerdict::DigestMismatch => SignatureVerdict::DigestMismatch,
            pb::SignatureVerdict::Malformed => SignatureVerdict::Malformed,
            pb::SignatureVerdict::ReferenceMismatch => SignatureVerdict::ReferenceMismatch,
            pb::SignatureVerdict::Unattested => SignatureVerdict::Unattested,
            pb::SignatureVerdict::Unspecified => return None,
        };
        Some(Self {
            verdict,
            key: non_empty(s.key),
            reference: non_empty(s.reference),
            predicate_type: non_empty(s.predicate_type),
            description: s.description,
        })
    }
}

/// Why a revision is in the catalog.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RevisionRole {
    pub kind: RoleKind,
    /// A waypoint's minimum previous version (`null`: reachable from any).
    pub minimum: Option<String>,
    /// For `newest_of_type`.
    #[serde(rename = "type")]
    pub package_type: Option<PackageType>,
    pub description: String,
    /// For `recalled`: why, and whether its instances are moved away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default)]
    pub move_away: bool,
    /// For `unverified`: the policy is enforced (the revision is not offered).
    #[serde(default)]
    pub enforced: bool,
}

/// One package revision.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Package {
    pub registry: String,
    pub image: String,
    pub tag: String,
    pub digest: Option<String>,
    pub category: String,
    pub name: String,
    #[serde(rename = "type")]
    pub package_type: Option<PackageType>,
    pub description: String,
    pub app_version: Option<String>,
    pub features: Vec<String>,
    /// Upstream's `requirements` list, as published.
    #[schema(value_type = Option<Vec<Object>>)]
    pub requirements: serde_json::Value,
    /// The options schema, `null` when none.
    #[schema(value_type = Option<Object>)]
    pub options: serde_json::Value,
    pub roles: Vec<RevisionRole>,
    /// When the scanner first saw its digest (RFC 3339): its age for a minimum release age.
    #[serde(default)]
    pub first_seen: Option<String>,
    /// Its signature verdict, when the JukeBox has a signature policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<Signature>,
}

fn json_field(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or(serde_json::Value::Null)
}

impl From<pb::Package> for Package {
    fn from(p: pb::Package) -> Self {
        let meta = p.metadata.unwrap_or_default();
        Self {
            registry: p.registry,
            image: p.image,
            tag: p.tag,
            digest: non_empty(p.digest),
            category: meta.category,
            name: meta.name,
            package_type: PackageType::from_proto(meta.r#type),
            description: meta.description,
            app_version: non_empty(meta.app_version),
            features: meta.features,
            requirements: json_field(&p.requirements_json),
            options: json_field(&p.options_json),
            roles: p
                .roles
                .into_iter()
                .map(|r| RevisionRole {
                    kind: match pb::RoleKind::try_from(r.kind) {
                        Ok(pb::RoleKind::Waypoint) => RoleKind::Waypoint,
                        Ok(pb::RoleKind::NewestOfType) => RoleKind::NewestOfType,
                        Ok(pb::RoleKind::Recalled) => RoleKind::Recalled,
                        Ok(pb::RoleKind::Unverified) => RoleKind::Unverified,
                        Ok(pb::RoleKind::SameDigest) => RoleKind::SameDigest,
                        _ => RoleKind::Head,
                    },
                    minimum: non_empty(r.minimum),
                    package_type: PackageType::from_proto(r.r#type),
                    description: r.description,
                    reason: non_empty(r.reason),
                    move_away: r.move_away,
                    enforced: r.enforced,
                })
                .collect(),
            first_seen: non_empty(p.first_seen),
            signature: p.signature.and_then(Signature::from_proto),
        }
    }
}

#[utoipa::path(get, path = "/api/v1/jukeboxes", tag = "catalog", params(PageQuery),
    responses((status = 200, body = JukeboxList), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn list_jukeboxes(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    page: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<JukeboxList>, ApiError> {
    let page = app.pages.slice(&query(page)?)?;
    let request = pb::ListJukeboxesRequest { page_size: page.size(), page_token: page.token() };
    let request = app.services.request(&ctx, request);
    let answer = app.services.catalog()?.list_jukeboxes(request).await.map_err(failed(Service::Catalog))?;
    let answer = answer.into_inner();
    let items = answer
        .jukeboxes
        .into_iter()
        .map(|j| Jukebox {
            name: j.name,
            package_count: j.package_count,
            pull_secret: non_empty(j.pull_secret),
            last_change_time: non_empty(j.last_change_time),
            conditions: j.conditions.into_iter().map(Condition::from).collect(),
            content_hash: j.content_hash,
        })
        .collect();
    let next_page_token = non_empty(answer.next_page_token);
    let skipped =
        answer.skipped.into_iter().map(|s| SkippedSource { source: s.source, problem: s.problem }).collect();
    Ok(Json(JukeboxList { items, skipped, next_page_token }))
}

#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CatalogQuery {
    pub category: Option<String>,
    pub name: Option<String>,
    #[serde(rename = "type")]
    #[param(rename = "type", value_type = Option<PackageType>)]
    pub package_type: Option<PackageType>,
    pub limit: Option<usize>,
    pub page_token: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CatalogPage {
    pub jukebox: String,
    pub content_hash: String,
    /// Newest first within each package, in the JukeBox's own order.
    pub items: Vec<Package>,
    pub next_page_token: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/jukeboxes/{jukebox}/catalog", tag = "catalog",
    params(("jukebox" = String, Path), CatalogQuery),
    responses((status = 200, body = CatalogPage), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn get_catalog(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path(jukebox): Path<String>,
    filters: Result<Query<CatalogQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    check_subdomain("jukebox", &jukebox)?;
    let filters = query(filters)?;
    let page =
        app.pages.slice(&PageQuery { limit: filters.limit, page_token: filters.page_token.clone() })?;
    let key = RenderedPages::key(&jukebox, &filters);
    let shared = app.catalog_pages.page(key);
    let ask = |held: Option<Arc<Rendered>>| async move {
        let request = pb::GetCatalogRequest {
            jukebox,
            category: filters.category.unwrap_or_default(),
            name: filters.name.unwrap_or_default(),
            r#type: filters.package_type.map(PackageType::to_proto).unwrap_or_default(),
            channel: 0,
            if_none_match: held.as_ref().map(|r| r.hash.clone()).unwrap_or_default(),
            page_size: page.size(),
            page_token: page.token(),
        };
        let request = app.services.request(&ctx, request);
        let answer = app.services.catalog()?.get_catalog(request).await.map_err(failed(Service::Catalog))?;
        render(answer.into_inner(), held)
    };
    // Asked for every read (whether it changed), by a round trip shared
    // with the reads that arrived meanwhile: only decoding and rendering
    // are saved when it did not.
    Ok(json_body(shared.read(ask).await?))
}

/// The page of `answer`, or the `held` bytes when the catalog says they are
/// still its content (`not_modified`): neither decoded nor rendered again.
fn render(answer: pb::GetCatalogResponse, held: Option<Arc<Rendered>>) -> Result<Arc<Rendered>, ApiError> {
    if let Some(held) = held.filter(|_| answer.not_modified) {
        return Ok(held);
    }
    // Only the page is converted (a catalog holds hundreds of packages).
    let (items, next_page_token) = (answer.packages, non_empty(answer.next_page_token));
    let items = items.into_iter().map(Package::from).collect();
    let page = CatalogPage {
        jukebox: answer.jukebox,
        content_hash: answer.content_hash.clone(),
        items,
        next_page_token,
    };
    let body = serde_json::to_vec(&page)
        .map_err(|e| ApiError::internal(format!("cannot render the catalog: {e}")))?;
    Ok(Arc::new(Rendered { hash: answer.content_hash, body: body.into() }))
}

fn json_body(body: bytes::Bytes) -> Response {
    ([(http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Catalog pages as the gateway last rendered them, by every input of the
/// page but the catalog's content. Bounded (`quick_cache`): an evicted page
/// is rendered at its next read.
#[derive(Debug)]
pub struct RenderedPages(quick_cache::sync::Cache<String, Arc<RenderedPage>>);

/// One page: what was last rendered, and the reads that arrived for it.
///
/// A read takes a ticket as it arrives. A round trip to the catalog covers
/// every ticket taken before it was sent, so a read whose ticket is covered
/// is served that answer: the catalog was asked after the read arrived, and
/// a read after a change never gets the page from before it. A read not
/// covered sends the next round trip (for itself and every read that
/// arrives meanwhile) once none is in flight, or waits for it; an answer
/// wakes every waiting read at once. Under load that is about two round
/// trips per catalog latency, whatever the number of readers; the shared
/// round trip carries the request id and caller of the read that sent it,
/// and its failure is every covered read's answer.
#[derive(Debug, Default)]
pub struct RenderedPage {
    state: std::sync::Mutex<PageState>,
    answered: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct PageState {
    arrivals: u64,
    in_flight: bool,
    /// The last answer (rendered, or the error it was).
    last: Option<(u64, Result<Arc<Rendered>, ApiError>)>,
    /// The last page rendered, whose hash the next round trip sends.
    rendered: Option<Arc<Rendered>>,
}

/// A page as rendered from the catalog's `content_hash` `hash`.
#[derive(Debug)]
struct Rendered {
    hash: String,
    body: bytes::Bytes,
}

/// Sends the round trip of a page; dropped (a read cancelled mid-flight,
/// its client gone), it lets the next waiting read send one.
struct InFlight<'a>(&'a RenderedPage);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Ok(mut state) = self.0.state.lock() {
            state.in_flight = false;
        }
        self.0.answered.notify_waiters();
    }
}

enum Turn {
    Served(Result<Arc<Rendered>, ApiError>),
    Ask(Option<Arc<Rendered>>, u64),
    Wait,
}

impl RenderedPage {
    /// The page for a read arriving now: a covering answer, else the answer
    /// of `ask(last rendered)`, sent by this read or another.
    async fn read<F, Fut>(&self, ask: F) -> Result<bytes::Bytes, ApiError>
    where
        F: FnOnce(Option<Arc<Rendered>>) -> Fut,
        Fut: std::future::Future<Output = Result<Arc<Rendered>, ApiError>>,
    {
        let ticket = self.locked(|s| {
            s.arrivals += 1;
            s.arrivals
        })?;
        loop {
            // Registered before the state is read: an answer given between
            // the two still wakes this read.
            let answered = self.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            let turn = self.locked(|s| match &s.last {
                Some((covers, answer)) if *covers >= ticket => Turn::Served(answer.clone()),
                _ if s.in_flight => Turn::Wait,
                _ => {
                    s.in_flight = true;
                    Turn::Ask(s.rendered.clone(), s.arrivals)
                }
            })?;
            match turn {
                Turn::Served(answer) => return answer.map(|r| r.body.clone()),
                Turn::Wait => answered.await,
                Turn::Ask(held, covers) => {
                    let flight = InFlight(self);
                    let answer = ask(held).await;
                    self.locked(|s| {
                        if let Ok(rendered) = &answer {
                            s.rendered = Some(rendered.clone());
                        }
                        s.last = Some((covers, answer.clone()));
                    })?;
                    drop(flight);
                    return answer.map(|r| r.body.clone());
                }
            }
        }
    }

    fn locked<T>(&self, f: impl FnOnce(&mut PageState) -> T) -> Result<T, ApiError> {
        let mut state =
            self.state.lock().map_err(|_| ApiError::internal("a catalog page's state was poisoned"))?;
        Ok(f(&mut state))
    }
}

impl RenderedPages {
    pub const CAPACITY: usize = 1024;

    pub fn new(capacity: usize) -> Self {
        Self(quick_cache::sync::Cache::new(capacity.max(1)))
    }

    /// Every input of a page but the catalog's content.
    fn key(jukebox: &str, filters: &CatalogQuery) -> String {
        let part = |v: Option<&str>| v.unwrap_or_default().replace('\0', "");
        let package_type = filters.package_type.map(|t| format!("{t:?}"));
        [
            jukebox.to_string(),
            part(filters.category.as_deref()),
            part(filters.name.as_deref()),
            part(package_type.as_deref()),
            filters.limit.map(|l| l.to_string()).unwrap_or_default(),
            part(filters.page_token.as_deref()),
        ]
        .join("\0")
    }

    fn page(&self, key: String) -> Arc<RenderedPage> {
        match self.0.get_or_insert_with(&key, || Ok::<_, std::convert::Infallible>(Arc::default())) {
            Ok(page) => page,
            Err(never) => match never {},
        }
    }
}

#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UpgradePathQuery {
    pub category: String,
    pub name: String,
    #[serde(rename = "type")]
    #[param(rename = "type", value_type = PackageType)]
    pub package_type: PackageType,
    /// The installed version; absent for a fresh install.
    pub from: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NoMatch {
    /// jukebox, category+name, type, minimum version, framework version or held.
    pub excluded_by: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UpgradePath {
    /// Each revision installed in turn (one agent Job each), oldest first.
    pub steps: Vec<Package>,
    /// The newest revision reached.
    pub to: Option<String>,
    /// Why no step can be taken.
    pub blocked: Option<NoMatch>,
}

#[utoipa::path(get, path = "/api/v1/jukeboxes/{jukebox}/upgrade-path", tag = "catalog",
    params(("jukebox" = String, Path), UpgradePathQuery),
    responses((status = 200, body = UpgradePath), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn upgrade_path(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path(jukebox): Path<String>,
    asked: Result<Query<UpgradePathQuery>, QueryRejection>,
) -> Result<Json<UpgradePath>, ApiError> {
    check_subdomain("jukebox", &jukebox)?;
    let asked = query(asked)?;
    let request = pb::GetUpgradePathRequest {
        jukebox,
        category: asked.category,
        name: asked.name,
        r#type: asked.package_type.to_proto(),
        from_tag: asked.from.unwrap_or_default(),
    };
    let request = app.services.request(&ctx, request);
    let answer = app.services.catalog()?.get_upgrade_path(request).await.map_err(failed(Service::Catalog))?;
    let answer = answer.into_inner();
    Ok(Json(UpgradePath {
        steps: answer.steps.into_iter().map(Package::from).collect(),
        to: non_empty(answer.to_tag),
        blocked: answer.blocked.map(|b| NoMatch { excluded_by: b.excluded_by, reason: b.reason }),
    }))
}
