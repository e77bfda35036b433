//! Fenced leases: one worker at a time per named resource across replicas
//! (a JukeBox's scans, a repository's purge), that expire with a holder that
//! dies or stops answering.
//!
//! Each acquisition gets its own token; the lease is held by the token, not
//! by the process, so a worker frozen past its lease (a `SIGSTOP`, a long GC
//! pause, a partitioned node) cannot mistake a lease someone else took
//! meanwhile for its own. The keeper renews only while the token still holds
//! the lease and never takes it back once lost (a released or stolen lease
//! stays lost). A worker calls [`Lease::check`] — one store call — right before
//! each external write (a status write, a DELETE) and stops if it fails; its
//! Redis-side writes name the lease in the same script ([`Fence`]), so they
//! are conditional on the token atomically.
//!
//! With replicas ([`crate::primary`]), an acquisition, a renewal and a
//! fenced write count only once the replicas the connection waits for have
//! them (`WAIT`): a lease a failover could lose is never held, so two
//! workers never both start under it. What a failover can still lose is a
//! write made after that (a renewal that failed to replicate shortens the
//! lease on the new primary, and the next [`Lease::check`] there says so).
//!
//! What remains is the window between the check and the write reaching its
//! server, bounded by that request's timeouts, which must stay shorter than
//! the lease: a JukeBox status write reaches the API server within the
//! client's connect + write timeouts (2 × [`vynil_kube::WRITE_WINDOW`], 20 s,
//! against the scanner's 30 s lease); a purger's DELETE is sent once (no
//! transport retry) within `--registry-timeout-seconds` (10 s by default,
//! and the purger refuses a lease not longer than twice it, room for a token
//! fetch). A write sent after the check lands before anyone else could have
//! taken the lease, or not at all.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{StoreError, redis_error};

/// Where leases live: Redis (shared by replicas) or process memory.
#[async_trait::async_trait]
pub trait LeaseStore: Send + Sync + std::fmt::Debug {
    /// Takes `name` for `token` unless another token holds it.
    async fn acquire(&self, name: &str, token: &str, ttl: Duration) -> Result<bool, StoreError>;
    /// Extends `name` only while `token` holds it.
    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<bool, StoreError>;
    /// The token holding `name`, if any.
    async fn holder(&self, name: &str) -> Result<Option<String>, StoreError>;
    /// Frees `name` if `token` holds it.
    async fn release(&self, name: &str, token: &str) -> Result<(), StoreError>;
    /// The Redis key of `name` (for scripts that write under the lease).
    fn key(&self, name: &str) -> String;
}

/// Leases in Redis, under `<prefix>:<name>`.
#[derive(Clone)]
pub struct RedisLeases {
    connection: crate::RedisConnection,
    prefix: String,
}

impl std::fmt::Debug for RedisLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLeases").field("prefix", &self.prefix).finish_non_exhaustive()
    }
}

impl RedisLeases {
    pub fn new(connection: crate::RedisConnection, prefix: &str) -> Self {
        Self { connection, prefix: prefix.to_string() }
    }

    /// `script(KEYS[1] = the lease, ARGV = token, ttl in ms)`, answering 1
    /// or 0, once the replicas the connection waits for have it.
    async fn run(&self, script: &str, name: &str, token: &str, ttl: Duration) -> Result<bool, StoreError> {
        let mut pipeline = redis::pipe();
        pipeline.cmd("EVAL").arg(script).arg(1).arg(self.key(name)).arg(token).arg(millis(ttl));
        let answer: i64 = self.connection.replicated(pipeline).await?;
        Ok(answer == 1)
    }
}

const ACQUIRE: &str = r"
local current = redis.call('GET', KEYS[1])
if current == false or current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0";

const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0";

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[async_trait::async_trait]
impl LeaseStore for RedisLeases {
    async fn acquire(&self, name: &str, token: &str, ttl: Duration) -> Result<bool, StoreError> {
        let acquired = self.run(ACQUIRE, name, token, ttl).await;
        if acquired.is_err() {
            // Not replicated in time (or unknown): not held, and not left
            // to block the others until it expires.
            let _ = self.release(name, token).await;
        }
        acquired
    }

    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<bool, StoreError> {
        self.run(RENEW, name, token, ttl).await
    }

