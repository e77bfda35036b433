//! Index sources end to end: an index exported from a real registry's scan
//! (by `vynil-scanner export`, a process, to an HTTP server taking PUTs; and
//! by the exporter the `ExportIndex` RPC runs, to an S3-compatible server
//! that checks signatures), then consumed by `http` and `s3` JukeBoxes of
//! every maturity on two framework versions: each catalog equals the direct
//! OCI scan's. An unchanged index costs one conditional request per file and
//! writes nothing; a malformed or refused file is a condition naming it, and
//! what was known stays.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::{path::Path, sync::Arc, time::Duration};

use clap::Parser;
use vynil_scanner::{Config, Scanner};
use vynil_testkit::{IndexServer, PackageSpec, PackageType, RegistryServer, S3Server, publish_examples};

const MATURITIES: [&str; 3] = ["stable", "beta", "alpha"];
const TOKEN: &str = "index-token-1";

/// Scanner library in process, status in memory, framework `framework`.
async fn scanner(
    dir: &Path,
    registry: &str,
    framework: &str,
) -> (Arc<Scanner>, tokio::sync::oneshot::Sender<()>) {
    scanner_with(dir, registry, framework, &[]).await
}

/// The same with `extra` flags (a Redis, say).
async fn scanner_with(
    dir: &Path,
    registry: &str,
    framework: &str,
    extra: &[&str],
) -> (Arc<Scanner>, tokio::sync::oneshot::Sender<()>) {
    let base = [
        "vynil-scanner",
        "--jukebox-dir",
        dir.to_str().unwrap(),
        "--insecure-registry",
        registry,
        "--vynil-version",
        framework,
        "--poll-milliseconds",
        "20",
    ];
    let config = Config::parse_from(base.iter().chain(extra.iter()));
    let scanner = vynil_scanner::build(&config).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(scanner.clone().work(async move {
        let _ = stopped.await;
    }));
    (scanner, stop)
}

async fn scan(scanner: &Scanner, jukebox: &str) -> vynil_scanner::ScanRecord {
    scan_scoped(scanner, jukebox, vynil_rules::ScanScope::Full).await
}

