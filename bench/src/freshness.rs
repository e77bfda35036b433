//! P1: status change → all 3 catalog replicas fresh, p50/p99 over 200
//! changes. Local mode: on one real Redis, beside a bare Redis pub/sub round
//! trip; then on Redis in Sentinel mode (a primary, two replicas, three
//! sentinels: what the services follow across failovers), beside the same on
//! one Redis, and a failover: the primary killed → a status change fresh on
//! every replica again, beside the sentinels' own promotion. Cluster mode: the replicas follow the fake Kubernetes API server's
//! watch (and share one Redis), beside the fake's own watch delivery to a
//! bare kube watcher. Each baseline is measured in the same run.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt;
use vynil_catalog::Catalog;
use vynil_crds::JukeBoxStatus;
use vynil_rules::{Package, PackageContent, PackageType};
use vynil_store::{JukeboxStore, LocalStore, RedisTarget};
use vynil_testkit::{RedisSentinels, RedisServer, sentinel::MASTER_NAME};

use crate::report::{Figure, Row};

const CHANGES: usize = 200;

fn package(tag: &str) -> Package {
    Package::new("registry.example", "db/pg", tag, PackageContent::minimal("db", "pg", PackageType::System))
}

pub fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    (at(0.50), at(0.99))
}

/// P1 in local mode on one Redis, and on Redis in Sentinel mode beside it.
pub async fn local() -> [Figure; 2] {
    let single = measure().await;
    let with_sentinel = match &single {
        Ok((_, fresh)) => measure_sentinel(fresh.clone()).await,
        Err(error) => Err(anyhow::anyhow!("needs the single-Redis figure, which failed: {error}")),
    };
    [
        Figure::from_result("P1", "cache freshness, local mode (3 catalogs)", single.map(|(rows, _)| rows)),
        Figure::from_result(
            "P1s",
            "cache freshness, local mode, Redis with Sentinel (3 catalogs)",
            with_sentinel,
        ),
    ]
}

pub async fn cluster() -> Figure {
    Figure::from_result("P1", "cache freshness, cluster mode (3 catalogs)", measure_cluster().await)
}

fn rows(fresh: Vec<Duration>, baseline: Vec<Duration>, baseline_name: &str) -> Vec<Row> {
    let (base50, base99) = percentiles(baseline);
    let (fresh50, fresh99) = percentiles(fresh);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    vec![
        Row::new(format!("status change -> all fresh, p50 of {CHANGES}"), ms(fresh50), "ms")
            .against(format!("{baseline_name}, p50"), ms(base50)),
        Row::new(format!("status change -> all fresh, p99 of {CHANGES}"), ms(fresh99), "ms")
            .against(format!("{baseline_name}, p99"), ms(base99)),
    ]
}

async fn measure_cluster() -> anyhow::Result<Vec<Row>> {
    use kube::{
        Api,
        api::{Patch, PatchParams, PostParams},
    };
    use vynil_crds::JukeBox;
    let redis = RedisServer::start().await?;
    let api = vynil_testkit::kube_api::FakeApiServer::start().await?;
    api.create_namespaces(&["vynil-system", "apps"])?;
    let boxes: Api<JukeBox> = Api::all(api.client()?);
    let jukebox: JukeBox = serde_json::from_value(vynil_testkit::JukeboxBuilder::new("box").json())?;
    boxes.create(&PostParams::default(), &jukebox).await?;
    let status = |i: usize| {
        let package = serde_json::to_value(package(&format!("1.0.{i}")))?;
        anyhow::Ok(serde_json::json!({"status": {"packages": [package]}}))
    };

    let patches = (0..CHANGES).map(status).collect::<anyhow::Result<Vec<_>>>()?;
    let bare = watch_delivery(&boxes, &patches).await?;

    let mut replicas = Vec::new();
    for _ in 0..3 {
        let store = Arc::new(vynil_store::KubeStore::new(api.client()?));
        let catalog = Arc::new(
            Catalog::new(
                store,
                Some(&vynil_store::RedisTarget::url(redis.url())),
                semver::Version::new(0, 8, 0),
            )
            .await?,
        );
        catalog.resync().await?;
        tokio::spawn(catalog.clone().follow(Duration::from_secs(3600)));
        replicas.push(catalog);
    }
    // Let each replica's watch list and settle before measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut fresh = Vec::new();
    for i in CHANGES..2 * CHANGES {
        let mut receivers: Vec<_> = replicas.iter().map(|r| r.subscribe()).collect();
        let start = Instant::now();
        boxes.patch_status("box", &PatchParams::default(), &Patch::Merge(&status(i)?)).await?;
        for receiver in &mut receivers {
            tokio::time::timeout(Duration::from_secs(10), receiver.recv())
                .await
                .map_err(|_| anyhow::anyhow!("a replica was not fresh 10 s after a status change"))??;
        }
        fresh.push(start.elapsed());
    }
    Ok(rows(fresh, bare, "the fake API server's watch delivery"))
}

