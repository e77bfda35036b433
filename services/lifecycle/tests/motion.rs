//! Lifecycle in motion, whole loops on the fake API server: catalog fan-out
//! with an hour-long idle requeue (only the fan-out can explain a prompt
//! upgrade), resumption after a catalog restart, two replicas and one leader,
//! an unsynced replica that refuses to answer, the cap on running agent Jobs,
//! held upgrades and the bounded history.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use clap::Parser;
use common::*;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use vynil_proto::{
    lifecycle::v1::{InstanceState, ListInstalledRevisionsRequest, ListInstancesRequest},
    purger::v1::{PlanRequest, Repository, plan_request::Target, purger_client::PurgerClient},
};
use vynil_testkit::kube_api::{AgentOutcome, ApiFault, ApiFaultAction};

const HOUR: &[&str] = &["--requeue-seconds", "3600"];

fn v(tag: &str, minimum: Option<&str>) -> serde_json::Value {
    let requirements = minimum.map_or(json!([]), |m| json!([{"minimum_previous_version": m}]));
    package("registry.example", "apps", "web", "tenant", tag, requirements)
}

async fn installed_tag(world: &World, name: &str) -> Option<String> {
    world.get("TenantInstance", name).await["status"]["package"]["tag"].as_str().map(str::to_string)
}

