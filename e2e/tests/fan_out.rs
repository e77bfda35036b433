//! A new version published to the real registry and scanned reaches its
//! instance at once: lifecycle's idle requeue is an hour (see `Stack`), so
//! only the catalog fan-out can explain the new agent Job. And a tag moved
//! under an installed revision brings its repository's scan at once.

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

/// TenantInstance `apps/web` of JukeBox `box`, once 1.0.0 is installed.
async fn install_web(stack: &Stack) -> kube::Api<kube::api::DynamicObject> {
    let instances = stack.tenant_instances();
    let instance = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "web", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "apps", "package": "web"}});
    instances.create(&PostParams::default(), &serde_json::from_value(instance).unwrap()).await.unwrap();
    eventually("1.0.0 installed", || async {
        (instances.get("web").await.unwrap().data["status"]["package"]["tag"] == "1.0.0").then_some(())
    })
    .await;
    instances
}

#[tokio::test]
async fn a_scanned_new_version_starts_its_agent_job_soon_after_the_catalog_changes() {
    let stack = Stack::start("apps/web").await;
    let agent = FakeAgent::start(&stack.api, "vynil-system", |_| AgentOutcome::succeed()).unwrap();
    stack.publish("apps", "web", PackageType::Tenant, "1.0.0").await;
    stack.scan_until(&["1.0.0"]).await;
    install_web(&stack).await;

    stack.publish("apps", "web", PackageType::Tenant, "1.1.0").await;
    stack.scan_until(&["1.1.0"]).await;
    let changed = Instant::now();
    let runs = agent.wait_for_runs(2, Duration::from_secs(60)).await.unwrap();
    println!("catalog shows 1.1.0 -> agent Job for it: {:?}", changed.elapsed());
    assert_eq!(runs[1].job.tag.as_deref(), Some("1.1.0"));
    stack.stop().await;
}

/// #65 item 1: the tag of an installed revision is re-pointed to other
/// bytes; its next Job (a forced re-run) still pulls the chosen digest, and
/// lifecycle asks the real scanner for a scan of the repository
/// (`NotifyPush`): the JukeBox's status lists the tag at its new digest
/// with no scan asked by anyone else (the JukeBox scans once a year).
#[tokio::test]
async fn a_tag_moved_under_an_installed_revision_brings_its_repositorys_scan() {
    let stack = Stack::start("apps/web").await;
    let agent = FakeAgent::start(&stack.api, "vynil-system", |_| AgentOutcome::succeed()).unwrap();
    let chosen = stack.publish("apps", "web", PackageType::Tenant, "1.0.0").await;
    stack.scan_until(&["1.0.0"]).await;
    let instances = install_web(&stack).await;
    let mut other = vynil_testkit::PackageSpec::new("apps", "web", PackageType::Tenant, "1.0.0");
    other.description = "re-pointed".into();
    let moved = stack.registry.publisher().publish("apps/web", &other).await.unwrap();
    assert_ne!(moved, chosen);
    let force = json!({"metadata": {"annotations": {"vynil.solidite.fr/force-reinstall": "true"}}});
    let params = kube::api::PatchParams::default();
    instances.patch("web", &params, &kube::api::Patch::Merge(&force)).await.unwrap();
    let event = eventually("the TagMoved Event", || async {
        stack.api.objects("events.k8s.io", "events").into_iter().find(|e| e["reason"] == "TagMoved")
    })
    .await;
    let note = event["note"].as_str().unwrap_or_default();
    assert!(note.contains("a scan of the repository was asked (1 JukeBox(es))"), "{note}");
    eventually("the JukeBox's status lists 1.0.0 at the moved digest", || async {
        let jukebox = stack.boxes.get("box").await.ok()?;
        let listed = jukebox.status?.packages.into_iter().find(|p| p.tag == "1.0.0")?;
        (listed.digest.as_deref() == Some(moved.as_str())).then_some(())
    })
    .await;
    let runs = agent.wait_for_runs(2, Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        runs[1].job.tag.as_deref(),
        Some("1.0.0"),
        "the re-run pulled the chosen digest, told the tag"
    );
    stack.stop().await;
}
