//! JukeBoxes from the Kubernetes API: the cluster's [`JukeboxStore`].
//!
//! Reads go to the API server (a status write that lost a race must re-read
//! the truth, not a cache). Status writes go through the `status` subresource
//! with the `resourceVersion` read as precondition: a `409` becomes
//! [`StoreError::Conflict`], so the writer re-reads and re-merges, never
//! overwrites blindly. A kube-runtime watcher announces every JukeBox that
//! changed (spec, annotations or status) or went away, and a relist (start,
//! reconnection after `410 Gone`) as an empty name: re-read everything.
//! Pull secrets are read from the control plane's namespace (the client's
//! default namespace: the kubeconfig context's, or the pod's in a cluster),
//! afresh at each scan so a rotated secret is used at once. Scan outcomes
//! are published as Events on the JukeBox, as upstream does.

use std::sync::Mutex;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    runtime::{
        WatchStreamExt,
        events::{Event, EventType, Recorder, Reporter},
        watcher,
    },
};
use serde_json::json;
use tokio::sync::broadcast;
use vynil_crds::{JukeBox, JukeBoxStatus};

use crate::{
    JukeboxEvent, JukeboxRecord, JukeboxStore, ScannerStore, StatusVersion, StoreChange, StoreError,
    kube_error,
};

/// See the module documentation.
pub struct KubeStore {
    api: Api<JukeBox>,
    dynamic: Api<DynamicObject>,
    secrets: Api<Secret>,
    config_maps: Api<ConfigMap>,
    namespace: String,
    recorder: Recorder,
    changes: broadcast::Sender<StoreChange>,
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStore").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

impl Drop for KubeStore {
    fn drop(&mut self) {
        if let Some(watcher) = self.watcher.lock().unwrap_or_else(|p| p.into_inner()).take() {
            watcher.abort();
        }
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == code)
}

fn record(jukebox: JukeBox) -> JukeboxRecord {
    let upstream_finalizer_pending = jukebox.metadata.deletion_timestamp.is_some()
        && jukebox.finalizers().iter().any(|f| f == crate::takeover::UPSTREAM_FINALIZER);
    JukeboxRecord {
        upstream_finalizer_pending,
        name: jukebox.name_any(),
        status_version: StatusVersion::new(jukebox.resource_version().unwrap_or_default()),
        annotations: jukebox.metadata.annotations.clone().unwrap_or_default(),
        generation: jukebox.metadata.generation.unwrap_or(0),
        spec: jukebox.spec,
        status: jukebox.status,
    }
}

impl KubeStore {
    /// Starts following JukeBoxes (cluster-scoped) through `client`; pull
    /// secrets are read in the client's default namespace.
    pub fn new(client: Client) -> Self {
        Self::reporting_as(client, "vynil", None)
    }

    /// [`KubeStore::new`], its Events reported by `service` (`vynil-purger`)
    /// from the pod `pod` (`--pod-name`).
    pub fn reporting_as(client: Client, service: &str, pod: Option<String>) -> Self {
        let api: Api<JukeBox> = Api::all(client.clone());
        let dynamic = Api::all_with(client.clone(), &ApiResource::erase::<JukeBox>(&()));
        let namespace = client.default_namespace().to_string();
        let secrets = Api::namespaced(client.clone(), &namespace);
        let config_maps = Api::namespaced(client.clone(), &namespace);
        let reporter = Reporter { controller: service.into(), instance: pod };
        let recorder = Recorder::new(client, reporter);
        let (changes, _) = broadcast::channel(1024);
        Self { api, dynamic, secrets, config_maps, namespace, recorder, changes, watcher: Mutex::default() }
    }

