//! Our generated CRD schemas accept every upstream object, condition type and
//! enum value, and still reject what upstream rejects. Validation uses a
//! maintained JSON-schema crate on the `openAPIV3Schema` of `crdgen`'s output.

#![allow(clippy::unwrap_used, clippy::panic)]

use serde_json::{Value, json};

const SAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/samples");

fn sample(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{SAMPLES}/{name}")).unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
}

/// OpenAPI's `nullable: true` becomes JSON Schema's `type: [T, "null"]`.
fn to_json_schema(value: Value) -> Value {
    match value {
        Value::Object(mut map) => {
            let nullable = map.remove("nullable") == Some(Value::Bool(true));
            let mut map: serde_json::Map<String, Value> =
                map.into_iter().map(|(k, v)| (k, to_json_schema(v))).collect();
            if nullable && let Some(Value::String(t)) = map.get("type").cloned() {
                map.insert("type".into(), json!([t, "null"]));
            }
            Value::Object(map)
        }
        Value::Array(items) => Value::Array(items.into_iter().map(to_json_schema).collect()),
        other => other,
    }
}

fn validator(kind: &str) -> jsonschema::Validator {
    let crd = vynil_crds::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for {kind}"));
    let schema =
        serde_json::to_value(&crd.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema).unwrap();
    jsonschema::validator_for(&to_json_schema(schema)).unwrap()
}

fn errors(validator: &jsonschema::Validator, object: &Value) -> Vec<String> {
    // apiVersion/kind/metadata are the API server's, not the schema's.
    let mut body = object.clone();
    for key in ["apiVersion", "kind", "metadata"] {
        body.as_object_mut().unwrap().remove(key);
    }
    validator.iter_errors(&body).map(|e| format!("{} at {}", e, e.instance_path())).collect()
}

#[test]
fn every_upstream_sample_is_valid_against_our_schemas() {
    let cases = [
        ("JukeBox", "jukebox-list.yaml"),
        ("JukeBox", "jukebox-harbor.yaml"),
        ("JukeBox", "jukebox-gitlab.yaml"),
        ("JukeBox", "jukebox-script.yaml"),
        ("JukeBox", "jukebox-http.yaml"),
        ("JukeBox", "jukebox-s3.yaml"),
        ("TenantInstance", "tenantinstance.yaml"),
        ("ServiceInstance", "serviceinstance.yaml"),
        ("SystemInstance", "systeminstance.yaml"),
    ];
    for (kind, file) in cases {
        let problems = errors(&validator(kind), &sample(file));
        assert!(problems.is_empty(), "{file}: {problems:?}");
    }
}

fn with_condition(file: &str, condition_type: &str, status: &str) -> Value {
    let mut object = sample(file);
    object["status"]["conditions"] =
        json!([{"type": condition_type, "status": status, "message": "m", "generation": 1}]);
    object
}

#[test]
fn every_upstream_condition_type_and_status_is_accepted() {
    let tenant = [
        "Ready",
        "Installed",
        "Backuped",
        "Restored",
        "AgentStarted",
        "TofuInstalled",
        "BeforeApplied",
        "VitalApplied",
        "ScalableApplied",
        "InitFrom",
        "ScheduleBackup",
        "OtherApplied",
        "RhaiApplied",
        "PostApplied",
    ];
    let service: Vec<&str> = tenant.iter().copied().chain(["CrdApplied"]).collect();
    let system =
        ["Ready", "Installed", "AgentStarted", "CrdApplied", "TofuInstalled", "SystemApplied", "RhaiApplied"];
    let table: [(&str, &str, Vec<&str>); 4] = [
        ("JukeBox", "jukebox-list.yaml", vec!["Ready", "Updated"]),
        ("TenantInstance", "tenantinstance.yaml", tenant.to_vec()),
        ("ServiceInstance", "serviceinstance.yaml", service),
        ("SystemInstance", "systeminstance.yaml", system.to_vec()),
    ];
    for (kind, file, types) in table {
        let validator = validator(kind);
        for condition_type in types {
            for status in ["True", "False"] {
                let problems = errors(&validator, &with_condition(file, condition_type, status));
                assert!(problems.is_empty(), "{kind} {condition_type}={status}: {problems:?}");
            }
        }
        // The schema is not a blank cheque.
        assert!(
            !errors(&validator, &with_condition(file, "Bogus", "True")).is_empty(),
            "{kind} accepted Bogus"
        );
        assert!(
            !errors(&validator, &with_condition(file, "Ready", "Maybe")).is_empty(),
            "{kind} accepted Maybe"
        );
    }
}

#[test]
fn every_maturity_and_package_type_is_accepted_and_others_are_not() {
    let validator = validator("JukeBox");
    for maturity in [json!("stable"), json!("beta"), json!("alpha"), Value::Null] {
        let mut object = sample("jukebox-list.yaml");
        object["spec"]["maturity"] = maturity.clone();
        assert!(errors(&validator, &object).is_empty(), "maturity {maturity}");
    }
    for package_type in ["tenant", "service", "system"] {
        let mut object = sample("jukebox-list.yaml");
        object["status"]["packages"][0]["metadata"]["type"] = json!(package_type);
        assert!(errors(&validator, &object).is_empty(), "type {package_type}");
    }
    let mut object = sample("jukebox-list.yaml");
    object["spec"]["maturity"] = json!("nightly");
    assert!(!errors(&validator, &object).is_empty());
    let mut object = sample("jukebox-list.yaml");
    object["spec"].as_object_mut().unwrap().remove("schedule");
    assert!(!errors(&validator, &object).is_empty(), "schedule is required");
}

#[test]
fn the_committed_crd_yaml_is_crdgens_output() {
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/crds/vynil.yaml"))
            .unwrap();
    assert_eq!(
        committed,
        vynil_crds::crds_yaml().unwrap(),
        "deploy/crds/vynil.yaml is stale: run `cargo run -p vynil-crds --bin crdgen`"
    );
}
