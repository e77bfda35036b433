//! The gRPC face of the scanner; errors become `Status` codes here only.

use std::{pin::Pin, sync::Arc, time::Duration};

use futures::Stream;
use tonic::{Request, Response, Status};
use vynil_proto::scanner::v1::{
    self as pb, ExportIndexRequest, ExportIndexResponse, GetScanRequest, LiftRecallRequest, NotifiedScan,
    NotifyPushRequest, NotifyPushResponse, RecallRequest, RecallResponse, RepositoryError, ScanRequest,
    ScanResponse, ScanState, ScanStatus, WatchScanRequest, scanner_server::Scanner as ScannerApi,
};
use vynil_rules::ScanScope;

use vynil_runtime::{Classify, Failure, ToStatus};

use crate::{
    ScannerError,
    recalls::RecallChange,
    requests::{RecordState, ScanRecord},
    worker::Scanner,
};

impl Classify for ScannerError {
    fn failure(&self) -> Failure {
        match self {
            ScannerError::NotFound(_) => Failure::Missing,
            ScannerError::Rules(e) => e.failure(),
            ScannerError::Registry(e) => e.failure(),
            ScannerError::Index(e) => e.failure(),
            ScannerError::Conflict(_) | ScannerError::LeaseLost(_) => Failure::Concurrent,
            ScannerError::Store(_) => Failure::Transient,
            ScannerError::Lost(_) => Failure::Lost,
            ScannerError::Config(_) => Failure::Refused,
            ScannerError::Serve(e) => e.failure(),
        }
    }
}

impl From<ScannerError> for Status {
    fn from(error: ScannerError) -> Self {
        error.to_status()
    }
}

fn to_proto(record: &ScanRecord) -> ScanStatus {
    let state = match record.state {
        RecordState::Queued => ScanState::Queued,
        RecordState::Running => ScanState::Running,
        RecordState::Succeeded => ScanState::Succeeded,
        RecordState::PartiallyFailed => ScanState::PartiallyFailed,
        RecordState::Failed => ScanState::Failed,
    };
    ScanStatus {
        scan_id: record.id.clone(),
        jukebox: record.jukebox.clone(),
        filter: record.filter.clone(),
        repository: record.repository.as_ref().map(|(registry, repository)| {
            vynil_proto::scanner::v1::Repository {
                registry: registry.clone(),
                repository: repository.clone(),
            }
        }),
        state: state as i32,
        repositories_done: record.repositories_done,
        repositories_total: record.repositories_total,
        tags_seen: record.tags_seen,
        manifests_read: record.manifests_read,
        errors: record
            .errors
            .iter()
            .map(|(repository, message)| RepositoryError {
                repository: repository.clone(),
                message: message.clone(),
            })
            .collect(),
        started_at: record.started_at.clone(),
        finished_at: record.finished_at.clone(),
    }
}

#[derive(Debug, Clone)]
pub struct ScannerService {
    pub scanner: Arc<Scanner>,
    /// Scan, NotifyPush, ExportIndex, Recall and LiftRecall are privileged: the service token.
    pub trust: vynil_runtime::Trust,
}

type StatusStream = Pin<Box<dyn Stream<Item = Result<ScanStatus, Status>> + Send>>;

impl ScannerService {
    async fn recalls(
        &self,
        jukebox: &str,
        change: &RecallChange,
        actor: &str,
    ) -> Result<Response<RecallResponse>, Status> {
        let recalls = self.scanner.change_recalls(jukebox, change, actor).await?;
        let recalls = recalls
            .into_iter()
            .map(|r| pb::RecalledRevision {
                tag: r.tag,
                reason: r.reason,
                move_away: r.move_away,
                by: r.by,
                at: r.at,
            })
            .collect();
        Ok(Response::new(RecallResponse { recalls }))
    }

    async fn record(&self, id: &str) -> Result<ScanRecord, Status> {
        Ok(self.scanner.queue.find(id).await?)
    }
}

/// A repository named in a request, validated as the registry client reads it.
fn repository_of(repository: &vynil_proto::scanner::v1::Repository) -> Result<(String, String), Status> {
    let parsed = vynil_registry::RepositoryRef::new(&repository.registry, &repository.repository)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok((parsed.registry, parsed.repository))
}

#[tonic::async_trait]
impl ScannerApi for ScannerService {
    async fn scan(&self, request: Request<ScanRequest>) -> Result<Response<ScanResponse>, Status> {
        self.trust.privileged(&request, "Scan").map_err(|e| e.to_status())?;
        let request = request.into_inner();
        let filter = vynil_rules::ScanFilter::from_request(&request.filter).map_err(ScannerError::from)?;
        let scope = match (request.repository, filter) {
            (None, filter) => ScanScope::from_filter(filter),
            (Some(repository), None) => ScanScope::Repository(repository_of(&repository)?),
            (Some(_), Some(_)) => {
                return Err(Status::invalid_argument(
                    "a scan is partial (filter) or of one repository (repository), not both",
                ));
            }
        };
        let (scan_id, joined_existing) = self.scanner.request(&request.jukebox, scope).await?;
        Ok(Response::new(ScanResponse { scan_id, joined_existing }))
    }

