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

#[tokio::test]
async fn a_redis_outage_shows_under_the_cache_health_name_while_the_server_stays_serving() {
    use vynil_testkit::ServingStatus;
    let mut redis = vynil_testkit::RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    vynil_testkit::JukeboxBuilder::new("box").write_to(dir.path()).unwrap();
    let args =
        ["--jukebox-dir", dir.path().to_str().unwrap(), "--redis-url", &redis.url(), "--resync-seconds", "1"];
    let service = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-catalog")), &args).await.unwrap();
    let status_of = async |name: &str, wanted: ServingStatus| {
        for _ in 0..200 {
            if service.health(name).await.unwrap() == wanted {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        false
    };
    assert!(status_of(vynil_catalog::CACHE_HEALTH, ServingStatus::Serving).await);

    redis.kill();
    assert!(
        status_of(vynil_catalog::CACHE_HEALTH, ServingStatus::NotServing).await,
        "the cache is reported down"
    );
    for name in ["", SERVICE] {
        assert_eq!(service.health(name).await.unwrap(), ServingStatus::Serving, "{name:?} keeps serving");
    }
    redis.restart().await.unwrap();
    assert!(status_of(vynil_catalog::CACHE_HEALTH, ServingStatus::Serving).await, "and back once Redis is");
}

/// A port taken between the test kit's probe and the service's bind (by a
/// parallel test) is not the service's failure: it starts on another one.
#[tokio::test]
async fn a_service_whose_port_was_taken_before_it_bound_starts_on_another() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let binary = Path::new(env!("CARGO_BIN_EXE_vynil-catalog"));
    let service = ServiceProcess::start_trying_port_first(binary, &[], port).await.unwrap();
    assert_ne!(service.endpoint(), format!("http://127.0.0.1:{port}"));
    service.check_serves_then_stops(SERVICE).await.unwrap();
}
