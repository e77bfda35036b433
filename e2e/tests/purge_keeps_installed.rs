//! The purger in a cluster with lifecycle running: a revision an instance
//! runs is kept with the reason "installed by …", the one its upgrade Job
//! installs with "being installed by …", and the plan needs no
//! acknowledgement because usage is known. Scanner, catalog, lifecycle and
//! purger each run on their own Kubernetes client against the fake API
//! server, with a real registry and the fake agent.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{Stack, as_gateway, channel};
use kube::api::PostParams;
use serde_json::json;
use vynil_proto::purger::v1::{PlanRequest, Repository, plan_request::Target, purger_client::PurgerClient};
use vynil_testkit::{
    PackageType,
    kube_api::{AgentOutcome, FakeAgent},
};

#[tokio::test]
async fn a_revision_an_instance_runs_is_kept_as_installed_by_it_without_acknowledgement() {
    let stack = Stack::start("apps/web").await;
    let host = stack.registry.host();
    for tag in ["1.0.0", "2.1.0"] {
        stack.publish("apps", "web", PackageType::Tenant, tag).await;
    }
    // The restore at 1.0.0 succeeds; the upgrade that follows stays running.
    let agent = FakeAgent::start(&stack.api, "vynil-system", |job| {
        if job.tag.as_deref() == Some("1.0.0") { AgentOutcome::succeed() } else { AgentOutcome::Hang }
    })
    .unwrap();
    // Scan: the catalog shows 2.1.0 only (no waypoint keeps 1.0.0).
    stack.scan_until(&["2.1.0"]).await;
    // An instance restored at 1.0.0 (initFrom.version: found in the registry, not the catalog).
    let instances = stack.tenant_instances();
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

    let mut purger_client = PurgerClient::new(channel(stack.purger).await);
    let target = Target::Repository(Repository { registry: host.clone(), repository: "apps/web".into() });
    let plan = purger_client
        .plan(as_gateway(PlanRequest { target: Some(target) }, "ops"))
        .await
        .unwrap()
        .into_inner();
    assert!(!plan.usage_unknown, "{plan:?}");
    let entry =
        |tag: &str| plan.entries.iter().find(|e| e.tag == tag).unwrap_or_else(|| panic!("{tag}: {plan:?}"));
    let kept = entry("1.0.0");
    assert!(kept.keep, "{kept:?}");
    assert!(kept.reasons.iter().any(|r| r == "installed by tenant apps/web"), "{kept:?}");
    let upgrading = entry("2.1.0");
    assert!(upgrading.reasons.iter().any(|r| r == "being installed by tenant apps/web"), "{upgrading:?}");

    stack.stop().await;
}
