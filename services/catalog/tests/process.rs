//! The `vynil-catalog` binary as a real process: health, reflection, SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use vynil_proto::catalog::v1::{ListJukeboxesRequest, catalog_client::CatalogClient};
use vynil_testkit::ServiceProcess;

const SERVICE: &str = "vynil.catalog.v1.Catalog";

#[tokio::test]
async fn the_binary_serves_health_and_reflection_then_exits_cleanly_on_sigterm() {
    let service = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-catalog")), &[]).await.unwrap();
    service.check_serves_then_stops(SERVICE).await.unwrap();
}

#[tokio::test]
async fn before_anything_is_loaded_the_catalog_is_unavailable_never_empty() {
    let service = ServiceProcess::start(
        Path::new(env!("CARGO_BIN_EXE_vynil-catalog")),
        &["--jukebox-dir", "does-not-exist"],
    )
    .await
    .unwrap();
    let mut client = CatalogClient::new(service.channel().await.unwrap());
    let status = client.list_jukeboxes(ListJukeboxesRequest::default()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
}
