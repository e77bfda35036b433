//! The catalog in a cluster: it follows JukeBox **status** through a kube
//! watcher (the fake API server, the real kube client), with real Redis.
//! `docs/upstream-vynil.md` §9 item 13, one test each, plus the binary with `--kubernetes`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{eventually, set_calls};
use std::{path::Path, sync::Arc, time::Duration};

use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use vynil_catalog::{Catalog, Change};
use vynil_crds::JukeBox;
use vynil_proto::catalog::v1::{ListJukeboxesRequest, catalog_client::CatalogClient};
use vynil_store::KubeStore;
use vynil_testkit::{RedisServer, ServiceProcess, kube_api::FakeApiServer};

struct World {
    redis: RedisServer,
    api: FakeApiServer,
    boxes: Api<JukeBox>,
}

async fn world(names: &[&str]) -> World {
    let redis = RedisServer::start().await.unwrap();
    let api = FakeApiServer::start_under_deploy_rbac(&[]).await.unwrap();
    let boxes: Api<JukeBox> = Api::all(api.client().unwrap());
    for name in names {
        let jukebox = vynil_testkit::JukeboxBuilder::new(name).list(["registry.example/think/ollama"]).json();
        let jukebox: JukeBox = serde_json::from_value(jukebox).unwrap();
        boxes.create(&PostParams::default(), &jukebox).await.unwrap();
    }
    World { redis, api, boxes }
}

async fn replica(world: &World) -> Arc<Catalog> {
    // The catalog under its deployed grants, on its ServiceAccount's token.
    let token = world.api.service_account_token("vynil-system", "vynil-catalog");
    let store = Arc::new(KubeStore::new(world.api.client_as(&token).unwrap()));
    let catalog = Arc::new(
        Catalog::new(
            store,
            Some(&vynil_store::RedisTarget::url(world.redis.url())),
            semver::Version::new(0, 8, 0),
        )
        .await
        .unwrap(),
    );
    catalog.resync().await.unwrap();
    tokio::spawn(catalog.clone().follow(Duration::from_secs(3600)));
    catalog
}

fn package(tag: &str) -> serde_json::Value {
    json!({
        "registry": "registry.example", "image": "think/ollama", "tag": tag,
        "metadata": {"name": "ollama", "category": "think", "description": "", "type": "tenant", "features": []},
        "requirements": [],
    })
}

/// What the scanner writes: the status subresource.
async fn write(world: &World, name: &str, tags: &[&str], message: &str) {
    let packages: Vec<_> = tags.iter().map(|t| package(t)).collect();
    let status = json!({"status": {"packages": packages, "conditions": [
        {"type": "Updated", "status": "True", "message": message, "generation": 1},
    ]}});
    world.boxes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
}

#[tokio::test]
async fn a_status_change_updates_the_entry_while_a_scan_job_still_runs() {
    let world = world(&["box"]).await;
    let catalog = replica(&world).await;
    // What upstream waited for: a scan Job, still running. The catalog never looks at it.
    let jobs: Api<k8s_openapi::api::batch::v1::Job> =
        Api::namespaced(world.api.client().unwrap(), "vynil-system");
    let job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "scan-box", "labels": {"app.kubernetes.io/instance": "box"}},
        "spec": {"template": {"spec": {"restartPolicy": "OnFailure", "containers": [{"name": "scan", "image": "agent"}]}}},
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &job).await.unwrap();
    write(&world, "box", &["1.0.0"], "Updated succesfully").await;
    eventually(&catalog, "box", &["1.0.0"]).await;
}

#[tokio::test]
async fn a_change_written_by_a_scheduled_scan_updates_the_entry() {
    let world = world(&["box"]).await;
    let catalog = replica(&world).await;
    write(&world, "box", &["1.0.0"], "Updated succesfully").await;
    eventually(&catalog, "box", &["1.0.0"]).await;
    write(&world, "box", &["1.1.0", "1.0.0"], "Updated succesfully (scheduled scan)").await;
    eventually(&catalog, "box", &["1.1.0", "1.0.0"]).await;
}

#[tokio::test]
async fn updating_one_jukebox_never_touches_another_on_any_replica() {
    let world = world(&["a", "b"]).await;
    let replicas = [replica(&world).await, replica(&world).await, replica(&world).await];
    write(&world, "b", &["1.0.0"], "Updated succesfully").await;
    for catalog in &replicas {
        eventually(catalog, "b", &["1.0.0"]).await;
    }
    let b_hash = replicas[0].entry("b").unwrap().unwrap().hash.clone();
    let mut changes = replicas[0].subscribe();
    write(&world, "a", &["0.1.10"], "Updated succesfully").await;
    for catalog in &replicas {
        eventually(catalog, "a", &["0.1.10"]).await;
        assert_eq!(catalog.entry("b").unwrap().unwrap().hash, b_hash, "b untouched");
    }
    assert_eq!(changes.recv().await.unwrap().jukebox, "a");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(changes.try_recv().is_err(), "no change announced for b");
}

