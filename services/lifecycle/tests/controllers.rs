//! Whole loops: the lifecycle controllers against the fake API server (the
//! real kube client and kube-runtime), a real catalog following JukeBox
//! status over gRPC, and the fake agent playing upstream's agent on the Jobs
//! lifecycle creates. `docs/upstream-vynil.md` §9 items 8, 9, 17–21, adoption,
//! failure, tolerant decoding, and the usage the purger reads.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use vynil_proto::lifecycle::v1::{
    ExplainRequest, InstanceState, ListInstalledRevisionsRequest, ListInstancesRequest, RevisionUse,
};
use vynil_testkit::kube_api::{AgentOutcome, FakeApiServer};

#[tokio::test]
async fn item_8_the_selection_chain_goes_one_waypoint_at_a_time_then_rests() {
    let (world, _) = World::start(web("registry.example"), &[]).await;
    // Installed by upstream at 1.0.0: created suspended so the status lands first.
    world.create("TenantInstance", "web", web_spec(), json!({"vynil.solidite.fr/suspend": "true"})).await;
    world
        .patch_status(
            "TenantInstance",
            "web",
            // As upstream's agent leaves it: its status types require `conditions`.
            json!({"tag": "1.0.0", "digest": vynil_rules::install::options_hash(None), "conditions": []}),
        )
        .await;
    world
        .patch(
            "TenantInstance",
            "web",
            json!({"metadata": {"annotations": {"vynil.solidite.fr/suspend": null}}}),
        )
        .await;
    let installed = eventually("4.0.0 recorded as installed", || async {
        let object = world.get("TenantInstance", "web").await;
        (object["status"]["package"]["tag"] == "4.0.0").then_some(object)
    })
    .await;
    assert_eq!(world.tags_run("web"), ["2.5.0", "3.5.0", "4.0.0"]);
    assert_eq!(installed["status"]["package"]["digest"], "sha256:400");
    assert!(installed["status"]["target"].is_null(), "{installed}");
    // At rest: another reconcile (a label change) runs nothing more.
    world.patch("TenantInstance", "web", json!({"metadata": {"labels": {"touched": "yes"}}})).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(world.tags_run("web").len(), 3);
    let explained = world
        .grpc()
        .await
        .explain(ExplainRequest { r#ref: Some(tenant(APPS, "web")) })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(explained.state, InstanceState::UpToDate as i32, "{explained:?}");
    assert_eq!((explained.from_tag.as_str(), explained.latest_tag.as_str()), ("4.0.0", "4.0.0"));
    world.stop().await;
}

#[tokio::test]
async fn item_9_a_tenant_instance_never_picks_a_service_package() {
    let packages = vec![package("registry.example", "think", "ollama", "service", "0.1.10", json!([]))];
    let (world, _) = World::start(packages, &[]).await;
    world
        .create(
            "TenantInstance",
            "ollama",
            json!({"jukebox": "box", "category": "think", "package": "ollama"}),
            json!({}),
        )
        .await;
    let blocked = eventually("the missing package condition", || async {
        let object = world.get("TenantInstance", "ollama").await;
        condition(&object, "AgentStarted").cloned()
    })
    .await;
    assert_eq!(blocked["status"], "False");
    assert!(blocked["message"].as_str().unwrap().starts_with("Package think/ollama is missing"), "{blocked}");
    assert!(world.jobs().list(&Default::default()).await.unwrap().items.is_empty());
    let listed =
        world.grpc().await.list_instances(ListInstancesRequest::default()).await.unwrap().into_inner();
    let summary = &listed.instances[0];
    assert_eq!((summary.state, summary.blocked_by.as_str()), (InstanceState::Blocked as i32, "package"));
    world.stop().await;
}

#[tokio::test]
async fn items_17_18_suspend_holds_everything_and_force_reinstall_runs_again() {
    let (world, _) = World::start(web("registry.example"), &[]).await;
    world.create("TenantInstance", "web", web_spec(), json!({"vynil.solidite.fr/suspend": "true"})).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(world.jobs().list(&Default::default()).await.unwrap().items.is_empty(), "suspended: no Job");
    world
        .patch(
            "TenantInstance",
            "web",
            json!({"metadata": {"annotations": {"vynil.solidite.fr/suspend": "no"}}}),
        )
        .await;
    eventually("the first install", || async {
        (world.get("TenantInstance", "web").await["status"]["package"]["tag"] == "4.0.0").then_some(())
    })
    .await;
    assert_eq!(world.tags_run("web"), ["4.0.0"]);
    world
        .patch(
            "TenantInstance",
            "web",
            json!({"metadata": {"annotations": {"vynil.solidite.fr/force-reinstall": "now"}}}),
        )
        .await;
    world.agent.wait_for_runs(2, Duration::from_secs(30)).await.unwrap();
    let object = eventually("the annotation removed", || async {
        let object = world.get("TenantInstance", "web").await;
        object["metadata"]["annotations"].get("vynil.solidite.fr/force-reinstall").is_none().then_some(object)
    })
    .await;
    assert_eq!(world.tags_run("web"), ["4.0.0", "4.0.0"], "{object}");
    // #65 item 12: a forced run is in the audit trail, an Event on the instance.
    let forced = eventually("the ForcedRun Event", || async {
        world.api.objects("events.k8s.io", "events").into_iter().find(|e| e["reason"] == "ForcedRun")
    })
    .await;
    assert_eq!(forced["regarding"]["name"], "web", "{forced}");
    assert!(forced["note"].as_str().unwrap_or_default().contains("force-reinstall"), "{forced}");
    world.stop().await;
}

#[tokio::test]
async fn item_19_options_change_re_runs_and_no_change_does_not_even_after_the_job_was_deleted() {
    let (world, _) = World::start(web("registry.example"), &[]).await;
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    eventually("the first install", || async {
        (world.get("TenantInstance", "web").await["status"]["package"]["tag"] == "4.0.0").then_some(())
    })
    .await;
    let first = world.agent.runs()[0].job.options_hash.clone().unwrap();
    world.jobs().delete("tenant--apps--web", &DeleteParams::background()).await.unwrap();
    world.patch("TenantInstance", "web", json!({"metadata": {"labels": {"touched": "yes"}}})).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(world.agent.runs().len(), 1, "an unchanged fingerprint never re-runs");
    assert!(world.jobs().get_opt("tenant--apps--web").await.unwrap().is_none());

    // A wrong type blocks, naming the option; nothing runs.
    world.patch("TenantInstance", "web", json!({"spec": {"options": {"replicas": "two"}}})).await;
    let blocked = eventually("the option type condition", || async {
        let object = world.get("TenantInstance", "web").await;
        condition(&object, "AgentStarted").filter(|c| c["status"] == "False").cloned()
    })
    .await;
    assert!(blocked["message"].as_str().unwrap().contains("replicas"), "{blocked}");
    assert_eq!(world.agent.runs().len(), 1);

    world.patch("TenantInstance", "web", json!({"spec": {"options": {"replicas": 2}}})).await;
    let runs = world.agent.wait_for_runs(2, Duration::from_secs(30)).await.unwrap();
    let second = runs[1].job.options_hash.clone().unwrap();
    assert_ne!(first, second);
    assert_eq!(
        second,
        vynil_rules::install::options_hash(serde_json::from_value(json!({"replicas": 2})).ok().as_ref())
    );
    world.stop().await;
}

/// #65 item 1 on the real registry, the attack: a pusher who cannot sign
/// re-points the tag the catalog chose (and, under a policy, verified) to
/// other bytes before the install. The Job's unpack pulls the chosen digest
/// (`GET /v2/apps/web/manifests/sha256:<chosen>`, never the tag), the agent
/// is told the plain tag, and a Warning Event names both digests.
#[tokio::test]
async fn a_tag_re_pointed_after_the_choice_still_installs_the_chosen_digest() {
    use vynil_testkit::{
        PackageSpec, PackageType, RegistryOptions, RegistryServer, kube_api::UNPACK_USER_AGENT,
    };
    let registry =
        RegistryServer::start_with(RegistryOptions { access_log: true, ..Default::default() }).await.unwrap();
    let host = registry.host();
    let publisher = registry.publisher();
    let chosen = publisher
        .publish("apps/web", &PackageSpec::new("apps", "web", PackageType::Tenant, "0.2.0"))
        .await
        .unwrap();
    let mut revision = package(&host, "apps", "web", "tenant", "0.2.0", json!([]));
    revision["digest"] = json!(chosen);
    let insecure: &'static str = Box::leak(host.clone().into_boxed_str());
    let (world, _) = World::start(vec![revision], &["--insecure-registry", insecure]).await;
    world.agent.pull_from_registries("http");
    // The attack: other bytes under the same tag, after the choice.
    let mut other = PackageSpec::new("apps", "web", PackageType::Tenant, "0.2.0");
    other.description = "re-pointed by a pusher".into();
    let pushed = publisher.publish("apps/web", &other).await.unwrap();
    assert_ne!(pushed, chosen);
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    eventually("0.2.0 installed", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("0.2.0")).then_some(())
    })
    .await;
    let unpacked: Vec<String> = registry
        .requests()
        .into_iter()
        .filter(|r| r.user_agent == UNPACK_USER_AGENT && r.path.contains("/manifests/"))
        .map(|r| format!("{} {} {}", r.method, r.path, r.status))
        .collect();
    assert!(unpacked.contains(&format!("GET /v2/apps/web/manifests/{chosen} 200")), "{unpacked:?}");
    assert!(
        !unpacked.iter().any(|r| r.contains("/manifests/0.2.0")),
        "the unpack never asks the tag: {unpacked:?}"
    );
    assert_eq!(world.tags_run("web"), ["0.2.0"], "the agent is told the plain tag");
    let event = eventually("the TagMoved Event", || async {
        world.api.objects("events.k8s.io", "events").into_iter().find(|e| e["reason"] == "TagMoved")
    })
    .await;
    let note = event["note"].as_str().unwrap_or_default();
    assert!(note.contains(&chosen) && note.contains(&pushed), "{note}");
    assert_eq!(event["type"], "Warning", "{event}");
    world.stop().await;
}