    /// The watcher starts with the first subscriber (a store nobody follows,
    /// the purger's, never watches).
    fn follow(&self) {
        let mut watcher = self.watcher.lock().unwrap_or_else(|p| p.into_inner());
        if watcher.is_some() {
            return;
        }
        let (relay, watched) = (self.changes.clone(), self.api.clone());
        *watcher = Some(tokio::spawn(async move {
            let mut events =
                kube::runtime::watcher(watched, watcher::Config::default()).default_backoff().boxed();
            while let Some(event) = events.next().await {
                // The watch carries each object: every replica following it
                // has the JukeBox without a GET of its own.
                let change = match event {
                    Ok(watcher::Event::Apply(jb)) => StoreChange::Applied(Box::new(record(jb))),
                    Ok(watcher::Event::Delete(jb)) => StoreChange::Deleted(jb.name_any()),
                    // A (re)list is complete: one full re-read covers every object
                    // it listed and the deletions missed meanwhile.
                    Ok(watcher::Event::InitDone) => StoreChange::Resync,
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
                    Err(error) => {
                        tracing::warn!(%error, "JukeBox watch interrupted; retrying with backoff");
                        continue;
                    }
                };
                let _ = relay.send(change);
            }
        }));
    }
}

#[async_trait::async_trait]
impl JukeboxStore for KubeStore {
    async fn list(&self) -> Result<Vec<JukeboxRecord>, StoreError> {
        let list =
            self.api.list(&ListParams::default()).await.map_err(|e| kube_error("listing JukeBoxes", e))?;
        let mut records: Vec<JukeboxRecord> = list.items.into_iter().map(record).collect();
        records.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(records)
    }

    async fn get(&self, name: &str) -> Result<Option<JukeboxRecord>, StoreError> {
        let found = self.api.get_opt(name).await.map_err(|e| kube_error("reading a JukeBox", e))?;
        Ok(found.map(record))
    }

    /// `PUT …/status` with `resourceVersion` = `expected`; a JukeBox deleted
    /// meanwhile is a conflict too (the re-read finds it gone).
    async fn write_status(
        &self,
        name: &str,
        expected: &StatusVersion,
        status: &JukeBoxStatus,
    ) -> Result<StatusVersion, StoreError> {
        let body = json!({
            "apiVersion": "vynil.solidite.fr/v1",
            "kind": "JukeBox",
            "metadata": {"name": name, "resourceVersion": expected.as_str()},
            "status": status,
        });
        let object: DynamicObject =
            serde_json::from_value(body).map_err(|e| StoreError::Config(format!("status body: {e}")))?;
        match self.dynamic.replace_status(name, &PostParams::default(), &object).await {
            Ok(written) => Ok(StatusVersion::new(written.resource_version().unwrap_or_default())),
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => Err(StoreError::Conflict(name.to_string())),
            Err(e) => Err(kube_error("writing a JukeBox status", e)),
        }
    }

    fn subscribe(&self) -> broadcast::Receiver<StoreChange> {
        let receiver = self.changes.subscribe();
        self.follow();
        receiver
    }