    async fn notify_push(
        &self,
        request: Request<NotifyPushRequest>,
    ) -> Result<Response<NotifyPushResponse>, Status> {
        self.trust.privileged(&request, "NotifyPush").map_err(|e| e.to_status())?;
        let request = request.into_inner();
        let repository = request
            .repository
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("name the repository pushed to"))?;
        let repository = repository_of(repository)?;
        let scans = self.scanner.notify(&repository).await?;
        tracing::info!(
            registry = %repository.0,
            repository = %repository.1,
            tag = %request.tag,
            deleted = request.deleted,
            jukeboxes = scans.len(),
            "registry event"
        );
        let scans = scans
            .into_iter()
            .map(|(jukebox, scan_id, joined_existing)| NotifiedScan { jukebox, scan_id, joined_existing })
            .collect();
        Ok(Response::new(NotifyPushResponse { scans }))
    }

    async fn export_index(
        &self,
        request: Request<ExportIndexRequest>,
    ) -> Result<Response<ExportIndexResponse>, Status> {
        // It writes where the caller says, with a Secret the caller names.
        self.trust.privileged(&request, "ExportIndex").map_err(|e| e.to_status())?;
        let request = request.into_inner();
        if request.jukebox.is_empty() || request.destination.is_empty() {
            return Err(Status::invalid_argument("name the jukebox to export and its destination"));
        }
        let secret = Some(request.secret.as_str()).filter(|s| !s.is_empty());
        let done = self.scanner.export(&request.jukebox, &request.destination, secret).await?;
        tracing::info!(jukebox = %request.jukebox, destination = %request.destination, packages = done.report.packages, written = done.report.written.len(), removed = done.report.removed.len(), "index exported");
        Ok(Response::new(ExportIndexResponse {
            repositories: done.repositories as u32,
            packages: done.report.packages as u32,
            written: done.report.written,
            removed: done.report.removed,
        }))
    }

    async fn recall(&self, request: Request<RecallRequest>) -> Result<Response<RecallResponse>, Status> {
        // Every instance of the JukeBox is concerned: the gateway decides who may.
        let caller = self.trust.privileged(&request, "Recall").map_err(|e| e.to_status())?;
        let request = request.into_inner();
        let by = caller.recorded(&request.caller);
        let change = RecallChange::Recall(vynil_crds::RecalledRevision {
            tag: request.tag,
            reason: request.reason,
            move_away: request.move_away,
            by: by.clone(),
            at: vynil_crds::condition::rfc3339_seconds(jiff::Timestamp::now()),
        });
        self.recalls(&request.jukebox, &change, &by).await
    }

    async fn lift_recall(
        &self,
        request: Request<LiftRecallRequest>,
    ) -> Result<Response<RecallResponse>, Status> {
        let caller = self.trust.privileged(&request, "LiftRecall").map_err(|e| e.to_status())?;
        let request = request.into_inner();
        let by = caller.recorded(&request.caller);
        self.recalls(&request.jukebox, &RecallChange::Lift(request.tag), &by).await
    }

    async fn get_scan(&self, request: Request<GetScanRequest>) -> Result<Response<ScanStatus>, Status> {
        let request = request.into_inner();
        if !request.scan_id.is_empty() {
            return Ok(Response::new(to_proto(&self.record(&request.scan_id).await?)));
        }
        if request.jukebox.is_empty() {
            return Err(Status::invalid_argument("name a scan_id, or a jukebox for its latest scan"));
        }
        let latest = self.scanner.queue.latest(&request.jukebox).await?.ok_or_else(|| {
            Status::not_found(format!(
                "no finished scan of JukeBox {:?} in the last 24 h; request one with Scan",
                request.jukebox
            ))
        })?;
        Ok(Response::new(to_proto(&latest)))
    }

    /// Streams each change of the scan's record until it is final. Records
    /// live in the shared queue, so any replica can answer.
    async fn watch_scan(&self, request: Request<WatchScanRequest>) -> Result<Response<StatusStream>, Status> {
        let id = request.into_inner().scan_id;
        let first = self.record(&id).await?;
        let this = self.clone();
        let stream = async_stream(first, move |last: ScanRecord| {
            let this = this.clone();
            let id = id.clone();
            async move {
                if last.is_final() {
                    return None;
                }
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    match this.scanner.queue.find(&id).await {
                        Ok(next) if next != last => return Some(Ok(next)),
                        Ok(_) => continue,
                        // The store is away: the scan goes on, keep following it.
                        Err(error @ ScannerError::Store(_)) => {
                            tracing::debug!(%id, %error, "following a scan: store unavailable; retrying");
                        }
                        // Lost or gone: say so, rather than end as if it had finished.
                        Err(error) => return Some(Err(Status::from(error))),
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// `first`, then each value `next` yields from the previous one, until it
/// yields nothing or an error (sent, then the end).
fn async_stream<F, Fut>(first: ScanRecord, next: F) -> impl Stream<Item = Result<ScanStatus, Status>> + Send
where
    F: Fn(ScanRecord) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Option<Result<ScanRecord, Status>>> + Send,
{
    futures::stream::unfold(Some((Ok(first), next)), |state| async move {
        let (current, next) = state?;
        match current {
            Ok(record) => {
                let following = next(record.clone()).await;
                Some((Ok(to_proto(&record)), following.map(|f| (f, next))))
            }
            Err(status) => Some((Err(status), None)),
        }
    })
}

#[cfg(test)]
mod tests {
    use tonic::Code;
    use vynil_store::StoreError;

    use super::*;

    #[test]
    fn shared_failures_answer_the_codes_every_service_answers() {
        let timeout = vynil_registry::RegistryError::Timeout { what: "tags".into(), seconds: 1, attempts: 1 };
        assert_eq!(Status::from(ScannerError::Registry(timeout)).code(), Code::Unavailable);
        assert_eq!(
            Status::from(ScannerError::from(StoreError::Conflict("box".into()))).code(),
            Code::Aborted
        );
        assert_eq!(
            Status::from(ScannerError::from(StoreError::Unavailable("r".into()))).code(),
            Code::Unavailable
        );
    }
}
