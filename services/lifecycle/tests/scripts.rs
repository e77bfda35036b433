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

/// Issue "Credentials that stay where they belong" item 9: a package's
/// script read ConfigMaps and workloads in every namespace. It reads in its
/// instance's namespaces and in those of the services its package
/// recommends (here a system service `db` a ServiceInstance publishes from `infra`); another
/// tenant's namespace, and a list across every namespace, fail the read
/// with `[E_SCRIPT_READ_DENIED]`, never an empty answer.
#[tokio::test]
async fn a_script_reads_a_recommended_system_service_and_no_other_tenant() {
    let mut web = package("registry.test", "apps", "web", "tenant", "1.0.0", json!([]));
    web["recommandations"] = json!([{"system_service": "db"}]);
    let script = r#"let other = ""; let everywhere = "";
        try { other = k8s_resource("ConfigMap", "other").get("their-settings").data.password; } catch (e) { other = `${e}`; }
        try { everywhere = k8s_resource("ConfigMap").list().items.len(); } catch (e) { everywhere = `${e}`; }
        #{ db: k8s_resource("ConfigMap", "infra").get("db-settings").data.host, other: other, everywhere: everywhere }"#;
    web["value_script"] = Value::String(serde_json::to_string(script).unwrap());
    let (world, _) = World::start(vec![web], &[]).await;
    let namespaces: Api<Namespace> = Api::all(world.client.clone());
    for name in ["infra", "other"] {
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        namespaces.create(&PostParams::default(), &serde_json::from_value(namespace).unwrap()).await.unwrap();
    }
    for (namespace, name, data) in [
        ("infra", "db-settings", json!({"host": "db.infra"})),
        ("other", "their-settings", json!({"password": "theirs"})),
    ] {
        let maps: Api<ConfigMap> = Api::namespaced(world.client.clone(), namespace);
        let map = json!({"metadata": {"name": name}, "data": data});
        maps.create(&PostParams::default(), &serde_json::from_value(map).unwrap()).await.unwrap();
    }
    // The system service `db`, published by a ServiceInstance in `infra`.
    let systems = world.instances_in("ServiceInstance", "infra");
    let db = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "ServiceInstance",
        "metadata": {"name": "db", "namespace": "infra"},
        "spec": {"jukebox": "box", "category": "core", "package": "db"}});
    systems.create(&PostParams::default(), &serde_json::from_value(db).unwrap()).await.unwrap();
    let published =
        json!({"status": {"services": [{"key": "db", "service": {"fqdn": "db.infra", "port": 5432}}]}});
    systems.patch_status("db", &PatchParams::default(), &Patch::Merge(&published)).await.unwrap();
    eventually("lifecycle to see the published service", || async {
        let object = systems.get("db").await.ok()?;
        object.data.pointer("/status/services/0/key").map(|_| ())
    })
    .await;
    world.create("TenantInstance", "web", web_spec(), json!({})).await;
    let values = eventually("the install recorded with its controller values", || async {
        let object = world.get("TenantInstance", "web").await;
        object.pointer("/status/package/controllerValues").and_then(Value::as_str).map(str::to_string)
    })
    .await;
    let values: Value = serde_json::from_str(&values).unwrap();
    assert_eq!(values["db"], "db.infra", "{values}");
    let other = values["other"].as_str().unwrap_or_default();
    assert!(
        other.contains("[E_SCRIPT_READ_DENIED] ConfigMap in other: "),
        "another tenant's ConfigMap: {values}"
    );
    let everywhere = values["everywhere"].as_str().unwrap_or_default();
    assert!(everywhere.contains("[E_SCRIPT_READ_DENIED] ConfigMap in every namespace"), "{values}");
    world.stop().await;
}
