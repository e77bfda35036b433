//! The package cache the catalog keeps: one entry per JukeBox (its packages, pull secret, last
//! scan time, conditions) and a hash of that content, behind one trait with
//! two implementations: [`RedisCache`] (shared by replicas) and
//! [`MemoryCache`] (one process, the embedded default of local mode).
//!
//! Writes are "upsert if changed": an identical entry costs one read and no
//! write. In Redis every write is announced on pub/sub so every replica
//! refreshes its in-process snapshot, from which all answers are served — so a
//! Redis outage leaves reads working (degraded, not down). Keys carry a schema
//! version so a later layout can live beside this one during an upgrade.

pub use crate::pubsub::Message;
use std::{collections::HashMap, sync::Mutex};

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use vynil_crds::{Condition, JukeBoxConditionType, JukeBoxStatus};
use vynil_rules::Package;

use crate::{StoreError, redis_error};

const PREFIX: &str = "vynil:v1:catalog";
/// Pub/sub channel of cache changes; payload `<jukebox> <hash>` (empty hash: removed).
pub const CHANGES: &str = "vynil:v1:catalog:changes";

/// One JukeBox's cache entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub jukebox: String,
    pub packages: Vec<Package>,
    pub pull_secret: Option<String>,
    /// The channel (`spec.maturity`) the packages are the view of.
    #[serde(default)]
    pub channel: vynil_rules::Channel,
    /// When the scanner last changed the packages or `Updated` (see `new_status`).
    #[serde(alias = "last_scan_time")]
    pub last_change_time: Option<String>,
    pub conditions: Vec<Condition<JukeBoxConditionType>>,
    /// Where the JukeBox's revisions may come from (`spec.source`): a
    /// recorded revision runs its delete hooks only from there.
    #[serde(default)]
    pub origins: vynil_rules::selection::Origins,
    /// When upgrades of its instances may start (`spec.upgrade_policy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<vynil_crds::UpgradePolicy>,
    /// Revisions recalled for its instances (`spec.recalls`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recalls: Vec<vynil_crds::RecalledRevision>,
    /// Its signature policy's mode (`spec.verify.mode`): the verdicts are in the packages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<vynil_crds::VerifyMode>,
    pub hash: String,
}

/// The [`vynil_rules::selection::Origins`] of a JukeBox's `spec.source`.
pub fn origins_of(source: Option<&vynil_crds::JukeBoxSource>) -> vynil_rules::selection::Origins {
    use vynil_crds::JukeBoxSource;
    use vynil_rules::selection::Origins;
    match source {
        Some(JukeBoxSource::List(entries)) => Origins::Repositories(entries.clone()),
        Some(JukeBoxSource::Harbor(h)) => {
            Origins::Project { registry: h.registry.clone(), project: h.project.clone() }
        }
        Some(JukeBoxSource::Gitlab(g)) => {
            Origins::Project { registry: g.registry.clone(), project: g.project.clone() }
        }
        Some(_) | None => Origins::Scanned,
    }
}

impl Entry {
    /// Its signature policy's mode, as the rules read it.
    pub fn verify_mode(&self) -> Option<vynil_rules::signature::VerifyMode> {
        self.verify.map(vynil_crds::VerifyMode::rules)
    }

    /// The entry of JukeBox `jukebox` whose `spec` and `status` are these.
    pub fn from_status(jukebox: &str, spec: &vynil_crds::JukeBoxSpec, status: &JukeBoxStatus) -> Self {
        let (pull_secret, channel) = (spec.pull_secret.clone(), spec.channel());
        let (origins, upgrade_policy) = (origins_of(spec.source.as_ref()), spec.upgrade_policy.clone());
        let recalls = spec.recalls.clone();
        let verify = spec.verify.as_ref().map(|v| v.mode);
        let last_change_time = status
            .conditions
            .iter()
            .find(|c| c.condition_type == JukeBoxConditionType::Updated)
            .and_then(|c| c.last_transition_time.clone());
        let content = serde_json::json!([
            status.packages,
            pull_secret,
            status.conditions,
            channel,
            origins,
            upgrade_policy,
            recalls,
            verify
        ]);
        let hash = format!("sha256:{}", hex::encode(Sha256::digest(content.to_string().as_bytes())));
        Self {
            jukebox: jukebox.to_string(),
            packages: status.packages.clone(),
            pull_secret,
            channel,
            last_change_time,
            conditions: status.conditions.clone(),
            origins,
            upgrade_policy,
            recalls,
            verify,
            hash,
        }
    }
}