async fn wait_installed(world: &World, name: &str, tag: &str) {
    eventually(&format!("{name} at {tag}"), || async {
        (installed_tag(world, name).await.as_deref() == Some(tag)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_catalog_change_upgrades_at_once_although_the_requeue_is_an_hour() {
    let (world, _) = World::start(vec![v("2.5.0", None)], HOUR).await;
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    wait_installed(&world, "web", "2.5.0").await;
    world.publish(vec![v("3.5.0", Some("2.0.0")), v("2.5.0", None)]).await;
    let published = Instant::now();
    world.agent.wait_for_runs(2, Duration::from_secs(30)).await.unwrap();
    println!("catalog change -> new agent Job: {:?}", published.elapsed());
    assert_eq!(world.tags_run("web"), ["2.5.0", "3.5.0"]);
    world.stop().await;
}

#[tokio::test]
async fn after_a_catalog_restart_the_subscription_resumes_and_still_fans_out() {
    let (mut world, _) = World::start(vec![v("2.5.0", None)], HOUR).await;
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    wait_installed(&world, "web", "2.5.0").await;
    world.restart_catalog().await;
    world.publish(vec![v("3.5.0", Some("2.0.0")), v("2.5.0", None)]).await;
    world.agent.wait_for_runs(2, Duration::from_secs(40)).await.unwrap();
    assert_eq!(world.tags_run("web"), ["2.5.0", "3.5.0"]);
    world.stop().await;
}

fn writes_by(world: &World, pod: &str) -> Vec<String> {
    world
        .api
        .requests()
        .into_iter()
        .filter(|r| r.user_agent.contains(&format!("pod/{pod}")))
        .filter(|r| {
            ["create", "update", "patch", "delete"].contains(&r.verb.as_str()) && r.resource != "leases"
        })
        .map(|r| format!("{} {}/{}", r.verb, r.resource, r.name.unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn with_two_replicas_only_the_leader_writes_and_the_other_takes_over() {
    let lease = ["--lease-seconds", "2"];
    let (mut world, _) = World::start(web("registry.example"), &lease).await;
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(world.client.clone(), JOBS);
    // b starts once a leads (which of two replicas started together wins the Lease is the machine's timing).
    eventually("a holds the Lease", || async {
        let lease = leases.get_opt("vynil-lifecycle").await.unwrap()?.spec?;
        (lease.holder_identity.as_deref() == Some("a")).then_some(())
    })
    .await;
    let (_b, _stop_b) = world.start_replica("b", &lease).await;
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    wait_installed(&world, "web", "4.0.0").await;
    assert!(!writes_by(&world, "a").is_empty(), "a leads");
    assert_eq!(writes_by(&world, "b"), Vec::<String>::new(), "b never writes while a leads");

    world.lifecycle_shutdown.trigger();
    let stopped = Instant::now();
    world.create("TenantInstance", "pending", web_spec(), json!({})).await;
    wait_installed(&world, "pending", "4.0.0").await;
    println!("leader stopped -> pending instance installed by the other replica: {:?}", stopped.elapsed());
    assert!(writes_by(&world, "b").iter().any(|w| w.contains("pending")), "{:?}", writes_by(&world, "b"));
    // b writes because it took the Lease over from a (no clock bound: how
    // soon is the machine's load; the lease rule is the ordering).
    let lease = leases.get("vynil-lifecycle").await.unwrap().spec.unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some("b"));
    assert!(lease.lease_transitions >= Some(1), "{lease:?}");
    world.stop().await;
}

/// #44 item 4: an upgrade inside a maintenance window (Europe/Paris, open
/// every minute for an hour: always open) whose leader stops the moment its
/// Job exists is followed to its end by the next leader: one Job.
#[tokio::test]
async fn a_leader_stopped_inside_a_window_leaves_one_job_for_the_upgrade() {
    let lease = ["--lease-seconds", "2"];
    let (mut world, _) = World::start(vec![v("2.5.0", None)], &lease).await;
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(world.client.clone(), JOBS);
    eventually("a holds the Lease", || async {
        let lease = leases.get_opt("vynil-lifecycle").await.unwrap()?.spec?;
        (lease.holder_identity.as_deref() == Some("a")).then_some(())
    })
    .await;
    let (_b, _stop_b) = world.start_replica("b", &lease).await;
    let boxes: kube::Api<vynil_crds::JukeBox> = kube::Api::all(world.client.clone());
    let window = json!({"spec": {"upgrade_policy": {"windows": [
        {"schedule": "* * * * *", "zone": "Europe/Paris", "duration": "1h"}]}}});
    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&window)).await.unwrap();
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    wait_installed(&world, "web", "2.5.0").await;
    world.publish(vec![v("3.5.0", Some("2.0.0")), v("2.5.0", None)]).await;
    eventually("the upgrade's Job created by a", || async {
        world.tags_run("web").contains(&"3.5.0".to_string()).then_some(())
    })
    .await;
    world.lifecycle_shutdown.trigger();
    wait_installed(&world, "web", "3.5.0").await;
    assert!(
        writes_by(&world, "b").iter().any(|w| w.contains("web")),
        "b followed it: {:?}",
        writes_by(&world, "b")
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(world.tags_run("web"), ["2.5.0", "3.5.0"], "one Job for the upgrade");
    world.stop().await;
}

#[tokio::test]
async fn an_unsynced_replica_answers_unavailable_and_the_purger_plans_with_usage_unknown() {
    let registry = vynil_testkit::RegistryServer::start().await.unwrap();
    let host = registry.host();
    let spec = vynil_testkit::PackageSpec::new("apps", "web", vynil_testkit::PackageType::Tenant, "1.0.0");
    registry.publisher().publish("apps/web", &spec).await.unwrap();
    // Its JukeBox names the repository the purger plans (the purger plans no other).
    let (mut world, _) = World::start(web(&host), &[]).await;
    // Replica c never completes its first list of TenantInstances.
    let fault = ApiFault::new(Some("list"), Some("tenantinstances"), 10_000, ApiFaultAction::Status(500));
    world.api.inject(fault.for_user_agent("pod/c"));
    let (c, _stop_c) = world.start_replica("c", &[]).await;
    let status = grpc_at(c)
        .await
        .list_installed_revisions(ListInstalledRevisionsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let listed = world.grpc().await.list_installed_revisions(ListInstalledRevisionsRequest::default()).await;
    assert!(listed.is_ok(), "{listed:?}");

    let a = format!("http://{}", world.lifecycle);
    let c = format!("http://{c}");
    // One lifecycle per cluster sharing the registry: any that cannot say makes usage unknown.
    let cases =
        [(vec![c.as_str()], true), (vec![a.as_str()], false), (vec![a.as_str(), "http://127.0.0.1:1"], true)];
    for (endpoints, unknown) in cases {
        let (server, purger_addr) = bound().await;
        let listen = purger_addr.to_string();
        let mut args = vec![
            "vynil-purger",
            "--allow-unauthenticated",
            "--listen",
            &listen,
            "--insecure-registry",
            &host,
        ];
        for endpoint in &endpoints {
            args.extend(["--lifecycle-endpoint", endpoint]);
        }
        let config = vynil_purger::Config::parse_from(args);
        let store = Arc::new(vynil_store::KubeStore::new(world.client.clone()));
        let stop = vynil_runtime::Shutdown::new();
        let purger = tokio::spawn(vynil_purger::run_with_store(server, config, store, stop.signaled()));
        let mut client = PurgerClient::new(channel(purger_addr).await);
        let target = Target::Repository(Repository { registry: host.clone(), repository: "apps/web".into() });
        let plan = client.plan(PlanRequest { target: Some(target) }).await.unwrap().into_inner();
        assert_eq!(plan.usage_unknown, unknown, "{endpoints:?}: {plan:?}");
        stop.trigger();
        purger.await.unwrap().unwrap();
    }
    world.stop().await;
}

fn running(jobs: &[Job]) -> Vec<String> {
    jobs.iter()
        .filter(|j| {
            !j.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Complete"))
        })
        .filter_map(|j| j.metadata.name.clone())
        .collect()
}

#[tokio::test]
async fn twenty_instances_at_once_never_run_more_agent_jobs_than_the_cap() {
    let (world, script) = World::start(web("registry.example"), &["--max-running-jobs", "5"]).await;
    *script.lock().unwrap() = Box::new(|_| AgentOutcome::Hang);
    for i in 0..20 {
        world.create("TenantInstance", &format!("web-{i:02}"), web_spec(), json!({})).await;
    }
    // Those beyond the cap say why they wait.
    let grpc = world.grpc().await;
    eventually("instances queued for a slot", || {
        let mut grpc = grpc.clone();
        async move {
            let listed = grpc.list_instances(ListInstancesRequest::default()).await.ok()?.into_inner();
            let queued = listed.instances.iter().filter(|i| i.state == InstanceState::Queued as i32).count();
            (queued >= 10).then_some(())
        }
    })
    .await;
    let jobs = world.jobs();
    let (mut peak, mut done) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(90);
    while done < 20 {
        assert!(Instant::now() < deadline, "only {done} of 20 installed");
        let listed = jobs.list(&ListParams::default()).await.unwrap().items;
        let now_running = running(&listed);
        peak = peak.max(now_running.len());
        assert!(now_running.len() <= 5, "{} running: {now_running:?}", now_running.len());
        // Play the agent: finish what runs.
        for name in now_running {
            let complete =
                json!({"status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}});
            jobs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&complete)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut count = 0;
        for i in 0..20 {
            if installed_tag(&world, &format!("web-{i:02}")).await.is_some() {
                count += 1;
            }
        }
        done = count;
    }
    assert_eq!(peak, 5, "the cap was reached, never passed");
    world.stop().await;
}

#[tokio::test]
async fn held_upgrades_still_apply_option_changes_and_the_history_shows_the_last_revisions() {
    let (world, _) = World::start(vec![v("2.5.0", None)], HOUR).await;
    world
        .create("TenantInstance", "web", web_spec(), json!({"vynil.solidite.fr/hold-upgrades": "true"}))
        .await;
    wait_installed(&world, "web", "2.5.0").await;
    world.publish(vec![v("3.5.0", Some("2.0.0")), v("2.5.0", None)]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(world.tags_run("web"), ["2.5.0"], "held: no new version");
    world.patch("TenantInstance", "web", json!({"spec": {"options": {"replicas": 3}}})).await;
    world.agent.wait_for_runs(2, Duration::from_secs(30)).await.unwrap();
    assert_eq!(world.tags_run("web"), ["2.5.0", "2.5.0"], "the option change ran on the held revision");
    // Its Job runs in a pod now: released only once it is installed (a
    // release while it runs supersedes it, as a newer target does).
    let hash =
        vynil_rules::install::options_hash(serde_json::from_value(json!({"replicas": 3})).ok().as_ref());
    // Credited, not only written by the agent (which writes `status.digest`
    // before its Job completes): under load, a release in between superseded it.
    eventually("the option change installed", || async {
        let history =
            world.grpc().await.list_instances(ListInstancesRequest::default()).await.ok()?.into_inner();
        let tags: Vec<String> = history.instances.first()?.history.iter().map(|h| h.tag.clone()).collect();
        (world.get("TenantInstance", "web").await["status"]["digest"] == hash.as_str()
            && tags == ["2.5.0", "2.5.0"])
        .then_some(())
    })
    .await;
    // Released: the upgrade goes on.
    world
        .patch(
            "TenantInstance",
            "web",
            json!({"metadata": {"annotations": {"vynil.solidite.fr/hold-upgrades": null}}}),
        )
        .await;
    wait_installed(&world, "web", "3.5.0").await;
    let listed =
        world.grpc().await.list_instances(ListInstancesRequest::default()).await.unwrap().into_inner();
    let history: Vec<&str> = listed.instances[0].history.iter().map(|h| h.tag.as_str()).collect();
    assert_eq!(history, ["2.5.0", "2.5.0", "3.5.0"]);
    world.stop().await;
}

#[tokio::test]
async fn a_lease_left_by_a_crashed_leader_is_taken_over_once_it_expires() {
    // What a leader that died without releasing leaves behind: a fresh renewal by a ghost.
    let planted_at = Instant::now();
    let seed = |client: kube::Client| -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(async move {
            let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
                kube::Api::namespaced(client, JOBS);
            let now = jiff::Timestamp::now().to_string();
            let ghost = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "vynil-lifecycle"},
                "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": 2, "renewTime": now, "acquireTime": now}});
            leases.create(&Default::default(), &serde_json::from_value(ghost).unwrap()).await.unwrap();
        })
    };
    let (world, _) = World::start_with(web("registry.example"), &["--lease-seconds", "2"], seed).await;
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    wait_installed(&world, "web", "4.0.0").await;
    let waited = planted_at.elapsed();
    println!("ghost lease renewed -> instance installed by the new leader: {waited:?}");
    assert!(waited >= Duration::from_millis(1900), "took over before the ghost's lease expired: {waited:?}");
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(world.client.clone(), JOBS);
    let lease = leases.get("vynil-lifecycle").await.unwrap().spec.unwrap();
    assert_eq!((lease.holder_identity.as_deref(), lease.lease_transitions), (Some("a"), Some(1)));
    world.stop().await;
}