async fn scan_scoped(
    scanner: &Scanner,
    jukebox: &str,
    scope: vynil_rules::ScanScope,
) -> vynil_scanner::ScanRecord {
    let (id, _) = scanner.request(jukebox, scope).await.unwrap();
    for _ in 0..2400 {
        let record = scanner.queue.record(&id).await.unwrap().unwrap();
        if record.is_final() {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("scan {id} of {jukebox} did not finish");
}

/// `image tag digest type`, sorted: what a catalog shows of each revision.
async fn packages(scanner: &Scanner, jukebox: &str) -> Vec<String> {
    let record = scanner.store.get(jukebox).await.unwrap().unwrap();
    let mut rows: Vec<String> = record
        .status
        .unwrap_or_default()
        .packages
        .iter()
        .map(|p| {
            format!("{} {} {} {:?}", p.image, p.tag, p.digest.as_deref().unwrap_or("-"), p.package_type())
        })
        .collect();
    rows.sort();
    rows
}

async fn message(scanner: &Scanner, jukebox: &str) -> String {
    let record = scanner.store.get(jukebox).await.unwrap().unwrap();
    let status = record.status.unwrap_or_default();
    status
        .conditions
        .iter()
        .map(|c| format!("{:?}={:?} {}", c.condition_type, c.status, c.message))
        .collect::<Vec<_>>()
        .join(" | ")
}

fn jukebox(dir: &Path, name: &str, maturity: &str, source: &str) {
    let text = format!(
        "apiVersion: vynil.solidite.fr/v1\nkind: JukeBox\nmetadata:\n  name: {name}\nspec:\n  maturity: {maturity}\n  schedule: \"0 0 1 1 *\"\n  source:\n{source}"
    );
    std::fs::write(dir.join(format!("{name}.yaml")), text).unwrap();
}

/// A Secret a JukeBox may name (the opt-in label), bound to `url`'s host.
fn secret(dir: &Path, name: &str, url: &str, pairs: &[(&str, &str)]) {
    let label = format!("{{{}: \"true\"}}", vynil_crds::secrets::OPT_IN_LABEL);
    let pairs: Vec<(&str, &str)> = pairs.iter().copied().chain([("hosts", host_of(url))]).collect();
    secret_labelled(dir, name, &pairs, &label);
}

/// A Secret an RPC request may name (`ExportIndex`'s credentials) as well
/// as a JukeBox, bound to `url`'s host.
fn request_secret(dir: &Path, name: &str, url: &str, pairs: &[(&str, &str)]) {
    let labels = format!(
        "{{{}: \"true\", {}: \"true\"}}",
        vynil_store::RPC_CREDENTIALS_LABEL,
        vynil_crds::secrets::OPT_IN_LABEL
    );
    let pairs: Vec<(&str, &str)> = pairs.iter().copied().chain([("hosts", host_of(url))]).collect();
    secret_labelled(dir, name, &pairs, &labels);
}

fn host_of(url: &str) -> &str {
    url.split("://").nth(1).unwrap_or(url).split('/').next().unwrap()
}

fn secret_labelled(dir: &Path, name: &str, pairs: &[(&str, &str)], labels: &str) {
    let data: String = pairs.iter().map(|(k, v)| format!("  {k}: {v:?}\n")).collect();
    let text = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  labels: {labels}\nstringData:\n{data}"
    );
    std::fs::write(dir.join(format!("{name}.yaml")), text).unwrap();
}

/// The example set (waypoints, a type change, a beta, an unannotated
/// `latest`) and `db/pg`, whose newer revisions need framework 0.9.0.
async fn registry() -> RegistryServer {
    let registry = RegistryServer::start().await.unwrap();
    let publisher = registry.publisher();
    publish_examples(&publisher).await.unwrap();
    let pg = |tag: &str| PackageSpec::new("db", "pg", PackageType::Service, tag);
    for spec in [
        pg("1.0.0"),
        pg("2.0.0").min("1.0.0").vynil("0.9.0"),
        pg("2.1.0").vynil("0.9.0"),
        pg("3.0.0-beta.1").min("2.0.0").vynil("0.9.0"),
    ] {
        publisher.publish("db/pg", &spec).await.unwrap();
    }
    // An alpha version without Vynil annotations: the alpha descent stops
    // there, so the alpha view of apps/web is [3.0.0-beta.1] alone, while
    // the index holds the stable waypoints below it.
    publisher.publish_plain("apps/web", "2.2.0-alpha.1").await.unwrap();
    registry
}

fn list_source(registry: &RegistryServer) -> String {
    let images: String = ["think/ollama", "apps/web", "db/pg"]
        .iter()
        .map(|r| format!("      - {}/{r}\n", registry.host()))
        .collect();
    format!("    list:\n{images}")
}

#[tokio::test]
async fn an_exported_http_index_gives_every_consumer_the_direct_scans_catalog() {
    let registry = registry().await;
    let served = tempfile::tempdir().unwrap();
    let server = IndexServer::start(served.path(), TOKEN).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    for maturity in MATURITIES {
        jukebox(dir.path(), &format!("oci-{maturity}"), maturity, &list_source(&registry));
        let http =
            format!("    http:\n      url: {}/team/index/\n      secret: index-credentials\n", server.url());
        jukebox(dir.path(), &format!("http-{maturity}"), maturity, &http);
    }
    secret(dir.path(), "index-credentials", &server.url(), &[("token", TOKEN)]);

    // The exporter as CI runs it: a process, an HTTP destination taking PUTs.
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_vynil-scanner"))
        .args(["export", "--jukebox-file"])
        .arg(dir.path().join("oci-stable.yaml"))
        .args(["--to", &format!("{}/team/index", server.url()), "--token", TOKEN])
        .args(["--insecure-registry", &registry.host()])
        .output()
        .await
        .unwrap();
    let said =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "export failed: {said}");
    assert!(said.contains("exported"), "{said}");
    let index_dir = served.path().join("team/index");
    let index: vynil_index::IndexDocument =
        serde_yaml_ng::from_slice(&std::fs::read(index_dir.join("index.yaml")).unwrap()).unwrap();
    assert_eq!(index.packages.len(), 3, "{index:?}");
    let unannotated: Vec<(&str, &[String])> =
        index.unannotated.iter().map(|u| (u.image.as_str(), u.tags.as_slice())).collect();
    assert_eq!(unannotated, [("apps/web", &["2.2.0-alpha.1".to_string()][..])], "{index:?}");

    // Each consumer, on two framework versions, sees what a direct scan shows.
    let mut seen_frameworks = Vec::new();
    for framework in ["0.7.7", "0.9.0"] {
        let (scanner, _stop) = scanner(dir.path(), &registry.host(), framework).await;
        for maturity in MATURITIES {
            let direct = format!("oci-{maturity}");
            let consumer = format!("http-{maturity}");
            assert!(scan(&scanner, &direct).await.errors.is_empty());
            let record = scan(&scanner, &consumer).await;
            assert!(record.errors.is_empty(), "{consumer}: {:?}", record.errors);
            let (expected, got) = (packages(&scanner, &direct).await, packages(&scanner, &consumer).await);
            assert!(!expected.is_empty());
            assert_eq!(got, expected, "{consumer} on framework {framework}");
            if maturity == "alpha" {
                let web: Vec<&String> = got.iter().filter(|r| r.starts_with("apps/web")).collect();
                assert!(
                    web.len() == 1 && web[0].starts_with("apps/web 3.0.0-beta.1"),
                    "the alpha descent stops at 2.2.0-alpha.1: {web:?}"
                );
            }
        }
        seen_frameworks.push(packages(&scanner, "http-stable").await);
    }
    assert_ne!(seen_frameworks[0], seen_frameworks[1], "the framework version changes the view of db/pg");
    assert!(seen_frameworks[1].iter().any(|r| r.starts_with("db/pg 2.1.0")), "{:?}", seen_frameworks[1]);
    assert!(
        seen_frameworks[0].iter().any(|r| r.starts_with("think/ollama 0.1.9")),
        "both types: {:?}",
        seen_frameworks[0]
    );

    // An unchanged index: one conditional request per file, all 304, nothing written.
    let (scanner, _stop) = scanner(dir.path(), &registry.host(), "0.7.7").await;
    scan(&scanner, "http-stable").await;
    let before = scanner.store.get("http-stable").await.unwrap().unwrap();
    server.clear_requests();
    let record = scan(&scanner, "http-stable").await;
    assert!(record.errors.is_empty(), "{:?}", record.errors);
    let requests = server.requests();
    assert_eq!(requests.len(), 1 + index.packages.len(), "{requests:?}");
    assert!(requests.iter().all(|r| r.method == "GET" && r.conditional && r.status == 304), "{requests:?}");
    let after = scanner.store.get("http-stable").await.unwrap().unwrap();
    assert_eq!(after.status_version, before.status_version, "an unchanged index writes nothing");

    // A partial scan reads the index and the matching files only; an entry
    // the index no longer lists under the filter goes, as upstream.
    let partial =
        |filter: &str| vynil_rules::ScanScope::Partial(vynil_rules::ScanFilter::parse(filter).unwrap());
    let full = packages(&scanner, "http-stable").await;
    let pg = index.packages.iter().find(|e| e.name == "pg").unwrap();
    server.clear_requests();
    let record = scan_scoped(&scanner, "http-stable", partial("db/pg")).await;
    assert!(record.errors.is_empty(), "{:?}", record.errors);
    let files: Vec<String> = server.requests().iter().map(|r| r.file.clone()).collect();
    assert_eq!(files, ["team/index/index.yaml".to_string(), format!("team/index/{}", pg.file)]);
    assert_eq!(packages(&scanner, "http-stable").await, full);
    let without_pg = vynil_index::IndexDocument {
        packages: index.packages.iter().filter(|e| e.name != "pg").cloned().collect(),
        unannotated: index.unannotated.clone(),
    };
    let original = std::fs::read(index_dir.join("index.yaml")).unwrap();
    std::fs::write(index_dir.join("index.yaml"), without_pg.render().unwrap()).unwrap();
    scan_scoped(&scanner, "http-stable", partial("db")).await;
    let expected: Vec<String> = full.iter().filter(|r| !r.starts_with("db/pg")).cloned().collect();
    assert_eq!(packages(&scanner, "http-stable").await, expected, "db/pg is no longer listed");
    std::fs::write(index_dir.join("index.yaml"), original).unwrap();
    scan(&scanner, "http-stable").await;
    assert_eq!(packages(&scanner, "http-stable").await, full);

    // A malformed package file: a condition naming it; every entry stays.
    let known = packages(&scanner, "http-stable").await;
    let web = index.packages.iter().find(|e| e.name == "web").unwrap();
    std::fs::write(index_dir.join(&web.file), "- registry: [unclosed\n").unwrap();
    let record = scan(&scanner, "http-stable").await;
    assert!(record.errors.iter().any(|(file, _)| file.ends_with(&web.file)), "{:?}", record.errors);
    let said = message(&scanner, "http-stable").await;
    assert!(said.contains(&web.file) && said.contains("malformed"), "{said}");
    assert_eq!(packages(&scanner, "http-stable").await, known, "the malformed file's entries are kept");

    // A malformed index.yaml: the same, for the whole index.
    std::fs::write(index_dir.join("index.yaml"), "packages: {not: a list}\n").unwrap();
    scan(&scanner, "http-stable").await;
    let said = message(&scanner, "http-stable").await;
    assert!(said.contains("index.yaml is malformed"), "{said}");
    assert_eq!(packages(&scanner, "http-stable").await, known);

    // A wrong token: refused, readably, and nothing lost.
    secret(dir.path(), "index-credentials", &server.url(), &[("token", "not-the-token")]);
    scan(&scanner, "http-stable").await;
    let said = message(&scanner, "http-stable").await;
    assert!(said.contains("401") || said.contains("refused"), "{said}");
    assert_eq!(packages(&scanner, "http-stable").await, known);
}