    async fn holder(&self, name: &str) -> Result<Option<String>, StoreError> {
        let mut c = self.connection.clone();
        redis::cmd("GET").arg(self.key(name)).query_async(&mut c).await.map_err(redis_error)
    }

    async fn release(&self, name: &str, token: &str) -> Result<(), StoreError> {
        let mut c = self.connection.clone();
        let script = redis::Script::new(RELEASE);
        let _: i64 = script.key(self.key(name)).arg(token).invoke_async(&mut c).await.map_err(redis_error)?;
        Ok(())
    }

    fn key(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }
}

/// Leases of a single process.
#[derive(Debug, Default)]
pub struct MemoryLeases {
    held: Mutex<HashMap<String, (String, Instant)>>,
}

impl MemoryLeases {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, (String, Instant)>) -> T) -> T {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.retain(|_, (_, until)| *until > Instant::now());
        f(&mut held)
    }
}

#[async_trait::async_trait]
impl LeaseStore for MemoryLeases {
    async fn acquire(&self, name: &str, token: &str, ttl: Duration) -> Result<bool, StoreError> {
        Ok(self.with(|held| match held.get(name) {
            Some((holder, _)) if holder != token => false,
            _ => {
                held.insert(name.to_string(), (token.to_string(), Instant::now() + ttl));
                true
            }
        }))
    }

    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<bool, StoreError> {
        Ok(self.with(|held| match held.get_mut(name) {
            Some((holder, until)) if holder == token => {
                *until = Instant::now() + ttl;
                true
            }
            _ => false,
        }))
    }

    async fn holder(&self, name: &str) -> Result<Option<String>, StoreError> {
        Ok(self.with(|held| held.get(name).map(|(holder, _)| holder.clone())))
    }

    async fn release(&self, name: &str, token: &str) -> Result<(), StoreError> {
        self.with(|held| {
            if held.get(name).is_some_and(|(holder, _)| holder == token) {
                held.remove(name);
            }
        });
        Ok(())
    }

    fn key(&self, name: &str) -> String {
        name.to_string()
    }
}

/// A new token for one acquisition.
pub fn new_token(holder: &str) -> String {
    format!("{holder}:{:016x}", fastrand::u64(..))
}

/// The lease of some names, held by one token, renewed until released or lost.
#[derive(Debug)]
pub struct Lease {
    store: Arc<dyn LeaseStore>,
    names: Vec<String>,
    token: String,
    lost: Arc<AtomicBool>,
    keeper: tokio::task::JoinHandle<()>,
}

