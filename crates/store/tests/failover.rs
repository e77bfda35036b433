//! The shared state through a Sentinel failover, on Debian's real
//! `redis-server` and `redis-sentinel` (a primary, two replicas, three
//! sentinels, `vynil_testkit::RedisSentinels`):
//!
//! - a connection follows the primary the sentinels promote: its next write
//!   lands there;
//! - a record the old primary acknowledged but never replicated is reported
//!   lost after the failover, never as absent;
//! - a lease whose acquisition no replica has is not held, so a second
//!   worker taking it on the promoted primary is the only holder, and the
//!   first one's fenced writes are refused.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use vynil_store::{
    RedisConnection, RedisTarget, StoreError,
    epoch::{Epoch, Missing},
    lease::{Lease, LeaseError, LeaseStore, RedisLeases, run_fenced},
};
use vynil_testkit::{RedisSentinels, sentinel::MASTER_NAME};

fn target(set: &RedisSentinels) -> RedisTarget {
    RedisTarget::sentinel(set.sentinels(), MASTER_NAME, None)
}

/// Raw `SET` then `GET` on one node, past our client.
async fn on_node(port: u16, key: &str) -> Option<String> {
    let client = redis::Client::open(RedisSentinels::url(port)).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("GET").arg(key).query_async(&mut c).await.unwrap()
}

/// `SET key value` through `connection`, retried until a primary accepts it.
async fn write_until_accepted(connection: &RedisConnection, key: &str, value: &str) -> Duration {
    let start = Instant::now();
    loop {
        let mut c = connection.clone();
        let written: Result<(), _> = redis::cmd("SET").arg(key).arg(value).query_async(&mut c).await;
        if written.is_ok() {
            return start.elapsed();
        }
        assert!(start.elapsed() < Duration::from_secs(60), "no primary accepted a write in 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills the primary, thaws what was frozen, and waits for the promotion.
async fn fail_over(set: &mut RedisSentinels, frozen: &[u16]) -> (u16, u16) {
    let old = set.primary().await.unwrap();
    set.kill(old).unwrap();
    for port in frozen {
        set.thaw(*port).unwrap();
    }
    let new = set.failed_over_from(old, Duration::from_secs(60)).await.unwrap();
    (old, new)
}

#[tokio::test]
async fn a_connection_follows_the_promoted_primary_and_what_it_lost_is_reported_lost() {
    let mut set = RedisSentinels::start(2).await.unwrap();
    let connection = target(&set).connect().await.unwrap();
    let before = Epoch::of_redis(&connection).await.unwrap();
    write_until_accepted(&connection, "kept", "replicated").await;
    // Replicated: the WAIT through our replication path answers.
    let _: () = connection
        .replicated(redis::pipe().cmd("SET").arg("kept").arg("replicated").to_owned())
        .await
        .unwrap();

    // A record made now is acknowledged by the primary alone.
    let replicas = set.cut_off_replicas(set.primary().await.unwrap()).await.unwrap();
    let lost_id = before.new_id("scan-");
    write_until_accepted(&connection, &lost_id, "never replicated").await;
    let refused: Result<(), StoreError> =
        connection.replicated(redis::pipe().cmd("SET").arg("fenced").arg("1").to_owned()).await;
    assert!(
        matches!(&refused, Err(StoreError::Unavailable(why)) if why.contains("0 of the 1 replica")),
        "a write no replica has is refused: {refused:?}"
    );

    let (old, new) = fail_over(&mut set, &replicas).await;
    let took = write_until_accepted(&connection, "after", "the failover").await;
    println!("the connection wrote on the promoted primary :{new} {took:?} after the sentinels named it");
    // An ordering check, not a timing one: the write landed on the new primary.
    assert_eq!(on_node(new, "after").await.as_deref(), Some("the failover"));
    assert_eq!(connection.status().address, format!("127.0.0.1:{new}"));
    assert!(connection.status().followed >= 1);
    assert_ne!(old, new);

    assert_eq!(on_node(new, "kept").await.as_deref(), Some("replicated"), "what was replicated is kept");
    assert_eq!(on_node(new, &lost_id).await, None, "the promoted replica never had the record");
    let after = Epoch::of_redis(&connection).await.unwrap();
    assert_ne!(after, before, "a failover starts a new epoch");
    assert!(
        matches!(after.missing(&lost_id, "scan-"), Missing::Lost { .. }),
        "the record made before the failover and missing now is lost, not unknown"
    );
    let made_after = after.new_id("scan-");
    assert_eq!(after.missing(&made_after, "scan-"), Missing::Unknown, "one made after is not");
    assert_eq!(Epoch::of_redis(&connection).await.unwrap(), after, "the epoch changes once per failover");
}

#[tokio::test]
async fn a_lease_no_replica_has_is_not_held_so_the_promoted_primary_has_one_holder() {
    let mut set = RedisSentinels::start(2).await.unwrap();
    let first_connection = target(&set).connect().await.unwrap();
    let second_connection = target(&set).connect().await.unwrap();
    let first: Arc<dyn LeaseStore> = Arc::new(RedisLeases::new(first_connection.clone(), "test:lease"));
    let second: Arc<dyn LeaseStore> = Arc::new(RedisLeases::new(second_connection.clone(), "test:lease"));
    let ttl = Duration::from_secs(30);

    // Replicas cut off before the lease write: it cannot replicate.
    let replicas = set.cut_off_replicas(set.primary().await.unwrap()).await.unwrap();
    let refused = Lease::acquire(first.clone(), vec!["repo".into()], "purger-0", ttl).await;
    assert!(matches!(&refused, Err(StoreError::Unavailable(_))), "not held: {refused:?}");
    // Had the first worker gone on anyway, with a token the old primary
    // accepted (what happened without the replication wait):
    let stale_token = "purger-0:unreplicated";
    let mut c = first_connection.clone();
    let _: () = redis::cmd("SET").arg(first.key("repo")).arg(stale_token).query_async(&mut c).await.unwrap();

    fail_over(&mut set, &replicas).await;
    let held = loop {
        match Lease::acquire(second.clone(), vec!["repo".into()], "purger-1", ttl).await {
            Ok(Some(lease)) => break lease,
            Ok(None) => panic!("the promoted primary has a holder already"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    held.check().await.unwrap();

    // The first worker, resumed, finds its fence gone on the new primary.
    let stale = Lease::adopt(first.clone(), vec!["repo".into()], stale_token.into(), ttl);
    let checked = loop {
        match stale.check().await {
            Err(LeaseError::Store(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            other => break other,
        }
    };
    assert!(matches!(checked, Err(LeaseError::Lost(_))), "{checked:?}");
    let fenced = run_fenced(
        &first_connection,
        Some(&stale.fence("repo")),
        "redis.call('SET', KEYS[2], ARGV[2]) return 1",
        &["test:journal"],
        &["deleted"],
    )
    .await
    .unwrap();
    assert!(!fenced, "a fenced write under the lost lease writes nothing");
    let written = run_fenced(
        &second_connection,
        Some(&held.fence("repo")),
        "redis.call('SET', KEYS[2], ARGV[2]) return 1",
        &["test:journal"],
        &["deleted once"],
    )
    .await
    .unwrap();
    assert!(written, "the holder's fenced write lands (and replicates)");
}