/// #65 item 1, a pinned digest gone: the tag the catalog chose was
/// re-pointed and its chosen bytes deleted from the registry before the
/// install. No agent Job pulls a digest the registry no longer serves (its
/// unpack would fail on every retry): `[E_DIGEST_GONE] <digest>`, a Warning
/// Event, until a scan lists the revision again; then the install runs the
/// digest the status lists.
#[tokio::test]
async fn item_1_a_pinned_digest_gone_from_the_registry_runs_no_job_until_a_scan_lists_it_again() {
    use vynil_testkit::{PackageSpec, PackageType, RegistryServer};
    let registry = RegistryServer::start().await.unwrap();
    let host = registry.host();
    let publisher = registry.publisher();
    let spec = PackageSpec::new("apps", "web", PackageType::Tenant, "0.2.0");
    let chosen = publisher.publish("apps/web", &spec).await.unwrap();
    let mut revision = package(&host, "apps", "web", "tenant", "0.2.0", json!([]));
    revision["digest"] = json!(chosen);
    let insecure: &'static str = Box::leak(host.clone().into_boxed_str());
    let (world, _) = World::start(vec![revision.clone()], &["--insecure-registry", insecure]).await;
    world.agent.pull_from_registries("http");
    let mut other = spec.clone();
    other.description = "published again".into();
    let now_named = publisher.publish("apps/web", &other).await.unwrap();
    let deleted = reqwest::Client::new()
        .delete(format!("{}/v2/apps/web/manifests/{chosen}", registry.base_url()))
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    let event = eventually("the DigestGone Event", || async {
        world.api.objects("events.k8s.io", "events").into_iter().find(|e| e["reason"] == "DigestGone")
    })
    .await;
    let note = event["note"].as_str().unwrap_or_default();
    assert!(note.starts_with(&format!("[E_DIGEST_GONE] {chosen}")), "{note}");
    assert!(
        world.jobs().list(&Default::default()).await.unwrap().items.is_empty(),
        "no Job pulls a digest gone"
    );
    // A scan lists what the tag names now: the install runs those bytes.
    revision["digest"] = json!(now_named);
    world.publish(vec![revision]).await;
    eventually("0.2.0 installed at the digest listed now", || async {
        let object = world.get("TenantInstance", "web").await;
        (object["status"]["package"]["digest"] == json!(now_named)).then_some(())
    })
    .await;
    world.stop().await;
}

#[tokio::test]
async fn item_20_init_from_version_found_runs_that_tag_and_not_found_blocks() {
    let registry = vynil_testkit::RegistryServer::start().await.unwrap();
    let host = registry.host();
    let (world, _) =
        World::start(web(&host), &["--insecure-registry", &*Box::leak(host.clone().into_boxed_str())]).await;
    let mut spec = web_spec();
    spec["initFrom"] = json!({"snapshot": "abc", "version": "2.5.0"});
    world.create("TenantInstance", "restored", spec.clone(), json!({})).await;
    world.agent.wait_for_runs(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(world.tags_run("restored")[0], "2.5.0");
    // The restore is credited (its agent writes `status.tag` before its Job
    // completes: that write must not turn the first install into an upgrade
    // that supersedes it), then the upgrade path goes on from it.
    eventually("the restore recorded, then upgraded", || async {
        let listed =
            world.grpc().await.list_instances(ListInstancesRequest::default()).await.ok()?.into_inner();
        let restored =
            listed.instances.into_iter().find(|i| i.r#ref.as_ref().is_some_and(|r| r.name == "restored"))?;
        let history: Vec<String> = restored.history.into_iter().map(|h| h.tag).collect();
        (history == ["2.5.0", "3.5.0", "4.0.0"]).then_some(())
    })
    .await;
    spec["initFrom"]["version"] = json!("9.9.9");
    world.create("TenantInstance", "lost", spec, json!({})).await;
    let blocked = eventually("the InitFrom condition", || async {
        let object = world.get("TenantInstance", "lost").await;
        condition(&object, "InitFrom").cloned()
    })
    .await;
    assert_eq!(blocked["status"], "False");
    assert_eq!(
        blocked["message"],
        "[E_INIT_VERSION_NOT_FOUND] Version 9.9.9 introuvable dans le registre OCI"
    );
    assert!(world.tags_run("lost").is_empty());
    world.stop().await;
}

#[tokio::test]
async fn item_21_a_missing_crd_requirement_blocks_with_upstreams_message() {
    let requirement = json!([{"custom_resource_definition": "middlewares.traefik.io"}]);
    let packages = vec![package("registry.example", "apps", "web", "tenant", "1.0.0", requirement)];
    let (world, _) = World::start(packages, &[]).await;
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    let blocked = eventually("the requirement condition", || async {
        condition(&world.get("TenantInstance", "web").await, "AgentStarted").cloned()
    })
    .await;
    assert_eq!(
        (blocked["status"].as_str(), blocked["message"].as_str()),
        (Some("False"), Some("CRD middlewares.traefik.io is not installed"))
    );
    assert!(world.agent.runs().is_empty());
    world.stop().await;
}

/// Adoption (#65 item 3): an instance upstream installed before the
/// takeover is adopted once, with no Job; after that, a status its tenant
/// writes changes nothing. The attack: an instance created after the
/// takeover writes upstream's status as its own, and is not adopted (its
/// Job runs, a first install like any other).
#[tokio::test]
async fn an_instance_upstream_installed_is_adopted_without_running_its_job() {
    // What upstream's agent wrote: tag, options hash, conditions, children; no status.package.
    let status = json!({"tag": "4.0.0", "digest": vynil_rules::install::options_hash(None),
        "vitals": [{"kind": "Deployment", "name": "web"}],
        "conditions": [{"type": "Ready", "status": "True", "message": "Installed succesfully", "generation": 1}]});
    let upstreams = status.clone();
    let seed =
        move |client: kube::Client| -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
            Box::pin(async move {
                let api: Api<kube::api::DynamicObject> =
                    Api::namespaced_with(client, APPS, &tenant_instance_resource());
                let object = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
                "metadata": {"name": "web", "namespace": APPS}, "spec": web_spec()});
                api.create(&PostParams::default(), &serde_json::from_value(object).unwrap()).await.unwrap();
                let patch = json!({"status": upstreams});
                api.patch_status("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
            })
        };
    // Created before lifecycle first ran: its creation time is not after the takeover's.
    let (world, _) = World::start_with(web("registry.example"), &[], seed).await;
    let adopted = eventually("status.package filled", || async {
        let object = world.get("TenantInstance", "web").await;
        object["status"].get("package").cloned().filter(|p| !p.is_null())
    })
    .await;
    assert_eq!((adopted["tag"].as_str(), adopted["image"].as_str()), (Some("4.0.0"), Some("apps/web")));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(world.agent.runs().is_empty(), "adopted without a Job");
    // After the takeover, the tenant's status is a display copy: cleared, nothing runs.
    let as_tenant = tenant_with_full_rights_on_its_instances(&world).await;
    let own: Api<kube::api::DynamicObject> =
        Api::namespaced_with(as_tenant, APPS, &tenant_instance_resource());
    let cleared = json!({"status": {"tag": null, "package": null}});
    own.patch_status("web", &PatchParams::default(), &Patch::Merge(&cleared)).await.unwrap();
    // The attack: an instance created now, writing what upstream's agent would have.
    let suspended = json!({"vynil.solidite.fr/suspend": "true"});
    world.create("TenantInstance", "late", web_spec(), suspended).await;
    own.patch_status("late", &PatchParams::default(), &Patch::Merge(&json!({"status": status})))
        .await
        .unwrap();
    let resume = json!({"metadata": {"annotations": {"vynil.solidite.fr/suspend": null}}});
    world.patch("TenantInstance", "late", resume).await;
    eventually("the late instance installed by its own Job", || async {
        let ran = world.agent.runs().into_iter().any(|r| r.job.instance_name == "late");
        (ran && installed_tag(&world.get("TenantInstance", "late").await) == Some("4.0.0")).then_some(())
    })
    .await;
    let ran: Vec<String> = world.agent.runs().into_iter().map(|r| r.job.instance_name).collect();
    assert_eq!(ran, ["late"], "web, adopted, runs nothing even with its status cleared");
    eventually("web's status showing its ledger again", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("4.0.0")).then_some(())
    })
    .await;
    world.instances("TenantInstance").delete("late", &DeleteParams::default()).await.unwrap();
    eventually("late uninstalled", || async {
        world.instances("TenantInstance").get_opt("late").await.unwrap().is_none().then_some(())
    })
    .await;
    let revisions = world
        .grpc()
        .await
        .list_installed_revisions(ListInstalledRevisionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let used: Vec<(&str, i32)> = revisions.revisions.iter().map(|r| (r.tag.as_str(), r.r#use)).collect();
    assert_eq!(used, [("4.0.0", RevisionUse::Installed as i32)]);
    world.stop().await;
}

/// #65, a rolling update: the previous release, beside this one, rewrites
/// an upgrade record with only the keys it knows (its `Upgrades::write`
/// at 6b4428f: uid, instance, quarantine, approvals, installed,
/// phasesBefore), dropping the ledger. Its status was that release's to
/// write: this one adopts it from there once more, and runs nothing again.
/// (Both binaries on one fake would need the previous release built in the
/// test; this writes exactly what it writes instead.)
#[tokio::test]
async fn a_record_rewritten_by_the_previous_release_is_adopted_again_without_a_job() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let (world, _) = World::start(web("registry.example"), &[]).await;
    let maps: Api<ConfigMap> = Api::namespaced(world.client.clone(), JOBS);
    eventually("the takeover time recorded", || async { maps.get_opt("vynil-takeover").await.ok()? }).await;
    // Created after the takeover (its time is to the second): never adopted on its creation time.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    eventually("4.0.0 installed", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("4.0.0")).then_some(())
    })
    .await;
    let uid = world.get("TenantInstance", "web").await["metadata"]["uid"].as_str().unwrap().to_string();
    let name = format!("vynil-upgrade-{uid}");
    let mut record = maps.get(&name).await.unwrap();
    assert!(record.data.as_ref().unwrap().contains_key("package"), "the ledger is recorded");
    // Its Job gone, as its TTL makes it (a Job of ours would be credited as it stands).
    let job = world.agent.runs()[0].job.job_name.clone();
    world.jobs().delete(&job, &DeleteParams::default()).await.unwrap();
    eventually("the Job gone", || async {
        world.jobs().get_opt(&job).await.unwrap().is_none().then_some(())
    })
    .await;
    let kept = ["uid", "instance", "quarantine", "approvals", "installed", "phasesBefore"];
    record.data.as_mut().unwrap().retain(|key, _| kept.contains(&key.as_str()));
    maps.replace(&name, &PostParams::default(), &record).await.unwrap();
    // Anything that makes it reconcile.
    world.patch("TenantInstance", "web", json!({"metadata": {"labels": {"poke": "1"}}})).await;
    let adopted = eventually("the ledger recorded again", || async {
        let data = maps.get(&name).await.ok()?.data?;
        data.get("package").cloned()
    })
    .await;
    assert!(adopted.contains("\"4.0.0\""), "{adopted}");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(world.tags_run("web"), ["4.0.0"], "no Job ran again");
    world.stop().await;
}

