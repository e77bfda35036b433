//! The reaper: `vynil-lifecycle reap --kind <k> --namespace <ns> --name <n>
//! --confirmations-namespace <control plane>`, the delete Job of an instance
//! whose package is gone, which carries
//! `vynil.solidite.fr/delete-without-package: "true"` and whose recorded
//! children an admin confirmed (`crate::confirmation`). It runs under the agent
//! ServiceAccount (the lifecycle service itself never deletes children, so its
//! own RBAC stays narrow) and unpacks nothing: no package hook runs.
//!
//! It deletes exactly the children the admin confirmed, and nothing unless
//! the confirmation still holds (same object UID, the status' recorded
//! children unchanged since), in reverse phase
//! order (posts → scalables → others → vitals → befores, then systems), waits
//! until each is gone and verifies it with a GET answering 404. `status` is
//! writable by whoever may patch the instance's status (a tenant with a wide
//! Role), and the reaper runs as the cluster-admin agent account, so a
//! recorded child is only a candidate: it is deleted only when the object
//! carries the labels upstream's agent sets on what it creates for this very
//! instance (`managed-by: vynil`, `app.kubernetes.io/instance`,
//! `owner-namespace`, `owner-type`, `owner-category`) and, when namespaced,
//! lies in the instance's namespace (or, for a tenant, one of its tenant's
//! namespaces); the delete is conditioned on the UID that was checked.
//! Anything else is reported for a human, never deleted. It is
//! careful: a child without `apiVersion` is resolved by discovery only when
//! exactly one served resource has that kind; CustomResourceDefinitions and
//! Namespaces are never deleted (deleting a CRD deletes every object of its
//! type cluster-wide) but listed for a human. Its report — one line per child:
//! deleted, already gone, skipped and why, still present — is JSON on stdout
//! and in the container's termination message, which lifecycle reads.

use std::time::Duration;

