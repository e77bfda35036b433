//! P7: the lifecycle at fleet scale, on the fake Kubernetes API server (the
//! strict one: admission, schemas and RBAC as a real one refuses them), its
//! agent Jobs completed at once by the test kit's `InstantAgent` (no pod,
//! no process per Job). `--instances` TenantInstances over [`JUKEBOXES`]
//! JukeBoxes (each listing one of [`PACKAGES`] packages) are created at once,
//! then followed until every one is installed; then a new revision of one
//! package (the JukeBoxes of 10% of the instances) until they are upgraded;
//! all with the default `--requeue-seconds` (900 s, as deployed). Then the
//! lifecycle is started again with it scaled down ([`REQUEUE_SECONDS`]) for
//! an idle window, its requests scaled to an hour at the default. Scaled
//! down while installing, every instance installed early was requeued
//! again and again while the others installed: requests per instance grew
//! with the install's duration, so with the fleet (exponent 1.2 from 1 000
//! to 10 000), an artefact of the bench, not the cost of a deployed
//! lifecycle. Only the lifecycle's requests are counted (by its user agent).
//!
//! The same runs at a tenth of the instances, for the growth of each cost.
//! Baseline, same run: the fake API server's own cost for as many creates,
//! one status patch each and a watcher seeing every event (ConfigMaps, no
//! controller).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
    runtime::watcher,
};
use serde_json::json;
use vynil_e2e::fleet::{Fleet, Shape};
use vynil_proto::{
    catalog::v1::{GetCatalogRequest, catalog_client::CatalogClient},
    scanner::v1::{ScanRequest, scanner_client::ScannerClient},
};
use vynil_testkit::{JukeboxBuilder, kube_api::InstantAgent};

use crate::{
    report::{Figure, Row, growth},
    scan::resident_mib,
};

const JUKEBOXES: usize = 100;
const PACKAGES: usize = 10;
/// Lifecycle's `--requeue-seconds` for the idle window, and the window.
const REQUEUE_SECONDS: u64 = 10;
const IDLE: Duration = Duration::from_secs(20);
/// Lifecycle's default `--requeue-seconds`, which the idle figure is scaled to.
const DEFAULT_REQUEUE_SECONDS: f64 = 900.0;
const MAX_RUNNING_JOBS: usize = 32;
/// Creates in flight at once (the bench's own client).
const CREATES: usize = 32;
const NAME: &str = "lifecycle at fleet scale (strict fake API server, instant agent)";

pub async fn fleet_scale(instances: usize) -> Figure {
    // The fleet is test infrastructure, which panics on a failed set-up: a
    // task keeps that from taking the whole bench down.
    match tokio::spawn(at_two_sizes(instances)).await {
        Ok(rows) => Figure::from_result("P7", NAME, rows),
        Err(panic) => Figure::failed("P7", NAME, format!("the fleet panicked: {panic}")),
    }
}

async fn at_two_sizes(instances: usize) -> anyhow::Result<Vec<Row>> {
    let small = measure(instances / 10).await?;
    let large = measure(instances).await?;
    let mut rows = large.rows;
    let (n, m) = (small.instances as f64, large.instances as f64);
    rows.extend(growth(
        "install all",
        "ms per instance",
        (n, small.install_s * 1e3),
        (m, large.install_s * 1e3),
    ));
    rows.extend(growth("lifecycle API requests", "per instance", (n, small.requests), (m, large.requests)));
    rows.extend(growth(
        "lifecycle peak RSS",
        "KiB per instance",
        (n, small.rss_mib * 1024.0),
        (m, large.rss_mib * 1024.0),
    ));
    Ok(rows)
}

struct Run {
    rows: Vec<Row>,
    instances: usize,
    install_s: f64,
    /// Lifecycle requests while installing.
    requests: f64,
    rss_mib: f64,
}

fn package(jukebox: usize) -> String {
    format!("web{}", jukebox % PACKAGES)
}

