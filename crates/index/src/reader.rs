//! Reading an index with conditional requests.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use object_store::{GetOptions, ObjectStore, path::Path};
use vynil_rules::Package;

use crate::{
    INDEX_FILE, IndexDocument, IndexEntry, IndexError, Location, MAX_FILE_BYTES, Result,
    format::parse_package_file,
};

/// Where the last bytes read of each index file are kept with their `ETag`,
/// keyed by the file's address: in process memory, or shared by replicas
/// (Redis, in the store crate). A miss or an outage only costs a full GET.
#[async_trait::async_trait]
pub trait ConditionalStore: Send + Sync + std::fmt::Debug {
    async fn get(&self, key: &str) -> Option<(String, Bytes)>;
    async fn put(&self, key: &str, etag: &str, bytes: &Bytes);
    async fn forget(&self, key: &str);
}

#[derive(Debug, Default)]
struct MemoryStore {
    entries: Mutex<HashMap<String, (String, Bytes)>>,
}

#[async_trait::async_trait]
impl ConditionalStore for MemoryStore {
    async fn get(&self, key: &str) -> Option<(String, Bytes)> {
        self.entries.lock().ok()?.get(key).cloned()
    }

    async fn put(&self, key: &str, etag: &str, bytes: &Bytes) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(key.to_string(), (etag.to_string(), bytes.clone()));
        }
    }

    async fn forget(&self, key: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.remove(key);
        }
    }
}

/// The last bytes read of each index file with their `ETag`, shared by every
/// scan (of a process, or of every replica with a shared store): the next
/// read asks `If-None-Match` and an unchanged file costs a `304`. Bounded by
/// the files of the indexes read (each at most [`MAX_FILE_BYTES`]); an entry
/// is replaced when its file changes.
#[derive(Debug, Clone)]
pub struct ConditionalCache {
    store: Arc<dyn ConditionalStore>,
}

impl Default for ConditionalCache {
    fn default() -> Self {
        Self { store: Arc::new(MemoryStore::default()) }
    }
}

impl ConditionalCache {
    pub fn new(store: Arc<dyn ConditionalStore>) -> Self {
        Self { store }
    }

    async fn get(&self, key: &str) -> Option<(String, Bytes)> {
        self.store.get(key).await
    }

    async fn put(&self, key: String, etag: Option<String>, bytes: Bytes) {
        match etag {
            Some(etag) => self.store.put(&key, &etag, &bytes).await,
            None => self.store.forget(&key).await,
        }
    }
}

/// An index opened at its location.
#[derive(Debug)]
pub struct IndexReader {
    location: Location,
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    cache: ConditionalCache,
}

impl IndexReader {
    pub fn open(location: Location, cache: ConditionalCache) -> Result<Self> {
        let (store, prefix) = location.open()?;
        Ok(Self { location, store, prefix, cache })
    }

    pub fn location(&self) -> &Location {
        &self.location
    }

    /// `index.yaml`.
    pub async fn index(&self) -> Result<IndexDocument> {
        let described = self.location.describe(INDEX_FILE);
        IndexDocument::parse(&self.fetch(INDEX_FILE).await?, &described)
    }

    /// The revisions of `entry`'s package file.
    pub async fn package_file(&self, entry: &IndexEntry) -> Result<Vec<Package>> {
        let bytes = self.fetch(&entry.file).await?;
        let named = IndexEntry { file: self.location.describe(&entry.file), ..entry.clone() };
        parse_package_file(&bytes, &named)
    }

    /// A file's bytes: a conditional GET when its bytes are cached.
    async fn fetch(&self, file: &str) -> Result<Bytes> {
        let described = self.location.describe(file);
        let path =
            if self.prefix.as_ref().is_empty() { Path::from(file) } else { self.prefix.clone().join(file) };
        let cached = self.cache.get(&described).await;
        let options = GetOptions {
            if_none_match: cached.as_ref().map(|(etag, _)| etag.clone()),
            ..GetOptions::default()
        };
        match self.store.get_opts(&path, options).await {
            Ok(result) => {
                if result.meta.size > MAX_FILE_BYTES {
                    return Err(IndexError::TooLarge {
                        file: described,
                        size: result.meta.size,
                        limit: MAX_FILE_BYTES,
                    });
                }
                let etag = result.meta.e_tag.clone();
                let bytes = result.bytes().await.map_err(|e| error(&described, e))?;
                self.cache.put(described, etag, bytes.clone()).await;
                Ok(bytes)
            }
            Err(object_store::Error::NotModified { .. }) => match cached {
                Some((_, bytes)) => Ok(bytes),
                None => Err(IndexError::Unreachable {
                    file: described,
                    problem: "304 to an unconditional request".into(),
                }),
            },
            Err(e) => Err(error(&described, e)),
        }
    }
}

/// One mapping of the store's errors, for reads and writes alike.
pub(crate) fn error(file: &str, error: object_store::Error) -> IndexError {
    let file = file.to_string();
    match error {
        object_store::Error::NotFound { .. } => IndexError::Missing { file },
        object_store::Error::PermissionDenied { source, .. }
        | object_store::Error::Unauthenticated { source, .. } => {
            IndexError::Unauthorized { file, problem: source.to_string() }
        }
        other => {
            let problem = other.to_string();
            // The S3 client reports a refused signature as a generic error
            // carrying the server's status and code.
            if ["403", "401", "SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied"]
                .iter()
                .any(|code| problem.contains(code))
            {
                IndexError::Unauthorized { file, problem }
            } else {
                IndexError::Unreachable { file, problem }
            }
        }
    }
}
