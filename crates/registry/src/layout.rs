//! OCI image layouts (`index.json` + `blobs/`, as `skopeo copy … oci:`,
//! `oras --oci-layout` and `regctl` write them) as a package source behind
//! the same [`crate::RegistryClient`] the scanner and purger use for
//! registries: air-gapped sites move packages this way, and local mode's
//! embedded example is one.
//!
//! A layout is named like a registry, `oci-layout:<directory>`, so package
//! records (`status.packages[].registry`) say where they came from. A
//! repository `R` of it is either the layout directory `<directory>/R`
//! (every `org.opencontainers.image.ref.name` is a tag), or, when there is
//! none, the entries of `<directory>/index.json` named `R:<tag>`.
//!
//! Formats are `oci-spec`'s (index and descriptors). A delete rewrites
//! `index.json` atomically (a temporary file, fsync, rename, fsync of the
//! directory), then removes every blob no index entry reaches. A crash
//! between the two leaves a valid layout with unreferenced blobs, which the
//! next delete (or [`crate::RegistryClient::collect_garbage`]) removes.
//!
//! The collection errs towards keeping: only manifests and indexes are read
//! (bounded by `--max-manifest-bytes`, hashed as they are read), never a
//! config or a layer, so a large layer costs nothing; a manifest that is
//! there but cannot be read, verified or parsed may reference anything, so
//! nothing is removed while one is; and a blob younger than
//! `--layout-gc-grace-seconds` stays, since a copy in progress (`skopeo`,
//! `oras`) writes its blobs before the index names them.
//! Writers of one layout directory are serialized by an advisory lock on
//! `.index.json.lock` beside `index.json` (`flock`, which the file system
//! shares between processes): the purger deletes several digests at once,
//! two purger replicas may share a layout, and each delete rewrites the same
//! `index.json` from what it read; unserialized, an update is lost and the
//! collection then removes blobs still referenced. A tool that does not take
//! the lock (`skopeo copy`) writes its blobs before naming them, which the
//! collection's grace covers.

