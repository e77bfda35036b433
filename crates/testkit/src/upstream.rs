//! Upstream's own types, transcribed, so tests read what we write as upstream
//! reads it (sebt3/vynil at 72bc059, 0.7.8-alpha.4).
//!
//! Our fake agent and fake API server used to read status as untyped JSON, so
//! a condition type upstream's closed enums refuse (`Deleting`) went unseen
//! while upstream's agent exited 3 on it. Every type here is a transcription
//! of upstream's serde types, with the upstream file named on each: the
//! enums are closed (no `other` variant, so one unknown value fails the whole
//! decode, as upstream's), required fields are required, and undeclared
//! fields are ignored (upstream has no `deny_unknown_fields`). Nothing here
//! is ours: change it only when upstream's types change, naming the commit.

use serde::Deserialize;
use serde_json::{Map, Value};

macro_rules! closed_enum {
    ($(#[$doc:meta])* $name:ident { $($variant:ident),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
        pub enum $name {
            $($variant),+
        }
    };
}

closed_enum!(
    /// `common/src/instancetenant.rs` `ConditionsType`.
    TenantConditionsType {
        Ready, Installed, Backuped, Restored, AgentStarted, TofuInstalled, BeforeApplied, VitalApplied,
        ScalableApplied, InitFrom, ScheduleBackup, OtherApplied, RhaiApplied, PostApplied,
    }
);
closed_enum!(
    /// `common/src/instanceservice.rs` `ConditionsType`.
    ServiceConditionsType {
        Ready, Installed, Backuped, Restored, AgentStarted, CrdApplied, TofuInstalled, BeforeApplied,
        VitalApplied, ScalableApplied, InitFrom, ScheduleBackup, OtherApplied, RhaiApplied, PostApplied,
    }
);
closed_enum!(
    /// `common/src/instancesystem.rs` `ConditionsType`.
    SystemConditionsType {
        Ready, Installed, AgentStarted, CrdApplied, TofuInstalled, SystemApplied, RhaiApplied,
    }
);
closed_enum!(
    /// `common/src/jukebox.rs` `ConditionsType`.
    JukeBoxConditionsType { Ready, Updated }
);
closed_enum!(
    /// `common/src/*.rs` `ConditionsStatus`.
    ConditionsStatus { True, False }
);

/// `ApplicationCondition` (`common/src/instance*.rs`, `jukebox.rs`): `message`
/// and `generation` required, no `reason`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationCondition<T> {
    pub last_transition_time: Option<String>,
    pub message: String,
    #[serde(rename = "type")]
    pub condition_type: T,
    pub status: ConditionsStatus,
    pub generation: i64,
}

/// `Children` (`common/src/lib.rs`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Children {
    pub api_version: Option<String>,
    pub kind: String,
    pub name: String,
    pub namespace: Option<String>,
}

/// `ServiceEndpoint`, `Published` (`common/src/lib.rs`).
#[derive(Debug, Clone, Deserialize)]
pub struct ServiceEndpoint {
    pub fqdn: String,
    pub port: u16,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Published {
    pub key: String,
    pub tenant: Option<String>,
    pub service: Option<ServiceEndpoint>,
    pub definition: Option<Children>,
}

/// `InitFrom` (`common/src/instancetenant.rs`, `instanceservice.rs`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitFrom {
    pub secret_name: Option<String>,
    pub sub_path: Option<String>,
    pub snapshot: String,
    pub version: Option<String>,
}

/// The spec the three kinds share (`common/src/instance*.rs`; System has no `initFrom`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSpec {
    pub jukebox: String,
    pub category: String,
    pub package: String,
    pub options: Option<Map<String, Value>>,
    pub init_from: Option<InitFrom>,
}

/// `TenantInstanceStatus` (`common/src/instancetenant.rs`).
#[derive(Debug, Clone, Deserialize)]
pub struct TenantInstanceStatus {
    pub conditions: Vec<ApplicationCondition<TenantConditionsType>>,
    pub tag: Option<String>,
    pub digest: Option<String>,
    pub tfstate: Option<String>,
    pub rhaistate: Option<String>,
    pub befores: Option<Vec<Children>>,
    pub vitals: Option<Vec<Children>>,
    pub scalables: Option<Vec<Children>>,
    pub others: Option<Vec<Children>>,
    pub posts: Option<Vec<Children>>,
    pub services: Option<Vec<Published>>,
}

