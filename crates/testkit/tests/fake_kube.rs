//! The fake API server, driven by the real `kube::Client`, kube-runtime's
//! `watcher` and `Controller`: one test per emulated semantic.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{batch::v1::Job, core::v1::ConfigMap};
use kube::{
    Api, Client, ResourceExt,
    api::{
        ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent,
        WatchParams,
    },
    discovery::Discovery,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        finalizer::{Event as Finalizer, finalizer},
        watcher,
    },
};
use serde_json::json;
use vynil_crds::{JukeBox, TenantInstance};
use vynil_testkit::kube_api::{
    AccessRule, AgentOutcome, ApiFault, ApiFaultAction, FakeAgent, FakeApiOptions, FakeApiServer,
};

mod common;
use common::{TestResult, eventually};

fn config_map(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    cm.data = Some(BTreeMap::from([("key".to_string(), "one".to_string())]));
    cm
}

fn jukebox(name: &str) -> Result<JukeBox, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "vynil.solidite.fr/v1", "kind": "JukeBox", "metadata": {"name": name},
        "spec": {"source": {"list": ["registry.example/apps/a"]}, "schedule": "0 * * * *"},
    }))
}

fn api_code(result: Result<impl std::fmt::Debug, kube::Error>) -> Option<u16> {
    match result {
        Err(kube::Error::Api(status)) => Some(status.code),
        _ => None,
    }
}

async fn server() -> Result<(FakeApiServer, Client), Box<dyn std::error::Error + Send + Sync>> {
    let server = FakeApiServer::start().await?;
    server.create_namespaces(&["apps", "other", "tenant-a", "vynil-system"])?;
    let client = server.client()?;
    Ok((server, client))
}

#[tokio::test]
async fn discovery_lists_our_crds_and_the_builtins() -> TestResult {
    let (_server, client) = server().await?;
    let version = client.apiserver_version().await?;
    assert_eq!((version.major.as_str(), version.minor.as_str()), ("1", "33"));
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut found = Vec::new();
    for group in discovery.groups() {
        for (resource, _) in group.recommended_resources() {
            found.push(format!("{}/{}", resource.api_version, resource.plural));
        }
    }
    for expected in [
        "vynil.solidite.fr/v1/jukeboxes",
        "vynil.solidite.fr/v1/tenantinstances",
        "vynil.solidite.fr/v1/serviceinstances",
        "vynil.solidite.fr/v1/systeminstances",
        "batch/v1/jobs",
        "coordination.k8s.io/v1/leases",
        "events.k8s.io/v1/events",
        "apiextensions.k8s.io/v1/customresourcedefinitions",
        "v1/secrets",
        "v1/configmaps",
        "v1/namespaces",
    ] {
        assert!(found.iter().any(|f| f == expected), "{expected} missing from {found:?}");
    }
    // The CRDs are objects too, and a new CRD serves its resource.
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >(&()),
    );
    assert_eq!(crds.list(&ListParams::default()).await?.items.len(), 4);
    let widget_crd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
                 "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}}}]},
    }))?;
    crds.create(&PostParams::default(), &widget_crd).await?;
    let widget = ApiResource {
        group: "example.com".into(),
        version: "v1".into(),
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "apps", &widget);
    let one: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "one"}, "spec": {"size": 1},
    }))?;
    widgets.create(&PostParams::default(), &one).await?;
    assert_eq!(widgets.list(&ListParams::default()).await?.items.len(), 1);
    crds.delete("widgets.example.com", &DeleteParams::default()).await?;
    assert_eq!(
        api_code(widgets.list(&ListParams::default()).await),
        Some(404),
        "the resource went with its CRD"
    );
    Ok(())
}

#[tokio::test]
async fn a_watch_with_initial_events_ends_them_with_a_bookmark() -> TestResult {
    let (_server, client) = server().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    cms.create(&PostParams::default(), &config_map("one", &[])).await?;
    let params = WatchParams::default().initial_events();
    let mut events = cms.watch(&params, "").await?.boxed();
    match tokio::time::timeout(Duration::from_secs(5), events.try_next()).await?? {
        Some(WatchEvent::Added(cm)) => assert_eq!(cm.name_any(), "one"),
        other => return Err(format!("expected one added, got {other:?}").into()),
    }
    match tokio::time::timeout(Duration::from_secs(5), events.try_next()).await?? {
        Some(WatchEvent::Bookmark(mark)) => {
            assert_eq!(
                mark.metadata.annotations.get("k8s.io/initial-events-end").map(String::as_str),
                Some("true")
            )
        }
        other => return Err(format!("expected the initial-events-end bookmark, got {other:?}").into()),
    }
    Ok(())
}

