//! The example package set from a real registry and from an OCI image
//! layout, side by side in local mode (every service in this process): the
//! same catalog for each maturity, the same purge decisions, and a purge
//! executed on the layout leaves in `index.json` and `blobs/` exactly the
//! kept packages and nothing unreferenced.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use futures::StreamExt;
use vynil_proto::{
    catalog::v1::{GetCatalogRequest, catalog_client::CatalogClient},
    purger::v1::{
        ExecuteRequest, PlanRequest, PurgePlan, execute_progress::Event, plan_request::Target,
        purger_client::PurgerClient,
    },
    scanner::v1::{ScanRequest, ScanState, WatchScanRequest, scanner_client::ScannerClient},
};
use vynil_testkit::{
    EXAMPLE_REPOSITORIES, LayoutWriter, RegistryServer, channel, publish_examples, reachable_blobs,
    stored_blobs, write_examples,
};

const MATURITIES: [&str; 3] = ["stable", "beta", "alpha"];

/// `(repository, tag, digest, type, roles)` of a JukeBox's catalog, sorted.
async fn catalog(client: &mut CatalogClient<tonic::transport::Channel>, jukebox: &str) -> Vec<String> {
    let answer = client
        .get_catalog(GetCatalogRequest { jukebox: jukebox.into(), ..Default::default() })
        .await
        .unwrap();
    let mut rows: Vec<String> = answer
        .into_inner()
        .packages
        .into_iter()
        .map(|p| {
            let roles: Vec<String> = p.roles.into_iter().map(|r| r.description).collect();
            format!(
                "{} {} {} {:?} {roles:?}",
                p.image,
                p.tag,
                p.digest,
                p.metadata.unwrap_or_default().r#type
            )
        })
        .collect();
    rows.sort();
    rows
}

/// `(repository, tag, digest, keep, reasons)` of a plan, sorted.
fn decisions(plan: &PurgePlan) -> Vec<String> {
    let mut rows: Vec<String> = plan
        .entries
        .iter()
        .map(|e| format!("{} {} {} {} {:?}", e.repository, e.tag, e.digest, e.keep, e.reasons))
        .collect();
    rows.sort();
    rows
}

