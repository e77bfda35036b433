//! Registry operations: tags (all pages), digests, manifests, Vynil metadata
//! by digest, artifacts, and deletes that are verified before being reported.

use std::{collections::BTreeMap, sync::Arc};

use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE,
};
use reqwest::{Method, StatusCode};
use sha2::{Digest, Sha256};
use vynil_rules::ArtifactTag;

use crate::{
    CredentialStore, ManifestMetadata, MetadataCache, RegistryError, RepositoryRef, RequestCounters, Result,
    TransportConfig, decode,
    layout::Layout,
    referrers::ReferrersAbsent,
    transport::{Access, Request, Response, Transport},
};

/// Runs file work of a layout off the async threads.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|e| RegistryError::Layout {
        what: "an OCI image layout operation".into(),
        problem: format!("the task failed: {e}"),
    })?
}

const MANIFEST_TYPES: &[&str] = &[
    OCI_IMAGE_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];
const JSON: &[&str] = &["application/json"];
const PAGE_SIZE: usize = 1000;
const MAX_LIST_BYTES: usize = 16 * 1024 * 1024;

/// A manifest as served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub digest: String,
    pub media_type: String,
    pub annotations: BTreeMap<String, String>,
}

/// A tag, its digest and what its annotations say.
#[derive(Debug, Clone, PartialEq)]
pub struct TaggedManifest {
    pub tag: String,
    pub digest: String,
    pub metadata: ManifestMetadata,
    /// The manifest was read for this answer (its digest was not cached):
    /// what a scan counts as `manifests_read`, its own and no other's.
    pub manifest_read: bool,
}

/// An artifact attached to a subject digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// The cosign-convention tag, when found that way.
    pub tag: Option<String>,
    pub digest: String,
    /// `signature`, `attestation`, `SBOM`, or the referrer's artifact type.
    pub kind: String,
}

/// What a delete did, verified by reading back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeletionOutcome {
    /// Gone, and so are these tags: eligible for registry garbage collection.
    Deleted {
        tags: Vec<String>,
    },
    AlreadyGone,
    Failed {
        status: Option<u16>,
        code: String,
        message: String,
    },
}

/// The registry client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RegistryClient {
    transport: Arc<Transport>,
    cache: Arc<dyn MetadataCache>,
    referrers_absent: ReferrersAbsent,
}

impl RegistryClient {
    pub fn new(
        config: TransportConfig,
        credentials: CredentialStore,
        cache: Arc<dyn MetadataCache>,
    ) -> Result<Self> {
        let transport = Arc::new(Transport::new(config, credentials)?);
        Ok(Self { transport, cache, referrers_absent: ReferrersAbsent::default() })
    }

    /// This client with a JukeBox's pull-secret credentials over the
    /// configured ones (same metadata cache and counters).
    pub fn with_credentials(&self, extra: &CredentialStore) -> Result<Self> {
        Ok(Self { transport: Arc::new(self.transport.with_credentials(extra)?), ..self.clone() })
    }

    pub fn counters(&self) -> RequestCounters {
        self.transport.counters.clone()
    }

    pub(crate) fn transport(&self) -> &Transport {
        &self.transport
    }

    pub(crate) fn cache(&self) -> &dyn MetadataCache {
        &*self.cache
    }

    pub(crate) fn referrers_absent(&self) -> &ReferrersAbsent {
        &self.referrers_absent
    }

    pub(crate) fn request(
        &self,
        kind: &'static str,
        what: String,
        repo: &RepositoryRef,
        method: Method,
        path: &str,
    ) -> Request {
        Request {
            kind,
            what,
            registry: repo.registry.clone(),
            method,
            url: format!("{}{path}", self.transport.base_url(&repo.registry)),
            accept: MANIFEST_TYPES,
            token_scope: Some((repo.api_repository().into_owned(), Access::Read)),
            authorization: None,
            max_body: self.transport.config().max_manifest_bytes,
            max_attempts: None,
        }
    }

    /// Every tag of the repository, following `Link` pages to the end.
    pub async fn list_tags(&self, repo: &RepositoryRef) -> Result<Vec<String>> {
        self.list_tags_at_most(repo, usize::MAX).await
    }

