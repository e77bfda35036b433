//! Manifest metadata cached by digest.
//!
//! A digest names immutable content, so its metadata never changes: a tag whose
//! digest is unchanged is never read again, and a re-pointed tag (new digest)
//! is. The cache is pluggable: in memory here, shared through Redis by the
//! scanner's replicas.

use std::sync::Arc;

pub use vynil_rules::ManifestMetadata;
use vynil_rules::signature::Evidence;

#[async_trait::async_trait]
pub trait MetadataCache: Send + Sync + std::fmt::Debug {
    async fn get(&self, digest: &str) -> Option<ManifestMetadata>;
    async fn put(&self, digest: &str, metadata: &ManifestMetadata);
    /// The digest tag `reference` (`<registry>/<repository>:<tag>`) had when
    /// last read. A tag seen before is checked with a HEAD (it may have been
    /// re-pointed); one never seen is read with a single GET.
    async fn tag_digest(&self, reference: &str) -> Option<String>;
    async fn put_tag_digest(&self, reference: &str, digest: &str);
    /// What the cosign signature manifest `digest` holds (immutable too).
    async fn evidence(&self, digest: &str) -> Option<Evidence>;
    async fn put_evidence(&self, digest: &str, evidence: &Evidence);
}

/// A process-local cache, bounded: at most about `capacity` metadata entries
/// and as many tag digests, the least used evicted first (`quick_cache`'s
/// CLOCK-Pro). An evicted entry costs one read more at the next scan, never a
/// wrong answer: a digest's metadata never changes, and a tag without a known
/// digest is read in full.
#[derive(Debug, Clone)]
pub struct InMemoryMetadataCache {
    entries: Arc<quick_cache::sync::Cache<String, ManifestMetadata>>,
    tags: Arc<quick_cache::sync::Cache<String, String>>,
    evidence: Arc<quick_cache::sync::Cache<String, Evidence>>,
}

impl InMemoryMetadataCache {
    /// Enough for a rescan of a 10 000-tag repository and its neighbours
    /// without a manifest read; a few tens of MiB of metadata at most.
    pub const DEFAULT_CAPACITY: usize = 50_000;

    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            entries: Arc::new(quick_cache::sync::Cache::new(capacity)),
            tags: Arc::new(quick_cache::sync::Cache::new(capacity)),
            evidence: Arc::new(quick_cache::sync::Cache::new(capacity)),
        }
    }

    /// `(metadata entries, tag digests)` held now.
    pub fn len(&self) -> (usize, usize) {
        (self.entries.len(), self.tags.len())
    }
}

impl Default for InMemoryMetadataCache {
    fn default() -> Self {
        Self::with_capacity(Self::DEFAULT_CAPACITY)
    }
}

#[async_trait::async_trait]
impl MetadataCache for InMemoryMetadataCache {
    async fn get(&self, digest: &str) -> Option<ManifestMetadata> {
        self.entries.get(digest)
    }

    async fn put(&self, digest: &str, metadata: &ManifestMetadata) {
        self.entries.insert(digest.to_string(), metadata.clone());
    }

    async fn tag_digest(&self, reference: &str) -> Option<String> {
        self.tags.get(reference)
    }

    async fn put_tag_digest(&self, reference: &str, digest: &str) {
        self.tags.insert(reference.to_string(), digest.to_string());
    }

    async fn evidence(&self, digest: &str) -> Option<Evidence> {
        self.evidence.get(digest)
    }

    async fn put_evidence(&self, digest: &str, evidence: &Evidence) {
        self.evidence.insert(digest.to_string(), evidence.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_cache_holds_what_it_was_given_up_to_its_capacity() {
        let cache = InMemoryMetadataCache::with_capacity(100);
        cache.put("sha256:first", &ManifestMetadata::NotVynil).await;
        cache.put_tag_digest("r/x:1.0.0", "sha256:first").await;
        assert_eq!(cache.get("sha256:first").await, Some(ManifestMetadata::NotVynil));
        assert_eq!(cache.tag_digest("r/x:1.0.0").await.as_deref(), Some("sha256:first"));
        for i in 0..10_000 {
            cache.put(&format!("sha256:{i}"), &ManifestMetadata::NotVynil).await;
            cache.put_tag_digest(&format!("r/x:{i}"), &format!("sha256:{i}")).await;
        }
        let (entries, tags) = cache.len();
        assert!(
            entries <= 100 && tags <= 100,
            "{entries} entries and {tags} tag digests over a capacity of 100"
        );
        assert!(
            entries >= 50 && tags >= 50,
            "{entries} entries and {tags} tag digests: the cache forgot too much"
        );
    }
}
