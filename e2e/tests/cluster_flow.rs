//! The cluster path end to end, as `docs/architecture.md` draws it: the scanner writes a
//! JukeBox's status through the Kubernetes API, the catalog follows that
//! status with its watcher and answers over gRPC. Both services run with
//! their own Kubernetes store (as separate deployments would) against the
//! fake API server, with a real registry; a `force-scan` annotation starts it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, channel};
use kube::api::{Patch, PatchParams};
use vynil_proto::catalog::v1::{GetCatalogRequest, catalog_client::CatalogClient};

#[tokio::test]
async fn a_forced_scan_reaches_the_catalog_through_jukebox_status() {
    let cluster = Cluster::start(&[]).await;
    let boxes = &cluster.boxes;
    let annotate = serde_json::json!({"metadata": {"annotations": {"vynil.solidite.fr/force-scan": "true"}}});
    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&annotate)).await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut catalog = CatalogClient::new(channel(cluster.catalog_addr).await);
    let tags = loop {
        let request = GetCatalogRequest { jukebox: "box".into(), ..Default::default() };
        if let Ok(answer) = catalog.get_catalog(request).await {
            let tags: Vec<String> = answer.into_inner().packages.into_iter().map(|p| p.tag).collect();
            if !tags.is_empty() {
                break tags;
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

    cluster.stop().await;
}

/// The catalog's tags of `box` once they equal `want`, or the last seen at the deadline.
async fn catalog_until(cluster: &Cluster, want: &[&str]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut catalog = CatalogClient::new(channel(cluster.catalog_addr).await);
    loop {
        let request = GetCatalogRequest { jukebox: "box".into(), ..Default::default() };
        let tags: Vec<String> = match catalog.get_catalog(request).await {
            Ok(answer) => answer.into_inner().packages.into_iter().map(|p| p.tag).collect(),
            Err(_) => Vec::new(),
        };
        if tags == want || Instant::now() > deadline {
            return tags;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn every_watch_closed_at_once_loses_nothing_the_next_scan_writes() {
    let cluster = Cluster::start(&[]).await;
    let force = serde_json::json!({"metadata": {"annotations": {"vynil.solidite.fr/force-scan": "true"}}});
    let boxes = &cluster.boxes;
    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&force)).await.unwrap();
    assert_eq!(catalog_until(&cluster, &["2.1.0"]).await, ["2.1.0"]);

    // The API server drops every watch (a restart, a load balancer): the
    // scanner must see the next force-scan and the catalog the status it writes.
    let watches =
        || cluster.api.requests().iter().filter(|r| r.verb == "watch" && r.resource == "jukeboxes").count();
    let before = watches();
    cluster.api.close_watches();
    let spec = vynil_testkit::PackageSpec::new("apps", "web", vynil_testkit::PackageType::Tenant, "2.2.0");
    cluster.registry.publisher().publish("apps/web", &spec).await.unwrap();
    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&force)).await.unwrap();
    assert_eq!(
        catalog_until(&cluster, &["2.2.0"]).await,
        ["2.2.0"],
        "a closed watch lost the scan or its status"
    );
    // Every watcher watched again (the scanner's and the catalog's at least).
    assert!(watches() >= before + 2, "{before} watches before closing, {} after", watches());
    cluster.stop().await;
}