#[tokio::test]
async fn writes_bump_versions_and_stale_preconditions_conflict() -> TestResult {
    let (server, client) = server().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    let created = cms.create(&PostParams::default(), &config_map("one", &[])).await?;
    let rv1: u64 = created.resource_version().unwrap_or_default().parse()?;
    assert!(created.uid().is_some() && created.creation_timestamp().is_some());
    assert_eq!(api_code(cms.create(&PostParams::default(), &config_map("one", &[])).await), Some(409));

    // A write that changes nothing changes no version.
    let same = cms.replace("one", &PostParams::default(), &created).await?;
    assert_eq!(same.resource_version(), created.resource_version());

    let mut changed = created.clone();
    changed.data = Some(BTreeMap::from([("key".into(), "two".into())]));
    let replaced = cms.replace("one", &PostParams::default(), &changed).await?;
    let rv2: u64 = replaced.resource_version().unwrap_or_default().parse()?;
    assert!(rv2 > rv1);
    assert_eq!(server.resource_version(), rv2);

    // The old version is stale now: PUT and patch with it both conflict.
    assert_eq!(api_code(cms.replace("one", &PostParams::default(), &changed).await), Some(409));
    let stale = json!({"metadata": {"resourceVersion": rv1.to_string()}, "data": {"key": "three"}});
    assert_eq!(api_code(cms.patch("one", &PatchParams::default(), &Patch::Merge(&stale)).await), Some(409));
    assert_eq!(cms.get("one").await?.data.and_then(|d| d.get("key").cloned()).as_deref(), Some("two"));

    assert_eq!(api_code(cms.get("missing").await), Some(404));
    assert_eq!(api_code(cms.create(&PostParams::default(), &config_map("Bad_Name", &[])).await), Some(422));
    Ok(())
}

#[tokio::test]
async fn the_status_subresource_is_written_apart_and_generation_counts_spec_changes() -> TestResult {
    let (_server, client) = server().await?;
    let boxes: Api<JukeBox> = Api::all(client.clone());
    let mut with_status = jukebox("box")?;
    with_status.status = Some(Default::default());
    let created = boxes.create(&PostParams::default(), &with_status).await?;
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.status.is_none(), "create drops the status of a kind with a status subresource");

    // A status patch changes the status only; the generation stays.
    let status = json!({"status": {"conditions": [], "packages": []}, "spec": {"schedule": "ignored"}});
    let patched = boxes.patch_status("box", &PatchParams::default(), &Patch::Merge(&status)).await?;
    assert!(patched.status.is_some());
    assert_eq!(patched.spec.schedule, "0 * * * *");
    assert_eq!(patched.metadata.generation, Some(1));

    // A spec change through the object bumps the generation; its status part is ignored.
    let spec = json!({"spec": {"schedule": "*/5 * * * *"}, "status": null});
    let patched = boxes.patch("box", &PatchParams::default(), &Patch::Merge(&spec)).await?;
    assert_eq!(patched.metadata.generation, Some(2));
    assert!(patched.status.is_some(), "the object's endpoint cannot erase the status");

    // Labels are metadata: no generation bump.
    let labels = json!({"metadata": {"labels": {"team": "a"}}});
    let patched = boxes.patch("box", &PatchParams::default(), &Patch::Merge(&labels)).await?;
    assert_eq!(patched.metadata.generation, Some(2));

    // A status write with a stale resourceVersion fails with 409.
    let stale =
        json!({"metadata": {"resourceVersion": created.resource_version()}, "status": {"packages": []}});
    let result = boxes.patch_status("box", &PatchParams::default(), &Patch::Merge(&stale)).await;
    assert_eq!(api_code(result), Some(409));
    Ok(())
}