use std::{
    collections::HashSet,
    io::{Read, Write},
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use oci_spec::image::{Descriptor, ImageIndex};
use sha2::{Digest, Sha256};

use crate::{RegistryError, RepositoryRef, Result};

pub use crate::reference::{LAYOUT_SCHEME, layout_root};
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// The advisory lock of a layout directory, held while its index is read,
/// rewritten and collected (module doc); released when dropped (closed).
#[derive(Debug)]
struct Locked(#[allow(dead_code)] std::fs::File);

/// Waits for, then holds, the lock of layout `dir`.
fn lock(dir: &Path, what: &str) -> Result<Locked> {
    let path = dir.join(".index.json.lock");
    let io = |e: std::io::Error| error(what, format!("locking {}: {e}", path.display()));
    let file = std::fs::File::options().create(true).truncate(false).write(true).open(&path).map_err(io)?;
    file.lock().map_err(io)?;
    Ok(Locked(file))
}

/// One repository of a layout.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    dir: PathBuf,
    /// `None`: the directory is the repository's own layout; `Some(R)`: the
    /// entries named `R:<tag>` of a shared layout.
    prefix: Option<String>,
    what: String,
    /// A larger manifest is not read.
    max_manifest_bytes: usize,
    /// Unreferenced blobs younger than this stay.
    grace: Duration,
}

fn error(what: &str, problem: impl std::fmt::Display) -> RegistryError {
    RegistryError::Layout { what: what.to_string(), problem: problem.to_string() }
}

impl Layout {
    /// The layout repository `repo` names, `None` when it is a real registry.
    /// `config` gives the manifest size limit and the collection's grace.
    pub(crate) fn of(repo: &RepositoryRef, config: &crate::TransportConfig) -> Result<Option<Self>> {
        let Some(root) = layout_root(&repo.registry) else {
            return Ok(None);
        };
        let what = repo.to_string();
        let (max_manifest_bytes, grace) = (config.max_manifest_bytes, config.layout_gc_grace);
        let own = root.join(&repo.repository);
        if own.join("index.json").is_file() {
            return Ok(Some(Self { dir: own, prefix: None, what, max_manifest_bytes, grace }));
        }
        if root.join("index.json").is_file() {
            let prefix = Some(repo.repository.clone());
            return Ok(Some(Self { dir: root.to_path_buf(), prefix, what, max_manifest_bytes, grace }));
        }
        Err(RegistryError::NotFound {
            what: format!("OCI image layout {what}"),
            code: format!("neither {}/index.json nor {}/index.json exists", own.display(), root.display()),
        })
    }

    fn index_path(&self) -> PathBuf {
        self.dir.join("index.json")
    }

    fn read_index(&self) -> Result<ImageIndex> {
        ImageIndex::from_file(self.index_path()).map_err(|e| error(&self.what, format!("index.json: {e}")))
    }

    /// The tag an entry gives this repository, if it belongs to it.
    fn tag_of(&self, entry: &Descriptor) -> Option<String> {
        let name = entry.annotations().as_ref()?.get(REF_NAME)?;
        match &self.prefix {
            // A bare tag, or a full reference whose tag is after the last ':'.
            None => Some(match name.rsplit_once(':') {
                Some((_, tag)) if !tag.contains('/') => tag.to_string(),
                _ => name.clone(),
            }),
            Some(repository) => {
                let (named, tag) = name.rsplit_once(':')?;
                (named == repository || named.ends_with(&format!("/{repository}"))).then(|| tag.to_string())
            }
        }
    }

    /// `(tag, digest, media type)` of every tagged entry of the repository.
    pub(crate) fn entries(&self) -> Result<Vec<(String, String, String)>> {
        let index = self.read_index()?;
        Ok(index
            .manifests()
            .iter()
            .filter_map(|m| self.tag_of(m).map(|t| (t, m.digest().to_string(), m.media_type().to_string())))
            .collect())
    }

    pub(crate) fn tags(&self) -> Result<Vec<String>> {
        Ok(self.entries()?.into_iter().map(|(tag, _, _)| tag).collect())
    }

    /// `(digest, media type)` that `reference` (a tag or a digest) names.
    pub(crate) fn resolve(&self, reference: &str) -> Result<Option<(String, String)>> {
        let entries = self.entries()?;
        let found = entries.into_iter().find(|(tag, digest, _)| {
            if reference.starts_with("sha256:") { digest == reference } else { tag == reference }
        });
        match found {
            Some((_, digest, media_type)) => Ok(Some((digest, media_type))),
            // A child of an index is addressable by digest too.
            None if self.prefix.is_none()
                && reference.starts_with("sha256:")
                && self.blob_path(reference).is_some_and(|p| p.is_file()) =>
            {
                Ok(Some((reference.to_string(), String::new())))
            }
            None => Ok(None),
        }
    }

    fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        let hex = digest.strip_prefix("sha256:")?;
        (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()))
            .then(|| self.dir.join("blobs/sha256").join(hex))
    }

    /// The content of the manifest (or index) blob `digest`, read up to
    /// the manifest size limit and checked against its digest; `None` when
    /// absent.
    pub(crate) fn manifest(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        let path = self
            .blob_path(digest)
            .ok_or_else(|| error(&self.what, format!("{digest:?} is not a sha256 digest")))?;
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(error(&self.what, format!("{}: {e}", path.display()))),
        };
        let mut bytes = Vec::new();
        let limit = self.max_manifest_bytes;
        file.take(limit as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| error(&self.what, format!("{}: {e}", path.display())))?;
        if bytes.len() > limit {
            return Err(RegistryError::TooLarge { what: format!("{} manifest {digest}", self.what), limit });
        }
        let actual = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        if actual != digest {
            return Err(error(
                &self.what,
                format!("blob {digest} holds content of digest {actual}: the layout is corrupt"),
            ));
        }
        Ok(Some(bytes))
    }

    /// Removes every entry of this repository pointing to `digest` from
    /// `index.json` (atomically), then the blobs nothing references any
    /// more. `false` when no entry pointed to it.
    pub(crate) fn delete(&self, digest: &str) -> Result<bool> {
        let _held = lock(&self.dir, &self.what)?;
        let mut index = self.read_index()?;
        let before = index.manifests().len();
        let kept: Vec<Descriptor> = index
            .manifests()
            .iter()
            // In a shared layout, another repository's entry on the same
            // digest stays (and so does its blob).
            .filter(|m| {
                !(m.digest().to_string() == digest && (self.prefix.is_none() || self.tag_of(m).is_some()))
            })
            .cloned()
            .collect();
        let removed = kept.len() != before;
        if removed {
            index.set_manifests(kept);
            self.write_index(&index)?;
        }
        self.collect_garbage_locked()?;
        Ok(removed)
    }

    /// `index.json` replaced atomically: write a temporary file, fsync it,
    /// rename it over, fsync the directory.
    fn write_index(&self, index: &ImageIndex) -> Result<()> {
        let text = index.to_string_pretty().map_err(|e| error(&self.what, e))?;
        let temporary = self.dir.join(".index.json.tmp");
        let io = |e: std::io::Error| error(&self.what, format!("rewriting index.json: {e}"));
        let mut file = std::fs::File::create(&temporary).map_err(io)?;
        file.write_all(text.as_bytes()).map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&temporary, self.index_path()).map_err(io)?;
        std::fs::File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io)
    }

    /// Removes the blobs no entry of `index.json` reaches (through
    /// manifests, their config and layers, and index children) and that are
    /// older than the grace; returns how many. Only manifests are read; one
    /// that cannot be read keeps everything (module doc).
    pub(crate) fn collect_garbage(&self) -> Result<usize> {
        let _held = lock(&self.dir, &self.what)?;
        self.collect_garbage_locked()
    }

    fn collect_garbage_locked(&self) -> Result<usize> {
        let Some(reached) = self.reachable()? else { return Ok(0) };
        let blobs = self.dir.join("blobs/sha256");
        let listing = match std::fs::read_dir(&blobs) {
            Ok(listing) => listing,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(error(&self.what, format!("{}: {e}", blobs.display()))),
        };
        let now = SystemTime::now();
        let mut removed = 0;
        for file in listing.flatten() {
            let name = file.file_name().to_string_lossy().to_string();
            if reached.contains(&format!("sha256:{name}")) {
                continue;
            }
            // Unknown age (no mtime, or one in the future) is young: kept.
            let modified = file.metadata().and_then(|m| m.modified()).ok();
            let age = modified.and_then(|m| now.duration_since(m).ok());
            if age.is_none_or(|age| age < self.grace) {
                continue;
            }
            std::fs::remove_file(file.path())
                .map_err(|e| error(&self.what, format!("removing blob {name}: {e}")))?;
            removed += 1;
        }
        Ok(removed)
    }

    /// Every digest `index.json` reaches, reading manifests and indexes
    /// only; `None` when a manifest that is there cannot be read, verified
    /// or parsed (it may reference any blob).
    fn reachable(&self) -> Result<Option<HashSet<String>>> {
        let index = self.read_index()?;
        let mut reached: HashSet<String> = HashSet::new();
        let mut pending: Vec<String> = index.manifests().iter().map(|m| m.digest().to_string()).collect();
        while let Some(digest) = pending.pop() {
            if !reached.insert(digest.clone()) {
                continue;
            }
            let parsed = self.manifest(&digest).and_then(|bytes| {
                bytes
                    .map(|b| serde_json::from_slice::<serde_json::Value>(&b))
                    .transpose()
                    .map_err(|e| error(&self.what, e))
            });
            let value = match parsed {
                Ok(Some(value)) => value,
                // Absent: it references nothing that is here.
                Ok(None) => continue,
                Err(problem) => {
                    tracing::warn!(layout = %self.what, manifest = %digest, %problem, "a manifest cannot be read: no blob of the layout is collected until it can");
                    return Ok(None);
                }
            };
            let digest_of = |d: &serde_json::Value| d.get("digest")?.as_str().map(String::from);
            // Manifests (index children, a subject) are read in turn; a
            // config, layers and an artifact's blobs are leaves, never read.
            pending.extend(
                value.get("manifests").and_then(|v| v.as_array()).into_iter().flatten().filter_map(digest_of),
            );
            pending.extend(value.get("subject").and_then(digest_of));
            let leaves = value.get("layers").and_then(|v| v.as_array()).into_iter().flatten();
            let leaves = leaves.chain(value.get("blobs").and_then(|v| v.as_array()).into_iter().flatten());
            reached.extend(leaves.chain(value.get("config")).filter_map(digest_of));
        }
        Ok(Some(reached))
    }
}

