//! `TenantInstance` (`vti`), `ServiceInstance` (`vsvc`), `SystemInstance`
//! (`vsi`): namespaced installs of a package (`docs/upstream-vynil.md` §1.2).
//!
//! Our additions are optional: `status.package` records the revision installed
//! (registry, image, tag, digest, type, fingerprint) so cleanup can use exactly
//! it (upstream #12 C). Condition types are upstream's closed enums, plus
//! `Deleting`, which our previous release wrote for uninstall states and
//! upstream's agent cannot decode: the CRD keeps accepting it for this one
//! release so the objects holding it stay writable, lifecycle removes every
//! one it finds and never writes it (uninstall states go on `Ready=False`).
//! Upstream's `status.digest` keeps its meaning: the hash of `spec.options`.

// `printcolumn(...)` repeats `type_ = "string"` by design; clippy reads it as a duplicate.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::condition::Condition;

/// `spec.initFrom`: restore from a backup on first install.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InitFrom {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<String>,
    pub snapshot: String,
    /// Exact package tag of the first install/restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// An object the agent created, recorded so it can be deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Children {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ServiceEndpoint {
    pub fqdn: String,
    pub port: u16,
}

/// A service an instance publishes for others' requirements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Published {
    pub key: String,
    /// The tenant using the published service, as the upstream agent writes
    /// it: a nullable string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceEndpoint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<Children>,
}

/// Ours: the revision lifecycle installed, as recorded at install time.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct InstalledPackage {
    pub registry: String,
    pub image: String,
    pub tag: String,
    /// Manifest digest `sha256:…` the tag resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// `tenant`, `service` or `system`.
    #[serde(rename = "type")]
    pub package_type: String,
    /// Hash of (revision, options hash, recommendations, controller values):
    /// a change re-runs the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// What a later delete Job needs: the pull secret the install used…
    #[serde(default, rename = "pullSecret", skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<String>,
    /// …and the controller values (`CONTROLLER_VALUES`) as rendered.
    #[serde(default, rename = "controllerValues", skip_serializing_if = "Option::is_none")]
    pub controller_values: Option<String>,
    /// RFC 3339: when lifecycle recorded this revision as installed.
    #[serde(default, rename = "installedAt", skip_serializing_if = "Option::is_none")]
    pub installed_at: Option<String>,
    /// The last revisions installed, oldest first, this one last (at most 5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<RevisionRecord>,
    /// The instance was installed by upstream's operator before the switch:
    /// checks upstream never made (the options' types) warn, never block.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
}

/// One entry of `status.package.history`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionRecord {
    pub tag: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed_at: Option<String>,
}

/// Ours: the agent Job in flight (`status.target`), recorded **before** the
/// Job is created, so a completion is credited only to the revision and
/// fingerprint it was started for.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentTarget {
    /// The revision, fingerprint and delete inputs the Job installs.
    pub revision: InstalledPackage,
    /// The Job's name in the control plane's namespace.
    pub job: String,
    /// Failed Jobs counted for this fingerprint.
    #[serde(default)]
    pub failures: u32,
    /// The uid of the last failed Job counted (each is counted once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_job: Option<String>,
    /// Why the last Job failed, from the Job and pod status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
    /// RFC 3339: the next attempt is not made before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<String>,
    /// RFC 3339: when the first Job for this fingerprint was started (kept
    /// across retries): what a failed upgrade applied is read from the
    /// phase conditions written since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

macro_rules! condition_types {
    ($name:ident { $($variant:ident),+ $(,)? }) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
        pub enum $name {
            $($variant),+
        }
    };
}

condition_types!(TenantConditionType {
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
    Deleting,
});
condition_types!(ServiceConditionType {
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
    CrdApplied,
    Deleting,
});
condition_types!(SystemConditionType {
    Ready,
    Installed,
    AgentStarted,
    CrdApplied,
    TofuInstalled,
    SystemApplied,
    RhaiApplied,
    Deleting,
});

/// Spec fields shared by the three kinds, camelCase on the wire.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[kube(
    group = "vynil.solidite.fr",
    version = "v1",
    kind = "TenantInstance",
    namespaced,
    shortname = "vti",
    status = "TenantInstanceStatus",
    doc = "A package installed for a tenant",
    printcolumn(name = "Juke", type_ = "string", json_path = ".spec.jukebox"),
    printcolumn(name = "cat", type_ = "string", json_path = ".spec.category"),
    printcolumn(name = "pkg", type_ = "string", json_path = ".spec.package"),
    printcolumn(name = "tag", type_ = "string", json_path = ".status.tag"),
    printcolumn(
        name = "last_updated",
        type_ = "date",
        json_path = ".status.conditions[?(@.type == 'Ready')].lastTransitionTime"
    ),
    printcolumn(name = "stage", type_ = "string", json_path = ".status.conditions[-1:].type"),
    printcolumn(
        name = "errors",
        type_ = "string",
        json_path = ".status.conditions[?(@.status == 'False')].message"
    )
)]
pub struct TenantInstanceSpec {
    pub jukebox: String,
    pub category: String,
    pub package: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::optional_free_object")]
    pub options: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<InitFrom>,
    /// Ours: when upgrades of this instance may start (replaces its JukeBox's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<crate::UpgradePolicy>,
}