#[tokio::test]
async fn a_failed_install_job_is_kept_and_its_reason_shown_with_the_next_attempt() {
    let (world, script) = World::start(web("registry.example"), &[]).await;
    *script.lock().unwrap() = Box::new(|_| AgentOutcome::fail("the install hook exited 1"));
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    let failed = eventually("the failure condition", || async {
        let object = world.get("TenantInstance", "web").await;
        condition(&object, "Installed").filter(|c| c["status"] == "False").map(|_| object.clone())
    })
    .await;
    let message = condition(&failed, "Installed").unwrap()["message"].as_str().unwrap().to_string();
    // The Job controller's reason, then the failed pod's termination message.
    assert!(message.starts_with("[E_AGENT_FAILED]") && message.contains("backoff limit"), "{message}");
    assert!(message.contains("exited 1 (Error): the install hook exited 1"), "{message}");
    assert_eq!(failed["status"]["target"]["failures"], 1);
    assert!(failed["status"]["target"]["retryAt"].is_string(), "{failed}");
    assert!(
        world.jobs().get_opt("tenant--apps--web").await.unwrap().is_some(),
        "the failed Job is kept for its logs"
    );
    let listed =
        world.grpc().await.list_instances(ListInstancesRequest::default()).await.unwrap().into_inner();
    assert_eq!(listed.instances[0].state, InstanceState::Retrying as i32);
    world.stop().await;
}

#[tokio::test]
async fn a_garbage_object_never_stops_the_others_and_is_reported() {
    let (world, _) = World::start(web("registry.example"), &[]).await;
    // Wrong types, unknown fields and a huge string, stored under an older schema
    // (the API server does not revalidate what it stored).
    let bad = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "bad", "namespace": "apps"},
        "spec": {"jukebox": 42, "category": ["x"], "surprise": "y".repeat(50_000)}});
    world.api.create_under_an_older_schema("vynil.solidite.fr", "tenantinstances", bad).unwrap();
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    eventually("the good instance installed", || async {
        (world.get("TenantInstance", "web").await["status"]["package"]["tag"] == "4.0.0").then_some(())
    })
    .await;
    let event = eventually("the InvalidObject Event", || async {
        world.api.objects("events.k8s.io", "events").into_iter().find(|e| e["reason"] == "InvalidObject")
    })
    .await;
    assert_eq!(event["regarding"]["name"], "bad", "{event}");
    let listed =
        world.grpc().await.list_instances(ListInstancesRequest::default()).await.unwrap().into_inner();
    let bad = listed.instances.iter().find(|i| i.r#ref.as_ref().unwrap().name == "bad").unwrap();
    assert_eq!(bad.state, InstanceState::Invalid as i32);
    let metrics =
        reqwest::get(format!("http://{}/metrics", world.lifecycle)).await.unwrap().text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("tenant_instance_reconcile_failures_total{")
            && l.contains("name=\"bad\"")
            && l.contains("error=\"decode\"")),
        "{metrics}"
    );
    // Deleting it ends too: it records nothing to undo.
    world.instances("TenantInstance").delete("bad", &DeleteParams::default()).await.unwrap();
    eventually("the bad object released", || async {
        world.instances("TenantInstance").get_opt("bad").await.unwrap().is_none().then_some(())
    })
    .await;
    world.stop().await;
}

#[tokio::test]
async fn a_job_finishing_alone_is_seen_at_once_through_the_job_watch() {
    // No timer brings a reconcile within the test (a day between idle
    // checks): the failure can only be seen through the Job's watch.
    let (world, script) = World::start(web("registry.example"), &["--requeue-seconds", "86400"]).await;
    *script.lock().unwrap() = Box::new(|_| AgentOutcome::Hang);
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    world.agent.wait_for_runs(1, Duration::from_secs(30)).await.unwrap();
    // Let every reconcile the instance's own writes caused settle on "running".
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(world.get("TenantInstance", "web").await["status"]["package"].is_null());
    // Only the Job changes (no instance write): its watch must bring the reconcile.
    let now = "2026-12-01T12:00:00Z";
    let status = json!({"status": {"failed": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "Job was active longer than specified deadline", "lastTransitionTime": now}]}});
    world
        .jobs()
        .patch_status("tenant--apps--web", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let message = eventually("the failure seen", || async {
        let object = world.get("TenantInstance", "web").await;
        condition(&object, "Installed").and_then(|c| c["message"].as_str().map(str::to_string))
    })
    .await;
    assert!(message.contains("DeadlineExceeded"), "{message}");
    world.stop().await;
}

#[tokio::test]
async fn tenant_and_system_requirements_are_read_from_the_cluster_and_the_tenant_label() {
    let requirements =
        json!([{"system_package": {"category": "infra", "name": "db"}}, {"tenant_service": "sso"}]);
    let packages = vec![package("registry.example", "apps", "web", "tenant", "1.0.0", requirements)];
    let (world, _) = World::start(packages, &[]).await;
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(world.client.clone());
    for (name, tenant) in [("apps", Some("t1")), ("apps-sso", Some("t1")), ("infra", None), ("lonely", None)]
    {
        let labels = tenant.map_or(json!({}), |t| json!({"vynil.solidite.fr/tenant": t}));
        let ns =
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}});
        // `apps` exists already (the world made it): applied, as `kubectl apply` would.
        let params = kube::api::PatchParams::apply("test");
        namespaces.patch(name, &params, &kube::api::Patch::Apply(&ns)).await.unwrap();
    }
    let create_in = |kind: &'static str,
                     namespace: &'static str,
                     name: &'static str,
                     spec: serde_json::Value| {
        let api: kube::Api<kube::api::DynamicObject> =
            kube::Api::namespaced_with(world.client.clone(), namespace, &resource(kind));
        let object = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": kind, "metadata": {"name": name, "namespace": namespace}, "spec": spec});
        async move { api.create(&Default::default(), &serde_json::from_value(object).unwrap()).await.unwrap() }
    };
    create_in(
        "SystemInstance",
        "infra",
        "db",
        json!({"jukebox": "box", "category": "infra", "package": "db"}),
    )
    .await;
    create_in(
        "TenantInstance",
        "apps-sso",
        "sso",
        json!({"jukebox": "box", "category": "auth", "package": "sso"}),
    )
    .await;
    let sso: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(world.client.clone(), "apps-sso", &resource("TenantInstance"));
    let published = json!({"status": {"conditions": [], "services": [{"key": "sso", "service": {"fqdn": "sso.apps-sso.svc", "port": 443}}]}});
    sso.patch_status("sso", &PatchParams::default(), &Patch::Merge(&published)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // In tenant t1: the system package exists and sso is published in a sibling namespace.
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    world.agent.wait_for_runs(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(world.tags_run("web"), ["1.0.0"]);
    // Outside the tenant, sso is not published.
    create_in("TenantInstance", "lonely", "web", web_spec()).await;
    let lonely: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(world.client.clone(), "lonely", &resource("TenantInstance"));
    let message = eventually("the tenant service requirement", || async {
        let object = serde_json::to_value(lonely.get("web").await.unwrap()).unwrap();
        condition(&object, "AgentStarted").and_then(|c| c["message"].as_str().map(str::to_string))
    })
    .await;
    assert_eq!(message, "Tenant service sso is not published in this tenant");
    world.stop().await;
}

fn resource(kind: &str) -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: "vynil.solidite.fr".into(),
        version: "v1".into(),
        api_version: "vynil.solidite.fr/v1".into(),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
    }
}

/// Every label value of `job` (and its pod template) is one the API server accepts.
fn labels_are_valid(job: &k8s_openapi::api::batch::v1::Job) -> Result<(), String> {
    let template =
        job.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).and_then(|m| m.labels.clone());
    let all = job.metadata.labels.clone().into_iter().chain(template).flatten();
    for (key, value) in all {
        let ok = value.len() <= 63
            && value.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && (value.is_empty()
                || (value.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && value.ends_with(|c: char| c.is_ascii_alphanumeric())));
        if !ok {
            return Err(format!(
                "label {key}={value:?} ({} characters) is not a valid label value",
                value.len()
            ));
        }
    }
    Ok(())
}

