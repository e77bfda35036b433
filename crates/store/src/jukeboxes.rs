//! Where JukeBoxes come from and where their status goes.
//!
//! [`JukeboxStore`] is what the scanner needs: read specs, write a status with
//! compare-and-set (a writer that lost a race re-reads and re-merges, never
//! overwrites), and announce changes so the catalog follows status, not scans.
//! Here: the **local** store — specs from a directory of JukeBox YAML files,
//! read afresh at each use so an edited file is seen at the next scan, and
//! status in memory or in Redis (shared by replicas, announced on pub/sub).
//! The Kubernetes store is in `kube.rs`.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use redis::AsyncCommands;
use tokio::sync::broadcast;
use vynil_crds::{JukeBox, JukeBoxSpec, JukeBoxStatus};

use crate::{StoreError, redis_error};

type Annotations = std::collections::BTreeMap<String, String>;
/// A JukeBox file as read: its name, spec and annotations.
type Spec = (String, JukeBoxSpec, Annotations);

/// What local mode's JukeBox directory holds: the JukeBoxes, the files that
/// are none of its kinds, the Secrets and ConfigMaps they may name.
struct Directory {
    specs: Vec<Spec>,
    skipped: Vec<SkippedSource>,
    secrets: Vec<Secret>,
    config_maps: Vec<ConfigMap>,
}

/// `value` read as a `K` (a Secret, a ConfigMap) into `into`, or why it is not one.
fn parse_into<K: serde::de::DeserializeOwned>(
    value: &serde_json::Value,
    into: &mut Vec<K>,
    kind: &str,
) -> Result<(), String> {
    let object = serde_json::from_value::<K>(value.clone()).map_err(|e| format!("not a {kind}: {e}"))?;
    into.push(object);
    Ok(())
}

/// A Secret's `data`, decoded.
pub type SecretData = std::collections::BTreeMap<String, Vec<u8>>;

/// Redis pub/sub channel announcing a JukeBox status change (payload: name).
pub const CHANGES_CHANNEL: &str = "vynil:v1:jukebox-status-changes";
const STATUS_PREFIX: &str = "vynil:v1:jukebox-status";

/// The version a status write must find to succeed: opaque (Kubernetes
/// defines `resourceVersion` as such; the local store's counter is kept in it
/// as text). Compared for equality only, never parsed by callers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct StatusVersion(String);

impl StatusVersion {
    pub fn new(version: impl Into<String>) -> Self {
        Self(version.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The local store's counter.
    fn local(&self) -> u64 {
        self.0.parse().unwrap_or(0)
    }
}

impl std::fmt::Display for StatusVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a store's change feed says ([`JukeboxStore::subscribe`]).
#[derive(Debug, Clone, PartialEq)]
pub enum StoreChange {
    /// Notifications may have been lost (a watch relisted, Redis came back
    /// after an outage): re-read everything.
    Resync,
    /// This JukeBox changed; read it (a feed of names: Redis pub/sub).
    Named(String),
    /// This JukeBox changed, as the change carried it (a watch event holds
    /// the object): a replica needs no read of its own.
    Applied(Box<JukeboxRecord>),
    /// This JukeBox is gone.
    Deleted(String),
}

impl StoreChange {
    /// The JukeBox concerned; `None` for [`StoreChange::Resync`].
    pub fn name(&self) -> Option<&str> {
        match self {
            StoreChange::Resync => None,
            StoreChange::Named(name) | StoreChange::Deleted(name) => Some(name),
            StoreChange::Applied(record) => Some(&record.name),
        }
    }
}

/// A JukeBox and the version of its status (for compare-and-set).
#[derive(Debug, Clone, PartialEq)]
pub struct JukeboxRecord {
    pub name: String,
    pub spec: JukeBoxSpec,
    pub status: Option<JukeBoxStatus>,
    pub status_version: StatusVersion,
    /// `metadata.annotations` (the force-scan request lives there).
    pub annotations: std::collections::BTreeMap<String, String>,
    /// `metadata.generation`, which conditions carry (0 outside a cluster).
    pub generation: i64,
    /// Being deleted, and upstream's finalizer is still on it (`crate::takeover`).
    pub upstream_finalizer_pending: bool,
}

/// A JukeBox source the store could not read, and why: answers that say "no
/// JukeBox x" name these too, so a typo in a file is not a mystery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedSource {
    /// The file (or object) skipped.
    pub source: String,
    pub problem: String,
}

impl std::fmt::Display for SkippedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} was skipped: {}", self.source, self.problem)
    }
}