#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[kube(
    group = "vynil.solidite.fr",
    version = "v1",
    kind = "ServiceInstance",
    namespaced,
    shortname = "vsvc",
    status = "ServiceInstanceStatus",
    doc = "A package installed as a shared service",
    printcolumn(name = "Juke", type_ = "string", json_path = ".spec.jukebox"),
    printcolumn(name = "cat", type_ = "string", json_path = ".spec.category"),
    printcolumn(name = "pkg", type_ = "string", json_path = ".spec.package"),
    printcolumn(name = "tag", type_ = "string", json_path = ".status.tag"),
    printcolumn(
        name = "last_updated",
        type_ = "date",
        json_path = ".status.conditions[?(@.type == 'Ready')].lastTransitionTime"
    ),
    printcolumn(name = "stage", type_ = "string", json_path = ".status.conditions[-1:].type"),
    printcolumn(
        name = "errors",
        type_ = "string",
        json_path = ".status.conditions[?(@.status == 'False')].message"
    )
)]
pub struct ServiceInstanceSpec {
    pub jukebox: String,
    pub category: String,
    pub package: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::optional_free_object")]
    pub options: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<InitFrom>,
    /// Ours: when upgrades of this instance may start (replaces its JukeBox's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<crate::UpgradePolicy>,
}

#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[kube(
    group = "vynil.solidite.fr",
    version = "v1",
    kind = "SystemInstance",
    namespaced,
    shortname = "vsi",
    status = "SystemInstanceStatus",
    doc = "A package installed for the whole cluster",
    printcolumn(name = "Juke", type_ = "string", json_path = ".spec.jukebox"),
    printcolumn(name = "cat", type_ = "string", json_path = ".spec.category"),
    printcolumn(name = "pkg", type_ = "string", json_path = ".spec.package"),
    printcolumn(name = "tag", type_ = "string", json_path = ".status.tag"),
    printcolumn(
        name = "last_updated",
        type_ = "date",
        json_path = ".status.conditions[?(@.type == 'Ready')].lastTransitionTime"
    ),
    printcolumn(name = "stage", type_ = "string", json_path = ".status.conditions[-1:].type"),
    printcolumn(
        name = "errors",
        type_ = "string",
        json_path = ".status.conditions[?(@.status == 'False')].message"
    )
)]
pub struct SystemInstanceSpec {
    pub jukebox: String,
    pub category: String,
    pub package: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::optional_free_object")]
    pub options: Option<Map<String, Value>>,
    /// Ours: when upgrades of this instance may start (replaces its JukeBox's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<crate::UpgradePolicy>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct TenantInstanceStatus {
    #[serde(default)]
    pub conditions: Vec<Condition<TenantConditionType>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Upstream's meaning: sha256 of the JSON of `spec.options`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tfstate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rhaistate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub befores: Option<Vec<Children>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vitals: Option<Vec<Children>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scalables: Option<Vec<Children>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub others: Option<Vec<Children>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub posts: Option<Vec<Children>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<Vec<Published>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<InstalledPackage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<AgentTarget>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct ServiceInstanceStatus {
    #[serde(default)]
    pub conditions: Vec<Condition<ServiceConditionType>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Upstream's meaning: sha256 of the JSON of `spec.options`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tfstate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rhaistate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub befores: Option<Vec<Children>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vitals: Option<Vec<Children>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scalables: Option<Vec<Children>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub others: Option<Vec<Children>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub posts: Option<Vec<Children>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crds: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<Vec<Published>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<InstalledPackage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<AgentTarget>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct SystemInstanceStatus {
    #[serde(default)]
    pub conditions: Vec<Condition<SystemConditionType>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Upstream's meaning: sha256 of the JSON of `spec.options`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tfstate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rhaistate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub systems: Option<Vec<Children>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crds: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<InstalledPackage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<AgentTarget>,
}

fn any_children(lists: &[&Option<Vec<Children>>]) -> bool {
    lists.iter().any(|l| l.as_ref().is_some_and(|v| !v.is_empty()))
}

fn any_state(tfstate: &Option<String>, rhaistate: &Option<String>) -> bool {
    tfstate.is_some() || rhaistate.is_some()
}

/// Upstream's `have_child()`: the status records something a delete must undo.
pub trait HaveChild {
    fn have_child(&self) -> bool;
}

impl HaveChild for TenantInstanceStatus {
    fn have_child(&self) -> bool {
        any_state(&self.tfstate, &self.rhaistate)
            || any_children(&[&self.befores, &self.vitals, &self.others, &self.scalables, &self.posts])
    }
}

impl HaveChild for ServiceInstanceStatus {
    fn have_child(&self) -> bool {
        any_state(&self.tfstate, &self.rhaistate)
            || any_children(&[&self.befores, &self.vitals, &self.others, &self.scalables, &self.posts])
            || self.crds.as_ref().is_some_and(|c| !c.is_empty())
    }
}

impl HaveChild for SystemInstanceStatus {
    fn have_child(&self) -> bool {
        any_state(&self.tfstate, &self.rhaistate)
            || any_children(&[&self.systems])
            || self.crds.as_ref().is_some_and(|c| !c.is_empty())
    }
}

impl<S: HaveChild> HaveChild for Option<S> {
    fn have_child(&self) -> bool {
        self.as_ref().is_some_and(HaveChild::have_child)
    }
}
