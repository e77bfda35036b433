//! Which life of the shared state a record was made in, so that a record
//! the state lost is reported lost, never "unknown" or "never existed".
//!
//! A Redis without persistence forgets every scan request, scan record and
//! purge plan when it restarts; a process keeping them in memory forgets them
//! when it restarts. Each life of that state has an [`Epoch`]: in Redis, a
//! key that every service reads and that the first one to find it missing
//! creates (`SET NX`), so replicas agree; in memory, a random value per
//! process. Every id a service hands out carries the epoch it was made in
//! ([`Epoch::new_id`]), and a lookup that finds nothing asks [`Epoch::missing`]
//! whether the id's epoch is still the current one: if not, the record was
//! lost with the state it lived in, and the caller is told so (`DATA_LOSS`).
//! With persistence on, the key survives a restart along with the records.
//!
//! A failover is another way to lose records: replication is asynchronous,
//! so the replica promoted may lack the last writes its old primary
//! acknowledged. Beside the epoch, Redis keeps the replication id of the
//! primary it belongs to ([`PRIMARY_KEY`]). A primary promoted from a
//! replica has a new replication id and keeps its old primary's as
//! `master_replid2`; a primary restarted has a new one and no second. So the
//! first service to find the epoch written under another primary, on a
//! primary that was promoted, starts a new epoch: every id made before the
//! failover and missing now is reported lost. A restart with persistence
//! keeps the epoch (what the append-only file reloads is there).

use crate::{StoreError, redis_error};

/// The Redis key holding the current epoch (never expires).
pub const KEY: &str = "vynil:v1:epoch";
/// The replication id of the primary [`KEY`] was last confirmed on.
pub const PRIMARY_KEY: &str = "vynil:v1:epoch:primary";

/// `KEYS` = epoch, primary; `ARGV` = a proposed epoch, this primary's
/// replication id, `1` when this primary was promoted from a replica.
/// Answers the current epoch.
const CURRENT: &str = r"
local epoch = redis.call('GET', KEYS[1])
local primary = redis.call('GET', KEYS[2])
if epoch == false or (primary ~= false and primary ~= ARGV[2] and ARGV[3] == '1') then
  epoch = ARGV[1]
  redis.call('SET', KEYS[1], epoch)
end
if primary ~= ARGV[2] then redis.call('SET', KEYS[2], ARGV[2]) end
return epoch";

/// One life of the shared state (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch(u32);

/// What a lookup that found nothing means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// The record was made in an earlier life of the state, which is gone.
    Lost { made: Epoch, now: Epoch },
    /// Made in this life (and expired), or never made here.
    Unknown,
}

impl Epoch {
    /// A fresh epoch: the life of a process's memory.
    pub fn random() -> Self {
        Self(fastrand::u32(..))
    }

    /// The epoch of the Redis `connection` talks to, created if its data
    /// has none, and anew after a failover (see the module documentation).
    pub async fn of_redis(connection: &crate::RedisConnection) -> Result<Self, StoreError> {
        let mut c = connection.clone();
        let info: String =
            redis::cmd("INFO").arg("replication").query_async(&mut c).await.map_err(redis_error)?;
        let primary = PrimaryIdentity::parse(&info);
        let text: String = redis::Script::new(CURRENT)
            .key(KEY)
            .key(PRIMARY_KEY)
            .arg(Self::random().to_string())
            .arg(&primary.id)
            .arg(if primary.promoted { "1" } else { "0" })
            .invoke_async(&mut c)
            .await
            .map_err(redis_error)?;
        u32::from_str_radix(&text, 16).map(Self).map_err(|_| {
            StoreError::Unavailable(format!("Redis: {KEY} holds {text:?}, not an epoch; delete the key"))
        })
    }

    /// `<prefix><epoch, 8 hex digits><random, 24 hex digits>`.
    pub fn new_id(self, prefix: &str) -> String {
        format!("{prefix}{self}{:016x}{:08x}", fastrand::u64(..), fastrand::u32(..))
    }

