//! Vynil packages written as OCI image layouts, byte for byte the manifests
//! the [`crate::Publisher`] pushes to a registry, so a layout and a registry
//! holding "the same packages" really hold the same digests.
//!
//! Each repository is its own layout directory `<root>/<repository>`
//! (`oci-layout`, `index.json`, `blobs/sha256/…`), tags as
//! `org.opencontainers.image.ref.name`, as `skopeo copy … oci:<dir>:<tag>`
//! writes them. `index.json` is written with sorted keys, so regenerating an
//! unchanged set changes no byte (the committed `examples/layout`).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::{
    ArtifactKind, PackageSpec, Result, TestkitError,
    publisher::{
        CONFIG_MEDIA_TYPE, LAYER_MEDIA_TYPE, OCI_MANIFEST, artifact_manifest, descriptor, image_manifest,
        package_annotations, sha256_digest, shared_blobs,
    },
};

const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Writes packages into layouts under one root directory.
#[derive(Debug, Clone)]
pub struct LayoutWriter {
    root: PathBuf,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> TestkitError {
    move |source| TestkitError::Io { doing: what, source }
}

impl LayoutWriter {
    pub fn new(root: &Path) -> Self {
        Self { root: root.to_path_buf() }
    }

    fn dir(&self, repository: &str) -> PathBuf {
        self.root.join(repository)
    }

    fn write_blob(&self, repository: &str, bytes: &[u8]) -> Result<String> {
        let digest = sha256_digest(bytes);
        let blobs = self.dir(repository).join("blobs/sha256");
        std::fs::create_dir_all(&blobs).map_err(io(format!("creating {}", blobs.display())))?;
        let path = blobs.join(digest.trim_start_matches("sha256:"));
        std::fs::write(&path, bytes).map_err(io(format!("writing {}", path.display())))?;
        Ok(digest)
    }

    fn read_index(&self, repository: &str) -> Result<Value> {
        let path = self.dir(repository).join("index.json");
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| TestkitError::Io {
                doing: format!("reading {}", path.display()),
                source: e.into(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(
                json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []}),
            ),
            Err(e) => Err(TestkitError::Io { doing: format!("reading {}", path.display()), source: e }),
        }
    }

    /// Points `tag` at `manifest` (re-pointing it when it exists).
    fn tag(&self, repository: &str, tag: &str, manifest: &[u8]) -> Result<String> {
        let digest = self.write_blob(repository, manifest)?;
        let mut index = self.read_index(repository)?;
        let entry = json!({
            "mediaType": OCI_MANIFEST,
            "digest": digest,
            "size": manifest.len(),
            "annotations": {REF_NAME: tag},
        });
        if let Some(entries) = index["manifests"].as_array_mut() {
            entries.retain(|e| e["annotations"][REF_NAME] != tag);
            entries.push(entry);
        }
        let dir = self.dir(repository);
        let layout = dir.join("oci-layout");
        std::fs::write(&layout, "{\"imageLayoutVersion\":\"1.0.0\"}\n")
            .map_err(io(format!("writing {}", layout.display())))?;
        let text =
            serde_json::to_string_pretty(&crate::publisher::canonical(index)).unwrap_or_default() + "\n";
        let path = dir.join("index.json");
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))?;
        Ok(digest)
    }

    fn blobs(&self, repository: &str) -> Result<(Value, Value)> {
        let (config, layer) = shared_blobs(repository);
        self.write_blob(repository, &config)?;
        self.write_blob(repository, &layer)?;
        Ok((descriptor(CONFIG_MEDIA_TYPE, &config), descriptor(LAYER_MEDIA_TYPE, &layer)))
    }

    /// One package revision, as [`crate::Publisher::publish`] pushes it; returns its digest.
    pub fn publish(&self, repository: &str, spec: &PackageSpec) -> Result<String> {
        let (config, layer) = self.blobs(repository)?;
        self.tag(repository, &spec.tag, &image_manifest(config, layer, package_annotations(spec)))
    }

    /// A tag without Vynil annotations, as [`crate::Publisher::publish_plain`] pushes it.
    pub fn publish_plain(&self, repository: &str, tag: &str) -> Result<String> {
        let (config, layer) = self.blobs(repository)?;
        self.tag(
            repository,
            tag,
            &image_manifest(config, layer, json!({"org.opencontainers.image.version": tag})),
        )
    }

    /// A cosign-style artifact of `subject`, as [`crate::Publisher::attach`]; returns its tag.
    pub fn attach(&self, repository: &str, subject: &str, kind: ArtifactKind) -> Result<String> {
        let (config, _) = self.blobs(repository)?;
        let (payload, manifest) = artifact_manifest(config, subject, kind);
        self.write_blob(repository, &payload)?;
        let tag = kind.tag_for(subject);
        self.tag(repository, &tag, &manifest)?;
        Ok(tag)
    }
}

/// The blobs a layout directory holds.
pub fn stored_blobs(dir: &Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(dir.join("blobs/sha256"))
        .map(|listing| {
            listing.flatten().map(|e| format!("sha256:{}", e.file_name().to_string_lossy())).collect()
        })
        .unwrap_or_default()
}

/// The blobs `index.json` of a layout directory reaches (manifests, their
/// config and layers), computed from the files; `Err` names a referenced
/// blob that is missing (the layout is not valid).
pub fn reachable_blobs(dir: &Path) -> std::result::Result<std::collections::BTreeSet<String>, String> {
    let read = |path: &Path| std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()));
    let index: Value = serde_json::from_slice(&read(&dir.join("index.json"))?).map_err(|e| e.to_string())?;
    let mut seen = std::collections::BTreeSet::new();
    let mut pending: Vec<String> = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["digest"].as_str().map(String::from))
        .collect();
    while let Some(digest) = pending.pop() {
        if !seen.insert(digest.clone()) {
            continue;
        }
        let path = dir.join("blobs/sha256").join(digest.trim_start_matches("sha256:"));
        let bytes = read(&path).map_err(|e| format!("{digest} is referenced but unreadable: {e}"))?;
        if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
            let children = value["layers"].as_array().into_iter().flatten().chain(value.get("config"));
            pending.extend(children.filter_map(|c| c["digest"].as_str().map(String::from)));
        }
    }
    Ok(seen)
}