#[tokio::test]
async fn two_instances_whose_names_collide_under_upstreams_rule_each_get_their_own_job() {
    let (world, script) = World::start(web("registry.example"), &[]).await;
    // `web.v2` and `web-v2` both give upstream's `tenant--apps--web-v2`.
    *script.lock().unwrap() =
        Box::new(
            |job| if job.instance_name == "web.v2" { AgentOutcome::Hang } else { AgentOutcome::succeed() },
        );
    world.create("TenantInstance", "web.v2", web_spec(), json!({})).await;
    world.agent.wait_for_runs(1, Duration::from_secs(30)).await.unwrap();
    let first = world.jobs().get("tenant--apps--web-v2").await.unwrap();
    world.create("TenantInstance", "web-v2", web_spec(), json!({})).await;
    eventually("web-v2 installed by a Job of its own", || async {
        (world.get("TenantInstance", "web-v2").await["status"]["package"]["tag"] == "4.0.0").then_some(())
    })
    .await;
    let still = world.jobs().get("tenant--apps--web-v2").await.unwrap();
    assert_eq!(still.metadata.uid, first.metadata.uid, "web.v2's running Job was not replaced");
    assert_eq!(still.metadata.labels.as_ref().unwrap()["instance"], "web.v2");
    assert!(
        world.get("TenantInstance", "web.v2").await["status"]["package"].is_null(),
        "not credited to web.v2"
    );
    let runs: Vec<(String, String)> =
        world.agent.runs().into_iter().map(|r| (r.job.instance_name, r.job.job_name)).collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_ne!(runs[0].1, runs[1].1, "{runs:?}");
    // Its uninstall runs under its own name too, and leaves web.v2's Job alone.
    world.instances("TenantInstance").delete("web-v2", &DeleteParams::default()).await.unwrap();
    eventually("web-v2 gone", || async {
        world.instances("TenantInstance").get_opt("web-v2").await.unwrap().is_none().then_some(())
    })
    .await;
    let after = world.jobs().get("tenant--apps--web-v2").await.unwrap();
    assert_eq!(after.metadata.uid, first.metadata.uid);
    world.stop().await;
}

#[tokio::test]
async fn an_instance_named_with_253_characters_installs_with_valid_labels() {
    let (world, _) = World::start(web("registry.example"), &[]).await;
    let name = format!("{}.{}", "a".repeat(200), "b".repeat(52));
    assert_eq!(name.len(), 253);
    world.create("TenantInstance", &name, web_spec(), json!({})).await;
    eventually("installed", || async {
        (world.get("TenantInstance", &name).await["status"]["package"]["tag"] == "4.0.0").then_some(())
    })
    .await;
    let jobs = world.jobs().list(&Default::default()).await.unwrap().items;
    assert_eq!(jobs.len(), 1);
    labels_are_valid(&jobs[0]).unwrap();
    let annotations = jobs[0].metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations["vynil.solidite.fr/instance"], name, "the full name rides in an annotation");
    // Upstream's agent found its instance by the Job's env.
    assert_eq!(world.agent.runs()[0].job.instance_name, name);
    world.stop().await;
}

#[tokio::test]
async fn a_status_field_the_crd_does_not_declare_is_pruned_and_the_controller_notices() {
    // The CRD of an older release, without `status.target`: the API server
    // prunes the field, the read-back sees it missing, and no Job starts.
    let api = FakeApiServer::start().await.unwrap();
    api.create_namespaces(&[APPS, JOBS]).unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client().unwrap());
    let mut crd = crds.get("tenantinstances.vynil.solidite.fr").await.unwrap();
    let schema = crd.spec.versions[0].schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()).unwrap();
    let status = schema.properties.as_mut().and_then(|p| p.get_mut("status")).unwrap();
    assert!(status.properties.as_mut().unwrap().remove("target").is_some(), "our CRD declares status.target");
    crds.replace("tenantinstances.vynil.solidite.fr", &PostParams::default(), &crd).await.unwrap();
    let (world, _) = World::start_on(api, web("registry.example"), &[]).await;
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    eventually("the pruned write noticed", || async {
        let metrics =
            reqwest::get(format!("http://{}/metrics", world.lifecycle)).await.ok()?.text().await.ok()?;
        metrics
            .lines()
            .any(|l| {
                l.starts_with("tenant_instance_reconcile_failures_total{")
                    && l.contains("name=\"web\"")
                    && l.contains("error=\"notdone\"")
            })
            .then_some(())
    })
    .await;
    let object = world.get("TenantInstance", "web").await;
    assert!(object["status"].get("target").is_none(), "{object}");
    assert!(
        world.jobs().list(&Default::default()).await.unwrap().items.is_empty(),
        "no Job without its target"
    );
    world.stop().await;
}

/// ListInstances answers page by page: a page size of 1 walks every
/// instance once, in the list's order (kind, namespace, name).
#[tokio::test]
async fn list_instances_answers_page_by_page() {
    let (world, _) = World::start(web("registry.example"), &[]).await;
    for name in ["c", "a", "b"] {
        world.create("TenantInstance", name, web_spec(), json!({"vynil.solidite.fr/suspend": "true"})).await;
    }
    eventually("the three instances listed", || async {
        let listed =
            world.grpc().await.list_instances(ListInstancesRequest::default()).await.ok()?.into_inner();
        (listed.instances.len() == 3).then_some(())
    })
    .await;
    let (mut names, mut token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let request = ListInstancesRequest { page_size: 1, page_token: token.clone(), ..Default::default() };
        let answer = world.grpc().await.list_instances(request).await.unwrap().into_inner();
        assert!(answer.instances.len() <= 1);
        names.extend(answer.instances.into_iter().filter_map(|i| i.r#ref.map(|r| r.name)));
        pages += 1;
        if answer.next_page_token.is_empty() {
            break;
        }
        token = answer.next_page_token;
    }
    assert_eq!((names, pages), (vec!["a".to_string(), "b".into(), "c".into()], 3));
    world.stop().await;
}

/// `apps/web` revisions `tags`, newest first, each installable from any other.
fn web_revisions(tags: &[&str]) -> Vec<serde_json::Value> {
    tags.iter().map(|tag| package("registry.example", "apps", "web", "tenant", tag, json!([]))).collect()
}

fn installed_tag(object: &serde_json::Value) -> Option<&str> {
    object["status"]["package"]["tag"].as_str()
}

fn ready_message(object: &serde_json::Value) -> String {
    condition(object, "Ready").and_then(|c| c["message"].as_str()).unwrap_or_default().to_string()
}

/// #44 item 1 as a user meets it: a failed upgrade that applied nothing goes
/// back on its own and its revision is never tried again; one that applied
/// a phase holds until an operator rolls it back (the service token only:
/// a caller without it is refused); a newer revision is then installed.
#[tokio::test]
async fn a_failed_upgrade_rolls_back_or_holds_for_an_operator_and_is_never_retried() {
    let (world, script) = World::start(web_revisions(&["0.2.0"]), &["--max-install-attempts", "1"]).await;
    *script.lock().unwrap() = Box::new(|job| match job.tag.as_deref() {
        Some("0.3.0") => AgentOutcome::fail("the 0.3.0 migration exited 1"),
        Some("0.3.1") => AgentOutcome::FailAfterApplying {
            applied: vec!["BeforeApplied".into(), "VitalApplied".into()],
            message: "the 0.3.1 scalables failed".into(),
        },
        _ => AgentOutcome::succeed(),
    });
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    eventually("0.2.0 installed", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("0.2.0")).then_some(())
    })
    .await;

    // 0.3.0 fails having applied nothing: back to 0.2.0 with a Job of its own.
    world.publish(web_revisions(&["0.3.0", "0.2.0"])).await;
    let rolling = eventually("the rollback under way", || async {
        let object = world.get("TenantInstance", "web").await;
        ready_message(&object).starts_with("[E_UPGRADE_ROLLED_BACK] 0.2.0 → 0.3.0 failed").then_some(object)
    })
    .await;
    assert!(ready_message(&rolling).contains("the 0.3.0 migration exited 1"), "{}", ready_message(&rolling));
    eventually("the rollback Job ran and succeeded", || async {
        let object = world.get("TenantInstance", "web").await;
        let runs = world.tags_run("web");
        let back = runs.iter().filter(|t| *t == "0.2.0").count() == 2;
        (back
            && condition(&object, "Ready").is_some_and(|c| c["status"] == "True")
            && object["status"]["target"].is_null())
        .then_some(())
    })
    .await;
    // A hundred changes later (each a reconcile), 0.3.0 was never tried again.
    for i in 0..100 {
        world
            .patch("TenantInstance", "web", json!({"metadata": {"annotations": {"touch": i.to_string()}}}))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let runs = world.tags_run("web");
    assert_eq!(runs.iter().filter(|t| *t == "0.3.0").count(), 1, "{runs:?}");
    assert_eq!(installed_tag(&world.get("TenantInstance", "web").await), Some("0.2.0"));
    assert!(
        world.jobs().list(&Default::default()).await.unwrap().items.iter().all(|j| {
            j.spec.as_ref().and_then(|s| s.template.spec.as_ref()).is_none_or(|p| {
                p.containers.iter().all(|c| {
                    c.env.iter().flatten().all(|e| e.name != "TAG" || e.value.as_deref() != Some("0.3.0"))
                })
            })
        }),
        "no Job for 0.3.0 exists"
    );

    // 0.3.1 fails having applied two phases: it holds, and says both ways out.
    // #65 item 10: its agent's node runs an hour behind, so the phases it
    // writes are stamped before the upgrade began on lifecycle's clock;
    // what it wrote is told from what lifecycle saw, not from those times.
    world.agent.skew_clock(-3600);
    world.publish(web_revisions(&["0.3.1", "0.3.0", "0.2.0"])).await;
    let held = eventually("the hold for an operator", || async {
        let object = world.get("TenantInstance", "web").await;
        ready_message(&object).starts_with("[E_UPGRADE_FAILED] 0.2.0 → 0.3.1").then_some(object)
    })
    .await;
    let message = ready_message(&held);
    assert!(message.contains("VitalApplied") && message.contains("vynilctl instance rollback"), "{message}");
    let mut grpc = world.grpc().await;
    let revisions =
        grpc.list_installed_revisions(ListInstalledRevisionsRequest::default()).await.unwrap().into_inner();
    let kept: Vec<(&str, i32)> = revisions.revisions.iter().map(|r| (r.tag.as_str(), r.r#use)).collect();
    assert!(kept.contains(&("0.2.0", RevisionUse::RollbackTarget as i32)), "{kept:?}");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(world.tags_run("web").iter().filter(|t| *t == "0.2.0").count(), 2, "no rollback on its own");
    let listed = grpc.list_instances(ListInstancesRequest::default()).await.unwrap().into_inner();
    let tags: Vec<&str> = listed.instances[0].quarantined.iter().map(|q| q.tag.as_str()).collect();
    assert_eq!(tags, ["0.3.0", "0.3.1"]);

    // Only through the gateway (the service token): a caller without it is refused.
    let request = || vynil_proto::lifecycle::v1::RollBackRequest {
        r#ref: Some(tenant(APPS, "web")),
        reason: "the 0.3.1 scalables need a fix".into(),
        ..Default::default()
    };
    let refused = grpc.roll_back(request()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let approved = grpc.roll_back(as_gateway(request(), "alice")).await.unwrap().into_inner();
    let quarantine = approved.quarantine.unwrap();
    assert_eq!((quarantine.tag.as_str(), quarantine.from_tag.as_str()), ("0.3.1", "0.2.0"));
    assert!(quarantine.rollback_detail.contains("alice"), "{quarantine:?}");
    eventually("rolled back by the operator", || async {
        let object = world.get("TenantInstance", "web").await;
        let back = world.tags_run("web").iter().filter(|t| *t == "0.2.0").count() == 3;
        (back && condition(&object, "Ready").is_some_and(|c| c["status"] == "True")).then_some(())
    })
    .await;

    // A tenant with every right on its instance and its status can neither
    // write the upgrade record nor get a quarantined revision installed by
    // naming it as installed (0.3.1, the catalog's newest, quarantined).
    let tenant = tenant_with_full_rights_on_its_instances(&world).await;
    let records: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(tenant.clone(), JOBS);
    let forged = json!({"data": {"quarantine": "[]"}});
    let record = world
        .api
        .objects("", "configmaps")
        .into_iter()
        .find(|m| m["metadata"]["labels"]["vynil.solidite.fr/upgrade-record"] == "true");
    let record = record.unwrap()["metadata"]["name"].as_str().unwrap().to_string();
    let refused = records.patch(&record, &PatchParams::default(), &Patch::Merge(&forged)).await.unwrap_err();
    assert!(matches!(&refused, kube::Error::Api(s) if s.code == 403), "{refused:?}");
    let own: Api<kube::api::DynamicObject> = Api::namespaced_with(tenant, APPS, &tenant_instance_resource());
    let status = json!({"status": {"tag": "0.3.1", "target": null,
        "package": {"registry": "registry.example", "image": "apps/web", "tag": "0.3.1", "type": "tenant", "fingerprint": "forged"}}});
    own.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    // The newest allowed revision is 0.2.0, whose Job (the rollback's) already succeeded: recorded again.
    eventually("the forged status answered with the newest allowed revision", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("0.2.0")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(world.tags_run("web").iter().filter(|t| *t == "0.3.1").count(), 1, "0.3.1 never ran again");

    // A newer revision is installed as usual.
    world.publish(web_revisions(&["0.3.2", "0.3.1", "0.3.0", "0.2.0"])).await;
    eventually("0.3.2 installed", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("0.3.2")).then_some(())
    })
    .await;
    world.stop().await;
}

fn tenant_instance_resource() -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: "vynil.solidite.fr".into(),
        version: "v1".into(),
        api_version: "vynil.solidite.fr/v1".into(),
        kind: "TenantInstance".into(),
        plural: "tenantinstances".into(),
    }
}

/// A client as a tenant who may do anything to the TenantInstances of its
/// namespace and their status (a Role and RoleBinding the admin wrote).
async fn tenant_with_full_rights_on_its_instances(world: &World) -> kube::Client {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let role = json!({"metadata": {"name": "tenant-all", "namespace": APPS}, "rules": [{
        "apiGroups": ["vynil.solidite.fr"], "resources": ["tenantinstances", "tenantinstances/status"], "verbs": ["*"]}]});
    let binding = json!({"metadata": {"name": "tenant-all", "namespace": APPS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-all"},
        "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": APPS}]});
    let roles: Api<Role> = Api::namespaced(world.client.clone(), APPS);
    roles.create(&PostParams::default(), &serde_json::from_value(role).unwrap()).await.unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(world.client.clone(), APPS);
    bindings.create(&PostParams::default(), &serde_json::from_value(binding).unwrap()).await.unwrap();
    world.api.client_as(&world.api.service_account_token(APPS, "tenant")).unwrap()
}

