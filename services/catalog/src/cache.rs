//! The package cache: one entry per JukeBox (its packages, pull secret, last
//! scan time, conditions) and a hash of that content.
//!
//! Writes are "upsert if changed": an identical entry costs one read and no
//! write. Every write is announced on Redis pub/sub so every replica refreshes
//! its in-process snapshot, from which all answers are served — so a Redis
//! outage leaves reads working (degraded, not down). Keys carry a schema
//! version so a later layout can live beside this one during an upgrade.

use std::collections::HashMap;

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use vynil_crds::{Condition, JukeBoxConditionType, JukeBoxStatus};
use vynil_rules::Package;

use crate::CatalogError;

const PREFIX: &str = "vynil:v1:catalog";
/// Pub/sub channel of cache changes; payload `<jukebox> <hash>` (empty hash: removed).
pub const CHANGES: &str = "vynil:v1:catalog:changes";

/// One JukeBox's cache entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub jukebox: String,
    pub packages: Vec<Package>,
    pub pull_secret: Option<String>,
    pub last_scan_time: Option<String>,
    pub conditions: Vec<Condition<JukeBoxConditionType>>,
    pub hash: String,
}

impl Entry {
    pub fn from_status(jukebox: &str, pull_secret: Option<String>, status: &JukeBoxStatus) -> Self {
        let last_scan_time = status
            .conditions
            .iter()
            .find(|c| c.condition_type == JukeBoxConditionType::Updated)
            .and_then(|c| c.last_transition_time.clone());
        let content = serde_json::json!([status.packages, pull_secret, status.conditions]);
        let hash = format!("sha256:{}", hex::encode(Sha256::digest(content.to_string().as_bytes())));
        Self {
            jukebox: jukebox.to_string(),
            packages: status.packages.clone(),
            pull_secret,
            last_scan_time,
            conditions: status.conditions.clone(),
            hash,
        }
    }
}

fn redis_error(e: redis::RedisError) -> CatalogError {
    CatalogError::Unavailable(format!("Redis: {e}"))
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
    connection: redis::aio::ConnectionManager,
}

impl std::fmt::Debug for RedisCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisCache")
    }
}

impl RedisCache {
    pub async fn connect(client: &redis::Client) -> Result<Self, CatalogError> {
        let connection = redis::aio::ConnectionManager::new(client.clone()).await.map_err(redis_error)?;
        Ok(Self { connection })
    }

    /// Writes `entry` unless its hash is already stored; true when written.
    pub async fn upsert_if_changed(&self, entry: &Entry) -> Result<bool, CatalogError> {
        let mut c = self.connection.clone();
        let body = serde_json::to_string(entry).map_err(|e| CatalogError::Unavailable(e.to_string()))?;
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

    pub async fn remove(&self, jukebox: &str) -> Result<bool, CatalogError> {
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

    pub async fn get(&self, jukebox: &str) -> Result<Option<Entry>, CatalogError> {
        let mut c = self.connection.clone();
        let text: Option<String> = c.get(format!("{PREFIX}:entry:{jukebox}")).await.map_err(redis_error)?;
        text.map(|t| {
            serde_json::from_str(&t)
                .map_err(|e| CatalogError::Unavailable(format!("cache entry unreadable: {e}")))
        })
        .transpose()
    }

    pub async fn all(&self) -> Result<HashMap<String, Entry>, CatalogError> {
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
}