/// Why a worker must stop writing.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("the lease on {0} was lost (another replica holds it now); this worker stops writing")]
    Lost(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Lease {
    /// Takes every one of `names` for a new token of `holder`, or none.
    pub async fn acquire(
        store: Arc<dyn LeaseStore>,
        names: Vec<String>,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let token = new_token(holder);
        for (index, name) in names.iter().enumerate() {
            if !store.acquire(name, &token, ttl).await? {
                for taken in &names[..index] {
                    store.release(taken, &token).await?;
                }
                return Ok(None);
            }
        }
        Ok(Some(Self::adopt(store, names, token, ttl)))
    }

    /// A lease `token` already took (in a script of its own, with other
    /// writes), kept and checked from now on.
    pub fn adopt(store: Arc<dyn LeaseStore>, names: Vec<String>, token: String, ttl: Duration) -> Lease {
        let lost = Arc::new(AtomicBool::new(false));
        let keeper = {
            let (store, names, token, lost) = (store.clone(), names.clone(), token.clone(), lost.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(ttl / 3).await;
                    for name in &names {
                        match store.renew(name, &token, ttl).await {
                            Ok(true) => {}
                            Ok(false) => {
                                tracing::warn!(%name, "lost the lease; this worker stops writing");
                                lost.store(true, Ordering::Release);
                                return;
                            }
                            // Unknown is not lost: the next renewal (or check) decides.
                            Err(error) => tracing::warn!(%name, %error, "cannot renew the lease; retrying"),
                        }
                    }
                }
            })
        };
        Lease { store, names, token, lost, keeper }
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether this token still holds every name: one store call per name,
    /// to make right before an external write.
    pub async fn check(&self) -> Result<(), LeaseError> {
        if self.lost.load(Ordering::Acquire) {
            return Err(LeaseError::Lost(self.names.join(", ")));
        }
        for name in &self.names {
            if self.store.holder(name).await?.as_deref() != Some(self.token.as_str()) {
                self.lost.store(true, Ordering::Release);
                return Err(LeaseError::Lost(name.clone()));
            }
        }
        Ok(())
    }

    /// What a Redis script needs to write under this lease's `name`.
    pub fn fence(&self, name: &str) -> Fence {
        Fence { key: self.store.key(name), token: self.token.clone() }
    }

    /// Stops renewing and frees every name still held by this token.
    pub async fn release(self) {
        self.keeper.abort();
        for name in &self.names {
            if let Err(error) = self.store.release(name, &self.token).await {
                tracing::warn!(%name, %error, "cannot release a lease; it expires by itself");
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// The lease key and token a Redis-side write checks in its own script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub key: String,
    pub token: String,
}

impl Fence {
    /// Lua ending the script with `0` unless `KEYS[1]` (the lease) holds
    /// `ARGV[1]` (the token): a script's first key and argument.
    const GUARD: &'static str = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end\n";
}

/// Runs the Lua `body` in one script, after the fence's check when `fence` is
/// given: `Ok(false)` (nothing written) when the lease no longer holds its
/// token. The body's own keys start at `KEYS[2]` and its arguments at
/// `ARGV[2]`; it returns 1.
pub async fn run_fenced(
    connection: &crate::RedisConnection,
    fence: Option<&Fence>,
    body: &str,
    keys: &[&str],
    args: &[&str],
) -> Result<bool, StoreError> {
    let guard = if fence.is_some() { Fence::GUARD } else { "" };
    let mut pipeline = redis::pipe();
    let eval = pipeline.cmd("EVAL").arg(format!("{guard}{body}")).arg(keys.len() + 1);
    eval.arg(fence.map_or("", |f| f.key.as_str()));
    for key in keys {
        eval.arg(*key);
    }
    eval.arg(fence.map_or("", |f| f.token.as_str()));
    for arg in args {
        eval.arg(*arg);
    }
    let written: i64 = if fence.is_some() {
        connection.replicated(pipeline).await?
    } else {
        let mut c = connection.clone();
        let (written,): (i64,) = pipeline.query_async(&mut c).await.map_err(redis_error)?;
        written
    };
    Ok(written == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lost_lease_fails_its_check_and_is_never_renewed_back() {
        let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeases::default());
        let ttl = Duration::from_millis(300);
        let first = Lease::acquire(store.clone(), vec!["box".into()], "a", ttl).await.unwrap().unwrap();
        first.check().await.unwrap();
        assert!(Lease::acquire(store.clone(), vec!["box".into()], "b", ttl).await.unwrap().is_none());
        // Someone else takes it (as after an expiry while the first was frozen).
        store.release("box", first.token()).await.unwrap();
        let second = Lease::acquire(store.clone(), vec!["box".into()], "b", ttl).await.unwrap().unwrap();
        assert!(matches!(first.check().await, Err(LeaseError::Lost(_))));
        tokio::time::sleep(ttl).await;
        assert_eq!(
            store.holder("box").await.unwrap().as_deref(),
            Some(second.token()),
            "no renewal took it back"
        );
        first.release().await;
        assert_eq!(
            store.holder("box").await.unwrap().as_deref(),
            Some(second.token()),
            "nor did the release"
        );
    }

    #[tokio::test]
    async fn several_names_are_taken_all_or_none() {
        let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeases::default());
        let ttl = Duration::from_secs(5);
        let held = Lease::acquire(store.clone(), vec!["r/b".into()], "a", ttl).await.unwrap().unwrap();
        let names = vec!["r/a".to_string(), "r/b".to_string()];
        assert!(Lease::acquire(store.clone(), names, "b", ttl).await.unwrap().is_none());
        assert_eq!(store.holder("r/a").await.unwrap(), None, "the first name was given back");
        held.check().await.unwrap();
    }
}
