//! The `vynil-scanner` binary as a real process: health, reflection, SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use vynil_proto::scanner::v1::{GetScanRequest, scanner_client::ScannerClient};
use vynil_testkit::ServiceProcess;

const SERVICE: &str = "vynil.scanner.v1.Scanner";

#[tokio::test]
async fn the_binary_serves_health_and_reflection_then_exits_cleanly_on_sigterm() {
    let service = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-scanner")), &[]).await.unwrap();
    service.check_serves_then_stops(SERVICE).await.unwrap();
}

#[tokio::test]
async fn with_embedded_defaults_an_unknown_scan_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let jukeboxes = dir.path().to_str().unwrap();
    let service =
        ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-scanner")), &["--jukebox-dir", jukeboxes])
            .await
            .unwrap();
    let mut client = ScannerClient::new(service.channel().await.unwrap());
    let status = client.get_scan(GetScanRequest { scan_id: "nope".into() }).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    let status = client
        .scan(vynil_proto::scanner::v1::ScanRequest { jukebox: "absent".into(), filter: String::new() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
}
