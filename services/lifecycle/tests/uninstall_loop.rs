//! Deletion, whole loops: the fake API server, a real catalog, a real
//! registry (the recorded revision is checked there), the fake agent for
//! delete Jobs, and the **real reaper** run as a process against the fake API
//! for `delete-without-package`. `docs/upstream-vynil.md` §9 items 23–25 and
//! upstream #12 C / #15.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use kube::{
    Api,
    api::{DeleteParams, DynamicObject, PostParams},
};
use serde_json::{Value, json};
use vynil_crds::JukeBox;
use vynil_proto::lifecycle::v1::{AllowDeleteWithoutPackageRequest, ExplainRequest};
use vynil_testkit::{PackageSpec, PackageType, RegistryServer, kube_api::AgentOutcome};

fn installs_with_children(_: &vynil_testkit::kube_api::AgentJob) -> AgentOutcome {
    AgentOutcome::Succeed {
        children: vec![("vitals".into(), vec![json!({"kind": "Deployment", "name": "web"})])],
    }
}

/// A registry holding `apps/web` at `tags`, and the catalog entries for them (no digests).
async fn registry_with(tags: &[&str]) -> (RegistryServer, Vec<Value>, String) {
    let registry = RegistryServer::start().await.unwrap();
    let host = registry.host();
    let mut packages = Vec::new();
    for tag in tags {
        registry
            .publisher()
            .publish("apps/web", &PackageSpec::new("apps", "web", PackageType::Tenant, tag))
            .await
            .unwrap();
        let mut p = package(&host, "apps", "web", "tenant", tag, json!([]));
        p.as_object_mut().unwrap().remove("digest");
        packages.push(p);
    }
    (registry, packages, host)
}

/// The value of `variable` in the unpack (init) container of every delete Job run so far.
fn delete_unpack_env(world: &World, variable: &str) -> Vec<String> {
    world
        .agent
        .runner()
        .runs()
        .into_iter()
        .filter(|run| {
            run.init && run.job.metadata.labels.as_ref().is_some_and(|l| l.values().any(|v| v == "delete"))
        })
        .filter_map(|run| {
            let env =
                run.job.spec.as_ref()?.template.spec.as_ref()?.init_containers.as_ref()?[0].env.clone()?;
            env.into_iter().find(|e| e.name == variable)?.value
        })
        .collect()
}

async fn installed(world: &World, name: &str, tag: &str) {
    eventually("the install recorded", || async {
        (world.get("TenantInstance", name).await["status"]["package"]["tag"] == tag).then_some(())
    })
    .await;
}

