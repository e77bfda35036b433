//! The reaper runs as the cluster-admin agent account, and an instance's
//! annotations and `status` are writable by whoever may patch the instance:
//! it deletes only what an admin confirmed (recorded in the control plane's
//! namespace, voided by any later change of the recorded children), and of
//! that only what upstream's agent labelled as this instance's, in the
//! instance's (tenant's) namespaces, and reports the rest.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use vynil_lifecycle::{
    children::preview,
    confirmation::{Confirmation, Confirmations, children_of},
    reaper::{ChildOutcome, ReapArgs, reap},
};
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
    if kind == "Namespace" {
        // `kube-system` is there from the start: applied, as `kubectl apply` would.
        let params = kube::api::PatchParams::apply("test");
        api.patch(name, &params, &kube::api::Patch::Apply(&object)).await.unwrap();
    } else {
        api.create(&PostParams::default(), &serde_json::from_value(object).unwrap()).await.unwrap();
    }
}

const CONTROL_PLANE: &str = "vynil-system";

fn tenants(client: &Client) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        "apps",
        &ApiResource {
            group: "vynil.solidite.fr".into(),
            version: "v1".into(),
            api_version: "vynil.solidite.fr/v1".into(),
            kind: "TenantInstance".into(),
            plural: "tenantinstances".into(),
        },
    )
}

/// What `AllowDeleteWithoutPackage` records when an admin confirms the
/// current children of `apps/web`.
async fn admin_confirms(client: &Client) {
    let web = tenants(client).get("web").await.unwrap();
    let status = web.data["status"].clone();
    let confirmation = Confirmation {
        uid: web.metadata.uid.clone().unwrap(),
        instance: "tenant/apps/web".into(),
        fingerprint: preview(&status, "apps").2,
        children: children_of(&status),
        confirmed_by: "alice".into(),
        confirmed_at: "2026-12-03T10:00:00Z".into(),
        reason: "package unpublished".into(),
    };
    Confirmations::new(client, CONTROL_PLANE).record(&confirmation).await.unwrap();
}

fn reap_args() -> ReapArgs {
    ReapArgs {
        kind: "tenant".into(),
        namespace: "apps".into(),
        name: "web".into(),
        confirmations_namespace: CONTROL_PLANE.into(),
        wait_seconds: 5,
        report_path: std::env::temp_dir().join("unused-termination-log"),
        tenant_label: "vynil.solidite.fr/tenant".into(),
    }
}

#[tokio::test]
async fn a_tenant_writing_status_cannot_make_the_reaper_delete_outside_its_instance() {
    let api = FakeApiServer::start().await.unwrap();
    let client = api.client().unwrap();
    for (name, tenant) in
        [("apps", Some("acme")), ("apps-db", Some("acme")), ("kube-system", None), (CONTROL_PLANE, None)]
    {
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

    let tenants = tenants(&client);
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
    // Even confirmed by an admin who did not look closely, a child is deleted only when it is the instance's.
    admin_confirms(&client).await;

    let report = reap(&client, &reap_args()).await.unwrap();
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

/// Security review item 3: the annotation is no gate (a tenant may set it)
/// and neither is status (a tenant may rewrite it after an admin looked).
#[tokio::test]
async fn a_tenant_cannot_open_the_escape_hatch_nor_widen_what_an_admin_confirmed() {
    let api = FakeApiServer::start().await.unwrap();
    let client = api.client().unwrap();
    for name in ["apps", CONTROL_PLANE] {
        create(&client, "v1", "Namespace", None, name, json!({})).await;
    }
    for name in ["settings", "cache"] {
        create(&client, "v1", "ConfigMap", Some("apps"), name, agent_labels("web")).await;
    }
    let tenants = tenants(&client);
    let web = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "web", "namespace": "apps",
            "annotations": {"vynil.solidite.fr/delete-without-package": "true"}},
        "spec": {"jukebox": "box", "category": "apps", "package": "web"}});
    tenants.create(&PostParams::default(), &serde_json::from_value(web).unwrap()).await.unwrap();
    let status = json!({"status": {"conditions": [], "others": [{"kind": "ConfigMap", "name": "settings"}]}});
    tenants.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    let there = |name: &str| api.object("", "configmaps", Some("apps"), name).is_some();

    // The tenant's annotation alone: refused, nothing deleted.
    let refused = reap(&client, &reap_args()).await.unwrap_err();
    assert!(refused.to_string().contains("no admin confirmed"), "{refused}");
    assert!(there("settings"));

    // An admin confirms `settings`; the tenant then adds `cache` to status: void, nothing deleted.
    admin_confirms(&client).await;
    let widened = json!({"status": {"others": [{"kind": "ConfigMap", "name": "settings"}, {"kind": "ConfigMap", "name": "cache"}]}});
    tenants.patch_status("web", &PatchParams::default(), &Patch::Merge(&widened)).await.unwrap();
    let refused = reap(&client, &reap_args()).await.unwrap_err();
    assert!(refused.to_string().contains("no longer holds"), "{refused}");
    assert!(there("settings") && there("cache"));

    // Back to what was confirmed: exactly that is deleted.
    tenants.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    let report = reap(&client, &reap_args()).await.unwrap();
    assert_eq!(report.deleted(), ["ConfigMap settings"]);
    assert!(!there("settings") && there("cache"));

    // A confirmation of another object of the same name confirms nothing.
    tenants.delete("web", &Default::default()).await.unwrap();
    let again = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "web", "namespace": "apps",
            "annotations": {"vynil.solidite.fr/delete-without-package": "true"}},
        "spec": {"jukebox": "box", "category": "apps", "package": "web"}});
    tenants.create(&PostParams::default(), &serde_json::from_value(again).unwrap()).await.unwrap();
    let cache = json!({"status": {"conditions": [], "others": [{"kind": "ConfigMap", "name": "cache"}]}});
    tenants.patch_status("web", &PatchParams::default(), &Patch::Merge(&cache)).await.unwrap();
    let refused = reap(&client, &reap_args()).await.unwrap_err();
    assert!(refused.to_string().contains("no admin confirmed"), "{refused}");
    assert!(there("cache"));
}