/// Something that happened to a JukeBox, as a Kubernetes Event on it: a
/// scan's outcome (upstream's `ScanSucceed` / `ScanFailed`, action `Scan`),
/// an executed purge of its repositories (`PurgeExecuted` / `PurgeFailed`,
/// action `Purge`: the audit record outlives a Redis without persistence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JukeboxEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

impl JukeboxEvent {
    pub fn scan(succeeded: bool, note: String) -> Self {
        let reason = if succeeded { "ScanSucceed" } else { "ScanFailed" };
        Self { warning: !succeeded, reason, action: "Scan", note }
    }

    pub fn purge(failures: bool, note: String) -> Self {
        let reason = if failures { "PurgeFailed" } else { "PurgeExecuted" };
        Self { warning: failures, reason, action: "Purge", note }
    }
}

#[async_trait::async_trait]
pub trait JukeboxStore: Send + Sync + std::fmt::Debug {
    async fn list(&self) -> Result<Vec<JukeboxRecord>, StoreError>;
    async fn get(&self, name: &str) -> Result<Option<JukeboxRecord>, StoreError>;
    /// Writes `status` if the stored version is still `expected`; returns
    /// `StoreError::Conflict` otherwise.
    async fn write_status(
        &self,
        name: &str,
        expected: &StatusVersion,
        status: &JukeBoxStatus,
    ) -> Result<StatusVersion, StoreError>;
    /// The JukeBoxes that changed, as the store learns of them.
    fn subscribe(&self) -> broadcast::Receiver<StoreChange>;
    /// Records an event where users look for it (nowhere outside a cluster).
    async fn record_event(&self, _name: &str, _event: &JukeboxEvent) {}
    /// Sources that could not be read as JukeBoxes (bad YAML files).
    async fn skipped(&self) -> Vec<SkippedSource> {
        Vec::new()
    }
}

/// The label a Secret needs before an RPC request may name it (`ExportIndex`'s
/// credentials): `vynil.solidite.fr/rpc-credentials: "true"`.
pub const RPC_CREDENTIALS_LABEL: &str = "vynil.solidite.fr/rpc-credentials";

/// Refuses Secret `name` unless its `labels` opt in to RPC requests.
pub fn opted_in(name: &str, labels: &std::collections::BTreeMap<String, String>) -> Result<(), StoreError> {
    if labels.get(RPC_CREDENTIALS_LABEL).is_some_and(|v| v == "true") {
        return Ok(());
    }
    Err(StoreError::Config(format!(
        "secret {name:?} may not be named in a request: label it {RPC_CREDENTIALS_LABEL}=\"true\" if it holds credentials meant for exports"
    )))
}

/// What only the scanner does with JukeBoxes besides reading them and
/// writing their status: serve the force-scan annotation, read pull secrets.
#[async_trait::async_trait]
pub trait ScannerStore: JukeboxStore {
    /// Removes annotation `key` if it still has `value`; `false` when it
    /// changed, is gone, or the store cannot remove annotations (files are the
    /// user's: the local store never edits them).
    async fn remove_annotation(&self, name: &str, key: &str, value: &str) -> Result<bool, StoreError>;
    /// The `.dockerconfigjson` of a pull secret, or `None` where pull secrets
    /// are not read (outside a cluster: `--dockerconfig` applies).
    async fn pull_secret(&self, secret: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Secret `name` as a JukeBox's spec names it (an index source's
    /// credentials, trusted keys): admitted by `vynil_crds::secrets::admit`
    /// (the opt-in label, never the control plane's own); an absent Secret
    /// is a configuration error naming where it was looked for.
    async fn secret(&self, name: &str) -> Result<vynil_crds::secrets::NamedSecret, StoreError>;
    /// ConfigMap `name` as a JukeBox's spec names it (a trusted root):
    /// admitted by `vynil_crds::secrets::admit_config_map`, the same opt-in
    /// label as a Secret.
    async fn config_map(&self, name: &str) -> Result<vynil_crds::secrets::NamedSecret, StoreError>;
    /// The data of Secret `name` when a **request** names it (`ExportIndex`):
    /// only a Secret carrying [`RPC_CREDENTIALS_LABEL`]` = "true"` is read, so
    /// a caller cannot have any Secret of the control plane's namespace (the
    /// service token's among them) sent where it says. A Secret a JukeBox's
    /// spec names is read with [`ScannerStore::secret`].
    async fn requested_secret(&self, name: &str) -> Result<SecretData, StoreError>;
    /// Replaces JukeBox `name`'s `spec.recalls` if the object is still at
    /// `expected` (its version when read): `false` when it changed since
    /// (read it again and retry). JukeBoxes read from files are the user's:
    /// the local store refuses, saying where to write the recall.
    async fn set_recalls(
        &self,
        name: &str,
        expected: &StatusVersion,
        recalls: &[vynil_crds::RecalledRevision],
    ) -> Result<bool, StoreError> {
        let _ = (expected, recalls);
        Err(StoreError::Config(format!(
            "JukeBox {name} is read from a file, which vynil never edits: add the recall to its spec.recalls there"
        )))
    }
    /// Takes JukeBox `name` over from upstream's operator (`crate::takeover`);
    /// nothing to do outside a cluster.
    async fn retire_upstream(&self, _name: &str) -> Result<crate::takeover::Retired, StoreError> {
        Ok(crate::takeover::Retired::default())
    }
}

/// Status with its version.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Versioned {
    version: u64,
    status: JukeBoxStatus,
}