#[tokio::test]
async fn json_patches_apply_with_tests_and_apply_creates() -> TestResult {
    let (_server, client) = server().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    cms.create(&PostParams::default(), &config_map("one", &[])).await?;
    let ok: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/data/key", "value": "one"},
        {"op": "replace", "path": "/data/key", "value": "two"},
    ]))?;
    let patched = cms.patch("one", &PatchParams::default(), &Patch::Json::<()>(ok)).await?;
    assert_eq!(patched.data.and_then(|d| d.get("key").cloned()).as_deref(), Some("two"));
    let failing: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/data/key", "value": "one"}]))?;
    assert_eq!(
        api_code(cms.patch("one", &PatchParams::default(), &Patch::Json::<()>(failing)).await),
        Some(422)
    );

    // Server-side apply (approximated as a merge) creates what is missing.
    let applied =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "two"}, "data": {"a": "b"}});
    let created = cms.patch("two", &PatchParams::apply("test").force(), &Patch::Apply(&applied)).await?;
    assert_eq!(created.data.and_then(|d| d.get("a").cloned()).as_deref(), Some("b"));
    // Strategic merge is a merge patch here.
    let smp = json!({"data": {"c": "d"}});
    let merged = cms.patch("two", &PatchParams::default(), &Patch::Strategic(&smp)).await?;
    assert_eq!(merged.data.map(|d| d.len()), Some(2));
    Ok(())
}

#[tokio::test]
async fn finalizers_hold_deletion_and_owners_take_their_dependents() -> TestResult {
    let (_server, client) = server().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    let mut held = config_map("held", &[]);
    held.metadata.finalizers = Some(vec!["vynil.solidite.fr/test".into()]);
    let owner = cms.create(&PostParams::default(), &held).await?;

    cms.delete("held", &DeleteParams::default()).await?;
    let marked = cms.get("held").await?;
    assert!(marked.metadata.deletion_timestamp.is_some(), "deletion only marks while a finalizer is left");

    // A dependent of the owner goes with it.
    let mut child = config_map("child", &[]);
    child.metadata.owner_references =
        Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "held".into(),
            uid: owner.uid().unwrap_or_default(),
            ..Default::default()
        }]);
    cms.create(&PostParams::default(), &child).await?;

    let release = json!({"metadata": {"finalizers": null}});
    cms.patch("held", &PatchParams::default(), &Patch::Merge(&release)).await?;
    assert_eq!(api_code(cms.get("held").await), Some(404), "the last finalizer removed, the object is gone");
    eventually(|| async { api_code(cms.get("child").await) == Some(404) }, "its dependent is collected")
        .await?;

    // Orphan propagation frees dependents of their reference, and keeps them.
    let plain = cms.create(&PostParams::default(), &config_map("plain", &[])).await?;
    let mut orphan = config_map("orphan", &[]);
    orphan.metadata.owner_references = Some(vec![owner_ref("plain", &plain)]);
    cms.create(&PostParams::default(), &orphan).await?;
    cms.delete(
        "plain",
        &DeleteParams {
            propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
            ..Default::default()
        },
    )
    .await?;
    eventually(|| async { api_code(cms.get("plain").await) == Some(404) }, "the orphaning owner goes")
        .await?;
    let kept = cms.get("orphan").await?;
    assert!(kept.metadata.owner_references.unwrap_or_default().is_empty(), "its reference was removed");
    Ok(())
}

fn owner_ref(
    name: &str,
    owner: &ConfigMap,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: name.into(),
        uid: owner.uid().unwrap_or_default(),
        ..Default::default()
    }
}

#[tokio::test]
async fn selectors_filter_lists_and_watches() -> TestResult {
    let (_server, client) = server().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    for (name, tier) in [("a", "front"), ("b", "back"), ("c", "front")] {
        cms.create(&PostParams::default(), &config_map(name, &[("tier", tier), ("app", "web")])).await?;
    }
    Api::<ConfigMap>::namespaced(client.clone(), "other")
        .create(&PostParams::default(), &config_map("a", &[("tier", "front")]))
        .await?;
    let names =
        |list: kube::api::ObjectList<ConfigMap>| list.items.iter().map(|c| c.name_any()).collect::<Vec<_>>();
    assert_eq!(names(cms.list(&ListParams::default().labels("tier=front")).await?), ["a", "c"]);
    assert_eq!(names(cms.list(&ListParams::default().labels("tier in (back),app")).await?), ["b"]);
    assert_eq!(names(cms.list(&ListParams::default().fields("metadata.name!=a")).await?), ["b", "c"]);
    let everywhere: Api<ConfigMap> = Api::all(client.clone());
    assert_eq!(everywhere.list(&ListParams::default().labels("tier=front")).await?.items.len(), 3);

    let rv = cms.list(&ListParams::default()).await?.metadata.resource_version.unwrap_or_default();
    let mut events = cms.watch(&WatchParams::default().labels("tier=back"), &rv).await?.boxed();
    cms.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"x": "1"}}))).await?;
    cms.patch("b", &PatchParams::default(), &Patch::Merge(json!({"data": {"x": "1"}}))).await?;
    match tokio::time::timeout(Duration::from_secs(5), events.try_next()).await?? {
        Some(WatchEvent::Modified(cm)) => assert_eq!(cm.name_any(), "b"),
        other => return Err(format!("expected b modified, got {other:?}").into()),
    }
    Ok(())
}