/// A writer and 3 catalog replicas, each with its own connections to `target`.
async fn replicas_on(
    target: &RedisTarget,
    dir: &std::path::Path,
) -> anyhow::Result<(LocalStore, Vec<Arc<Catalog>>)> {
    let writer = LocalStore::with_redis(dir.to_path_buf(), target).await?;
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let store = Arc::new(LocalStore::with_redis(dir.to_path_buf(), target).await?);
        let catalog = Arc::new(Catalog::new(store, Some(target), semver::Version::new(0, 8, 0)).await?);
        catalog.resync().await?;
        tokio::spawn(catalog.clone().follow(Duration::from_secs(3600)));
        replicas.push(catalog);
    }
    Ok((writer, replicas))
}

/// One status change written (retried until a primary takes it), until
/// every replica has it: the time from its first write.
async fn change(writer: &LocalStore, replicas: &[Arc<Catalog>], i: usize) -> anyhow::Result<Duration> {
    let mut receivers: Vec<_> = replicas.iter().map(|r| r.subscribe()).collect();
    let status = JukeBoxStatus { packages: vec![package(&format!("1.0.{i}"))], ..Default::default() };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut start = None;
    loop {
        let written = match writer.get("box").await {
            Ok(record) => {
                let version = record.map(|r| r.status_version).unwrap_or_default();
                start.get_or_insert_with(Instant::now);
                writer.write_status("box", &version, &status).await.map(|_| ())
            }
            Err(error) => Err(error),
        };
        match written {
            Ok(()) => break,
            Err(error) if Instant::now() > deadline => {
                anyhow::bail!("no status write accepted in 60 s: {error}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    for receiver in &mut receivers {
        tokio::time::timeout(Duration::from_secs(60), receiver.recv())
            .await
            .map_err(|_| anyhow::anyhow!("a replica was not fresh 60 s after a status change"))??;
    }
    Ok(start.map(|s| s.elapsed()).unwrap_or_default())
}

/// 200 changes timed on `writer` and `replicas`.
async fn changes(writer: &LocalStore, replicas: &[Arc<Catalog>]) -> anyhow::Result<Vec<Duration>> {
    let mut fresh = Vec::new();
    for i in 0..CHANGES {
        fresh.push(change(writer, replicas, i).await?);
    }
    Ok(fresh)
}

/// P1 on Redis with Sentinel, beside `single` (the same on one Redis), then a failover.
async fn measure_sentinel(single: Vec<Duration>) -> anyhow::Result<Vec<Row>> {
    let mut set = RedisSentinels::start(2).await?;
    let dir = tempfile::tempdir()?;
    vynil_testkit::JukeboxBuilder::new("box").write_to(dir.path())?;
    let target = RedisTarget::sentinel(set.sentinels(), MASTER_NAME, None);
    let (writer, replicas) = replicas_on(&target, dir.path()).await?;
    let fresh = changes(&writer, &replicas).await?;
    let mut rows = rows(fresh, single, "the same on one Redis");
    let old = set.primary().await?;
    let killed = Instant::now();
    set.kill(old)?;
    let (promoted, followed) = tokio::join!(
        async { set.failed_over_from(old, Duration::from_secs(60)).await.map(|_| killed.elapsed()) },
        async { change(&writer, &replicas, CHANGES).await.map(|_| killed.elapsed()) },
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    rows.push(
        Row::new("primary killed -> a status change fresh on every replica", ms(followed?), "ms")
            .against("primary killed -> a replica promoted by the sentinels", ms(promoted?)),
    );
    Ok(rows)
}

/// P1 on one Redis: its rows, and the samples the Sentinel figure compares with.
async fn measure() -> anyhow::Result<(Vec<Row>, Vec<Duration>)> {
    let redis = RedisServer::start().await?;
    let dir = tempfile::tempdir()?;
    vynil_testkit::JukeboxBuilder::new("box").write_to(dir.path())?;
    let (writer, replicas) = replicas_on(&RedisTarget::url(redis.url()), dir.path()).await?;

    // Bare pub/sub round trip on the same Redis.
    let client = redis::Client::open(redis.url())?;
    let mut publisher = client.get_multiplexed_async_connection().await?;
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe("bench").await?;
    let mut messages = pubsub.into_on_message();
    let mut bare = Vec::new();
    for i in 0..CHANGES {
        let start = Instant::now();
        let _: i64 = redis::cmd("PUBLISH").arg("bench").arg(i).query_async(&mut publisher).await?;
        messages.next().await;
        bare.push(start.elapsed());
    }

    let fresh = changes(&writer, &replicas).await?;
    Ok((rows(fresh.clone(), bare, "bare pub/sub round trip"), fresh))
}

/// The fake API server's own watch delivery: each of `patches` applied to
/// JukeBox `box`'s status, timed until a bare kube watcher sees it.
pub async fn watch_delivery(
    boxes: &kube::Api<vynil_crds::JukeBox>,
    patches: &[serde_json::Value],
) -> anyhow::Result<Vec<Duration>> {
    use kube::{
        api::{Patch, PatchParams},
        runtime::watcher,
    };
    let mut events = watcher(boxes.clone(), watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        if matches!(event?, watcher::Event::InitDone) {
            break;
        }
    }
    let mut delivered = Vec::new();
    for patch in patches {
        let start = Instant::now();
        boxes.patch_status("box", &PatchParams::default(), &Patch::Merge(patch)).await?;
        loop {
            match events.next().await {
                Some(Ok(watcher::Event::Apply(_))) => break,
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(error.into()),
                None => anyhow::bail!("the watch ended"),
            }
        }
        delivered.push(start.elapsed());
    }
    Ok(delivered)
}
