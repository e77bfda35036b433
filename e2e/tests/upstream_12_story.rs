//! The story this project exists for (upstream #12), end to end: an instance
//! installed as `tenant` whose package was republished as `service`, then
//! purged, could never be deleted. Here every service runs (scanner, catalog,
//! lifecycle, purger) on the fake API server with a real registry, and the
//! fake agent plays upstream's agent.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Stack, as_gateway, channel, eventually};
use futures::StreamExt;
use kube::{
    Api,
    api::{DeleteParams, DynamicObject, PostParams},
};
use serde_json::{Value, json};
use vynil_proto::{
    lifecycle::v1::{
        AllowDeleteWithoutPackageRequest, ExplainRequest, InstanceKind, InstanceRef,
        lifecycle_client::LifecycleClient,
    },
    purger::v1::{
        ExecuteRequest, PlanRequest, Repository, plan_request::Target, purger_client::PurgerClient,
    },
};
use vynil_testkit::{
    PackageType,
    kube_api::{AgentOutcome, FakeAgent},
};

fn instances(stack: &Stack) -> Api<DynamicObject> {
    stack.tenant_instances()
}

/// The agent: installs record a Deployment; deletes succeed; reaper Jobs
/// run the real reaper.
fn agent(stack: &Stack) -> FakeAgent {
    FakeAgent::start(&stack.api, "vynil-system", |_| AgentOutcome::Succeed {
        children: vec![("vitals".into(), vec![json!({"kind": "Deployment", "name": "ollama"})])],
    })
    .unwrap()
}

async fn install_ollama(stack: &Stack) {
    let instance = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "ollama", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "think", "package": "ollama"}});
    instances(stack)
        .create(&PostParams::default(), &serde_json::from_value(instance).unwrap())
        .await
        .unwrap();
    eventually("0.1.8 installed", || async {
        let object = instances(stack).get("ollama").await.unwrap();
        (object.data["status"]["package"]["tag"] == "0.1.8").then_some(())
    })
    .await;
}

fn deleting_message(object: &Value) -> Option<String> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| {
            c["type"] == "Ready"
                && c["status"] == "False"
                && c["message"].as_str().is_some_and(|m| m.starts_with("[E_"))
        })
        .and_then(|c| c["message"].as_str().map(str::to_string))
}

#[tokio::test]
async fn installed_as_tenant_republished_as_service_purged_and_still_deleted_with_its_own_hooks() {
    let stack = Stack::start("think/ollama").await;
    let agent = agent(&stack);
    let host = stack.registry.host();
    stack.publish("think", "ollama", PackageType::Tenant, "0.1.8").await;
    stack.scan_until(&["0.1.8"]).await;
    install_ollama(&stack).await;

    stack.publish("think", "ollama", PackageType::Service, "0.1.9").await;
    stack.publish("think", "ollama", PackageType::Service, "0.1.10").await;
    stack.scan_until(&["0.1.10", "0.1.8"]).await;

    // Purge: 0.1.8 is kept (installed, and the last tenant revision); 0.1.9 goes.
    let mut purger = PurgerClient::new(channel(stack.purger).await);
    let target = Target::Repository(Repository { registry: host.clone(), repository: "think/ollama".into() });
    let plan =
        purger.plan(as_gateway(PlanRequest { target: Some(target) }, "ops")).await.unwrap().into_inner();
    assert!(!plan.usage_unknown, "lifecycle answered: {plan:?}");
    let entry = |tag: &str| plan.entries.iter().find(|e| e.tag == tag).unwrap().clone();
    let kept = entry("0.1.8");
    assert!(kept.keep && kept.reasons.iter().any(|r| r == "installed by tenant apps/ollama"), "{kept:?}");
    assert!(!entry("0.1.9").keep, "{plan:?}");
    let execute = ExecuteRequest {
        plan_id: plan.plan_id.clone(),
        confirm: plan.target.clone(),
        fingerprint: plan.fingerprint.clone(),
        acknowledge_usage_unknown: false,
    };
    let mut progress = purger.execute(as_gateway(execute, "ops")).await.unwrap().into_inner();
    while let Some(event) = progress.next().await {
        event.unwrap();
    }
    stack.scan_until(&["0.1.10", "0.1.8"]).await;

    // Upstream looped here forever. The delete Job runs 0.1.8's hooks, then the finalizer goes.
    instances(&stack).delete("ollama", &DeleteParams::default()).await.unwrap();
    eventually("the instance deleted", || async {
        instances(&stack).get_opt("ollama").await.unwrap().is_none().then_some(())
    })
    .await;
    let runs: Vec<(String, Option<String>)> =
        agent.runs().into_iter().map(|r| (r.job.action, r.job.tag)).collect();
    assert_eq!(runs, [("install".into(), Some("0.1.8".into())), ("delete".into(), Some("0.1.8".into()))]);
    stack.stop().await;
}

#[tokio::test]
async fn with_the_installed_revision_really_deleted_the_instance_says_package_gone_and_the_escape_hatch_starts_the_reaper()
 {
    let stack = Stack::start("think/ollama").await;
    let _agent = agent(&stack);
    let digest = stack.publish("think", "ollama", PackageType::Tenant, "0.1.8").await;
    stack.scan_until(&["0.1.8"]).await;
    install_ollama(&stack).await;
    stack.publish("think", "ollama", PackageType::Service, "0.1.9").await;
    // 0.1.8's manifest really deleted from the registry (what upstream's blind purge did).
    let url = format!("{}/v2/think/ollama/manifests/{digest}", stack.registry.base_url());
    let deleted = reqwest::Client::new().delete(&url).send().await.unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    stack.scan_until(&["0.1.9"]).await;

    instances(&stack).delete("ollama", &DeleteParams::default()).await.unwrap();
    let message = eventually("E_PACKAGE_GONE", || async {
        deleting_message(&serde_json::to_value(instances(&stack).get("ollama").await.unwrap()).unwrap())
    })
    .await;
    assert!(message.starts_with("[E_PACKAGE_GONE]"), "{message}");
    assert!(message.contains("think/ollama") && message.contains("delete-without-package"), "{message}");

    let mut lifecycle = LifecycleClient::new(channel(stack.lifecycle).await);
    let reference =
        InstanceRef { kind: InstanceKind::Tenant as i32, namespace: "apps".into(), name: "ollama".into() };
    let explained =
        lifecycle.explain(ExplainRequest { r#ref: Some(reference.clone()) }).await.unwrap().into_inner();
    assert_eq!(explained.blocking_code, "E_PACKAGE_GONE", "{explained:?}");
    assert_eq!(explained.children_to_delete, ["vitals: Deployment apps/ollama"]);
    lifecycle
        .allow_delete_without_package(as_gateway(
            AllowDeleteWithoutPackageRequest {
                r#ref: Some(reference),
                confirm: "tenant/apps/ollama".into(),
                caller: "ops".into(),
                reason: "0.1.8 is gone".into(),
                fingerprint: explained.children_fingerprint,
            },
            "ops",
        ))
        .await
        .unwrap();
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(stack.client.clone(), "vynil-system");
    let reaper = eventually("the reaper Job", || async {
        jobs.get_opt("tenant--apps--ollama").await.unwrap().filter(|j| {
            j.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("vynil.solidite.fr/revision"))
                .map(String::as_str)
                == Some("reaper")
        })
    })
    .await;
    let pod = reaper.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("vynil-agent"));
    assert!(pod.init_containers.is_none(), "no unpack step");
    assert_eq!(pod.containers[0].args.as_deref().unwrap()[..2], ["reap".to_string(), "--kind".to_string()]);
    stack.stop().await;
}
