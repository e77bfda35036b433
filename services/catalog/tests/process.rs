//! The `vynil-catalog` binary as a real process: health, reflection, SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::Path, time::Duration};

use vynil_proto::catalog::v1::{ListJukeboxesRequest, catalog_client::CatalogClient};
use vynil_testkit::{ServiceProcess, ServingStatus};

const SERVICE: &str = "vynil.catalog.v1.Catalog";

#[tokio::test]
async fn the_binary_serves_health_and_reflection_then_exits_cleanly_on_sigterm() {
    let service = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-catalog")), &[])
        .await
        .unwrap();
    assert_eq!(service.health("").await.unwrap(), ServingStatus::Serving);
    assert_eq!(
        service.health(SERVICE).await.unwrap(),
        ServingStatus::Serving
    );
    let reflected = service.reflected_services().await.unwrap();
    assert!(reflected.iter().any(|s| s == SERVICE), "{reflected:?}");
    assert!(
        reflected.iter().any(|s| s == "grpc.health.v1.Health"),
        "{reflected:?}"
    );

    let status = service.terminate(Duration::from_secs(10)).await.unwrap();
    assert!(status.success(), "exit status {status}");
}

#[tokio::test]
async fn an_rpc_not_implemented_yet_answers_unimplemented() {
    let service = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-catalog")), &[])
        .await
        .unwrap();
    let mut client = CatalogClient::new(service.channel().await.unwrap());
    let status = client
        .list_jukeboxes(ListJukeboxesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
}
