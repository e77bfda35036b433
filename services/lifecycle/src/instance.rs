//! The three instance kinds as one view, decoded object by object.
//!
//! The controllers watch `DynamicObject`s, not the typed CRDs: a typed watcher
//! fails its whole stream on one object it cannot decode, and upstream's
//! operator panicked on some (upstream #16). Here each object is decoded on
//! its own into [`Instance`], the kind-independent view the planner reads; an
//! object that does not decode is a [`DecodeError`] for that object only (an
//! Event and a counted failure), and the others keep reconciling.

use kube::{
    ResourceExt,
    api::{ApiResource, DynamicObject},
};
use serde_json::{Map, Value};
use vynil_crds::{
    AgentTarget, Condition, HaveChild, InitFrom, InstalledPackage, ServiceInstance, ServiceInstanceStatus,
    SystemInstance, SystemInstanceStatus, TenantInstance, annotations, finalizers,
};
use vynil_rules::PackageType;

/// `TenantInstance`, `ServiceInstance` or `SystemInstance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InstanceKind {
    Tenant,
    Service,
    System,
}

impl InstanceKind {
    pub const ALL: [InstanceKind; 3] = [InstanceKind::Tenant, InstanceKind::Service, InstanceKind::System];

    /// The package type this kind installs (and the Job name's prefix).
    pub fn package_type(self) -> PackageType {
        match self {
            InstanceKind::Tenant => PackageType::Tenant,
            InstanceKind::Service => PackageType::Service,
            InstanceKind::System => PackageType::System,
        }
    }

    pub fn from_package_type(package_type: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.package_type().as_str() == package_type)
    }

    pub fn kind(self) -> &'static str {
        match self {
            InstanceKind::Tenant => "TenantInstance",
            InstanceKind::Service => "ServiceInstance",
            InstanceKind::System => "SystemInstance",
        }
    }

    pub fn finalizer(self) -> &'static str {
        match self {
            InstanceKind::Tenant => finalizers::TENANT,
            InstanceKind::Service => finalizers::SERVICE,
            InstanceKind::System => finalizers::SYSTEM,
        }
    }

    pub fn api_resource(self) -> ApiResource {
        let kind = self.kind();
        ApiResource {
            group: "vynil.solidite.fr".into(),
            version: "v1".into(),
            api_version: "vynil.solidite.fr/v1".into(),
            kind: kind.into(),
            plural: format!("{}s", kind.to_ascii_lowercase()),
        }
    }
}

impl std::fmt::Display for InstanceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.package_type().as_str())
    }
}

/// An object of an instance kind that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {namespace}/{name} does not decode: {problem}; fix the object (kubectl edit) or delete it")]
pub struct DecodeError {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub problem: String,
}

/// What the planner reads of an instance, whatever its kind.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    pub kind: InstanceKind,
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    /// `metadata.creationTimestamp` (set by the API server, never by a writer).
    pub created: Option<jiff::Timestamp>,
    pub generation: i64,
    pub deleting: bool,
    pub suspended: bool,
    pub force_reinstall: bool,
    /// `vynil.solidite.fr/hold-upgrades: "true"`.
    pub hold_upgrades: bool,
    /// `vynil.solidite.fr/rollback: "false"`: a failed upgrade is neither
    /// quarantined nor rolled back.
    pub rollback_off: bool,
    /// `vynil.solidite.fr/upgrade-approval: manual`.
    pub manual_approval: bool,
    /// The raw value of `vynil.solidite.fr/delete-without-package`, when set.
    pub delete_without_package: Option<String>,
    pub jukebox: String,
    pub category: String,
    pub package: String,
    pub options: Option<Map<String, Value>>,
    pub init_from: Option<InitFrom>,
    /// Ours: when its upgrades may start (replaces its JukeBox's).
    pub upgrade_policy: Option<vynil_crds::UpgradePolicy>,
    /// What lifecycle reads as the status: once [`Instance::per_ledger`] is
    /// applied, `package`, `target` and the installed tag are lifecycle's
    /// own record, not the object's status (a display copy).
    pub status: InstanceStatus,
    /// What the object's status shows of the record (a copy that may lag);
    /// `None` until [`Instance::per_ledger`] is applied.
    pub shown: Option<Shown>,
    /// The repositories its ledger credited installs from ([`Ledger::repositories`]).
    pub listed_before: Vec<String>,
    /// The whole object as JSON, bound as `instance` in Rhai scripts.
    pub object: Value,
}

