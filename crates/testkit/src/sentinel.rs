//! Redis in Sentinel mode, as `deploy/overlays/redis-sentinel` runs it: one
//! primary, replicas, and three `redis-sentinel` processes (Debian's
//! package) agreeing on failovers with a quorum of two, all on free loopback
//! ports, without persistence. Tests kill the primary (SIGKILL) or freeze
//! replicas (SIGSTOP) and follow what the sentinels decide.

use std::{process::Command, time::Duration};

use nix::sys::signal::Signal;

use crate::{
    Persistence, Result, TestkitError, io,
    process::{Supervised, find_binary, free_port},
};

/// The name the sentinels know the primary by.
pub const MASTER_NAME: &str = "vynil";

/// How long the sentinels wait before they call a silent primary down.
const DOWN_AFTER: Duration = Duration::from_millis(1000);

/// One `redis-server` of the set.
#[derive(Debug)]
struct Node {
    port: u16,
    process: Supervised,
    frozen: bool,
}

/// A primary, its replicas and three sentinels; every process is killed on drop.
#[derive(Debug)]
pub struct RedisSentinels {
    nodes: Vec<Node>,
    sentinels: Vec<(u16, Supervised)>,
    dir: tempfile::TempDir,
}

impl RedisSentinels {
    /// A primary with `replicas` replicas, every one in sync, and three
    /// sentinels that know them all and each other.
    pub async fn start(replicas: usize) -> Result<Self> {
        let server = find_binary("redis-server", "apt-get install -y redis-server")?;
        let sentinel = find_binary("redis-sentinel", "apt-get install -y redis-sentinel")?;
        let dir = tempfile::tempdir().map_err(io("creating a Sentinel directory"))?;
        let mut nodes = Vec::new();
        for index in 0..=replicas {
            let port = free_port()?;
            let node_dir = dir.path().join(format!("node-{index}"));
            std::fs::create_dir_all(&node_dir).map_err(io("creating a node directory"))?;
            let mut command = crate::redis_server::command(&server, port, &node_dir, Persistence::Off);
            if let Some(primary) = nodes.first().map(|n: &Node| n.port) {
                command.args(["--replicaof", "127.0.0.1", &primary.to_string()]);
            }
            let process =
                answering(format!("redis-server :{port}"), command, port, &dir, &format!("node-{index}"))
                    .await?;
            nodes.push(Node { port, process, frozen: false });
        }
        let primary = nodes[0].port;
        let mut sentinels = Vec::new();
        for index in 0..3 {
            let port = free_port()?;
            let conf = dir.path().join(format!("sentinel-{index}.conf"));
            let text = format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {down}\n\
                 sentinel failover-timeout {MASTER_NAME} 4000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = dir.path().display(),
                down = DOWN_AFTER.as_millis(),
            );
            std::fs::write(&conf, text).map_err(io("writing a sentinel's configuration"))?;
            let mut command = Command::new(&sentinel);
            command.arg(&conf);
            let process = answering(
                format!("redis-sentinel :{port}"),
                command,
                port,
                &dir,
                &format!("sentinel-{index}"),
            )
            .await?;
            sentinels.push((port, process));
        }
        let set = Self { nodes, sentinels, dir };
        set.wait_known(replicas).await?;
        Ok(set)
    }

    /// Until every sentinel knows `replicas` replicas (in sync) and the two other sentinels.
    async fn wait_known(&self, replicas: usize) -> Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let mut known = true;
            for (port, _) in &self.sentinels {
                let seen_replicas = sentinel_list(*port, "REPLICAS").await.unwrap_or_default();
                let in_sync =
                    seen_replicas.iter().filter(|r| r.get("master-link-status").is_some_and(|s| s == "ok"));
                let peers = sentinel_list(*port, "SENTINELS").await.unwrap_or_default();
                known &= in_sync.count() == replicas && peers.len() == self.sentinels.len() - 1;
            }
            if known {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(TestkitError::Fixture(format!(
                    "the sentinels did not learn the {replicas} replicas and each other in 30 s; logs in {}",
                    self.dir.path().display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `host:port` of each sentinel, as `--redis-sentinels` takes them.
    pub fn sentinels(&self) -> Vec<String> {
        self.sentinels.iter().map(|(port, _)| format!("127.0.0.1:{port}")).collect()
    }

    /// `--redis-sentinels` and `--redis-master-name` for a service.
    pub fn service_args(&self) -> Vec<String> {
        vec![
            "--redis-sentinels".into(),
            self.sentinels().join(","),
            "--redis-master-name".into(),
            MASTER_NAME.into(),
        ]
    }

    /// The port of the primary the sentinels name now.
    pub async fn primary(&self) -> Result<u16> {
        for (port, _) in &self.sentinels {
            if let Some(primary) = master_port(*port).await {
                return Ok(primary);
            }
        }
        Err(TestkitError::Fixture("no sentinel names a primary".into()))
    }

    /// `redis://127.0.0.1:<port>/` of a node.
    pub fn url(port: u16) -> String {
        format!("redis://127.0.0.1:{port}/")
    }

    /// The ports of every node but the primary `primary`.
    pub fn replicas_of(&self, primary: u16) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).filter(|p| *p != primary).collect()
    }

    fn node(&mut self, port: u16) -> Result<&mut Node> {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .ok_or_else(|| TestkitError::Fixture(format!("no Redis node on port {port}")))
    }

    /// SIGKILL of the node on `port` (the primary going away without a word).
    pub fn kill(&mut self, port: u16) -> Result<()> {
        self.node(port)?.process.kill();
        Ok(())
    }

    /// SIGSTOP of the node on `port`: it holds its connections and answers nothing.
    pub fn freeze(&mut self, port: u16) -> Result<()> {
        let node = self.node(port)?;
        node.process.signal(Signal::SIGSTOP)?;
        node.frozen = true;
        Ok(())
    }

    /// Cuts every replica of `primary` off, as a partition would: each is
    /// frozen (SIGSTOP) and the primary closes their replication links
    /// (`CLIENT KILL TYPE replica`). SIGSTOP alone does not stop
    /// replication: what the primary sends lands in the frozen replica's
    /// socket buffer and is applied once it is thawed. Answers the replicas.
    pub async fn cut_off_replicas(&mut self, primary: u16) -> Result<Vec<u16>> {
        let replicas = self.replicas_of(primary);
        for port in &replicas {
            self.freeze(*port)?;
        }
        let mut c =
            connection(primary).await.ok_or_else(|| TestkitError::Fixture("primary unreachable".into()))?;
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("replica")
            .query_async::<i64>(&mut c)
            .await
            .map_err(|e| TestkitError::Fixture(format!("CLIENT KILL TYPE replica: {e}")))?;
        Ok(replicas)
    }

    /// SIGCONT of a frozen node.
    pub fn thaw(&mut self, port: u16) -> Result<()> {
        let node = self.node(port)?;
        node.process.signal(Signal::SIGCONT)?;
        node.frozen = false;
        Ok(())
    }

    /// Waits until the sentinels name a primary other than `old`, and it answers as one.
    pub async fn failed_over_from(&self, old: u16, timeout: Duration) -> Result<u16> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(primary) = self.primary().await
                && primary != old
                && role(primary).await.as_deref() == Some("master")
            {
                return Ok(primary);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(TestkitError::Fixture(format!(
                    "no failover from :{old} within {timeout:?}; logs in {}",
                    self.dir.path().display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `SENTINEL FAILOVER`: a failover without a failure (the old primary becomes a replica).
    pub async fn force_failover(&self) -> Result<()> {
        let (port, _) = &self.sentinels[0];
        let mut c =
            connection(*port).await.ok_or_else(|| TestkitError::Fixture("sentinel unreachable".into()))?;
        redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(MASTER_NAME)
            .query_async::<()>(&mut c)
            .await
            .map_err(|e| TestkitError::Fixture(format!("SENTINEL FAILOVER: {e}")))
    }
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        // A frozen process ignores nothing but SIGKILL; thawed first anyway,
        // so its connections close.
        for node in &mut self.nodes {
            if node.frozen {
                let _ = node.process.signal(Signal::SIGCONT);
            }
        }
    }
}

/// `command` started as `what`, logging to `<name>.log` in `dir`, once it answers `PING` on `port`.
async fn answering(
    what: String,
    command: Command,
    port: u16,
    dir: &tempfile::TempDir,
    name: &str,
) -> Result<Supervised> {
    let mut process = Supervised::spawn(what, command, &dir.path().join(format!("{name}.log")))?;
    process.wait_ready(Duration::from_secs(10), || answers(port, "PING")).await?;
    Ok(process)
}

async fn connection(port: u16) -> Option<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    tokio::time::timeout(Duration::from_secs(1), client.get_multiplexed_async_connection()).await.ok()?.ok()
}

async fn answers(port: u16, command: &str) -> bool {
    let Some(mut c) = connection(port).await else { return false };
    redis::cmd(command).query_async::<redis::Value>(&mut c).await.is_ok()
}

/// `ROLE`'s first element: `master`, `slave` or `sentinel`.
pub async fn role(port: u16) -> Option<String> {
    let mut c = connection(port).await?;
    let answer: Vec<redis::Value> =
        tokio::time::timeout(Duration::from_secs(1), redis::cmd("ROLE").query_async(&mut c))
            .await
            .ok()?
            .ok()?;
    redis::from_redis_value(answer.first()?.clone()).ok()
}

async fn master_port(sentinel: u16) -> Option<u16> {
    let mut c = connection(sentinel).await?;
    let address: Vec<String> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(MASTER_NAME)
        .query_async(&mut c)
        .await
        .ok()?;
    address.get(1)?.parse().ok()
}

/// `SENTINEL REPLICAS|SENTINELS <master>`, each entry as its fields.
async fn sentinel_list(sentinel: u16, what: &str) -> Option<Vec<std::collections::HashMap<String, String>>> {
    let mut c = connection(sentinel).await?;
    let entries: Vec<Vec<String>> =
        redis::cmd("SENTINEL").arg(what).arg(MASTER_NAME).query_async(&mut c).await.ok()?;
    Some(
        entries
            .into_iter()
            .map(|fields| {
                fields.chunks(2).filter_map(|p| Some((p.first()?.clone(), p.get(1)?.clone()))).collect()
            })
            .collect(),
    )
}
