//! The purger in a cluster with lifecycle running: a revision an instance
//! runs is kept with the reason "installed by …", the one its upgrade Job
//! installs with "being installed by …", and the plan needs no
//! acknowledgement because usage is known. Scanner, catalog, lifecycle and
//! purger each run on their own Kubernetes client against the fake API
//! server, with a real registry and the fake agent.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::Parser;
use common::channel;
use kube::{
    Api,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::json;
use vynil_crds::JukeBox;
use vynil_proto::purger::v1::{PlanRequest, Repository, plan_request::Target, purger_client::PurgerClient};
use vynil_runtime::Shutdown;
use vynil_store::KubeStore;
use vynil_testkit::{
    JukeboxBuilder, PackageSpec, PackageType, RegistryServer, free_port,
    kube_api::{AgentOutcome, FakeAgent, FakeApiServer},
};

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port().unwrap()))
}

#[tokio::test]
async fn a_revision_an_instance_runs_is_kept_as_installed_by_it_without_acknowledgement() {
    let registry = RegistryServer::start().await.unwrap();
    let host = registry.host();
    for tag in ["1.0.0", "2.1.0"] {
        let spec = PackageSpec::new("apps", "web", PackageType::Tenant, tag);
        registry.publisher().publish("apps/web", &spec).await.unwrap();
    }
    let api = FakeApiServer::start().await.unwrap();
    let client = api.client().unwrap();
    let boxes: Api<JukeBox> = Api::all(client.clone());
    let jukebox = JukeboxBuilder::new("box").list([format!("{host}/apps/web")]).schedule("0 0 1 1 *").json();
    boxes.create(&PostParams::default(), &serde_json::from_value(jukebox).unwrap()).await.unwrap();

    let (scanner, catalog, lifecycle, purger) = (loopback(), loopback(), loopback(), loopback());
    let shutdown = Shutdown::new();
    let mut services = tokio::task::JoinSet::new();
    let store = || Arc::new(KubeStore::new(client.clone()));
    let config = vynil_scanner::Config::parse_from([
        "vynil-scanner",
        "--listen",
        &scanner.to_string(),
        "--insecure-registry",
        &host,
        "--poll-milliseconds",
        "50",
    ]);
    let (s, done) = (store(), shutdown.signaled());
    services.spawn(
        async move { vynil_scanner::run_with_store(config, s, done).await.map_err(|e| e.to_string()) },
    );
    let config = vynil_catalog::Config::parse_from(["vynil-catalog", "--listen", &catalog.to_string()]);
    let (s, done) = (store(), shutdown.signaled());
    services.spawn(
        async move { vynil_catalog::run_with_store(config, s, done).await.map_err(|e| e.to_string()) },
    );
    let config = vynil_lifecycle::Config::parse_from([
        "vynil-lifecycle",
        "--listen",
        &lifecycle.to_string(),
        "--kubernetes",
        "--catalog-endpoint",
        &format!("http://{catalog}"),
        "--namespace",
        "vynil-system",
        "--insecure-registry",
        &host,
    ]);
    let (c, done) = (client.clone(), shutdown.signaled());
    services.spawn(async move {
        vynil_lifecycle::run_with_client(config, c, done).await.map_err(|e| e.to_string())
    });
    let config = vynil_purger::Config::parse_from([
        "vynil-purger",
        "--listen",
        &purger.to_string(),
        "--insecure-registry",
        &host,
        "--lifecycle-endpoint",
        &format!("http://{lifecycle}"),
    ]);
    let (s, done) = (store(), shutdown.signaled());
    services
        .spawn(async move { vynil_purger::run_with_store(config, s, done).await.map_err(|e| e.to_string()) });
    // The restore at 1.0.0 succeeds; the upgrade that follows stays running.
    let agent = FakeAgent::start(client.clone(), "vynil-system", |job| {
        if job.tag.as_deref() == Some("1.0.0") { AgentOutcome::succeed() } else { AgentOutcome::Hang }
    });

    // Scan: the catalog shows 2.1.0 only (no waypoint keeps 1.0.0).
    let annotate = json!({"metadata": {"annotations": {"vynil.solidite.fr/force-scan": "true"}}});
    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&annotate)).await.unwrap();
    // An instance restored at 1.0.0 (initFrom.version: found in the registry, not the catalog).
    let resource = ApiResource {
        group: "vynil.solidite.fr".into(),
        version: "v1".into(),
        api_version: "vynil.solidite.fr/v1".into(),
        kind: "TenantInstance".into(),
        plural: "tenantinstances".into(),
    };
    let instances: Api<DynamicObject> = Api::namespaced_with(client.clone(), "apps", &resource);
    let instance = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "web", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "apps", "package": "web", "initFrom": {"snapshot": "s1", "version": "1.0.0"}}});
    instances.create(&PostParams::default(), &serde_json::from_value(instance).unwrap()).await.unwrap();
    let runs = agent.wait_for_runs(2, Duration::from_secs(60)).await.unwrap();
    let tags: Vec<_> = runs.iter().map(|r| r.job.tag.clone().unwrap_or_default()).collect();
    assert_eq!(tags, ["1.0.0", "2.1.0"], "restored, then upgraded");
    let deadline = Instant::now() + Duration::from_secs(30);
    while instances.get("web").await.unwrap().data["status"]["package"]["tag"] != "1.0.0" {
        assert!(Instant::now() < deadline, "the install was never recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut purger_client = PurgerClient::new(channel(purger).await);
    let target = Target::Repository(Repository { registry: host.clone(), repository: "apps/web".into() });
    let plan = purger_client.plan(PlanRequest { target: Some(target) }).await.unwrap().into_inner();
    assert!(!plan.usage_unknown, "{plan:?}");
    let entry =
        |tag: &str| plan.entries.iter().find(|e| e.tag == tag).unwrap_or_else(|| panic!("{tag}: {plan:?}"));
    let kept = entry("1.0.0");
    assert!(kept.keep, "{kept:?}");
    assert!(kept.reasons.iter().any(|r| r == "installed by tenant apps/web"), "{kept:?}");
    let upgrading = entry("2.1.0");
    assert!(upgrading.reasons.iter().any(|r| r == "being installed by tenant apps/web"), "{upgrading:?}");

    shutdown.trigger();
    while let Some(done) = services.join_next().await {
        done.unwrap().unwrap();
    }
}