#[tokio::test]
async fn a_resumed_watch_misses_nothing_and_a_compacted_one_is_told_410() -> TestResult {
    let (server, client) = server().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    let first = cms.create(&PostParams::default(), &config_map("one", &[])).await?;
    let resume_from = first.resource_version().unwrap_or_default();
    // Changes happen while nobody watches…
    cms.create(&PostParams::default(), &config_map("two", &[])).await?;
    cms.patch("one", &PatchParams::default(), &Patch::Merge(json!({"data": {"key": "changed"}}))).await?;
    cms.delete("two", &DeleteParams::default()).await?;
    // …and a watch resumed from the last version seen replays them in order.
    let mut events = cms.watch(&WatchParams::default(), &resume_from).await?.boxed();
    let mut seen = Vec::new();
    for _ in 0..3 {
        match tokio::time::timeout(Duration::from_secs(5), events.try_next()).await?? {
            Some(WatchEvent::Added(c)) => seen.push(format!("added {}", c.name_any())),
            Some(WatchEvent::Modified(c)) => seen.push(format!("modified {}", c.name_any())),
            Some(WatchEvent::Deleted(c)) => seen.push(format!("deleted {}", c.name_any())),
            other => return Err(format!("unexpected {other:?}").into()),
        }
    }
    assert_eq!(seen, ["added two", "modified one", "deleted two"]);

    server.compact();
    let mut expired = cms.watch(&WatchParams::default(), &resume_from).await?.boxed();
    match tokio::time::timeout(Duration::from_secs(5), expired.try_next()).await?? {
        Some(WatchEvent::Error(status)) if status.code == 410 => {}
        other => return Err(format!("expected a 410 error event, got {other:?}").into()),
    }
    Ok(())
}

#[tokio::test]
async fn watches_receive_bookmarks_when_they_allow_them() -> TestResult {
    let options = FakeApiOptions { bookmark_interval: Duration::from_millis(50), ..Default::default() };
    let server = FakeApiServer::start_with(options).await?;
    server.create_namespaces(&["apps"])?;
    let cms: Api<ConfigMap> = Api::namespaced(server.client()?, "apps");
    cms.create(&PostParams::default(), &config_map("one", &[])).await?;
    let rv = server.resource_version().to_string();
    let mut events =
        cms.watch(&WatchParams { bookmarks: true, ..WatchParams::default() }, &rv).await?.boxed();
    match tokio::time::timeout(Duration::from_secs(5), events.try_next()).await?? {
        Some(WatchEvent::Bookmark(mark)) => assert_eq!(mark.metadata.resource_version, rv),
        other => return Err(format!("expected a bookmark, got {other:?}").into()),
    }
    Ok(())
}