/// Lifecycle's ledger of an instance, kept in its own record (#65 item 3):
/// the revision it credited as installed and the Job it started. A tenant
/// who may write its instance's status writes neither: `status.package` and
/// `status.target` are display copies of these.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Ledger {
    pub package: Option<InstalledPackage>,
    pub target: Option<AgentTarget>,
    /// What the status said when lifecycle first met the instance (the
    /// takeover): upstream's `status.tag` and options hash then.
    pub adopted: Option<Adopted>,
    /// Every repository (`registry/repository`) it credited an install
    /// from: the instance's own package there, for its cleanup, wherever
    /// the catalog lists the package now (#65 item 5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repositories: Vec<String>,
}

/// Upstream's `status.tag` and `status.digest` (its options hash) as
/// lifecycle first met them.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Adopted {
    pub tag: Option<String>,
    pub options_hash: Option<String>,
}

/// What the object's status shows of the record: the fingerprints of its
/// `package` and `target` copies.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Shown {
    pub package: Option<String>,
    pub target: Option<String>,
}

impl Shown {
    fn of(status: &InstanceStatus) -> Self {
        Self {
            package: status.package.as_ref().and_then(|p| p.fingerprint.clone()),
            target: status.target.as_ref().and_then(|t| t.revision.fingerprint.clone()),
        }
    }
}

/// The status fields lifecycle reads and writes, kind-independent.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InstanceStatus {
    /// `status.tag`, `None` when never installed.
    pub tag: Option<String>,
    /// `status.digest`: upstream's options hash.
    pub digest: Option<String>,
    pub conditions: Vec<Condition<String>>,
    pub package: Option<InstalledPackage>,
    pub target: Option<AgentTarget>,
    pub have_child: bool,
    /// `status.crds` (service and system kinds).
    pub crds: Vec<String>,
}

impl Instance {
    /// Upstream's own control plane (`vynil_rules::install::is_upstream_control_plane`).
    pub fn is_upstream_control_plane(&self) -> bool {
        vynil_rules::install::is_upstream_control_plane(&self.category, &self.package, &self.status.crds)
    }

    /// Where its status says it stands: what lifecycle adopts when it first
    /// meets an instance created before its takeover (`crate::ledger`).
    pub fn ledger_shown(&self) -> Ledger {
        let adopted = Adopted { tag: self.status.tag.clone(), options_hash: self.status.digest.clone() };
        Ledger {
            package: self.status.package.clone(),
            target: self.status.target.clone(),
            adopted: Some(adopted),
            repositories: self
                .status
                .package
                .iter()
                .map(|p| vynil_rules::repository::entry(&p.registry, &p.image))
                .collect(),
        }
    }

    /// The instance as its `ledger` (lifecycle's record) says it stands: the
    /// installed revision, its tag and the Job started are the record's,
    /// whatever the status says; the status is kept as [`Instance::shown`].
    pub fn per_ledger(mut self, ledger: &Ledger) -> Self {
        self.shown = Some(Shown::of(&self.status));
        let adopted = ledger.adopted.as_ref().filter(|_| ledger.package.is_none());
        self.status.tag = match &ledger.package {
            Some(package) => Some(package.tag.clone()),
            None => adopted.and_then(|a| a.tag.clone()),
        };
        if ledger.package.is_none() {
            self.status.digest = adopted.and_then(|a| a.options_hash.clone());
        }
        self.status.package = ledger.package.clone();
        self.status.target = ledger.target.clone();
        self.listed_before = ledger.repositories.clone();
        self
    }

    /// Whether the status's copies lag the record (a status write that
    /// failed after the record's): the next write shows it again.
    pub fn shown_lags(&self) -> bool {
        self.shown.as_ref().is_some_and(|shown| *shown != Shown::of(&self.status))
    }

