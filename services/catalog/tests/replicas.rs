//! Three catalog processes on one Redis all serve the new catalog after a
//! status change, through their real gRPC API.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::{path::Path, time::Duration};

use vynil_crds::JukeBoxStatus;
use vynil_proto::catalog::v1::{GetCatalogRequest, catalog_client::CatalogClient};
use vynil_rules::{Package, PackageContent, PackageType};
use vynil_store::{JukeboxStore, LocalStore};
use vynil_testkit::{RedisServer, ServiceProcess};

fn package(tag: &str) -> Package {
    Package::new("registry.example", "db/pg", tag, PackageContent::minimal("db", "pg", PackageType::System))
}

#[tokio::test]
async fn three_catalog_processes_serve_the_new_catalog_after_a_status_change() {
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    vynil_testkit::JukeboxBuilder::new("box").write_to(dir.path()).unwrap();
    let writer =
        LocalStore::with_redis(dir.path().to_path_buf(), &vynil_store::RedisTarget::url(redis.url()))
            .await
            .unwrap();
    writer
        .write_status(
            "box",
            &vynil_store::StatusVersion::new("0"),
            &JukeBoxStatus { packages: vec![package("1.0.0")], ..Default::default() },
        )
        .await
        .unwrap();

    let (url, jukeboxes) = (redis.url(), dir.path().to_str().unwrap().to_string());
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let args = ["--redis-url", url.as_str(), "--jukebox-dir", jukeboxes.as_str()];
        replicas.push(
            ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-catalog")), &args).await.unwrap(),
        );
    }
    let mut clients = Vec::new();
    for replica in &replicas {
        clients.push(CatalogClient::new(replica.channel().await.unwrap()));
    }
    let request = || GetCatalogRequest { jukebox: "box".into(), ..GetCatalogRequest::default() };
    for client in &mut clients {
        let tags: Vec<String> = client
            .get_catalog(request())
            .await
            .unwrap()
            .into_inner()
            .packages
            .into_iter()
            .map(|p| p.tag)
            .collect();
        assert_eq!(tags, ["1.0.0"]);
    }

    writer
        .write_status(
            "box",
            &vynil_store::StatusVersion::new("1"),
            &JukeBoxStatus { packages: vec![package("2.0.0")], ..Default::default() },
        )
        .await
        .unwrap();
    for (index, client) in clients.iter_mut().enumerate() {
        let mut fresh = false;
        for _ in 0..200 {
            let tags: Vec<String> = client
                .get_catalog(request())
                .await
                .unwrap()
                .into_inner()
                .packages
                .into_iter()
                .map(|p| p.tag)
                .collect();
            if tags == ["2.0.0"] {
                fresh = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(fresh, "replica {index} never served 2.0.0");
    }
}
