//! Scans: start one (full or partial), read one, follow one as server-sent events.

use std::convert::Infallible;

use axum::{
    Json,
    extract::{Path, State, rejection::JsonRejection},
    http::StatusCode,
    response::sse::{Event, KeepAlive, Sse},
};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use vynil_proto::scanner::v1 as pb;

use super::{App, Ctx, Errors, body, check_subdomain, failed, json_event, non_empty};
use crate::{downstream::Service, error::ApiError};

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ScanRequest {
    /// `<category>` or `<category>/<name>`: a partial scan; absent: a full scan.
    pub filter: Option<String>,
    /// Exactly this repository (read only if it belongs to the JukeBox's
    /// source): only its entries are replaced. Not with `filter`.
    pub repository: Option<super::purge::RepositoryTarget>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScanStarted {
    pub scan_id: String,
    /// An equivalent queued or running scan already covers this request.
    pub joined_existing: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ScanState {
    Unknown,
    Queued,
    Running,
    Succeeded,
    /// Some repositories failed; their previous entries were kept.
    PartiallyFailed,
    Failed,
}

impl ScanState {
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::PartiallyFailed | Self::Failed)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RepositoryError {
    pub repository: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Scan {
    pub scan_id: String,
    pub jukebox: String,
    pub filter: Option<String>,
    /// Set for a repository-scoped scan (a push event's, say).
    pub repository: Option<super::purge::RepositoryTarget>,
    pub state: ScanState,
    pub repositories_done: u32,
    pub repositories_total: u32,
    pub tags_seen: u64,
    pub manifests_read: u64,
    pub errors: Vec<RepositoryError>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
}

impl From<pb::ScanStatus> for Scan {
    fn from(s: pb::ScanStatus) -> Self {
        let state = match pb::ScanState::try_from(s.state) {
            Ok(pb::ScanState::Queued) => ScanState::Queued,
            Ok(pb::ScanState::Running) => ScanState::Running,
            Ok(pb::ScanState::Succeeded) => ScanState::Succeeded,
            Ok(pb::ScanState::PartiallyFailed) => ScanState::PartiallyFailed,
            Ok(pb::ScanState::Failed) => ScanState::Failed,
            _ => ScanState::Unknown,
        };
        Self {
            scan_id: s.scan_id,
            jukebox: s.jukebox,
            filter: non_empty(s.filter),
            repository: s
                .repository
                .map(|r| super::purge::RepositoryTarget { registry: r.registry, repository: r.repository }),
            state,
            repositories_done: s.repositories_done,
            repositories_total: s.repositories_total,
            tags_seen: s.tags_seen,
            manifests_read: s.manifests_read,
            errors: s
                .errors
                .into_iter()
                .map(|e| RepositoryError { repository: e.repository, message: e.message })
                .collect(),
            started_at: non_empty(s.started_at),
            finished_at: non_empty(s.finished_at),
        }
    }
}

fn check_scan_id(id: &str) -> Result<(), ApiError> {
    super::check_id("scan_id", id)
}

#[utoipa::path(post, path = "/api/v1/jukeboxes/{jukebox}/scans", tag = "scans",
    params(("jukebox" = String, Path)), request_body = ScanRequest,
    responses((status = 202, body = ScanStarted, description = "The scan was queued, or joined one that covers it"), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn start_scan(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path(jukebox): Path<String>,
    request: Result<Json<ScanRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<ScanStarted>), ApiError> {
    check_subdomain("jukebox", &jukebox)?;
    let request = body(request)?;
    let filter = request.filter.unwrap_or_default();
    // The rules crate's own parser, so a bad filter never reaches the scanner.
    vynil_rules::ScanFilter::from_request(&filter).map_err(|e| ApiError::bad_request("filter", e))?;
    if request.repository.is_some() && !filter.is_empty() {
        return Err(ApiError::bad_request(
            "repository",
            "a scan is partial (filter) or of one repository, not both",
        ));
    }
    let repository =
        request.repository.map(|r| pb::Repository { registry: r.registry, repository: r.repository });
    let request = app.services.request(&ctx, pb::ScanRequest { jukebox, filter, repository });
    let answer = app.services.scanner()?.scan(request).await.map_err(failed(Service::Scanner))?;
    let answer = answer.into_inner();
    Ok((
        StatusCode::ACCEPTED,
        Json(ScanStarted { scan_id: answer.scan_id, joined_existing: answer.joined_existing }),
    ))
}

#[utoipa::path(get, path = "/api/v1/scans/{scan_id}", tag = "scans", params(("scan_id" = String, Path)),
    responses((status = 200, body = Scan), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn get_scan(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path(scan_id): Path<String>,
) -> Result<Json<Scan>, ApiError> {
    check_scan_id(&scan_id)?;
    let request = app.services.request(&ctx, pb::GetScanRequest { scan_id, jukebox: String::new() });
    let answer = app.services.scanner()?.get_scan(request).await.map_err(failed(Service::Scanner))?;
    Ok(Json(answer.into_inner().into()))
}

#[utoipa::path(get, path = "/api/v1/jukeboxes/{jukebox}/scans/latest", tag = "scans",
    params(("jukebox" = String, Path)),
    responses((status = 200, body = Scan), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn latest_scan(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path(jukebox): Path<String>,
) -> Result<Json<Scan>, ApiError> {
    check_subdomain("jukebox", &jukebox)?;
    let request = app.services.request(&ctx, pb::GetScanRequest { scan_id: String::new(), jukebox });
    let answer = app.services.scanner()?.get_scan(request).await.map_err(failed(Service::Scanner))?;
    Ok(Json(answer.into_inner().into()))
}

#[utoipa::path(get, path = "/api/v1/scans/{scan_id}/events", tag = "scans", params(("scan_id" = String, Path)),
    responses((status = 200, description = "`progress` events (a Scan each) until the scan ends; an `error` event if following fails", content_type = "text/event-stream", body = Scan), Errors),
    security(("bearer" = []), ("session" = [])))]
pub async fn follow_scan(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path(scan_id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    check_scan_id(&scan_id)?;
    let permit = app.streams.open(&ctx)?;
    let request = app.services.request(&ctx, pb::WatchScanRequest { scan_id });
    let stream = app.services.scanner()?.watch_scan(request).await.map_err(failed(Service::Scanner))?;
    let request_id = ctx.request_id.clone();
    let events = stream.into_inner().map(move |item| {
        let _held = &permit;
        Ok(match item {
            Ok(status) => json_event("progress", &Scan::from(status)),
            Err(status) => json_event(
                "error",
                &ApiError::from_status(Service::Scanner.name(), &status).body(&request_id),
            ),
        })
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

/// Where to write a JukeBox's index (`ExportIndex`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ExportRequest {
    /// `s3://<bucket>[/<prefix>]`, `http(s)://…` or a directory: one the
    /// scanner allows (`--export-destination`), or below one.
    pub destination: String,
    /// A Secret (labelled for exports) holding the destination's credentials.
    pub secret: Option<String>,
    /// The JukeBox's name, typed by the human who confirms: the index at the
    /// destination is replaced, and files it no longer lists removed.
    pub confirm: String,
}

/// What an export wrote.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExportDone {
    pub repositories: u32,
    pub packages: u32,
    /// Files written, `index.yaml` last; empty when the index was already this one.
    pub written: Vec<String>,
    /// Files of the previous index the new one no longer lists.
    pub removed: Vec<String>,
}

/// Writes the JukeBox's catalog as an index (`index.yaml` and its package
/// files) at an allowed destination, replacing the one there.
#[utoipa::path(post, path = "/api/v1/jukeboxes/{jukebox}/exports", tag = "scans", params(("jukebox" = String, Path)),
    request_body = ExportRequest,
    responses((status = 200, body = ExportDone, description = "The index was written (or was already this one)"), Errors),
    security(("bearer" = []), ("session" = [])))]
pub async fn export_index(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path(jukebox): Path<String>,
    request: Result<Json<ExportRequest>, JsonRejection>,
) -> Result<Json<ExportDone>, ApiError> {
    check_subdomain("jukebox", &jukebox)?;
    let request = body(request)?;
    if request.destination.is_empty() {
        return Err(ApiError::bad_request("destination", "name where to write the index"));
    }
    if request.confirm != jukebox {
        return Err(ApiError::refused(format!(
            "confirm: type the JukeBox's name ({jukebox}) to replace the index at {}",
            request.destination
        )));
    }
    let request = pb::ExportIndexRequest {
        jukebox,
        destination: request.destination,
        secret: request.secret.unwrap_or_default(),
    };
    let request = app.services.request(&ctx, request);
    let done = app.services.scanner()?.export_index(request).await.map_err(failed(Service::Scanner))?;
    let done = done.into_inner();
    Ok(Json(ExportDone {
        repositories: done.repositories,
        packages: done.packages,
        written: done.written,
        removed: done.removed,
    }))
}
