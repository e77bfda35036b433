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

use crate::{StoreError, redis_error};

/// The Redis key holding the current epoch (never expires).
pub const KEY: &str = "vynil:v1:epoch";

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

    /// The epoch of the Redis `connection` talks to, created if its data has none.
    pub async fn of_redis(connection: &redis::aio::ConnectionManager) -> Result<Self, StoreError> {
        let mut c = connection.clone();
        let proposed = Self::random().to_string();
        // SET NX GET: the value already there, else ours (set by this call).
        let existing: Option<String> = redis::cmd("SET")
            .arg(KEY)
            .arg(&proposed)
            .arg("NX")
            .arg("GET")
            .query_async(&mut c)
            .await
            .map_err(redis_error)?;
        let text = existing.unwrap_or(proposed);
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
                "{what} was lost: the state it was kept in restarted without it (epoch {made}, now {now}; \
                 a Redis without persistence, or a process keeping it in memory); {redo}"
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

    #[test]
    fn ids_made_before_epochs_or_by_hand_are_unknown_not_lost() {
        let epoch = Epoch::random();
        for id in ["scan-0123456789abcdef", "0123456789abcdef0123456789abcdef0", "nope", "scan-zz"] {
            assert_eq!(epoch.missing(id, "scan-"), Missing::Unknown, "{id}");
        }
    }
}
