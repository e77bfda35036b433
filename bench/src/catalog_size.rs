//! P8: the catalog at size. [`JUKEBOXES`] JukeBoxes × [`PACKAGES`] packages
//! × [`REVISIONS`] revisions written to one real Redis (local mode, as the
//! scanner writes statuses), served by one `vynil-catalog` process:
//! - memory per revision in Redis (`used_memory`) and in the catalog
//!   (its RSS loaded, less its RSS with every JukeBox empty);
//! - `GetCatalog` of one JukeBox (a page of [`PAGE`]) while another JukeBox
//!   changes every 100 ms, beside a raw Redis `GET` of the same bytes (the
//!   encoded answer, stored under a key) on one connection;
//! - `WatchCatalog`: [`SUBSCRIBERS`] streams following one JukeBox, and a
//!   change of it. Its ingest (the write's end to the first stream's
//!   message: read, decode, store in Redis, roles) beside the bench's own
//!   write of that status; its fan-out (the first stream's message to the
//!   last's) beside a Redis `PUBLISH` to as many subscribers.
//!
//! The same at a tenth of the JukeBoxes, for the growth of each cost.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use futures::StreamExt;
use prost::Message as _;
use vynil_crds::JukeBoxStatus;
use vynil_proto::catalog::v1::{
    GetCatalogRequest, ListJukeboxesRequest, WatchCatalogRequest, catalog_client::CatalogClient,
};
use vynil_rules::{Package, PackageContent, PackageType};
use vynil_store::{JukeboxStore, LocalStore, RedisTarget};
use vynil_testkit::{JukeboxBuilder, RedisServer, ServiceProcess};

use crate::{
    freshness::percentiles,
    report::{Figure, Row, growth},
    scan::{resident_mib, sibling},
};

const JUKEBOXES: usize = 100;
const PACKAGES: usize = 1_000;
const REVISIONS: usize = 10;
const PAGE: u32 = 100;
const READS: usize = 2_000;
const SUBSCRIBERS: usize = 100;
const FANOUTS: usize = 20;
const TOKEN: &str = "bench-service-token";
const NAME: &str = "catalog at size (1 000 packages x 10 revisions per JukeBox)";

pub async fn catalog_size() -> Figure {
    Figure::from_result("P8", NAME, at_two_sizes(JUKEBOXES).await)
}

async fn at_two_sizes(jukeboxes: usize) -> anyhow::Result<Vec<Row>> {
    let small = measure(jukeboxes / 10).await?;
    let large = measure(jukeboxes).await?;
    let mut rows = large.rows;
    let (n, m) = (small.revisions, large.revisions);
    // `growth` divides by the size: it is given totals, not per-revision figures.
    let total = |revisions: f64, per_revision: f64| (revisions, revisions * per_revision);
    rows.extend(growth(
        "Redis memory",
        "B per revision",
        total(n, small.redis_bytes),
        total(m, large.redis_bytes),
    ));
    rows.extend(growth(
        "catalog RSS",
        "B per revision",
        total(n, small.catalog_bytes),
        total(m, large.catalog_bytes),
    ));
    rows.push(
        Row::new(format!("GetCatalog p50 at {m:.0} revisions"), large.p50_ms, "ms")
            .against(format!("the same at {n:.0}"), small.p50_ms),
    );
    Ok(rows)
}

struct Sized {
    rows: Vec<Row>,
    revisions: f64,
    redis_bytes: f64,
    catalog_bytes: f64,
    p50_ms: f64,
}

fn packages(jukebox: usize, generation: usize) -> Vec<Package> {
    (0..PACKAGES)
        .flat_map(|p| {
            (0..REVISIONS).map(move |r| {
                let name = format!("pkg{p}");
                let content = PackageContent::minimal("bench", &name, PackageType::Tenant);
                let repository = format!("jb{jukebox}/{name}");
                Package::new("registry.example", &repository, &format!("1.{generation}.{r}"), content)
            })
        })
        .collect()
}

async fn write(writer: &LocalStore, jukebox: usize, generation: usize) -> anyhow::Result<()> {
    let name = format!("jb{jukebox}");
    let version = writer.get(&name).await?.map(|r| r.status_version).unwrap_or_default();
    let status = JukeBoxStatus { packages: packages(jukebox, generation), ..Default::default() };
    writer.write_status(&name, &version, &status).await?;
    Ok(())
}

