//! The fake API server refuses, prunes, defaults and collects as a real one
//! does: one test per rule, each asserting the real server's status code and
//! message shape (`422 Invalid` with `details.causes[].field`, `403
//! Forbidden`, `404`, `409 AlreadyExists`, `413`, "request is too large").
//! The expected messages are the API server's (`apimachinery`'s
//! `field.Error` rendering, `NamespaceLifecycle`, etcd's limit), not ours.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use k8s_openapi::api::{batch::v1::Job, core::v1::ConfigMap, core::v1::Namespace};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    core::Status,
};
use serde_json::{Value, json};
use vynil_crds::TenantInstance;
use vynil_testkit::kube_api::FakeApiServer;

mod common;
use common::{TestResult, eventually};

async fn server() -> Result<(FakeApiServer, Client), Box<dyn std::error::Error + Send + Sync>> {
    let server = FakeApiServer::start().await?;
    server.create_namespaces(&["apps"])?;
    let client = server.client()?;
    Ok((server, client))
}

/// The `Status` a refused request was answered with.
fn refusal<T: std::fmt::Debug>(result: kube::Result<T>) -> Box<Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected the API server to refuse, got {other:?}"),
    }
}

/// `(field, reason)` of each cause.
fn causes(status: &Status) -> Vec<(String, String)> {
    status.details.iter().flat_map(|d| d.causes.iter()).map(|c| (c.field.clone(), c.reason.clone())).collect()
}

fn config_map(value: Value) -> ConfigMap {
    serde_json::from_value(value).unwrap()
}

#[tokio::test]
async fn a_label_value_over_63_characters_is_invalid() -> TestResult {
    let (_server, client) = server().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client, "apps");
    let long = "a".repeat(64);
    let status = refusal(
        cms.create(
            &PostParams::default(),
            &config_map(json!({"metadata": {"name": "x", "labels": {"instance": long}}})),
        )
        .await,
    );
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert_eq!(causes(&status), vec![("metadata.labels".to_string(), "FieldValueInvalid".to_string())]);
    assert!(
        status.message.starts_with(&format!(
            "ConfigMap \"x\" is invalid: metadata.labels: Invalid value: \"{long}\": must be no more than 63 characters"
        )),
        "{}",
        status.message
    );
    // A key with two slashes, and one whose name part starts with '-'.
    for key in ["a/b/c", "example.com/-x"] {
        let body = config_map(json!({"metadata": {"name": "y", "labels": {key: "v"}}}));
        let status = refusal(cms.create(&PostParams::default(), &body).await);
        assert_eq!(status.code, 422, "{key}");
        assert!(status.message.contains(&format!("Invalid value: \"{key}\"")), "{}", status.message);
    }
    let fine =
        json!({"metadata": {"name": "z", "labels": {"app.kubernetes.io/name": "My_value.1", "empty": ""}}});
    cms.create(&PostParams::default(), &config_map(fine)).await?;
    Ok(())
}

#[tokio::test]
async fn names_follow_their_kinds_rule_and_generated_names_fit() -> TestResult {
    let (_server, client) = server().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    let status = refusal(
        cms.create(&PostParams::default(), &config_map(json!({"metadata": {"name": "Upper"}}))).await,
    );
    assert_eq!(causes(&status), vec![("metadata.name".to_string(), "FieldValueInvalid".to_string())]);
    assert!(status.message.contains("a lowercase RFC 1123 subdomain must consist of"), "{}", status.message);
    // A subdomain may have dots; a namespace (an RFC 1123 label) may not, nor exceed 63.
    cms.create(&PostParams::default(), &config_map(json!({"metadata": {"name": "a.b"}}))).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for name in ["a.b".to_string(), "n".repeat(64)] {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        let status = refusal(namespaces.create(&PostParams::default(), &ns).await);
        assert_eq!(status.code, 422, "{name}");
        assert!(
            status.message.starts_with(&format!("Namespace \"{name}\" is invalid: metadata.name")),
            "{}",
            status.message
        );
    }
    // generateName: the prefix is cut so that prefix and suffix fit in 63.
    let generated = cms
        .create(&PostParams::default(), &config_map(json!({"metadata": {"generateName": "p".repeat(80)}})))
        .await?;
    assert_eq!(generated.name_any().len(), 63);
    assert!(generated.name_any().starts_with(&"p".repeat(58)));
    // The same name twice.
    let status =
        refusal(cms.create(&PostParams::default(), &config_map(json!({"metadata": {"name": "a.b"}}))).await);
    assert_eq!((status.code, status.reason.as_str()), (409, "AlreadyExists"));
    Ok(())
}

