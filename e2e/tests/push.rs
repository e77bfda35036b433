//! Push-driven freshness, with a real distribution registry whose
//! `notifications.endpoints` point at the gateway's hook: JukeBoxes scheduled
//! far in the future, no scan requested by the test, and every push appears
//! in all three catalog replicas (scanner, catalogs and gateway in this
//! process over real gRPC, sharing one Redis). Prints push → all replicas
//! fresh p50/p99 over 50 pushes; a tag deleted in the registry leaves every
//! view; 100 tags pushed in a burst cause a few scans
//! and end in the view a full scan computes; forged, unsigned and replayed
//! events are refused and reach no registry.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

mod common;

use clap::Parser;
use hmac::{Hmac, Mac};
use vynil_e2e::bound;
use vynil_proto::{
    catalog::v1::{GetCatalogRequest, catalog_client::CatalogClient},
    scanner::v1::{GetScanRequest, ScanState, scanner_client::ScannerClient},
};
use vynil_runtime::Shutdown;
use vynil_testkit::{JukeboxBuilder, PackageSpec, PackageType, RedisServer, RegistryOptions, RegistryServer};

const SECRET: &str = "distribution-hook-secret";
const CI_SECRET: &str = "ci-pipeline-hook-secret";

struct World {
    registry: RegistryServer,
    gateway: String,
    scanner: SocketAddr,
    catalogs: Vec<SocketAddr>,
    shutdown: Shutdown,
    redis: RedisServer,
    _dir: tempfile::TempDir,
}

impl World {
    /// JukeBox `box` lists `apps/web` and `apps/new` (nothing published yet);
    /// `other` lists `db/pg`. Both are scheduled once a year.
    async fn start() -> Self {
        let redis = RedisServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let hooks = dir.path().join("hooks.yaml");
        std::fs::write(
            &hooks,
            format!(
                "hooks:\n  - name: registry\n    format: distribution\n    secret: {SECRET}\n  \
                 - name: ci\n    format: generic\n    secret: {CI_SECRET}\n"
            ),
        )
        .unwrap();
        // The gateway's service token, which the scanner's NotifyPush requires.
        let token = dir.path().join("service-token");
        std::fs::write(&token, common::SERVICE_TOKEN).unwrap();
        let token = token.display().to_string();
        // Bound first: the registry's notifications go to the gateway, the
        // gateway's to the scanner, and the scanner reads the registry.
        let (scanner_server, scanner) = bound().await;
        let config = vynil_gateway::Config::parse_from([
            "vynil-gateway",
            "--listen",
            "127.0.0.1:0",
            "--scanner-endpoint",
            &format!("http://{scanner}"),
            "--service-token-file",
            &token,
            "--hooks-file",
            hooks.to_str().unwrap(),
        ]);
        let gateway_bound = vynil_gateway::Gateway::bind(&config).await.unwrap();
        let gateway = gateway_bound.local_addr().unwrap();
        let hook = format!("http://{gateway}/api/v1/hooks/registry");
        let options =
            RegistryOptions { notify: Some((hook, format!("Bearer {SECRET}"))), ..Default::default() };
        let registry = RegistryServer::start_with(options).await.unwrap();
        let host = registry.host();
        let jukeboxes = dir.path().join("jukeboxes");
        std::fs::create_dir_all(&jukeboxes).unwrap();
        JukeboxBuilder::new("box")
            .list([format!("{host}/apps/web"), format!("{host}/apps/new"), format!("{host}/apps/burst")])
            .schedule("0 0 1 1 *")
            .write_to(&jukeboxes)
            .unwrap();
        JukeboxBuilder::new("other")
            .list([format!("{host}/db/pg")])
            .schedule("0 0 1 1 *")
            .write_to(&jukeboxes)
            .unwrap();
        let (jukeboxes, url) = (jukeboxes.display().to_string(), redis.url());
        let shutdown = Shutdown::new();
        let config = vynil_scanner::Config::parse_from([
            "vynil-scanner",
            "--service-token-file",
            &token,
            "--listen",
            &scanner.to_string(),
            "--jukebox-dir",
            &jukeboxes,
            "--redis-url",
            &url,
            "--insecure-registry",
            &host,
        ]);
        tokio::spawn(vynil_scanner::run_on(scanner_server, config, shutdown.signaled()));
        let mut catalogs = Vec::new();
        for _ in 0..3 {
            let (server, listen) = bound().await;
            let config = vynil_catalog::Config::parse_from([
                "vynil-catalog",
                "--listen",
                &listen.to_string(),
                "--jukebox-dir",
                &jukeboxes,
                "--redis-url",
                &url,
            ]);
            tokio::spawn(vynil_catalog::run_on(server, config, shutdown.signaled()));
            catalogs.push(listen);
        }
        tokio::spawn(gateway_bound.serve(shutdown.signaled()));
        for addr in catalogs.iter().chain([&scanner]) {
            common::channel(*addr).await;
        }
        Self { registry, gateway: format!("http://{gateway}"), scanner, catalogs, shutdown, redis, _dir: dir }
    }