    /// [`RegistryClient::list_tags`], refused with
    /// [`RegistryError::TooManyTags`] as soon as a page takes the count past
    /// `cap`: pages are asked for at most `cap + 1` tags and read one at a
    /// time, so what a listing holds is bounded by the cap, whatever the
    /// repository holds.
    pub async fn list_tags_at_most(&self, repo: &RepositoryRef, cap: usize) -> Result<Vec<String>> {
        let what = format!("tags of {repo}");
        let over = |listed: usize| RegistryError::TooManyTags { what: what.clone(), listed, cap };
        if let Some(layout) = Layout::of(repo, self.transport.config())? {
            let tags = blocking(move || layout.tags()).await?;
            return if tags.len() > cap { Err(over(tags.len())) } else { Ok(tags) };
        }
        let mut tags = Vec::new();
        let page_size = PAGE_SIZE.min(cap.saturating_add(1));
        let mut path = format!("/v2/{}/tags/list?n={page_size}", repo.api_repository());
        let mut pages = 0;
        loop {
            pages += 1;
            let mut request = self.request("list_tags", what.clone(), repo, Method::GET, &path);
            request.accept = JSON;
            request.max_body = MAX_LIST_BYTES;
            let response = self.transport.send(&request).await?;
            check_status(&response, &what)?;
            let page = decode::tag_page(&response.body)
                .map_err(|problem| RegistryError::InvalidBody { what: what.clone(), problem })?;
            tags.extend(page);
            if tags.len() > cap {
                return Err(over(tags.len()));
            }
            let next = match response.header("link") {
                Some(link) => decode::next_link(link, &path)
                    .map_err(|problem| RegistryError::InvalidBody { what: what.clone(), problem })?,
                None => None,
            };
            match next {
                Some(next) if pages < 100_000 => path = next,
                _ => break,
            }
        }
        Ok(tags)
    }

    /// The digest `reference` (tag or digest) points to; `None` if absent.
    pub async fn head_digest(&self, repo: &RepositoryRef, reference: &str) -> Result<Option<String>> {
        if let Some(layout) = Layout::of(repo, self.transport.config())? {
            let reference = reference.to_string();
            return blocking(move || Ok(layout.resolve(&reference)?.map(|(digest, _)| digest))).await;
        }
        let what = format!("digest of {repo}:{reference}");
        let request =
            self.request("head_manifest", what.clone(), repo, Method::HEAD, &manifest_path(repo, reference));
        let response = self.transport.send(&request).await?;
        if response.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        check_status(&response, &what)?;
        match response.header("docker-content-digest") {
            Some(digest) => Ok(Some(digest.to_string())),
            // Without the header the digest is the hash of the body: fetch it.
            None => Ok(self.get_manifest(repo, reference).await?.map(|m| m.digest)),
        }
    }

    /// The manifest `reference` points to, with its annotations; an OCI index
    /// without Vynil annotations of its own takes those of its first image.
    pub async fn get_manifest(&self, repo: &RepositoryRef, reference: &str) -> Result<Option<Manifest>> {
        let Some(manifest) = self.get_one(repo, reference).await? else {
            return Ok(None);
        };
        if manifest.1.is_some()
            && !manifest.0.annotations.contains_key(vynil_rules::annotations::METADATA)
            && let Some(first) = manifest.1.as_deref()
            && let Some((child, _)) = self.get_one(repo, first).await?
        {
            return Ok(Some(Manifest {
                digest: manifest.0.digest,
                media_type: manifest.0.media_type,
                annotations: child.annotations,
            }));
        }
        Ok(Some(manifest.0))
    }

    /// One manifest, and for an index the digest of its first entry.
    async fn get_one(
        &self,
        repo: &RepositoryRef,
        reference: &str,
    ) -> Result<Option<(Manifest, Option<String>)>> {
        let what = format!("manifest {repo}:{reference}");
        let Some((body, media_type, served_digest)) = self.fetch_manifest(repo, reference, &what).await?
        else {
            return Ok(None);
        };
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
        if reference.starts_with("sha256:") && reference != digest {
            return Err(RegistryError::InvalidBody {
                what,
                problem: format!("content does not match its digest (got {digest}): truncated or corrupt"),
            });
        }
        // Read by tag, the digest is the body's: the registry's header must agree.
        if let Some(served) = served_digest.as_deref().filter(|d| d.starts_with("sha256:"))
            && served != digest
        {
            return Err(RegistryError::InvalidBody {
                what,
                problem: format!(
                    "the registry names digest {served} but the content hashes to {digest}: truncated or corrupt"
                ),
            });
        }
        let decode::ManifestBody { annotations, first } = decode::manifest(&body)
            .map_err(|problem| RegistryError::InvalidBody { what: what.clone(), problem })?;
        Ok(Some((Manifest { digest, media_type, annotations }, first)))
    }

