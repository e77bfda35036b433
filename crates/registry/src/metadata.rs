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
}

/// A process-local cache.
#[derive(Debug, Clone, Default)]
pub struct InMemoryMetadataCache {
    entries: Arc<Mutex<HashMap<String, ManifestMetadata>>>,
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
}
