//! Lifecycle's one call to the scanner (#65 item 1): when the tag of a
//! revision an agent Job is about to pull names other bytes than the digest
//! chosen (re-pushed, or re-pointed by someone who cannot sign), the Job
//! still runs pinned, and the scanner is asked for a repository-scoped scan
//! (`NotifyPush`, the same request a registry's push notification makes),
//! so that the JukeBox's status says what the tag names now (and, under a
//! signature policy, whether it is signed) without waiting for its
//! schedule. `NotifyPush` is privileged: lifecycle presents the service
//! token it verifies its own callers with. Best effort: an unreachable
//! scanner leaves the scan to the JukeBox's schedule.

use tonic::transport::Endpoint;
use vynil_proto::scanner::v1::{NotifyPushRequest, Repository, scanner_client::ScannerClient};
use vynil_runtime::{ServiceCredentials, TracedChannel, traced};

use crate::LifecycleError;

#[derive(Debug, Clone)]
pub struct Scanner {
    client: ScannerClient<TracedChannel>,
    credentials: ServiceCredentials,
}

impl Scanner {
    /// A lazily connected client of the scanner at `endpoint`, presenting `token`.
    pub fn connect(endpoint: &str, token: Option<&str>) -> Result<Self, LifecycleError> {
        let channel = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| LifecycleError::Config(format!("--scanner-endpoint {endpoint:?}: {e}")))?
            .connect_timeout(std::time::Duration::from_secs(5))
            .timeout(std::time::Duration::from_secs(10))
            .connect_lazy();
        let credentials = ServiceCredentials::new(token)
            .map_err(|e| LifecycleError::Config(format!("the service token: {}", e.message())))?;
        Ok(Self { client: ScannerClient::new(traced(channel)), credentials })
    }

    /// Asks a scan of `registry/image` for every JukeBox whose source holds
    /// it; how many scans were asked or joined.
    pub async fn rescan(&self, registry: &str, image: &str, tag: &str) -> Result<usize, LifecycleError> {
        let repository = Some(Repository { registry: registry.into(), repository: image.into() });
        let mut request =
            tonic::Request::new(NotifyPushRequest { repository, tag: tag.into(), deleted: false });
        self.credentials.apply(&mut request, "vynil-lifecycle");
        let answer =
            self.client.clone().notify_push(request).await.map_err(|e| {
                LifecycleError::Unavailable(format!("scanner, asking a scan: {}", e.message()))
            })?;
        Ok(answer.into_inner().scans.len())
    }
}