#[tokio::test]
async fn annotations_objects_and_requests_have_the_servers_size_limits() -> TestResult {
    let (_server, client) = server().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    let big = "x".repeat(256 * 1024);
    let body = config_map(json!({"metadata": {"name": "notes", "annotations": {"note": big}}}));
    let status = refusal(cms.create(&PostParams::default(), &body).await);
    assert_eq!(causes(&status), vec![("metadata.annotations".to_string(), "FieldValueTooLong".to_string())]);
    assert!(status.message.contains("Too long: must have at most 262144 bytes"), "{}", status.message);
    // A ConfigMap holds at most 1 MiB.
    let two_mib = "y".repeat(2 * 1024 * 1024);
    let status = refusal(
        cms.create(
            &PostParams::default(),
            &config_map(json!({"metadata": {"name": "big"}, "data": {"b": two_mib}})),
        )
        .await,
    );
    assert_eq!(causes(&status), vec![("data".to_string(), "FieldValueTooLong".to_string())]);
    // Under the request limit (3 MiB) but over etcd's (1.5 MiB).
    let instances: Api<TenantInstance> = Api::namespaced(client, "apps");
    let spec = json!({"jukebox": "box", "category": "apps", "package": "app", "options": {"blob": two_mib}});
    let status = refusal(instances.create(&PostParams::default(), &tenant("big", spec)).await);
    assert_eq!(status.code, 500);
    assert_eq!(status.message, "etcdserver: request is too large");
    let four_mib = "z".repeat(4 * 1024 * 1024);
    let status = refusal(
        cms.create(
            &PostParams::default(),
            &config_map(json!({"metadata": {"name": "huge"}, "data": {"b": four_mib}})),
        )
        .await,
    );
    assert_eq!((status.code, status.message.as_str()), (413, "Request entity too large: limit is 3145728"));
    Ok(())
}

fn tenant(name: &str, spec: Value) -> TenantInstance {
    serde_json::from_value(json!({
        "apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": name, "namespace": "apps"}, "spec": spec,
    }))
    .unwrap()
}

#[tokio::test]
async fn a_custom_resource_is_pruned_defaulted_and_validated_against_its_crd() -> TestResult {
    let (server, client) = server().await?;
    let instances: Api<TenantInstance> = Api::namespaced(client.clone(), "apps");
    // Unknown fields are pruned (spec and status), preserved ones are kept.
    let created = instances
        .create(
            &PostParams::default(),
            &tenant("app", json!({"jukebox": "box", "category": "apps", "package": "app", "made_up": 1, "options": {"free": {"form": true}}})),
        )
        .await?;
    let stored = server.object("vynil.solidite.fr", "tenantinstances", Some("apps"), "app").unwrap();
    assert!(stored["spec"].get("made_up").is_none(), "an undeclared field is pruned: {stored}");
    assert_eq!(
        stored["spec"]["options"]["free"]["form"],
        json!(true),
        "x-kubernetes-preserve-unknown-fields keeps"
    );
    let status = json!({"status": {"made_up_progress": "half", "tag": "1.0.0"}});
    instances.patch_status("app", &PatchParams::default(), &Patch::Merge(&status)).await?;
    let stored = server.object("vynil.solidite.fr", "tenantinstances", Some("apps"), "app").unwrap();
    assert_eq!(stored["status"]["tag"], json!("1.0.0"));
    assert!(
        stored["status"].get("made_up_progress").is_none(),
        "a status field outside the schema is pruned"
    );
    assert_eq!(stored["status"]["conditions"], json!([]), "the schema's default is applied");
    // Required fields, enums and types: one 422 naming each field.
    let resource = kube::api::ApiResource::erase::<TenantInstance>(&());
    let untyped: Api<kube::api::DynamicObject> = Api::namespaced_with(client, "apps", &resource);
    let bad: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "bad"}, "spec": {"jukebox": "box"},
    }))?;
    let status = refusal(untyped.create(&PostParams::default(), &bad).await);
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    let mut fields: Vec<String> = causes(&status).into_iter().map(|(f, _)| f).collect();
    fields.sort();
    assert_eq!(fields, vec!["spec.category", "spec.package"]);
    assert!(
        status.message.starts_with("TenantInstance.vynil.solidite.fr \"bad\" is invalid: ["),
        "{}",
        status.message
    );
    let wrong = json!({"status": {"conditions": [{"type": "Made-up", "status": "True", "message": "m", "generation": 1}]}});
    let status = refusal(instances.patch_status("app", &PatchParams::default(), &Patch::Merge(&wrong)).await);
    assert_eq!(
        causes(&status),
        vec![("status.conditions[0].type".to_string(), "FieldValueNotSupported".to_string())]
    );
    let typed = json!({"spec": {"package": 7}});
    let status = refusal(instances.patch("app", &PatchParams::default(), &Patch::Merge(&typed)).await);
    assert_eq!(causes(&status), vec![("spec.package".to_string(), "FieldValueTypeInvalid".to_string())]);
    // An object stored under an older schema can still be written where it
    // did not change (validation ratcheting), not where it did.
    let old = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "older", "namespace": "apps"}, "spec": {"jukebox": 42, "category": "a", "package": "p"}});
    server.create_under_an_older_schema("vynil.solidite.fr", "tenantinstances", old)?;
    let progress = json!({"status": {"tag": "1.0.0"}});
    untyped.patch_status("older", &PatchParams::default(), &Patch::Merge(&progress)).await?;
    let still_bad = json!({"spec": {"jukebox": 43}});
    let status = refusal(untyped.patch("older", &PatchParams::default(), &Patch::Merge(&still_bad)).await);
    assert_eq!(causes(&status), vec![("spec.jukebox".to_string(), "FieldValueTypeInvalid".to_string())]);
    // An update (PUT) of a custom resource needs its resourceVersion.
    let mut unconditional = created.clone();
    unconditional.metadata.resource_version = None;
    let status = refusal(instances.replace("app", &PostParams::default(), &unconditional).await);
    assert_eq!(
        causes(&status),
        vec![("metadata.resourceVersion".to_string(), "FieldValueInvalid".to_string())]
    );
    assert!(status.message.contains("must be specified for an update"), "{}", status.message);
    Ok(())
}

