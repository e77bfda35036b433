//! P2: what a scan costs, counted at the registry's front: a repository of
//! `--tags` versions (one `service` among `tenant`s, so the type-aware
//! descent reads to the end, and a signature every 100 tags) and three of
//! 100, scanned by a `vynil-scanner` process; a first scan, then an
//! immediate rescan. Baselines in the same run, through the same front: the
//! tag-list requests alone, and every manifest of the large repository read
//! by a plain HTTP client at the scanner's concurrency. Then the purger's
//! load: a `vynil-purger` process plans the whole JukeBox (every tag) and
//! purges one small repository, its peak RSS beside its own idle one.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use futures::StreamExt;
use reqwest::Method;
use vynil_proto::scanner::v1::{GetScanRequest, ScanRequest, ScanState, scanner_client::ScannerClient};
use vynil_testkit::{
    ArtifactKind, HttpFront, JukeboxBuilder, PackageSpec, PackageType, RegistryServer, ServiceProcess,
};

use crate::report::{Figure, Row};

const SMALL: [&str; 3] = ["small/a", "small/b", "small/c"];
const SMALL_TAGS: usize = 100;
/// The scanner's default `--manifest-read-ahead`: the plain client's concurrency too.
const CONCURRENCY: usize = 8;

pub async fn scan_cost(tags: usize) -> Figure {
    Figure::from_result("P2", "scan cost", at_two_sizes(tags).await)
}

/// The scan at `tags / 10`, then at `tags` (with the purger's load): the
/// rows of the large one, then the cost per tag of each scan at both sizes.
async fn at_two_sizes(tags: usize) -> anyhow::Result<Vec<Row>> {
    let small = measure(tags / 10, false).await?;
    let large = measure(tags, true).await?;
    let mut rows = large.rows;
    let (n, m) = (small.version_tags, large.version_tags);
    rows.extend(crate::report::growth(
        "first scan",
        "ms per tag",
        (n, small.first * 1e3),
        (m, large.first * 1e3),
    ));
    rows.extend(crate::report::growth(
        "rescan",
        "ms per tag",
        (n, small.rescan * 1e3),
        (m, large.rescan * 1e3),
    ));
    Ok(rows)
}

/// What one size gave.
struct Scans {
    rows: Vec<Row>,
    version_tags: f64,
    /// Seconds.
    first: f64,
    rescan: f64,
}

fn version(i: usize) -> String {
    format!("{}.{}.{}", i / 1000, (i / 10) % 100, i % 10)
}

async fn registry(tags: usize) -> anyhow::Result<RegistryServer> {
    let registry = RegistryServer::from_fixture(&format!("bench-scan-{tags}-v1"), |registry| async move {
        let publisher = registry.publisher();
        let mut items: Vec<(String, PackageSpec)> = (0..tags)
            .map(|i| {
                let kind = if i == 3 { PackageType::Service } else { PackageType::Tenant };
                ("big/repo".to_string(), PackageSpec::new("big", "repo", kind, &version(i)))
            })
            .collect();
        for repository in SMALL {
            let name = repository.trim_start_matches("small/");
            items.extend((0..SMALL_TAGS).map(|i| {
                let spec = PackageSpec::new("small", name, PackageType::Tenant, &version(i));
                (repository.to_string(), if i % 3 == 1 { spec.min(&version(i - 1)) } else { spec })
            }));
        }
        let digests = publisher.publish_all(&items, 16).await?;
        for digest in digests.iter().take(tags).step_by(100) {
            publisher.attach("big/repo", digest, ArtifactKind::Signature).await?;
        }
        Ok(registry)
    })
    .await?;
    Ok(registry)
}

/// A binary beside this one, built with the same profile as the code stands
/// (the package of a `vynil-<service>` binary is its name; the baseline is ours).
pub fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let package = if name == "vynil-health-only" { "vynil-bench" } else { name };
    Ok(vynil_testkit::workspace_binary(package, name)?)
}

/// Resident memory of a process in MiB, as `/proc` gives it: `VmHWM:` (the
/// peak) or `VmRSS:` (now).
pub fn resident_mib(pid: u32, field: &str) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no {field} for process {pid}"))?;
    Ok(kib / 1024.0)
}

