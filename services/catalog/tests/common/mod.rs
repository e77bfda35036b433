//! Helpers shared by the catalog's integration tests.

#![allow(clippy::unwrap_used, clippy::panic, dead_code)]

use std::time::Duration;

use vynil_catalog::Catalog;
use vynil_testkit::RedisServer;

/// The tags a replica's snapshot shows for `name`.
pub fn tags(catalog: &Catalog, name: &str) -> Vec<String> {
    catalog
        .entry(name)
        .unwrap()
        .map(|e| e.packages.iter().map(|p| p.tag.clone()).collect())
        .unwrap_or_default()
}

/// Waits (5 s at most) until `catalog` shows `expected` for `name`.
pub async fn eventually(catalog: &Catalog, name: &str, expected: &[&str]) {
    for _ in 0..500 {
        if tags(catalog, name) == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{name} never showed {expected:?}: {:?}", tags(catalog, name));
}

/// `SET` calls Redis itself counted (`INFO commandstats`), not our counters.
pub async fn set_calls(redis: &RedisServer) -> u64 {
    let mut connection =
        redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut connection).await.unwrap();
    info.lines()
        .find(|l| l.starts_with("cmdstat_set:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