#[tokio::test]
async fn an_identical_status_or_a_spec_change_writes_nothing_to_redis() {
    let world = world(&["box"]).await;
    let catalog = replica(&world).await;
    write(&world, "box", &["1.0.0"], "Updated succesfully").await;
    eventually(&catalog, "box", &["1.0.0"]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let before = set_calls(&world.redis).await;
    // The same status written again (a new resourceVersion is not a change)…
    let same = json!({"status": {"conditions": [
        {"type": "Updated", "status": "True", "message": "Updated succesfully", "generation": 1},
    ]}, "metadata": {"labels": {"touched": "yes"}}});
    world.boxes.patch("box", &PatchParams::default(), &Patch::Merge(&same)).await.unwrap();
    let spec = json!({"spec": {"schedule": "*/5 * * * *"}});
    world.boxes.patch("box", &PatchParams::default(), &Patch::Merge(&spec)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(set_calls(&world.redis).await - before, 0, "the catalog wrote nothing");

    write(&world, "box", &["2.0.0"], "Updated succesfully").await;
    eventually(&catalog, "box", &["2.0.0"]).await;
    assert_eq!(set_calls(&world.redis).await - before, 2, "entry and hash");
}

#[tokio::test]
async fn deleting_the_jukebox_removes_its_entry_without_a_resync() {
    let world = world(&["box"]).await;
    let catalog = replica(&world).await;
    write(&world, "box", &["1.0.0"], "Updated succesfully").await;
    eventually(&catalog, "box", &["1.0.0"]).await;
    let mut changes = catalog.subscribe();
    world.boxes.delete("box", &DeleteParams::default()).await.unwrap();
    let change = tokio::time::timeout(Duration::from_secs(5), changes.recv()).await.unwrap().unwrap();
    assert_eq!(change, Change { jukebox: "box".into(), hash: None });
    assert!(catalog.entry("box").unwrap().is_none());
}

#[tokio::test]
async fn the_binary_follows_the_cluster_with_the_kubernetes_flag() {
    let world = world(&["box"]).await;
    write(&world, "box", &["1.0.0"], "Updated succesfully").await;
    let dir = tempfile::tempdir().unwrap();
    let token = world.api.service_account_token("vynil-system", "vynil-catalog");
    let kubeconfig = world.api.write_kubeconfig_as(dir.path(), "vynil-system", &token).unwrap();
    let service = ServiceProcess::start_with_env(
        Path::new(env!("CARGO_BIN_EXE_vynil-catalog")),
        &["--kubernetes"],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    )
    .await
    .unwrap();
    let client = CatalogClient::new(service.channel().await.unwrap());
    let counts = || {
        let mut client = client.clone();
        async move {
            let list = client.list_jukeboxes(ListJukeboxesRequest::default()).await.map(|r| r.into_inner());
            list.map(|l| l.jukeboxes.iter().map(|j| (j.name.clone(), j.package_count)).collect::<Vec<_>>())
        }
    };
    assert_eq!(counts().await.unwrap(), [("box".to_string(), 1)]);
    write(&world, "box", &["1.1.0", "1.0.0"], "Updated succesfully").await;
    for _ in 0..500 {
        if counts().await.unwrap() == [("box".to_string(), 2)] {
            let log = world.api.requests();
            let watches: Vec<_> =
                log.iter().filter(|r| r.verb == "watch" && r.resource == "jukeboxes").collect();
            assert!(!watches.is_empty());
            assert!(watches.iter().all(|r| r.user_agent.starts_with("vynil-catalog/")), "{watches:?}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the catalog process never saw the new status; its log:\n{}", service.log());
}

#[tokio::test]
async fn replicas_take_each_change_from_the_watch_without_asking_the_api_server() {
    // Each replica follows the watch, whose events carry the object: N
    // replicas must not cost N GETs per change (nor one).
    let world = world(&["box"]).await;
    let replicas = [replica(&world).await, replica(&world).await, replica(&world).await];
    write(&world, "box", &["1.0.0"], "Updated succesfully").await;
    for catalog in &replicas {
        eventually(catalog, "box", &["1.0.0"]).await;
    }
    world.api.clear_requests();
    let changes = 10;
    for i in 1..=changes {
        let tag = format!("1.0.{i}");
        write(&world, "box", &[tag.as_str()], "Updated succesfully").await;
        for catalog in &replicas {
            eventually(catalog, "box", &[tag.as_str()]).await;
        }
    }
    let reads: Vec<_> = world
        .api
        .requests()
        .into_iter()
        .filter(|r| r.resource == "jukeboxes" && matches!(r.verb.as_str(), "get" | "list"))
        .collect();
    assert!(reads.is_empty(), "{changes} changes on 3 replicas cost {} reads: {reads:?}", reads.len());

    // A resync reads the list, not each JukeBox again.
    world.api.clear_requests();
    replicas[0].resync().await.unwrap();
    let verbs: Vec<String> =
        world.api.requests().into_iter().filter(|r| r.resource == "jukeboxes").map(|r| r.verb).collect();
    assert_eq!(verbs, ["list"], "a resync of one JukeBox");
}