#[tokio::test]
async fn no_finalizer_may_be_added_to_an_object_being_deleted() -> TestResult {
    let (_server, client) = server().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client, "apps");
    let held = json!({"metadata": {"name": "held", "finalizers": ["example.com/first"]}});
    cms.create(&PostParams::default(), &config_map(held)).await?;
    cms.delete("held", &DeleteParams::default()).await?;
    let more = json!({"metadata": {"finalizers": ["example.com/first", "example.com/second"]}});
    let status = refusal(cms.patch("held", &PatchParams::default(), &Patch::Merge(&more)).await);
    assert_eq!(causes(&status), vec![("metadata.finalizers".to_string(), "FieldValueForbidden".to_string())]);
    assert!(
        status.message.contains("no new finalizers can be added if the object is being deleted"),
        "{}",
        status.message
    );
    Ok(())
}

#[tokio::test]
async fn a_namespace_must_exist_and_terminates_after_its_content() -> TestResult {
    let (_server, client) = server().await?;
    let elsewhere: Api<ConfigMap> = Api::namespaced(client.clone(), "nowhere");
    let status = refusal(
        elsewhere.create(&PostParams::default(), &config_map(json!({"metadata": {"name": "x"}}))).await,
    );
    assert_eq!((status.code, status.message.as_str()), (404, "namespaces \"nowhere\" not found"));

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    cms.create(
        &PostParams::default(),
        &config_map(json!({"metadata": {"name": "held", "finalizers": ["example.com/f"]}})),
    )
    .await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    assert_eq!(namespaces.get("apps").await?.status.and_then(|s| s.phase).as_deref(), Some("Active"));
    namespaces.delete("apps", &DeleteParams::default()).await?;
    let terminating = namespaces.get("apps").await?;
    assert_eq!(terminating.status.and_then(|s| s.phase).as_deref(), Some("Terminating"));
    let status =
        refusal(cms.create(&PostParams::default(), &config_map(json!({"metadata": {"name": "late"}}))).await);
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        status.message,
        "unable to create new content in namespace apps because it is being terminated"
    );
    // Its content is being deleted; a finalizer holds it, and the namespace with it.
    eventually(
        || async { cms.get("held").await.is_ok_and(|c| c.metadata.deletion_timestamp.is_some()) },
        "content marked",
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(namespaces.get("apps").await.is_ok(), "a namespace with content left stays");
    cms.patch("held", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": null}})))
        .await?;
    eventually(|| async { namespaces.get("apps").await.is_err() }, "the emptied namespace goes").await?;
    Ok(())
}

#[tokio::test]
async fn garbage_collection_waits_for_every_owner_and_honours_foreground() -> TestResult {
    let (_server, client) = server().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client, "apps");
    let first =
        cms.create(&PostParams::default(), &config_map(json!({"metadata": {"name": "first"}}))).await?;
    let second =
        cms.create(&PostParams::default(), &config_map(json!({"metadata": {"name": "second"}}))).await?;
    let reference = |name: &str, owner: &ConfigMap| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": owner.uid().unwrap()});
    let shared = json!({"metadata": {"name": "shared", "ownerReferences": [reference("first", &first), reference("second", &second)]}});
    cms.create(&PostParams::default(), &config_map(shared)).await?;
    cms.delete("first", &DeleteParams::default()).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(cms.get("shared").await.is_ok(), "a dependent with an owner left stays");
    // Foreground: the owner stays, with its finalizer, until the dependents
    // whose reference sets `blockOwnerDeletion` are gone (the only ones that
    // block it, https://kubernetes.io/docs/concepts/architecture/garbage-collection/).
    let mut blocking = reference("second", &second);
    blocking["blockOwnerDeletion"] = json!(true);
    let held = json!({"metadata": {"name": "child", "finalizers": ["example.com/f"], "ownerReferences": [blocking]}});
    cms.create(&PostParams::default(), &config_map(held)).await?;
    cms.delete("second", &DeleteParams::foreground()).await?;
    let owner = cms.get("second").await?;
    assert_eq!(owner.metadata.finalizers, Some(vec!["foregroundDeletion".to_string()]));
    eventually(
        || async { api_gone(cms.get("shared").await) },
        "the shared dependent goes with its last owner",
    )
    .await?;
    eventually(
        || async { cms.get("child").await.is_ok_and(|c| c.metadata.deletion_timestamp.is_some()) },
        "child marked",
    )
    .await?;
    assert!(cms.get("second").await.is_ok(), "the owner waits for its held dependent");
    cms.patch("child", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": null}})))
        .await?;
    eventually(|| async { api_gone(cms.get("second").await) }, "the owner goes after its dependents").await?;
    Ok(())
}

fn api_gone<T>(result: kube::Result<T>) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.code == 404)
}