    /// Its phase conditions as they stand (`vynil_rules::upgrade::SeenPhase`).
    pub fn seen_phases(&self) -> Vec<vynil_rules::upgrade::SeenPhase> {
        self.status
            .conditions
            .iter()
            .filter(|c| vynil_rules::upgrade::SeenPhase::is_phase(&c.condition_type))
            .map(|c| vynil_rules::upgrade::SeenPhase {
                condition_type: c.condition_type.clone(),
                status: c.status.as_str().to_string(),
                message: c.message.clone(),
                last_transition_time: c.last_transition_time.clone().unwrap_or_default(),
            })
            .collect()
    }

    /// The tag install selection starts from: `status.tag`, except the tag
    /// the agent of our Job in flight (`status.target`) wrote: upstream's
    /// agent writes `status.tag` before its Job completes, and until that
    /// Job is credited the installed revision is the one recorded in
    /// `status.package` (none on our first install). Read as installed, it
    /// made the next revision look due and superseded the Job about to
    /// complete: a restore from `initFrom.version`, or a waypoint, never
    /// recorded.
    pub fn installed_tag(&self) -> Option<&str> {
        let tag = self.status.tag.as_deref();
        match (&self.status.package, &self.status.target) {
            (Some(package), Some(target)) if tag == Some(target.revision.tag.as_str()) => {
                Some(package.tag.as_str())
            }
            (None, Some(target)) if !target.revision.adopted && tag == Some(target.revision.tag.as_str()) => {
                None
            }
            _ => tag,
        }
    }

    /// Its labels (`metadata.labels`): what a JukeBox's waves select.
    pub fn labels(&self) -> std::collections::BTreeMap<String, String> {
        self.object
            .pointer("/metadata/labels")
            .and_then(|labels| serde_json::from_value(labels.clone()).ok())
            .unwrap_or_default()
    }

    /// Its own upgrade policy: `spec.upgradePolicy`, made manual by
    /// `vynil.solidite.fr/upgrade-approval: manual`.
    pub fn own_policy(&self) -> Option<vynil_crds::UpgradePolicy> {
        let manual = Some(vynil_crds::ApprovalMode::Manual);
        match (&self.upgrade_policy, self.manual_approval) {
            (policy, false) => policy.clone(),
            (Some(policy), true) => Some(vynil_crds::UpgradePolicy { approval: manual, ..policy.clone() }),
            (None, true) => Some(vynil_crds::UpgradePolicy { approval: manual, ..Default::default() }),
        }
    }

    /// Installed by upstream's operator before the switch: upstream's
    /// `status.tag` with nothing of ours recorded, or recorded as adopted
    /// (kept through later installs, so the instance keeps being served as
    /// upstream served it).
    pub fn upstream_installed(&self) -> bool {
        match (&self.status.package, &self.status.target) {
            (Some(package), _) => package.adopted,
            (None, Some(target)) => target.revision.adopted,
            (None, None) => self.status.tag.is_some(),
        }
    }
}

fn typed<T: serde::de::DeserializeOwned>(value: &Value) -> Result<T, String> {
    serde_json::from_value(value.clone()).map_err(|e| e.to_string())
}