    /// The bytes of the manifest `reference` names, its media type and the
    /// digest the server says it has; `None` when absent.
    pub(crate) async fn fetch_manifest(
        &self,
        repo: &RepositoryRef,
        reference: &str,
        what: &str,
    ) -> Result<Option<(bytes::Bytes, String, Option<String>)>> {
        if let Some(layout) = Layout::of(repo, self.transport.config())? {
            let reference = reference.to_string();
            return blocking(move || {
                let Some((digest, media_type)) = layout.resolve(&reference)? else { return Ok(None) };
                Ok(layout.manifest(&digest)?.map(|body| (bytes::Bytes::from(body), media_type, Some(digest))))
            })
            .await;
        }
        let request = self.request(
            "get_manifest",
            what.to_string(),
            repo,
            Method::GET,
            &manifest_path(repo, reference),
        );
        let response = self.transport.send(&request).await?;
        if response.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        check_status(&response, what)?;
        let media_type = response.header("content-type").unwrap_or_default().to_string();
        let served = response.header("docker-content-digest").map(String::from);
        Ok(Some((response.body, media_type, served)))
    }

    /// Removes the blobs of an OCI image layout that nothing references (what
    /// a crash between an index rewrite and its blob removal leaves); a
    /// registry collects its own garbage, so this is 0 there.
    pub async fn collect_garbage(&self, repo: &RepositoryRef) -> Result<usize> {
        match Layout::of(repo, self.transport.config())? {
            Some(layout) => blocking(move || layout.collect_garbage()).await,
            None => Ok(0),
        }
    }

    /// The digest of `tag` and its Vynil metadata. A tag seen before costs a
    /// HEAD (it may have been re-pointed), and a GET only when its digest is
    /// new; a tag never seen costs one GET, its digest the body's hash
    /// (checked against the one the registry names). `None` if absent.
    pub async fn tag_metadata(&self, repo: &RepositoryRef, tag: &str) -> Result<Option<TaggedManifest>> {
        let reference = format!("{repo}:{tag}");
        if self.cache.tag_digest(&reference).await.is_none() {
            let Some(manifest) = self.get_manifest(repo, tag).await? else {
                return Ok(None);
            };
            let metadata = ManifestMetadata::read(|key| manifest.annotations.get(key).map(String::as_str));
            self.cache.put(&manifest.digest, &metadata).await;
            self.cache.put_tag_digest(&reference, &manifest.digest).await;
            let digest = manifest.digest;
            return Ok(Some(TaggedManifest { tag: tag.to_string(), digest, metadata, manifest_read: true }));
        }
        let Some(digest) = self.head_digest(repo, tag).await? else {
            return Ok(None);
        };
        self.cache.put_tag_digest(&reference, &digest).await;
        if let Some(metadata) = self.cache.get(&digest).await {
            return Ok(Some(TaggedManifest { tag: tag.to_string(), digest, metadata, manifest_read: false }));
        }
        let Some(manifest) = self.get_manifest(repo, &digest).await? else {
            return Ok(None);
        };
        let metadata = ManifestMetadata::read(|key| manifest.annotations.get(key).map(String::as_str));
        self.cache.put(&digest, &metadata).await;
        Ok(Some(TaggedManifest { tag: tag.to_string(), digest, metadata, manifest_read: true }))
    }

