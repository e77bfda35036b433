//! P2 with verification: the scan cost of a repository of `--tags`
//! versions each signed with cosign's legacy format (a `.sig` manifest and
//! its payload blob per tag), and of a second one each signed as cosign v3
//! signs by default (a Sigstore bundle, listed by the referrers tag schema's
//! index `sha256-<hex>`: an index, an artifact manifest and a bundle blob
//! per tag), scanned by `vynil-scanner` processes on the same registry: one
//! with an enforced signature policy trusting the key per format, the
//! baseline without a policy. A first scan then an immediate rescan each;
//! requests counted at one front per scanner. What verification costs on a
//! first scan and that a rescan costs nothing more, in either format.

use std::time::Duration;

use futures::StreamExt;
use reqwest::Method;
use vynil_proto::scanner::v1::scanner_client::ScannerClient;
use vynil_rules::signature::bundle::SIGN_PREDICATE_TYPE;
use vynil_testkit::{
    HttpFront, JukeboxBuilder, PackageSpec, PackageType, RegistryServer, ServiceProcess, SignatureLayer,
    Signer, statement,
};

use crate::report::{Figure, Row};
use crate::scan::{resident_mib, scan_once, sibling};

const REPOSITORY: &str = "signed/repo";
const BUNDLED: &str = "bundled/repo";

pub async fn scan_cost(tags: usize) -> Figure {
    Figure::from_result("P2v", "scan cost with signature verification", measure(tags).await)
}

fn signer() -> Signer {
    Signer::from_label("vynil-bench release key")
}

async fn registry(tags: usize) -> anyhow::Result<RegistryServer> {
    let registry = RegistryServer::from_fixture(&format!("bench-signed-{tags}-v2"), |registry| async move {
        let publisher = registry.publisher();
        let (signer, reference) = (signer(), format!("{}/{REPOSITORY}", registry.host()));
        for repository in [REPOSITORY, BUNDLED] {
            let (namespace, name) = repository.split_once('/').unwrap_or((repository, repository));
            let items: Vec<(String, PackageSpec)> = (0..tags)
                .map(|i| {
                    let kind = if i == 3 { PackageType::Service } else { PackageType::Tenant };
                    let tag = format!("{}.{}.{}", i / 1000, (i / 10) % 100, i % 10);
                    (repository.to_string(), PackageSpec::new(namespace, name, kind, &tag))
                })
                .collect();
            let digests = publisher.publish_all(&items, 16).await?;
            let signed: Vec<vynil_testkit::Result<String>> = futures::stream::iter(digests)
                .map(|digest| {
                    let (publisher, signer, reference) =
                        (publisher.clone(), signer.clone(), reference.clone());
                    async move {
                        if repository == BUNDLED {
                            let signature = statement(&digest, SIGN_PREDICATE_TYPE, serde_json::json!({}));
                            let bundle = signer.bundle(&signature);
                            publisher.attach_bundle(repository, &digest, &bundle, SIGN_PREDICATE_TYPE).await
                        } else {
                            let layer = SignatureLayer::by(&signer, &reference, &digest);
                            publisher.sign(repository, &digest, &[layer]).await
                        }
                    }
                })
                .buffer_unordered(16)
                .collect()
                .await;
            signed.into_iter().collect::<vynil_testkit::Result<Vec<_>>>()?;
        }
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

/// A scanner of `repository` in `registry` through its own front, with the
/// policy `verify` (`None`: none), scanning twice.
async fn scans(
    registry: &RegistryServer,
    repository: &str,
    tags: usize,
    verify: Option<&str>,
) -> anyhow::Result<Scans> {
    let front = HttpFront::start(&registry.base_url()).await?;
    let dir = tempfile::tempdir()?;
    let mut jukebox = JukeboxBuilder::new("box").list([format!("{}/{repository}", front.host())]);
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
    let plain = scans(&registry, REPOSITORY, tags, None).await?;
    let enforced = scans(&registry, REPOSITORY, tags, Some("enforce")).await?;
    let bundled = scans(&registry, BUNDLED, tags, Some("enforce")).await?;
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
        Row::new(format!("first scan, {tags} tags signed with bundles, enforce"), s(bundled.first), "s")
            .against("the same signed with .sig", s(enforced.first)),
        Row::new("first scan: manifest and blob GETs, bundles", bundled.first_gets as f64, "requests")
            .against("with .sig", enforced.first_gets as f64),
        Row::new("immediate rescan, bundles, enforce", s(bundled.rescan), "s")
            .against("the same without a policy", s(plain.rescan)),
        Row::new("rescan: manifest and blob GETs, bundles", bundled.rescan_gets as f64, "requests"),
        Row::new("rescan: manifest HEADs, bundles", bundled.rescan_heads as f64, "requests")
            .against("without a policy", plain.rescan_heads as f64),
    ])
}