async fn gone(world: &World, name: &str) {
    eventually("the instance gone", || async {
        world.instances("TenantInstance").get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
}

async fn delete(world: &World, name: &str) {
    world.instances("TenantInstance").delete(name, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn item_23_the_delete_job_runs_the_recorded_revision_then_the_finalizer_goes() {
    let (_registry, packages, host) = registry_with(&["4.0.0"]).await;
    let leaked: &'static str = Box::leak(host.into_boxed_str());
    let (world, script) = World::start(packages, &["--insecure-registry", leaked]).await;
    *script.lock().unwrap() = Box::new(installs_with_children);
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    installed(&world, "web", "4.0.0").await;
    delete(&world, "web").await;
    gone(&world, "web").await;
    let runs: Vec<(String, Option<String>)> =
        world.agent.runs().into_iter().map(|r| (r.job.action, r.job.tag)).collect();
    assert_eq!(runs, [("install".into(), Some("4.0.0".into())), ("delete".into(), Some("4.0.0".into()))]);
    assert!(world.jobs().get_opt("tenant--apps--web").await.unwrap().is_none(), "the delete Job is deleted");
    world.stop().await;
}

/// #65 item 5: the package moved to another repository of its JukeBox (the
/// catalog lists it only there now); an instance lifecycle installed from
/// the old one is deleted with the delete hooks of what it installed, from
/// the repository lifecycle's record says it credited, not the catalog's
/// revision from the new one.
#[tokio::test]
async fn item_5_a_package_moved_to_another_repository_deletes_with_the_revision_lifecycle_credited() {
    let registry = RegistryServer::start().await.unwrap();
    let (host, publisher) = (registry.host(), registry.publisher());
    let mut revisions = Vec::new();
    for (image, tag) in [("apps/web", "4.0.0"), ("apps/web-next", "5.0.0")] {
        let digest = publisher
            .publish(image, &PackageSpec::new("apps", "web", PackageType::Tenant, tag))
            .await
            .unwrap();
        let mut p = package(&host, "apps", "web", "tenant", tag, json!([]));
        p["image"] = json!(image);
        p["digest"] = json!(digest);
        revisions.push(p);
    }
    let leaked: &'static str = Box::leak(host.clone().into_boxed_str());
    let (world, script) = World::start(vec![], &["--insecure-registry", leaked]).await;
    *script.lock().unwrap() = Box::new(installs_with_children);
    let boxes: Api<JukeBox> = Api::all(world.client.clone());
    let source =
        json!({"spec": {"source": {"list": [format!("{host}/apps/web"), format!("{host}/apps/web-next")]}}});
    boxes.patch("box", &Default::default(), &kube::api::Patch::Merge(&source)).await.unwrap();
    world.publish(vec![revisions[0].clone()]).await;
    world
        .create("TenantInstance", "web", web_spec(), json!({"vynil.solidite.fr/hold-upgrades": "true"}))
        .await;
    installed(&world, "web", "4.0.0").await;
    // The package moves: the catalog lists it in apps/web-next only.
    world.publish(vec![revisions[1].clone()]).await;
    delete(&world, "web").await;
    gone(&world, "web").await;
    let deletes: Vec<(String, Option<String>)> = world
        .agent
        .runs()
        .into_iter()
        .filter(|r| r.job.action == "delete")
        .map(|r| (r.job.action, r.job.tag))
        .collect();
    assert_eq!(
        deletes,
        [("delete".to_string(), Some("4.0.0".to_string()))],
        "the hooks of what was installed"
    );
    let images = delete_unpack_env(&world, "IMAGE");
    assert_eq!(images, ["apps/web"], "unpacked from the repository it was installed from");
    world.stop().await;
}

/// #65 item 6, the attack: whoever may write a JukeBox's status (or, before
/// item 6, Redis) marks a revision no trusted key signed as `verified`, and
/// under an enforced policy the cluster-admin agent installed it. The
/// verdict is read again from the registry's evidence before the Job: no
/// Job, `[E_UNVERIFIED]`.
#[tokio::test]
async fn item_6_a_verified_verdict_the_registry_does_not_bear_out_runs_no_job() {
    use vynil_testkit::{SignatureLayer, Signer};
    let registry = RegistryServer::start().await.unwrap();
    let (host, publisher) = (registry.host(), registry.publisher());
    let release = Signer::from_label("release");
    let reference = format!("{host}/apps/web");
    let mut catalog = Vec::new();
    for tag in ["0.2.0", "0.1.0"] {
        let digest = publisher
            .publish("apps/web", &PackageSpec::new("apps", "web", PackageType::Tenant, tag))
            .await
            .unwrap();
        if tag == "0.1.0" {
            let layer = SignatureLayer::by(&release, &reference, &digest);
            publisher.sign("apps/web", &digest, &[layer]).await.unwrap();
        }
        let mut p = package(&host, "apps", "web", "tenant", tag, json!([]));
        p["digest"] = json!(digest);
        // The forgery: 0.2.0 is unsigned in the registry.
        p["signature"] = json!({"verdict": "verified", "key": "release", "reference": reference});
        catalog.push(p);
    }
    let leaked: &'static str = Box::leak(host.clone().into_boxed_str());
    let (world, _) = World::start(vec![], &["--insecure-registry", leaked]).await;
    let boxes: Api<JukeBox> = Api::all(world.client.clone());
    let trusted = json!([{"name": "release", "public_key": release.public_pem()}]);
    let policy =
        json!({"spec": {"source": {"list": [reference]}, "verify": {"mode": "enforce", "keys": trusted}}});
    boxes.patch("box", &Default::default(), &kube::api::Patch::Merge(&policy)).await.unwrap();
    world.publish(catalog).await;
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    let refused = eventually("the SignatureRefused Event", || async {
        world.api.objects("events.k8s.io", "events").into_iter().find(|e| e["reason"] == "SignatureRefused")
    })
    .await;
    let note = refused["note"].as_str().unwrap_or_default();
    assert!(note.starts_with("[E_UNVERIFIED] apps/web:0.2.0: unsigned"), "{note}");
    assert!(world.agent.runs().is_empty(), "no agent ran the unsigned bytes");
    world.stop().await;
}

/// #65 item 1: a revision recorded without a digest (an instance upstream
/// installed, or a catalog entry without one) has its tag resolved once and
/// recorded in lifecycle's ledger with the delete Job, whose unpack pulls
/// that digest, never the tag a pusher may re-point.
#[tokio::test]
async fn item_1_a_revision_recorded_without_a_digest_is_pinned_and_recorded_for_its_delete_job() {
    let (registry, packages, host) = registry_with(&["4.0.0"]).await;
    let leaked: &'static str = Box::leak(host.into_boxed_str());
    let (world, script) = World::start(packages, &["--insecure-registry", leaked]).await;
    *script.lock().unwrap() = Box::new(|job| match job.action.as_str() {
        // The instance stays (its delete failed): its record can be read.
        "delete" => AgentOutcome::fail("the delete hook exited 1"),
        _ => installs_with_children(job),
    });
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    installed(&world, "web", "4.0.0").await;
    let object = world.get("TenantInstance", "web").await;
    assert!(object["status"]["package"].get("digest").is_none(), "installed without a digest: {object}");
    let uid = object["metadata"]["uid"].as_str().unwrap().to_string();
    let named = reqwest::Client::new()
        .head(format!("{}/v2/apps/web/manifests/4.0.0", registry.base_url()))
        .header("accept", "application/vnd.oci.image.manifest.v1+json")
        .send()
        .await
        .unwrap();
    let named = named.headers()["docker-content-digest"].to_str().unwrap().to_string();
    delete(&world, "web").await;
    world.agent.wait_for_runs(2, Duration::from_secs(30)).await.unwrap();
    let unpacked = delete_unpack_env(&world, "TAG");
    assert_eq!(unpacked, std::slice::from_ref(&named), "the delete's unpack pulls the digest its tag named");
    let record = world
        .api
        .objects("", "configmaps")
        .into_iter()
        .find(|c| c["metadata"]["name"] == format!("vynil-upgrade-{uid}"))
        .unwrap();
    assert!(record["data"].to_string().contains(&named), "the pin is in the ledger: {record}");
    world.stop().await;
}

/// #65 item 5, the attacks: a tenant writes `status.package` naming another
/// package of the same JukeBox (so that deleting its instance runs that
/// package's delete hooks as the cluster-admin agent), or a registry of its
/// choice with a Secret of the control plane (so that lifecycle sends a
/// request there, with those credentials). The delete runs the instance's
/// own package, and no request reaches the tenant's host.
#[tokio::test]
async fn a_recorded_revision_of_another_package_or_host_is_never_run_nor_asked() {
    let (registry, mut packages, host) = registry_with(&["4.0.0"]).await;
    let root = PackageSpec::new("apps", "root", PackageType::Tenant, "1.0.0");
    registry.publisher().publish("apps/root", &root).await.unwrap();
    let mut listed = package(&host, "apps", "root", "tenant", "1.0.0", json!([]));
    listed.as_object_mut().unwrap().remove("digest");
    packages.push(listed);
    let leaked: &'static str = Box::leak(host.into_boxed_str());
    let (world, script) = World::start(packages, &["--insecure-registry", leaked]).await;
    *script.lock().unwrap() = Box::new(installs_with_children);
    for name in ["web", "ssrf"] {
        world.create("TenantInstance", name, web_spec(), json!({})).await;
        installed(&world, name, "4.0.0").await;
    }
    let deletes_unpacked = || delete_unpack_env(&world, "IMAGE");
    world
        .patch_status("TenantInstance", "web", json!({"package": {"image": "apps/root", "tag": "1.0.0"}}))
        .await;
    delete(&world, "web").await;
    gone(&world, "web").await;
    assert_eq!(deletes_unpacked(), ["apps/web"], "the delete runs the instance's own package");
    // A host of the tenant's choice: it counts what reaches it.
    let trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    trap.set_nonblocking(true).unwrap();
    let trap_host = trap.local_addr().unwrap().to_string();
    world.patch_status("TenantInstance", "ssrf", json!({"package": {"registry": trap_host}})).await;
    delete(&world, "ssrf").await;
    gone(&world, "ssrf").await;
    assert_eq!(deletes_unpacked(), ["apps/web", "apps/web"]);
    assert!(trap.accept().is_err(), "no request reached the tenant's host");
    world.stop().await;
}

#[tokio::test]
async fn item_25_a_failed_delete_job_is_reported_as_soon_as_it_is_marked() {
    let (_registry, packages, host) = registry_with(&["4.0.0"]).await;
    let leaked: &'static str = Box::leak(host.into_boxed_str());
    // No timer brings a reconcile within the test (upstream waits 10 minutes;
    // here a day between idle checks): the failure is seen because the Job's
    // change is.
    let flags = ["--insecure-registry", leaked, "--requeue-seconds", "86400"];
    let (world, script) = World::start(packages, &flags).await;
    *script.lock().unwrap() = Box::new(|job| {
        if job.action == "delete" {
            AgentOutcome::fail("the delete hook exited 1")
        } else {
            installs_with_children(job)
        }
    });
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    installed(&world, "web", "4.0.0").await;
    delete(&world, "web").await;
    world.agent.wait_for_runs(2, Duration::from_secs(30)).await.unwrap();
    let message = eventually("the delete failure condition", || async {
        let object = world.get("TenantInstance", "web").await;
        coded_condition(&object, "Ready").map(|c| c["message"].to_string())
    })
    .await;
    assert!(message.contains("the delete hook exited 1"), "{message}");
    let object = world.get("TenantInstance", "web").await;
    assert!(object["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty()), "kept: {object}");
    assert!(world.jobs().get_opt("tenant--apps--web").await.unwrap().is_some(), "the failed Job is kept");
    world.stop().await;
}

/// An instance as upstream left it: children recorded, no `status.package`.
async fn upstream_instance(world: &World, name: &str) {
    world.create("TenantInstance", name, web_spec(), json!({"vynil.solidite.fr/suspend": "true"})).await;
    let status = json!({"tag": "1.0.0", "conditions": [], "vitals": [{"kind": "Deployment", "name": "web"}]});
    world.patch_status("TenantInstance", name, status).await;
    // Let lifecycle see it (suspended: nothing runs) and add its finalizer.
    eventually("the finalizer", || async {
        let object = world.get("TenantInstance", name).await;
        object["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_jukebox_deleted_under_its_instances_says_e_jukebox_gone_and_orphans_nothing() {
    let (world, _) = World::start(web("registry.example"), &[]).await;
    upstream_instance(&world, "web").await;
    let boxes: Api<JukeBox> = Api::all(world.client.clone());
    boxes.delete("box", &DeleteParams::default()).await.unwrap();
    // The instance is deleted once the catalog knows the JukeBox is gone.
    eventually("the catalog to say box is gone", || async {
        (world.catalog_box().await == Err(tonic::Code::NotFound)).then_some(())
    })
    .await;
    delete(&world, "web").await;
    let message = eventually("the E_JUKEBOX_GONE condition", || async {
        let object = world.get("TenantInstance", "web").await;
        coded_condition(&object, "Ready").and_then(|c| c["message"].as_str().map(str::to_string))
    })
    .await;
    assert!(message.starts_with("[E_JUKEBOX_GONE]"), "{message}");
    assert!(world.instances("TenantInstance").get_opt("web").await.unwrap().is_some(), "the finalizer stays");
    world.stop().await;
}

#[tokio::test]
async fn with_the_catalog_down_a_delete_waits_and_is_never_called_gone() {
    let (world, _) = World::start(web("registry.example"), &[]).await;
    upstream_instance(&world, "web").await;
    world.catalog_shutdown.trigger();
    eventually("the catalog to be down", || async {
        (world.catalog_box().await == Err(tonic::Code::Unavailable)).then_some(())
    })
    .await;
    delete(&world, "web").await;
    // An absence: looked for after the reconciles that follow have had time.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let object = world.get("TenantInstance", "web").await;
    let codes: Vec<&str> = object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["message"].as_str())
        .filter(|m| m.contains("GONE"))
        .collect();
    assert!(codes.is_empty(), "an outage is not 'gone': {object}");
    assert!(object["metadata"]["deletionTimestamp"].is_string());
    world.stop().await;
}

/// The reaper Job, run by the test kit's Job runner as on a cluster (the
/// real lifecycle binary in its pod, in-cluster as the agent's
/// ServiceAccount): waits for its container to end and returns its report,
/// the termination message its pod showed (lifecycle deletes the Job once
/// the instance is released, so the runner's record is read, not the Job).
async fn reaper_report(world: &World) -> String {
    let run = eventually("the reaper's container ended", || async {
        let runs = world.agent.runner().runs();
        runs.into_iter().find(|r| r.args.first().map(String::as_str) == Some("reap") && r.exit_code.is_some())
    })
    .await;
    assert_eq!(run.job.metadata.name.as_deref(), Some("tenant--apps--web"));
    assert_eq!(run.exit_code, Some(0), "the reaper: {}", run.stderr);
    run.message
}

#[tokio::test]
async fn package_gone_then_allowed_the_real_reaper_deletes_children_in_reverse_order_and_leaves_the_crd() {
    // The catalog has no tenant revision of apps/web left: only a service one.
    let packages = vec![package("registry.example", "apps", "web", "service", "0.2.0", json!([]))];
    let (world, script) = World::start(packages, &[]).await;
    *script.lock().unwrap() = Box::new(installs_with_children);
    // Children that really exist in the fake API, recorded as the agent would.
    let client = world.client.clone();
    let create = |api_version: &str, kind: &str, plural: &str, namespaced: bool, name: &str| {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let resource = kube::api::ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: api_version.into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        let api: Api<DynamicObject> = if namespaced {
            Api::namespaced_with(client.clone(), APPS, &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        // Labelled as upstream's agent labels what it creates for apps/web
        // (upstream-facts.md): the reaper deletes nothing else.
        let labels = json!({"app.kubernetes.io/managed-by": "vynil", "app.kubernetes.io/instance": "web",
            "vynil.solidite.fr/owner-namespace": APPS, "vynil.solidite.fr/owner-category": "apps",
            "vynil.solidite.fr/owner-type": "tenant"});
        let mut object =
            json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "labels": labels}});
        if kind == "Job" {
            object["spec"] = json!({"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "migrate", "image": "registry.example/migrate:1"}]}}});
        }
        if kind == "CustomResourceDefinition" {
            object["spec"] = json!({"group": "example.io", "scope": "Namespaced",
                "names": {"kind": "Thing", "plural": "things", "singular": "thing"},
                "versions": [{"name": "v1", "served": true, "storage": true}]});
        }
        async move { api.create(&PostParams::default(), &serde_json::from_value(object).unwrap()).await.unwrap() }
    };
    create("v1", "ConfigMap", "configmaps", true, "settings").await;
    create("apps/v1", "Deployment", "deployments", true, "web").await;
    create("batch/v1", "Job", "jobs", true, "migrate").await;
    create(
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
        "things.example.io",
    )
    .await;
    world.create("TenantInstance", "web", web_spec(), json!({"vynil.solidite.fr/suspend": "true"})).await;
    let status = json!({"tag": "0.1.8", "conditions": [],
        "befores": [{"kind": "ConfigMap", "name": "settings"}],
        "vitals": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "namespace": APPS}],
        "posts": [{"apiVersion": "batch/v1", "kind": "Job", "name": "migrate"}],
        // A tenant's status has no `crds` (upstream-vynil.md: service and system
        // only; the API server prunes it): a CRD a tenant package made is an `other`.
        "others": [{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "name": "things.example.io"}]});
    world.patch_status("TenantInstance", "web", status).await;
    eventually("the finalizer", || async {
        let object = world.get("TenantInstance", "web").await;
        object["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty()).then_some(())
    })
    .await;
    delete(&world, "web").await;
    let message = eventually("E_PACKAGE_GONE", || async {
        let object = world.get("TenantInstance", "web").await;
        coded_condition(&object, "Ready").and_then(|c| c["message"].as_str().map(str::to_string))
    })
    .await;
    assert!(
        message.starts_with("[E_PACKAGE_GONE]") && message.contains("delete-without-package"),
        "{message}"
    );

    // The tenant sets the annotation itself (it may patch its instance): it
    // asks, it deletes nothing; the condition says an admin must confirm.
    let hatch = "vynil.solidite.fr/delete-without-package";
    world.patch("TenantInstance", "web", json!({"metadata": {"annotations": {hatch: "true"}}})).await;
    let message = eventually("an admin must confirm", || async {
        let object = world.get("TenantInstance", "web").await;
        let message =
            coded_condition(&object, "Ready").and_then(|c| c["message"].as_str().map(str::to_string))?;
        message.contains("the annotation alone deletes nothing").then_some(message)
    })
    .await;
    assert!(message.contains("AllowDeleteWithoutPackage"), "{message}");
    // An absence: looked for after the reconciles that follow have had time.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let reaper = world.jobs().get_opt("tenant--apps--web").await.unwrap();
    assert!(reaper.is_none(), "no reaper Job for the annotation alone: {reaper:?}");
    world.patch("TenantInstance", "web", json!({"metadata": {"annotations": {hatch: null}}})).await;

    // The escape hatch, added after deletion began, through the API.
    let mut grpc = world.grpc().await;
    let explained =
        grpc.explain(ExplainRequest { r#ref: Some(tenant(APPS, "web")) }).await.unwrap().into_inner();
    assert_eq!(
        explained.children_to_delete,
        ["posts: Job apps/migrate", "vitals: Deployment apps/web", "befores: ConfigMap apps/settings"]
    );
    assert_eq!(explained.children_left, ["others: CustomResourceDefinition apps/things.example.io"]);
    let allow = |confirm: &str, fingerprint: &str| AllowDeleteWithoutPackageRequest {
        r#ref: Some(tenant(APPS, "web")),
        confirm: confirm.into(),
        caller: "alice".into(),
        reason: "package unpublished".into(),
        fingerprint: fingerprint.into(),
    };
    let annotation = || async {
        world.get("TenantInstance", "web").await["metadata"]["annotations"]["vynil.solidite.fr/delete-without-package"].clone()
    };
    // Straight to the service, without the gateway's service token: refused,
    // whatever caller the request claims.
    let anonymous = grpc
        .allow_delete_without_package(allow("tenant/apps/web", &explained.children_fingerprint))
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), tonic::Code::Unauthenticated, "{anonymous:?}");
    assert!(annotation().await.is_null(), "nothing changed");
    let allow = |confirm: &str, fingerprint: &str| as_gateway(allow(confirm, fingerprint), "alice");
    let wrong = grpc
        .allow_delete_without_package(allow("tenant/apps/other", &explained.children_fingerprint))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::InvalidArgument, "{wrong:?}");
    let stale = grpc.allow_delete_without_package(allow("tenant/apps/web", "0000")).await.unwrap_err();
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition, "{stale:?}");
    assert!(annotation().await.is_null(), "nothing changed");
    // The reaper Job starts as soon as the confirmation is recorded.
    world.api.clear_requests();
    let done = grpc
        .allow_delete_without_package(allow("tenant/apps/web", &explained.children_fingerprint))
        .await
        .unwrap()
        .into_inner();
    assert!(done.annotated);
    assert_eq!(annotation().await, "true");

    let report = reaper_report(&world).await;
    gone(&world, "web").await;

    // Reverse phase order, each DELETE verified by a GET answering 404.
    let log: Vec<(String, String, String, u16)> = world
        .api
        .requests()
        .into_iter()
        .filter(|r| {
            r.user_agent.starts_with("vynil-lifecycle") && ["delete", "get"].contains(&r.verb.as_str())
        })
        .filter(|r| {
            ["configmaps", "deployments", "jobs"].contains(&r.resource.as_str())
                && r.namespace.as_deref() == Some(APPS)
        })
        .map(|r| (r.verb, r.resource, r.name.unwrap_or_default(), r.status))
        .collect();
    let deletes: Vec<&str> =
        log.iter().filter(|(v, ..)| v == "delete").map(|(_, _, n, _)| n.as_str()).collect();
    assert_eq!(deletes, ["migrate", "web", "settings"], "{log:?}");
    for (_, resource, name, _) in log.iter().filter(|(v, ..)| v == "delete") {
        assert!(
            log.iter().any(|(v, r, n, s)| v == "get" && r == resource && n == name && *s == 404),
            "{name}: {log:?}"
        );
    }
    let crds = world.api.objects("apiextensions.k8s.io", "customresourcedefinitions");
    assert!(crds.iter().any(|c| c["metadata"]["name"] == "things.example.io"), "the CRD is left in place");
    let report: Value = serde_json::from_str(&report).unwrap();
    let crd = report["children"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "CustomResourceDefinition")
        .unwrap();
    assert_eq!(crd["outcome"], "skipped", "{report}");
    let event = eventually("the no-hooks Warning", || async {
        world
            .api
            .objects("events.k8s.io", "events")
            .into_iter()
            .find(|e| e["reason"] == "DeletedWithoutPackage")
    })
    .await;
    assert!(event["note"].as_str().unwrap().contains("things.example.io"), "{event}");
    let allowed = world
        .api
        .objects("events.k8s.io", "events")
        .into_iter()
        .find(|e| e["reason"] == "DeleteWithoutPackageAllowed");
    assert!(allowed.unwrap()["note"].as_str().unwrap().contains("alice"));
    world.stop().await;
}

/// Upstream's agent decodes its instance with closed enums (`Deleting` is not
/// one): our previous release left that condition on instances, so lifecycle
/// removes it, and the uninstall then goes through the strict agent.
#[tokio::test]
async fn a_deleting_condition_left_by_the_previous_release_is_removed_and_the_strict_agent_uninstalls() {
    let (_registry, packages, host) = registry_with(&["4.0.0"]).await;
    let leaked: &'static str = Box::leak(host.into_boxed_str());
    let (mut world, script) = World::start(packages, &["--insecure-registry", leaked]).await;
    world.seeded_refused_status = true;
    *script.lock().unwrap() = Box::new(installs_with_children);
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    installed(&world, "web", "4.0.0").await;
    let mut conditions = world.get("TenantInstance", "web").await["status"]["conditions"].clone();
    conditions.as_array_mut().unwrap().push(json!({"type": "Deleting", "status": "False",
        "message": "[E_PACKAGE_GONE] from the previous release", "generation": 1}));
    world.patch_status("TenantInstance", "web", json!({"conditions": conditions})).await;
    let refused = world.get("TenantInstance", "web").await;
    assert!(vynil_testkit::upstream::decode_instance(&refused).is_err(), "upstream refuses it: {refused}");
    eventually("the legacy condition removed", || async {
        let object = world.get("TenantInstance", "web").await;
        condition(&object, "Deleting").is_none().then_some(())
    })
    .await;
    delete(&world, "web").await;
    gone(&world, "web").await;
    let runs = world.agent.runs();
    assert!(runs.iter().all(|r| r.exit_code == Some(0)), "upstream's agent decoded its instance: {runs:?}");
    assert_eq!(runs.last().map(|r| r.job.action.as_str()), Some("delete"));
    world.stop().await;
}

/// #50 as an admin meets it, with a real registry holding real signatures
/// and the JukeBox's status as the scanner writes it (the scanner's own
/// tests check how it judges them): under `enforce` only the verified
/// revision is installed, `initFrom.version` naming an unverified one is
/// refused (from the catalog's verdict, or judged here when the catalog
/// does not list it), and once the key is removed the instance still
/// uninstalls: its delete Job runs, with a Warning Event.
#[tokio::test]
async fn under_enforce_only_the_verified_revision_installs_and_a_removed_key_never_blocks_an_uninstall() {
    use vynil_testkit::{SignatureLayer, Signer};
    let registry = RegistryServer::start().await.unwrap();
    let (host, publisher) = (registry.host(), registry.publisher());
    let release = Signer::from_label("release");
    let reference = format!("{host}/apps/web");
    let mut packages = Vec::new();
    let mut digests = Vec::new();
    for tag in ["0.0.9", "0.1.0", "0.2.0", "0.3.0"] {
        let spec = PackageSpec::new("apps", "web", PackageType::Tenant, tag);
        let digest = publisher.publish("apps/web", &spec).await.unwrap();
        let mut p = package(&host, "apps", "web", "tenant", tag, json!([]));
        p["digest"] = json!(digest);
        packages.push(p);
        digests.push(digest);
    }
    // 0.0.9 (not in the catalog) is signed by another key; 0.1.0 by the trusted one.
    let other = Signer::from_label("someone else");
    publisher
        .sign("apps/web", &digests[0], &[SignatureLayer::by(&other, &reference, &digests[0])])
        .await
        .unwrap();
    publisher
        .sign("apps/web", &digests[1], &[SignatureLayer::by(&release, &reference, &digests[1])])
        .await
        .unwrap();
    let mut catalog: Vec<Value> = packages.split_off(1);
    catalog[0]["signature"] = json!({"verdict": "verified", "key": "release", "reference": reference});
    catalog[1]["signature"] = json!({"verdict": "untrustedKey"});
    catalog[2]["signature"] = json!({"verdict": "unsigned"});
    let leaked: &'static str = Box::leak(host.clone().into_boxed_str());
    // The policy first, then the revisions (the catalog follows them in that
    // order): no instance sees them without it.
    let (world, script) = World::start(vec![], &["--insecure-registry", leaked]).await;
    *script.lock().unwrap() = Box::new(installs_with_children);
    let boxes: Api<JukeBox> = Api::all(world.client.clone());
    let source = json!({"list": [reference]});
    let policy =
        |keys: Value| json!({"spec": {"source": source, "verify": {"mode": "enforce", "keys": keys}}});
    let trusted = json!([{"name": "release", "public_key": release.public_pem()}]);
    boxes.patch("box", &Default::default(), &kube::api::Patch::Merge(&policy(trusted))).await.unwrap();
    world.publish(catalog.clone()).await;
    let mut grpc = world.grpc().await;

    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    installed(&world, "web", "0.1.0").await;
    let explained =
        grpc.explain(ExplainRequest { r#ref: Some(tenant(APPS, "web")) }).await.unwrap().into_inner();
    assert_eq!(
        explained.withheld,
        ["[E_UNVERIFIED] 0.3.0: unsigned", "[E_UNVERIFIED] 0.2.0: signed by an untrusted key"],
        "{}",
        explained.summary
    );
    for (name, version, verdict) in
        [("pinned", "0.2.0", "signed by an untrusted key"), ("older", "0.0.9", "signed by an untrusted key")]
    {
        let mut spec = web_spec();
        spec["initFrom"] = json!({"snapshot": "abc", "version": version});
        world.create("TenantInstance", name, spec, json!({})).await;
        let blocked = eventually("the InitFrom condition", || async {
            condition(&world.get("TenantInstance", name).await, "InitFrom").cloned()
        })
        .await;
        let message = blocked["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("[E_UNVERIFIED] initFrom.version {version}: {verdict}")),
            "{message}"
        );
        assert!(world.tags_run(name).is_empty(), "{name}: no Job");
    }

    // The key removed (the scanner then judges 0.1.0 untrusted): the uninstall still runs.
    boxes.patch("box", &Default::default(), &kube::api::Patch::Merge(&policy(json!([])))).await.unwrap();
    catalog[0]["signature"] = json!({"verdict": "untrustedKey"});
    world.publish(catalog).await;
    delete(&world, "web").await;
    gone(&world, "web").await;
    let runs: Vec<(String, Option<String>)> = world
        .agent
        .runs()
        .into_iter()
        .filter(|r| r.job.instance_name == "web")
        .map(|r| (r.job.action, r.job.tag))
        .collect();
    assert_eq!(runs, [("install".into(), Some("0.1.0".into())), ("delete".into(), Some("0.1.0".into()))]);
    let warned = world.api.objects("events.k8s.io", "events").into_iter().any(|e| {
        e["reason"] == "UnverifiedRevision"
            && e["regarding"]["name"] == "web"
            && e["note"].as_str().is_some_and(|n| n.starts_with("[E_UNVERIFIED]") && n.contains("untrusted"))
    });
    assert!(warned, "a Warning Event says the delete ran an unverified revision");
    world.stop().await;
}