/// The repositories of the layout directory `root`: each directory below it
/// holding an `index.json` (its path is the repository), and each `R` of a
/// root `index.json` entry named `R:<tag>`.
pub(crate) fn repositories(root: &Path) -> Result<Vec<String>> {
    let what = format!("{LAYOUT_SCHEME}{}", root.display());
    if !root.is_dir() {
        return Err(RegistryError::NotFound {
            what: format!("OCI image layout {what}"),
            code: format!("{} is not a directory", root.display()),
        });
    }
    let mut found = Vec::new();
    let mut pending = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = pending.pop() {
        let listing = std::fs::read_dir(&dir).map_err(|e| error(&what, format!("{}: {e}", dir.display())))?;
        for entry in listing.flatten() {
            let path = entry.path();
            if !path.is_dir() || entry.file_name() == "blobs" || depth >= 6 {
                continue;
            }
            if path.join("index.json").is_file() {
                if let Ok(relative) = path.strip_prefix(root) {
                    found.push(relative.to_string_lossy().replace('\\', "/"));
                }
            } else {
                pending.push((path, depth + 1));
            }
        }
    }
    if root.join("index.json").is_file() {
        let index = ImageIndex::from_file(root.join("index.json"))
            .map_err(|e| error(&what, format!("index.json: {e}")))?;
        for entry in index.manifests() {
            let name = entry.annotations().as_ref().and_then(|a| a.get(REF_NAME));
            if let Some((repository, _)) = name.and_then(|n| n.rsplit_once(':'))
                && !found.iter().any(|f| f == repository)
            {
                found.push(repository.to_string());
            }
        }
    }
    found.sort();
    Ok(found)
}
