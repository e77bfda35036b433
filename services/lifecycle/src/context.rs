//! What every reconcile shares ([`Context`]), and what it is made from
//! ([`Settings`]): the controllers, the executor, the observers and the gRPC
//! service all read it, so it lives apart from each of them.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::{
    batch::v1::Job,
    core::v1::{Pod, Secret},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DynamicObject, Patch, PatchParams},
    runtime::events::{Event as KubeEvent, EventType, Recorder},
};
use serde_json::json;
use vynil_registry::RegistryClient;
use vynil_script::ScriptLimits;

use crate::{
    LifecycleError,
    catalog_client::Catalog,
    confirmation::{Confirmation, Confirmations},
    facts::Stores,
    install_plan::{self, Outcome},
    instance::{Instance, InstanceKind},
    job::AgentSettings,
    leader::{Leader, Standing},
    metrics::LifecycleMetrics,
    upgrades::Upgrades,
};

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub jobs: Api<Job>,
    pub(crate) pods: Api<Pod>,
    pub(crate) secrets: Api<Secret>,
    /// Admins' confirmations of deletes without package (control plane's namespace).
    pub confirmations: Confirmations,
    /// Failed upgrades: quarantines and rollbacks (control plane's namespace).
    pub upgrades: Upgrades,
    pub catalog: Catalog,
    pub(crate) scanner: Option<crate::scanner_client::Scanner>,
    pub(crate) registry: RegistryClient,
    pub agent: AgentSettings,
    pub framework: semver::Version,
    pub scripts: ScriptLimits,
    pub max_attempts: u32,
    /// `--rollback-failed-upgrades`.
    pub rollback: bool,
    /// Upstream's re-runs, opted into.
    pub reruns: install_plan::Reruns,
    pub stores: Stores,
    pub metrics: LifecycleMetrics,
    recorders: Recorders,
    /// Only the leader reconciles; every replica serves reads.
    pub leader: Leader,
    /// The idle requeue (`--requeue-seconds`).
    pub(crate) requeue: Duration,
    /// Held across "count the running Jobs, create one": the cap holds.
    pub(crate) job_slots: tokio::sync::Mutex<()>,
    /// The agent Jobs running, at most `--max-running-jobs`, and the
    /// instances waiting for a slot, woken as slots free.
    pub(crate) job_queue: Arc<crate::slots::JobQueue>,
    /// The instances upgrading in waves, whom their peers' moves wake.
    pub(crate) under_waves: crate::fleet::UnderWaves,
    /// The last decision per instance, for `ListInstances`.
    pub(crate) outcomes: Mutex<HashMap<(InstanceKind, String, String), Outcome>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("agent", &self.agent).finish_non_exhaustive()
    }
}

/// What [`Context::new`] needs besides the client and the stores.
#[derive(Debug, Clone)]
pub struct Settings {
    pub namespace: String,
    pub catalog: Catalog,
    /// The scanner, when `--scanner-endpoint` names it (`crate::scanner_client`).
    pub scanner: Option<crate::scanner_client::Scanner>,
    pub registry: RegistryClient,
    pub agent: AgentSettings,
    pub framework: semver::Version,
    /// What a package's `value_script` and `prefly` may do.
    pub scripts: ScriptLimits,
    pub max_attempts: u32,
    pub rollback: bool,
    pub reruns: install_plan::Reruns,
    pub reporter: kube::runtime::events::Reporter,
    pub leader: Leader,
    pub requeue: Duration,
    pub job_queue: Arc<crate::slots::JobQueue>,
    pub(crate) under_waves: crate::fleet::UnderWaves,
}

impl Context {
    /// The registry client with the credentials of the pull secret `name`
    /// (read afresh: a rotated secret counts at once). A Secret that is gone,
    /// unusable, or one no JukeBox may name (`vynil_crds::secrets::admit`) is
    /// an error: never an anonymous pull instead.
    pub(crate) async fn registry_for(
        &self,
        pull_secret: Option<&str>,
    ) -> Result<RegistryClient, LifecycleError> {
        let Some(name) = pull_secret else {
            return Ok(self.registry.clone());
        };
        let secret = self.named_secret(name, "the pull secret").await?;
        let document = secret.data.get(".dockerconfigjson").ok_or_else(|| {
            LifecycleError::Invalid(vynil_crds::coded_message(
                "E_PULL_SECRET",
                &format!("pull secret {name} has no .dockerconfigjson key: it must be a kubernetes.io/dockerconfigjson Secret"),
            ))
        })?;
        let credentials = vynil_registry::CredentialStore::from_dockerconfigjson(document)
            .map_err(|e| LifecycleError::Invalid(format!("pull secret {name}: {e}")))?;
        self.registry.with_credentials(&credentials).map_err(|e| LifecycleError::Invalid(e.to_string()))
    }