/// `ServiceInstanceStatus` (`common/src/instanceservice.rs`).
#[derive(Debug, Clone, Deserialize)]
pub struct ServiceInstanceStatus {
    pub conditions: Vec<ApplicationCondition<ServiceConditionsType>>,
    pub tag: Option<String>,
    pub digest: Option<String>,
    pub tfstate: Option<String>,
    pub rhaistate: Option<String>,
    pub befores: Option<Vec<Children>>,
    pub vitals: Option<Vec<Children>>,
    pub scalables: Option<Vec<Children>>,
    pub others: Option<Vec<Children>>,
    pub posts: Option<Vec<Children>>,
    pub crds: Option<Vec<String>>,
    pub services: Option<Vec<Published>>,
}

/// `SystemInstanceStatus` (`common/src/instancesystem.rs`).
#[derive(Debug, Clone, Deserialize)]
pub struct SystemInstanceStatus {
    pub conditions: Vec<ApplicationCondition<SystemConditionsType>>,
    pub tag: Option<String>,
    pub digest: Option<String>,
    pub tfstate: Option<String>,
    pub rhaistate: Option<String>,
    pub systems: Option<Vec<Children>>,
    pub crds: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Object<Spec, Status> {
    pub spec: Spec,
    pub status: Option<Status>,
}

pub type TenantInstance = Object<InstanceSpec, TenantInstanceStatus>;
pub type ServiceInstance = Object<InstanceSpec, ServiceInstanceStatus>;
pub type SystemInstance = Object<InstanceSpec, SystemInstanceStatus>;

/// `VynilPackageType` (`common/src/vynilpackage.rs`, field `usage` on the wire `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VynilPackageType {
    Tenant,
    System,
    Service,
}

/// `VynilPackageFeature` (`common/src/vynilpackage.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VynilPackageFeature {
    Upgrade,
    Backup,
    Monitoring,
    HighAvailability,
    AutoConfig,
    AutoScaling,
    Deprecated,
}

/// `VynilPackageMeta` (`common/src/vynilpackage.rs`).
#[derive(Debug, Clone, Deserialize)]
pub struct VynilPackageMeta {
    pub name: String,
    pub category: String,
    pub description: String,
    pub app_version: Option<String>,
    #[serde(rename = "type")]
    pub usage: VynilPackageType,
    pub features: Vec<VynilPackageFeature>,
    pub backup_affinity: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum StorageCapability {
    RWX,
    ROX,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PackageRef {
    pub category: String,
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Prefly {
    pub script: String,
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ClusterVersion {
    pub major: u64,
    pub minor: u64,
}

/// `VynilPackageRequirement` (`common/src/vynilpackage.rs`): externally tagged, snake_case.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VynilPackageRequirement {
    CustomResourceDefinition(String),
    SystemService(String),
    TenantService(String),
    SystemPackage(PackageRef),
    TenantPackage(PackageRef),
    Prefly(Prefly),
    ClusterVersion(ClusterVersion),
    StorageCapability(StorageCapability),
    MinimumPreviousVersion(String),
    VynilVersion(String),
    Cpu(f64),
    Memory(u64),
    Disk(u64),
}

/// `VynilPackageRecommandation` (`common/src/vynilpackage.rs`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VynilPackageRecommandation {
    CustomResourceDefinition(String),
    SystemService(String),
    TenantService(String),
}

/// `VynilPackage` (`common/src/vynilpackage.rs`), as `JukeBox.status.packages[]`.
#[derive(Debug, Clone, Deserialize)]
pub struct VynilPackage {
    pub registry: String,
    pub image: String,
    pub tag: String,
    pub metadata: VynilPackageMeta,
    pub requirements: Vec<VynilPackageRequirement>,
    pub recommandations: Option<Vec<VynilPackageRecommandation>>,
    pub options: Option<Map<String, Value>>,
    pub value_script: Option<String>,
}

/// `JukeBoxStatus` (`common/src/jukebox.rs`): both lists required.
#[derive(Debug, Clone, Deserialize)]
pub struct JukeBoxStatus {
    pub conditions: Vec<ApplicationCondition<JukeBoxConditionsType>>,
    pub packages: Vec<VynilPackage>,
}

/// `JukeBoxDef` (`common/src/jukebox.rs`): the source, externally tagged,
/// snake_case (`docs/upstream-vynil.md` §1.1). Our `layout` is not among them.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JukeBoxDef {
    List(Vec<String>),
    Harbor {
        registry: String,
        project: String,
    },
    Gitlab {
        url: String,
        registry: String,
        project: String,
    },
    Script(String),
    Http {
        url: String,
        secret: Option<String>,
    },
    S3 {
        bucket: String,
        region: String,
        prefix: Option<String>,
        endpoint: Option<String>,
        secret: Option<String>,
    },
}

/// `JukeBoxMaturity` (`common/src/jukebox.rs`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JukeBoxMaturity {
    Stable,
    Beta,
    Alpha,
}

