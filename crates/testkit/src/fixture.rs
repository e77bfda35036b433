//! Registry content built once and reused.
//!
//! Publishing thousands of tags takes seconds to minutes; tests that only need
//! to *read* such a repository should not each pay for it. A fixture is keyed by
//! a name the caller derives from its content (bump it when the content
//! changes): the first test to need it publishes into a fresh registry, stops
//! it and snapshots its storage under the fixture cache; every later test (in
//! this run or the next) starts its own registry on a private copy. Two tests
//! racing to build the same fixture both build it; the first rename wins.

use std::path::{Path, PathBuf};

use crate::{RegistryOptions, RegistryServer, Result, TestkitError, io};

const COMPLETE_MARKER: &str = ".complete";

/// Where fixtures are cached: `$VYNIL_TESTKIT_FIXTURES`, else a folder in the
/// system temp dir.
fn cache_root() -> PathBuf {
    std::env::var_os("VYNIL_TESTKIT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("vynil-testkit-fixtures"))
}

impl RegistryServer {
    /// A registry holding the fixture `key`, built by `build` the first time.
    pub async fn from_fixture<F, Fut>(key: &str, build: F) -> Result<Self>
    where
        F: FnOnce(RegistryServer) -> Fut,
        Fut: std::future::Future<Output = Result<RegistryServer>>,
    {
        validate_key(key)?;
        let cached = cache_root().join(key);
        if !cached.join(COMPLETE_MARKER).is_file() {
            let registry = build(RegistryServer::start().await?).await?;
            snapshot(registry, &cached)?;
        }
        let dir = tempfile::tempdir().map_err(io("creating a registry directory"))?;
        copy_tree(&cached.join("data"), &dir.path().join("data"))?;
        RegistryServer::start_in(dir, RegistryOptions::default()).await
    }
}

fn validate_key(key: &str) -> Result<()> {
    let ok = !key.is_empty()
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !key.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(TestkitError::Fixture(format!(
            "fixture key {key:?} must be non-empty [A-Za-z0-9._-] not starting with '.'"
        )))
    }
}

fn snapshot(mut registry: RegistryServer, cached: &Path) -> Result<()> {
    registry.kill();
    let parent =
        cached.parent().ok_or_else(|| TestkitError::Fixture("fixture cache has no parent".into()))?;
    std::fs::create_dir_all(parent).map_err(io("creating the fixture cache"))?;
    let staging = tempfile::tempdir_in(parent).map_err(io("staging a fixture"))?;
    copy_tree(&registry.storage(), &staging.path().join("data"))?;
    std::fs::write(staging.path().join(COMPLETE_MARKER), b"").map_err(io("marking a fixture"))?;
    let staging = staging.keep();
    if std::fs::rename(&staging, cached).is_err() {
        // Another test won the race; its copy is as good as ours.
        let _ = std::fs::remove_dir_all(&staging);
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(io(format!("creating {}", to.display())))?;
    for entry in std::fs::read_dir(from).map_err(io(format!("reading {}", from.display())))? {
        let entry = entry.map_err(io(format!("reading {}", from.display())))?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type().map_err(io("reading a file type"))?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target).map_err(io(format!("copying to {}", target.display())))?;
        }
    }
    Ok(())
}