impl Instance {
    /// Decodes `object` as `kind`; the error names the object and the problem.
    pub fn decode(kind: InstanceKind, object: &DynamicObject) -> Result<Self, DecodeError> {
        let namespace = object.namespace().unwrap_or_default();
        let name = object.name_any();
        let fail = |problem: String| DecodeError {
            kind: kind.kind(),
            namespace: namespace.clone(),
            name: name.clone(),
            problem,
        };
        let mut value = serde_json::to_value(object).map_err(|e| fail(e.to_string()))?;
        if value.get("status").is_some_and(Value::is_null)
            && let Some(map) = value.as_object_mut()
        {
            map.remove("status");
        }
        // The typed decode is the schema check; one expansion per kind (shared fields, no shared type).
        macro_rules! view {
            ($typed:ty, |$i:ident| $init_from:expr, $crds:expr) => {{
                let $i: $typed = typed(&value).map_err(fail)?;
                let s = $i.status.unwrap_or_default();
                let have_child = s.have_child();
                let init_from = $init_from;
                let crds: Vec<String> = $crds(&s);
                let spec = (
                    ($i.spec.jukebox, $i.spec.category, $i.spec.package),
                    ($i.spec.options, init_from, $i.spec.upgrade_policy),
                );
                (spec, (s.tag, s.digest, conditions(&s.conditions), s.package, s.target, have_child, crds))
            }};
        }
        let (spec, status) = match kind {
            InstanceKind::Tenant => view!(TenantInstance, |i| i.spec.init_from.clone(), |_s| Vec::new()),
            InstanceKind::Service => {
                view!(ServiceInstance, |i| i.spec.init_from.clone(), |s: &ServiceInstanceStatus| s
                    .crds
                    .clone()
                    .unwrap_or_default())
            }
            InstanceKind::System => {
                view!(SystemInstance, |i| None, |s: &SystemInstanceStatus| s.crds.clone().unwrap_or_default())
            }
        };
        let ((jukebox, category, package), (options, init_from, upgrade_policy)) = spec;
        let (tag, digest, conditions, installed, target, have_child, crds) = status;
        let annotations = object.annotations();
        let says = |key: &str, value: &str| annotations.get(key).is_some_and(|v| v == value);
        Ok(Instance {
            kind,
            uid: object.uid(),
            created: object.metadata.creation_timestamp.as_ref().map(|t| t.0),
            generation: object.metadata.generation.unwrap_or(0),
            deleting: object.metadata.deletion_timestamp.is_some(),
            suspended: says(annotations::SUSPEND, "true"),
            force_reinstall: annotations.contains_key(annotations::FORCE_REINSTALL),
            delete_without_package: annotations.get(annotations::DELETE_WITHOUT_PACKAGE).cloned(),
            hold_upgrades: says(annotations::HOLD_UPGRADES, "true"),
            manual_approval: says(vynil_crds::policy::UPGRADE_APPROVAL, "manual"),
            rollback_off: says(vynil_rules::upgrade::ROLLBACK_ANNOTATION, "false"),
            jukebox,
            category,
            package,
            options,
            init_from,
            upgrade_policy,
            status: InstanceStatus {
                tag: tag.filter(|t| !t.is_empty()),
                digest,
                conditions,
                package: installed,
                target,
                have_child,
                crds,
            },
            shown: None,
            listed_before: Vec::new(),
            namespace,
            name,
            object: value,
        })
    }

    /// `<kind>/<namespace>/<name>`, e.g. `tenant/apps/ollama`.
    pub fn reference(&self) -> String {
        format!("{}/{}/{}", self.kind, self.namespace, self.name)
    }
}

fn conditions<T: serde::Serialize>(typed: &[Condition<T>]) -> Vec<Condition<String>> {
    typed
        .iter()
        .filter_map(|c| {
            let condition_type = serde_json::to_value(&c.condition_type).ok()?.as_str()?.to_string();
            Some(Condition {
                last_transition_time: c.last_transition_time.clone(),
                message: c.message.clone(),
                condition_type,
                status: c.status,
                generation: c.generation,
            })
        })
        .collect()
}

