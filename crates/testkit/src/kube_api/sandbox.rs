//! A container's filesystem view, as the kubelet gives it: the Job runner
//! (`kubelet`) starts each container as
//! `unshare --user --map-root-user --mount --propagation private vynil-pod <spec.json>`,
//! and `vynil-pod` ([`enter`]) builds, inside that private mount namespace,
//! a root where every mount of the container sits at its **real absolute
//! path** (`/var/run/secrets/kubernetes.io/serviceaccount/token`,
//! `/dev/termination-log`, `/package`, `/etc/vynil`…), then `chroot`s into
//! it and `exec`s the container's program.
//!
//! Why a mount namespace and not a path prefix the programs would honour:
//! a foreign binary (upstream's agent, any kube client's in-cluster
//! configuration) reads those fixed paths and cannot be taught a prefix; a
//! mount namespace lets it run unchanged, and our own executables (the fake
//! agent, the reaper) run exactly as in their pod. `unshare --user` needs no
//! privilege where unprivileged user namespaces are allowed, and as root
//! everywhere (the CI machines run as root; checked by the runner at start,
//! which fails naming the cause when the kernel refuses).
//!
//! The root is a tmpfs holding the host's own tree bound in, entry by entry,
//! except along the path to each mount, where a directory of the tmpfs
//! stands instead (so `/etc/vynil` can be added without touching the
//! host's `/etc`). Nothing is written to the host's filesystem. Not
//! emulated: the image's own filesystem (the host's is seen instead), user
//! ids (`runAsUser` is ignored: the program runs as the mapped root), and
//! the network (the host's loopback, where the fake API server listens).

use std::{
    collections::BTreeSet,
    convert::Infallible,
    os::unix::process::CommandExt,
    path::{Component, Path, PathBuf},
};

use nix::mount::{MsFlags, mount};
use serde::{Deserialize, Serialize};

/// What `vynil-pod` builds and runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// An empty host directory that becomes the container's `/`.
    pub root: PathBuf,
    pub mounts: Vec<SandboxMount>,
    /// The image's entrypoint (a host path, seen at the same path inside).
    pub program: PathBuf,
    pub args: Vec<String>,
    pub working_dir: Option<String>,
}

/// A host file or directory bound at `target` inside.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxMount {
    pub target: PathBuf,
    pub source: PathBuf,
    pub read_only: bool,
}

fn fail(doing: &str, path: &Path, e: impl std::fmt::Display) -> String {
    format!("vynil-pod: {doing} {}: {e}", path.display())
}

fn bind(source: &Path, target: &Path, recursive: bool) -> Result<(), String> {
    let flags = if recursive { MsFlags::MS_BIND | MsFlags::MS_REC } else { MsFlags::MS_BIND };
    mount(Some(source), target, None::<&str>, flags, None::<&str>).map_err(|e| fail("binding", source, e))
}

/// `path` with every symbolic link of its longest existing prefix resolved
/// on the host (`/var/run/…` is `/run/…` on Debian): the tree is built
/// along real directories.
fn resolve(path: &Path) -> PathBuf {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    while !existing.exists() {
        let Some(name) = existing.file_name().map(|n| n.to_os_string()) else { break };
        rest.push(name);
        existing.pop();
    }
    let mut resolved = std::fs::canonicalize(&existing).unwrap_or(existing);
    resolved.extend(rest.iter().rev());
    resolved
}

fn inside(root: &Path, path: &Path) -> PathBuf {
    let mut at = root.to_path_buf();
    at.extend(path.components().filter(|c| matches!(c, Component::Normal(_))));
    at
}

/// Fills `root/dir` with the host's `dir`: a directory along a mount's path
/// is made again (and filled the same way), anything else is bound in.
fn populate(root: &Path, dir: &Path, shadowed: &BTreeSet<PathBuf>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| fail("reading", dir, e))?;
    for entry in entries.flatten() {
        let host = entry.path();
        let at = inside(root, &host);
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_symlink() {
            if let Ok(link) = std::fs::read_link(&host) {
                std::os::unix::fs::symlink(link, &at).map_err(|e| fail("linking", &at, e))?;
            }
        } else if shadowed.contains(&host) {
            std::fs::create_dir(&at).map_err(|e| fail("creating", &at, e))?;
            populate(root, &host, shadowed)?;
        } else if kind.is_dir() {
            std::fs::create_dir(&at).map_err(|e| fail("creating", &at, e))?;
            bind(&host, &at, true)?;
        } else {
            std::fs::File::create(&at).map_err(|e| fail("creating", &at, e))?;
            // A socket or device that cannot be bound is left out, as an
            // image would not have it.
            let _ = bind(&host, &at, false);
        }
    }
    Ok(())
}

/// Builds the container's root and runs its program; returns only on failure.
pub fn enter(spec: &SandboxSpec) -> Result<Infallible, String> {
    let none = None::<&str>;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .map_err(|e| fail("making private", Path::new("/"), e))?;
    mount(Some("tmpfs"), &spec.root, Some("tmpfs"), MsFlags::empty(), Some("mode=0755"))
        .map_err(|e| fail("mounting a tmpfs at", &spec.root, e))?;
    let targets: Vec<PathBuf> = spec.mounts.iter().map(|m| resolve(&m.target)).collect();
    let shadowed: BTreeSet<PathBuf> = targets
        .iter()
        .flat_map(|t| t.ancestors().skip(1))
        .filter(|a| a.parent().is_some())
        .map(Path::to_path_buf)
        .collect();
    populate(&spec.root, Path::new("/"), &shadowed)?;
    for dir in &shadowed {
        let at = inside(&spec.root, dir);
        std::fs::create_dir_all(&at).map_err(|e| fail("creating", &at, e))?;
    }
    for (mount_spec, target) in spec.mounts.iter().zip(&targets) {
        let at = inside(&spec.root, target);
        if mount_spec.source.is_dir() {
            std::fs::create_dir_all(&at).map_err(|e| fail("creating", &at, e))?;
        } else if !at.exists() {
            std::fs::File::create(&at).map_err(|e| fail("creating", &at, e))?;
        }
        bind(&mount_spec.source, &at, true)?;
        if mount_spec.read_only {
            let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
            mount(none, &at, none, flags, none).map_err(|e| fail("making read-only", &at, e))?;
        }
    }
    nix::unistd::chroot(&spec.root).map_err(|e| fail("chroot to", &spec.root, e))?;
    let dir = spec.working_dir.as_deref().unwrap_or("/");
    std::env::set_current_dir(dir).map_err(|e| fail("entering", Path::new(dir), e))?;
    let error = std::process::Command::new(&spec.program).args(&spec.args).exec();
    Err(fail("starting", &spec.program, error))
}

/// `vynil-pod <spec.json>`: what the binary does.
pub fn main_with_args(args: &[String]) -> i32 {
    let Some(path) = args.get(1) else {
        eprintln!("usage: vynil-pod <spec.json> (run by the fake API server's Job runner)");
        return 2;
    };
    let spec = std::fs::read(path).map_err(|e| fail("reading", Path::new(path), e)).and_then(|bytes| {
        serde_json::from_slice::<SandboxSpec>(&bytes).map_err(|e| fail("parsing", Path::new(path), e))
    });
    let error = match spec.and_then(|spec| enter(&spec)) {
        Ok(never) => match never {},
        Err(error) => error,
    };
    eprintln!("{error}");
    // The kubelet's code for a container that could not start.
    128
}
