//! With `FakeApiOptions::rbac`, the fake API server authenticates each
//! request by its bearer token and authorises it by the RBAC objects it
//! stores, as the API server's RBAC authorizer does: `401` without a known
//! token, `403 Forbidden` in the API server's words without a grant.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::api::{batch::v1::Job, core::v1::ConfigMap};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use vynil_testkit::kube_api::{FakeApiOptions, FakeApiServer};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn server() -> Result<FakeApiServer, Box<dyn std::error::Error + Send + Sync>> {
    let server = FakeApiServer::start_with(FakeApiOptions { rbac: true, ..Default::default() }).await?;
    server.create_namespaces(&["apps", "other"])?;
    Ok(server)
}

fn code<T: std::fmt::Debug>(result: kube::Result<T>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

async fn apply(server: &FakeApiServer, objects: serde_json::Value) -> TestResult {
    let admin = server.client()?;
    for object in objects.as_array().unwrap() {
        let (kind, namespace) = (object["kind"].as_str().unwrap(), object["metadata"]["namespace"].as_str());
        let plural = format!("{}s", kind.to_lowercase());
        let resource = kube::api::ApiResource {
            group: "rbac.authorization.k8s.io".into(),
            version: "v1".into(),
            api_version: "rbac.authorization.k8s.io/v1".into(),
            kind: kind.into(),
            plural,
        };
        let api: Api<kube::api::DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(admin.clone(), ns, &resource),
            None => Api::all_with(admin.clone(), &resource),
        };
        api.create(&PostParams::default(), &serde_json::from_value(object.clone())?).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_service_account_may_do_what_its_role_grants_and_nothing_else() -> TestResult {
    let server = server().await?;
    let token = server.service_account_token("apps", "reader");
    apply(
        &server,
        json!([
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "reader", "namespace": "apps"},
             "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["settings"]},
                       {"apiGroups": ["batch"], "resources": ["jobs/status"], "verbs": ["patch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "reader", "namespace": "apps"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
             "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "apps"}]},
        ]),
    )
    .await?;
    let admin: Api<ConfigMap> = Api::namespaced(server.client()?, "apps");
    for name in ["settings", "secret-ish"] {
        admin
            .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name}}))?)
            .await?;
    }
    let client = server.client_as(&token)?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    maps.get("settings").await?;
    let user = "system:serviceaccount:apps:reader";
    assert_eq!(
        code(maps.get("secret-ish").await),
        (
            403,
            format!(
                "configmaps \"secret-ish\" is forbidden: User \"{user}\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"apps\""
            )
        ),
        "resourceNames restricts the grant"
    );
    assert_eq!(code(maps.list(&ListParams::default()).await).0, 403, "get is not list");
    let elsewhere: Api<ConfigMap> = Api::namespaced(client.clone(), "other");
    assert_eq!(code(elsewhere.get("settings").await).0, 403, "a Role grants in its namespace only");
    // A subresource grant is not the resource's.
    let jobs: Api<Job> = Api::namespaced(client.clone(), "apps");
    let (status, message) = code(jobs.patch("x", &PatchParams::default(), &Patch::Merge(&json!({}))).await);
    assert_eq!(status, 403);
    assert!(message.contains("cannot patch resource \"jobs\" in API group \"batch\""), "{message}");
    let (status, _) = code(jobs.patch_status("x", &PatchParams::default(), &Patch::Merge(&json!({}))).await);
    assert_eq!(status, 404, "allowed, and the Job does not exist");
    // Discovery is every authenticated user's; an unknown token is nobody.
    client.apiserver_version().await?;
    let stranger: Api<ConfigMap> = Api::namespaced(server.client_as("made-up")?, "apps");
    assert_eq!(code(stranger.get("settings").await), (401, "Unauthorized".to_string()));
    Ok(())
}

#[tokio::test]
async fn cluster_roles_bind_cluster_wide_or_per_namespace_and_reviews_read_the_same_rules() -> TestResult {
    let server = server().await?;
    let token = server.service_account_token("vynil-system", "watcher");
    apply(
        &server,
        json!([
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "watch-maps"},
             "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "write-maps"},
             "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "watch-maps"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "watch-maps"},
             "subjects": [{"kind": "Group", "name": "system:serviceaccounts:vynil-system"}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "write-maps", "namespace": "apps"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "write-maps"},
             "subjects": [{"kind": "ServiceAccount", "name": "watcher", "namespace": "vynil-system"}]},
        ]),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let client = server.client_as(&token)?;
    let all: Api<ConfigMap> = Api::all(client.clone());
    all.list(&ListParams::default()).await?;
    let map = |name: &str| serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": name}})).unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), "apps").create(&PostParams::default(), &map("made")).await?;
    let (status, message) = code(
        Api::<ConfigMap>::namespaced(client.clone(), "other").create(&PostParams::default(), &map("x")).await,
    );
    assert_eq!(status, 403, "a ClusterRole bound in one namespace grants there only");
    assert!(message.ends_with("in the namespace \"other\""), "{message}");
    // A SubjectAccessReview is answered from the same rules.
    let reviews: Api<k8s_openapi::api::authorization::v1::SubjectAccessReview> = Api::all(server.client()?);
    let review = |namespace: &str| {
        serde_json::from_value::<k8s_openapi::api::authorization::v1::SubjectAccessReview>(json!({
            "spec": {"user": "system:serviceaccount:vynil-system:watcher",
                     "groups": ["system:serviceaccounts:vynil-system"],
                     "resourceAttributes": {"verb": "create", "resource": "configmaps", "namespace": namespace}}
        }))
        .unwrap()
    };
    let allowed = |r: k8s_openapi::api::authorization::v1::SubjectAccessReview| r.status.map(|s| s.allowed);
    assert_eq!(allowed(reviews.create(&PostParams::default(), &review("apps")).await?), Some(true));
    assert_eq!(allowed(reviews.create(&PostParams::default(), &review("other")).await?), Some(false));
    Ok(())
}
