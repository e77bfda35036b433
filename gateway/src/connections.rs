//! How many connections the gateway holds, in all and per peer (issue
//! "Credentials that stay where they belong" item 5).
//!
//! Each connection costs buffers and a task whatever it sends; without a
//! bound, one client opening thousands holds the gateway's memory. A
//! connection past either cap is closed at once, before anything is read.
//! An IPv6 peer counts by its /64 (one host usually holds a whole /64), an
//! IPv4-mapped address as the IPv4 address. Behind an Ingress every
//! connection comes from the Ingress: raise `--max-connections-per-peer`
//! to its share.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The caps, and the connections held now.
#[derive(Debug, Clone)]
pub struct Connections {
    total: Arc<Semaphore>,
    per_peer: usize,
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A connection admitted: counted until dropped.
#[derive(Debug)]
pub struct Admitted {
    _total: OwnedSemaphorePermit,
    peer: IpAddr,
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = peers.get_mut(&self.peer) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                peers.remove(&self.peer);
            }
        }
    }
}

/// The address a peer is counted under.
pub fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
        v4 => v4,
    }
}

impl Connections {
    /// At most `total` connections (at least 1; a figure above what tokio's
    /// semaphore can count is held to its maximum, never a panic), at most
    /// `per_peer` of them from one peer.
    pub fn new(total: usize, per_peer: usize) -> Self {
        Self {
            total: Arc::new(Semaphore::new(total.clamp(1, Semaphore::MAX_PERMITS))),
            per_peer: per_peer.max(1),
            peers: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Admits a connection from `ip`, or `None` past a cap.
    pub fn admit(&self, ip: IpAddr) -> Option<Admitted> {
        let total = self.total.clone().try_acquire_owned().ok()?;
        let peer = peer_key(ip);
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let count = peers.entry(peer).or_insert(0);
        if *count >= self.per_peer {
            return None;
        }
        *count += 1;
        Some(Admitted { _total: total, peer, peers: self.peers.clone() })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// `--max-connections 18446744073709551615` started a gateway that
    /// panicked in `Semaphore::new` (above `MAX_PERMITS`).
    #[test]
    fn a_huge_limit_is_held_to_the_semaphores_maximum() {
        let connections = Connections::new(usize::MAX, usize::MAX);
        assert_eq!(connections.total.available_permits(), Semaphore::MAX_PERMITS);
    }

    #[test]
    fn a_peer_gets_its_share_and_an_ipv6_host_is_its_64() {
        let connections = Connections::new(3, 2);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let a = connections.admit(ip("2001:db8::1")).unwrap();
        let _b = connections.admit(ip("2001:db8::ffff:2")).unwrap();
        assert!(connections.admit(ip("2001:db8::3")).is_none(), "the same /64: its share is spent");
        drop(a);
        let _c = connections.admit(ip("2001:db8::3")).unwrap();
        let _d = connections.admit(ip("::ffff:10.0.0.1")).unwrap();
        assert!(connections.admit(ip("10.0.0.2")).is_none(), "the total is spent");
        assert_eq!(peer_key(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
    }
}
