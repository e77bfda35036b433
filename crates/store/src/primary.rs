//! The Redis primary every replica writes to, followed across failovers.
//!
//! A [`RedisTarget`] says where the primary is: one URL (a single server, or a
//! managed Redis that keeps its primary behind one address), or the
//! sentinels that name it (`--redis-sentinels`, `--redis-master-name`). The
//! URL's user, password and database also serve the primary Sentinel names,
//! so the credentials stay in the Secret that holds `REDIS_URL` today.
//!
//! [`RedisConnection`] is what every Redis user of the services holds (the
//! `redis` crate's `ConnectionManager`, which reconnects to one fixed
//! address, wrapped): when a command fails in a way a failover explains (the
//! connection refused or dropped, a timeout, `READONLY` from a primary
//! demoted to replica), it asks the sentinels again and, when they name
//! another primary, sends the following commands there. The failed command
//! is not replayed: the caller's retry decides, as after any outage.
//!
//! Replication is asynchronous, so a write a primary acknowledged may be
//! missing from the replica promoted after it. [`RedisConnection::replicated`]
//! sends a write and `WAIT <replicas> <timeout>` on the same connection, in
//! one pipeline, and fails unless enough replicas have it: the leases and
//! every write fenced by one use it (see [`crate::lease`]), so no guarded
//! work starts on a lease a failover can lose. `WAITAOF` (Redis 7.2) is not
//! used: Debian 12 ships 7.0.

use std::{
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use redis::{
    Cmd, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisFuture, Value,
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig},
    sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType},
};

use crate::{StoreError, redis_error};

/// How many replicas must have a fenced write before the work it guards
/// starts, and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replication {
    pub replicas: u32,
    pub timeout: Duration,
}

impl Replication {
    /// No wait: a single Redis, whose restart (not a failover) is what
    /// [`crate::epoch`] reports.
    pub const NONE: Replication = Replication { replicas: 0, timeout: Duration::ZERO };
}

/// Where the primary is (see the module documentation).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTarget {
    endpoint: Endpoint,
    replication: Replication,
}

#[derive(Clone, PartialEq, Eq)]
enum Endpoint {
    Url(String),
    Sentinel {
        sentinels: Vec<String>,
        master: String,
        node: Option<String>,
        sentinel_password: Option<String>,
    },
}

impl std::fmt::Debug for RedisTarget {
    // Never the URL: it may carry a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl RedisTarget {
    /// One server at `url` (`redis://[user:password@]host:port/[db]`), no replication wait.
    pub fn url(url: impl Into<String>) -> Self {
        Self { endpoint: Endpoint::Url(url.into()), replication: Replication::NONE }
    }

    /// The primary the `sentinels` (`host:port`) name `master`; `node` (a
    /// `redis://` URL whose host is ignored) gives its user, password and
    /// database. Waits for one replica by default.
    pub fn sentinel(sentinels: Vec<String>, master: impl Into<String>, node: Option<String>) -> Self {
        Self {
            endpoint: Endpoint::Sentinel { sentinels, master: master.into(), node, sentinel_password: None },
            replication: Replication { replicas: 1, timeout: Duration::from_secs(1) },
        }
    }

    /// The sentinels' own password (`requirepass` in `sentinel.conf`).
    pub fn with_sentinel_password(mut self, password: Option<String>) -> Self {
        if let Endpoint::Sentinel { sentinel_password, .. } = &mut self.endpoint {
            *sentinel_password = password;
        }
        self
    }

    pub fn with_replication(mut self, replication: Replication) -> Self {
        self.replication = replication;
        self
    }

    pub fn replication(&self) -> Replication {
        self.replication
    }

    /// Where it points, without credentials, for logs and errors.
    pub fn describe(&self) -> String {
        match &self.endpoint {
            Endpoint::Url(url) => match url.as_str().into_connection_info() {
                Ok(info) => format!("redis at {}", info.addr()),
                Err(_) => "redis at an unparsable URL".to_string(),
            },
            Endpoint::Sentinel { sentinels, master, .. } => {
                format!("the primary {master:?} of the sentinels {}", sentinels.join(","))
            }
        }
    }

