//! A new version published to the real registry and scanned reaches its
//! instance at once: lifecycle's idle requeue is an hour (see `Stack`), so
//! only the catalog fan-out can explain the new agent Job.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{Stack, eventually};
use kube::api::PostParams;
use serde_json::json;
use vynil_testkit::{
    PackageType,
    kube_api::{AgentOutcome, FakeAgent},
};

#[tokio::test]
async fn a_scanned_new_version_starts_its_agent_job_soon_after_the_catalog_changes() {
    let stack = Stack::start("apps/web").await;
    let agent = FakeAgent::start(&stack.api, "vynil-system", |_| AgentOutcome::succeed()).unwrap();
    stack.publish("apps", "web", PackageType::Tenant, "1.0.0").await;
    stack.scan_until(&["1.0.0"]).await;
    let instances = stack.tenant_instances();
    let instance = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "web", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "apps", "package": "web"}});
    instances.create(&PostParams::default(), &serde_json::from_value(instance).unwrap()).await.unwrap();
    eventually("1.0.0 installed", || async {
        (instances.get("web").await.unwrap().data["status"]["package"]["tag"] == "1.0.0").then_some(())
    })
    .await;

    stack.publish("apps", "web", PackageType::Tenant, "1.1.0").await;
    stack.scan_until(&["1.1.0"]).await;
    let changed = Instant::now();
    let runs = agent.wait_for_runs(2, Duration::from_secs(60)).await.unwrap();
    println!("catalog shows 1.1.0 -> agent Job for it: {:?}", changed.elapsed());
    assert_eq!(runs[1].job.tag.as_deref(), Some("1.1.0"));
    stack.stop().await;
}
