//! Publishes Vynil packages and registry noise through the OCI distribution API
//! (via `oci-client`), concurrently, so fixtures of thousands of tags are quick.
//!
//! Every revision shares one config blob and one layer blob per repository; the
//! manifests differ by their annotations, so each tag gets its own digest unless
//! it is explicitly an alias.

use std::{collections::HashSet, sync::Arc};

use futures::{StreamExt, TryStreamExt};
use oci_client::{
    Client, Reference,
    client::{ClientConfig, ClientProtocol},
    secrets::RegistryAuth,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use crate::{ArtifactKind, PackageSpec, Result};

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const COSIGN_LAYER: &str = "application/vnd.dev.cosign.simplesigning.v1+json";

/// Pushes to one registry. Cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    host: String,
    auth: RegistryAuth,
    repositories_with_blobs: Arc<Mutex<HashSet<String>>>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").field("host", &self.host).finish_non_exhaustive()
    }
}

/// `sha256:<hex>` of some bytes.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

impl Publisher {
    pub(crate) fn new(host: String, basic_auth: Option<(String, String)>) -> Self {
        let client = Client::new(ClientConfig {
            protocol: ClientProtocol::Http,
            use_monolithic_push: true,
            ..Default::default()
        });
        let auth = match basic_auth {
            Some((user, password)) => RegistryAuth::Basic(user, password),
            None => RegistryAuth::Anonymous,
        };
        Self { client, host, auth, repositories_with_blobs: Arc::default() }
    }

    fn reference(&self, repository: &str, tag: &str) -> Reference {
        Reference::with_tag(self.host.clone(), repository.to_string(), tag.to_string())
    }

    /// Pushes the shared config and layer blobs of `repository` once.
    async fn ensure_blobs(&self, repository: &str) -> Result<(Value, Value)> {
        let (config, layer) = shared_blobs(repository);
        let descriptors = (descriptor(OCI_CONFIG, &config), descriptor(OCI_LAYER, &layer));
        let mut done = self.repositories_with_blobs.lock().await;
        if !done.contains(repository) {
            let reference = self.reference(repository, "blobs");
            self.client.store_auth_if_needed(&self.host, &self.auth).await;
            self.client.push_blob(&reference, config.clone(), &sha256_digest(&config)).await?;
            self.client.push_blob(&reference, layer.clone(), &sha256_digest(&layer)).await?;
            done.insert(repository.to_string());
        }
        Ok(descriptors)
    }

    /// Pushes raw manifest bytes under `tag`; returns the manifest digest.
    pub async fn push_manifest(&self, repository: &str, tag: &str, manifest: &[u8]) -> Result<String> {
        self.push_raw(repository, tag, manifest, OCI_MANIFEST).await
    }