#[tokio::test]
async fn the_runtime_watcher_follows_lists_watches_and_relists_after_410() -> TestResult {
    // No bookmark may move the watcher past the compaction in this test.
    let options = FakeApiOptions { bookmark_interval: Duration::from_secs(600), ..Default::default() };
    let server = FakeApiServer::start_with(options).await?;
    server.create_namespaces(&["apps"])?;
    let client = server.client()?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    cms.create(&PostParams::default(), &config_map("before", &[])).await?;
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let recorder = seen.clone();
    let task = tokio::spawn(
        watcher(cms.clone(), watcher::Config::default().timeout(1)).applied_objects().for_each(move |cm| {
            if let Ok(cm) = cm
                && let Ok(mut seen) = recorder.lock()
            {
                seen.push(cm.name_any());
            }
            futures::future::ready(())
        }),
    );
    let wait_for = |name: &'static str| {
        let seen = seen.clone();
        async move {
            for _ in 0..500 {
                if seen.lock().map(|s| s.iter().any(|n| n == name)).unwrap_or(false) {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        }
    };
    assert!(wait_for("before").await, "the initial list");
    cms.create(&PostParams::default(), &config_map("after", &[])).await?;
    assert!(wait_for("after").await, "the watch");
    let count = |verb: &str| {
        server.requests().iter().filter(|r| r.verb == verb && r.resource == "configmaps").count()
    };
    let (lists, watches) = (count("list"), count("watch"));
    assert!(lists >= 1 && watches >= 1, "{lists} lists, {watches} watches");
    // The cluster moves on elsewhere and its history is compacted; when the
    // watch times out (1 s) and resumes from its last version, the server
    // answers 410 and the watcher lists again, then keeps following.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), "apps");
    let mut secret = k8s_openapi::api::core::v1::Secret::default();
    secret.metadata.name = Some("elsewhere".into());
    secrets.create(&PostParams::default(), &secret).await?;
    server.compact();
    for _ in 0..500 {
        if count("list") > lists {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(count("list") > lists, "no relist after 410");
    cms.create(&PostParams::default(), &config_map("later", &[])).await?;
    assert!(wait_for("later").await, "the watch after the relist");
    task.abort();
    Ok(())
}

struct Context {
    client: Client,
    cleaned: Mutex<Vec<String>>,
}

#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    #[error(transparent)]
    Finalizer(#[from] Box<kube::runtime::finalizer::Error<kube::Error>>),
}

async fn reconcile(jukebox: Arc<JukeBox>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let api: Api<JukeBox> = Api::all(ctx.client.clone());
    finalizer(&api, "test.vynil.solidite.fr/cleanup", jukebox, |event| async {
        match event {
            Finalizer::Apply(jb) => {
                let status = json!({"status": {"conditions": [], "packages": []}});
                api.patch_status(&jb.name_any(), &PatchParams::default(), &Patch::Merge(&status)).await?;
                Ok(Action::await_change())
            }
            Finalizer::Cleanup(jb) => {
                if let Ok(mut cleaned) = ctx.cleaned.lock() {
                    cleaned.push(jb.name_any());
                }
                Ok(Action::await_change())
            }
        }
    })
    .await
    .map_err(|e| ReconcileError::Finalizer(Box::new(e)))
}

#[tokio::test]
async fn a_controller_with_a_finalizer_runs_its_whole_loop() -> TestResult {
    let (server, client) = server().await?;
    let boxes: Api<JukeBox> = Api::all(client.clone());
    let ctx = Arc::new(Context { client: client.clone(), cleaned: Mutex::default() });
    let controller = tokio::spawn(
        Controller::new(boxes.clone(), watcher::Config::default())
            .run(reconcile, |_, _, _| Action::requeue(Duration::from_millis(100)), ctx.clone())
            .for_each(|_| futures::future::ready(())),
    );
    boxes.create(&PostParams::default(), &jukebox("reconciled")?).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let jb = boxes.get("reconciled").await?;
        if jb.status.is_some() && jb.finalizers().len() == 1 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("not reconciled: {jb:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    boxes.delete("reconciled", &DeleteParams::default()).await?;
    loop {
        if api_code(boxes.get("reconciled").await) == Some(404) {
            break;
        }
        if Instant::now() > deadline {
            return Err("the finalizer was never removed".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ctx.cleaned.lock().map(|c| c.clone()).unwrap_or_default(), ["reconciled"]);
    controller.abort();
    assert!(
        server.requests().iter().any(|r| r.verb == "patch" && r.subresource.as_deref() == Some("status"))
    );
    Ok(())
}

#[tokio::test]
async fn reviews_answer_from_the_test_table_and_requests_are_logged() -> TestResult {
    let (server, client) = server().await?;
    server.add_token("secret-token", "alice", &["team"]);
    server.allow(AccessRule {
        user: "alice".into(),
        verb: "get".into(),
        resource: "jukeboxes.vynil.solidite.fr".into(),
        namespace: None,
    });
    let reviews: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<k8s_openapi::api::authentication::v1::TokenReview>(&()),
    );
    let review: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
        "spec": {"token": "secret-token"},
    }))?;
    let answered = reviews.create(&PostParams::default(), &review).await?;
    assert_eq!(answered.data["status"]["user"]["username"], "alice");
    let unknown: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
        "spec": {"token": "other"},
    }))?;
    assert_eq!(
        reviews.create(&PostParams::default(), &unknown).await?.data["status"]["authenticated"],
        false
    );

    let sars: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<k8s_openapi::api::authorization::v1::SubjectAccessReview>(&()),
    );
    let ask = |verb: &str| {
        serde_json::from_value::<DynamicObject>(json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {},
            "spec": {"user": "alice", "resourceAttributes": {"verb": verb, "group": "vynil.solidite.fr", "resource": "jukeboxes"}},
        }))
    };
    assert_eq!(sars.create(&PostParams::default(), &ask("get")?).await?.data["status"]["allowed"], true);
    assert_eq!(sars.create(&PostParams::default(), &ask("delete")?).await?.data["status"]["allowed"], false);

    let boxes: Api<JukeBox> = Api::all(client.clone());
    boxes.create(&PostParams::default(), &jukebox("logged")?).await?;
    let log = server.requests();
    let create = log.iter().find(|r| r.verb == "create" && r.resource == "jukeboxes");
    assert_eq!(create.map(|r| (r.group.as_str(), r.name.is_none())), Some(("vynil.solidite.fr", true)));
    Ok(())
}