/// Where cache entries live.
#[async_trait::async_trait]
pub trait PackageCache: Send + Sync + std::fmt::Debug {
    /// Writes `entry` unless its hash is already stored; true when written.
    async fn upsert_if_changed(&self, entry: &Entry) -> Result<bool, StoreError>;
    /// Removes an entry; true when there was one.
    async fn remove(&self, jukebox: &str) -> Result<bool, StoreError>;
    async fn get(&self, jukebox: &str) -> Result<Option<Entry>, StoreError>;
    async fn all(&self) -> Result<HashMap<String, Entry>, StoreError>;
    /// Names of entries written by anyone (other replicas included), and
    /// [`Message::Resumed`] when some may have been missed (an outage, a
    /// failover); nothing for a cache no one else writes.
    fn invalidations(&self) -> mpsc::Receiver<Message>;
}

/// The cache `redis` names: Redis when given, else process memory.
pub async fn open(
    redis: Option<&crate::RedisTarget>,
) -> Result<std::sync::Arc<dyn PackageCache>, StoreError> {
    Ok(match redis {
        Some(target) => std::sync::Arc::new(RedisCache::connect(target).await?),
        None => std::sync::Arc::new(MemoryCache::default()),
    })
}

/// The cache of a single process.
#[derive(Debug, Default)]
pub struct MemoryCache {
    entries: Mutex<HashMap<String, Entry>>,
    /// Kept so `invalidations` receivers stay open (and silent).
    silent: Mutex<Vec<mpsc::Sender<Message>>>,
}

#[async_trait::async_trait]
impl PackageCache for MemoryCache {
    async fn upsert_if_changed(&self, entry: &Entry) -> Result<bool, StoreError> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.get(&entry.jukebox).is_some_and(|e| e.hash == entry.hash) {
            return Ok(false);
        }
        entries.insert(entry.jukebox.clone(), entry.clone());
        Ok(true)
    }

    async fn remove(&self, jukebox: &str) -> Result<bool, StoreError> {
        Ok(self.entries.lock().unwrap_or_else(|p| p.into_inner()).remove(jukebox).is_some())
    }

    async fn get(&self, jukebox: &str) -> Result<Option<Entry>, StoreError> {
        Ok(self.entries.lock().unwrap_or_else(|p| p.into_inner()).get(jukebox).cloned())
    }

    async fn all(&self) -> Result<HashMap<String, Entry>, StoreError> {
        Ok(self.entries.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    fn invalidations(&self) -> mpsc::Receiver<Message> {
        let (sender, receiver) = mpsc::channel(1);
        self.silent.lock().unwrap_or_else(|p| p.into_inner()).push(sender);
        receiver
    }
}

const UPSERT_IF_CHANGED: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[3] .. ' ' .. ARGV[1])
return 1";

const REMOVE: &str = r"
local existed = redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SREM', KEYS[3], ARGV[1])
if existed > 0 then redis.call('PUBLISH', ARGV[2], ARGV[1] .. ' ') end
return existed";

/// The shared cache in Redis.
#[derive(Clone)]
pub struct RedisCache {
    connection: crate::RedisConnection,
}

impl std::fmt::Debug for RedisCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisCache")
    }
}

impl RedisCache {
    pub async fn connect(target: &crate::RedisTarget) -> Result<Self, StoreError> {
        Ok(Self { connection: target.connect().await? })
    }
}

#[async_trait::async_trait]
impl PackageCache for RedisCache {
    async fn upsert_if_changed(&self, entry: &Entry) -> Result<bool, StoreError> {
        let mut c = self.connection.clone();
        let body = serde_json::to_string(entry).map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let written: i64 = redis::Script::new(UPSERT_IF_CHANGED)
            .key(format!("{PREFIX}:hash:{}", entry.jukebox))
            .key(format!("{PREFIX}:entry:{}", entry.jukebox))
            .key(format!("{PREFIX}:names"))
            .arg(&entry.hash)
            .arg(body)
            .arg(&entry.jukebox)
            .arg(CHANGES)
            .invoke_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(written == 1)
    }

    async fn remove(&self, jukebox: &str) -> Result<bool, StoreError> {
        let mut c = self.connection.clone();
        let removed: i64 = redis::Script::new(REMOVE)
            .key(format!("{PREFIX}:hash:{jukebox}"))
            .key(format!("{PREFIX}:entry:{jukebox}"))
            .key(format!("{PREFIX}:names"))
            .arg(jukebox)
            .arg(CHANGES)
            .invoke_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(removed > 0)
    }

    async fn get(&self, jukebox: &str) -> Result<Option<Entry>, StoreError> {
        let mut c = self.connection.clone();
        let text: Option<String> = c.get(format!("{PREFIX}:entry:{jukebox}")).await.map_err(redis_error)?;
        text.map(|t| {
            serde_json::from_str(&t)
                .map_err(|e| StoreError::Unavailable(format!("cache entry unreadable: {e}")))
        })
        .transpose()
    }

