//! The request queue in Redis: shared by every replica, each step one script
//! (submit, claim, complete, record) so concurrent replicas never interleave.

use std::{sync::Arc, time::Duration};

use vynil_rules::ScanScope;
use vynil_store::{
    RedisConnection, RedisTarget,
    epoch::Epoch,
    lease::{Fence, LeaseStore, RedisLeases, run_fenced},
};

use vynil_store::redis_error;

use super::*;
use crate::ScannerError;

/// The queue shared by replicas through Redis (atomic Lua scripts).
#[derive(Clone)]
pub struct RedisQueue {
    connection: RedisConnection,
    leases: Arc<RedisLeases>,
}

impl std::fmt::Debug for RedisQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisQueue")
    }
}

fn key(kind: &str, jukebox: &str) -> String {
    format!("{PREFIX}:{kind}:{jukebox}")
}

const SUBMIT: &str = r"
local field = ARGV[1]
local id = redis.call('HGET', KEYS[1], 'full')
if id then return {id, 1} end
local existing = redis.call('HGET', KEYS[1], field)
if existing then return {existing, 1} end
redis.call('HSET', KEYS[1], field, ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
return {ARGV[2], 0}";

/// Pub/sub channel announcing a new request (payload: the JukeBox): every
/// replica's worker wakes at once instead of at its next poll.
const WAKE_CHANNEL: &str = "vynil:v1:scanner:requests";

const CLAIM: &str = r"
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return false end
local running = redis.call('HGETALL', KEYS[3])
if #running > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return running
end
local pending = redis.call('HGETALL', KEYS[2])
if #pending == 0 then
  if holder then redis.call('DEL', KEYS[1]) end
  redis.call('SREM', KEYS[4], ARGV[3])
  return false
end
redis.call('HSET', KEYS[3], unpack(pending))
redis.call('DEL', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return pending";

const COMPLETE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  redis.call('DEL', KEYS[1])
end
return 1";

/// A record, and the JukeBox's latest pointer when final (under a lease's
/// fence when given).
const PUT_RECORD: &str = r"
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
if ARGV[5] == '1' then redis.call('SET', KEYS[3], ARGV[4], 'EX', ARGV[3]) end
return 1";

impl RedisQueue {
    pub async fn connect(target: &RedisTarget) -> Result<Self, ScannerError> {
        let connection = target.connect().await?;
        let leases = Arc::new(RedisLeases::new(connection.clone(), &format!("{PREFIX}:lease")));
        Ok(Self { connection, leases })
    }
}

#[async_trait::async_trait]
impl RequestQueue for RedisQueue {
    async fn announce(&self, jukebox: &str) -> Result<(), ScannerError> {
        let mut c = self.connection.clone();
        let _: i64 = redis::cmd("PUBLISH")
            .arg(WAKE_CHANNEL)
            .arg(jukebox)
            .query_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(())
    }

    async fn wakeups(&self) -> Option<tokio::sync::mpsc::Receiver<vynil_store::pubsub::Message>> {
        match vynil_store::pubsub::follow(self.connection.target().clone(), WAKE_CHANNEL).await {
            Ok(messages) => Some(messages),
            Err(error) => {
                tracing::warn!(%error, "cannot follow scan requests on pub/sub; polling only");
                None
            }
        }
    }

    async fn submit(&self, jukebox: &str, scope: &ScanScope) -> Result<(String, bool), ScannerError> {
        let mut c = self.connection.clone();
        let (id, joined): (String, i64) = redis::Script::new(SUBMIT)
            .key(key("pending", jukebox))
            .key(format!("{PREFIX}:with-work"))
            .arg(field(scope))
            .arg(self.epoch().await?.new_id(ID_PREFIX))
            .arg(jukebox)
            .invoke_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok((id, joined == 1))
    }

    async fn claim(
        &self,
        jukebox: &str,
        holder: &str,
        lease: Duration,
    ) -> Result<Option<Vec<ScanItem>>, ScannerError> {
        // The claim takes the lease: it counts once the replicas have it
        // (`vynil_store::primary`), else it is given back and retried.
        let mut pipeline = redis::pipe();
        pipeline.cmd("EVAL").arg(CLAIM).arg(4);
        pipeline.arg(key("lease", jukebox)).arg(key("pending", jukebox)).arg(key("running", jukebox));
        pipeline.arg(format!("{PREFIX}:with-work")).arg(holder).arg(lease.as_millis() as u64).arg(jukebox);
        let claimed: Option<Vec<String>> = match self.connection.replicated(pipeline).await {
            Ok(claimed) => claimed,
            Err(error) => {
                let _ = self.leases.release(jukebox, holder).await;
                return Err(error.into());
            }
        };
        Ok(claimed.map(|flat| flat.chunks(2).filter_map(|pair| item(pair.first()?, pair.get(1)?)).collect()))
    }

    fn leases(&self) -> Arc<dyn LeaseStore> {
        self.leases.clone()
    }

    async fn complete(&self, jukebox: &str, token: &str) -> Result<(), ScannerError> {
        let mut c = self.connection.clone();
        let _: i64 = redis::Script::new(COMPLETE)
            .key(key("lease", jukebox))
            .key(key("running", jukebox))
            .arg(token)
            .invoke_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(())
    }

    async fn pending(&self, jukebox: &str) -> Result<Vec<ScanItem>, ScannerError> {
        let mut c = self.connection.clone();
        let fields: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(key("pending", jukebox))
            .query_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(fields.iter().filter_map(|(f, id)| item(f, id)).collect())
    }

    async fn with_work(&self) -> Result<Vec<String>, ScannerError> {
        use redis::AsyncCommands;
        let mut c = self.connection.clone();
        Ok(c.smembers(format!("{PREFIX}:with-work")).await.map_err(redis_error)?)
    }

    async fn put_record(&self, record: &ScanRecord, fence: Option<&Fence>) -> Result<bool, ScannerError> {
        let body = serde_json::to_string(record).map_err(|e| ScannerError::Store(e.to_string()))?;
        let (scan, latest) = (key("scan", &record.id), key("latest", &record.jukebox));
        let (ttl, last) = (RECORD_TTL.as_secs().to_string(), if record.is_final() { "1" } else { "0" });
        let args = [body.as_str(), ttl.as_str(), record.id.as_str(), last];
        Ok(run_fenced(&self.connection, fence, PUT_RECORD, &[&scan, &latest], &args).await?)
    }

    async fn latest(&self, jukebox: &str) -> Result<Option<ScanRecord>, ScannerError> {
        use redis::AsyncCommands;
        let mut c = self.connection.clone();
        let id: Option<String> = c.get(key("latest", jukebox)).await.map_err(redis_error)?;
        match id {
            Some(id) => self.record(&id).await,
            None => Ok(None),
        }
    }

    async fn record(&self, id: &str) -> Result<Option<ScanRecord>, ScannerError> {
        use redis::AsyncCommands;
        let mut c = self.connection.clone();
        let text: Option<String> = c.get(key("scan", id)).await.map_err(redis_error)?;
        text.map(|t| {
            serde_json::from_str(&t).map_err(|e| ScannerError::Store(format!("scan record unreadable: {e}")))
        })
        .transpose()
    }

    async fn epoch(&self) -> Result<Epoch, ScannerError> {
        Ok(Epoch::of_redis(&self.connection).await?)
    }

    async fn claim_tick(&self, jukebox: &str, at: i64, keep: Duration) -> Result<bool, ScannerError> {
        let mut c = self.connection.clone();
        let claimed: Option<String> = redis::cmd("SET")
            .arg(format!("{}:{at}", key("tick", jukebox)))
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(keep.as_millis().max(1) as u64)
            .query_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(claimed.is_some())
    }

    async fn touch(&self, jukebox: &str, at_ms: i64) -> Result<(), ScannerError> {
        let mut c = self.connection.clone();
        let _: () = redis::cmd("SET")
            .arg(key("touched", jukebox))
            .arg(at_ms)
            .arg("PX")
            .arg(TOUCH_TTL.as_millis() as u64)
            .query_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(())
    }

    async fn touched(&self, jukebox: &str) -> Result<Option<i64>, ScannerError> {
        let mut c = self.connection.clone();
        Ok(redis::cmd("GET").arg(key("touched", jukebox)).query_async(&mut c).await.map_err(redis_error)?)
    }
}
