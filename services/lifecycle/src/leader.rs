//! Leader election with a `coordination.k8s.io/v1` Lease, as client-go's
//! leaderelection does: one replica holds `vynil-lifecycle` in the control
//! plane's namespace and renews it every retry period (a third of the lease
//! duration); another takes it over once `renewTime + leaseDurationSeconds`
//! has passed. Every write is compare-and-set on the Lease's
//! `resourceVersion`, so two replicas never both believe they won.
//!
//! A replica counts itself leader only until its last successful renewal plus
//! the lease duration, measured on its own clock from **before** the write
//! that renewed it: past that instant it stops writing even if it could not hear
//! that another replica took over. Every other replica keeps its watch caches
//! and serves reads; only the leader reconciles.
//!
//! **A lapse is not a loss.** A renewal that takes longer than the rest of
//! the lease (an API server slow under load) leaves the leader without the
//! right to write until it returns, though it still holds the Lease. Its
//! reconciles meanwhile must come back ([`Standing::Renewing`]), not wait for
//! a change as a follower's do: nothing re-reconciles them when the renewal
//! succeeds, since no new term begins (bench P7 at 10 000 instances, a 3 s
//! lease: an upgrade wave stalled for good, its instances dropped during a
//! lapse, some with their old Job deleted and no new one).

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

/// Where this replica stands in the election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// It holds the Lease: it may write.
    Leading,
    /// It held the Lease at its last renewal, the lease ran out on its own
    /// clock and the renewal has not answered yet: no write, and a reconcile
    /// comes back after `retry` (the renewal period).
    Renewing { retry: Duration },
    /// Another replica leads, or none: this one is brought back when elected.
    Following,
}

#[derive(Debug, Default)]
struct Term {
    /// Writes are allowed until then.
    until: Option<Instant>,
    /// The last round renewed (or took) the Lease.
    held: bool,
}

/// This replica's view of the election; cheap to clone.
#[derive(Debug, Clone)]
pub struct Leader {
    term: Arc<Mutex<Term>>,
    /// How often the Lease is renewed.
    retry: Duration,
    /// Bumped each time this replica becomes leader.
    epochs: watch::Receiver<u64>,
}

impl Leader {
    /// A replica that stands as `standing` forever (tests of a single reconcile).
    #[cfg(test)]
    pub fn fixed(standing: Standing) -> Self {
        let (_, epochs) = watch::channel(0);
        let forever = Instant::now() + Duration::from_secs(u32::MAX as u64);
        let (until, held, retry) = match standing {
            Standing::Leading => (Some(forever), true, Duration::from_secs(1)),
            Standing::Renewing { retry } => (None, true, retry),
            Standing::Following => (None, false, Duration::from_secs(1)),
        };
        Self { term: Arc::new(Mutex::new(Term { until, held })), retry, epochs }
    }