    /// A client for the primary now (asking the sentinels when there are).
    pub async fn client(&self) -> Result<redis::Client, StoreError> {
        match &self.endpoint {
            Endpoint::Url(url) => redis::Client::open(url.as_str()).map_err(redis_error),
            Endpoint::Sentinel { .. } => self.sentinel_client()?.async_get_client().await.map_err(|e| {
                StoreError::Unavailable(format!(
                    "Redis: no sentinel named a reachable primary ({}): {e}; retry when one answers",
                    self.describe()
                ))
            }),
        }
    }

    fn sentinel_client(&self) -> Result<SentinelClient, StoreError> {
        let Endpoint::Sentinel { sentinels, master, node, sentinel_password } = &self.endpoint else {
            return Err(StoreError::Config("not a Sentinel target".into()));
        };
        let mut addresses = Vec::with_capacity(sentinels.len());
        for sentinel in sentinels {
            let url = match sentinel_password {
                Some(password) => format!("redis://:{password}@{sentinel}"),
                None => format!("redis://{sentinel}"),
            };
            let info = url.as_str().into_connection_info().map_err(|e| {
                StoreError::Config(format!("--redis-sentinels: {sentinel:?} is not host:port ({e})"))
            })?;
            addresses.push(info);
        }
        let mut node_info = SentinelNodeConnectionInfo::default();
        if let Some(node) = node {
            let info: ConnectionInfo = node.as_str().into_connection_info().map_err(|e| {
                StoreError::Config(format!("REDIS_URL (the primary's credentials) does not parse: {e}"))
            })?;
            node_info = node_info.set_redis_connection_info(info.redis_settings().clone());
        }
        SentinelClient::build(addresses, master.clone(), Some(node_info), SentinelServerType::Master)
            .map_err(|e| StoreError::Config(format!("--redis-sentinels: {e}")))
    }

    /// A connection to the primary, following it across failovers.
    pub async fn connect(&self) -> Result<RedisConnection, StoreError> {
        let client = self.client().await?;
        let address = client.get_connection_info().addr().to_string();
        let manager = self.manager(client).await?;
        tracing::info!(primary = %address, target = %self.describe(), "connected to the Redis primary");
        Ok(RedisConnection {
            shared: Arc::new(Shared {
                target: self.clone(),
                current: RwLock::new(Current { manager, address, reachable: true }),
                following: tokio::sync::Mutex::new(None),
                followed: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }

    async fn manager(&self, client: redis::Client) -> Result<ConnectionManager, StoreError> {
        // The replication wait answers within its timeout: room for it.
        let response = Duration::from_millis(500) + self.replication.timeout;
        let mut config = ConnectionManagerConfig::new().set_response_timeout(Some(response));
        if let Endpoint::Sentinel { .. } = self.endpoint {
            // A primary that does not answer may be gone for good: fail
            // fast, so the next command asks the sentinels, rather than
            // retrying the old address with backoff.
            config = config.set_connection_timeout(Some(Duration::from_millis(500))).set_number_of_retries(0);
        }
        ConnectionManager::new_with_config(client, config).await.map_err(redis_error)
    }
}

/// This process's view of its primary (what its health reports): whether
/// the last command on any of its connections was answered.
static REACHABLE: std::sync::LazyLock<tokio::sync::watch::Sender<bool>> =
    std::sync::LazyLock::new(|| tokio::sync::watch::Sender::new(true));

/// Whether this process's Redis primary answers.
pub fn reachable() -> tokio::sync::watch::Receiver<bool> {
    REACHABLE.subscribe()
}

/// What a connection says about its primary (logs, tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryStatus {
    /// `host:port` of the primary in use.
    pub address: String,
    /// Whether its last command was answered.
    pub reachable: bool,
    /// Failovers this connection followed.
    pub followed: u64,
}

/// A connection to the primary, cheap to clone (see the module documentation).
#[derive(Clone)]
pub struct RedisConnection {
    shared: Arc<Shared>,
}

struct Shared {
    target: RedisTarget,
    current: RwLock<Current>,
    /// When the sentinels were last asked (one asker at a time).
    following: tokio::sync::Mutex<Option<Instant>>,
    followed: std::sync::atomic::AtomicU64,
}

struct Current {
    manager: ConnectionManager,
    address: String,
    reachable: bool,
}

/// Sentinels are asked at most this often by one connection.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(200);

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConnection").field("target", &self.shared.target).finish_non_exhaustive()
    }
}

impl RedisConnection {
    pub fn target(&self) -> &RedisTarget {
        &self.shared.target
    }

