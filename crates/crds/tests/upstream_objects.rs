//! Upstream-shaped objects: they parse, re-serialise without losing or renaming
//! a field, validate against our generated CRD schemas, and odd ones (unknown
//! fields, no status) parse without panic.

#![allow(clippy::unwrap_used, clippy::panic)]

use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;
use vynil_crds::{JukeBox, ServiceInstance, SystemInstance, TenantInstance};

const SAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/samples");

fn sample(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{SAMPLES}/{name}")).unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
}

/// Null-valued keys are "absent" on both sides: upstream writes `null` for
/// some absent optionals, we omit them.
fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k, without_nulls(v))).collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

fn round_trip<T: Serialize + DeserializeOwned>(name: &str) {
    let original = sample(name);
    let typed: T = serde_json::from_value(original.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(without_nulls(back), without_nulls(original), "{name} changed in a round trip");
}

#[test]
fn every_jukebox_source_variant_and_status_round_trips() {
    for name in [
        "jukebox-list.yaml",
        "jukebox-harbor.yaml",
        "jukebox-gitlab.yaml",
        "jukebox-script.yaml",
        "jukebox-http.yaml",
        "jukebox-s3.yaml",
    ] {
        round_trip::<JukeBox>(name);
    }
}

#[test]
fn instances_with_every_status_list_round_trip() {
    round_trip::<TenantInstance>("tenantinstance.yaml");
    round_trip::<ServiceInstance>("serviceinstance.yaml");
    round_trip::<SystemInstance>("systeminstance.yaml");
}

#[test]
fn the_value_script_stays_the_json_string_literal_upstream_stored() {
    let jukebox: JukeBox = serde_json::from_value(sample("jukebox-list.yaml")).unwrap();
    let package = &jukebox.status.unwrap().packages[0];
    assert_eq!(package.content.value_script.as_deref(), Some("\"#{ gpu: true }\""));
    assert_eq!(package.content.value_script_source().unwrap().as_deref(), Some("#{ gpu: true }"));
    assert_eq!(package.content.recommandations.as_ref().unwrap().len(), 3);
}

#[test]
fn unknown_fields_and_missing_optional_status_parse_without_panic() {
    let mut odd = sample("tenantinstance.yaml");
    odd["spec"]["futureField"] = Value::from("x");
    odd["status"]["somethingNew"] = serde_json::json!({"a": 1});
    odd["status"]["conditions"][0]["reason"] = Value::from("NewField");
    let parsed: TenantInstance = serde_json::from_value(odd).unwrap();
    assert_eq!(parsed.spec.package, "ollama");

    let mut bare = sample("tenantinstance.yaml");
    bare.as_object_mut().unwrap().remove("status");
    let parsed: TenantInstance = serde_json::from_value(bare).unwrap();
    assert!(parsed.status.is_none());

    let mut empty_status = sample("systeminstance.yaml");
    empty_status["status"] = serde_json::json!({});
    let parsed: SystemInstance = serde_json::from_value(empty_status).unwrap();
    assert!(parsed.status.unwrap().conditions.is_empty());

    let mut jukebox = sample("jukebox-harbor.yaml");
    jukebox["status"] = serde_json::json!({"packages": [{"registry": "r", "image": "i", "tag": "1.0.0",
        "metadata": {"name": "n", "category": "c", "description": "", "type": "tenant", "features": ["brand_new"]},
        "requirements": [{"gpu": {"vendor": "amd"}}]}]});
    let parsed: JukeBox = serde_json::from_value(jukebox).unwrap();
    assert_eq!(parsed.status.unwrap().packages[0].content.requirements[0].kind(), "gpu");
}
