//! A package's `value_script` using upstream's helpers, through the whole
//! loop: the facts lifecycle gathers for the instance (its namespace's tenant
//! label) and a Kubernetes read through lifecycle's client reach the script,
//! and the values it computes are what the agent Job gets and
//! `status.package` records.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{APPS, World, eventually, package, web_spec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

#[tokio::test]
async fn a_value_script_calling_upstreams_helpers_sees_the_instances_tenant() {
    let mut web = package("registry.test", "apps", "web", "tenant", "1.0.0", json!([]));
    // As the scanner stores it: the annotation's JSON string literal.
    let script = r#"#{ tenant: instance.get_tenant_name(), namespaces: instance.get_tenant_namespaces(),
        digest: instance.options_digest(), name: base64_encode(instance.metadata.name),
        mode: k8s_resource("ConfigMap", instance.metadata.namespace).get("settings").data.mode }"#;
    web["value_script"] = Value::String(serde_json::to_string(script).unwrap());
    let (world, _) = World::start(vec![web], &[]).await;
    let namespaces: Api<Namespace> = Api::all(world.client.clone());
    let label = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": APPS, "labels": {"vynil.solidite.fr/tenant": "acme"}}});
    namespaces.patch(APPS, &PatchParams::apply("test").force(), &Patch::Apply(&label)).await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(world.client.clone(), APPS);
    let settings = json!({"metadata": {"name": "settings"}, "data": {"mode": "fast"}});
    maps.create(&PostParams::default(), &serde_json::from_value(settings).unwrap()).await.unwrap();
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    let values = eventually("the install recorded with its controller values", || async {
        let object = world.get("TenantInstance", "web").await;
        object.pointer("/status/package/controllerValues").and_then(Value::as_str).map(str::to_string)
    })
    .await;
    let values: Value = serde_json::from_str(&values).unwrap();
    // sha256("") for an instance without options (upstream's get_options_digest);
    // base64 of "web" is "d2Vi".
    assert_eq!(
        values,
        json!({"tenant": "acme", "namespaces": [APPS], "mode": "fast",
            "digest": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "name": "d2Vi"})
    );
    world.stop().await;
}