/// #44 item 4 as a user meets it: a JukeBox's freeze makes its instances'
/// upgrades wait (listed `WAITING`, saying until when), while a first install
/// goes on; an instance's own policy cannot lift it, the operator can.
#[tokio::test]
async fn a_freeze_on_the_jukebox_holds_upgrades_until_the_operator_lifts_it() {
    let (world, _) = World::start(web_revisions(&["0.2.0"]), &[]).await;
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    eventually("0.2.0 installed", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("0.2.0")).then_some(())
    })
    .await;
    let freeze = json!({"spec": {"upgrade_policy": {"freezes": [
        {"from": "2020-01-01T00:00:00Z", "until": "2099-01-01T00:00:00Z", "reason": "until further notice"}]}}});
    let boxes: Api<vynil_crds::JukeBox> = Api::all(world.client.clone());
    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&freeze)).await.unwrap();
    world.publish(web_revisions(&["0.3.0", "0.2.0"])).await;
    let mut grpc = world.grpc().await;
    let waiting = eventually("the upgrade waiting", || async {
        let listed = grpc.clone().list_instances(ListInstancesRequest::default()).await.ok()?.into_inner();
        listed.instances.into_iter().find(|i| i.state == InstanceState::Waiting as i32)
    })
    .await;
    assert_eq!(waiting.blocked_by, "upgrade_window");
    assert!(
        waiting.blocking_reason.contains("0.2.0 → 0.3.0")
            && waiting.blocking_reason.contains("frozen until 2099-01-01"),
        "{}",
        waiting.blocking_reason
    );
    // A first install is never held.
    world.create("TenantInstance", "fresh", web_spec(), json!({})).await;
    eventually("the first install", || async {
        (installed_tag(&world.get("TenantInstance", "fresh").await) == Some("0.3.0")).then_some(())
    })
    .await;
    assert!(!world.tags_run("web").contains(&"0.3.0".to_string()), "web did not upgrade");
    // Its own policy (no window, no freeze) does not lift the JukeBox's freeze…
    world.patch("TenantInstance", "web", json!({"spec": {"upgradePolicy": {}}})).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(installed_tag(&world.get("TenantInstance", "web").await), Some("0.2.0"));
    // …the operator does.
    let thaw = json!({"spec": {"upgrade_policy": null}});
    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&thaw)).await.unwrap();
    eventually("the upgrade once the freeze is lifted", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("0.3.0")).then_some(())
    })
    .await;
    let explained =
        grpc.explain(ExplainRequest { r#ref: Some(tenant(APPS, "web")) }).await.unwrap().into_inner();
    assert_eq!(explained.state, InstanceState::UpToDate as i32, "{}", explained.summary);
    world.stop().await;
}

/// #65 item 9, the attack: a tenant who may edit its instance writes its own
/// windows — open every minute, or lasting 100000000h — to walk around its
/// JukeBox's window. Its windows only narrow the JukeBox's, and a duration
/// past the bound holds the upgrade with `[E_UPGRADE_POLICY]` naming it.
#[tokio::test]
async fn a_tenants_own_windows_never_open_its_jukeboxs_closed_window() {
    let (world, _) = World::start(web_revisions(&["0.2.0"]), &[]).await;
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    eventually("0.2.0 installed", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("0.2.0")).then_some(())
    })
    .await;
    // The operator's window: one hour on each 29 February, closed now.
    let window = json!({"spec": {"upgrade_policy": {"windows": [
        {"schedule": "0 0 29 2 *", "zone": "UTC", "duration": "1h"}]}}});
    let boxes: Api<vynil_crds::JukeBox> = Api::all(world.client.clone());
    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&window)).await.unwrap();
    let as_tenant = tenant_with_full_rights_on_its_instances(&world).await;
    let own: Api<kube::api::DynamicObject> =
        Api::namespaced_with(as_tenant, APPS, &tenant_instance_resource());
    let every_minute = json!({"spec": {"upgradePolicy": {"windows": [
        {"schedule": "* * * * *", "zone": "UTC", "duration": "1m"}]}}});
    own.patch("web", &PatchParams::default(), &Patch::Merge(&every_minute)).await.unwrap();
    world.publish(web_revisions(&["0.3.0", "0.2.0"])).await;
    let grpc = world.grpc().await;
    let waiting = eventually("the upgrade waiting for the JukeBox's window", || async {
        let listed = grpc.clone().list_instances(ListInstancesRequest::default()).await.ok()?.into_inner();
        listed.instances.into_iter().find(|i| i.state == InstanceState::Waiting as i32)
    })
    .await;
    assert!(waiting.blocking_reason.contains("0 0 29 2 *"), "{}", waiting.blocking_reason);
    let forever = json!({"spec": {"upgradePolicy": {"windows": [
        {"schedule": "* * * * *", "zone": "UTC", "duration": "100000000h"}]}}});
    own.patch("web", &PatchParams::default(), &Patch::Merge(&forever)).await.unwrap();
    let held = eventually("the out-of-bound duration held", || async {
        let explained = grpc
            .clone()
            .explain(ExplainRequest { r#ref: Some(tenant(APPS, "web")) })
            .await
            .ok()?
            .into_inner();
        (explained.blocking_code == "E_UPGRADE_POLICY").then_some(explained)
    })
    .await;
    assert!(held.blocking_reason.contains("8784h"), "{}", held.blocking_reason);
    assert!(!world.tags_run("web").contains(&"0.3.0".to_string()), "web did not upgrade");
    world.stop().await;
}

/// What Explain answers of TenantInstance `web` (`None`: no answer yet).
async fn explain_web(
    grpc: &vynil_proto::lifecycle::v1::lifecycle_client::LifecycleClient<tonic::transport::Channel>,
) -> Option<vynil_proto::lifecycle::v1::ExplainResponse> {
    let request = ExplainRequest { r#ref: Some(tenant(APPS, "web")) };
    grpc.clone().explain(request).await.ok().map(|r| r.into_inner())
}

/// #65 item 8: simple signing binds a digest, never a tag: a pusher re-tags
/// an old signed revision (0.1.0, with known bugs) as 0.9.0, and it still
/// verifies. Explain tells the re-tag of the revision an instance runs.
#[tokio::test]
async fn item_8_explain_tells_a_verified_digest_published_under_two_version_tags() {
    let verified = json!({"verdict": "verified", "key": "release", "reference": "registry.example/apps/web"});
    let mut revisions = web_revisions(&["0.9.0", "0.1.0"]);
    for revision in &mut revisions {
        revision["digest"] = json!("sha256:0100");
        revision["signature"] = verified.clone();
    }
    let (world, _) = World::start(revisions, &[]).await;
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    eventually("0.9.0 installed", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("0.9.0")).then_some(())
    })
    .await;
    let grpc = world.grpc().await;
    let explained = eventually("Explain answers", || explain_web(&grpc)).await;
    assert!(
        explained
            .details
            .iter()
            .any(|d| d.contains("apps/web:0.9.0 is the same signed bytes (sha256:0100) as 0.1.0")),
        "{:?}",
        explained.details
    );
    world.stop().await;
}

