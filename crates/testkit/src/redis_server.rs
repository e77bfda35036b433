//! A real `redis-server` per test, on a free loopback port, without persistence.

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
}

impl RedisServer {
    /// Starts a server and waits until it answers `PING`.
    pub async fn start() -> Result<Self> {
        let binary = find_binary("redis-server", "apt-get install -y redis-server")?;
        let dir = tempfile::tempdir().map_err(io("creating a Redis directory"))?;
        let mut last_error = None;
        // A free port can be taken between our probe and Redis's bind: retry.
        for _ in 0..3 {
            let port = free_port()?;
            let command = command(&binary, port, dir.path());
            let mut process =
                Supervised::spawn(format!("redis-server :{port}"), command, &dir.path().join("redis.log"))?;
            match process.wait_ready(Duration::from_secs(10), || ping(port)).await {
                Ok(()) => {
                    return Ok(Self { process, port, dir });
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

    /// Starts the server again on the same port (empty: no persistence).
    pub async fn restart(&mut self) -> Result<()> {
        self.process.kill();
        let binary = find_binary("redis-server", "apt-get install -y redis-server")?;
        let port = self.port;
        let command = command(&binary, port, self.dir.path());
        let log = self.dir.path().join("redis-restarted.log");
        let mut process = Supervised::spawn(format!("redis-server :{port}"), command, &log)?;
        process.wait_ready(Duration::from_secs(10), || ping(port)).await?;
        self.process = process;
        Ok(())
    }
}

/// `redis-server` on `port`, loopback only, without persistence.
fn command(binary: &std::path::Path, port: u16, dir: &std::path::Path) -> Command {
    let mut command = Command::new(binary);
    command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .arg("--dir")
        .arg(dir);
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
