//! Rolling back to upstream's operator (docs/migration.md): objects as our
//! services leave them do not all decode with upstream's types (its enums do
//! not know our source variant and condition type); after the documented
//! steps they do, and the optional fields we add are ignored.

#![allow(clippy::unwrap_used)]

use serde::Deserialize;
use serde_json::{Value, json};

/// Upstream's shapes, as its operator decodes them (unknown fields ignored,
/// unknown enum values refused).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum UpstreamSource {
    List(Vec<String>),
    Harbor(Value),
    Gitlab(Value),
    Script(String),
    Http(Value),
    S3(Value),
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct UpstreamJukeBoxSpec {
    source: Option<UpstreamSource>,
    schedule: String,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct UpstreamJukeBox {
    spec: UpstreamJukeBoxSpec,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
enum UpstreamTenantConditionType {
    Ready,
    Installed,
    Backuped,
    Restored,
    AgentStarted,
    TofuInstalled,
    BeforeApplied,
    VitalApplied,
    ScalableApplied,
    InitFrom,
    ScheduleBackup,
    OtherApplied,
    RhaiApplied,
    PostApplied,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct UpstreamCondition {
    #[serde(rename = "type")]
    condition_type: UpstreamTenantConditionType,
    status: String,
    message: String,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct UpstreamTenantStatus {
    #[serde(default)]
    conditions: Vec<UpstreamCondition>,
    tag: Option<String>,
    digest: Option<String>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct UpstreamTenantInstance {
    status: Option<UpstreamTenantStatus>,
}

/// docs/migration.md, "Rolling back", step 2, as a user would do it.
fn roll_back(mut object: Value) -> Value {
    if object["spec"]["source"].get("layout").is_some() {
        object["spec"]["source"] = json!({"list": ["registry.example/think/ollama"]});
    }
    if let Some(conditions) = object["status"]["conditions"].as_array_mut() {
        conditions.retain(|c| c["type"] != "Deleting");
    }
    object
}

#[test]
fn after_the_documented_rollback_steps_upstreams_types_decode_what_we_wrote() {
    let jukebox = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "JukeBox", "metadata": {"name": "mirror"},
        "spec": {"source": {"layout": {"path": "/mirror"}}, "schedule": "0 3 * * *"},
        "status": {"packages": [{"registry": "oci-layout:/mirror", "image": "think/ollama", "tag": "0.1.8",
            "digest": "sha256:00", "metadata": {"name": "ollama", "category": "think", "description": "", "type": "tenant", "features": []}, "requirements": []}]}});
    // What we wrote is a valid object of ours…
    serde_json::from_value::<vynil_crds::JukeBox>(jukebox.clone()).unwrap();
    // …that upstream cannot read as it is.
    assert!(serde_json::from_value::<UpstreamJukeBox>(jukebox.clone()).is_err());
    serde_json::from_value::<UpstreamJukeBox>(roll_back(jukebox)).unwrap();

    let instance = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "ollama", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "think", "package": "ollama"},
        "status": {"tag": "0.1.8", "digest": "abc",
            "conditions": [
                {"type": "Ready", "status": "True", "message": "ok", "generation": 1},
                {"type": "Deleting", "status": "False", "message": "[E_PACKAGE_GONE] …", "generation": 1}],
            "package": {"registry": "r", "image": "think/ollama", "tag": "0.1.8", "type": "tenant", "fingerprint": "f"},
            "target": {"job": "tenant--apps--ollama", "revision": {"registry": "r", "image": "think/ollama", "tag": "0.1.9", "type": "tenant"}}}});
    serde_json::from_value::<vynil_crds::TenantInstance>(instance.clone()).unwrap();
    assert!(
        serde_json::from_value::<UpstreamTenantInstance>(instance.clone()).is_err(),
        "Deleting is unknown upstream"
    );
    let rolled: UpstreamTenantInstance = serde_json::from_value(roll_back(instance)).unwrap();
    let status = rolled.status.unwrap();
    assert_eq!(
        (status.tag.as_deref(), status.conditions.len()),
        (Some("0.1.8"), 1),
        "status.package and status.target are ignored"
    );
}