    async fn record_event(&self, name: &str, event: &JukeboxEvent) {
        let reference = match self.api.get_opt(name).await {
            Ok(Some(jukebox)) => jukebox.object_ref(&()),
            _ => ObjectReference {
                api_version: Some(JukeBox::api_version(&()).into_owned()),
                kind: Some(JukeBox::kind(&()).into_owned()),
                name: Some(name.to_string()),
                ..Default::default()
            },
        };
        let note: String = event.note.chars().take(1023).collect();
        let published = Event {
            type_: if event.warning { EventType::Warning } else { EventType::Normal },
            reason: event.reason.into(),
            note: Some(note),
            action: event.action.into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&published, &reference).await {
            tracing::warn!(jukebox = %name, %error, reason = event.reason, "cannot publish the Event");
        }
    }
}

impl KubeStore {
    async fn found_secret(&self, name: &str) -> Result<k8s_openapi::api::core::v1::Secret, StoreError> {
        let namespace = &self.namespace;
        let found = self.secrets.get_opt(name).await.map_err(|e| kube_error("reading a secret", e))?;
        found.ok_or_else(|| {
            StoreError::Config(format!(
                "secret {name:?} does not exist in namespace {namespace:?}: create it there"
            ))
        })
    }
}

#[async_trait::async_trait]
impl ScannerStore for KubeStore {
    /// Removes an annotation if it still has `value` (a JSON patch `test`
    /// guards it: a newer request written meanwhile is kept). Returns whether
    /// it was removed.
    async fn remove_annotation(&self, name: &str, key: &str, value: &str) -> Result<bool, StoreError> {
        let pointer = format!("/metadata/annotations/{}", key.replace('~', "~0").replace('/', "~1"));
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": pointer, "value": value},
            {"op": "remove", "path": pointer},
        ]))
        .map_err(|e| StoreError::Config(format!("annotation patch: {e}")))?;
        match self.api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch)).await {
            Ok(_) => Ok(true),
            // The test failed (the value changed or is gone) or the JukeBox is gone.
            Err(e) if is_status(&e, 422) || is_status(&e, 404) => Ok(false),
            Err(e) => Err(kube_error("removing an annotation", e)),
        }
    }

    async fn set_recalls(
        &self,
        name: &str,
        expected: &StatusVersion,
        recalls: &[vynil_crds::RecalledRevision],
    ) -> Result<bool, StoreError> {
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": expected.as_str()},
            {"op": "add", "path": "/spec/recalls", "value": recalls},
        ]))
        .map_err(|e| StoreError::Config(format!("recalls patch: {e}")))?;
        match self.api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch)).await {
            Ok(_) => Ok(true),
            // Changed since it was read (the test failed, or a conflict).
            Err(e) if is_status(&e, 422) || is_status(&e, 409) => Ok(false),
            Err(e) => Err(kube_error("writing a JukeBox's recalls", e)),
        }
    }

    async fn retire_upstream(&self, name: &str) -> Result<crate::takeover::Retired, StoreError> {
        let cronjobs = Api::namespaced(self.api.clone().into_client(), &self.namespace);
        let jobs = Api::namespaced(self.api.clone().into_client(), &self.namespace);
        crate::takeover::retire(&self.api, &cronjobs, &jobs, name).await
    }

    async fn secret(&self, name: &str) -> Result<vynil_crds::secrets::NamedSecret, StoreError> {
        Ok(vynil_crds::secrets::admit(&self.found_secret(name).await?)?)
    }

    async fn config_map(&self, name: &str) -> Result<vynil_crds::secrets::NamedSecret, StoreError> {
        let namespace = &self.namespace;
        let found = self.config_maps.get_opt(name).await.map_err(|e| kube_error("reading a configmap", e))?;
        let found = found.ok_or_else(|| {
            StoreError::Config(format!(
                "configmap {name:?} does not exist in namespace {namespace:?}: create it there"
            ))
        })?;
        Ok(vynil_crds::secrets::admit_config_map(&found)?)
    }

    async fn requested_secret(&self, name: &str) -> Result<crate::jukeboxes::SecretData, StoreError> {
        let found = self.found_secret(name).await?;
        crate::jukeboxes::opted_in(name, found.metadata.labels.as_ref().unwrap_or(&Default::default()))?;
        Ok(found.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect())
    }

    async fn pull_secret(&self, secret: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let namespace = &self.namespace;
        let found = self.secrets.get_opt(secret).await.map_err(|e| kube_error("reading a pull secret", e))?;
        let Some(found) = found else {
            return Err(StoreError::Config(format!(
                "pull secret {secret:?} does not exist in namespace {namespace:?}: create a \
                 kubernetes.io/dockerconfigjson Secret there"
            )));
        };
        let admitted = vynil_crds::secrets::admit(&found)?;
        match admitted.data.get(".dockerconfigjson") {
            Some(bytes) => Ok(Some(bytes.clone())),
            None => Err(StoreError::Config(format!(
                "pull secret {secret:?} in namespace {namespace:?} has no .dockerconfigjson key (type {}): \
                 it must be a kubernetes.io/dockerconfigjson Secret",
                found.type_.as_deref().unwrap_or("unset")
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_of_the_service_itself_says_which_grant_to_fix() {
        let status = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("jukeboxes \"box\" is forbidden", "Forbidden")
                    .with_code(code)
                    .boxed(),
            )
        };
        let forbidden = kube_error("reading a JukeBox", status(403)).to_string();
        assert!(forbidden.contains("lacks the grant") && forbidden.contains("rbac.yaml"), "{forbidden}");
        let other = kube_error("reading a JukeBox", status(500)).to_string();
        assert!(!other.contains("grant"), "{other}");
    }
}