async fn measure(instances: usize) -> anyhow::Result<Run> {
    let shape = Shape {
        catalogs: 1,
        scanners: 1,
        purgers: 0,
        lifecycles: 1,
        gateways: 0,
        requeue_seconds: DEFAULT_REQUEUE_SECONDS as u64,
        max_running_jobs: MAX_RUNNING_JOBS,
        ..Shape::default()
    };
    let names: Vec<String> = (0..PACKAGES).map(|p| format!("apps/web{p}")).collect();
    let repositories: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut fleet = Fleet::start(&shape, &repositories, "tokens: []\n").await;
    for p in 0..PACKAGES {
        fleet.publish(&format!("web{p}"), "1.0.0").await;
    }
    for j in 0..JUKEBOXES {
        let image = format!("{}/apps/{}", fleet.front.host(), package(j));
        let jukebox = JukeboxBuilder::new(&format!("jb{j}")).list([image]).schedule("0 0 1 1 *").json();
        fleet.boxes.create(&PostParams::default(), &serde_json::from_value(jukebox)?).await?;
    }
    scan_and_wait(&fleet, (0..JUKEBOXES).collect(), "1.0.0").await?;
    let lifecycle = fleet.lifecycles[0].pid();
    let idle_rss = resident_mib(lifecycle, "VmHWM:")?;
    let agent = InstantAgent::start(&fleet.api, vynil_e2e::CONTROL_PLANE_NAMESPACE)?;
    let client = fleet.api.client()?;
    let api = vynil_e2e::tenant_instances(&client);

    fleet.api.clear_requests();
    let start = Instant::now();
    futures::stream::iter(0..instances)
        .map(|i| {
            let api = api.clone();
            let jukebox = i % JUKEBOXES;
            let instance = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
                "metadata": {"name": format!("i{i}"), "namespace": "apps"},
                "spec": {"jukebox": format!("jb{jukebox}"), "category": "apps", "package": package(jukebox)}});
            async move {
                let instance = serde_json::from_value(instance)?;
                anyhow::Ok(api.create(&PostParams::default(), &instance).await?)
            }
        })
        .buffer_unordered(CREATES)
        .try_collect::<Vec<_>>()
        .await?;
    let created = start.elapsed();
    installed(&fleet, |_| "1.0.0", instances).await?;
    let install = start.elapsed();
    let install_requests = lifecycle_requests(&fleet);
    let jobs_created = install_requests.get("create jobs").copied().unwrap_or_default();
    let peak_rss = resident_mib(lifecycle, "VmHWM:")?;
    anyhow::ensure!(agent.failed() == 0, "{} agent Jobs failed", agent.failed());

    // 10% of the instances: the JukeBoxes of package web0.
    fleet.api.clear_requests();
    fleet.publish("web0", "1.1.0").await;
    let start = Instant::now();
    let upgraded: Vec<usize> = (0..JUKEBOXES).filter(|j| package(*j) == "web0").collect();
    scan_and_wait(&fleet, upgraded, "1.1.0").await?;
    let version = |i: usize| if package(i % JUKEBOXES) == "web0" { "1.1.0" } else { "1.0.0" };
    installed(&fleet, version, instances).await?;
    let upgrade = start.elapsed();
    let upgrade_requests = lifecycle_requests(&fleet);

    // At rest, the requeue scaled down: the lifecycle started again with it;
    // measured once the new process leads (the lease expires) and its first
    // pass over every instance is over.
    fleet.lifecycles[0].restart_with("--requeue-seconds", &REQUEUE_SECONDS.to_string()).await?;
    tokio::time::sleep(Duration::from_secs(shape.lease_seconds + 2 * REQUEUE_SECONDS)).await;
    fleet.api.clear_requests();
    tokio::time::sleep(IDLE).await;
    let at_rest = lifecycle_requests(&fleet);
    let sum = |requests: &BTreeMap<String, usize>| -> usize {
        requests.iter().filter(|(k, _)| !k.starts_with("conflict")).map(|(_, v)| v).sum()
    };
    let idle_total = sum(&at_rest);
    let per_hour = idle_total as f64 / instances as f64
        * (REQUEUE_SECONDS as f64 / IDLE.as_secs_f64())
        * (3600.0 / DEFAULT_REQUEUE_SECONDS);

    let floor = fake_floor(&fleet, instances).await?;
    let (upgraded, total) = ((instances / 10).max(1), sum(&install_requests));
    let each = |verb: &str| -> f64 {
        install_requests.iter().filter(|(k, _)| k.starts_with(verb)).map(|(_, v)| *v).sum::<usize>() as f64
            / instances as f64
    };
    let mut rows = vec![
        Row::new(
            format!("{instances} TenantInstances created at once -> all installed"),
            install.as_secs_f64(),
            "s",
        )
        .against("the fake's own cost: as many creates, a status patch each, watched", floor.as_secs_f64()),
        Row::new("of which the bench's creates", created.as_secs_f64(), "s"),
        Row::new(
            format!("agent Jobs created per second (--max-running-jobs {MAX_RUNNING_JOBS})"),
            jobs_created as f64 / install.as_secs_f64(),
            "Jobs/s",
        ),
        Row::new(
            "lifecycle API requests per instance, installing",
            total as f64 / instances as f64,
            "requests",
        ),
    ];
    for verb in ["get", "list", "watch", "create", "patch", "update", "delete"] {
        rows.push(Row::new(format!("  of which {verb}"), each(verb), "requests"));
    }
    rows.push(Row::new("  of which refused 409 Conflict (any verb)", each("conflict"), "requests"));
    rows.extend([
        Row::new(
            format!("catalog change upgrading {} instances -> the last upgraded", instances / 10),
            upgrade.as_secs_f64(),
            "s",
        ),
        Row::new(
            "lifecycle API requests per upgraded instance, upgrading",
            sum(&upgrade_requests) as f64 / upgraded as f64,
            "requests",
        ),
        Row::new(
            "lifecycle API requests per instance per hour at rest (requeue scaled to 900 s)",
            per_hour,
            "requests",
        ),
        Row::new("vynil-lifecycle peak RSS", peak_rss, "MiB").against("the same process idle", idle_rss),
    ]);
    let text = at_rest.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", ");
    eprintln!(
        "P7 at {instances}: requests at rest in {IDLE:?}: {text}; installing: {install_requests:?}; upgrading: {upgrade_requests:?}"
    );
    Ok(Run { rows, instances, install_s: install.as_secs_f64(), requests: total as f64, rss_mib: peak_rss })
}