#[async_trait::async_trait]
trait StatusBackend: Send + Sync + std::fmt::Debug {
    async fn get(&self, name: &str) -> Result<Option<Versioned>, StoreError>;
    async fn compare_and_set(
        &self,
        name: &str,
        expected: u64,
        status: &JukeBoxStatus,
    ) -> Result<u64, StoreError>;
}

#[derive(Debug, Default)]
struct MemoryBackend {
    statuses: Mutex<HashMap<String, Versioned>>,
}

#[async_trait::async_trait]
impl StatusBackend for MemoryBackend {
    async fn get(&self, name: &str) -> Result<Option<Versioned>, StoreError> {
        Ok(self.statuses.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned())
    }

    async fn compare_and_set(
        &self,
        name: &str,
        expected: u64,
        status: &JukeBoxStatus,
    ) -> Result<u64, StoreError> {
        let mut statuses = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
        let current = statuses.get(name).map_or(0, |v| v.version);
        if current != expected {
            return Err(StoreError::Conflict(name.to_string()));
        }
        statuses.insert(name.to_string(), Versioned { version: current + 1, status: status.clone() });
        Ok(current + 1)
    }
}

struct RedisBackend {
    connection: crate::RedisConnection,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisBackend")
    }
}

const COMPARE_AND_SET: &str = r#"
local current = redis.call('GET', KEYS[1])
local version = 0
if current then version = cjson.decode(current)['version'] end
if version ~= tonumber(ARGV[1]) then return -1 end
local next = version + 1
redis.call('SET', KEYS[1], '{"version":' .. next .. ',"status":' .. ARGV[2] .. '}')
redis.call('PUBLISH', ARGV[3], ARGV[4])
return next"#;

#[async_trait::async_trait]
impl StatusBackend for RedisBackend {
    async fn get(&self, name: &str) -> Result<Option<Versioned>, StoreError> {
        let mut c = self.connection.clone();
        let text: Option<String> = c.get(format!("{STATUS_PREFIX}:{name}")).await.map_err(redis_error)?;
        text.map(|t| {
            serde_json::from_str(&t)
                .map_err(|e| StoreError::Unavailable(format!("stored status of {name} is unreadable: {e}")))
        })
        .transpose()
    }

    async fn compare_and_set(
        &self,
        name: &str,
        expected: u64,
        status: &JukeBoxStatus,
    ) -> Result<u64, StoreError> {
        let mut c = self.connection.clone();
        let body = serde_json::to_string(status).map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let next: i64 = redis::Script::new(COMPARE_AND_SET)
            .key(format!("{STATUS_PREFIX}:{name}"))
            .arg(expected)
            .arg(body)
            .arg(CHANGES_CHANNEL)
            .arg(name)
            .invoke_async(&mut c)
            .await
            .map_err(redis_error)?;
        u64::try_from(next).map_err(|_| StoreError::Conflict(name.to_string()))
    }
}

/// JukeBox specs from `*.yaml` files in a directory; status in a backend.
#[derive(Debug)]
pub struct LocalStore {
    directory: PathBuf,
    backend: Arc<dyn StatusBackend>,
    changes: broadcast::Sender<StoreChange>,
    /// In memory, writes are announced here; with Redis, by the pub/sub relay.
    announce_writes: bool,
}