fn job(name: &str, restart: &str) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"restartPolicy": restart, "containers": [{"name": "c", "image": "i"}]}}},
    }))
    .unwrap()
}

#[tokio::test]
async fn a_job_is_defaulted_validated_and_its_template_is_immutable() -> TestResult {
    let (_server, client) = server().await?;
    let jobs: Api<Job> = Api::namespaced(client, "apps");
    let status = refusal(jobs.create(&PostParams::default(), &job("always", "Always")).await);
    assert_eq!(
        causes(&status),
        vec![("spec.template.spec.restartPolicy".to_string(), "FieldValueNotSupported".to_string())]
    );
    let created = jobs.create(&PostParams::default(), &job("run", "Never")).await?;
    let uid = created.uid().unwrap();
    let labels = created
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap();
    assert_eq!(labels.get("batch.kubernetes.io/controller-uid"), Some(&uid));
    assert_eq!(labels.get("batch.kubernetes.io/job-name").map(String::as_str), Some("run"));
    assert_eq!(labels.get("job-name").map(String::as_str), Some("run"));
    let selector =
        created.spec.as_ref().and_then(|s| s.selector.clone()).and_then(|s| s.match_labels).unwrap();
    assert_eq!(selector.get("batch.kubernetes.io/controller-uid"), Some(&uid));
    let change = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "other"}]}}}});
    let status = refusal(jobs.patch("run", &PatchParams::default(), &Patch::Merge(&change)).await);
    assert_eq!(causes(&status), vec![("spec.template".to_string(), "FieldValueInvalid".to_string())]);
    assert!(status.message.contains("field is immutable"), "{}", status.message);
    // A Job name over 63 characters fails on the job-name label it gets.
    let status = refusal(jobs.create(&PostParams::default(), &job(&"j".repeat(64), "Never")).await);
    assert_eq!(status.code, 422);
    assert!(causes(&status).iter().any(|(f, _)| f == "spec.template.metadata.labels"), "{status:?}");
    Ok(())
}
