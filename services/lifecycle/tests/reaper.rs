//! The reaper runs as the cluster-admin agent account and reads what to
//! delete from the instance's `status`, which whoever may patch that status
//! can write: it deletes only what upstream's agent labelled as this
//! instance's, in the instance's (tenant's) namespaces, and reports the rest.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use vynil_lifecycle::reaper::{ChildOutcome, ReapArgs, reap};
use vynil_testkit::kube_api::FakeApiServer;

/// The labels upstream's agent sets on what it creates for tenant `apps/web`
/// of category `apps` (`upstream-facts.md`, "The agent").
fn agent_labels(instance: &str) -> Value {
    json!({"app.kubernetes.io/managed-by": "vynil", "app.kubernetes.io/name": "web",
        "app.kubernetes.io/instance": instance, "vynil.solidite.fr/owner-namespace": "apps",
        "vynil.solidite.fr/owner-category": "apps", "vynil.solidite.fr/owner-type": "tenant",
        "vynil.solidite.fr/tenant": "acme"})
}

async fn create(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
    labels: Value,
) {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let plural = format!("{}s", kind.to_lowercase());
    let resource = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural,
    };
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let object =
        json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "labels": labels}});
    api.create(&PostParams::default(), &serde_json::from_value(object).unwrap()).await.unwrap();
}

#[tokio::test]
async fn a_tenant_writing_status_cannot_make_the_reaper_delete_outside_its_instance() {
    let api = FakeApiServer::start().await.unwrap();
    let client = api.client().unwrap();
    for (name, tenant) in [("apps", Some("acme")), ("apps-db", Some("acme")), ("kube-system", None)] {
        let labels = tenant.map(|t| json!({"vynil.solidite.fr/tenant": t})).unwrap_or(json!({}));
        create(&client, "v1", "Namespace", None, name, labels).await;
    }
    // The instance's own children, in its namespace and in its tenant's other one.
    create(&client, "v1", "ConfigMap", Some("apps"), "settings", agent_labels("web")).await;
    create(&client, "v1", "ConfigMap", Some("apps-db"), "db-settings", agent_labels("web")).await;
    // What a tenant could list in status to have the cluster-admin reaper delete.
    create(&client, "v1", "ConfigMap", Some("kube-system"), "coredns", agent_labels("web")).await;
    create(&client, "v1", "ConfigMap", Some("apps"), "someone-elses", agent_labels("blog")).await;
    create(&client, "v1", "ConfigMap", Some("apps"), "unlabelled", json!({})).await;
    create(&client, "rbac.authorization.k8s.io/v1", "ClusterRole", None, "admin", json!({})).await;

    let tenants: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "apps",
        &ApiResource {
            group: "vynil.solidite.fr".into(),
            version: "v1".into(),
            api_version: "vynil.solidite.fr/v1".into(),
            kind: "TenantInstance".into(),
            plural: "tenantinstances".into(),
        },
    );
    let web = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "web", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "apps", "package": "web"}});
    tenants.create(&PostParams::default(), &serde_json::from_value(web).unwrap()).await.unwrap();
    let status = json!({"status": {"conditions": [], "others": [
        {"kind": "ConfigMap", "name": "settings"},
        {"kind": "ConfigMap", "name": "db-settings", "namespace": "apps-db"},
        {"kind": "ConfigMap", "name": "coredns", "namespace": "kube-system"},
        {"kind": "ConfigMap", "name": "someone-elses"},
        {"kind": "ConfigMap", "name": "unlabelled"},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": "admin"}]}});
    tenants.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();

    let args = ReapArgs {
        kind: "tenant".into(),
        namespace: "apps".into(),
        name: "web".into(),
        wait_seconds: 5,
        report_path: std::env::temp_dir().join("unused-termination-log"),
        tenant_label: "vynil.solidite.fr/tenant".into(),
    };
    let report = reap(&client, &args).await.unwrap();
    let outcome = |name: &str| report.children.iter().find(|c| c.name == name).unwrap().outcome.clone();
    assert_eq!(outcome("settings"), ChildOutcome::Deleted);
    assert_eq!(outcome("db-settings"), ChildOutcome::Deleted, "a namespace of the instance's tenant");
    for name in ["coredns", "someone-elses", "unlabelled", "admin"] {
        assert!(matches!(outcome(name), ChildOutcome::Skipped { .. }), "{name}: {:?}", outcome(name));
    }
    let why = |name: &str| match outcome(name) {
        ChildOutcome::Skipped { why } => why,
        other => panic!("{other:?}"),
    };
    assert!(why("coredns").contains("namespace kube-system"), "{}", why("coredns"));
    assert!(why("someone-elses").contains("app.kubernetes.io/instance=web"), "{}", why("someone-elses"));
    // Still there, all of them.
    assert!(api.object("", "configmaps", Some("kube-system"), "coredns").is_some());
    assert!(api.object("", "configmaps", Some("apps"), "someone-elses").is_some());
    assert!(api.object("", "configmaps", Some("apps"), "unlabelled").is_some());
    assert!(api.object("rbac.authorization.k8s.io", "clusterroles", None, "admin").is_some());
    assert!(api.object("", "configmaps", Some("apps"), "settings").is_none());
    assert_eq!(report.left().len(), 4, "reported for a human: {:?}", report.left());
}
