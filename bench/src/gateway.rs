//! P4: catalog reads through the gateway under concurrent load: a
//! `vynil-gateway` process in front of a `vynil-catalog` process on one real
//! Redis, holding a JukeBox of [`PACKAGES`] packages; [`CLIENTS`] clients
//! each read `GET /api/v1/jukeboxes/box/catalog` for [`LOAD`]. Baseline, same
//! run, same client: an axum handler in this process answering the very bytes
//! the gateway answered. The two processes' peak RSS under that load are the
//! loaded figures of P6, beside their own idle RSS.

use std::{
    net::SocketAddr,
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use vynil_crds::JukeBoxStatus;
use vynil_gateway::auth::{Role, TokenBook};
use vynil_rules::{Package, PackageContent, PackageType};
use vynil_store::{JukeboxStore, LocalStore};
use vynil_testkit::{RedisServer, ServiceProcess, free_port};

use crate::{
    freshness::percentiles,
    report::{Figure, Row},
    scan::{resident_mib, sibling},
};

const PACKAGES: usize = 200;
const CLIENTS: usize = 32;
const LOAD: Duration = Duration::from_secs(3);
const TOKEN: &str = "bench-viewer-token";

pub async fn reads_under_load() -> (Figure, Figure) {
    match measure().await {
        Ok((load, memory)) => (
            Figure::measured("P4", "gateway catalog reads under load", load),
            Figure::measured("P6", "loaded RSS of catalog and gateway (P4's load)", memory),
        ),
        Err(error) => (
            Figure::failed("P4", "gateway catalog reads under load", format!("{error:#}")),
            Figure::failed("P6", "loaded RSS of catalog and gateway (P4's load)", format!("{error:#}")),
        ),
    }
}

/// What a load of `CLIENTS` readers of `url` for `LOAD` gave.
struct Load {
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

async fn load(url: &str) -> anyhow::Result<Load> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(CLIENTS).build()?;
    let until = Instant::now() + LOAD;
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (http, url) = (http.clone(), url.to_string());
        readers.spawn(async move {
            let mut samples = Vec::new();
            while Instant::now() < until {
                let start = Instant::now();
                let body =
                    http.get(&url).bearer_auth(TOKEN).send().await?.error_for_status()?.bytes().await?;
                anyhow::ensure!(!body.is_empty(), "{url} answered an empty body");
                samples.push(start.elapsed());
            }
            anyhow::Ok(samples)
        });
    }
    let mut samples = Vec::new();
    while let Some(done) = readers.join_next().await {
        samples.extend(done??);
    }
    anyhow::ensure!(!samples.is_empty(), "no read of {url} completed");
    let per_second = samples.len() as f64 / LOAD.as_secs_f64();
    let (p50, p99) = percentiles(samples);
    Ok(Load { per_second, p50, p99 })
}

/// A gateway process, killed on drop (it serves HTTP, not gRPC health).
struct GatewayProcess {
    child: tokio::process::Child,
    url: String,
}