    async fn all(&self) -> Result<HashMap<String, Entry>, StoreError> {
        let mut c = self.connection.clone();
        let names: Vec<String> = c.smembers(format!("{PREFIX}:names")).await.map_err(redis_error)?;
        let mut entries = HashMap::new();
        for name in names {
            if let Some(entry) = self.get(&name).await? {
                entries.insert(name, entry);
            }
        }
        Ok(entries)
    }

    /// Cache writes announced on pub/sub, resubscribing after an outage.
    fn invalidations(&self) -> mpsc::Receiver<Message> {
        let (sender, receiver) = mpsc::channel(1024);
        let target = self.connection.target().clone();
        tokio::spawn(async move {
            loop {
                if let Ok(mut messages) = crate::pubsub::follow(target.clone(), CHANGES).await {
                    while let Some(message) = messages.recv().await {
                        let message = match message {
                            Message::Payload(payload) => {
                                Message::Payload(payload.split(' ').next().unwrap_or_default().to_string())
                            }
                            Message::Resumed => Message::Resumed,
                        };
                        if sender.send(message).await.is_err() {
                            return;
                        }
                    }
                }
                if sender.is_closed() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        });
        receiver
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jukeboxs_origins_come_from_its_source_and_change_its_hash() {
        use vynil_crds::{JukeBoxSource, jukebox::GitlabSource};
        use vynil_rules::selection::Origins;
        let list = JukeBoxSource::List(vec!["r.example/apps/web".into()]);
        assert_eq!(origins_of(Some(&list)), Origins::Repositories(vec!["r.example/apps/web".into()]));
        let gitlab = JukeBoxSource::Gitlab(GitlabSource {
            url: "https://gitlab.example/api/v4".into(),
            registry: "registry.gitlab.example".into(),
            project: "team/charts".into(),
        });
        let project =
            Origins::Project { registry: "registry.gitlab.example".into(), project: "team/charts".into() };
        assert_eq!(origins_of(Some(&gitlab)), project, "the registry, not the API's host");
        assert_eq!(origins_of(Some(&JukeBoxSource::Script("[]".into()))), Origins::Scanned);
        let status = JukeBoxStatus::default();
        let spec = |source| vynil_crds::JukeBoxSpec {
            source: Some(source),
            maturity: None,
            pull_secret: None,
            schedule: "0 * * * *".into(),
            upgrade_policy: None,
            recalls: Vec::new(),
            verify: None,
        };
        let a = Entry::from_status("box", &spec(list), &status);
        let b = Entry::from_status("box", &spec(gitlab), &status);
        assert_ne!(a.hash, b.hash, "a changed source is a changed entry");
        let mut windowed = spec(JukeBoxSource::Script("[]".into()));
        let plain = Entry::from_status("box", &windowed, &status);
        windowed.upgrade_policy = Some(vynil_crds::UpgradePolicy {
            windows: vec![vynil_crds::MaintenanceWindow {
                schedule: "0 2 * * 6".into(),
                zone: "Europe/Paris".into(),
                duration: "4h".into(),
            }],
            ..Default::default()
        });
        let with_window = Entry::from_status("box", &windowed, &status);
        assert_ne!(
            plain.hash, with_window.hash,
            "a changed upgrade policy is a changed entry (instances reconcile)"
        );
        windowed.recalls = vec![vynil_crds::RecalledRevision {
            tag: "1.0.0".into(),
            reason: "data loss".into(),
            move_away: false,
            by: String::new(),
            at: String::new(),
        }];
        let recalled = Entry::from_status("box", &windowed, &status);
        assert_ne!(recalled.hash, with_window.hash, "a recall is a changed entry (instances reconcile)");
    }

    #[tokio::test]
    async fn the_memory_cache_writes_only_what_changed() -> Result<(), StoreError> {
        let cache = MemoryCache::default();
        let mut spec = vynil_crds::JukeBoxSpec {
            source: None,
            maturity: None,
            pull_secret: None,
            schedule: "0 * * * *".into(),
            upgrade_policy: None,
            recalls: Vec::new(),
            verify: None,
        };
        let empty = Entry::from_status("box", &spec, &JukeBoxStatus::default());
        spec.pull_secret = Some("pull".into());
        let with_secret = Entry::from_status("box", &spec, &JukeBoxStatus::default());
        assert_ne!(empty.hash, with_secret.hash);
        assert!(cache.upsert_if_changed(&empty).await?);
        assert!(!cache.upsert_if_changed(&empty).await?, "identical content writes nothing");
        assert!(cache.upsert_if_changed(&with_secret).await?);
        assert_eq!(cache.get("box").await?.map(|e| e.hash), Some(with_secret.hash));
        assert_eq!(cache.all().await?.len(), 1);
        assert!(cache.remove("box").await?);
        assert!(!cache.remove("box").await?);
        assert!(cache.invalidations().try_recv().is_err(), "nobody else writes a process's cache");
        Ok(())
    }
}
