//! A scan that finds nothing new writes nothing: no JukeBox status write
//! through the Kubernetes API, no write to the catalog's entry keys in Redis,
//! no `WatchCatalog` message. The scan itself is still seen: its record
//! (`GetScan` by JukeBox) and the scanner's last-scan gauge.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::{Cluster, channel};
use futures::StreamExt;
use vynil_proto::{
    catalog::v1::{GetCatalogRequest, WatchCatalogRequest, catalog_client::CatalogClient},
    scanner::v1::{GetScanRequest, ScanRequest, ScanState, scanner_client::ScannerClient},
};
use vynil_testkit::RedisServer;

async fn scan_to_the_end(scanner: &mut ScannerClient<tonic::transport::Channel>) -> String {
    let request = ScanRequest { jukebox: "box".into(), ..Default::default() };
    let id = scanner.scan(request).await.unwrap().into_inner().scan_id;
    for _ in 0..400 {
        let status =
            scanner.get_scan(GetScanRequest { scan_id: id.clone(), ..Default::default() }).await.unwrap();
        let state = status.into_inner().state;
        if state == ScanState::Succeeded as i32 {
            return id;
        }
        assert!(state != ScanState::Failed as i32 && state != ScanState::PartiallyFailed as i32);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("scan {id} never ended");
}

#[tokio::test]
async fn a_second_scan_of_an_unchanged_registry_writes_nothing_anywhere() {
    let redis = RedisServer::start().await.unwrap();
    let cluster = Cluster::start(&["--redis-url", &redis.url()]).await;
    let (api, scanner_addr, catalog_addr) = (&cluster.api, cluster.scanner_addr, cluster.catalog_addr);
    let mut scanner = ScannerClient::new(channel(scanner_addr).await);
    let mut catalog = CatalogClient::new(channel(catalog_addr).await);
    scan_to_the_end(&mut scanner).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let request = GetCatalogRequest { jukebox: "box".into(), ..Default::default() };
        let answer = catalog.get_catalog(request).await.map(|a| a.into_inner().packages.len());
        if answer.ok() == Some(1) {
            break;
        }
        assert!(Instant::now() < deadline, "the catalog never showed the first scan");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let redis_client = redis::Client::open(redis.url()).unwrap();
    let mut connection = redis_client.get_multiplexed_async_connection().await.unwrap();
    let entry_written = async |connection: &mut redis::aio::MultiplexedConnection| {
        let exists: bool =
            redis::cmd("EXISTS").arg("vynil:v1:catalog:entry:box").query_async(connection).await.unwrap();
        exists
    };
    while !entry_written(&mut connection).await {
        assert!(Instant::now() < deadline, "the catalog never wrote its entry");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Watch every write to the catalog's keys, every catalog change, every API write.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("KA")
        .query_async(&mut connection)
        .await
        .unwrap();
    let mut pubsub = redis_client.get_async_pubsub().await.unwrap();
    pubsub.psubscribe("__keyspace@*__:vynil:v1:catalog:*").await.unwrap();
    let key_writes = Arc::new(Mutex::new(Vec::<String>::new()));
    let collector = {
        let key_writes = key_writes.clone();
        tokio::spawn(async move {
            let mut messages = pubsub.on_message();
            while let Some(message) = messages.next().await {
                let operation: String = message.get_payload().unwrap_or_default();
                key_writes.lock().unwrap().push(format!("{} {operation}", message.get_channel_name()));
            }
        })
    };
    let mut changes = catalog.watch_catalog(WatchCatalogRequest::default()).await.unwrap().into_inner();
    api.clear_requests();
    // Conditions carry whole seconds: the second scan ends in a later second,
    // so a scan that stamped fresh conditions would show as a write.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let second = scan_to_the_end(&mut scanner).await;
    // Absence needs a window: anything the scan caused has landed well within it.
    let quiet = tokio::time::timeout(Duration::from_millis(1500), changes.message()).await;
    assert!(quiet.is_err(), "WatchCatalog sent {quiet:?} after an unchanged scan");

    let status_writes: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.resource == "jukeboxes" && matches!(r.verb.as_str(), "update" | "patch"))
        .collect();
    assert!(status_writes.is_empty(), "JukeBox writes after an unchanged scan: {status_writes:?}");
    assert!(key_writes.lock().unwrap().is_empty(), "catalog key writes: {:?}", key_writes.lock().unwrap());
    collector.abort();

    // The scan is still seen: its record is the JukeBox's latest, and its Event was recorded.
    let latest = scanner
        .get_scan(GetScanRequest { jukebox: "box".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(latest.scan_id, second);
    // A repeated Event is a patch of the first one's series, as kube's recorder does.
    let events = api
        .requests()
        .into_iter()
        .filter(|r| r.resource == "events" && matches!(r.verb.as_str(), "create" | "patch"))
        .count();
    assert_eq!(events, 1, "the unchanged scan is still recorded by its ScanSucceed Event");
    let metrics = reqwest::get(format!("http://{scanner_addr}/metrics")).await.unwrap().text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("vynil_scanner_last_scan_timestamp_seconds{jukebox=\"box\"}")),
        "{metrics}"
    );

    // The open WatchCatalog stream must not hold the catalog's drain.
    cluster.stop().await;
}