#[tokio::test]
async fn injected_faults_hit_the_named_verb_and_resource_only() -> TestResult {
    let (server, client) = server().await?;
    let boxes: Api<JukeBox> = Api::all(client.clone());
    boxes.create(&PostParams::default(), &jukebox("box")?).await?;
    server.inject(ApiFault::new(Some("patch"), Some("jukeboxes/status"), 1, ApiFaultAction::Status(409)));
    server.inject(ApiFault::new(Some("get"), Some("jukeboxes"), 1, ApiFaultAction::Status(500)));
    let status = json!({"status": {"packages": []}});
    assert_eq!(
        api_code(boxes.patch_status("box", &PatchParams::default(), &Patch::Merge(&status)).await),
        Some(409)
    );
    assert!(
        boxes.patch_status("box", &PatchParams::default(), &Patch::Merge(&status)).await.is_ok(),
        "once only"
    );
    assert_eq!(api_code(boxes.get("box").await), Some(500));
    assert!(boxes.get("box").await.is_ok());

    // A concurrent writer slipped in first: the read version is stale for real.
    let read = boxes.get("box").await?;
    let other = json!({"metadata": {"labels": {"by": "other"}}});
    server.inject(ApiFault::new(Some("patch"), Some("jukeboxes"), 1, ApiFaultAction::WriteFirst(other)));
    let mine =
        json!({"metadata": {"resourceVersion": read.resource_version()}, "spec": {"schedule": "1 * * * *"}});
    assert_eq!(api_code(boxes.patch("box", &PatchParams::default(), &Patch::Merge(&mine)).await), Some(409));
    assert_eq!(boxes.get("box").await?.labels().get("by").map(String::as_str), Some("other"));

    server.inject(ApiFault::new(Some("list"), None, 1, ApiFaultAction::Delay(Duration::from_millis(300))));
    let started = Instant::now();
    boxes.list(&ListParams::default()).await?;
    assert!(started.elapsed() >= Duration::from_millis(300));
    Ok(())
}

#[tokio::test]
async fn the_fake_agent_runs_in_its_job_and_a_failing_one_is_seen_through_the_watch() -> TestResult {
    let (server, client) = server().await?;
    let instances: Api<TenantInstance> = Api::namespaced(client.clone(), "tenant-a");
    let instance: TenantInstance = serde_json::from_value(json!({
        "apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "app", "namespace": "tenant-a"},
        "spec": {"jukebox": "box", "category": "apps", "package": "app"},
    }))?;
    instances.create(&PostParams::default(), &instance).await?;

    let agent = FakeAgent::start(&server, "vynil-system", |job| match job.action.as_str() {
        "install" => AgentOutcome::Succeed {
            children: vec![("vitals".into(), vec![json!({"kind": "Deployment", "name": "app"})])],
        },
        _ => AgentOutcome::fail("the delete hook exited 1"),
    })?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "vynil-system");
    let rv = server.resource_version().to_string();
    let mut events = jobs.watch(&WatchParams::default(), &rv).await?.boxed();
    jobs.create(&PostParams::default(), &agent_job("install", "1.2.3")?).await?;
    let install = loop {
        let done = jobs.get("tenant--tenant-a--app-install").await?;
        let conditions = done.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
        if conditions.iter().any(|c| c.type_ == "Complete" && c.status == "True") {
            break agent.runs();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(install[0].exit_code, Some(0), "{:?}", install[0].stderr);
    let installed = instances.get("app").await?;
    let status = installed.status.ok_or("no status written")?;
    assert_eq!(status.tag.as_deref(), Some("1.2.3"));
    assert_eq!(status.vitals.as_ref().map(Vec::len), Some(1));

    jobs.create(&PostParams::default(), &agent_job("delete", "1.2.3")?).await?;
    let observed = loop {
        match tokio::time::timeout(Duration::from_secs(10), events.try_next()).await?? {
            Some(WatchEvent::Modified(job)) if job.name_any().contains("delete") => {
                let conditions = job.status.and_then(|s| s.conditions).unwrap_or_default();
                if let Some(failed) = conditions.iter().find(|c| c.type_ == "Failed" && c.status == "True") {
                    break failed.clone();
                }
            }
            Some(_) => continue,
            None => return Err("the watch ended".into()),
        }
    };
    // The Job controller's words, after backoffLimit (2) + 1 pods, each
    // container exiting 1 with the script's message.
    assert_eq!(observed.reason.as_deref(), Some("BackoffLimitExceeded"));
    let runs = agent.runs();
    let delete = runs.iter().find(|r| r.job.action == "delete").ok_or("no delete run")?;
    assert_eq!(delete.exit_code, Some(1));
    assert!(delete.stderr.contains("the delete hook exited 1"), "{}", delete.stderr);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "vynil-system");
    let failed_pods =
        pods.list(&ListParams::default().labels("job-name=tenant--tenant-a--app-delete")).await?.items;
    assert_eq!(failed_pods.len(), 3);
    let after = instances.get("app").await?;
    assert_eq!(
        after.status.and_then(|s| s.vitals).map(|v| v.len()),
        Some(1),
        "a failed delete keeps the children"
    );
    Ok(())
}