    /// The epoch an id made by [`Epoch::new_id`] with `prefix` was made in.
    pub fn of_id(id: &str, prefix: &str) -> Option<Self> {
        let rest = id.strip_prefix(prefix)?;
        if rest.len() != 32 || !rest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(rest.get(..8)?, 16).ok().map(Self)
    }

    /// Why the record `id` (made with `prefix`) is not found, `self` being
    /// the current epoch. Ids made before epochs existed are `Unknown`.
    pub fn missing(self, id: &str, prefix: &str) -> Missing {
        match Self::of_id(id, prefix) {
            Some(made) if made != self => Missing::Lost { made, now: self },
            _ => Missing::Unknown,
        }
    }
}

/// Who the primary answering is, as `INFO replication` says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PrimaryIdentity {
    /// `master_replid`.
    id: String,
    /// Whether `master_replid2` names a primary it replicated before its
    /// promotion.
    promoted: bool,
}

impl PrimaryIdentity {
    fn parse(info: &str) -> Self {
        let field = |name: &str| {
            info.lines().find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':')).unwrap_or("")
        };
        let second = field("master_replid2");
        Self { id: field("master_replid").to_string(), promoted: second.bytes().any(|b| b != b'0') }
    }
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

impl Missing {
    /// The error for `what` (`scan "scan-…"`) when it was lost, else `None`.
    pub fn lost(&self, what: &str, redo: &str) -> Option<StoreError> {
        match self {
            Missing::Lost { made, now } => Some(StoreError::Lost(format!(
                "{what} was lost: the state it was kept in restarted or failed over without it (epoch {made}, now {now}; \
                 a Redis without persistence, a replica promoted before it had the record, or a process keeping \
                 it in memory); {redo}"
            ))),
            Missing::Unknown => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_names_the_epoch_it_was_made_in() {
        let epoch = Epoch::random();
        let id = epoch.new_id("scan-");
        assert_eq!(id.len(), "scan-".len() + 32, "{id}");
        assert_eq!(Epoch::of_id(&id, "scan-"), Some(epoch));
        assert_eq!(epoch.missing(&id, "scan-"), Missing::Unknown, "same life: expired, not lost");
        let later = Epoch(epoch.0.wrapping_add(1));
        assert_eq!(later.missing(&id, "scan-"), Missing::Lost { made: epoch, now: later });
    }

    /// `INFO replication` as redis-server 7.0.15 (Debian 12) answered it,
    /// transcribed: a primary restarted from its append-only file, then a
    /// replica promoted by `REPLICAOF NO ONE` (as Sentinel does).
    #[test]
    fn a_promoted_primary_is_told_from_a_restarted_one() {
        let restarted = "# PrimaryIdentity\r\nrole:master\r\nconnected_slaves:0\r\n\
            master_replid:95d881ac9baf34b03c178029433b2899d3760bcc\r\n\
            master_replid2:0000000000000000000000000000000000000000\r\nmaster_repl_offset:0\r\n\
            second_repl_offset:-1\r\n";
        let promoted = "# PrimaryIdentity\r\nrole:master\r\nconnected_slaves:0\r\n\
            master_replid:53a4306f5fd5f212dd2c359f04e84c8cdba4a741\r\n\
            master_replid2:b6f03355105984c66751776baa00a4a14f8d9a1c\r\nmaster_repl_offset:87\r\n\
            second_repl_offset:88\r\n";
        assert_eq!(
            PrimaryIdentity::parse(restarted),
            PrimaryIdentity { id: "95d881ac9baf34b03c178029433b2899d3760bcc".into(), promoted: false }
        );
        assert_eq!(
            PrimaryIdentity::parse(promoted),
            PrimaryIdentity { id: "53a4306f5fd5f212dd2c359f04e84c8cdba4a741".into(), promoted: true }
        );
    }

    #[test]
    fn ids_made_before_epochs_or_by_hand_are_unknown_not_lost() {
        let epoch = Epoch::random();
        for id in ["scan-0123456789abcdef", "0123456789abcdef0123456789abcdef0", "nope", "scan-zz"] {
            assert_eq!(epoch.missing(id, "scan-"), Missing::Unknown, "{id}");
        }
    }
}