pub async fn scan_once(client: &mut ScannerClient<tonic::transport::Channel>) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let id =
        client.scan(ScanRequest { jukebox: "box".into(), ..Default::default() }).await?.into_inner().scan_id;
    loop {
        let status =
            client.get_scan(GetScanRequest { scan_id: id.clone(), ..Default::default() }).await?.into_inner();
        match ScanState::try_from(status.state) {
            Ok(ScanState::Succeeded) => return Ok(start.elapsed()),
            Ok(ScanState::Queued | ScanState::Running) => tokio::time::sleep(Duration::from_millis(20)).await,
            other => anyhow::bail!("the scan ended {other:?}: {:?}", status.errors),
        }
    }
}

struct Counts {
    lists: usize,
    heads: usize,
    gets: usize,
}

fn counts(front: &HttpFront) -> Counts {
    Counts {
        lists: front.count(&Method::GET, "/tags/list"),
        heads: front.count(&Method::HEAD, "/manifests/"),
        gets: front.count(&Method::GET, "/manifests/"),
    }
}

async fn measure(tags: usize, with_purge: bool) -> anyhow::Result<Scans> {
    let binary = sibling("vynil-scanner")?;
    let registry = registry(tags).await?;
    let front = HttpFront::start(&registry.base_url()).await?;
    let dir = tempfile::tempdir()?;
    let repositories: Vec<String> =
        std::iter::once("big/repo").chain(SMALL).map(|r| format!("{}/{r}", front.host())).collect();
    JukeboxBuilder::new("box").list(&repositories).write_to(dir.path())?;
    let max_tags = (tags + tags / 10 + 100).to_string();
    let host = front.host();
    let args = [
        // Loopback, as in local mode.
        "--allow-unauthenticated",
        "--jukebox-dir",
        dir.path().to_str().unwrap_or_default(),
        "--insecure-registry",
        &host,
        "--max-tags-per-repository",
        &max_tags,
        "--vynil-version",
        "0.8.0",
        "--poll-milliseconds",
        "20",
    ];
    let scanner = ServiceProcess::start(&binary, &args).await?;
    let idle_rss = resident_mib(scanner.pid(), "VmHWM:")?;
    let mut client = ScannerClient::new(scanner.channel().await?);

    front.reset_counts();
    let first = scan_once(&mut client).await?;
    let first_counts = counts(&front);
    front.reset_counts();
    let rescan = scan_once(&mut client).await?;
    let rescan_counts = counts(&front);
    let peak_rss = resident_mib(scanner.pid(), "VmHWM:")?;

    // Baselines, through the same front.
    let http = reqwest::Client::new();
    let base = format!("http://{}", front.host());
    let list = |repository: String| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let mut names = Vec::new();
            let mut path = format!("/v2/{repository}/tags/list?n=1000");
            loop {
                let response = http.get(format!("{base}{path}")).send().await?.error_for_status()?;
                let next = response
                    .headers()
                    .get("link")
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| l.split(';').next())
                    .map(|l| l.trim().trim_start_matches('<').trim_end_matches('>').to_string());
                let page: serde_json::Value = response.json().await?;
                names.extend(
                    page["tags"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|t| t.as_str().map(String::from)),
                );
                match next {
                    Some(next) => path = next,
                    None => return Ok::<_, anyhow::Error>(names),
                }
            }
        }
    };
    let start = Instant::now();
    let mut listed = Vec::new();
    for repository in std::iter::once("big/repo").chain(SMALL) {
        let names = list(repository.to_string()).await?;
        listed.extend(
            names
                .into_iter()
                .filter(|t| vynil_rules::Tag::parse(t).is_some())
                .map(|t| format!("{repository}/manifests/{t}")),
        );
    }
    let lists_alone = start.elapsed();
    let big: Vec<&String> = listed.iter().filter(|m| m.starts_with("big/repo/")).collect();
    let plain_gets = plain_reads(&http, &base, Method::GET, &big).await?;
    // The rescan's floor: the same tag lists, then a HEAD of every version
    // tag it HEADs, at the same window.
    let start = Instant::now();
    for repository in std::iter::once("big/repo").chain(SMALL) {
        list(repository.to_string()).await?;
    }
    let every: Vec<&String> = listed.iter().collect();
    let plain_heads = start.elapsed() + plain_reads(&http, &base, Method::HEAD, &every).await?;

    let version_tags = listed.len() as f64;
    let s = |d: Duration| d.as_secs_f64();
    let mut rows = vec![
        Row::new(format!("first scan, {tags} + 3 x {SMALL_TAGS} tags"), s(first), "s").against(
            format!("{} manifest GETs, plain client, {CONCURRENCY} at once", big.len()),
            s(plain_gets),
        ),
        Row::new("first scan: manifest GETs", first_counts.gets as f64, "requests")
            .against("version tags", version_tags),
        Row::new("first scan: manifest HEADs", first_counts.heads as f64, "requests"),
        Row::new("first scan: tag-list requests", first_counts.lists as f64, "requests"),
        Row::new("immediate rescan", s(rescan), "s").against(
            format!("the tag lists + {} manifest HEADs, plain client, {CONCURRENCY} at once", listed.len()),
            s(plain_heads),
        ),
        Row::new("the tag-list requests alone", s(lists_alone), "s"),
        Row::new("rescan: manifest GETs", rescan_counts.gets as f64, "requests"),
        Row::new("rescan: manifest HEADs", rescan_counts.heads as f64, "requests")
            .against("version tags", version_tags),
        Row::new("scanner peak RSS", peak_rss, "MiB").against("the same process idle", idle_rss),
    ];
    if with_purge {
        let (purger_idle, purger_peak, deleted) = purge_load(dir.path(), &host, &max_tags).await?;
        rows.push(
            Row::new(
                format!("purger peak RSS, planning every tag, purging {deleted} digests"),
                purger_peak,
                "MiB",
            )
            .against("the same process idle", purger_idle),
        );
    }
    Ok(Scans { rows, version_tags, first: s(first), rescan: s(rescan) })
}