/// `JukeBoxSpec` (`common/src/jukebox.rs`; snake_case fields).
#[derive(Debug, Clone, Deserialize)]
pub struct JukeBoxSpec {
    pub source: Option<JukeBoxDef>,
    pub maturity: Option<JukeBoxMaturity>,
    pub pull_secret: Option<String>,
    pub schedule: String,
}

/// A JukeBox as upstream's operator decodes it.
#[derive(Debug, Clone, Deserialize)]
pub struct JukeBox {
    pub spec: JukeBoxSpec,
    pub status: Option<JukeBoxStatus>,
}

/// Why upstream's types refuse an object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("upstream's {kind} types refuse {what}: {problem}")]
pub struct Refused {
    pub kind: String,
    pub what: String,
    pub problem: String,
}

fn named(object: &Value) -> String {
    let meta = &object["metadata"];
    match (meta["namespace"].as_str(), meta["name"].as_str()) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        (None, Some(name)) => name.to_string(),
        _ => "an unnamed object".into(),
    }
}

fn decode_as<T: serde::de::DeserializeOwned>(kind: &str, object: &Value) -> Result<T, Refused> {
    // `status: null` is an absent status to serde's `Option`, as to upstream's.
    T::deserialize(object).map_err(|e| Refused {
        kind: kind.into(),
        what: named(object),
        problem: e.to_string(),
    })
}

/// Decodes an instance object (JSON, with its `kind`) as upstream's operator and agent do.
pub fn decode_instance(object: &Value) -> Result<(), Refused> {
    let kind = object["kind"].as_str().unwrap_or_default();
    match kind {
        "TenantInstance" => decode_as::<TenantInstance>(kind, object).map(drop),
        "ServiceInstance" => decode_as::<ServiceInstance>(kind, object).map(drop),
        "SystemInstance" => decode_as::<SystemInstance>(kind, object).map(drop),
        other => {
            Err(Refused { kind: other.into(), what: named(object), problem: "not an instance kind".into() })
        }
    }
}

/// Decodes the `status` of an instance object alone (absent is fine): what
/// our services write, whatever the spec a test wrote.
pub fn decode_instance_status(object: &Value) -> Result<(), Refused> {
    let kind = object["kind"].as_str().unwrap_or_default();
    let status = match object.get("status") {
        None | Some(Value::Null) => return Ok(()),
        Some(status) => status,
    };
    let decoded = match kind {
        "TenantInstance" => TenantInstanceStatus::deserialize(status).map(drop),
        "ServiceInstance" => ServiceInstanceStatus::deserialize(status).map(drop),
        "SystemInstance" => SystemInstanceStatus::deserialize(status).map(drop),
        _ => {
            return Err(Refused {
                kind: kind.into(),
                what: named(object),
                problem: "not an instance kind".into(),
            });
        }
    };
    decoded.map_err(|e| Refused { kind: kind.into(), what: named(object), problem: e.to_string() })
}

/// Decodes a JukeBox's `status` as upstream's operator does (absent is fine).
pub fn decode_jukebox_status(object: &Value) -> Result<(), Refused> {
    match object.get("status") {
        None | Some(Value::Null) => Ok(()),
        Some(status) => JukeBoxStatus::deserialize(status).map(drop).map_err(|e| Refused {
            kind: "JukeBox".into(),
            what: named(object),
            problem: e.to_string(),
        }),
    }
}

/// Decodes a whole JukeBox (spec and status) as upstream's operator does.
pub fn decode_jukebox(object: &Value) -> Result<(), Refused> {
    decode_as::<JukeBox>("JukeBox", object).map(drop)
}