fn agent_job(action: &str, tag: &str) -> Result<Job, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": format!("tenant--tenant-a--app-{action}"), "namespace": "vynil-system", "labels": {
            "app.kubernetes.io/component": "agent", "vynil.solidite.fr/action": action,
            "vynil.solidite.fr/type": "tenant", "namespace": "tenant-a", "instance": "app",
        }},
        "spec": {"backoffLimit": 2, "template": {"spec": {"restartPolicy": "Never", "containers": [{
            // Upstream's agent contract: it finds its instance by this env, not by labels.
            "name": action, "image": vynil_testkit::kube_api::UPSTREAM_AGENT_IMAGE, "args": ["tenant", action],
            "env": [{"name": "NAMESPACE", "value": "tenant-a"}, {"name": "INSTANCE", "value": "app"},
                {"name": "TAG", "value": tag}, {"name": "OPTIONS_HASH", "value": "abc"}],
        }]}}},
    }))
}

/// A real API server checks a delete's `preconditions` against the stored
/// object: another UID (the object was replaced) is `409 Conflict`.
#[tokio::test]
async fn a_delete_whose_uid_precondition_names_another_object_is_a_conflict() -> TestResult {
    let (server, client) = server().await?;
    let maps: Api<ConfigMap> = Api::namespaced(client, "apps");
    let first = maps.create(&PostParams::default(), &config_map("settings", &[])).await?;
    maps.delete("settings", &DeleteParams::default()).await?;
    maps.create(&PostParams::default(), &config_map("settings", &[])).await?;
    let preconditions = kube::api::Preconditions { uid: first.metadata.uid, resource_version: None };
    let params = DeleteParams { preconditions: Some(preconditions), ..DeleteParams::default() };
    let refused = maps.delete("settings", &params).await;
    assert_eq!(api_code(refused.map(drop)), Some(409));
    assert!(server.object("", "configmaps", Some("apps"), "settings").is_some(), "the replacement stays");
    Ok(())
}

#[tokio::test]
async fn a_watch_with_a_selector_sees_an_object_enter_as_added_and_leave_as_deleted() -> TestResult {
    let (_server, client) = server().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    cms.create(&PostParams::default(), &config_map("moving", &[("tier", "web")])).await?;
    let params = WatchParams::default().labels("tier=db");
    let mut events = cms.watch(&params, "0").await?.boxed();
    let relabel = |tier: &str| json!({"metadata": {"labels": {"tier": tier}}});
    cms.patch("moving", &PatchParams::default(), &Patch::Merge(&relabel("db"))).await?;
    cms.patch("moving", &PatchParams::default(), &Patch::Merge(&json!({"data": {"key": "two"}}))).await?;
    cms.patch("moving", &PatchParams::default(), &Patch::Merge(&relabel("web"))).await?;
    // A change outside the selector, on both sides, is not sent.
    cms.patch("moving", &PatchParams::default(), &Patch::Merge(&json!({"data": {"key": "three"}}))).await?;
    cms.patch("moving", &PatchParams::default(), &Patch::Merge(&relabel("db"))).await?;
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let event = tokio::time::timeout(Duration::from_secs(5), events.try_next()).await??;
        let (kind, object) = match event {
            Some(WatchEvent::Added(o)) => ("ADDED", o),
            Some(WatchEvent::Modified(o)) => ("MODIFIED", o),
            Some(WatchEvent::Deleted(o)) => ("DELETED", o),
            other => return Err(format!("unexpected {other:?}").into()),
        };
        let tier = object.labels().get("tier").cloned().unwrap_or_default();
        seen.push(format!("{kind} {tier}"));
    }
    assert_eq!(seen, ["ADDED db", "MODIFIED db", "DELETED web", "ADDED db"]);
    Ok(())
}