/// The object of `kind` as the lifecycle API names it.
pub(crate) fn proto_reference(
    kind: InstanceKind,
    object: &DynamicObject,
) -> vynil_proto::lifecycle::v1::InstanceRef {
    use vynil_proto::lifecycle::v1::InstanceKind as ProtoKind;
    let kind = match kind {
        InstanceKind::Tenant => ProtoKind::Tenant,
        InstanceKind::Service => ProtoKind::Service,
        InstanceKind::System => ProtoKind::System,
    };
    vynil_proto::lifecycle::v1::InstanceRef {
        kind: kind as i32,
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn an_upstream_tenant_instance_decodes_into_the_view() {
        let o = object(json!({
            "apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
            "metadata": {"name": "ollama", "namespace": "apps", "generation": 2,
                "annotations": {"vynil.solidite.fr/suspend": "true"}},
            "spec": {"jukebox": "box", "category": "think", "package": "ollama", "options": {"a": 1}},
            "status": {"tag": "1.0.0", "digest": "abc", "vitals": [{"kind": "Deployment", "name": "x"}],
                "conditions": [{"type": "Ready", "status": "True", "message": "Installed succesfully", "generation": 2}]},
        }));
        let i = Instance::decode(InstanceKind::Tenant, &o).unwrap();
        assert_eq!((i.jukebox.as_str(), i.category.as_str(), i.package.as_str()), ("box", "think", "ollama"));
        assert_eq!(i.status.tag.as_deref(), Some("1.0.0"));
        assert!(i.status.have_child && i.suspended && !i.force_reinstall);
        assert_eq!(i.status.conditions[0].condition_type, "Ready");
        assert_eq!(i.reference(), "tenant/apps/ollama");
    }

    #[test]
    fn the_tag_our_agent_wrote_before_its_job_completed_is_not_read_as_installed() {
        let revision = |tag: &str, adopted: bool| InstalledPackage {
            tag: tag.into(),
            adopted,
            ..InstalledPackage::default()
        };
        let target = |tag: &str, adopted: bool| AgentTarget {
            revision: revision(tag, adopted),
            ..AgentTarget::default()
        };
        let base = object(json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
            "metadata": {"name": "web", "namespace": "apps"},
            "spec": {"jukebox": "box", "category": "apps", "package": "web"}}));
        let base = Instance::decode(InstanceKind::Tenant, &base).unwrap();
        let with = |tag: Option<&str>, package: Option<InstalledPackage>, target: Option<AgentTarget>| {
            let mut instance = base.clone();
            instance.status =
                InstanceStatus { tag: tag.map(String::from), package, target, ..InstanceStatus::default() };
            instance
        };
        // Upgrade in flight, its agent done writing: still 2.5.0 until credited.
        assert_eq!(
            with(Some("3.5.0"), Some(revision("2.5.0", false)), Some(target("3.5.0", false))).installed_tag(),
            Some("2.5.0")
        );
        // Before the agent wrote: 2.5.0 too.
        assert_eq!(
            with(Some("2.5.0"), Some(revision("2.5.0", false)), Some(target("3.5.0", false))).installed_tag(),
            Some("2.5.0")
        );
        // Our first install in flight: nothing installed yet.
        assert_eq!(with(Some("2.5.0"), None, Some(target("2.5.0", false))).installed_tag(), None);
        // Upstream's install (adopted) being upgraded: its tag is all we know.
        assert_eq!(with(Some("3.5.0"), None, Some(target("3.5.0", true))).installed_tag(), Some("3.5.0"));
        // Nothing in flight: status.tag, ours or upstream's.
        assert_eq!(with(Some("4.0.0"), Some(revision("4.0.0", false)), None).installed_tag(), Some("4.0.0"));
        assert_eq!(with(Some("1.0.0"), None, None).installed_tag(), Some("1.0.0"));
    }

    #[test]
    fn garbage_is_an_error_naming_the_object_never_a_panic() {
        let cases = [
            json!({"spec": "not an object"}),
            json!({"spec": {"jukebox": 3, "category": "c", "package": "p"}}),
            json!({"spec": {"jukebox": "b", "category": "c", "package": "p", "options": [1]}}),
            json!({"spec": {"jukebox": "b", "category": "c", "package": "p"}, "status": {"conditions": "x"}}),
            json!({}),
        ];
        for case in cases {
            let mut value = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
                "metadata": {"name": "bad", "namespace": "apps"}});
            for (k, v) in case.as_object().unwrap() {
                value[k] = v.clone();
            }
            let error = Instance::decode(InstanceKind::Tenant, &object(value)).unwrap_err();
            assert!(error.to_string().contains("TenantInstance apps/bad"), "{error}");
        }
        // Unknown fields and a huge string are fine.
        let ok = object(json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "ServiceInstance",
            "metadata": {"name": "ok", "namespace": "apps"},
            "spec": {"jukebox": "b", "category": "c", "package": "x".repeat(100_000), "surprise": true}}));
        assert!(Instance::decode(InstanceKind::Service, &ok).is_ok());
    }
}
