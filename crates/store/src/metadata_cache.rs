//! Manifest metadata cached by digest in Redis, shared by scanner replicas:
//! a digest is immutable, so one read serves every replica forever.

use redis::AsyncCommands;
use vynil_registry::{ManifestMetadata, MetadataCache};
use vynil_rules::signature::Evidence;

const PREFIX: &str = "vynil:v1:manifest-metadata";
const TAG_PREFIX: &str = "vynil:v1:tag-digest";
const EVIDENCE_PREFIX: &str = "vynil:v1:signature-evidence";
const TTL_SECONDS: u64 = 90 * 24 * 3600;

#[derive(Clone)]
pub struct RedisMetadataCache {
    connection: crate::RedisConnection,
}

impl std::fmt::Debug for RedisMetadataCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisMetadataCache")
    }
}

impl RedisMetadataCache {
    pub async fn connect(target: &crate::RedisTarget) -> Result<Self, crate::StoreError> {
        Ok(Self { connection: target.connect().await? })
    }
}

impl RedisMetadataCache {
    /// The JSON value at `key`; any failure (an outage, a value that does not decode) is a miss.
    async fn get_json<T: serde::de::DeserializeOwned>(&self, key: String) -> Option<T> {
        let mut c = self.connection.clone();
        let text: Option<String> = c.get(key).await.ok()?;
        serde_json::from_str(&text?).ok()
    }

    /// Stores `value` at `key` for the cache's lifetime; a failure is logged (the next read misses).
    async fn put_json<T: serde::Serialize>(&self, key: String, value: &T, what: &str) {
        let mut c = self.connection.clone();
        if let Ok(body) = serde_json::to_string(value) {
            let result: Result<(), _> = c.set_ex(key, body, TTL_SECONDS).await;
            if let Err(error) = result {
                tracing::warn!(%error, "cannot cache {what}");
            }
        }
    }
}

#[async_trait::async_trait]
impl MetadataCache for RedisMetadataCache {
    async fn get(&self, digest: &str) -> Option<ManifestMetadata> {
        // A Redis outage is a cache miss: the manifest is read from the registry.
        self.get_json(format!("{PREFIX}:{digest}")).await
    }

    async fn put(&self, digest: &str, metadata: &ManifestMetadata) {
        self.put_json(format!("{PREFIX}:{digest}"), metadata, "manifest metadata").await
    }

    async fn tag_digest(&self, reference: &str) -> Option<String> {
        let mut c = self.connection.clone();
        // An outage reads as "never seen": one GET instead of a HEAD.
        c.get(format!("{TAG_PREFIX}:{reference}")).await.ok()?
    }

    async fn put_tag_digest(&self, reference: &str, digest: &str) {
        let mut c = self.connection.clone();
        let result: Result<(), _> = c.set_ex(format!("{TAG_PREFIX}:{reference}"), digest, TTL_SECONDS).await;
        if let Err(error) = result {
            tracing::warn!(%error, "cannot remember a tag's digest");
        }
    }

    async fn evidence(&self, digest: &str) -> Option<Evidence> {
        // An outage is a miss: the signature is read from the registry.
        self.get_json(format!("{EVIDENCE_PREFIX}:{digest}")).await
    }

    async fn put_evidence(&self, digest: &str, evidence: &Evidence) {
        self.put_json(format!("{EVIDENCE_PREFIX}:{digest}"), evidence, "a signature's evidence").await
    }
}

const INDEX_PREFIX: &str = "vynil:v1:index-file";
const INDEX_TTL_SECONDS: u64 = 7 * 24 * 3600;

/// Index files' last bytes and `ETag`s, on the same connection: shared by
/// scanner replicas, so a replica that never read a file still asks
/// `If-None-Match`.
#[async_trait::async_trait]
impl vynil_index::ConditionalStore for RedisMetadataCache {
    async fn get(&self, key: &str) -> Option<(String, bytes::Bytes)> {
        let mut c = self.connection.clone();
        let (etag, body): (Option<String>, Option<Vec<u8>>) = redis::cmd("HMGET")
            .arg(format!("{INDEX_PREFIX}:{key}"))
            .arg("etag")
            .arg("body")
            .query_async(&mut c)
            .await
            .ok()?;
        Some((etag?, bytes::Bytes::from(body?)))
    }

    async fn put(&self, key: &str, etag: &str, bytes: &bytes::Bytes) {
        let mut c = self.connection.clone();
        let key = format!("{INDEX_PREFIX}:{key}");
        let result: Result<(), _> = redis::pipe()
            .atomic()
            .hset_multiple(&key, &[("etag", etag.as_bytes()), ("body", bytes.as_ref())])
            .ignore()
            .expire(&key, INDEX_TTL_SECONDS as i64)
            .ignore()
            .query_async(&mut c)
            .await;
        if let Err(error) = result {
            tracing::warn!(%error, "cannot cache an index file");
        }
    }

    async fn forget(&self, key: &str) {
        let mut c = self.connection.clone();
        let _: Result<(), _> = c.del(format!("{INDEX_PREFIX}:{key}")).await;
    }
}
