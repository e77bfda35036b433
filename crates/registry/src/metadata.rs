//! Manifest metadata cached by digest.
//!
//! A digest names immutable content, so its metadata never changes: a tag whose
//! digest is unchanged is never read again, and a re-pointed tag (new digest)
//! is. The cache is pluggable: in memory here, shared through Redis by the
//! scanner's replicas.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

pub use vynil_rules::ManifestMetadata;

#[async_trait::async_trait]
pub trait MetadataCache: Send + Sync + std::fmt::Debug {
    async fn get(&self, digest: &str) -> Option<ManifestMetadata>;
    async fn put(&self, digest: &str, metadata: &ManifestMetadata);
    /// The digest tag `reference` (`<registry>/<repository>:<tag>`) had when
    /// last read. A tag seen before is checked with a HEAD (it may have been
    /// re-pointed); one never seen is read with a single GET.
    async fn tag_digest(&self, reference: &str) -> Option<String>;
    async fn put_tag_digest(&self, reference: &str, digest: &str);
}

/// A process-local cache.
#[derive(Debug, Clone, Default)]
pub struct InMemoryMetadataCache {
    entries: Arc<Mutex<HashMap<String, ManifestMetadata>>>,
    tags: Arc<Mutex<HashMap<String, String>>>,
}

#[async_trait::async_trait]
impl MetadataCache for InMemoryMetadataCache {
    async fn get(&self, digest: &str) -> Option<ManifestMetadata> {
        self.entries.lock().ok()?.get(digest).cloned()
    }

    async fn put(&self, digest: &str, metadata: &ManifestMetadata) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(digest.to_string(), metadata.clone());
        }
    }

    async fn tag_digest(&self, reference: &str) -> Option<String> {
        self.tags.lock().ok()?.get(reference).cloned()
    }

    async fn put_tag_digest(&self, reference: &str, digest: &str) {
        if let Ok(mut tags) = self.tags.lock() {
            tags.insert(reference.to_string(), digest.to_string());
        }
    }
}