/// #44 item 5 as a user meets it: with `approval: manual` on the JukeBox, an
/// upgrade waits (`PENDING_APPROVAL`, the exact step); an approval of that
/// step (service token only) starts it; when the catalog moves on, the old
/// approval lapses and approving it again is refused naming the new step.
#[tokio::test]
async fn a_manual_upgrade_runs_once_its_exact_step_is_approved_and_a_stale_approval_is_refused() {
    use vynil_proto::lifecycle::v1::ApproveUpgradeRequest;
    let (world, _) = World::start(web_revisions(&["0.2.0"]), &[]).await;
    let boxes: Api<vynil_crds::JukeBox> = Api::all(world.client.clone());
    let manual = json!({"spec": {"upgrade_policy": {"approval": "manual"}}});
    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&manual)).await.unwrap();
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    eventually("0.2.0 installed (a first install needs no approval)", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("0.2.0")).then_some(())
    })
    .await;
    world.publish(web_revisions(&["0.3.0", "0.2.0"])).await;
    let (mut grpc, reader) = (world.grpc().await, world.grpc().await);
    let explain = || explain_web(&reader);
    let pending = eventually("the upgrade pending approval", || async {
        explain().await.filter(|e| e.state == InstanceState::PendingApproval as i32)
    })
    .await;
    assert_eq!((pending.to_tag.as_str(), pending.blocked_by.as_str()), ("0.3.0", "approval"));
    assert!(pending.blocking_reason.contains(&pending.approval_fingerprint), "{}", pending.blocking_reason);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!world.tags_run("web").contains(&"0.3.0".to_string()), "nothing runs before the approval");
    let approve = |fingerprint: &str| ApproveUpgradeRequest {
        r#ref: Some(tenant(APPS, "web")),
        fingerprint: fingerprint.into(),
        reason: "reviewed".into(),
        ..Default::default()
    };
    let refused = grpc.approve_upgrade(approve(&pending.approval_fingerprint)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "only through the gateway");
    let approved = grpc
        .approve_upgrade(as_gateway(approve(&pending.approval_fingerprint), "alice"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((approved.from_tag.as_str(), approved.to_tag.as_str()), ("0.2.0", "0.3.0"));
    eventually("0.3.0 installed once approved", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("0.3.0")).then_some(())
    })
    .await;
    // The catalog moves on before the next approval: the old step's approval is stale.
    world.publish(web_revisions(&["0.3.1", "0.3.0", "0.2.0"])).await;
    let next = eventually("the next upgrade pending", || async {
        explain().await.filter(|e| e.state == InstanceState::PendingApproval as i32 && e.to_tag == "0.3.1")
    })
    .await;
    assert_ne!(next.approval_fingerprint, pending.approval_fingerprint);
    let stale =
        grpc.approve_upgrade(as_gateway(approve(&pending.approval_fingerprint), "alice")).await.unwrap_err();
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition, "{stale:?}");
    assert!(
        stale.message().contains("0.3.0 → 0.3.1") && stale.message().contains(&next.approval_fingerprint),
        "{}",
        stale.message()
    );
    world.stop().await;
}

/// #65 item 3, the attacks: a tenant who may write its instance's status
/// (1) writes the pending upgrade's fingerprint, which Explain shows it, as
/// the started target, then (2) clears what says 0.2.0 is installed, to make
/// the upgrade a first install. "Installed" and "started" are lifecycle's own
/// record: the upgrade still waits for its approval, from 0.2.0.
#[tokio::test]
async fn item_3_a_tenant_writing_its_status_never_starts_an_unapproved_upgrade() {
    let (world, _) = World::start(web_revisions(&["0.2.0"]), &[]).await;
    let boxes: Api<vynil_crds::JukeBox> = Api::all(world.client.clone());
    let manual = json!({"spec": {"upgrade_policy": {"approval": "manual"}}});
    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&manual)).await.unwrap();
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    eventually("0.2.0 installed", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("0.2.0")).then_some(())
    })
    .await;
    world.publish(web_revisions(&["0.3.0", "0.2.0"])).await;
    let reader = world.grpc().await;
    let explain = || explain_web(&reader);
    let pending = eventually("the upgrade pending approval", || async {
        explain().await.filter(|e| e.state == InstanceState::PendingApproval as i32)
    })
    .await;
    let as_tenant = tenant_with_full_rights_on_its_instances(&world).await;
    let own: Api<kube::api::DynamicObject> =
        Api::namespaced_with(as_tenant, APPS, &tenant_instance_resource());
    // (1) The pending fingerprint written as the target lifecycle started.
    let mut revision = world.get("TenantInstance", "web").await["status"]["package"].clone();
    revision["tag"] = json!("0.3.0");
    revision["fingerprint"] = json!(pending.approval_fingerprint);
    let started = json!({"status": {"target": {"revision": revision, "job": "", "failures": 0}}});
    own.patch_status("web", &PatchParams::default(), &Patch::Merge(&started)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!world.tags_run("web").contains(&"0.3.0".to_string()), "a forged target started the upgrade");
    // (2) Nothing installed, as far as the status says.
    let cleared = json!({"status": {"tag": null, "digest": null, "package": null, "target": null}});
    own.patch_status("web", &PatchParams::default(), &Patch::Merge(&cleared)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!world.tags_run("web").contains(&"0.3.0".to_string()), "a cleared status made a first install");
    let still = explain().await.unwrap();
    assert_eq!(
        (still.state, still.from_tag.as_str(), still.to_tag.as_str()),
        (InstanceState::PendingApproval as i32, "0.2.0", "0.3.0"),
        "{}",
        still.summary
    );
    world.stop().await;
}

/// #65 item 6, the attack: whoever may write Redis upserts the JukeBox's
/// catalog entry (a `SET` and a `PUBLISH`, as the catalog itself writes)
/// with a revision the scan never found — a tag the JukeBox's status does
/// not list, at a digest of the attacker's choosing, named verified. The
/// catalog offers it; lifecycle confirms it against the JukeBox's status in
/// the API server, refuses it (`[E_UNCONFIRMED]`) and runs no Job.
#[tokio::test]
async fn item_6_a_revision_written_in_redis_alone_never_runs() {
    use vynil_store::package_cache::PackageCache;
    let redis = vynil_testkit::RedisServer::start().await.unwrap();
    let url = redis.url();
    let catalog_args = ["--redis-url", url.as_str()];
    let (world, _) = World::start_with_catalog(web_revisions(&["0.2.0"]), &[], &catalog_args).await;
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    eventually("0.2.0 installed", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("0.2.0")).then_some(())
    })
    .await;
    let cache =
        vynil_store::package_cache::RedisCache::connect(&vynil_store::RedisTarget::url(&url)).await.unwrap();
    let mut entry = cache.get("box").await.unwrap().expect("the catalog's entry in Redis");
    let mut forged = entry.packages[0].clone();
    forged.tag = "0.3.0".into();
    forged.digest = Some(format!("sha256:{}", "e".repeat(64)));
    entry.packages.insert(0, forged);
    entry.hash = "written-by-the-attacker".into();
    assert!(cache.upsert_if_changed(&entry).await.unwrap());
    let grpc = world.grpc().await;
    let outcome = eventually("the forged revision refused, or run", || async {
        if world.tags_run("web").contains(&"0.3.0".to_string()) {
            return Some(Err(()));
        }
        explain_web(&grpc).await.filter(|e| e.blocking_code == "E_UNCONFIRMED").map(Ok)
    })
    .await;
    let refused = outcome.expect("a Job ran 0.3.0, which only Redis lists");
    assert!(refused.blocking_reason.contains("0.3.0"), "{}", refused.blocking_reason);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(world.tags_run("web"), ["0.2.0"], "no Job for what Redis alone says");
    world.stop().await;
}

/// `web_revisions`, each first seen at the time given (RFC 3339).
fn seen_revisions(tags: &[(&str, &str)]) -> Vec<serde_json::Value> {
    tags.iter()
        .map(|(tag, seen)| {
            let mut package = package("registry.example", "apps", "web", "tenant", tag, json!([]));
            package["first_seen"] = json!(seen);
            package
        })
        .collect()
}