/// Scans each JukeBox `jb<j>` and waits until its catalog holds `tag`.
async fn scan_and_wait(fleet: &Fleet, jukeboxes: Vec<usize>, tag: &str) -> anyhow::Result<()> {
    let mut scanner = ScannerClient::new(fleet.scanners[0].channel().await?);
    let mut catalog = CatalogClient::new(fleet.catalogs[0].channel().await?);
    for j in &jukeboxes {
        let request = ScanRequest { jukebox: format!("jb{j}"), ..Default::default() };
        scanner.scan(vynil_e2e::as_gateway(request, "bench")).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    for j in jukeboxes {
        let request = GetCatalogRequest { jukebox: format!("jb{j}"), ..Default::default() };
        loop {
            let answer = catalog.get_catalog(vynil_e2e::as_gateway(request.clone(), "bench")).await;
            if answer.is_ok_and(|a| a.into_inner().packages.iter().any(|p| p.tag == tag)) {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "jb{j}'s catalog never showed {tag}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// Waits until the lifecycle recorded `version(n)` as installed on every
/// instance `i<n>` (`status.package`, once its Job was read back complete; read
/// in the fake's store, not through the API: the reads are not counted).
async fn installed(
    fleet: &Fleet,
    version: impl Fn(usize) -> &'static str,
    instances: usize,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let done = fleet.api.count("vynil.solidite.fr", "tenantinstances", |o| {
            let index =
                o["metadata"]["name"].as_str().and_then(|n| n.strip_prefix('i')).and_then(|n| n.parse().ok());
            index.is_some_and(|i: usize| o["status"]["package"]["tag"] == version(i))
        });
        if done == instances {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{done} of {instances} instances installed within 30 min");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The lifecycle's requests since the log was cleared, by `<verb> <resource>`.
fn lifecycle_requests(fleet: &Fleet) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for request in fleet.api.requests() {
        if request.user_agent.starts_with("vynil-lifecycle") {
            let resource = match &request.subresource {
                Some(sub) => format!("{}/{sub}", request.resource),
                None => request.resource.clone(),
            };
            *counts.entry(format!("{} {resource}", request.verb)).or_default() += 1;
            if request.status == 409 {
                *counts.entry(format!("conflict: {} {resource}", request.verb)).or_default() += 1;
            }
        }
    }
    if std::env::var_os("VYNIL_BENCH_DETAIL").is_some() {
        eprintln!("lifecycle requests: {counts:#?}");
    }
    counts
}

/// The fake's own cost for `count` creates, a status-like patch each, and a
/// watcher seeing all of them: ConfigMaps no controller follows.
async fn fake_floor(fleet: &Fleet, count: usize) -> anyhow::Result<Duration> {
    fleet.api.create_namespaces(&["floor"])?;
    let maps: Api<ConfigMap> = Api::namespaced(fleet.api.client()?, "floor");
    let watched = maps.clone();
    let expected = 2 * count;
    let mut events = watcher(watched, watcher::Config::default()).boxed();
    while !matches!(events.try_next().await?, Some(watcher::Event::InitDone) | None) {}
    let follower = tokio::spawn(async move {
        let mut seen = 0;
        while seen < expected {
            match events.next().await {
                Some(Ok(watcher::Event::Apply(_))) => seen += 1,
                Some(_) => {}
                None => break,
            }
        }
    });
    let start = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let maps = maps.clone();
            async move {
                let map =
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("c{i}")}});
                maps.create(&PostParams::default(), &serde_json::from_value(map)?).await?;
                let patch = json!({"data": {"tag": "1.0.0"}});
                maps.patch(&format!("c{i}"), &PatchParams::default(), &Patch::Merge(patch)).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CREATES)
        .try_collect::<Vec<_>>()
        .await?;
    tokio::time::timeout(Duration::from_secs(300), follower).await??;
    Ok(start.elapsed())
}