    /// An OCI image index under `tag` listing `manifests` (digests of images
    /// already pushed to `repository`), without annotations of its own.
    pub async fn push_index(&self, repository: &str, tag: &str, manifests: &[String]) -> Result<String> {
        let mut entries = Vec::new();
        for digest in manifests {
            let (bytes, _) = self
                .client
                .pull_manifest_raw(&self.reference(repository, digest), &self.auth, &[OCI_MANIFEST])
                .await?;
            entries.push(json!({
                "mediaType": OCI_MANIFEST,
                "digest": digest,
                "size": bytes.len(),
                "platform": {"architecture": "amd64", "os": "linux"},
            }));
        }
        let index = json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries});
        self.push_raw(repository, tag, index.to_string().as_bytes(), OCI_INDEX).await
    }

    async fn push_raw(
        &self,
        repository: &str,
        tag: &str,
        manifest: &[u8],
        media_type: &'static str,
    ) -> Result<String> {
        self.client.store_auth_if_needed(&self.host, &self.auth).await;
        let content_type = reqwest::header::HeaderValue::from_static(media_type);
        self.client
            .push_manifest_raw(&self.reference(repository, tag), manifest.to_vec(), content_type)
            .await?;
        Ok(sha256_digest(manifest))
    }

    async fn push_image(&self, repository: &str, tag: &str, annotations: impl Into<Value>) -> Result<String> {
        let (config, layer) = self.ensure_blobs(repository).await?;
        let manifest = image_manifest(config, layer, annotations.into());
        self.push_manifest(repository, tag, &manifest).await
    }

    /// Publishes one package revision; returns its manifest digest. Publishing to
    /// an existing tag re-points it.
    pub async fn publish(&self, repository: &str, spec: &PackageSpec) -> Result<String> {
        self.push_image(repository, &spec.tag, package_annotations(spec)).await
    }

    /// Publishes many revisions with up to `concurrency` pushes in flight;
    /// returns the digests in input order.
    pub async fn publish_all(
        &self,
        items: &[(String, PackageSpec)],
        concurrency: usize,
    ) -> Result<Vec<String>> {
        futures::stream::iter(items)
            .map(|(repository, spec)| self.publish(repository, spec))
            .buffered(concurrency.max(1))
            .try_collect()
            .await
    }

    /// An image tag without any Vynil annotation (e.g. `latest`, `4.0`, or a
    /// version pushed by another tool); unique per tag.
    pub async fn publish_plain(&self, repository: &str, tag: &str) -> Result<String> {
        self.push_image(repository, tag, json!({"org.opencontainers.image.version": tag})).await
    }

    /// Points `alias` at the manifest `tag` points to (same digest).
    pub async fn alias(&self, repository: &str, tag: &str, alias: &str) -> Result<String> {
        let (manifest, _) = self
            .client
            .pull_manifest_raw(&self.reference(repository, tag), &self.auth, &[OCI_MANIFEST])
            .await?;
        self.push_manifest(repository, alias, &manifest).await
    }

    /// A cosign-style artifact tag `sha256-<hex>.<sig|att|sbom>` for `subject`;
    /// returns the artifact's tag.
    pub async fn attach(&self, repository: &str, subject: &str, kind: ArtifactKind) -> Result<String> {
        let tag = kind.tag_for(subject);
        let (config, _) = self.ensure_blobs(repository).await?;
        let (payload, manifest) = artifact_manifest(config, subject, kind);
        let payload_ref = self.reference(repository, "payload");
        self.client.push_blob(&payload_ref, payload.clone(), &sha256_digest(&payload)).await?;
        self.push_manifest(repository, &tag, &manifest).await?;
        Ok(tag)
    }

    /// cosign's `.sig` manifest of `subject` with these layers (payload
    /// blobs pushed first), as `cosign sign` writes it; returns its digest.
    pub async fn sign(
        &self,
        repository: &str,
        subject: &str,
        layers: &[crate::SignatureLayer],
    ) -> Result<String> {
        let (config, _) = self.ensure_blobs(repository).await?;
        let reference = self.reference(repository, "signature");
        let mut descriptors = Vec::new();
        for layer in layers {
            let digest = sha256_digest(&layer.payload);
            self.client.push_blob(&reference, layer.payload.clone(), &digest).await?;
            descriptors.push(json!({
                "mediaType": COSIGN_LAYER,
                "digest": digest,
                "size": layer.payload.len(),
                "annotations": {"dev.cosignproject.cosign/signature": layer.signature},
            }));
        }
        let manifest = canonical(json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config,
            "layers": descriptors,
        }));
        self.push_manifest(
            repository,
            &ArtifactKind::Signature.tag_for(subject),
            manifest.to_string().as_bytes(),
        )
        .await
    }
}

/// The OCI empty descriptor's blob (`{}`), the config of an artifact.
const EMPTY_BLOB: &[u8] = b"{}";
const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";