impl LocalStore {
    /// Status in process memory.
    pub fn in_memory(directory: PathBuf) -> Self {
        let (changes, _) = broadcast::channel(1024);
        Self { directory, backend: Arc::new(MemoryBackend::default()), changes, announce_writes: true }
    }

    /// Status in Redis; changes from every replica are relayed to subscribers.
    pub async fn with_redis(directory: PathBuf, target: &crate::RedisTarget) -> Result<Self, StoreError> {
        let connection = target.connect().await?;
        let (changes, _) = broadcast::channel(1024);
        let relay = changes.clone();
        let mut messages = crate::pubsub::follow(target.clone(), CHANGES_CHANNEL).await?;
        tokio::spawn(async move {
            while let Some(message) = messages.recv().await {
                // After an outage, changes made meanwhile are repaired by
                // the subscribers' resyncs.
                let change = match message {
                    crate::pubsub::Message::Payload(name) => StoreChange::Named(name),
                    crate::pubsub::Message::Resumed => StoreChange::Resync,
                };
                let _ = relay.send(change);
            }
        });
        Ok(Self {
            directory,
            backend: Arc::new(RedisBackend { connection }),
            changes,
            announce_writes: false,
        })
    }

    fn local_secret(&self, name: &str) -> Result<Secret, StoreError> {
        let secrets = self.read_directory()?.secrets;
        secrets.into_iter().find(|s| s.metadata.name.as_deref() == Some(name)).ok_or_else(|| {
            StoreError::Config(format!(
                "secret {name:?} is not in {}: add a Secret manifest (kind: Secret, metadata.name: {name}) there",
                self.directory.display()
            ))
        })
    }

    fn local_config_map(&self, name: &str) -> Result<ConfigMap, StoreError> {
        let found = self.read_directory()?.config_maps;
        found.into_iter().find(|c| c.metadata.name.as_deref() == Some(name)).ok_or_else(|| {
            StoreError::Config(format!(
                "configmap {name:?} is not in {}: add a ConfigMap manifest (kind: ConfigMap, metadata.name: \
                 {name}) there",
                self.directory.display()
            ))
        })
    }

    fn read_specs(&self) -> Result<Vec<Spec>, StoreError> {
        Ok(self.read_directory()?.specs)
    }

    /// What the directory holds.
    fn read_directory(&self) -> Result<Directory, StoreError> {
        let entries = std::fs::read_dir(&self.directory).map_err(|e| {
            StoreError::Config(format!("cannot read the JukeBox directory {}: {e}", self.directory.display()))
        })?;
        let (mut specs, mut skipped, mut secrets, mut config_maps) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for entry in entries.flatten() {
            let path = entry.path();
            let is_yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
            if !is_yaml {
                continue;
            }
            let skip = |problem: String| SkippedSource { source: path.display().to_string(), problem };
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(e) => {
                    skipped.push(skip(format!("unreadable: {e}")));
                    continue;
                }
            };
            // Through a JSON value: YAML enum tags would otherwise be required
            // for `source`, whose upstream form is a single-key map.
            let value = serde_yaml_ng::from_str::<serde_json::Value>(&text);
            let kind = value.as_ref().ok().and_then(|v| v.get("kind")).and_then(|k| k.as_str());
            let object = match (kind, &value) {
                (Some("Secret"), Ok(value)) => Some(parse_into(value, &mut secrets, "Secret")),
                (Some("ConfigMap"), Ok(value)) => Some(parse_into(value, &mut config_maps, "ConfigMap")),
                _ => None,
            };
            if let Some(parsed) = object {
                if let Err(problem) = parsed {
                    skipped.push(skip(problem));
                }
                continue;
            }
            let parsed = value
                .map_err(|e| e.to_string())
                .and_then(|value| serde_json::from_value::<JukeBox>(value).map_err(|e| e.to_string()));
            match parsed {
                Ok(jukebox) => match jukebox.metadata.name {
                    Some(name) => {
                        specs.push((name, jukebox.spec, jukebox.metadata.annotations.unwrap_or_default()))
                    }
                    None => skipped.push(skip("a JukeBox without metadata.name".into())),
                },
                Err(e) => skipped
                    .push(skip(format!("not a JukeBox: {e}; fix the file, it is read again at each use"))),
            }
        }
        for skip in &skipped {
            tracing::warn!(source = %skip.source, problem = %skip.problem, "JukeBox file skipped");
        }
        specs.sort_by(|a, b| a.0.cmp(&b.0));
        skipped.sort_by(|a, b| a.source.cmp(&b.source));
        Ok(Directory { specs, skipped, secrets, config_maps })
    }

    async fn record(
        &self,
        (name, spec, annotations): (String, JukeBoxSpec, Annotations),
    ) -> Result<JukeboxRecord, StoreError> {
        let stored = self.backend.get(&name).await?;
        Ok(JukeboxRecord {
            status_version: StatusVersion::new(stored.as_ref().map_or(0, |s| s.version).to_string()),
            status: stored.map(|s| s.status),
            name,
            spec,
            annotations,
            generation: 0,
            upstream_finalizer_pending: false,
        })
    }
}