    /// Secret `name` of the control plane's namespace as a JukeBox names it
    /// (`what` it is for): admitted, or an error saying why not.
    pub(crate) async fn named_secret(
        &self,
        name: &str,
        what: &str,
    ) -> Result<vynil_crds::secrets::NamedSecret, LifecycleError> {
        let secret = self.found(&self.secrets, name, what).await?;
        vynil_crds::secrets::admit(&secret).map_err(|refused| LifecycleError::Invalid(refused.to_string()))
    }

    /// ConfigMap `name` of the control plane's namespace as a JukeBox names
    /// it (a trusted root): the same opt-in label as a Secret.
    pub(crate) async fn named_config_map(
        &self,
        name: &str,
        what: &str,
    ) -> Result<vynil_crds::secrets::NamedSecret, LifecycleError> {
        let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(self.client.clone(), self.secrets.namespace().unwrap_or_default());
        let found = self.found(&config_maps, name, what).await?;
        vynil_crds::secrets::admit_config_map(&found)
            .map_err(|refused| LifecycleError::Invalid(refused.to_string()))
    }

    /// Object `name` of `api` (the control plane's namespace); absent is an
    /// error saying where it was looked for.
    async fn found<K>(&self, api: &Api<K>, name: &str, what: &str) -> Result<K, LifecycleError>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        api.get_opt(name).await.map_err(LifecycleError::kube(format!("reading {what} {name}")))?.ok_or_else(
            || {
                let namespace = self.secrets.namespace().unwrap_or_default();
                LifecycleError::Invalid(format!(
                    "{what} {name} does not exist in namespace {namespace}: create it there"
                ))
            },
        )
    }

    pub fn new(client: Client, stores: Stores, metrics: LifecycleMetrics, settings: Settings) -> Self {
        Self {
            jobs: Api::namespaced(client.clone(), &settings.namespace),
            pods: Api::namespaced(client.clone(), &settings.namespace),
            secrets: Api::namespaced(client.clone(), &settings.namespace),
            confirmations: Confirmations::new(&client, &settings.namespace),
            upgrades: Upgrades::new(&client, &settings.namespace),
            recorders: Recorders::new(&client, &settings.reporter),
            client,
            catalog: settings.catalog,
            scanner: settings.scanner,
            registry: settings.registry,
            agent: settings.agent,
            framework: settings.framework,
            scripts: settings.scripts,
            max_attempts: settings.max_attempts.max(1),
            rollback: settings.rollback,
            reruns: settings.reruns,
            stores,
            metrics,
            outcomes: Mutex::default(),
            leader: settings.leader,
            requeue: settings.requeue,
            job_slots: tokio::sync::Mutex::new(()),
            job_queue: settings.job_queue,
            under_waves: settings.under_waves,
        }
    }

    pub fn outcome(&self, kind: InstanceKind, namespace: &str, name: &str) -> Option<Outcome> {
        let outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        outcomes.get(&(kind, namespace.to_string(), name.to_string())).cloned()
    }

    pub(crate) fn remember(&self, instance: &Instance, outcome: Outcome) {
        let mut outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        outcomes.insert((instance.kind, instance.namespace.clone(), instance.name.clone()), outcome);
    }

    /// Records the admin's `confirmation` where tenants cannot write
    /// (read back), then sets `delete-without-package: "true"` (read back)
    /// and records who confirmed in an Event.
    pub async fn allow_delete_without_package(
        &self,
        kind: InstanceKind,
        object: &DynamicObject,
        confirmation: &Confirmation,
    ) -> Result<(), LifecycleError> {
        let (caller, reason) = (&confirmation.confirmed_by, &confirmation.reason);
        self.confirmations.record(confirmation).await?;
        let name = object.name_any();
        let api = self.instances(kind, &object.namespace().unwrap_or_default());
        let patch =
            json!({"metadata": {"annotations": {vynil_crds::annotations::DELETE_WITHOUT_PACKAGE: "true"}}});
        let written = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(LifecycleError::kube(format!("annotating {name}")))?;
        if written.annotations().get(vynil_crds::annotations::DELETE_WITHOUT_PACKAGE).map(String::as_str)
            != Some("true")
        {
            return Err(LifecycleError::NotDone(format!("the annotation on {name} cannot be read back")));
        }
        let note = format!(
            "{caller} allowed deleting the recorded children without package hooks{}",
            if reason.is_empty() { String::new() } else { format!(": {reason}") }
        );
        self.audit(&written, kind, true, ("DeleteWithoutPackageAllowed", caller), note).await;
        Ok(())
    }

    /// Refuses a write once this replica is not (or no longer) the leader.
    pub(crate) fn ensure_leader(&self) -> Result<(), LifecycleError> {
        let (why, retry_after) = match self.leader.standing() {
            Standing::Leading => return Ok(()),
            Standing::Renewing { retry } => {
                ("the Lease ran out while its renewal runs: no write until it answers", retry)
            }
            Standing::Following => ("not the leader: no write", Duration::from_secs(5)),
        };
        Err(LifecycleError::Pending { why: why.into(), retry_after })
    }

    pub(crate) fn instances(&self, kind: InstanceKind, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &kind.api_resource())
    }

    /// One entry of the audit trail of what overrides a gate
    /// (`docs/security.md`, "Audit trail"): a structured log line on target
    /// `vynil::audit` naming the actor, and the Event on the instance.
    pub(crate) async fn audit(
        &self,
        object: &DynamicObject,
        kind: InstanceKind,
        warning: bool,
        (reason, actor): (&str, &str),
        note: String,
    ) {
        let (namespace, name) = (object.namespace().unwrap_or_default(), object.name_any());
        tracing::info!(target: "vynil::audit", reason, actor, kind = kind.kind(), namespace, name, note, "audit");
        self.publish(object, kind, warning, reason, note).await;
    }

    pub(crate) async fn publish(
        &self,
        object: &DynamicObject,
        kind: InstanceKind,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let event = KubeEvent {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.into(),
            note: Some(note.chars().take(1023).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let reference = object.object_ref(&kind.api_resource());
        if let Err(error) = self.recorders.of(&reference).publish(&event, &reference).await {
            tracing::warn!(%error, reason, "cannot publish the Event");
        }
    }

    /// A Warning Event regarding JukeBox `jukebox` (cluster-scoped: it lands
    /// where the API server puts such Events, `kubectl describe jukebox` shows it).
    pub(crate) async fn publish_on_jukebox(&self, jukebox: &str, reason: &str, note: String) {
        use kube::Resource;
        let event = KubeEvent {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note.chars().take(1023).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(vynil_crds::JukeBox::api_version(&()).into_owned()),
            kind: Some(vynil_crds::JukeBox::kind(&()).into_owned()),
            name: Some(jukebox.to_string()),
            ..Default::default()
        };
        if let Err(error) = self.recorders.of(&reference).publish(&event, &reference).await {
            tracing::warn!(%error, %jukebox, reason, "cannot publish the Event on the JukeBox");
        }
    }
}

/// kube-runtime's `Recorder::publish` goes over every Event its cache holds
/// (each kept 6 minutes, to count a series) on each publish: one recorder
/// for a fleet made each Event cost every Event of the last minutes (bench
/// P7, 10 000 instances installed at once). The recorders are sharded by
/// object, so an object's Events still go through one cache and still
/// count as a series.
struct Recorders(Vec<Recorder>);

impl Recorders {
    const SHARDS: usize = 64;

    fn new(client: &Client, reporter: &kube::runtime::events::Reporter) -> Self {
        Self((0..Self::SHARDS).map(|_| Recorder::new(client.clone(), reporter.clone())).collect())
    }

    fn of(&self, reference: &k8s_openapi::api::core::v1::ObjectReference) -> &Recorder {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let object = (&reference.kind, &reference.namespace, &reference.name);
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(object);
        &self.0[usize::try_from(hash % Self::SHARDS as u64).unwrap_or_default()]
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ObjectReference;

    use super::*;

    #[tokio::test]
    async fn an_objects_events_go_through_one_recorder_and_a_fleets_through_all() {
        let (service, _handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let client = Client::new(service, "vynil-system");
        let reporter =
            kube::runtime::events::Reporter { controller: "vynil-lifecycle".into(), instance: None };
        let recorders = Recorders::new(&client, &reporter);
        let reference = |i: usize| ObjectReference {
            kind: Some("TenantInstance".into()),
            namespace: Some("apps".into()),
            name: Some(format!("i{i}")),
            ..ObjectReference::default()
        };
        let shard = |r: &ObjectReference| std::ptr::from_ref(recorders.of(r)) as usize;
        for i in 0..100 {
            assert_eq!(shard(&reference(i)), shard(&reference(i)), "a series is counted in one cache");
        }
        let used: std::collections::HashSet<usize> = (0..10_000).map(|i| shard(&reference(i))).collect();
        assert_eq!(used.len(), Recorders::SHARDS, "10 000 instances spread over every shard");
    }
}