impl GatewayProcess {
    async fn start(dir: &Path, catalog: &str) -> anyhow::Result<Self> {
        let tokens = dir.join("tokens.yaml");
        std::fs::write(&tokens, format!("tokens:\n{}\n", TokenBook::line("bench", Role::Viewer, TOKEN)))?;
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        // The other services are not needed for catalog reads: their
        // channels are lazy.
        let unused = format!("http://127.0.0.1:{}", free_port()?);
        let child = tokio::process::Command::new(sibling("vynil-gateway")?)
            .args(["--listen", &listen.to_string(), "--catalog-endpoint", catalog])
            .args([
                "--scanner-endpoint",
                &unused,
                "--purger-endpoint",
                &unused,
                "--lifecycle-endpoint",
                &unused,
            ])
            .arg("--tokens-file")
            .arg(&tokens)
            .arg("--service-token-file")
            .arg(dir.join("service-token"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let url = format!("http://{listen}");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if http.get(format!("{url}/healthz")).send().await.is_ok_and(|r| r.status().is_success()) {
                return Ok(Self { child, url });
            }
            anyhow::ensure!(Instant::now() < deadline, "the gateway did not answer /healthz within 20 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn pid(&self) -> anyhow::Result<u32> {
        self.child.id().ok_or_else(|| anyhow::anyhow!("the gateway process has exited"))
    }
}

/// A static handler answering `body` at the URL returned, served by this
/// process's runtime (the client's own threads).
async fn static_server(body: bytes::Bytes) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/catalog", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, static_app(body)).await });
    Ok(url)
}

fn static_app(body: bytes::Bytes) -> axum::Router {
    axum::Router::new().route(
        "/catalog",
        axum::routing::get(move || {
            let body = body.clone();
            async move { ([(http::header::CONTENT_TYPE, "application/json")], body) }
        }),
    )
}

/// The same static handler in a process of its own, as the gateway is (its
/// own runtime, reached across processes): the bench run with
/// `--static-child <body file>`, which prints its URL. Killed on drop.
struct StaticProcess {
    _child: tokio::process::Child,
    url: String,
}

impl StaticProcess {
    async fn start(body_file: &Path) -> anyhow::Result<Self> {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .arg("--static-child")
            .arg(body_file)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdout =
            child.stdout.take().ok_or_else(|| anyhow::anyhow!("the static handler has no stdout"))?;
        let mut line = String::new();
        let mut stdout = tokio::io::BufReader::new(stdout);
        tokio::time::timeout(Duration::from_secs(20), stdout.read_line(&mut line)).await??;
        let url = line.trim().to_string();
        anyhow::ensure!(url.starts_with("http://"), "the static handler printed {line:?}, not its URL");
        Ok(Self { _child: child, url })
    }
}

/// The child's work: serves the file's bytes, prints the URL, until killed.
pub async fn static_child(body_file: &Path) -> anyhow::Result<()> {
    let body = bytes::Bytes::from(std::fs::read(body_file)?);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("http://{}/catalog", listener.local_addr()?);
    axum::serve(listener, static_app(body)).await?;
    Ok(())
}

async fn measure() -> anyhow::Result<(Vec<Row>, Vec<Row>)> {
    let redis = RedisServer::start().await?;
    let dir = tempfile::tempdir()?;
    let jukeboxes = dir.path().join("jukeboxes");
    std::fs::create_dir_all(&jukeboxes)?;
    vynil_testkit::JukeboxBuilder::new("box").write_to(&jukeboxes)?;
    std::fs::write(dir.path().join("service-token"), "bench-service-token\n")?;
    let writer =
        LocalStore::with_redis(jukeboxes.clone(), &vynil_store::RedisTarget::url(redis.url())).await?;
    let packages: Vec<Package> = (0..PACKAGES)
        .map(|i| {
            let name = format!("pkg{i}");
            let content = PackageContent::minimal("bench", &name, PackageType::Tenant);
            Package::new("registry.example", &format!("bench/{name}"), "1.0.0", content)
        })
        .collect();
    let version = writer.get("box").await?.map(|r| r.status_version).unwrap_or_default();
    writer.write_status("box", &version, &JukeBoxStatus { packages, ..Default::default() }).await?;

    let jukebox_dir = jukeboxes.to_string_lossy().into_owned();
    let token_file = dir.path().join("service-token").to_string_lossy().into_owned();
    let catalog = ServiceProcess::start(
        &sibling("vynil-catalog")?,
        &["--jukebox-dir", &jukebox_dir, "--redis-url", &redis.url(), "--service-token-file", &token_file],
    )
    .await?;
    let gateway = GatewayProcess::start(dir.path(), &catalog.endpoint()).await?;
    let idle = (resident_mib(catalog.pid(), "VmRSS:")?, resident_mib(gateway.pid()?, "VmRSS:")?);

    let url = format!("{}/api/v1/jukeboxes/box/catalog", gateway.url);
    let answer = reqwest::Client::new().get(&url).bearer_auth(TOKEN).send().await?.error_for_status()?;
    let content_type =
        answer.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
    anyhow::ensure!(
        content_type.as_deref().is_some_and(|t| t.starts_with("application/json")),
        "the gateway answered {content_type:?}, not JSON"
    );
    let body = answer.bytes().await?;
    let items = body.windows(b"\"image\":".len()).filter(|w| *w == b"\"image\":").count();
    anyhow::ensure!(items > 0, "the gateway's catalog holds none of the {PACKAGES} packages written");
    let kib = body.len() as f64 / 1024.0;

    let through = load(&url).await?;
    let loaded = (resident_mib(catalog.pid(), "VmHWM:")?, resident_mib(gateway.pid()?, "VmHWM:")?);
    let body_file = dir.path().join("page.json");
    std::fs::write(&body_file, &body)?;
    let apart = StaticProcess::start(&body_file).await?;
    let baseline = load(&apart.url).await?;
    let inside = load(&static_server(body).await?).await?;

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let what = format!("{CLIENTS} clients, a page of {items} packages ({kib:.0} KiB)");
    let load_rows = vec![
        Row::new(format!("reads/s, {what}"), through.per_second, "req/s")
            .against("static handler (own process), identical bytes, reads/s", baseline.per_second),
        Row::new("read latency, p50", ms(through.p50), "ms")
            .against("static handler (own process), p50", ms(baseline.p50)),
        Row::new("read latency, p99", ms(through.p99), "ms")
            .against("static handler (own process), p99", ms(baseline.p99)),
        Row::new("reads/s (the same)", through.per_second, "req/s")
            .against("static handler in the client's process, reads/s", inside.per_second),
        Row::new("read latency, p99 (the same)", ms(through.p99), "ms")
            .against("static handler in the client's process, p99", ms(inside.p99)),
    ];
    let memory_rows = vec![
        Row::new("vynil-catalog, peak under P4's load", loaded.0, "MiB")
            .against("the same process idle", idle.0),
        Row::new("vynil-gateway, peak under P4's load", loaded.1, "MiB")
            .against("the same process idle", idle.1),
    ];
    Ok((load_rows, memory_rows))
}
