//! A real `redis-server` per test, on a free loopback port: without
//! persistence, or with the append-only file `deploy/` configures.

use std::{process::Command, time::Duration};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    Result, io,
    process::{Supervised, find_binary, free_port},
};

/// A running `redis-server`, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    process: Supervised,
    port: u16,
    dir: tempfile::TempDir,
    persistence: Persistence,
}

/// Whether a [`RedisServer`] keeps its data across a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// Nothing on disk: a restart starts empty.
    Off,
    /// `--appendonly yes --appendfsync everysec`, as `deploy/base/redis.yaml`:
    /// a restart (SIGTERM, as a pod is stopped) reloads every write.
    AppendOnly,
}

impl RedisServer {
    /// Starts a server without persistence and waits until it answers `PING`.
    pub async fn start() -> Result<Self> {
        Self::start_with(Persistence::Off).await
    }

    /// Starts a server with `persistence` and waits until it answers `PING`.
    pub async fn start_with(persistence: Persistence) -> Result<Self> {
        let binary = find_binary("redis-server", "apt-get install -y redis-server")?;
        let dir = tempfile::tempdir().map_err(io("creating a Redis directory"))?;
        let mut last_error = None;
        // A free port can be taken between our probe and Redis's bind: retry.
        for _ in 0..3 {
            let port = free_port()?;
            let command = command(&binary, port, dir.path(), persistence);
            let mut process =
                Supervised::spawn(format!("redis-server :{port}"), command, &dir.path().join("redis.log"))?;
            match process.wait_ready(Duration::from_secs(10), || ping(port)).await {
                Ok(()) => {
                    return Ok(Self { process, port, dir, persistence });
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| crate::TestkitError::Fixture("redis did not start".into())))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Kills the server now (a "Redis went away" fault); the port is released.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts the server again on the same port: empty without persistence
    /// (killed), with every write reloaded from the append-only file with it
    /// (stopped by SIGTERM first, as Kubernetes stops a pod).
    pub async fn restart(&mut self) -> Result<()> {
        match self.persistence {
            Persistence::Off => self.process.kill(),
            Persistence::AppendOnly => {
                self.process.signal(nix::sys::signal::Signal::SIGTERM)?;
                self.process.wait_exit(Duration::from_secs(10)).await?;
            }
        }
        let binary = find_binary("redis-server", "apt-get install -y redis-server")?;
        let port = self.port;
        let command = command(&binary, port, self.dir.path(), self.persistence);
        let log = self.dir.path().join("redis-restarted.log");
        let mut process = Supervised::spawn(format!("redis-server :{port}"), command, &log)?;
        process.wait_ready(Duration::from_secs(10), || ping(port)).await?;
        self.process = process;
        Ok(())
    }
}

/// `redis-server` on `port`, loopback only, with `persistence`.
pub(crate) fn command(
    binary: &std::path::Path,
    port: u16,
    dir: &std::path::Path,
    persistence: Persistence,
) -> Command {
    let mut command = Command::new(binary);
    command.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--protected-mode",
        "no",
    ]);
    match persistence {
        Persistence::Off => command.args(["--appendonly", "no"]),
        Persistence::AppendOnly => command.args(["--appendonly", "yes", "--appendfsync", "everysec"]),
    };
    command.arg("--dir").arg(dir);
    command
}

/// One raw RESP round trip: enough to know the server accepts commands.
async fn ping(port: u16) -> bool {
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    if stream.write_all(b"PING\r\n").await.is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).await.is_ok() && &reply == b"+PONG\r\n"
}