/// `paths` (`<repository>/manifests/<tag>`) read with `method` by a plain
/// client, [`CONCURRENCY`] at once: how long that took.
async fn plain_reads(
    http: &reqwest::Client,
    base: &str,
    method: Method,
    paths: &[&String],
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let read: Vec<anyhow::Result<()>> = futures::stream::iter(paths)
        .map(|path| {
            let request = http
                .request(method.clone(), format!("{base}/v2/{path}"))
                .header("accept", "application/vnd.oci.image.manifest.v1+json");
            async move {
                request.send().await?.error_for_status()?.bytes().await?;
                Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    anyhow::ensure!(read.iter().all(Result::is_ok), "the plain client's manifest {method}s failed");
    Ok(start.elapsed())
}

/// A purger on the scanned JukeBox (`dir`, through the front `host`): its
/// idle and peak RSS around a plan of the whole JukeBox and the purge of one
/// small repository, and how many digests that deleted.
async fn purge_load(dir: &std::path::Path, host: &str, max_tags: &str) -> anyhow::Result<(f64, f64, usize)> {
    use vynil_proto::purger::v1::{
        DeletionState, ExecuteRequest, PlanRequest, Repository, execute_progress::Event,
        plan_request::Target, purger_client::PurgerClient,
    };
    let args = [
        "--jukebox-dir",
        dir.to_str().unwrap_or_default(),
        "--insecure-registry",
        host,
        "--vynil-version",
        "0.8.0",
        // The scanner's cap: the large repository's signatures count as tags.
        "--max-tags-per-repository",
        max_tags,
        // Loopback only: executing without the gateway's service token.
        "--allow-unauthenticated",
    ];
    let purger = ServiceProcess::start(&sibling("vynil-purger")?, &args).await?;
    let idle = resident_mib(purger.pid(), "VmHWM:")?;
    let mut client = PurgerClient::new(purger.channel().await?);
    // The whole JukeBox planned (and held), one small repository purged: ten
    // thousand verified DELETEs would take minutes and tell nothing more.
    client.plan(PlanRequest { target: Some(Target::Jukebox("box".into())) }).await?;
    let small = Repository { registry: host.to_string(), repository: SMALL[0].to_string() };
    let plan = client.plan(PlanRequest { target: Some(Target::Repository(small)) }).await?.into_inner();
    let request = ExecuteRequest {
        plan_id: plan.plan_id.clone(),
        confirm: plan.target.clone(),
        fingerprint: plan.fingerprint.clone(),
        acknowledge_usage_unknown: plan.usage_unknown,
    };
    let mut progress = client.execute(request).await?.into_inner();
    let mut deleted = 0;
    while let Some(step) = progress.message().await? {
        if let Some(Event::Outcome(outcome)) = step.event
            && outcome.state == DeletionState::Deleted as i32
        {
            deleted += 1;
        }
    }
    anyhow::ensure!(deleted > 0, "the purge of {} deleted nothing", plan.target);
    Ok((idle, resident_mib(purger.pid(), "VmHWM:")?, deleted))
}