impl Publisher {
    /// `bundle` attached to `subject` as cosign v3 publishes it on a registry
    /// without the referrers API (sigstore/cosign `specs/BUNDLE_SPEC.md`,
    /// "Publishing"): an artifact manifest (artifact type and layer the
    /// bundle's media type, the empty config, `subject` set, the predicate
    /// type annotated) pushed by digest, and its descriptor added to the
    /// referrers tag schema's index at tag `sha256-<hex>`. Returns the
    /// artifact manifest's digest.
    pub async fn attach_bundle(
        &self,
        repository: &str,
        subject: &str,
        bundle: &[u8],
        predicate_type: &str,
    ) -> Result<String> {
        use vynil_rules::signature::bundle::{BUNDLE_MEDIA_TYPES, PREDICATE_TYPE_ANNOTATION};
        let reference = self.reference(repository, "bundle");
        self.client.store_auth_if_needed(&self.host, &self.auth).await;
        {
            // Once per repository: concurrent uploads of one blob race in distribution 2.8.
            let mut done = self.repositories_with_blobs.lock().await;
            if done.insert(format!("{repository} empty")) {
                self.client.push_blob(&reference, EMPTY_BLOB.to_vec(), &sha256_digest(EMPTY_BLOB)).await?;
            }
        }
        self.client.push_blob(&reference, bundle.to_vec(), &sha256_digest(bundle)).await?;
        let (subject_body, _) = self
            .client
            .pull_manifest_raw(&self.reference(repository, subject), &self.auth, &[OCI_MANIFEST])
            .await?;
        let annotations = json!({
            "dev.sigstore.bundle.content": "dsse-envelope",
            PREDICATE_TYPE_ANNOTATION: predicate_type,
            "org.opencontainers.image.created": "2026-12-07T00:00:00Z",
        });
        let manifest = canonical(json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": BUNDLE_MEDIA_TYPES[0],
            "config": descriptor(EMPTY_MEDIA_TYPE, EMPTY_BLOB),
            "layers": [descriptor(BUNDLE_MEDIA_TYPES[0], bundle)],
            "subject": {"mediaType": OCI_MANIFEST, "digest": subject, "size": subject_body.len()},
            "annotations": annotations,
        }))
        .to_string()
        .into_bytes();
        let digest = sha256_digest(&manifest);
        self.push_manifest(repository, &digest, &manifest).await?;
        let entry = json!({
            "mediaType": OCI_MANIFEST,
            "digest": digest,
            "size": manifest.len(),
            "artifactType": BUNDLE_MEDIA_TYPES[0],
            "annotations": annotations,
        });
        let tag = subject.replacen(':', "-", 1);
        let mut entries: Vec<Value> = match self
            .client
            .pull_manifest_raw(&self.reference(repository, &tag), &self.auth, &[OCI_INDEX])
            .await
        {
            Ok((index, _)) => serde_json::from_slice::<Value>(&index)
                .map_err(|e| crate::TestkitError::Fixture(format!("the referrers index: {e}")))?["manifests"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        entries.push(entry);
        let index = canonical(json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}));
        self.push_raw(repository, &tag, index.to_string().as_bytes(), OCI_INDEX).await?;
        Ok(digest)
    }
}

/// The config and layer blobs every revision of `repository` shares.
pub(crate) fn shared_blobs(repository: &str) -> (Vec<u8>, Vec<u8>) {
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#.to_vec();
    let layer = format!("vynil test package layer of {repository}").into_bytes();
    (config, layer)
}

pub(crate) fn descriptor(media_type: &str, blob: &[u8]) -> Value {
    json!({"mediaType": media_type, "digest": sha256_digest(blob), "size": blob.len()})
}

pub(crate) const CONFIG_MEDIA_TYPE: &str = OCI_CONFIG;
pub(crate) const LAYER_MEDIA_TYPE: &str = OCI_LAYER;

/// `value` with the keys of every object in sorted order, whatever
/// serde_json's `preserve_order` feature (which another crate of a workspace
/// build may turn on): manifests hash to the same digests in every build.
pub(crate) fn canonical(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let sorted: std::collections::BTreeMap<String, Value> =
                map.into_iter().map(|(k, v)| (k, canonical(v))).collect();
            Value::Object(sorted.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(canonical).collect()),
        other => other,
    }
}

/// The bytes of an image manifest over `config` and `layer` descriptors.
pub(crate) fn image_manifest(config: Value, layer: Value, annotations: Value) -> Vec<u8> {
    canonical(json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config,
        "layers": [layer],
        "annotations": annotations,
    }))
    .to_string()
    .into_bytes()
}

/// The annotations of a package revision, as real build tools write them
/// (`org.opencontainers.image.version` also gives every version its own digest).
pub(crate) fn package_annotations(spec: &PackageSpec) -> Value {
    let mut annotations: serde_json::Map<String, Value> =
        spec.annotations().into_iter().map(|(k, v)| (k, Value::String(v))).collect();
    annotations.insert("org.opencontainers.image.version".into(), Value::String(spec.tag.clone()));
    Value::Object(annotations)
}

/// A cosign-style artifact of `subject`: its payload blob and manifest bytes.
pub(crate) fn artifact_manifest(config: Value, subject: &str, kind: ArtifactKind) -> (Vec<u8>, Vec<u8>) {
    let payload = format!("{{\"critical\":{{\"image\":{{\"docker-manifest-digest\":\"{subject}\"}}}}}}");
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config,
        "layers": [{
            "mediaType": COSIGN_LAYER,
            "digest": sha256_digest(payload.as_bytes()),
            "size": payload.len(),
            "annotations": {"dev.cosignproject.cosign/signature": format!("test-{}", kind.suffix())},
        }],
    });
    (payload.into_bytes(), canonical(manifest).to_string().into_bytes())
}
