//! Scans against a real registry (behind the test kit's counting front) and a
//! real Redis: the scanner library in process, its work loop running.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::{sync::Arc, time::Duration};

use axum::http::Method;
use clap::Parser;
use vynil_scanner::{Config, RecordState, Scanner};
use vynil_testkit::{
    Fault, FaultAction, HttpFront, JukeboxBuilder, PackageSpec, PackageType, RedisServer, RegistryServer,
};

struct Harness {
    registry: RegistryServer,
    front: HttpFront,
    _redis: RedisServer,
    dir: tempfile::TempDir,
    scanner: Arc<Scanner>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn harness(registry: RegistryServer, repositories: &[&str]) -> Harness {
    harness_with(registry, repositories, &|_, _| vec![]).await
}

/// `extra` flags may depend on the front's host and the JukeBox directory.
async fn harness_with(
    registry: RegistryServer,
    repositories: &[&str],
    extra: &dyn Fn(&HttpFront, &std::path::Path) -> Vec<String>,
) -> Harness {
    let front = HttpFront::start(&registry.base_url()).await.unwrap();
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let extra = extra(&front, dir.path());
    let list: Vec<String> = repositories.iter().map(|r| format!("{}/{r}", front.host())).collect();
    JukeboxBuilder::new("box").list(list).write_to(dir.path()).unwrap();
    let config = Config::parse_from(
        vec![
            "vynil-scanner",
            "--jukebox-dir",
            dir.path().to_str().unwrap(),
            "--redis-url",
            &redis.url(),
            "--insecure-registry",
            &front.host(),
            "--vynil-version",
            "0.8.0",
            "--poll-milliseconds",
            "50",
        ]
        .into_iter()
        .map(String::from)
        .chain(extra.iter().map(|e| e.to_string()).collect::<Vec<_>>()),
    );
    let scanner = vynil_scanner::build(&config).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(scanner.clone().work(async move {
        let _ = stopped.await;
    }));
    Harness { registry, front, _redis: redis, dir, scanner, _stop: stop }
}

async fn scan(h: &Harness, filter: &str) -> vynil_scanner::ScanRecord {
    let filter = vynil_rules::ScanFilter::from_request(filter).unwrap();
    let (id, _) = h.scanner.request("box", vynil_rules::ScanScope::from_filter(filter)).await.unwrap();
    // Generous: a first scan of a large repository reads its manifests one by one.
    for _ in 0..7200 {
        let record = h.scanner.queue.record(&id).await.unwrap().unwrap();
        if record.is_final() {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("scan {id} did not finish");
}

async fn catalog(h: &Harness) -> Vec<String> {
    let record = h.scanner.store.get("box").await.unwrap().unwrap();
    record
        .status
        .map(|s| s.packages.iter().map(|p| format!("{}:{}", p.image, p.tag)).collect())
        .unwrap_or_default()
}

fn spec(category: &str, name: &str, kind: PackageType, tag: &str) -> PackageSpec {
    PackageSpec::new(category, name, kind, tag)
}

#[tokio::test]
async fn the_type_change_story_shows_the_last_tenant_revision_beside_the_new_service() {
    let registry = RegistryServer::start().await.unwrap();
    let p = registry.publisher();
    p.publish("think/ollama", &spec("think", "ollama", PackageType::Tenant, "0.1.5")).await.unwrap();
    p.publish("think/ollama", &spec("think", "ollama", PackageType::Tenant, "0.1.8").min("0.1.0"))
        .await
        .unwrap();
    p.publish("think/ollama", &spec("think", "ollama", PackageType::Service, "0.1.9").min("0.1.8"))
        .await
        .unwrap();
    p.publish("think/ollama", &spec("think", "ollama", PackageType::Service, "0.1.10")).await.unwrap();
    let h = harness(registry, &["think/ollama"]).await;
    let record = scan(&h, "").await;
    assert_eq!(record.state, RecordState::Succeeded, "{record:?}");
    assert_eq!(catalog(&h).await, ["think/ollama:0.1.10", "think/ollama:0.1.8"]);
    let status = h.scanner.store.get("box").await.unwrap().unwrap().status.unwrap();
    let conditions: Vec<(String, String)> =
        status.conditions.iter().map(|c| (format!("{:?}", c.condition_type), c.message.clone())).collect();
    assert_eq!(
        conditions,
        [("Updated".into(), "Updated succesfully".into()), ("Ready".into(), "Updated succesfully".into())]
    );
}

async fn three_repositories() -> RegistryServer {
    let registry = RegistryServer::start().await.unwrap();
    let p = registry.publisher();
    for (repository, category, name) in
        [("db/pg", "db", "pg"), ("db/mysql", "db", "mysql"), ("monitoring/prom", "monitoring", "prom")]
    {
        p.publish(repository, &spec(category, name, PackageType::System, "1.0.0")).await.unwrap();
    }
    registry
}

#[tokio::test]
async fn partial_scans_replace_only_what_their_filter_names() {
    let h = harness(three_repositories().await, &["db/pg", "db/mysql", "monitoring/prom"]).await;
    assert_eq!(scan(&h, "").await.state, RecordState::Succeeded);
    let p = h.registry.publisher();
    for (repository, category, name) in
        [("db/pg", "db", "pg"), ("db/mysql", "db", "mysql"), ("monitoring/prom", "monitoring", "prom")]
    {
        p.publish(repository, &spec(category, name, PackageType::System, "2.0.0")).await.unwrap();
    }

    h.front.reset_counts();
    assert_eq!(scan(&h, "db/pg").await.state, RecordState::Succeeded);
    assert_eq!(catalog(&h).await, ["db/mysql:1.0.0", "monitoring/prom:1.0.0", "db/pg:2.0.0"]);
    assert_eq!(h.front.count(&Method::GET, "/tags/list"), 1, "only db/pg was listed");

    assert_eq!(scan(&h, "db").await.state, RecordState::Succeeded);
    assert_eq!(catalog(&h).await, ["monitoring/prom:1.0.0", "db/mysql:2.0.0", "db/pg:2.0.0"]);

    h.front.reset_counts();
    let before = catalog(&h).await;
    let record = scan(&h, "apps/x").await;
    assert_eq!(record.state, RecordState::Succeeded);
    assert!(h.front.seen().is_empty(), "a filter matching nothing reads nothing: {:?}", h.front.seen());
    assert_eq!(catalog(&h).await, before, "and changes nothing");
}

#[tokio::test]
async fn a_scan_requested_after_a_push_sees_the_tag_even_while_an_older_scan_runs() {
    let h = harness(three_repositories().await, &["db/pg"]).await;
    // The running scan's tag list is read at once but answered slowly, so
    // the push below lands after that scan has read the registry.
    h.front.inject(Fault::new(
        Some(Method::GET),
        "/tags/list",
        1,
        FaultAction::DelayAnswer(Duration::from_millis(800)),
    ));
    let (running, _) = h.scanner.request("box", vynil_rules::ScanScope::Full).await.unwrap();
    for _ in 0..400 {
        if h.front.count(&Method::GET, "/tags/list") >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.registry.publisher().publish("db/pg", &spec("db", "pg", PackageType::System, "2.0.0")).await.unwrap();
    let record = scan(&h, "").await;
    assert_ne!(record.id, running, "the running scan started before the request");
    assert_eq!(record.state, RecordState::Succeeded, "{record:?}");
    assert_eq!(catalog(&h).await, ["db/pg:2.0.0"]);
}

#[tokio::test]
async fn manifests_read_counts_this_scans_reads_while_repositories_scan_concurrently() {
    let registry = three_repositories().await;
    let p = registry.publisher();
    for (repository, category, name) in [("db/pg", "db", "pg"), ("db/mysql", "db", "mysql")] {
        for tag in ["1.0.1", "1.0.2", "1.0.3", "1.0.4"] {
            p.publish(repository, &spec(category, name, PackageType::System, tag)).await.unwrap();
        }
    }
    let h = harness(registry, &["db/pg", "db/mysql", "monitoring/prom"]).await;
    // Slow manifests keep the repositories' reads overlapping.
    h.front.inject(Fault::new(
        Some(Method::GET),
        "/manifests/",
        usize::MAX,
        FaultAction::Delay(Duration::from_millis(30)),
    ));
    let record = scan(&h, "").await;
    assert_eq!(record.state, RecordState::Succeeded, "{record:?}");
    let sent = h.front.count(&Method::GET, "/manifests/") as u64;
    assert_eq!(sent, 11, "5 + 5 + 1 manifests, each read once");
    assert_eq!(record.manifests_read, sent);
}

#[tokio::test]
async fn a_failed_repository_keeps_its_entries_while_the_others_update() {
    let h = harness(three_repositories().await, &["db/pg", "db/mysql", "monitoring/prom"]).await;
    assert_eq!(scan(&h, "").await.state, RecordState::Succeeded);
    let p = h.registry.publisher();
    p.publish("db/mysql", &spec("db", "mysql", PackageType::System, "2.0.0")).await.unwrap();
    p.publish("db/pg", &spec("db", "pg", PackageType::System, "2.0.0")).await.unwrap();
    h.front.inject(Fault::new(None, "/v2/db/pg/", usize::MAX, FaultAction::Status(500)));

    let record = scan(&h, "").await;
    assert_eq!(record.state, RecordState::PartiallyFailed);
    assert_eq!(catalog(&h).await, ["db/pg:1.0.0", "db/mysql:2.0.0", "monitoring/prom:1.0.0"]);
    let status = h.scanner.store.get("box").await.unwrap().unwrap().status.unwrap();
    let updated = status.conditions.iter().find(|c| format!("{:?}", c.condition_type) == "Updated").unwrap();
    assert_eq!(format!("{:?}", updated.status), "False");
    assert!(updated.message.contains("/db/pg") && updated.message.contains("500"), "{}", updated.message);
}

#[tokio::test]
async fn under_each_registry_fault_the_others_update_the_faulted_keeps_its_entries_and_all_converge() {
    // What a registry does wrong on one repository's manifests, until it is fixed.
    let faults = [
        ("500", FaultAction::Status(500)),
        ("429", FaultAction::TooManyRequests { retry_after_secs: 0 }),
        ("truncated", FaultAction::Truncate),
        ("oversized", FaultAction::Oversize(5 * 1024 * 1024)),
        ("tampered", FaultAction::Tamper),
    ];
    for (name, action) in faults {
        let h = harness(three_repositories().await, &["db/pg", "db/mysql", "monitoring/prom"]).await;
        assert_eq!(scan(&h, "").await.state, RecordState::Succeeded);
        let untouched = h.scanner.store.get("box").await.unwrap().unwrap().status.unwrap().packages;
        let untouched: Vec<_> = untouched.into_iter().filter(|p| p.image == "monitoring/prom").collect();
        let p = h.registry.publisher();
        p.publish("db/mysql", &spec("db", "mysql", PackageType::System, "2.0.0")).await.unwrap();
        p.publish("db/pg", &spec("db", "pg", PackageType::System, "2.0.0")).await.unwrap();
        h.front.inject(Fault::new(None, "/v2/db/pg/manifests/", usize::MAX, action));

        let record = scan(&h, "").await;
        assert_eq!(record.state, RecordState::PartiallyFailed, "{name}: {record:?}");
        assert_eq!(record.errors.len(), 1, "{name}: {record:?}");
        assert!(record.errors[0].0.ends_with("/db/pg"), "{name}: {record:?}");
        assert_eq!(
            catalog(&h).await,
            ["db/pg:1.0.0", "db/mysql:2.0.0", "monitoring/prom:1.0.0"],
            "{name}: the faulted repository keeps its entries, the others update"
        );
        let after = h.scanner.store.get("box").await.unwrap().unwrap().status.unwrap().packages;
        let after: Vec<_> = after.into_iter().filter(|p| p.image == "monitoring/prom").collect();
        assert_eq!(after, untouched, "{name}: an untouched repository's entries are identical");

        h.front.clear_faults();
        assert_eq!(scan(&h, "").await.state, RecordState::Succeeded, "{name}: converges once fixed");
        assert_eq!(catalog(&h).await, ["db/pg:2.0.0", "db/mysql:2.0.0", "monitoring/prom:1.0.0"], "{name}");
    }
}

#[tokio::test]
async fn a_repository_of_1200_tags_is_scanned_completely_and_a_rescan_reads_no_manifest() {
    let registry = RegistryServer::from_fixture("scanner-1200-tags-v1", |registry| async move {
        let items: Vec<(String, PackageSpec)> = (0..1200)
            .map(|i| {
                let kind = if i == 3 { PackageType::Service } else { PackageType::Tenant };
                let tag = format!("{}.{}.{}", i / 100, (i / 10) % 10, i % 10);
                ("big/repo".to_string(), spec("big", "repo", kind, &tag))
            })
            .collect();
        registry.publisher().publish_all(&items, 16).await?;
        Ok(registry)
    })
    .await
    .unwrap();
    let h = harness(registry, &["big/repo"]).await;
    let record = scan(&h, "").await;
    assert_eq!(record.state, RecordState::Succeeded, "{record:?}");
    assert_eq!(record.tags_seen, 1200);
    // The newest tenant, then the type-aware descent finds the only service revision.
    assert_eq!(catalog(&h).await, ["big/repo:11.9.9", "big/repo:0.0.3"]);
    // Only tenant and service revisions exist: the type-aware descent looks for
    // a system revision to the end, reading each manifest once.
    assert_eq!(h.front.count(&Method::GET, "/manifests/"), 1200);
    // A tag never seen is read with one GET, its digest the body's: no HEAD.
    assert_eq!(h.front.count(&Method::HEAD, "/manifests/"), 0, "a first scan sends no HEAD");

    h.front.reset_counts();
    assert_eq!(scan(&h, "").await.state, RecordState::Succeeded);
    assert_eq!(h.front.count(&Method::GET, "/manifests/"), 0, "an immediate rescan makes zero manifest GETs");
    // Tags seen before are checked for re-pointing: one HEAD each.
    assert_eq!(h.front.count(&Method::HEAD, "/manifests/"), 1200);
    let _ = h.dir.path();
}

#[tokio::test]
async fn a_repository_over_the_tag_cap_is_reported_not_truncated() {
    let h = harness_with(three_repositories().await, &["db/pg", "db/mysql"], &|_, _| {
        vec!["--max-tags-per-repository".into(), "1".into()]
    })
    .await;
    h.registry.publisher().publish("db/pg", &spec("db", "pg", PackageType::System, "2.0.0")).await.unwrap();
    let record = scan(&h, "").await;
    assert_eq!(record.state, RecordState::PartiallyFailed);
    assert_eq!(catalog(&h).await, ["db/mysql:1.0.0"], "db/pg had no previous entries to keep");
    let (repository, why) = &record.errors[0];
    assert!(repository.ends_with("/db/pg"), "{repository}");
    assert!(why.contains("2 tags, over the cap of 1"), "{why}");
}

#[tokio::test]
async fn a_manifest_over_the_size_limit_is_reported_and_keeps_the_catalog() {
    let h = harness_with(three_repositories().await, &["db/pg", "db/mysql"], &|_, _| {
        vec!["--max-manifest-bytes".into(), "200".into()]
    })
    .await;
    let record = scan(&h, "").await;
    // Each repository failed on its own; the source was read.
    assert_eq!(record.state, RecordState::PartiallyFailed, "{record:?}");
    assert_eq!(record.errors.len(), 2, "{record:?}");
    for (_, why) in &record.errors {
        assert!(why.contains("larger than 200 bytes") && why.contains("--max-manifest-bytes"), "{why}");
    }
    assert!(catalog(&h).await.is_empty(), "nothing read, nothing invented");
}

#[tokio::test]
async fn a_source_over_the_repository_cap_fails_its_scan_and_keeps_the_catalog() {
    let h = harness_with(three_repositories().await, &["db/pg", "db/mysql"], &|_, _| {
        vec!["--max-repositories-per-jukebox".into(), "2".into()]
    })
    .await;
    assert_eq!(scan(&h, "").await.state, RecordState::Succeeded, "two repositories: within the cap");
    let before = catalog(&h).await;
    let host = h.front.host();
    JukeboxBuilder::new("box")
        .list([format!("{host}/db/pg"), format!("{host}/db/mysql"), format!("{host}/monitoring/prom")])
        .write_to(h.dir.path())
        .unwrap();
    h.front.reset_counts();
    let record = scan(&h, "").await;
    assert_eq!(record.state, RecordState::Failed);
    let why = &record.errors[0].1;
    assert!(
        why.contains("3 repositories, over the cap of 2") && why.contains("--max-repositories-per-jukebox"),
        "{why}"
    );
    assert_eq!(catalog(&h).await, before, "nothing lost");
    assert_eq!(h.front.count(&Method::GET, "/tags/list"), 0, "nothing read");
}

#[tokio::test]
async fn a_failing_source_script_is_a_condition_and_keeps_the_catalog() {
    let h = harness(three_repositories().await, &["db/pg"]).await;
    assert_eq!(scan(&h, "").await.state, RecordState::Succeeded);
    std::fs::write(h.dir.path().join("leak.rhai"), r#"export const value = "leaked/repository";"#).unwrap();
    let module = h.dir.path().join("leak").to_string_lossy().into_owned();
    for (script, says) in [
        ("throw \"no registry today\"".to_string(), "no registry today"),
        (format!("import {module:?} as m; [m::value]"), "leak"),
        ("loop { }".to_string(), "operations"),
    ] {
        JukeboxBuilder::new("box").script(&script).write_to(h.dir.path()).unwrap();
        let record = scan(&h, "").await;
        assert_eq!(record.state, RecordState::Failed, "{script}");
        assert_eq!(
            catalog(&h).await,
            ["db/pg:1.0.0"],
            "the edited file is read at the next scan; nothing lost"
        );
        let status = h.scanner.store.get("box").await.unwrap().unwrap().status.unwrap();
        let updated =
            status.conditions.iter().find(|c| format!("{:?}", c.condition_type) == "Updated").unwrap();
        assert!(updated.message.contains(says), "{script}: {}", updated.message);
    }
}

#[tokio::test]
async fn a_source_script_over_the_operation_limit_is_stopped_and_names_the_flag() {
    let h = harness_with(three_repositories().await, &["db/pg"], &|_, _| {
        vec!["--max-script-operations".into(), "500".into()]
    })
    .await;
    assert_eq!(scan(&h, "").await.state, RecordState::Succeeded);
    let host = h.front.host();
    // A few operations: within the limit.
    JukeboxBuilder::new("box").script(&format!("[\"{host}/db/pg\"]")).write_to(h.dir.path()).unwrap();
    assert_eq!(scan(&h, "").await.state, RecordState::Succeeded);
    // The same list built in a long loop: over it.
    let looping = format!("let r = []; for i in 0..1000 {{ if i == 999 {{ r.push(\"{host}/db/pg\") }} }} r");
    JukeboxBuilder::new("box").script(&looping).write_to(h.dir.path()).unwrap();
    let record = scan(&h, "").await;
    assert_eq!(record.state, RecordState::Failed);
    let why = &record.errors[0].1;
    assert!(why.contains("over 500 operations") && why.contains("--max-script-operations"), "{why}");
    assert_eq!(catalog(&h).await, ["db/pg:1.0.0"], "nothing lost");
}

#[tokio::test]
async fn a_private_registry_is_scanned_with_the_dockerconfig_credentials() {
    let options = vynil_testkit::RegistryOptions {
        basic_auth: Some(("robot".into(), "pull-only".into())),
        ..Default::default()
    };
    let private = || async {
        let registry = RegistryServer::start_with(options.clone()).await.unwrap();
        registry.publisher().publish("db/pg", &spec("db", "pg", PackageType::System, "1.0.0")).await.unwrap();
        registry
    };
    let with_secret = |front: &HttpFront, dir: &std::path::Path| {
        let auth = "cm9ib3Q6cHVsbC1vbmx5"; // base64("robot:pull-only")
        let path = dir.join("dockerconfig.json");
        std::fs::write(&path, format!(r#"{{"auths":{{"{}":{{"auth":"{auth}"}}}}}}"#, front.host())).unwrap();
        vec!["--dockerconfig".into(), path.to_str().unwrap().to_string()]
    };
    let h = harness_with(private().await, &["db/pg"], &with_secret).await;
    assert_eq!(scan(&h, "").await.state, RecordState::Succeeded);
    assert_eq!(catalog(&h).await, ["db/pg:1.0.0"]);

    let h = harness(private().await, &["db/pg"]).await;
    let record = scan(&h, "").await;
    assert_eq!(record.state, RecordState::PartiallyFailed);
    assert!(record.errors[0].1.contains("unauthorized"), "{:?}", record.errors);
}