/// A watch trails the store, as the API server's watch cache trails etcd:
/// with `watch_lag`, a read right after a write sees it at once, its watch
/// event comes no sooner than the lag after the write, and a burst of
/// writes is not delivered one lag per event.
#[tokio::test]
async fn a_lagging_watch_delivers_each_event_its_lag_after_the_write_while_reads_see_it_at_once() -> TestResult
{
    let lag = Duration::from_secs(1);
    let server = FakeApiServer::start_with(FakeApiOptions { watch_lag: lag, ..Default::default() }).await?;
    server.create_namespaces(&["apps"])?;
    let cms: Api<ConfigMap> = Api::namespaced(server.client()?, "apps");
    let mut events = cms.watch(&WatchParams::default(), "0").await?.boxed();
    let mut written = Vec::new();
    for i in 0..5 {
        // Taken before the create is sent: the server's write is no sooner.
        written.push(std::time::Instant::now());
        cms.create(&PostParams::default(), &config_map(&format!("burst-{i}"), &[])).await?;
    }
    assert!(cms.get_opt("burst-0").await?.is_some(), "the store has it");
    let mut delivered = Vec::new();
    while delivered.len() < 5 {
        if let Some(WatchEvent::Added(o)) =
            tokio::time::timeout(Duration::from_secs(30), events.try_next()).await??
        {
            delivered.push((o.name_any(), std::time::Instant::now()));
        }
    }
    let names: Vec<&str> = delivered.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["burst-0", "burst-1", "burst-2", "burst-3", "burst-4"], "in order");
    for ((name, at), written) in delivered.iter().zip(&written) {
        assert!(*at >= *written + lag, "{name} delivered {:?} after its write", *at - *written);
    }
    // Each event waits out its own lag, not the events' before it: lags
    // that added up would put a lag between one delivery and the next.
    // Measured against the writes' own spread, so a slow machine's slower
    // writes are not counted as lag.
    let spread = |first: std::time::Instant, last: std::time::Instant| last - first;
    let delivery = spread(delivered[0].1, delivered[4].1);
    let writing = spread(written[0], written[4]);
    assert!(
        delivery < writing + lag * 2,
        "the lags added up: delivered over {delivery:?}, written over {writing:?}"
    );
    Ok(())
}

#[tokio::test]
async fn lists_are_served_in_pages_with_a_continue_token() -> TestResult {
    let (_server, client) = server().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    for i in 0..7 {
        cms.create(&PostParams::default(), &config_map(&format!("cm-{i}"), &[])).await?;
    }
    let first = cms.list(&ListParams::default().limit(3)).await?;
    assert_eq!(first.items.len(), 3);
    assert_eq!(first.metadata.remaining_item_count, Some(4));
    let mut names: Vec<String> = first.items.iter().map(ResourceExt::name_any).collect();
    let mut token = first.metadata.continue_;
    while let Some(next) = token.filter(|t| !t.is_empty()) {
        let page = cms.list(&ListParams::default().limit(3).continue_token(&next)).await?;
        assert!(page.items.len() <= 3);
        names.extend(page.items.iter().map(ResourceExt::name_any));
        token = page.metadata.continue_;
    }
    let expected: Vec<String> = (0..7).map(|i| format!("cm-{i}")).collect();
    assert_eq!(names, expected, "every object once, in order");
    let status = cms.list(&ListParams::default().continue_token("not-a-token")).await;
    assert_eq!(api_code(status), Some(400));
    // kube-runtime's watcher pages its lists and still sees every object.
    let all: Vec<ConfigMap> = watcher(cms.clone(), watcher::Config::default().page_size(2))
        .default_backoff()
        .applied_objects()
        .take(7)
        .try_collect()
        .await?;
    assert_eq!(all.len(), 7);
    Ok(())
}