#[tokio::test]
async fn an_index_exported_to_s3_is_consumed_with_the_right_credentials_and_refused_with_a_wrong_secret() {
    let registry = registry().await;
    let buckets = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(buckets.path(), &["catalogs"], "AKIDEXAMPLE", "s3cr3t-key").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    jukebox(dir.path(), "oci-stable", "stable", &list_source(&registry));
    let s3_source = |secret: &str| {
        format!(
            "    s3:\n      bucket: catalogs\n      region: us-east-1\n      prefix: team/index\n      endpoint: {}\n      secret: {secret}\n",
            s3.endpoint()
        )
    };
    jukebox(dir.path(), "s3-stable", "stable", &s3_source("s3-credentials"));
    jukebox(dir.path(), "s3-wrong", "stable", &s3_source("s3-wrong-credentials"));
    secret(
        dir.path(),
        "s3-credentials",
        &s3.endpoint(),
        &[("access_key_id", s3.access_key()), ("secret_access_key", s3.secret_key())],
    );
    secret(
        dir.path(),
        "s3-wrong-credentials",
        &s3.endpoint(),
        &[("access_key_id", s3.access_key()), ("secret_access_key", "wrong")],
    );

    let destination = format!("s3://catalogs/team/index?region=us-east-1&endpoint={}", s3.endpoint());
    let allowed = ["--export-destination", destination.as_str()];
    let (scanner, _stop) = scanner_with(dir.path(), &registry.host(), "0.7.7", &allowed).await;
    // Elsewhere than the listed destination: refused before any Secret is read.
    let elsewhere = format!("s3://catalogs/team/index-evil?region=us-east-1&endpoint={}", s3.endpoint());
    let refused = scanner.export("oci-stable", &elsewhere, Some("s3-credentials")).await.unwrap_err();
    assert!(refused.to_string().contains("--export-destination"), "{refused}");
    // A Secret without the opt-in label is not read for a request (the
    // JukeBox that names it in its spec still scans with it).
    let refused = scanner.export("oci-stable", &destination, Some("s3-credentials")).await.unwrap_err();
    assert!(refused.to_string().contains(vynil_store::RPC_CREDENTIALS_LABEL), "{refused}");
    assert!(!buckets.path().join("catalogs/team/index/index.yaml").exists(), "nothing written");
    let good = [("access_key_id", s3.access_key()), ("secret_access_key", s3.secret_key())];
    request_secret(dir.path(), "s3-credentials", &s3.endpoint(), &good);
    let wrong = [("access_key_id", s3.access_key()), ("secret_access_key", "wrong")];
    request_secret(dir.path(), "s3-wrong-credentials", &s3.endpoint(), &wrong);
    // A wrong secret cannot write either, and says so.
    let refused = scanner.export("oci-stable", &destination, Some("s3-wrong-credentials")).await.unwrap_err();
    assert!(refused.to_string().contains("credentials"), "{refused}");
    let done = scanner.export("oci-stable", &destination, Some("s3-credentials")).await.unwrap();
    assert_eq!(done.repositories, 3);
    assert_eq!(done.report.written.last().map(String::as_str), Some("index.yaml"), "{done:?}");
    assert!(buckets.path().join("catalogs/team/index/index.yaml").exists());

    assert!(scan(&scanner, "oci-stable").await.errors.is_empty());
    let record = scan(&scanner, "s3-stable").await;
    assert!(record.errors.is_empty(), "{:?}", record.errors);
    assert_eq!(packages(&scanner, "s3-stable").await, packages(&scanner, "oci-stable").await);

    let record = scan(&scanner, "s3-wrong").await;
    assert_eq!(record.state, vynil_scanner::RecordState::Failed);
    let said = message(&scanner, "s3-wrong").await;
    assert!(said.contains("index.yaml") && said.contains("credentials"), "{said}");
    assert!(packages(&scanner, "s3-wrong").await.is_empty());

    // A second export of the same registry writes nothing.
    let again = scanner.export("oci-stable", &destination, Some("s3-credentials")).await.unwrap();
    assert!(again.report.written.is_empty() && again.report.removed.is_empty(), "{again:?}");
}