#[tokio::test]
async fn a_registry_and_a_layout_of_the_same_packages_give_the_same_catalogs_and_purges() {
    let registry = RegistryServer::start().await.unwrap();
    publish_examples(&registry.publisher()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    write_examples(&LayoutWriter::new(&layout)).unwrap();
    let boxes = dir.path().join("jukeboxes");
    std::fs::create_dir_all(&boxes).unwrap();
    let list: Vec<String> =
        EXAMPLE_REPOSITORIES.iter().map(|r| format!("      - {}/{r}", registry.host())).collect();
    for maturity in MATURITIES {
        let head = |name: &str| {
            format!(
                "apiVersion: vynil.solidite.fr/v1\nkind: JukeBox\nmetadata:\n  name: {name}-{maturity}\nspec:\n  maturity: {maturity}\n  schedule: \"0 0 1 1 *\"\n"
            )
        };
        let registry_box = format!("{}  source:\n    list:\n{}\n", head("registry"), list.join("\n"));
        std::fs::write(boxes.join(format!("registry-{maturity}.yaml")), registry_box).unwrap();
        let layout_box = format!(
            "{}  source:\n    layout:\n      path: {:?}\n",
            head("layout"),
            layout.display().to_string()
        );
        std::fs::write(boxes.join(format!("layout-{maturity}.yaml")), layout_box).unwrap();
    }
    let path = |p: &std::path::Path| p.display().to_string();
    let args = [
        "vynil".to_string(),
        "--catalog-listen".into(),
        "127.0.0.1:0".into(),
        "--scanner-listen".into(),
        "127.0.0.1:0".into(),
        "--purger-listen".into(),
        "127.0.0.1:0".into(),
        "--lifecycle-listen".into(),
        "127.0.0.1:0".into(),
        "--gateway-listen".into(),
        "127.0.0.1:0".into(),
        "--jukebox-dir".into(),
        path(&boxes),
        "--state-dir".into(),
        path(&dir.path().join("state")),
        "--insecure-registry".into(),
        registry.host(),
        // Nothing copies into this layout while it is purged: no grace.
        "--layout-gc-grace-seconds".into(),
        "0".into(),
    ];
    let config = <vynil_local::Config as clap::Parser>::parse_from(args);
    let stop = vynil_runtime::Shutdown::new();
    let bound = vynil_local::bind(config).await.unwrap();
    let at = bound.addresses();
    let (catalog_addr, scanner_addr, purger_addr) = (at.catalog, at.scanner, at.purger);
    let local = tokio::spawn(bound.run(stop.signaled()));

    let mut scanner = ScannerClient::new(channel(scanner_addr).await);
    let mut catalogs = CatalogClient::new(channel(catalog_addr).await);
    for source in ["registry", "layout"] {
        for maturity in MATURITIES {
            let jukebox = format!("{source}-{maturity}");
            let id =
                scanner.scan(ScanRequest { jukebox: jukebox.clone(), ..Default::default() }).await.unwrap();
            let mut stream = scanner
                .watch_scan(WatchScanRequest { scan_id: id.into_inner().scan_id })
                .await
                .unwrap()
                .into_inner();
            let mut last = None;
            while let Some(status) = stream.next().await {
                last = Some(status.unwrap());
            }
            assert_eq!(last.unwrap().state, ScanState::Succeeded as i32, "{jukebox}");
        }
    }
    for maturity in MATURITIES {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let from_registry = catalog(&mut catalogs, &format!("registry-{maturity}")).await;
            let from_layout = catalog(&mut catalogs, &format!("layout-{maturity}")).await;
            if !from_registry.is_empty() && from_registry == from_layout {
                break;
            }
            assert!(Instant::now() < deadline, "{maturity}: {from_registry:#?} vs {from_layout:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let stable = catalog(&mut catalogs, "layout-stable").await;
    assert!(
        stable.iter().any(|r| r.contains("think/ollama 0.1.9"))
            && stable.iter().any(|r| r.contains("think/ollama 0.1.10")),
        "both types of the type-changed package: {stable:#?}"
    );

    let mut purger = PurgerClient::new(channel(purger_addr).await);
    let plan = |jukebox: &str| PlanRequest { target: Some(Target::Jukebox(jukebox.into())) };
    let from_registry = purger.plan(plan("registry-stable")).await.unwrap().into_inner();
    let from_layout = purger.plan(plan("layout-stable")).await.unwrap().into_inner();
    assert_eq!(decisions(&from_registry), decisions(&from_layout));
    assert!(from_layout.delete_count > 0, "{from_layout:?}");

    let execute = ExecuteRequest {
        plan_id: from_layout.plan_id.clone(),
        confirm: from_layout.target.clone(),
        fingerprint: from_layout.fingerprint.clone(),
        acknowledge_usage_unknown: true,
    };
    let mut progress = purger.execute(execute).await.unwrap().into_inner();
    let mut report = None;
    while let Some(event) = progress.next().await {
        if let Some(Event::Report(r)) = event.unwrap().event {
            report = Some(r);
        }
    }
    let report = report.unwrap();
    assert_eq!(
        report.outcomes.len(),
        from_layout.entries.iter().filter(|e| !e.keep).map(|e| &e.digest).collect::<BTreeSet<_>>().len()
    );
    for repository in EXAMPLE_REPOSITORIES {
        let repo_dir = layout.join(repository);
        let kept: BTreeSet<String> = from_layout
            .entries
            .iter()
            .filter(|e| e.keep && e.repository == repository)
            .map(|e| e.tag.clone())
            .collect();
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(repo_dir.join("index.json")).unwrap()).unwrap();
        let tags: BTreeSet<String> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["annotations"]["org.opencontainers.image.ref.name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(tags, kept, "{repository}: index.json holds exactly the kept tags");
        assert_eq!(
            stored_blobs(&repo_dir),
            reachable_blobs(&repo_dir).unwrap(),
            "{repository}: nothing unreferenced"
        );
    }
    stop.trigger();
    local.await.unwrap().unwrap();
}