async fn used_memory(redis: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(redis).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no used_memory in INFO memory"))
}

fn authorized<T>(message: T) -> anyhow::Result<tonic::Request<T>> {
    Ok(vynil_testkit::as_gateway(message, TOKEN, "bench")?)
}

/// Waits until the catalog serves `jukeboxes` JukeBoxes of every revision.
async fn loaded(
    catalog: &mut CatalogClient<tonic::transport::Channel>,
    jukeboxes: usize,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let list = catalog.list_jukeboxes(authorized(ListJukeboxesRequest::default())?).await?.into_inner();
        let full = list.jukeboxes.iter().filter(|j| j.package_count as usize == PACKAGES * REVISIONS).count();
        if full == jukeboxes {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the catalog loaded {full} of {jukeboxes} JukeBoxes in 10 min"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn measure(jukeboxes: usize) -> anyhow::Result<Sized> {
    anyhow::ensure!(jukeboxes >= 3, "P8 needs 3 JukeBoxes or more");
    let redis = RedisServer::start().await?;
    let mut raw = redis::Client::open(redis.url())?.get_multiplexed_async_connection().await?;
    let dir = tempfile::tempdir()?;
    let boxes = dir.path().join("jukeboxes");
    std::fs::create_dir_all(&boxes)?;
    for j in 0..jukeboxes {
        JukeboxBuilder::new(&format!("jb{j}")).write_to(&boxes)?;
    }
    let catalog = start_catalog(dir.path(), &boxes, &redis).await?;
    let mut client = CatalogClient::new(catalog.channel().await?);
    let idle_rss = resident_mib(catalog.pid(), "VmRSS:")?;
    let redis_before = used_memory(&mut raw).await?;
    let writer = LocalStore::with_redis(boxes.clone(), &RedisTarget::url(redis.url())).await?;
    for j in 0..jukeboxes {
        write(&writer, j, 0).await?;
    }
    loaded(&mut client, jukeboxes).await?;
    let revisions = (jukeboxes * PACKAGES * REVISIONS) as f64;
    let redis_bytes = (used_memory(&mut raw).await? - redis_before) / revisions;
    let loaded_rss = resident_mib(catalog.pid(), "VmRSS:")?;
    let catalog_bytes = (loaded_rss - idle_rss) * 1024.0 * 1024.0 / revisions;

    // Reads of jb0 while jb1 changes every 100 ms.
    let changes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let changer = {
        let writer = LocalStore::with_redis(boxes.clone(), &RedisTarget::url(redis.url())).await?;
        let changes = changes.clone();
        tokio::spawn(async move {
            for generation in 1.. {
                let started = Instant::now();
                if write(&writer, 1, generation).await.is_err() {
                    return;
                }
                changes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100).saturating_sub(started.elapsed())).await;
            }
        })
    };
    let request = GetCatalogRequest { jukebox: "jb0".into(), page_size: PAGE, ..Default::default() };
    let (mut reads, mut bytes) = (Vec::with_capacity(READS), Vec::new());
    for _ in 0..READS {
        let start = Instant::now();
        let answer = client.get_catalog(authorized(request.clone())?).await?.into_inner();
        reads.push(start.elapsed());
        bytes = answer.encode_to_vec();
    }
    changer.abort();
    let changes = changes.load(std::sync::atomic::Ordering::SeqCst);
    let _: () = redis::cmd("SET").arg("bench:page").arg(&bytes).query_async(&mut raw).await?;
    let mut gets = Vec::with_capacity(READS);
    for _ in 0..READS {
        let start = Instant::now();
        let got: Vec<u8> = redis::cmd("GET").arg("bench:page").query_async(&mut raw).await?;
        gets.push(start.elapsed());
        anyhow::ensure!(got.len() == bytes.len(), "Redis answered {} bytes of {}", got.len(), bytes.len());
    }
    let (fanout, publish) = fan_out(&mut client, &writer, &redis).await?;

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (p50, p99) = percentiles(reads);
    let (g50, g99) = percentiles(gets);
    let (w50, _) = percentiles(fanout.write);
    let (i50, i99) = percentiles(fanout.first);
    let (f50, f99) = percentiles(fanout.spread);
    let (b50, b99) = percentiles(publish);
    let kib = bytes.len() as f64 / 1024.0;
    let rows = vec![
        Row::new(format!("Redis memory per revision, {revisions:.0} revisions"), redis_bytes, "B"),
        Row::new("catalog RSS per revision", catalog_bytes, "B"),
        Row::new("catalog RSS loaded", loaded_rss, "MiB").against("the same process, every JukeBox empty", idle_rss),
        Row::new(format!("GetCatalog, a page of {PAGE} ({kib:.0} KiB), while another JukeBox changed {changes} times, p50"), ms(p50), "ms")
            .against("a raw Redis GET of the same bytes, p50", ms(g50)),
        Row::new("GetCatalog, p99", ms(p99), "ms").against("a raw Redis GET of the same bytes, p99", ms(g99)),
        Row::new(format!("a change of {} revisions -> the first WatchCatalog message (ingest), p50 of {FANOUTS}", PACKAGES * REVISIONS), ms(i50), "ms")
            .against("the bench's write of that status (encode, store, announce), p50", ms(w50)),
        Row::new("the same, p99", ms(i99), "ms"),
        Row::new(format!("WatchCatalog fan-out, first -> last of {SUBSCRIBERS} streams, p50"), ms(f50), "ms")
            .against(format!("Redis PUBLISH -> {SUBSCRIBERS} subscribers, p50"), ms(b50)),
        Row::new("WatchCatalog fan-out, p99", ms(f99), "ms")
            .against(format!("Redis PUBLISH -> {SUBSCRIBERS} subscribers, p99"), ms(b99)),
    ];
    Ok(Sized { rows, revisions, redis_bytes, catalog_bytes, p50_ms: ms(p50) })
}

