//! JukeBoxes from the Kubernetes API: the cluster's [`JukeboxStore`].
//!
//! Reads go to the API server (a status write that lost a race must re-read
//! the truth, not a cache). Status writes go through the `status` subresource
//! with the `resourceVersion` read as precondition: a `409` becomes
//! [`StoreError::Conflict`], so the writer re-reads and re-merges, never
//! overwrites blindly. A kube-runtime watcher announces every JukeBox that
//! changed (spec, annotations or status) or went away, and a relist (start,
//! reconnection after `410 Gone`) as an empty name: re-read everything.

use futures::StreamExt;
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use tokio::sync::broadcast;
use vynil_crds::{JukeBox, JukeBoxStatus};

use crate::{JukeboxRecord, JukeboxStore, StoreError};

/// See the module documentation.
#[derive(Debug)]
pub struct KubeStore {
    api: Api<JukeBox>,
    dynamic: Api<DynamicObject>,
    changes: broadcast::Sender<String>,
    watcher: tokio::task::JoinHandle<()>,
}

impl Drop for KubeStore {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

pub(crate) fn kube_error(doing: &str, e: kube::Error) -> StoreError {
    StoreError::Unavailable(format!("Kubernetes API, {doing}: {e}"))
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == code)
}

fn record(jukebox: JukeBox) -> JukeboxRecord {
    JukeboxRecord {
        name: jukebox.name_any(),
        status_version: jukebox.resource_version().and_then(|rv| rv.parse().ok()).unwrap_or(0),
        annotations: jukebox.metadata.annotations.clone().unwrap_or_default(),
        spec: jukebox.spec,
        status: jukebox.status,
    }
}

impl KubeStore {
    /// Starts following JukeBoxes (cluster-scoped) through `client`.
    pub fn new(client: Client) -> Self {
        let api: Api<JukeBox> = Api::all(client.clone());
        let dynamic = Api::all_with(client, &ApiResource::erase::<JukeBox>(&()));
        let (changes, _) = broadcast::channel(1024);
        let relay = changes.clone();
        let watched = api.clone();
        let watcher = tokio::spawn(async move {
            let mut events = watcher(watched, watcher::Config::default()).default_backoff().boxed();
            while let Some(event) = events.next().await {
                let name = match event {
                    Ok(
                        watcher::Event::Apply(jb)
                        | watcher::Event::Delete(jb)
                        | watcher::Event::InitApply(jb),
                    ) => jb.name_any(),
                    // A (re)list is complete: deletions missed meanwhile are found by a full re-read.
                    Ok(watcher::Event::InitDone) => String::new(),
                    Ok(watcher::Event::Init) => continue,
                    Err(error) => {
                        tracing::warn!(%error, "JukeBox watch interrupted; retrying with backoff");
                        continue;
                    }
                };
                let _ = relay.send(name);
            }
        });
        Self { api, dynamic, changes, watcher }
    }

    /// Removes an annotation if it still has `value` (a JSON patch `test`
    /// guards it: a newer request written meanwhile is kept). Returns whether
    /// it was removed.
    pub async fn remove_annotation(&self, name: &str, key: &str, value: &str) -> Result<bool, StoreError> {
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
        expected: u64,
        status: &JukeBoxStatus,
    ) -> Result<u64, StoreError> {
        let body = json!({
            "apiVersion": "vynil.solidite.fr/v1",
            "kind": "JukeBox",
            "metadata": {"name": name, "resourceVersion": expected.to_string()},
            "status": status,
        });
        let object: DynamicObject =
            serde_json::from_value(body).map_err(|e| StoreError::Config(format!("status body: {e}")))?;
        match self.dynamic.replace_status(name, &PostParams::default(), &object).await {
            Ok(written) => Ok(written.resource_version().and_then(|rv| rv.parse().ok()).unwrap_or(0)),
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => Err(StoreError::Conflict(name.to_string())),
            Err(e) => Err(kube_error("writing a JukeBox status", e)),
        }
    }

    fn subscribe(&self) -> broadcast::Receiver<String> {
        self.changes.subscribe()
    }
}
