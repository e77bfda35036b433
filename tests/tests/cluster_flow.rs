//! The cluster path end to end, as DESIGN draws it: the scanner writes a
//! JukeBox's status through the Kubernetes API, the catalog follows that
//! status with its watcher and answers over gRPC. Both services run with
//! their own Kubernetes store (as separate deployments would) against the
//! fake API server, with a real registry; a `force-scan` annotation starts it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::Parser;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use vynil_crds::JukeBox;
use vynil_proto::catalog::v1::{GetCatalogRequest, catalog_client::CatalogClient};
use vynil_store::KubeStore;
use vynil_testkit::{PackageSpec, PackageType, RegistryServer, free_port, kube_api::FakeApiServer};

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port().unwrap()))
}

#[tokio::test]
async fn a_forced_scan_reaches_the_catalog_through_jukebox_status() {
    let registry = RegistryServer::start().await.unwrap();
    let spec = PackageSpec::new("apps", "web", PackageType::Tenant, "2.1.0");
    registry.publisher().publish("apps/web", &spec).await.unwrap();
    let api = FakeApiServer::start().await.unwrap();
    let boxes: Api<JukeBox> = Api::all(api.client().unwrap());
    let jukebox: JukeBox = serde_json::from_value(serde_json::json!({
        "apiVersion": "vynil.solidite.fr/v1", "kind": "JukeBox", "metadata": {"name": "box"},
        "spec": {"source": {"list": [format!("{}/apps/web", registry.host())]}, "schedule": "0 0 1 1 *"},
    }))
    .unwrap();
    boxes.create(&PostParams::default(), &jukebox).await.unwrap();

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let shutdown = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let (scanner_addr, catalog_addr) = (loopback(), loopback());
    let host = registry.host();
    let scanner = vynil_scanner::Config::parse_from([
        "vynil-scanner",
        "--listen",
        &scanner_addr.to_string(),
        "--insecure-registry",
        &host,
        "--poll-milliseconds",
        "100",
    ]);
    let catalog = vynil_catalog::Config::parse_from(["vynil-catalog", "--listen", &catalog_addr.to_string()]);
    let mut services = tokio::task::JoinSet::new();
    let (store, done) = (Arc::new(KubeStore::new(api.client().unwrap())), shutdown());
    services.spawn(async move {
        vynil_scanner::run_with_store(scanner, store, done).await.map_err(|e| e.to_string())
    });
    let (store, done) = (Arc::new(KubeStore::new(api.client().unwrap())), shutdown());
    services.spawn(async move {
        vynil_catalog::run_with_store(catalog, store, done).await.map_err(|e| e.to_string())
    });

    let annotate = serde_json::json!({"metadata": {"annotations": {"vynil.solidite.fr/force-scan": "true"}}});
    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&annotate)).await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    let tags = loop {
        if let Ok(channel) =
            tonic::transport::Channel::from_shared(format!("http://{catalog_addr}")).unwrap().connect().await
        {
            let request = GetCatalogRequest { jukebox: "box".into(), ..Default::default() };
            if let Ok(answer) = CatalogClient::new(channel).get_catalog(request).await {
                let tags: Vec<String> = answer.into_inner().packages.into_iter().map(|p| p.tag).collect();
                if !tags.is_empty() {
                    break tags;
                }
            }
        }
        assert!(Instant::now() < deadline, "the catalog never showed the scanned package");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(tags, ["2.1.0"]);
    // The status is in the API server, and the request is served.
    let stored = boxes.get("box").await.unwrap();
    assert_eq!(stored.status.map(|s| s.packages.len()), Some(1));
    for _ in 0..100 {
        let annotations = boxes.get("box").await.unwrap().metadata.annotations.unwrap_or_default();
        if !annotations.contains_key("vynil.solidite.fr/force-scan") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let annotations = boxes.get("box").await.unwrap().metadata.annotations.unwrap_or_default();
    assert!(!annotations.contains_key("vynil.solidite.fr/force-scan"), "{annotations:?}");

    stop.send(true).unwrap();
    while let Some(done) = services.join_next().await {
        done.unwrap().unwrap();
    }
}