async fn start_catalog(dir: &Path, boxes: &Path, redis: &RedisServer) -> anyhow::Result<ServiceProcess> {
    let token = dir.join("service-token");
    std::fs::write(&token, format!("{TOKEN}\n"))?;
    let (boxes, token) = (boxes.to_string_lossy().into_owned(), token.to_string_lossy().into_owned());
    let args = ["--jukebox-dir", &boxes, "--redis-url", &redis.url(), "--service-token-file", &token];
    Ok(ServiceProcess::start(&sibling("vynil-catalog")?, &args).await?)
}

/// What [`FANOUTS`] changes of one JukeBox gave.
#[derive(Default)]
struct FanOut {
    /// The bench's write of the status (encoded, stored, announced).
    write: Vec<Duration>,
    /// From the write's end to the first stream's message: the catalog's ingest.
    first: Vec<Duration>,
    /// From the first stream's message to the last's: the fan-out itself.
    spread: Vec<Duration>,
}

/// [`FANOUTS`] changes of jb2 until each of [`SUBSCRIBERS`] `WatchCatalog`
/// streams has it, and as many Redis `PUBLISH`es until each of as many
/// subscribers has it (the time to the last).
async fn fan_out(
    client: &mut CatalogClient<tonic::transport::Channel>,
    writer: &LocalStore,
    redis: &RedisServer,
) -> anyhow::Result<(FanOut, Vec<Duration>)> {
    let mut streams = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let request = WatchCatalogRequest { jukeboxes: vec!["jb2".into()] };
        streams.push(client.watch_catalog(authorized(request)?).await?.into_inner());
    }
    let mut fanout = FanOut::default();
    for generation in 1..=FANOUTS {
        let start = Instant::now();
        write(writer, 2, generation).await?;
        let wrote = Instant::now();
        let mut first = None;
        for stream in &mut streams {
            tokio::time::timeout(Duration::from_secs(60), stream.message())
                .await
                .map_err(|_| anyhow::anyhow!("a WatchCatalog stream saw no change in 60 s"))??;
            first.get_or_insert_with(Instant::now);
        }
        let first = first.unwrap_or(wrote);
        fanout.write.push(wrote - start);
        fanout.first.push(first - wrote);
        fanout.spread.push(first.elapsed());
    }
    let client = redis::Client::open(redis.url())?;
    let mut subscribers = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe("bench:fanout").await?;
        subscribers.push(pubsub.into_on_message());
    }
    let mut publisher = client.get_multiplexed_async_connection().await?;
    let mut publish = Vec::new();
    for i in 0..FANOUTS {
        let start = Instant::now();
        let _: i64 = redis::cmd("PUBLISH").arg("bench:fanout").arg(i).query_async(&mut publisher).await?;
        for subscriber in &mut subscribers {
            subscriber.next().await;
        }
        publish.push(start.elapsed());
    }
    Ok((fanout, publish))
}