    /// Where this replica stands now.
    pub fn standing(&self) -> Standing {
        let term = self.term.lock().unwrap_or_else(|p| p.into_inner());
        match term.until {
            Some(until) if Instant::now() < until => Standing::Leading,
            _ if term.held => Standing::Renewing { retry: self.retry },
            _ => Standing::Following,
        }
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
    let term = Arc::new(Mutex::new(Term::default()));
    let (epochs_tx, epochs) = watch::channel(0u64);
    let retry = (duration / 3).max(Duration::from_millis(200));
    let leader = Leader { term: term.clone(), retry, epochs };
    tokio::spawn(async move {
        let mut leading = false;
        loop {
            let started = Instant::now();
            let written = match try_acquire(&leases, &identity, duration).await {
                Ok(written) => written,
                Err(error) => {
                    tracing::warn!(%error, "leader election: cannot read or write the Lease");
                    None
                }
            };
            let won = written.is_some();
            {
                let mut term = term.lock().unwrap_or_else(|p| p.into_inner());
                let lapsed = term.until.is_none_or(|t| Instant::now() >= t);
                if won && leading && lapsed {
                    let took = started.elapsed();
                    tracing::info!(%identity, ?took, "renewed the Lease after it ran out on this replica's clock: writes go on");
                }
                if let Some(written) = written {
                    term.until = Some(written + duration);
                } else if lapsed || !leading {
                    term.until = None;
                }
                term.held = won;
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
        *term.lock().unwrap_or_else(|p| p.into_inner()) = Term::default();
        if leading {
            release(&leases, &identity).await;
        }
    });
    leader
}

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// One round: create, renew or take over the Lease. When held, the instant
/// before the write that renewed it: the lease runs from there on this
/// replica's clock (its `renewTime` is taken after it), not from before the
/// read, which a slow API server can make as long as the lease.
async fn try_acquire(
    leases: &Api<Lease>,
    identity: &str,
    duration: Duration,
) -> Result<Option<Instant>, kube::Error> {
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
        let writing = Instant::now();
        return match leases.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(Some(writing)),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
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
            return Ok(None);
        }
    }
    if !held_by_me {
        spec.holder_identity = Some(identity.into());
        spec.acquire_time = Some(now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.lease_duration_seconds = Some(seconds);
    let writing = Instant::now();
    spec.renew_time = Some(now());
    match leases.replace(LEASE, &PostParams::default(), &lease).await {
        Ok(_) => Ok(Some(writing)),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
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

/// The campaign against kube's `tower-test` mock, on a paused clock: each
/// round's answers are scripted, so a renewal can be made slower than the
/// lease.
#[cfg(test)]
mod tests {
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::{Value, json};

    use super::*;

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/vynil-system/leases";

    fn lease(holder: &str) -> Value {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": LEASE, "namespace": "vynil-system", "resourceVersion": "7"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 3,
                "renewTime": jiff::Timestamp::now().to_string()}})
    }

    /// Answers the next request, checking its method and path.
    async fn answer(handle: &mut Handle, method: &str, status: u16, body: Value) {
        let (request, send) = handle.next_request().await.expect("a request");
        assert_eq!(request.method().as_str(), method, "{}", request.uri());
        assert!(request.uri().path().starts_with(LEASE_PATH), "{}", request.uri());
        let body = Body::from(serde_json::to_vec(&body).unwrap_or_default());
        send.send_response(Response::builder().status(status).body(body).unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_slower_than_the_lease_pauses_writes_without_giving_up_the_term() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "vynil-system");
        let shutdown = Shutdown::new();
        let duration = Duration::from_secs(3);
        let leader = campaign(client, "vynil-system", "me".into(), duration, shutdown.clone());
        let not_found = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
            "message": "not found", "code": 404});
        answer(&mut handle, "GET", 404, not_found).await;
        answer(&mut handle, "POST", 201, lease("me")).await;
        // The second round asks for the Lease a renewal period later.
        let (request, send) = handle.next_request().await.expect("the renewal's read");
        assert_eq!(request.method(), http::Method::GET);
        assert_eq!(leader.standing(), Standing::Leading);
        assert_eq!(*leader.epochs.borrow(), 1, "elected once");
        // The API server answers after the lease ran out on this replica's clock.
        tokio::time::sleep(duration).await;
        let retry = duration / 3;
        assert_eq!(leader.standing(), Standing::Renewing { retry }, "no write, and no reconcile dropped");
        send.send_response(
            Response::builder().body(Body::from(lease("me").to_string().into_bytes())).unwrap(),
        );
        answer(&mut handle, "PUT", 200, lease("me")).await;
        // The third round: the renewal answered, so this replica leads, in the same term.
        let (_, send) = handle.next_request().await.expect("the next renewal's read");
        assert_eq!(leader.standing(), Standing::Leading);
        assert_eq!(*leader.epochs.borrow(), 1, "a late renewal is no new term");
        // A failed renewal leaves the writes until the lease runs out, then follows.
        let failed = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "InternalError",
            "message": "unavailable", "code": 500});
        send.send_response(
            Response::builder().status(500).body(Body::from(failed.to_string().into_bytes())).unwrap(),
        );
        let (_, send) = handle.next_request().await.expect("the round after a failure");
        assert_eq!(leader.standing(), Standing::Leading, "still within the lease");
        tokio::time::sleep(duration).await;
        assert_eq!(leader.standing(), Standing::Following);
        drop(send);
        shutdown.trigger();
    }
}