    /// Every tag of `repo` with its digest, and the metadata of version tags
    /// (read by digest through the cache): what a retention plan or an index
    /// export needs of a repository. Non-version tags need no metadata, their
    /// name says what they are. `concurrency` requests at a time; a
    /// repository of more than `max_tags` tags is refused
    /// ([`RegistryError::TooManyTags`]) before any of them is read.
    pub async fn snapshot(
        &self,
        repo: &RepositoryRef,
        concurrency: usize,
        max_tags: usize,
    ) -> Result<Vec<vynil_rules::retention::RepositoryTag>> {
        use futures::{StreamExt, TryStreamExt};
        use vynil_rules::retention::RepositoryTag;
        let tags = self.list_tags_at_most(repo, max_tags).await?;
        futures::stream::iter(tags)
            .map(|tag| async move {
                if vynil_rules::Tag::parse(&tag).is_some() {
                    let found = self.tag_metadata(repo, &tag).await?;
                    Ok(found.map(|f| RepositoryTag { name: tag, digest: f.digest, metadata: f.metadata }))
                } else {
                    let digest = self.head_digest(repo, &tag).await?;
                    Ok(digest.map(|digest| RepositoryTag {
                        name: tag,
                        digest,
                        metadata: ManifestMetadata::NotVynil,
                    }))
                }
            })
            .buffer_unordered(concurrency.max(1))
            .try_filter_map(|t| async move { Ok::<_, RegistryError>(t) })
            .try_collect()
            .await
    }

    /// Artifacts of `subject` (`sha256:…`): the OCI referrers API where the
    /// registry offers it, else the cosign tag convention among `tags`.
    pub async fn artifacts(
        &self,
        repo: &RepositoryRef,
        subject: &str,
        tags: &[String],
    ) -> Result<Vec<Artifact>> {
        if let Some(index) = self.referrers(repo, subject).await?
            && let Some(referrers) = decode::referrers(&index)
        {
            return Ok(referrers
                .into_iter()
                .map(|(digest, kind)| Artifact { tag: None, digest, kind })
                .collect());
        }
        let mut artifacts = Vec::new();
        for tag in tags {
            let Some(artifact) = ArtifactTag::parse(tag).filter(|a| a.subject == subject) else {
                continue;
            };
            if let Some(digest) = self.head_digest(repo, tag).await? {
                artifacts.push(Artifact {
                    tag: Some(tag.clone()),
                    digest,
                    kind: artifact.kind.noun().into(),
                });
            }
        }
        Ok(artifacts)
    }

    /// Deletes the manifest `digest` (which removes every tag on it), then
    /// verifies: a GET by digest answers 404 and none of `tags` is listed.
    pub async fn delete_digest(
        &self,
        repo: &RepositoryRef,
        digest: &str,
        tags: &[String],
    ) -> DeletionOutcome {
        match Layout::of(repo, self.transport.config()) {
            Ok(Some(layout)) => return self.delete_in_layout(layout, repo, digest, tags).await,
            Ok(None) => {}
            Err(error) => return failed_from(error),
        }
        let what = format!("delete {repo}@{digest}");
        let mut request =
            self.request("delete", what.clone(), repo, Method::DELETE, &manifest_path(repo, digest));
        request.token_scope = Some((repo.api_repository().into_owned(), Access::Delete));
        // Sent once: a purger checks its lease right before a DELETE, and a
        // retry would widen the window in which a lost lease still deletes.
        // A failed DELETE is reported, and the next run (HEAD first) retries it.
        request.max_attempts = Some(1);
        let response = match self.transport.send(&request).await {
            Ok(response) => response,
            Err(error) => return failed_from(error),
        };
        let already_gone = response.status == StatusCode::NOT_FOUND;
        if !already_gone && !response.status.is_success() {
            let (code, message) = response.error_code();
            return DeletionOutcome::Failed { status: Some(response.status.as_u16()), code, message };
        }
        match self.verify_gone(repo, digest, tags).await {
            Ok(()) if already_gone => DeletionOutcome::AlreadyGone,
            Ok(()) => DeletionOutcome::Deleted { tags: tags.to_vec() },
            Err(reason) => DeletionOutcome::Failed {
                status: Some(response.status.as_u16()),
                code: "NOT_VERIFIED".into(),
                message: reason,
            },
        }
    }

    /// A layout delete: the index rewritten, unreferenced blobs removed,
    /// then the same verification as for a registry.
    async fn delete_in_layout(
        &self,
        layout: Layout,
        repo: &RepositoryRef,
        digest: &str,
        tags: &[String],
    ) -> DeletionOutcome {
        let owned = digest.to_string();
        let removed = match blocking(move || layout.delete(&owned)).await {
            Ok(removed) => removed,
            Err(error) => return failed_from(error),
        };
        match self.verify_gone(repo, digest, tags).await {
            Ok(()) if removed => DeletionOutcome::Deleted { tags: tags.to_vec() },
            Ok(()) => DeletionOutcome::AlreadyGone,
            Err(reason) => {
                DeletionOutcome::Failed { status: None, code: "NOT_VERIFIED".into(), message: reason }
            }
        }
    }