#[async_trait::async_trait]
impl JukeboxStore for LocalStore {
    async fn list(&self) -> Result<Vec<JukeboxRecord>, StoreError> {
        let mut records = Vec::new();
        for spec in self.read_specs()? {
            records.push(self.record(spec).await?);
        }
        Ok(records)
    }

    async fn get(&self, name: &str) -> Result<Option<JukeboxRecord>, StoreError> {
        let Some(spec) = self.read_specs()?.into_iter().find(|(n, _, _)| n == name) else {
            return Ok(None);
        };
        Ok(Some(self.record(spec).await?))
    }

    async fn write_status(
        &self,
        name: &str,
        expected: &StatusVersion,
        status: &JukeBoxStatus,
    ) -> Result<StatusVersion, StoreError> {
        let version = self.backend.compare_and_set(name, expected.local(), status).await?;
        if self.announce_writes {
            let _ = self.changes.send(StoreChange::Named(name.to_string()));
        }
        Ok(StatusVersion::new(version.to_string()))
    }

    fn subscribe(&self) -> broadcast::Receiver<StoreChange> {
        self.changes.subscribe()
    }

    async fn skipped(&self) -> Vec<SkippedSource> {
        self.read_directory().map(|d| d.skipped).unwrap_or_default()
    }
}

#[async_trait::async_trait]
impl ScannerStore for LocalStore {
    async fn remove_annotation(&self, _name: &str, _key: &str, _value: &str) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn pull_secret(&self, _secret: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }

    /// Outside a cluster, Secrets are `kind: Secret` manifests in the JukeBox
    /// directory (`data` base64, or `stringData`), as `kubectl` would apply them.
    /// The same rule as in a cluster: the files are the operator's, but a
    /// JukeBox file and a Secret file may come from different hands.
    async fn secret(&self, name: &str) -> Result<vynil_crds::secrets::NamedSecret, StoreError> {
        Ok(vynil_crds::secrets::admit(&self.local_secret(name)?)?)
    }

    async fn config_map(&self, name: &str) -> Result<vynil_crds::secrets::NamedSecret, StoreError> {
        Ok(vynil_crds::secrets::admit_config_map(&self.local_config_map(name)?)?)
    }

    async fn requested_secret(&self, name: &str) -> Result<SecretData, StoreError> {
        let secret = self.local_secret(name)?;
        opted_in(name, secret.metadata.labels.as_ref().unwrap_or(&Default::default()))?;
        let mut data: SecretData =
            secret.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
        for (key, text) in secret.string_data.unwrap_or_default() {
            data.insert(key, text.into_bytes());
        }
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jukebox_files_are_read_from_the_directory_and_bad_ones_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("box.yaml"),
            "apiVersion: vynil.solidite.fr/v1\nkind: JukeBox\nmetadata:\n  name: box\nspec:\n  schedule: '0 * * * *'\n  source:\n    list:\n      - 127.0.0.1:5000/db/pg\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("broken.yaml"), "kind: [").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not yaml").unwrap();
        let store = LocalStore::in_memory(dir.path().to_path_buf());
        let names: Vec<String> = store.list().await.unwrap().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["box"]);
    }

    #[tokio::test]
    async fn a_status_write_with_a_stale_version_is_a_conflict() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::in_memory(dir.path().to_path_buf());
        let mut changes = store.subscribe();
        let status = JukeBoxStatus::default();
        let first = StatusVersion::default();
        assert_eq!(store.write_status("box", &first, &status).await.unwrap(), StatusVersion::new("1"));
        assert!(matches!(store.write_status("box", &first, &status).await, Err(StoreError::Conflict(_))));
        assert_eq!(changes.recv().await.unwrap(), StoreChange::Named("box".into()));
    }
}