/// Reads every instance version the API server publishes, as upstream's
/// operator would (it watches the three kinds and decodes each object), and
/// keeps the statuses upstream's types refused: the round trip every
/// whole-loop test checks on what our services wrote (a spec is the test's
/// own write, so only `status` is read).
#[derive(Debug)]
pub struct UpstreamReader {
    refused: std::sync::Arc<std::sync::Mutex<Vec<(String, Refused)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for UpstreamReader {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl UpstreamReader {
    /// Watches the three instance kinds in every namespace.
    pub fn start(client: kube::Client) -> Self {
        let kinds = [
            ("TenantInstance", "tenantinstances"),
            ("ServiceInstance", "serviceinstances"),
            ("SystemInstance", "systeminstances"),
        ];
        Self::watch(client, &kinds, decode_instance_status)
    }

    /// Watches the JukeBoxes (what the scanner writes).
    pub fn jukeboxes(client: kube::Client) -> Self {
        Self::watch(client, &[("JukeBox", "jukeboxes")], decode_jukebox_status)
    }

    fn watch(
        client: kube::Client,
        kinds: &[(&str, &str)],
        decode: fn(&Value) -> Result<(), Refused>,
    ) -> Self {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let refused: std::sync::Arc<std::sync::Mutex<Vec<(String, Refused)>>> = Default::default();
        let tasks = kinds
            .iter()
            .map(|(kind, plural)| {
                let resource = kube::api::ApiResource {
                    group: "vynil.solidite.fr".into(),
                    version: "v1".into(),
                    api_version: "vynil.solidite.fr/v1".into(),
                    kind: kind.to_string(),
                    plural: plural.to_string(),
                };
                let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(client.clone(), &resource);
                let refused = refused.clone();
                tokio::spawn(async move {
                    let mut stream =
                        watcher(api, watcher::Config::default()).default_backoff().applied_objects().boxed();
                    while let Some(event) = stream.next().await {
                        let Ok(object) = event else { continue };
                        let version = object.metadata.resource_version.clone().unwrap_or_default();
                        let Ok(value) = serde_json::to_value(&object) else { continue };
                        if let Err(why) = decode(&value)
                            && let Ok(mut list) = refused.lock()
                        {
                            list.push((version, why));
                        }
                    }
                })
            })
            .collect();
        Self { refused, tasks }
    }

    /// Every object version upstream's types refused, with its `resourceVersion`.
    pub fn refused(&self) -> Vec<(String, Refused)> {
        self.refused.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn tenant(conditions: Value) -> Value {
        json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
            "metadata": {"name": "web", "namespace": "apps"},
            "spec": {"jukebox": "box", "category": "apps", "package": "web"},
            "status": {"conditions": conditions, "tag": "1.0.0", "package": {"ours": true}}})
    }

    #[test]
    fn an_unknown_condition_type_fails_the_whole_decode_as_upstreams_enum_does() {
        let good = tenant(json!([{"type": "Ready", "status": "True", "message": "ok", "generation": 1}]));
        decode_instance(&good).unwrap();
        let bad = tenant(json!([{"type": "Deleting", "status": "False", "message": "x", "generation": 1}]));
        let refused = decode_instance(&bad).unwrap_err();
        assert!(refused.problem.contains("unknown variant `Deleting`"), "{refused}");
        assert_eq!(refused.what, "apps/web");
    }

    #[test]
    fn a_condition_needs_message_and_generation_and_a_known_status() {
        for condition in [
            json!({"type": "Ready", "status": "True", "generation": 1}),
            json!({"type": "Ready", "status": "True", "message": "ok"}),
            json!({"type": "Ready", "status": "Unknown", "message": "ok", "generation": 1}),
        ] {
            assert!(decode_instance(&tenant(json!([condition]))).is_err(), "{condition}");
        }
        let system = json!({"kind": "SystemInstance", "metadata": {"name": "s", "namespace": "n"},
            "spec": {"jukebox": "b", "category": "c", "package": "p"},
            "status": {"conditions": [{"type": "InitFrom", "status": "True", "message": "", "generation": 1}]}});
        assert!(decode_instance(&system).is_err(), "System has no InitFrom");
    }

    #[test]
    fn a_jukebox_status_needs_both_lists() {
        let object = |status: Value| json!({"kind": "JukeBox", "metadata": {"name": "b"}, "status": status});
        decode_jukebox_status(&object(json!({"conditions": [], "packages": []}))).unwrap();
        let jukebox = |source: Value| json!({"metadata": {"name": "b"}, "spec": {"source": source, "schedule": "0 3 * * *"}});
        decode_jukebox(&jukebox(json!({"list": ["docker.io/sebt3/vynil"]}))).unwrap();
        let refused = decode_jukebox(&jukebox(json!({"layout": {"path": "/mirror"}}))).unwrap_err();
        assert!(refused.problem.contains("unknown variant `layout`"), "{refused}");
        assert!(decode_jukebox_status(&object(json!({"conditions": []}))).is_err());
    }
}