    async fn verify_gone(
        &self,
        repo: &RepositoryRef,
        digest: &str,
        tags: &[String],
    ) -> std::result::Result<(), String> {
        match self.head_digest(repo, digest).await {
            Ok(None) => {}
            Ok(Some(_)) => {
                return Err("the registry accepted the delete but still serves the manifest".into());
            }
            Err(error) => return Err(format!("cannot verify the delete: {error}")),
        }
        if tags.is_empty() {
            return Ok(());
        }
        match self.list_tags(repo).await {
            Ok(listed) => {
                let remaining: Vec<&String> = tags.iter().filter(|t| listed.contains(t)).collect();
                if remaining.is_empty() {
                    Ok(())
                } else {
                    Err(format!("tags still listed after the delete: {remaining:?}"))
                }
            }
            // The last tag of a repository gone: distribution answers NAME_UNKNOWN.
            Err(RegistryError::NotFound { .. }) => Ok(()),
            Err(error) => Err(format!("cannot verify the delete: {error}")),
        }
    }
}

fn failed_from(error: RegistryError) -> DeletionOutcome {
    let status = match &error {
        RegistryError::Registry { status, .. } | RegistryError::Unauthorized { status, .. } => Some(*status),
        RegistryError::RateLimited { .. } => Some(429),
        _ => None,
    };
    let code = match &error {
        RegistryError::Registry { code, .. } => code.clone(),
        RegistryError::Unauthorized { .. } => "UNAUTHORIZED".into(),
        RegistryError::RateLimited { .. } => "TOOMANYREQUESTS".into(),
        _ => "UNREACHABLE".into(),
    };
    DeletionOutcome::Failed { status, code, message: error.to_string() }
}

fn manifest_path(repo: &RepositoryRef, reference: &str) -> String {
    format!("/v2/{}/manifests/{reference}", repo.api_repository())
}

/// Maps a non-success status to a typed error (404 → `NotFound`).
pub(crate) fn check_status(response: &Response, what: &str) -> Result<()> {
    if response.status.is_success() {
        return Ok(());
    }
    let (code, message) = response.error_code();
    if response.status == StatusCode::NOT_FOUND {
        return Err(RegistryError::NotFound {
            what: what.to_string(),
            code: if code.is_empty() { "404".into() } else { code },
        });
    }
    Err(RegistryError::Registry { what: what.to_string(), status: response.status.as_u16(), code, message })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_references_split_at_the_first_slash_and_refuse_hostile_names() {
        let r = RepositoryRef::parse("docker.io/sebt3/vynil-ollama").unwrap();
        assert_eq!((r.registry.as_str(), r.repository.as_str()), ("docker.io", "sebt3/vynil-ollama"));
        assert_eq!(RepositoryRef::parse("127.0.0.1:5000/a").unwrap().registry, "127.0.0.1:5000");
        for bad in ["noslash", "/a", "r/", "r/A", "r/a/../b", "r/a?x=1", "r/a b", "r/-a", "h\u{0}st/a"] {
            assert!(RepositoryRef::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn docker_hub_names_reach_its_api_host_and_official_images_live_under_library() {
        use crate::reference::api_host;
        let transport = Transport::new(TransportConfig::default(), CredentialStore::default()).unwrap();
        for hub in ["docker.io", "index.docker.io"] {
            assert_eq!(api_host(hub), "registry-1.docker.io");
            assert_eq!(transport.base_url(hub), "https://registry-1.docker.io");
        }
        assert_eq!(api_host("ghcr.io"), "ghcr.io");
        assert_eq!(transport.base_url("ghcr.io"), "https://ghcr.io");
        let official = RepositoryRef::parse("docker.io/redis").unwrap();
        assert_eq!(official.api_repository(), "library/redis");
        assert_eq!(official.to_string(), "docker.io/redis", "users keep seeing their own name");
        let user = RepositoryRef::parse("docker.io/sebt3/vynil-ollama").unwrap();
        assert_eq!(user.api_repository(), "sebt3/vynil-ollama");
        assert_eq!(RepositoryRef::parse("ghcr.io/redis").unwrap().api_repository(), "redis");
    }
}