    /// Publishes `tag`; returns its manifest digest.
    async fn publish(&self, repository: &str, tag: &str) -> String {
        let (category, name) = repository.split_once('/').unwrap();
        let spec = PackageSpec::new(category, name, PackageType::Tenant, tag);
        self.registry.publisher().publish(repository, &spec).await.unwrap()
    }

    /// The tags of `repository` in `jukebox` as catalog replica `addr` answers.
    async fn tags(addr: SocketAddr, jukebox: &str, repository: &str) -> Vec<String> {
        let mut client = CatalogClient::new(common::channel(addr).await);
        let request = GetCatalogRequest { jukebox: jukebox.into(), ..Default::default() };
        match client.get_catalog(request).await {
            Ok(answer) => answer
                .into_inner()
                .packages
                .into_iter()
                .filter(|p| p.image == repository)
                .map(|p| p.tag)
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Waits until every catalog replica shows `tag` of `repository` in `box`.
    async fn until_everywhere(&self, repository: &str, tag: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for addr in &self.catalogs {
            while !Self::tags(*addr, "box", repository).await.iter().any(|t| t == tag) {
                assert!(Instant::now() < deadline, "catalog {addr} never showed {repository}:{tag}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// Waits until no catalog replica shows `tag` of `repository` in `box` any more.
    async fn until_gone_everywhere(&self, repository: &str, tag: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for addr in &self.catalogs {
            while Self::tags(*addr, "box", repository).await.iter().any(|t| t == tag) {
                assert!(
                    Instant::now() < deadline,
                    "catalog {addr} still shows the deleted {repository}:{tag}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// `(scans ended, registry requests)` so far, from the scanner's metrics.
    async fn counts(&self) -> (u64, u64) {
        let text =
            reqwest::get(format!("http://{}/metrics", self.scanner)).await.unwrap().text().await.unwrap();
        let sum = |prefix: &str| -> u64 {
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64
        };
        (sum("vynil_scanner_scans_total{"), sum("vynil_scanner_registry_requests_total{"))
    }

    /// Waits until no scan is queued or running (the counts stop moving).
    async fn settled(&self) -> (u64, u64) {
        let mut last = self.counts().await;
        loop {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let now = self.counts().await;
            if now == last {
                return now;
            }
            last = now;
        }
    }
}

/// `X-Vynil-Signature` of `body` signed at `at` with `secret` (docs/push.md).
fn signature(at: i64, secret: &str, body: &str) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{at}.{body}").as_bytes());
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Waits until scan `id` succeeded.
async fn until_succeeded(scanner: &ScannerClient<tonic::transport::Channel>, id: &str) {
    common::eventually("the scan to succeed", || {
        let (mut scanner, scan_id) = (scanner.clone(), id.to_string());
        async move {
            let status =
                scanner.get_scan(GetScanRequest { scan_id, ..Default::default() }).await.ok()?.into_inner();
            (status.state == ScanState::Succeeded as i32).then_some(())
        }
    })
    .await;
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

#[tokio::test]
async fn a_push_reaches_every_catalog_replica_without_a_scan_request_and_bursts_coalesce() {
    let world = World::start().await;

    // A repository listed but never published is discovered by its first push.
    world.publish("apps/new", "0.1.0").await;
    world.until_everywhere("apps/new", "0.1.0").await;

    let mut latencies = Vec::new();
    let mut last = String::new();
    for i in 0..50 {
        let tag = format!("1.0.{i}");
        last = world.publish("apps/web", &tag).await;
        let pushed = Instant::now();
        world.until_everywhere("apps/web", &tag).await;
        latencies.push(pushed.elapsed());
    }
    latencies.sort();
    println!(
        "push -> all 3 catalog replicas fresh over {} pushes: p50 {:?}, p99 {:?}, max {:?}",
        latencies.len(),
        quantile(&latencies, 0.5),
        quantile(&latencies, 0.99),
        latencies.last().unwrap()
    );
    // A tag deleted in the registry leaves the view at the scan its delete event causes.
    let deleted = reqwest::Client::new()
        .delete(format!("{}/v2/apps/web/manifests/{last}", world.registry.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 202, "{}", deleted.text().await.unwrap());
    world.until_gone_everywhere("apps/web", "1.0.49").await;
    world.until_everywhere("apps/web", "1.0.48").await;
    assert!(
        World::tags(world.catalogs[0], "other", "apps/web").await.is_empty(),
        "a JukeBox whose source does not contain the pushed repository does not show it"
    );

    // 100 tags at once: the view a full scan computes. (How many scans the
    // pushes made depends on how fast they came: printed, not asserted;
    // coalescing is checked causally below.)
    let (scans_before, _) = world.settled().await;
    let tags: Vec<String> = (0..100).map(|i| format!("2.{}.{}", i / 10, i % 10)).collect();
    let started = Instant::now();
    for tag in &tags {
        world.publish("apps/burst", tag).await;
    }
    let burst = started.elapsed();
    world.until_everywhere("apps/burst", "2.9.9").await;
    let (scans_after, _) = world.settled().await;
    println!("100 tags pushed one after the other in {burst:?}: {} scans", scans_after - scans_before);
    let pushed_view = World::tags(world.catalogs[1], "box", "apps/burst").await;
    let mut scanner = ScannerClient::new(common::channel(world.scanner).await);
    let full = scanner
        .scan(common::as_gateway(
            vynil_proto::scanner::v1::ScanRequest { jukebox: "box".into(), ..Default::default() },
            "ops",
        ))
        .await
        .unwrap()
        .into_inner();
    until_succeeded(&scanner, &full.scan_id).await;
    assert_eq!(World::tags(world.catalogs[2], "box", "apps/burst").await, pushed_view, "push-driven view");

    // Pushes that come while the JukeBox's push scan waits join it: with
    // its scan lease held (as by a replica mid-scan), 20 events for one
    // repository all answer the same scan, and releasing the lease runs one.
    let (scans, _) = world.settled().await;
    let mut redis =
        redis::Client::open(world.redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let lease = "vynil:v1:scanner:lease:box";
    let held: Option<String> = redis::cmd("SET")
        .arg(lease)
        .arg("elsewhere:held-by-the-test")
        .arg("NX")
        .arg("PX")
        .arg(600_000)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(held.is_some(), "the scan lease was free once settled");
    let http = reqwest::Client::new();
    let ci = format!("{}/api/v1/hooks/ci", world.gateway);
    let mut answered = Vec::new();
    for i in 0..20 {
        let body = serde_json::json!({"registry": world.registry.host(), "repository": "apps/burst", "tag": format!("2.0.{i}")})
            .to_string();
        let at = jiff::Timestamp::now().as_second();
        let answer: serde_json::Value = http
            .post(&ci)
            .header("content-type", "application/json")
            .header("x-vynil-timestamp", at.to_string())
            .header("x-vynil-signature", signature(at, CI_SECRET, &body))
            .body(body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let scan = &answer["scans"][0];
        answered.push((
            scan["scan_id"].as_str().unwrap().to_string(),
            scan["joined_existing"].as_bool().unwrap(),
        ));
    }
    let first = answered[0].0.clone();
    let expected: Vec<(String, bool)> = (0..20).map(|i| (first.clone(), i > 0)).collect();
    assert_eq!(answered, expected, "one queued scan, joined by every later push");
    assert_eq!(world.counts().await.0, scans, "no scan ran while the lease was held");
    let _: i64 = redis::cmd("DEL").arg(lease).query_async(&mut redis).await.unwrap();
    until_succeeded(&scanner, &first).await;
    assert_eq!(world.settled().await.0, scans + 1, "20 pushes, one scan");

    // Forged, unsigned and replayed events: refused, and no registry request.
    let (scans, requests) = world.settled().await;
    let http = reqwest::Client::new();
    let envelope = serde_json::json!({"events": [{"id": "forged-1", "action": "push",
        "target": {"mediaType": "application/vnd.oci.image.manifest.v1+json", "repository": "apps/web", "tag": "9.9.9"},
        "request": {"host": world.registry.host()}}]});
    let hook = format!("{}/api/v1/hooks/registry", world.gateway);
    for authorization in [None, Some("Bearer wrong-secret-of-the-right-size"), Some(CI_SECRET)] {
        let mut request = http.post(&hook).json(&envelope);
        if let Some(authorization) = authorization {
            request = request.header("authorization", authorization);
        }
        assert_eq!(request.send().await.unwrap().status(), 401, "{authorization:?}");
    }
    let generic =
        serde_json::json!({"registry": world.registry.host(), "repository": "apps/web", "tag": "9.9.9"})
            .to_string();
    let ci = format!("{}/api/v1/hooks/ci", world.gateway);
    let sign = |at: i64, secret: &str| signature(at, secret, &generic);
    let now = jiff::Timestamp::now().as_second();
    for (at, secret, what) in [
        (now, SECRET, "signed with another hook's secret"),
        (now - 3600, CI_SECRET, "replayed an hour later"),
    ] {
        let answer = http
            .post(&ci)
            .header("content-type", "application/json")
            .header("x-vynil-timestamp", at.to_string())
            .header("x-vynil-signature", sign(at, secret))
            .body(generic.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 401, "{what}");
    }
    let unsigned =
        http.post(&ci).header("content-type", "application/json").body(generic.clone()).send().await;
    assert_eq!(unsigned.unwrap().status(), 401, "unsigned");
    let malformed =
        http.post(&hook).header("authorization", format!("Bearer {SECRET}")).body("{").send().await;
    assert_eq!(malformed.unwrap().status(), 400, "malformed");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(world.counts().await, (scans, requests), "a refused event reached the scanner or a registry");

    // The same signed event twice: the second is a duplicate, answered and ignored.
    let signed = |at: i64| {
        http.post(&ci)
            .header("content-type", "application/json")
            .header("x-vynil-timestamp", at.to_string())
            .header("x-vynil-signature", sign(at, CI_SECRET))
            .body(generic.clone())
    };
    let first: serde_json::Value = signed(now).send().await.unwrap().json().await.unwrap();
    assert_eq!(first["scans"].as_array().unwrap().len(), 1, "{first}");
    let id = first["scans"][0]["scan_id"].as_str().unwrap().to_string();
    let status =
        scanner.get_scan(GetScanRequest { scan_id: id, ..Default::default() }).await.unwrap().into_inner();
    let repository = status.repository.unwrap();
    assert_eq!(
        (status.filter.as_str(), repository.registry, repository.repository.as_str()),
        ("", world.registry.host(), "apps/web"),
        "a push's scan says which repository it reads"
    );
    let again: serde_json::Value = signed(now).send().await.unwrap().json().await.unwrap();
    assert_eq!((again["duplicates"].as_u64(), again["scans"].as_array().map(Vec::len)), (Some(1), Some(0)));
    world.shutdown.trigger();
}