/// #44 items 2 and 3 as an admin meets them with kubectl (the CLI and
/// gateway test the same through the service): a recalled revision is never
/// installed, an instance running one keeps it and says so until the recall
/// moves it away (no window nor approval holds that); a revision younger
/// than the minimum age waits, and Explain says when it becomes selectable.
#[tokio::test]
async fn a_recalled_or_too_young_revision_is_never_installed_and_a_recall_may_move_instances_away() {
    let (world, _) = World::start(web_revisions(&["0.1.0", "0.2.0"]), &[]).await;
    let boxes: Api<vynil_crds::JukeBox> = Api::all(world.client.clone());
    let set_box = |spec: serde_json::Value| {
        let boxes = boxes.clone();
        async move {
            boxes.patch("box", &PatchParams::default(), &Patch::Merge(&json!({"spec": spec}))).await.unwrap()
        }
    };
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    eventually("0.2.0 installed", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("0.2.0")).then_some(())
    })
    .await;
    let grpc = world.grpc().await;
    let explain = |name: &'static str| {
        let mut grpc = grpc.clone();
        async move { grpc.explain(ExplainRequest { r#ref: Some(tenant(APPS, name)) }).await.unwrap().into_inner() }
    };

    // 0.3.0, recalled as it is published: never installed, by an upgrade or a first install.
    set_box(json!({"recalls": [{"tag": "0.3.0", "reason": "corrupts the index"}]})).await;
    world.publish(web_revisions(&["0.1.0", "0.2.0", "0.3.0"])).await;
    let held = eventually("0.3.0 held back", || async {
        let explained = explain("web").await;
        (!explained.withheld.is_empty()).then_some(explained)
    })
    .await;
    assert_eq!(held.withheld, ["0.3.0 is recalled: corrupts the index"], "{}", held.summary);
    assert_eq!(held.state, InstanceState::UpToDate as i32, "{}", held.summary);
    world.create("TenantInstance", "fresh", web_spec(), json!({})).await;
    eventually("a first install of 0.2.0", || async {
        (installed_tag(&world.get("TenantInstance", "fresh").await) == Some("0.2.0")).then_some(())
    })
    .await;

    // 0.2.0 recalled too: its instances keep it (a downgrade is no package's promise) and say so.
    set_box(json!({"recalls": [{"tag": "0.3.0", "reason": "corrupts the index"},
        {"tag": "0.2.0", "reason": "CVE-2026-1234"}]}))
    .await;
    let running = eventually("running a recalled revision", || async {
        let explained = explain("web").await;
        (!explained.recalled.is_empty()).then_some(explained)
    })
    .await;
    assert_eq!(
        running.recalled,
        "running a recalled revision: 0.2.0 is recalled: CVE-2026-1234; the next selectable revision is 0.1.0 \
         (moving instances away, across a freeze or to an older revision, needs an admin's recall with move_away)",
        "#65 item 7: Explain says who may move the instances"
    );
    assert_eq!(running.state, InstanceState::UpToDate as i32, "{}", running.summary);

    // Moving away: to the newest selectable revision, older or not, even during a freeze.
    set_box(json!({"upgrade_policy": {"freezes": [
            {"from": "2020-01-01T00:00:00Z", "until": "2099-01-01T00:00:00Z", "reason": "quiet period"}]},
        "recalls": [{"tag": "0.3.0", "reason": "corrupts the index"},
            {"tag": "0.2.0", "reason": "CVE-2026-1234", "move_away": true}]}))
    .await;
    for name in ["web", "fresh"] {
        eventually("moved away to 0.1.0", || async {
            (installed_tag(&world.get("TenantInstance", name).await) == Some("0.1.0")).then_some(())
        })
        .await;
    }
    let runs: Vec<String> = world.tags_run("web");
    assert!(
        !runs.contains(&"0.3.0".to_string()) && !world.tags_run("fresh").contains(&"0.3.0".into()),
        "{runs:?}"
    );

    // A minimum age of 72h: 0.4.0, first seen 71h before now, waits an hour; at 70h it is old enough.
    let now = jiff::Timestamp::now();
    let ago = |hours: i64| (now - jiff::SignedDuration::from_hours(hours)).to_string();
    let (seen_04, old) = (ago(71), ago(1000));
    set_box(json!({"upgrade_policy": {"minimumAge": "72h", "freezes": null}, "recalls": null})).await;
    world
        .publish(seen_revisions(&[("0.1.0", &old), ("0.2.0", &old), ("0.3.0", &old), ("0.4.0", &seen_04)]))
        .await;
    let young = eventually("0.4.0 too young", || async {
        let explained = explain("web").await;
        explained.withheld.iter().any(|w| w.starts_with("0.4.0")).then_some(explained)
    })
    .await;
    let selectable_at =
        (seen_04.parse::<jiff::Timestamp>().unwrap() + jiff::SignedDuration::from_hours(72)).to_string();
    assert_eq!(young.withheld, [format!("0.4.0 becomes selectable at {selectable_at} (minimum age 72h)")]);
    assert_eq!(young.to_tag, "0.3.0", "the recall lifted, 0.3.0 is old enough: {}", young.summary);
    set_box(json!({"upgrade_policy": {"minimumAge": "70h"}})).await;
    eventually("0.4.0 installed once old enough", || async {
        (installed_tag(&world.get("TenantInstance", "web").await) == Some("0.4.0")).then_some(())
    })
    .await;
    // An instance's own minimum age cannot shorten its JukeBox's.
    eventually("fresh at 0.4.0", || async {
        (installed_tag(&world.get("TenantInstance", "fresh").await) == Some("0.4.0")).then_some(())
    })
    .await;
    world.patch("TenantInstance", "fresh", json!({"spec": {"upgradePolicy": {"minimumAge": "1h"}}})).await;
    let seen_05 = ago(2);
    world.publish(seen_revisions(&[("0.1.0", &old), ("0.4.0", &seen_04), ("0.5.0", &seen_05)])).await;
    let fresh = eventually("0.5.0 too young for fresh", || async {
        let explained = explain("fresh").await;
        explained.withheld.iter().any(|w| w.starts_with("0.5.0")).then_some(explained)
    })
    .await;
    assert!(fresh.withheld[0].ends_with("(minimum age 70h)"), "{:?}", fresh.withheld);
    assert!(!world.tags_run("fresh").contains(&"0.5.0".to_string()));
    world.stop().await;
}

/// A namespace the operator labels into a wave.
const CANARIES: &str = "canaries";

/// Creates `namespace` (when missing) with `labels`, as an operator applies it.
async fn label_namespace(world: &World, namespace: &str, labels: serde_json::Value) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(world.client.clone());
    let object =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}});
    namespaces.patch(namespace, &PatchParams::apply("operator"), &Patch::Apply(&object)).await.unwrap();
}

async fn get_in(world: &World, namespace: &str, name: &str) -> serde_json::Value {
    serde_json::to_value(world.instances_in("TenantInstance", namespace).get(name).await.unwrap()).unwrap()
}

/// #65 item 4, the attack: waves were chosen by the instances' own labels,
/// so a tenant labelled its instance into the canary wave and suspended it,
/// and every other tenant's rollout of the package waited for it forever.
/// Now the canary wave is the namespaces the operator labels, and a member
/// of it that never starts the revision holds the rest only for the wave's
/// patience, after which the rollout goes on with an Event naming it.
#[tokio::test]
async fn item_4_a_tenant_never_holds_a_rollout_by_its_own_labels_nor_by_suspending_a_canary() {
    let (world, _) = World::start(web_revisions(&["0.2.0"]), &[]).await;
    let boxes: Api<vynil_crds::JukeBox> = Api::all(world.client.clone());
    let waves = json!({"spec": {"upgrade_policy": {"waves": [
        {"name": "canary", "namespaces": {"wave": "canary"}, "soak": "0s", "patience": "1h"}]}}});
    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&waves)).await.unwrap();
    label_namespace(&world, CANARIES, json!({"wave": "canary"})).await;
    let instances = [
        (CANARIES, "canary", json!({})),
        (APPS, "rest", json!({})),
        (APPS, "sneaky", json!({"wave": "canary"})),
    ];
    for (namespace, name, labels) in &instances {
        let object = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
            "metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": web_spec()});
        world
            .instances_in("TenantInstance", namespace)
            .create(&PostParams::default(), &serde_json::from_value(object).unwrap())
            .await
            .unwrap();
    }
    let at = |tag: &'static str, who: &'static [(&'static str, &'static str)]| {
        let world = &world;
        async move {
            for (namespace, name) in who {
                if installed_tag(&get_in(world, namespace, name).await) != Some(tag) {
                    return None;
                }
            }
            Some(())
        }
    };
    let everyone = &[(CANARIES, "canary"), (APPS, "rest"), (APPS, "sneaky")];
    eventually("every instance at 0.2.0", || at("0.2.0", everyone)).await;
    // The tenant of `sneaky` labelled it `wave: canary` and suspends it.
    world
        .patch(
            "TenantInstance",
            "sneaky",
            json!({"metadata": {"annotations": {"vynil.solidite.fr/suspend": "true"}}}),
        )
        .await;
    world.publish(web_revisions(&["0.3.0", "0.2.0"])).await;
    // Within the hour of patience: the rest follows the real canary, not the tenant's.
    eventually("the canary, then the rest, at 0.3.0", || {
        at("0.3.0", &[(CANARIES, "canary"), (APPS, "rest")])
    })
    .await;

    // A canary the operator placed, suspended: the rest waits for it only for the patience.
    let patience = json!({"spec": {"upgrade_policy": {"waves": [
        {"name": "canary", "namespaces": {"wave": "canary"}, "soak": "0s", "patience": "3s"}]}}});
    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&patience)).await.unwrap();
    let suspend = json!({"metadata": {"annotations": {"vynil.solidite.fr/suspend": "true"}}});
    let canaries = world.instances_in("TenantInstance", CANARIES);
    canaries.patch("canary", &PatchParams::default(), &Patch::Merge(&suspend)).await.unwrap();
    // Its patience counts from the revision's first sighting (the scanner's, in the JukeBox's status).
    let published = jiff::Timestamp::now();
    let mut revisions = web_revisions(&["0.4.0", "0.3.0", "0.2.0"]);
    revisions[0]["first_seen"] = json!(published.to_string());
    world.publish(revisions).await;
    eventually("the rest at 0.4.0 past the canary's patience", || at("0.4.0", &[(APPS, "rest")])).await;
    let rest = get_in(&world, APPS, "rest").await;
    let rest_at: jiff::Timestamp =
        rest["status"]["package"]["installedAt"].as_str().unwrap().parse().unwrap();
    assert!(rest_at >= published + jiff::SignedDuration::from_secs(2), "{rest_at}: not before the patience");
    assert!(!world.tags_run("canary").contains(&"0.4.0".to_string()), "the suspended canary never ran");
    let skipped = world.api.objects("events.k8s.io", "events").into_iter().find(|e| {
        e["reason"] == "WaveMembersSkipped"
            && e["regarding"]["name"] == "rest"
            && e["note"].as_str().is_some_and(|n| n.contains("tenant/canaries/canary (wave canary)"))
    });
    assert!(skipped.is_some(), "the skip is in the audit trail");
    world.stop().await;
}