use kube::{
    Api, Client, Discovery,
    api::{ApiResource, DeleteParams, DynamicObject},
    discovery::{ApiCapabilities, Scope},
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{LifecycleError, children::recorded_children, instance::InstanceKind};

/// Kubernetes keeps at most 4096 bytes of a termination message.
const TERMINATION_MESSAGE_MAX: usize = 4096;

/// `vynil-lifecycle reap`: flags of the reaper Job's container.
#[derive(Debug, Clone, clap::Args)]
pub struct ReapArgs {
    /// `tenant`, `service` or `system`.
    #[arg(long)]
    pub kind: String,
    #[arg(long)]
    pub namespace: String,
    #[arg(long)]
    pub name: String,
    /// Where lifecycle records admins' confirmations (its own namespace).
    #[arg(long)]
    pub confirmations_namespace: String,
    /// How long each child may take to disappear.
    #[arg(long, default_value_t = 300)]
    pub wait_seconds: u64,
    /// Where the report is also written (Kubernetes reads it as the termination message).
    #[arg(long, default_value = "/dev/termination-log")]
    pub report_path: std::path::PathBuf,
    /// Namespace label naming a namespace's tenant (upstream's `TENANT_LABEL`).
    #[arg(long, env = "TENANT_LABEL", default_value = "vynil.solidite.fr/tenant")]
    pub tenant_label: String,
}

/// Whose a recorded child must be before the reaper deletes it.
#[derive(Debug, Clone)]
struct Owner {
    /// Upstream's agent labels (`upstream-facts.md`, "The agent"), key → value.
    labels: Vec<(&'static str, String)>,
    /// Where a namespaced child may be: the instance's namespace, and for a
    /// tenant its tenant's namespaces.
    namespaces: Vec<String>,
}

impl Owner {
    /// `None` when the object is this instance's; else why not.
    fn refuses(&self, object: &DynamicObject, namespace: Option<&str>) -> Option<String> {
        if let Some(ns) = namespace
            && !self.namespaces.iter().any(|n| n == ns)
        {
            return Some(format!(
                "namespace {ns} is not the instance's ({}): never deleted here",
                self.namespaces.join(", ")
            ));
        }
        let labels = object.metadata.labels.clone().unwrap_or_default();
        let wrong: Vec<String> = self
            .labels
            .iter()
            .filter(|(key, value)| labels.get(*key) != Some(value))
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        (!wrong.is_empty()).then(|| {
            format!(
                "not labelled as this instance's by upstream's agent (lacks {}): never deleted here",
                wrong.join(", ")
            )
        })
    }
}

/// What became of one child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ChildOutcome {
    Deleted,
    AlreadyGone,
    Skipped { why: String },
    StillPresent { why: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildReport {
    pub phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(flatten)]
    pub outcome: ChildOutcome,
}

impl ChildReport {
    fn label(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

/// The reaper's report.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ReaperReport {
    pub children: Vec<ChildReport>,
    /// Entries left out of the termination message for its size (all deleted or gone).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub omitted: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl ReaperReport {
    /// Every child the reaper was allowed to delete is verified gone.
    pub fn all_allowed_gone(&self) -> bool {
        !self.children.iter().any(|c| matches!(c.outcome, ChildOutcome::StillPresent { .. }))
    }

    pub fn still_present(&self) -> Vec<String> {
        self.children
            .iter()
            .filter_map(|c| match &c.outcome {
                ChildOutcome::StillPresent { why } => Some(format!("{} ({why})", c.label())),
                _ => None,
            })
            .collect()
    }

    pub fn deleted(&self) -> Vec<String> {
        let mut deleted: Vec<String> = self
            .children
            .iter()
            .filter(|c| c.outcome == ChildOutcome::Deleted)
            .map(ChildReport::label)
            .collect();
        if self.omitted > 0 {
            deleted.push(format!("{} more", self.omitted));
        }
        deleted
    }

    /// What a human must look at: skipped children, with why.
    pub fn left(&self) -> Vec<String> {
        self.children
            .iter()
            .filter_map(|c| match &c.outcome {
                ChildOutcome::Skipped { why } => Some(format!("{} ({why})", c.label())),
                _ => None,
            })
            .collect()
    }

    /// Compact JSON within the termination message limit: deleted and
    /// already-gone entries are dropped first, counted in `omitted`.
    pub fn to_message(&self) -> String {
        let mut report = self.clone();
        loop {
            let text = serde_json::to_string(&report).unwrap_or_default();
            if text.len() <= TERMINATION_MESSAGE_MAX {
                return text;
            }
            let Some(i) = report
                .children
                .iter()
                .position(|c| matches!(c.outcome, ChildOutcome::Deleted | ChildOutcome::AlreadyGone))
            else {
                return text;
            };
            report.children.remove(i);
            report.omitted += 1;
        }
    }
}

/// A recorded child, as the agent writes it in status.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Child {
    #[serde(default, alias = "api_version")]
    api_version: Option<String>,
    kind: String,
    name: String,
    #[serde(default)]
    namespace: Option<String>,
}

fn resolve(discovery: &Discovery, child: &Child) -> Result<(ApiResource, ApiCapabilities), String> {
    let mut found: Vec<(ApiResource, ApiCapabilities)> = Vec::new();
    for group in discovery.groups() {
        for (resource, capabilities) in group.recommended_resources() {
            let version_ok = child.api_version.as_deref().is_none_or(|v| v == resource.api_version);
            if resource.kind == child.kind && version_ok {
                found.push((resource, capabilities));
            }
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(format!(
            "no served resource has kind {}{}",
            child.kind,
            child.api_version.as_deref().map(|v| format!(" in {v}")).unwrap_or_default()
        )),
        n => Err(format!("{n} served resources have kind {} and the child names no apiVersion", child.kind)),
    }
}

/// Deletes the recorded children of the instance and reports on each.
pub async fn reap(client: &Client, args: &ReapArgs) -> Result<ReaperReport, LifecycleError> {
    let kind = InstanceKind::from_package_type(&args.kind).ok_or_else(|| {
        LifecycleError::Invalid(format!("--kind {:?}: use tenant, service or system", args.kind))
    })?;
    let instances: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &args.namespace, &kind.api_resource());
    let instance = instances.get(&args.name).await.map_err(LifecycleError::kube("reading the instance"))?;
    let status = instance.data.get("status").cloned().unwrap_or(Value::Null);
    let status = confirmed_children(client, args, &instance, &status).await?;
    let owner = owner_of(client, args, kind, &instance).await?;
    let (children, crds) = recorded_children(&status);
    let discovery = Discovery::new(client.clone()).run().await.map_err(LifecycleError::kube("discovery"))?;
    let wait = Duration::from_secs(args.wait_seconds);
    let mut report = ReaperReport::default();
    for (phase, raw) in children {
        let parsed: Result<Child, _> = serde_json::from_value(raw.clone());
        let Ok(child) = parsed else {
            report.children.push(ChildReport {
                phase,
                api_version: None,
                kind: raw.get("kind").and_then(Value::as_str).unwrap_or("?").into(),
                name: raw.get("name").and_then(Value::as_str).unwrap_or("?").into(),
                namespace: None,
                outcome: ChildOutcome::Skipped {
                    why: format!("the recorded child {raw} is not {{kind, name}}"),
                },
            });
            continue;
        };
        let outcome = reap_child(client, &discovery, &child, &owner, &args.namespace, wait).await;
        report.children.push(ChildReport {
            phase,
            api_version: child.api_version,
            kind: child.kind,
            name: child.name,
            namespace: child.namespace,
            outcome,
        });
    }
    for crd in crds {
        report.children.push(ChildReport {
            phase: "crds".into(),
            api_version: Some("apiextensions.k8s.io/v1".into()),
            kind: "CustomResourceDefinition".into(),
            name: crd,
            namespace: None,
            outcome: ChildOutcome::Skipped {
                why:
                    "CRDs are never deleted here: deleting one deletes every object of its type cluster-wide"
                        .into(),
            },
        });
    }
    Ok(report)
}

/// The children an admin confirmed for this instance, while the
/// confirmation holds: status is tenant-writable, so only what was confirmed
/// is ever deleted.
async fn confirmed_children(
    client: &Client,
    args: &ReapArgs,
    instance: &DynamicObject,
    status: &Value,
) -> Result<Value, LifecycleError> {
    let uid = instance.metadata.uid.clone().unwrap_or_default();
    let confirmations = crate::confirmation::Confirmations::new(client, &args.confirmations_namespace);
    let reference = format!("{} {}/{}", args.kind, args.namespace, args.name);
    let confirmed = confirmations.read(&uid).await?.ok_or_else(|| {
        LifecycleError::Refused(format!(
            "no admin confirmed deleting the children of {reference} without package (AllowDeleteWithoutPackage): nothing deleted"
        ))
    })?;
    if let Some(why) = confirmed.voided(&uid, status, &args.namespace) {
        return Err(LifecycleError::Refused(format!(
            "the confirmation for {reference} no longer holds: {why}; nothing deleted"
        )));
    }
    Ok(confirmed.children)
}

/// What marks a child as this instance's: its labels, in the instance's
/// namespace or (for a tenant) any namespace of its tenant.
async fn owner_of(
    client: &Client,
    args: &ReapArgs,
    kind: InstanceKind,
    instance: &DynamicObject,
) -> Result<Owner, LifecycleError> {
    let category = instance.data.pointer("/spec/category").and_then(Value::as_str).unwrap_or_default();
    let mut namespaces = vec![args.namespace.clone()];
    if kind == InstanceKind::Tenant {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        let own =
            api.get_opt(&args.namespace).await.map_err(LifecycleError::kube("reading the namespace"))?;
        let tenant = own.and_then(|n| n.metadata.labels.and_then(|l| l.get(&args.tenant_label).cloned()));
        if let Some(tenant) = tenant {
            let selector =
                kube::api::ListParams::default().labels(&format!("{}={tenant}", args.tenant_label));
            let listed =
                api.list(&selector).await.map_err(LifecycleError::kube("listing the tenant's namespaces"))?;
            namespaces.extend(listed.items.into_iter().filter_map(|n| n.metadata.name));
        }
    }
    Ok(Owner {
        labels: vec![
            ("app.kubernetes.io/managed-by", "vynil".into()),
            ("app.kubernetes.io/instance", args.name.clone()),
            ("vynil.solidite.fr/owner-namespace", args.namespace.clone()),
            ("vynil.solidite.fr/owner-type", kind.package_type().as_str().into()),
            ("vynil.solidite.fr/owner-category", category.into()),
        ],
        namespaces,
    })
}

async fn reap_child(
    client: &Client,
    discovery: &Discovery,
    child: &Child,
    owner: &Owner,
    default_ns: &str,
    wait: Duration,
) -> ChildOutcome {
    if matches!(child.kind.as_str(), "CustomResourceDefinition" | "Namespace") {
        return ChildOutcome::Skipped {
            why: format!("a {} is never deleted here: it takes every object it holds along", child.kind),
        };
    }
    let (resource, capabilities) = match resolve(discovery, child) {
        Ok(found) => found,
        Err(why) => return ChildOutcome::Skipped { why },
    };
    let (api, namespace): (Api<DynamicObject>, Option<&str>) = match capabilities.scope {
        Scope::Namespaced => {
            let ns = child.namespace.as_deref().unwrap_or(default_ns);
            (Api::namespaced_with(client.clone(), ns, &resource), Some(ns))
        }
        Scope::Cluster => (Api::all_with(client.clone(), &resource), None),
    };
    let found = match api.get_opt(&child.name).await {
        Ok(Some(found)) => found,
        Ok(None) => return ChildOutcome::AlreadyGone,
        Err(e) => return ChildOutcome::StillPresent { why: format!("cannot read it: {e}") },
    };
    if let Some(why) = owner.refuses(&found, namespace) {
        return ChildOutcome::Skipped { why };
    }
    // Exactly the object checked: a replacement of the same name is not deleted.
    let mut params = DeleteParams::background();
    params.preconditions =
        Some(kube::api::Preconditions { uid: found.metadata.uid.clone(), resource_version: None });
    match api.delete(&child.name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => return ChildOutcome::AlreadyGone,
        Err(e) => return ChildOutcome::StillPresent { why: format!("delete refused: {e}") },
    }
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match api.get_opt(&child.name).await {
            Ok(None) => return ChildOutcome::Deleted,
            Ok(Some(_)) if tokio::time::Instant::now() >= deadline => {
                return ChildOutcome::StillPresent { why: format!("still there after {}s", wait.as_secs()) };
            }
            Ok(Some(_)) => {}
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return ChildOutcome::StillPresent { why: format!("cannot verify: {e}") };
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The `reap` subcommand: reap, print the report, write it as the termination message.
pub async fn main(args: ReapArgs) -> Result<(), LifecycleError> {
    let client = vynil_kube::client(vynil_runtime::user_agent!())
        .await
        .map_err(|e| LifecycleError::Unavailable(e.to_string()))?;
    let report = reap(&client, &args).await?;
    let message = report.to_message();
    println!("{message}");
    if let Err(error) = std::fs::write(&args.report_path, &message) {
        tracing::warn!(path = %args.report_path.display(), %error, "cannot write the termination message");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn children_come_in_reverse_phase_order_and_crds_apart() {
        let status = json!({
            "befores": [{"kind": "ConfigMap", "name": "b"}],
            "vitals": [{"kind": "Deployment", "name": "v"}],
            "posts": [{"kind": "Job", "name": "p"}],
            "crds": ["things.example.io"],
        });
        let (children, crds) = recorded_children(&status);
        let names: Vec<&str> = children.iter().map(|(_, c)| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["p", "v", "b"]);
        assert_eq!(crds, ["things.example.io"]);
    }

    #[test]
    fn a_huge_report_fits_the_termination_message_keeping_the_problems() {
        let mut report = ReaperReport::default();
        for i in 0..200 {
            report.children.push(ChildReport {
                phase: "vitals".into(),
                api_version: None,
                kind: "ConfigMap".into(),
                name: format!("a-rather-long-config-map-name-{i}"),
                namespace: Some("apps".into()),
                outcome: ChildOutcome::Deleted,
            });
        }
        report.children.push(ChildReport {
            phase: "vitals".into(),
            api_version: None,
            kind: "Widget".into(),
            name: "w".into(),
            namespace: None,
            outcome: ChildOutcome::StillPresent { why: "still there".into() },
        });
        let message = report.to_message();
        assert!(message.len() <= TERMINATION_MESSAGE_MAX);
        let back: ReaperReport = serde_json::from_str(&message).unwrap();
        assert!(!back.all_allowed_gone() && back.omitted > 0, "{back:?}");
    }
}
