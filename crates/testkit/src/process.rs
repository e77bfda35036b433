//! Child processes of tests: found on the PATH or reported missing, logged to a
//! file, and killed by their own PID when their owner is dropped.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{Result, TestkitError, io};

/// A loopback port that was free a moment ago: for an address nothing
/// listens on, or for a server that retries on a lost race (Redis, the
/// registry, [`crate::ServiceProcess`]). Our own servers in a test process
/// bind port 0 and report their address instead.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("finding a free port"))?;
    let port = listener.local_addr().map_err(io("finding a free port"))?.port();
    Ok(port)
}

/// Binary `name` of this workspace's package `package`, found beside the
/// running executable (`target/<profile>`, or its parent from `deps/`).
///
/// `cargo test --workspace` builds every binary with the libraries the tests
/// link. A narrower run (`cargo test -p vynil-e2e`) rebuilds a changed
/// library but not its binary: a binary older than its package's library is
/// stale, and it is built again here (under cargo, once per process), as is
/// a missing one, so a test never runs a service older than the code. (It is
/// not built unconditionally: a build of one package resolves other features
/// than the workspace's and would rebuild half the dependencies.)
pub fn workspace_binary(package: &str, name: &str) -> Result<PathBuf> {
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let exe = std::env::current_exe().map_err(io("finding the running executable"))?;
    let dir = exe.parent().map(|d| if d.ends_with("deps") { d.parent().unwrap_or(d) } else { d });
    let dir = dir.ok_or_else(|| TestkitError::Fixture(format!("{} has no directory", exe.display())))?;
    let release = dir.ends_with("release");
    let path = dir.join(name);
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    let cargo = std::env::var_os("CARGO");
    if let Some(cargo) = cargo.filter(|_| !built.iter().any(|b| b == name) && stale(dir, package, &path)) {
        let mut command = Command::new(cargo);
        command.args(["build", "--locked", "-p", package, "--bin", name]);
        if release {
            command.arg("--release");
        }
        let output = command.output().map_err(io(format!("running cargo build for {name}")))?;
        if !output.status.success() {
            return Err(TestkitError::Fixture(format!(
                "cargo build -p {package} --bin {name} failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        built.push(name.to_string());
    }
    if !path.is_file() {
        let profile = if release { " --release" } else { "" };
        return Err(TestkitError::Fixture(format!(
            "{} is not built: run `cargo build{profile} -p {package} --bin {name}`",
            path.display()
        )));
    }
    Ok(path)
}

/// Whether `binary` is missing or older than a build of its package's library.
fn stale(dir: &Path, package: &str, binary: &Path) -> bool {
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let Some(built) = modified(binary) else { return true };
    let library = format!("lib{}-", package.replace('-', "_"));
    std::fs::read_dir(dir.join("deps")).into_iter().flatten().flatten().any(|entry| {
        let file = entry.file_name();
        let file = file.to_string_lossy();
        file.starts_with(&library)
            && file.ends_with(".rlib")
            && modified(&entry.path()).is_some_and(|m| m > built)
    })
}

/// Finds `binary` on the PATH, or says which package installs it.
pub(crate) fn find_binary(binary: &'static str, hint: &'static str) -> Result<PathBuf> {
    find_binary_in(&std::env::var_os("PATH").unwrap_or_default(), binary, hint)
}

fn find_binary_in(path: &std::ffi::OsStr, binary: &'static str, hint: &'static str) -> Result<PathBuf> {
    std::env::split_paths(path)
        .map(|dir| dir.join(binary))
        .find(|candidate| candidate.is_file())
        .ok_or(TestkitError::MissingBinary { binary, hint })
}

/// A child process whose output goes to `log` and which is killed on drop.
#[derive(Debug)]
pub(crate) struct Supervised {
    pub what: String,
    child: Child,
    log: PathBuf,
}

impl Supervised {
    pub fn spawn(what: impl Into<String>, mut command: Command, log: &Path) -> Result<Self> {
        let what = what.into();
        let out = std::fs::File::create(log).map_err(io(format!("creating the log of {what}")))?;
        let err = out.try_clone().map_err(io(format!("creating the log of {what}")))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(io(format!("starting {what}")))?;
        Ok(Self { what, child, log: log.to_path_buf() })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails with the log if the process already exited.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(TestkitError::ExitedEarly {
                what: self.what.clone(),
                status: status.to_string(),
                log: self.log(),
            }),
            Ok(None) => Ok(()),
            Err(source) => Err(TestkitError::Io { doing: format!("checking {}", self.what), source }),
        }
    }

    /// Polls `ready` until it answers true, the process dies, or time runs out.
    pub async fn wait_ready<F, Fut>(&mut self, timeout: Duration, mut ready: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = Instant::now();
        loop {
            self.check_alive()?;
            // A probe may hang (another listener on the port that never
            // answers): each gets a second, and the process is checked again.
            if tokio::time::timeout(Duration::from_secs(1), ready()).await.unwrap_or(false) {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(TestkitError::NotReady {
                    what: self.what.clone(),
                    seconds: timeout.as_secs(),
                    log: self.log(),
                });
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits for the process to exit by itself, up to `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let start = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if start.elapsed() > timeout => {
                    return Err(TestkitError::NotReady {
                        what: format!("exit of {}", self.what),
                        seconds: timeout.as_secs(),
                        log: self.log(),
                    });
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(source) => {
                    return Err(TestkitError::Io { doing: format!("waiting for {}", self.what), source });
                }
            }
        }
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: nix::sys::signal::Signal) -> Result<()> {
        let pid = i32::try_from(self.pid()).map_err(|_| TestkitError::Fixture("pid out of range".into()))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)?;
        Ok(())
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_names_the_package_to_install() {
        let empty = tempfile::tempdir().unwrap();
        let error =
            find_binary_in(empty.path().as_os_str(), "redis-server", "apt-get install -y redis-server")
                .unwrap_err();
        let text = error.to_string();
        assert!(text.contains("`redis-server` is not installed"), "{text}");
        assert!(text.contains("apt-get install -y redis-server"), "{text}");
    }

    #[test]
    fn a_binary_on_the_path_is_found() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tool"), b"").unwrap();
        let found = find_binary_in(dir.path().as_os_str(), "tool", "-").unwrap();
        assert_eq!(found, dir.path().join("tool"));
    }
}