#[tokio::test]
async fn a_replica_that_never_read_the_index_asks_conditionally_through_redis() {
    let redis = vynil_testkit::RedisServer::start().await.unwrap();
    let registry = registry().await;
    let served = tempfile::tempdir().unwrap();
    let server = IndexServer::start(served.path(), TOKEN).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    jukebox(dir.path(), "oci-stable", "stable", &list_source(&registry));
    let http = format!("    http:\n      url: {}/idx\n      secret: index-credentials\n", server.url());
    jukebox(dir.path(), "http-stable", "stable", &http);
    secret(dir.path(), "index-credentials", &server.url(), &[("token", TOKEN)]);
    let url = redis.url();
    let index = served.path().join("idx").display().to_string();
    let redis_flags = ["--redis-url", url.as_str(), "--export-destination", index.as_str()];
    let (first, stop_first) = scanner_with(dir.path(), &registry.host(), "0.7.7", &redis_flags).await;
    first.export("oci-stable", &index, None).await.unwrap();
    assert!(scan(&first, "http-stable").await.errors.is_empty());
    let files = server.requests().len();
    assert!(files >= 2, "{:?}", server.requests());
    // The first replica stops working: the second runs the next scan.
    drop(stop_first);
    let (second, _stop) = scanner_with(dir.path(), &registry.host(), "0.7.7", &redis_flags).await;
    server.clear_requests();
    let record = scan(&second, "http-stable").await;
    assert!(record.errors.is_empty(), "{:?}", record.errors);
    let requests = server.requests();
    assert_eq!(requests.len(), files, "{requests:?}");
    assert!(requests.iter().all(|r| r.conditional && r.status == 304), "{requests:?}");
}