/// #44 item 6 as a user meets it: with waves on the JukeBox (canary, then the
/// rest), a new revision reaches the canary first, the rest after the
/// canary's soak; a canary that fails halts the rest (`[E_WAVE_HALTED]`) and
/// rolls back; an operator clearing its quarantine resumes the rollout. The
/// canary wave is the namespaces the operator labels (#65 item 4).
#[tokio::test]
async fn a_rollout_in_waves_goes_canary_first_and_a_canary_failure_halts_the_rest() {
    use vynil_proto::lifecycle::v1::ClearQuarantineRequest;
    let (world, script) = World::start(web_revisions(&["0.2.0"]), &["--max-install-attempts", "1"]).await;
    let boxes: Api<vynil_crds::JukeBox> = Api::all(world.client.clone());
    let waves = json!({"spec": {"upgrade_policy": {"waves": [
        {"name": "canary", "namespaces": {"wave": "canary"}, "soak": "2s"}]}}});
    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&waves)).await.unwrap();
    label_namespace(&world, CANARIES, json!({"wave": "canary"})).await;
    for (namespace, name) in [(CANARIES, "canary"), (APPS, "rest1"), (APPS, "rest2")] {
        let object = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
            "metadata": {"name": name, "namespace": namespace}, "spec": web_spec()});
        world
            .instances_in("TenantInstance", namespace)
            .create(&PostParams::default(), &serde_json::from_value(object).unwrap())
            .await
            .unwrap();
    }
    let at = |tag: &'static str, names: &'static [&'static str]| {
        let world = &world;
        async move {
            for name in names {
                let namespace = if *name == "canary" { CANARIES } else { APPS };
                if installed_tag(&get_in(world, namespace, name).await) != Some(tag) {
                    return None;
                }
            }
            Some(())
        }
    };
    eventually("every instance at 0.2.0 (first installs are not held)", || {
        at("0.2.0", &["canary", "rest1", "rest2"])
    })
    .await;

    // 0.3.0: the canary first, the rest once it has run 0.3.0 for its soak.
    world.publish(web_revisions(&["0.3.0", "0.2.0"])).await;
    let grpc = world.grpc().await;
    let waiting = eventually("the rest waiting for the canary", || async {
        let listed = grpc.clone().list_instances(ListInstancesRequest::default()).await.ok()?.into_inner();
        let rest: Vec<_> = listed
            .instances
            .into_iter()
            .filter(|i| i.r#ref.as_ref().is_some_and(|r| r.name.starts_with("rest")))
            .collect();
        rest.iter().all(|i| i.state == InstanceState::Waiting as i32).then_some(rest)
    })
    .await;
    assert!(
        waiting[0].blocking_reason.contains("wave the rest of JukeBox box")
            && waiting[0].blocking_reason.contains("wave canary runs 0.3.0"),
        "{}",
        waiting[0].blocking_reason
    );
    eventually("the canary at 0.3.0", || at("0.3.0", &["canary"])).await;
    let canary = get_in(&world, CANARIES, "canary").await;
    let canary_at: jiff::Timestamp =
        canary["status"]["package"]["installedAt"].as_str().unwrap().parse().unwrap();
    // The canary's tenant forges its install time to skip the soak: the waves read lifecycle's record.
    let forged = json!({"status": {"package": {"installedAt": "2020-01-01T00:00:00Z"}}});
    let canaries = world.instances_in("TenantInstance", CANARIES);
    canaries.patch_status("canary", &PatchParams::default(), &Patch::Merge(&forged)).await.unwrap();
    eventually("the rest at 0.3.0 after the soak", || at("0.3.0", &["rest1", "rest2"])).await;
    for name in ["rest1", "rest2"] {
        let rest = world.get("TenantInstance", name).await;
        let rest_at: jiff::Timestamp =
            rest["status"]["package"]["installedAt"].as_str().unwrap().parse().unwrap();
        assert!(
            rest_at >= canary_at + jiff::SignedDuration::from_secs(2),
            "{name} at {rest_at}, canary at {canary_at}"
        );
    }

    // 0.4.0 fails on the canary, having applied nothing: it rolls back, and the rest halt.
    *script.lock().unwrap() = Box::new(|job| match job.tag.as_deref() {
        Some("0.4.0") => AgentOutcome::fail("the 0.4.0 migration exited 1"),
        _ => AgentOutcome::succeed(),
    });
    world.publish(web_revisions(&["0.4.0", "0.3.0", "0.2.0"])).await;
    let halted = eventually("the rest halted", || async {
        let listed = grpc.clone().list_instances(ListInstancesRequest::default()).await.ok()?.into_inner();
        let rest: Vec<_> = listed
            .instances
            .into_iter()
            .filter(|i| i.r#ref.as_ref().is_some_and(|r| r.name.starts_with("rest")))
            .collect();
        rest.iter().all(|i| i.blocking_code == "E_WAVE_HALTED").then_some(rest)
    })
    .await;
    assert!(
        halted[0].blocking_reason.contains("tenant/canaries/canary of wave canary failed"),
        "{}",
        halted[0].blocking_reason
    );
    let on_the_jukebox = || {
        world.api.objects("events.k8s.io", "events").into_iter().find(|e| {
            e["reason"] == "WaveHalted"
                && e["regarding"]["kind"] == "JukeBox"
                && e["regarding"]["name"] == "box"
                && e["note"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("[E_WAVE_HALTED]") && n.contains("canary"))
        })
    };
    eventually("the halt told on the JukeBox", || async { on_the_jukebox() }).await;
    eventually("the canary rolled back to 0.3.0", || async {
        (world.tags_run("canary").iter().filter(|t| *t == "0.3.0").count() == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for name in ["rest1", "rest2"] {
        assert!(!world.tags_run(name).contains(&"0.4.0".to_string()), "{name} never tried 0.4.0");
    }

    // Fixed, and the quarantine cleared by an operator: the rollout resumes.
    *script.lock().unwrap() = Box::new(|_| AgentOutcome::succeed());
    let request = ClearQuarantineRequest {
        r#ref: Some(tenant(CANARIES, "canary")),
        tag: "0.4.0".into(),
        ..Default::default()
    };
    grpc.clone().clear_quarantine(as_gateway(request, "alice")).await.unwrap();
    eventually("every instance at 0.4.0", || at("0.4.0", &["canary", "rest1", "rest2"])).await;
    world.stop().await;
}

/// Issue "Credentials that stay where they belong" item 1, lifecycle's side:
/// a JukeBox editor names the service token's Secret as the pull secret, so
/// that the agent Job (cluster-admin, running the package's scripts) mounts
/// it. No Job runs: the condition says `[E_SECRET_NOT_ALLOWED]`; a Secret of
/// the user's own, opted in, is used.
#[tokio::test]
async fn a_pull_secret_no_jukebox_may_name_runs_no_job() {
    use k8s_openapi::api::core::v1::Secret;
    let (world, _) = World::start(web("r.example"), &[]).await;
    let secrets: Api<Secret> = Api::namespaced(world.client.clone(), JOBS);
    let config = json!({"auths": {"r.example": {"auth": "dXNlcjpwYXNz"}}}).to_string();
    for (name, labelled) in [("vynil-service-token", true), ("regcred", false)] {
        let labels = if labelled { json!({vynil_crds::secrets::OPT_IN_LABEL: "true"}) } else { json!({}) };
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": name, "labels": labels}, "stringData": {".dockerconfigjson": config},
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &secret).await.unwrap();
    }
    let boxes: Api<vynil_crds::JukeBox> = Api::all(world.client.clone());
    // One instance per refusal: Events of one object and reason form one
    // series, which keeps its first note.
    let refusals = [
        ("web", "vynil-service-token", "it is one of the control plane's own Secrets"),
        ("web-2", "regcred", "it does not carry the label"),
    ];
    for (instance, secret, why) in refusals {
        let named = json!({"spec": {"pull_secret": secret}});
        boxes.patch("box", &PatchParams::default(), &Patch::Merge(&named)).await.unwrap();
        world.create("TenantInstance", instance, web_spec(), json!({})).await;
        let expected = format!("[E_SECRET_NOT_ALLOWED] Secret {secret}: {why}");
        eventually("the refusal or a Job", || async {
            let jobs = world.jobs().list(&Default::default()).await.unwrap().items;
            let events = world.api.objects("events.k8s.io", "events");
            let refused = events.iter().any(|e| {
                e["reason"] == "PullSecretRefused"
                    && e["regarding"]["name"] == instance
                    && e["note"].as_str().is_some_and(|n| n.starts_with(&expected))
            });
            (refused || !jobs.is_empty()).then_some(())
        })
        .await;
        let jobs = world.jobs().list(&Default::default()).await.unwrap().items;
        assert!(jobs.is_empty(), "a Job mounts {secret}: {:?}", jobs[0].spec);
        assert_eq!(installed_tag(&world.get("TenantInstance", instance).await), None);
    }
    let label = json!({"metadata": {"labels": {vynil_crds::secrets::OPT_IN_LABEL: "true"}}});
    secrets.patch("regcred", &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
    // Lifecycle watches no Secret: the retry finds it, or a change of the instance.
    world.patch("TenantInstance", "web-2", json!({"metadata": {"annotations": {"test/poke": "1"}}})).await;
    eventually("the install with the user's own Secret", || async {
        installed_tag(&world.get("TenantInstance", "web-2").await).map(str::to_string)
    })
    .await;
    let job = world.jobs().list(&Default::default()).await.unwrap().items.remove(0);
    assert!(serde_json::to_string(&job).unwrap().contains("regcred"), "the Job mounts the opted-in Secret");
    world.stop().await;
}