    pub fn status(&self) -> PrimaryStatus {
        let current = self.shared.current.read().unwrap_or_else(|p| p.into_inner());
        PrimaryStatus {
            address: current.address.clone(),
            reachable: current.reachable,
            followed: self.shared.followed.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    fn manager(&self) -> ConnectionManager {
        self.shared.current.read().unwrap_or_else(|p| p.into_inner()).manager.clone()
    }

    fn answered(&self, reachable: bool) {
        let mut current = self.shared.current.write().unwrap_or_else(|p| p.into_inner());
        current.reachable = reachable;
        REACHABLE.send_if_modified(|now| std::mem::replace(now, reachable) != reachable);
    }

    /// After `error`: asks the sentinels for the primary and moves there
    /// when it is another one. A single server has nothing to follow.
    async fn after(&self, error: &redis::RedisError) {
        let failover_like = error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_timeout()
            || error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
        if !failover_like {
            return;
        }
        self.answered(false);
        if matches!(self.shared.target.endpoint, Endpoint::Url(_)) {
            return;
        }
        let mut last = self.shared.following.lock().await;
        if last.is_some_and(|at| at.elapsed() < FOLLOW_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        if let Err(error) = self.follow().await {
            tracing::warn!(%error, "cannot reach the Redis primary; retrying at the next command");
        }
    }

    async fn follow(&self) -> Result<(), StoreError> {
        let client = self.shared.target.client().await?;
        let address = client.get_connection_info().addr().to_string();
        if address == self.status().address {
            return Ok(());
        }
        let manager = self.shared.target.manager(client).await?;
        let previous = {
            let mut current = self.shared.current.write().unwrap_or_else(|p| p.into_inner());
            let previous = std::mem::replace(&mut current.address, address.clone());
            current.manager = manager;
            current.reachable = true;
            previous
        };
        self.shared.followed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(%previous, primary = %address, "the sentinels name another Redis primary; following it");
        Ok(())
    }

    /// Sends `pipeline` (writes) then `WAIT` on one connection: `Ok` with
    /// the pipeline's answers once the replicas [`RedisTarget::replication`]
    /// asks for have them, else `Unavailable` (the writes may be lost in a
    /// failover; nothing they guard may start). A pipeline of one command
    /// answers that command's value.
    pub async fn replicated<T: redis::FromRedisValue>(
        &self,
        mut pipeline: Pipeline,
    ) -> Result<T, StoreError> {
        let Replication { replicas, timeout } = self.shared.target.replication;
        let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX).max(1);
        if replicas > 0 {
            pipeline.cmd("WAIT").arg(replicas).arg(millis);
        }
        let mut c = self.clone();
        let mut answers: Vec<Value> = pipeline.query_async(&mut c).await.map_err(redis_error)?;
        let acknowledged: i64 = match (replicas, answers.pop()) {
            (0, last) => {
                answers.extend(last);
                0
            }
            (_, Some(value)) => redis::from_redis_value(value).map_err(|e| redis_error(e.into()))?,
            (_, None) => 0,
        };
        if acknowledged < i64::from(replicas) {
            return Err(StoreError::Unavailable(format!(
                "Redis: a fenced write reached {acknowledged} of the {replicas} replica(s) it needs within {timeout:?} \
                 (replicas down or lagging); it may be lost in a failover, so the work it guards does not start; \
                 retry when the replicas are back"
            )));
        }
        let answers =
            if answers.len() == 1 { answers.pop().unwrap_or(Value::Nil) } else { Value::Array(answers) };
        redis::from_redis_value(answers).map_err(|e| redis_error(e.into()))
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut manager = self.manager();
            let answer = manager.req_packed_command(cmd).await;
            match &answer {
                Err(error) => self.after(error).await,
                Ok(_) => self.answered(true),
            }
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut manager = self.manager();
            let answer = manager.req_packed_commands(pipeline, offset, count).await;
            match &answer {
                Err(error) => self.after(error).await,
                Ok(_) => self.answered(true),
            }
            answer
        })
    }

    fn get_db(&self) -> i64 {
        self.manager().get_db()
    }
}
