//! Local mode scans every JukeBox once at start (a laptop has no schedule
//! to wait for) and says, when each is done, what to look at.

use std::{future::Future, net::SocketAddr, path::PathBuf};

/// Local mode scans every JukeBox once at start (a laptop has no schedule to
/// wait for) and says, when each is done, what to look at.
pub(crate) async fn run(
    store: std::sync::Arc<dyn vynil_store::ScannerStore>,
    scanner: SocketAddr,
    url: String,
    admin: PathBuf,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> (&'static str, Result<(), String>) {
    use vynil_proto::scanner::v1::{ScanRequest, ScanState, WatchScanRequest, scanner_client::ScannerClient};
    let work = async move {
        let endpoint = format!("http://{scanner}");
        let mut client = None;
        for _ in 0..200 {
            if let Ok(connected) = ScannerClient::connect(endpoint.clone()).await {
                client = Some(connected);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let Some(mut client) = client else {
            tracing::warn!(%endpoint, "the scanner never answered: no first scan");
            return;
        };
        let names: Vec<String> = match store.list().await {
            Ok(records) => records.into_iter().map(|r| r.name).collect(),
            Err(error) => {
                tracing::warn!(%error, "cannot list the JukeBoxes: no first scan");
                return;
            }
        };
        for name in names {
            let request = ScanRequest { jukebox: name.clone(), ..Default::default() };
            let Ok(started) = client.scan(request).await else { continue };
            let scan_id = started.into_inner().scan_id;
            let Ok(stream) = client.watch_scan(WatchScanRequest { scan_id }).await else { continue };
            let mut stream = stream.into_inner();
            let mut last = None;
            while let Ok(Some(status)) = stream.message().await {
                last = Some(status);
            }
            let Some(status) = last else { continue };
            let state = ScanState::try_from(status.state).unwrap_or(ScanState::Unspecified);
            let admin = admin.display();
            println!(
                "JukeBox {name}: first scan {}, {} repositories, {} tags. Its catalog:\n  curl -H \"Authorization: Bearer $(cat {admin})\" {url}/api/v1/jukeboxes/{name}/catalog",
                match state {
                    ScanState::Succeeded => "succeeded",
                    ScanState::PartiallyFailed => "partially failed (see the scan's errors)",
                    _ => "failed (see the logs)",
                },
                status.repositories_total,
                status.tags_seen
            );
        }
    };
    // Done is not an end: the task lasts as long as the services.
    tokio::pin!(stopped);
    tokio::select! {
        _ = work => stopped.await,
        _ = &mut stopped => {}
    }
    ("first scans", Ok(()))
}
