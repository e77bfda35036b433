//! P2 with verification: the scan cost of a repository of `--tags`
//! versions each signed with cosign's format (a `.sig` manifest and its
//! payload blob per tag), scanned by two `vynil-scanner` processes on the
//! same registry: one with an enforced signature policy trusting the key,
//! the baseline without a policy. A first scan then an immediate rescan
//! each; requests counted at one front per scanner. What verification costs
//! on a first scan (each revision's `.sig` read once: a HEAD, the manifest
//! and its payload) and that a rescan costs nothing more.

use std::time::Duration;

use futures::StreamExt;
use reqwest::Method;
use vynil_proto::scanner::v1::scanner_client::ScannerClient;
use vynil_testkit::{
    HttpFront, JukeboxBuilder, PackageSpec, PackageType, RegistryServer, ServiceProcess, SignatureLayer,
    Signer,
};

use crate::report::{Figure, Row};
use crate::scan::{resident_mib, scan_once, sibling};

const REPOSITORY: &str = "signed/repo";

pub async fn scan_cost(tags: usize) -> Figure {
    Figure::from_result("P2v", "scan cost with signature verification", measure(tags).await)
}

fn signer() -> Signer {
    Signer::from_label("vynil-bench release key")
}

async fn registry(tags: usize) -> anyhow::Result<RegistryServer> {
    let registry = RegistryServer::from_fixture(&format!("bench-signed-{tags}-v1"), |registry| async move {
        let publisher = registry.publisher();
        let items: Vec<(String, PackageSpec)> = (0..tags)
            .map(|i| {
                let kind = if i == 3 { PackageType::Service } else { PackageType::Tenant };
                let tag = format!("{}.{}.{}", i / 1000, (i / 10) % 100, i % 10);
                (REPOSITORY.to_string(), PackageSpec::new("signed", "repo", kind, &tag))
            })
            .collect();
        let digests = publisher.publish_all(&items, 16).await?;
        let (signer, reference) = (signer(), format!("{}/{REPOSITORY}", registry.host()));
        let signed: Vec<vynil_testkit::Result<String>> = futures::stream::iter(digests)
            .map(|digest| {
                let (publisher, layer) =
                    (publisher.clone(), SignatureLayer::by(&signer, &reference, &digest));
                async move { publisher.sign(REPOSITORY, &digest, &[layer]).await }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        signed.into_iter().collect::<vynil_testkit::Result<Vec<_>>>()?;
        Ok(registry)
    })
    .await?;
    Ok(registry)
}

struct Scans {
    first: Duration,
    first_gets: usize,
    rescan: Duration,
    rescan_gets: usize,
    rescan_heads: usize,
    peak_rss: f64,
}

/// A scanner of `registry` through its own front, with the policy `verify`
/// (`None`: none), scanning twice.
async fn scans(registry: &RegistryServer, tags: usize, verify: Option<&str>) -> anyhow::Result<Scans> {
    let front = HttpFront::start(&registry.base_url()).await?;
    let dir = tempfile::tempdir()?;
    let mut jukebox = JukeboxBuilder::new("box").list([format!("{}/{REPOSITORY}", front.host())]);
    if let Some(mode) = verify {
        jukebox = jukebox.verify(mode, &[("release", signer().public_pem().as_str())]);
    }
    jukebox.write_to(dir.path())?;
    let (max_tags, host) = ((2 * tags + 100).to_string(), front.host());
    let args = [
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
    let scanner = ServiceProcess::start(&sibling("vynil-scanner")?, &args).await?;
    let mut client = ScannerClient::new(scanner.channel().await?);
    let gets =
        |front: &HttpFront| front.count(&Method::GET, "/manifests/") + front.count(&Method::GET, "/blobs/");
    front.reset_counts();
    let first = scan_once(&mut client).await?;
    let first_gets = gets(&front);
    front.reset_counts();
    let rescan = scan_once(&mut client).await?;
    Ok(Scans {
        first,
        first_gets,
        rescan,
        rescan_gets: gets(&front),
        rescan_heads: front.count(&Method::HEAD, "/manifests/"),
        peak_rss: resident_mib(scanner.pid(), "VmHWM:")?,
    })
}

async fn measure(tags: usize) -> anyhow::Result<Vec<Row>> {
    let registry = registry(tags).await?;
    let plain = scans(&registry, tags, None).await?;
    let enforced = scans(&registry, tags, Some("enforce")).await?;
    let s = |d: Duration| d.as_secs_f64();
    Ok(vec![
        Row::new(format!("first scan, {tags} signed tags, enforce"), s(enforced.first), "s")
            .against("the same without a policy", s(plain.first)),
        Row::new("first scan: manifest and blob GETs, enforce", enforced.first_gets as f64, "requests")
            .against("without a policy", plain.first_gets as f64),
        Row::new("immediate rescan, enforce", s(enforced.rescan), "s")
            .against("the same without a policy", s(plain.rescan)),
        Row::new("rescan: manifest and blob GETs, enforce", enforced.rescan_gets as f64, "requests"),
        Row::new("rescan: manifest HEADs, enforce", enforced.rescan_heads as f64, "requests")
            .against("without a policy", plain.rescan_heads as f64),
        Row::new("scanner peak RSS, enforce", enforced.peak_rss, "MiB")
            .against("without a policy", plain.peak_rss),
    ])
}
