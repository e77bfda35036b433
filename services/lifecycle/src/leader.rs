//! Leader election with a `coordination.k8s.io/v1` Lease, as client-go's
//! leaderelection does: one replica holds `vynil-lifecycle` in the control
//! plane's namespace and renews it every retry period (a third of the lease
//! duration); another takes it over once `renewTime + leaseDurationSeconds`
//! has passed. Every write is compare-and-set on the Lease's
//! `resourceVersion`, so two replicas never both believe they won.
//!
//! A replica counts itself leader only until its last successful renewal plus
//! the lease duration, measured on its own clock from **before** the renewal
//! request: past that instant it stops writing even if it could not hear
//! that another replica took over. Every other replica keeps its watch caches
//! and serves reads; only the leader reconciles.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio::{sync::watch, time::Instant};
use vynil_runtime::Shutdown;

/// The Lease's name.
pub const LEASE: &str = "vynil-lifecycle";

/// This replica's view of the election; cheap to clone.
#[derive(Debug, Clone)]
pub struct Leader {
    valid_until: Arc<Mutex<Option<Instant>>>,
    /// Bumped each time this replica becomes leader.
    epochs: watch::Receiver<u64>,
}

impl Leader {
    /// A replica that leads forever (tests of a single reconcile).
    #[cfg(test)]
    pub fn always() -> Self {
        let (_, epochs) = watch::channel(0);
        Self {
            valid_until: Arc::new(Mutex::new(Some(Instant::now() + Duration::from_secs(u32::MAX as u64)))),
            epochs,
        }
    }

    /// Whether this replica may write now.
    pub fn is_leader(&self) -> bool {
        let until = *self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        until.is_some_and(|t| Instant::now() < t)
    }

    /// Fires each time this replica becomes leader (to reconcile everything).
    pub fn elected(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        use futures::StreamExt;
        tokio_stream::wrappers::WatchStream::from_changes(self.epochs.clone()).map(|_| ())
    }
}

/// Campaigns for the Lease as `identity` until `shutdown`, then releases it.
pub fn campaign(
    client: Client,
    namespace: &str,
    identity: String,
    duration: Duration,
    shutdown: Shutdown,
) -> Leader {
    let leases: Api<Lease> = Api::namespaced(client, namespace);
    let valid_until = Arc::new(Mutex::new(None));
    let (epochs_tx, epochs) = watch::channel(0u64);
    let leader = Leader { valid_until: valid_until.clone(), epochs };
    let retry = (duration / 3).max(Duration::from_millis(200));
    tokio::spawn(async move {
        let mut leading = false;
        loop {
            let started = Instant::now();
            let won = match try_acquire(&leases, &identity, duration).await {
                Ok(won) => won,
                Err(error) => {
                    tracing::warn!(%error, "leader election: cannot read or write the Lease");
                    false
                }
            };
            {
                let mut until = valid_until.lock().unwrap_or_else(|p| p.into_inner());
                if won {
                    *until = Some(started + duration);
                } else if until.is_some_and(|t| Instant::now() >= t) || !leading {
                    *until = None;
                }
            }
            if won && !leading {
                tracing::info!(%identity, "became the leader");
                epochs_tx.send_modify(|e| *e += 1);
            }
            if !won && leading {
                tracing::info!(%identity, "lost the leadership");
            }
            leading = won;
            tokio::select! {
                () = tokio::time::sleep(retry) => {}
                () = shutdown.signaled() => break,
            }
        }
        *valid_until.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if leading {
            release(&leases, &identity).await;
        }
    });
    leader
}

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// One round: create, renew or take over the Lease. `Ok(true)` when held.
async fn try_acquire(leases: &Api<Lease>, identity: &str, duration: Duration) -> Result<bool, kube::Error> {
    let seconds = i32::try_from(duration.as_secs()).unwrap_or(i32::MAX).max(1);
    let Some(mut lease) = leases.get_opt(LEASE).await? else {
        let lease = Lease {
            metadata: ObjectMeta { name: Some(LEASE.into()), ..ObjectMeta::default() },
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.into()),
                lease_duration_seconds: Some(seconds),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match leases.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let held_by_me = holder.as_deref() == Some(identity);
    if !held_by_me && holder.is_some() {
        let lasting =
            Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(seconds)).unwrap_or(0));
        let renewed = spec.renew_time.as_ref().map(|t| t.0);
        let expired = renewed.is_none_or(|t| {
            jiff::SignedDuration::try_from(lasting)
                .ok()
                .and_then(|d| t.checked_add(d).ok())
                .is_none_or(|end| end < jiff::Timestamp::now())
        });
        if !expired {
            return Ok(false);
        }
    }
    if !held_by_me {
        spec.holder_identity = Some(identity.into());
        spec.acquire_time = Some(now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.lease_duration_seconds = Some(seconds);
    spec.renew_time = Some(now());
    match leases.replace(LEASE, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up on a clean stop, so another replica takes over at once.
async fn release(leases: &Api<Lease>, identity: &str) {
    let Ok(Some(mut lease)) = leases.get_opt(LEASE).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(identity) {
        return;
    }
    spec.holder_identity = None;
    if let Err(error) = leases.replace(LEASE, &PostParams::default(), &lease).await {
        tracing::warn!(%error, "cannot release the Lease; it expires on its own");
    }
}
