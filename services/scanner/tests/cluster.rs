//! The scanner in a cluster: scanner processes with `--kubernetes` against
//! the fake API server, a real registry (behind a counting front) and real
//! Redis. Force-scan (`docs/upstream-vynil.md` §9 item 14 in this design), concurrent status
//! writes, cron schedules across replicas, pull secrets.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use axum::http::Method;
use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use vynil_crds::{JukeBox, annotations::FORCE_SCAN};
use vynil_testkit::{
    Fault, FaultAction, HttpFront, JukeboxBuilder, PackageSpec, PackageType, RedisServer, RegistryOptions,
    RegistryServer, ServiceProcess,
    kube_api::{ApiFault, ApiFaultAction, FakeApiServer},
    upstream::{UpstreamReader, decode_jukebox_status},
};

struct World {
    registry: RegistryServer,
    front: HttpFront,
    redis: RedisServer,
    api: FakeApiServer,
    boxes: Api<JukeBox>,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    upstream: UpstreamReader,
}

/// What upstream's operator reads of what the scanner wrote: every JukeBox
/// status version the watch saw, and the final ones, decode with upstream's
/// types (`vynil_testkit::upstream`). Checked when each test's world goes,
/// unless the test already failed.
impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        for object in self.api.objects("vynil.solidite.fr", "jukeboxes") {
            decode_jukebox_status(&object).unwrap_or_else(|e| panic!("upstream cannot read a JukeBox: {e}"));
        }
        let refused = self.upstream.refused();
        assert!(
            refused.is_empty(),
            "upstream's types refused JukeBox statuses the scanner wrote: {refused:#?}"
        );
    }
}

async fn world() -> World {
    let registry = RegistryServer::start().await.unwrap();
    for name in ["a", "b"] {
        let spec = PackageSpec::new("apps", name, PackageType::Tenant, "1.0.0");
        registry.publisher().publish(&format!("apps/{name}"), &spec).await.unwrap();
    }
    let front = HttpFront::start(&registry.base_url()).await.unwrap();
    let redis = RedisServer::start().await.unwrap();
    // The scanner under its deployed grants, on its ServiceAccount's token.
    let api = FakeApiServer::start_under_deploy_rbac(&[]).await.unwrap();
    let boxes: Api<JukeBox> = Api::all(api.client().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let token = api.service_account_token("vynil-system", "vynil-scanner");
    let kubeconfig = api.write_kubeconfig_as(dir.path(), "vynil-system", &token).unwrap();
    let upstream = UpstreamReader::jukeboxes(api.client().unwrap());
    World { registry, front, redis, api, boxes, dir, kubeconfig, upstream }
}

impl World {
    async fn jukebox(&self, name: &str, repositories: &[&str], schedule: &str, pull_secret: Option<&str>) {
        let list: Vec<String> = repositories.iter().map(|r| format!("{}/{r}", self.front.host())).collect();
        let mut jukebox = JukeboxBuilder::new(name).list(list).schedule(schedule);
        if let Some(secret) = pull_secret {
            jukebox = jukebox.pull_secret(secret);
        }
        let jukebox: JukeBox = serde_json::from_value(jukebox.json()).unwrap();
        self.boxes.create(&PostParams::default(), &jukebox).await.unwrap();
    }

    async fn scanner(&self, extra: &[&str]) -> ServiceProcess {
        let (redis, front) = (self.redis.url(), self.front.host());
        let insecure = format!("{front},{}", self.registry.host());
        // Loopback, as in local mode: the service token's own tests are in
        // e2e/tests/privileged.rs.
        let mut args = vec![
            "--allow-unauthenticated",
            "--kubernetes",
            "--redis-url",
            &redis,
            "--insecure-registry",
            &insecure,
            "--scan-lease-seconds",
            "2",
            "--poll-milliseconds",
            "100",
            "--trigger-resync-seconds",
            "1",
        ];
        args.extend_from_slice(extra);
        let kubeconfig = self.kubeconfig.to_str().unwrap();
        let _ = &self.dir;
        ServiceProcess::start_with_env(
            Path::new(env!("CARGO_BIN_EXE_vynil-scanner")),
            &args,
            &[("KUBECONFIG", kubeconfig), ("RUST_LOG", "info")],
        )
        .await
        .unwrap()
    }

    async fn annotate(&self, name: &str, value: &str) {
        let patch = json!({"metadata": {"annotations": {FORCE_SCAN: value}}});
        self.boxes.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    }

    async fn tags(&self, name: &str) -> Vec<String> {
        let jukebox = self.boxes.get(name).await.unwrap();
        let packages = jukebox.status.map(|s| s.packages).unwrap_or_default();
        packages.iter().map(|p| format!("{}:{}", p.content.metadata.name, p.tag)).collect()
    }

    async fn annotation(&self, name: &str) -> Option<String> {
        self.boxes.get(name).await.unwrap().annotations().get(FORCE_SCAN).cloned()
    }

    /// Waits for `check` on the JukeBox; panics with the scanner's log.
    async fn until(&self, what: &str, scanner: &ServiceProcess, check: impl Fn(&JukeBox) -> bool) -> JukeBox {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let jukebox = self.boxes.get("box").await.unwrap();
            if check(&jukebox) {
                return jukebox;
            }
            if Instant::now() > deadline {
                panic!("{what} never happened: {jukebox:?}\nscanner log:\n{}", scanner.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn no_annotation(jukebox: &JukeBox) -> bool {
    !jukebox.annotations().contains_key(FORCE_SCAN)
}

fn condition(jukebox: &JukeBox, kind: &str) -> Option<(String, String)> {
    let status = jukebox.status.as_ref()?;
    let value = serde_json::to_value(&status.conditions).ok()?;
    value.as_array()?.iter().find(|c| c["type"] == kind).map(|c| {
        (
            c["status"].as_str().unwrap_or_default().to_string(),
            c["message"].as_str().unwrap_or_default().to_string(),
        )
    })
}

#[tokio::test]
async fn force_scan_true_scans_everything_and_the_annotation_goes_after_the_status_write() {
    let world = world().await;
    world.jukebox("box", &["apps/a", "apps/b"], "0 0 1 1 *", None).await;
    let scanner = world.scanner(&[]).await;
    world.annotate("box", "true").await;
    world.until("the force-scan to be served", &scanner, no_annotation).await;
    assert_eq!(world.tags("box").await, ["a:1.0.0", "b:1.0.0"]);

    // Order in the API server's log: the status write, then the annotation removal.
    let log = world.api.requests();
    let status_write =
        log.iter().position(|r| r.verb == "update" && r.subresource.as_deref() == Some("status"));
    let removal =
        log.iter().rposition(|r| r.verb == "patch" && r.resource == "jukeboxes" && r.subresource.is_none());
    assert!(status_write.is_some() && removal.is_some() && status_write < removal, "{log:#?}");
    let events = world.api.objects("events.k8s.io", "events");
    assert!(
        events.iter().any(|e| e["reason"] == "ScanSucceed" && e["note"] == "Found 2 packages"),
        "{events:#?}"
    );
}

#[tokio::test]
async fn force_scan_with_a_filter_scans_only_that_package_and_a_bad_filter_is_reported() {
    let world = world().await;
    world.jukebox("box", &["apps/a", "apps/b"], "0 0 1 1 *", None).await;
    let scanner = world.scanner(&[]).await;
    world.annotate("box", "true").await;
    world.until("the first scan", &scanner, no_annotation).await;
    for name in ["a", "b"] {
        let spec = PackageSpec::new("apps", name, PackageType::Tenant, "1.1.0");
        world.registry.publisher().publish(&format!("apps/{name}"), &spec).await.unwrap();
    }
    world.front.reset_counts();
    world.annotate("box", "apps/a").await;
    world.until("the partial scan", &scanner, no_annotation).await;
    assert_eq!(world.tags("box").await, ["b:1.0.0", "a:1.1.0"], "only apps/a was rescanned");
    assert_eq!(world.front.count(&Method::GET, "apps/b/tags/list"), 0);

    world.annotate("box", "apps/a/extra").await;
    let jukebox = world.until("the invalid filter to be handled", &scanner, no_annotation).await;
    let (status, message) = condition(&jukebox, "Updated").unwrap();
    assert_eq!(status, "False");
    assert!(message.starts_with("[E_INVALID_SCAN_FILTER] force-scan \"apps/a/extra\""), "{message}");
    assert_eq!(world.tags("box").await, ["b:1.0.0", "a:1.1.0"], "nothing lost");
}

#[tokio::test]
async fn a_scanner_dying_mid_scan_leaves_the_annotation_and_the_next_one_scans_again() {
    let world = world().await;
    world.jukebox("box", &["apps/a", "apps/b"], "0 0 1 1 *", None).await;
    world.front.inject(Fault::new(
        Some(Method::GET),
        "/tags/list",
        2,
        FaultAction::DelayAnswer(Duration::from_secs(3)),
    ));
    let first = world.scanner(&["--repository-concurrency", "1"]).await;
    world.annotate("box", "true").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while world.front.count(&Method::GET, "/tags/list") == 0 {
        assert!(Instant::now() < deadline, "the scan never started:\n{}", first.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(first); // SIGKILL, mid-scan
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(world.annotation("box").await.as_deref(), Some("true"), "the annotation stays");
    assert!(world.tags("box").await.is_empty());

    let second = world.scanner(&[]).await;
    world.until("the scan to run again", &second, no_annotation).await;
    assert_eq!(world.tags("box").await, ["a:1.0.0", "b:1.0.0"]);
}

#[tokio::test]
async fn a_status_write_meeting_a_concurrent_change_re_merges_and_loses_neither() {
    let world = world().await;
    world.jukebox("box", &["apps/a", "apps/b"], "0 0 1 1 *", None).await;
    let scanner = world.scanner(&[]).await;
    world.annotate("box", "true").await;
    world.until("the first scan", &scanner, no_annotation).await;
    let before = world.boxes.get("box").await.unwrap().status.unwrap();

    // Another writer (a partial scan of another category, say) adds a package
    // just before the scanner's next status write.
    let mut other = serde_json::to_value(&before.packages).unwrap();
    let mut extra = other[0].clone();
    extra["image"] = json!("other/x");
    extra["metadata"]["category"] = json!("other");
    extra["metadata"]["name"] = json!("x");
    other.as_array_mut().unwrap().push(extra);
    let concurrent = json!({"status": {"packages": other}});
    world.api.inject(ApiFault::new(
        Some("update"),
        Some("jukeboxes/status"),
        1,
        ApiFaultAction::WriteFirst(concurrent),
    ));
    let spec = PackageSpec::new("apps", "a", PackageType::Tenant, "1.1.0");
    world.registry.publisher().publish("apps/a", &spec).await.unwrap();
    world.annotate("box", "apps/a").await;
    world.until("the partial scan", &scanner, no_annotation).await;
    let mut tags = world.tags("box").await;
    tags.sort();
    assert_eq!(tags, ["a:1.1.0", "b:1.0.0", "x:1.0.0"], "both writes are in the status");
    let conflicts =
        world.api.requests().iter().filter(|r| r.subresource.as_deref() == Some("status")).count();
    assert!(conflicts >= 3, "a first write, its conflict, the re-merged write");
}

#[tokio::test]
async fn a_schedule_scans_once_per_tick_across_two_replicas() {
    let world = world().await;
    world.jukebox("box", &["apps/a"], "*/2 * * * * *", None).await;
    let jitter = ["--schedule-jitter-milliseconds", "1500"];
    let (first, second) = (world.scanner(&jitter).await, world.scanner(&jitter).await);
    let redis =
        redis::Client::open(world.redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let ticks = |mut redis: redis::aio::MultiplexedConnection| async move {
        let keys: Vec<String> = redis::cmd("KEYS").arg("*tick*").query_async(&mut redis).await.unwrap();
        keys
    };
    // Waits for the ticks themselves, not for a time that should hold some.
    let deadline = Instant::now() + Duration::from_secs(60);
    while ticks(redis.clone()).await.len() < 3 {
        assert!(Instant::now() < deadline, "fewer than 3 ticks claimed:\n{}\n{}", first.log(), second.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Stop the ticks; each claimed tick's scan reaches the registry once.
    let stop = json!({"spec": {"schedule": "0 0 1 1 *"}});
    world.boxes.patch("box", &PatchParams::default(), &Patch::Merge(&stop)).await.unwrap();
    let (mut steady, mut last) = (0, None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while steady < 3 {
        let now = (world.front.count(&Method::GET, "apps/a/tags/list"), ticks(redis.clone()).await);
        assert!(now.0 <= now.1.len(), "more scans than ticks: {now:?}\n{}\n{}", first.log(), second.log());
        steady = if now.0 == now.1.len() && last.as_ref() == Some(&now) { steady + 1 } else { 0 };
        last = Some(now);
        assert!(
            Instant::now() < deadline,
            "a claimed tick never scanned: {last:?}\n{}\n{}",
            first.log(),
            second.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ticks = ticks(redis.clone()).await;
    assert!(ticks.len() >= 3, "{ticks:?}");
    assert_eq!(world.tags("box").await, ["a:1.0.0"]);
}

#[tokio::test]
async fn an_invalid_schedule_is_a_readable_condition() {
    let world = world().await;
    world.jukebox("box", &["apps/a"], "every hour", None).await;
    let scanner = world.scanner(&[]).await;
    let jukebox = world.until("the schedule problem", &scanner, |j| condition(j, "Ready").is_some()).await;
    let (status, message) = condition(&jukebox, "Ready").unwrap();
    assert_eq!(status, "False");
    assert!(message.starts_with("[E_INVALID_SCHEDULE] schedule \"every hour\""), "{message}");
}

#[tokio::test]
async fn pull_secrets_give_credentials_and_a_bad_one_is_reported_without_stopping_others() {
    let world = world().await;
    let private = RegistryServer::start_with(RegistryOptions {
        basic_auth: Some(("bob".into(), "s3cret".into())),
        ..Default::default()
    })
    .await
    .unwrap();
    let spec = PackageSpec::new("apps", "p", PackageType::Tenant, "2.0.0");
    private.publisher().publish("apps/p", &spec).await.unwrap();
    let create_box = |name: &str, secret: &str| {
        let images = [format!("{}/apps/p", private.host())];
        let jukebox = JukeboxBuilder::new(name).list(images).schedule("0 0 1 1 *").pull_secret(secret);
        serde_json::from_value::<JukeBox>(jukebox.json()).unwrap()
    };
    world.boxes.create(&PostParams::default(), &create_box("box", "registry-auth")).await.unwrap();
    world.boxes.create(&PostParams::default(), &create_box("broken", "not-docker")).await.unwrap();
    world.jukebox("public", &["apps/a"], "0 0 1 1 *", None).await;
    let secrets: Api<Secret> = Api::namespaced(world.api.client().unwrap(), "vynil-system");
    let opaque: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "not-docker", "labels": {vynil_crds::secrets::OPT_IN_LABEL: "true"}},
        "data": {"password": base64::engine::general_purpose::STANDARD.encode("x")},
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &opaque).await.unwrap();

    let scanner = world.scanner(&["--insecure-registry", &private.host()]).await;
    for name in ["box", "broken", "public"] {
        world.annotate(name, "true").await;
    }
    // The secret does not exist yet: a readable condition, and the other JukeBoxes go on.
    let jukebox = world.until("the missing secret to be reported", &scanner, no_annotation).await;
    let (status, message) = condition(&jukebox, "Updated").unwrap();
    assert_eq!(status, "False");
    assert!(
        message.starts_with(
            "[E_PULL_SECRET] pull secret \"registry-auth\" does not exist in namespace \"vynil-system\""
        ),
        "{message}"
    );
    for _ in 0..200 {
        if world.tags("public").await == ["a:1.0.0"] && world.annotation("broken").await.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(world.tags("public").await, ["a:1.0.0"]);
    let broken = world.boxes.get("broken").await.unwrap();
    let (_, message) = condition(&broken, "Updated").unwrap();
    assert!(message.contains("has no .dockerconfigjson key (type Opaque)"), "{message}");

    // With the secret, the private registry is scanned with its credentials.
    let auth = base64::engine::general_purpose::STANDARD.encode("bob:s3cret");
    let config = json!({"auths": {private.host(): {"auth": auth}}}).to_string();
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "registry-auth", "labels": {vynil_crds::secrets::OPT_IN_LABEL: "true"}},
        "data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(config)},
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    world.annotate("box", "true").await;
    world
        .until("the private scan", &scanner, |j| j.status.as_ref().is_some_and(|s| !s.packages.is_empty()))
        .await;
    assert_eq!(world.tags("box").await, ["p:2.0.0"]);
}

#[tokio::test]
async fn a_scanner_frozen_past_its_lease_writes_nothing_after_it_thaws() {
    use vynil_proto::scanner::v1::{ScanRequest, scanner_client::ScannerClient};
    let world = world().await;
    world.jukebox("box", &["apps/a", "apps/b"], "0 0 1 1 *", None).await;
    // The frozen replica's first tag list is read at once and answered late.
    world.front.inject(Fault::new(
        Some(Method::GET),
        "/tags/list",
        1,
        FaultAction::DelayAnswer(Duration::from_millis(1500)),
    ));
    let frozen = world.scanner(&["--repository-concurrency", "1"]).await;
    let mut client = ScannerClient::new(frozen.channel().await.unwrap());
    client.scan(ScanRequest { jukebox: "box".into(), ..Default::default() }).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while world.front.count(&Method::GET, "/tags/list") == 0 {
        assert!(Instant::now() < deadline, "the scan never started:\n{}", frozen.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    frozen.pause().unwrap();
    // Meanwhile apps/a gets a release the frozen replica's answer does not hold.
    let spec = PackageSpec::new("apps", "a", PackageType::Tenant, "2.0.0");
    world.registry.publisher().publish("apps/a", &spec).await.unwrap();

    let other = world.scanner(&[]).await;
    world
        .until("the other replica to take over once the lease expired", &other, |jukebox| {
            jukebox.status.as_ref().is_some_and(|s| s.packages.iter().any(|p| p.tag == "2.0.0"))
        })
        .await;
    frozen.resume().unwrap();
    // The thawed replica's scan ends one way or another: its outcome is counted.
    let outcome = loop {
        let metrics =
            reqwest::get(format!("{}/metrics", frozen.endpoint())).await.unwrap().text().await.unwrap();
        let ended =
            metrics.lines().find(|l| l.starts_with("vynil_scanner_scans_total{") && l.ends_with(" 1"));
        if let Some(line) = ended {
            break line.to_string();
        }
        assert!(Instant::now() < deadline + Duration::from_secs(20), "never ended:\n{}", frozen.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        world.tags("box").await,
        ["a:2.0.0", "b:1.0.0"],
        "the thawed replica's stale result was not written"
    );
    let requests = world.api.requests();
    let status_writes = requests
        .iter()
        .filter(|r| {
            r.resource == "jukeboxes"
                && r.subresource.as_deref() == Some("status")
                && matches!(r.verb.as_str(), "update" | "patch")
        })
        .count();
    assert_eq!(status_writes, 1, "only the replica holding the lease wrote: {requests:?}");
    let events = requests
        .iter()
        .filter(|r| r.resource == "events" && matches!(r.verb.as_str(), "create" | "patch"))
        .count();
    assert_eq!(events, 1, "and only its Event: {requests:?}");
    assert!(outcome.contains("outcome=\"abandoned\""), "{outcome}");
}

#[tokio::test]
async fn taking_over_from_upstream_deletes_its_scan_cronjob_and_job_and_releases_its_jukebox_finalizer() {
    use kube::api::DeleteParams;
    let w = world().await;
    w.jukebox("box", &["apps/a"], "0 0 1 1 *", None).await;
    // What upstream's operator leaves behind (scaled to zero): its scan
    // CronJob and Job, and its finalizer on the JukeBox.
    let client = w.api.client().unwrap();
    let scan_container =
        json!([{"name": "scan", "image": "docker.io/sebt3/vynil-agent:0.7.7", "args": ["box", "scan"]}]);
    let cronjob = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "scan-box", "namespace": "vynil-system"},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "OnFailure", "containers": scan_container}}}}}});
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "scan-box", "namespace": "vynil-system"},
        "spec": {"template": {"spec": {"restartPolicy": "OnFailure", "containers": scan_container}}}});
    // Someone else's CronJob of a similar name is not touched.
    let other = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "scan-box-report", "namespace": "vynil-system"},
        "spec": {"schedule": "0 4 * * *", "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "OnFailure",
            "containers": [{"name": "report", "image": "busybox", "args": ["echo"]}]}}}}}});
    let cronjobs: Api<k8s_openapi::api::batch::v1::CronJob> = Api::namespaced(client.clone(), "vynil-system");
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), "vynil-system");
    cronjobs.create(&PostParams::default(), &serde_json::from_value(cronjob).unwrap()).await.unwrap();
    cronjobs.create(&PostParams::default(), &serde_json::from_value(other).unwrap()).await.unwrap();
    jobs.create(&PostParams::default(), &serde_json::from_value(job).unwrap()).await.unwrap();
    let finalizer = json!({"metadata": {"finalizers": ["jukeboxes.vynil.solidite.fr"]}});
    w.boxes.patch("box", &PatchParams::default(), &Patch::Merge(&finalizer)).await.unwrap();

    let scanner = w.scanner(&[]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while cronjobs.get_opt("scan-box").await.unwrap().is_some()
        || jobs.get_opt("scan-box").await.unwrap().is_some()
    {
        assert!(Instant::now() < deadline, "upstream's scan objects are still there:\n{}", scanner.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(cronjobs.get_opt("scan-box-report").await.unwrap().is_some(), "not upstream's: kept");

    // Deleting the JukeBox: upstream's finalizer is released, the JukeBox goes.
    w.boxes.delete("box", &DeleteParams::default()).await.unwrap();
    while w.boxes.get_opt("box").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the JukeBox never went:\n{}", scanner.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_http_index_source_reads_its_secret_from_the_api_and_says_when_it_is_missing() {
    let world = world().await;
    let served = tempfile::tempdir().unwrap();
    let server = vynil_testkit::IndexServer::start(served.path(), "t0ken").await.unwrap();
    let package = vynil_rules::Package::new(
        "r.example",
        "db/pg",
        "1.0.0",
        vynil_rules::PackageContent::minimal("db", "pg", vynil_rules::PackageType::Tenant),
    );
    let location = vynil_index::Location::Directory(served.path().join("idx"));
    vynil_index::write_index(&location, &[package], &[]).await.unwrap();
    let jukebox: JukeBox = serde_json::from_value(json!({
        "apiVersion": "vynil.solidite.fr/v1", "kind": "JukeBox",
        "metadata": {"name": "box", "annotations": {FORCE_SCAN: "true"}},
        "spec": {"schedule": "0 0 1 1 *", "source": {"http": {"url": format!("{}/idx", server.url()), "secret": "index-auth"}}}
    }))
    .unwrap();
    world.boxes.create(&PostParams::default(), &jukebox).await.unwrap();
    let scanner = world.scanner(&[]).await;

    let failed = world.until("the missing secret to be reported", &scanner, no_annotation).await;
    let (status, message) = condition(&failed, "Updated").unwrap_or_default();
    assert_eq!(status, "False");
    assert!(
        message.contains("secret \"index-auth\" does not exist in namespace \"vynil-system\""),
        "{failed:?}"
    );
    assert!(server.requests().is_empty(), "nothing asked without credentials");

    let secrets: Api<Secret> = Api::namespaced(world.api.client().unwrap(), "vynil-system");
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "index-auth", "labels": {vynil_crds::secrets::OPT_IN_LABEL: "true"}},
        "data": {"token": "dDBrZW4="},
        "stringData": {"hosts": server.url().trim_start_matches("http://")},
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    world.annotate("box", "true").await;
    world
        .until("the index to be scanned", &scanner, |j| {
            no_annotation(j) && j.status.as_ref().is_some_and(|s| !s.packages.is_empty())
        })
        .await;
    assert_eq!(world.tags("box").await, ["pg:1.0.0"]);
    assert!(server.requests().iter().all(|r| r.status == 200 || r.status == 304), "{:?}", server.requests());
}

/// When the scanner first saw each revision's digest, in the JukeBox's status.
async fn first_seen(world: &World, tag: &str) -> (Option<String>, Option<String>) {
    let jukebox = world.boxes.get("box").await.unwrap();
    let packages = jukebox.status.map(|s| s.packages).unwrap_or_default();
    let found = packages.into_iter().find(|p| p.tag == tag);
    found.map(|p| (p.first_seen, p.digest)).unwrap_or_default()
}

/// #44 item 3: a revision's first sighting (its age for a minimum release
/// age) lives in the JukeBox's status, so a restarted scanner (or another
/// replica) keeps it; a tag re-pushed with a new digest starts again.
#[tokio::test]
async fn a_first_sighting_survives_a_scanner_restart_and_a_re_pushed_tag_starts_again() {
    let world = world().await;
    world.jukebox("box", &["apps/a"], "0 0 1 1 *", None).await;
    let first = world.scanner(&[]).await;
    world.annotate("box", "true").await;
    world.until("the first scan", &first, no_annotation).await;
    let (seen, digest) = first_seen(&world, "1.0.0").await;
    let seen = seen.expect("the scan records when it first saw 1.0.0");
    drop(first);

    let second = world.scanner(&[]).await;
    world.annotate("box", "true").await;
    world.until("a rescan by the restarted scanner", &second, no_annotation).await;
    assert_eq!(first_seen(&world, "1.0.0").await, (Some(seen.clone()), digest.clone()), "unchanged");

    let repushed = PackageSpec::new("apps", "a", PackageType::Tenant, "1.0.0").feature("upgrade");
    world.registry.publisher().publish("apps/a", &repushed).await.unwrap();
    world.annotate("box", "true").await;
    world.until("the re-pushed tag scanned", &second, no_annotation).await;
    let (again, new_digest) = first_seen(&world, "1.0.0").await;
    assert_ne!(new_digest, digest, "the re-push changed the digest");
    let (before, after): (jiff::Timestamp, jiff::Timestamp) =
        (seen.parse().unwrap(), again.unwrap().parse().unwrap());
    assert!(after > before, "a new digest is seen anew: {before} then {after}");
}

/// The attack of issue "Credentials that stay where they belong" item 1:
/// whoever may patch a JukeBox names the service token's Secret as an index
/// source's credentials and points the source at its own server. Refused,
/// label or not; a Secret of the user's own needs the opt-in label and goes
/// only to the hosts it binds.
#[tokio::test]
async fn a_jukebox_can_send_neither_the_service_token_nor_an_unbound_secret_anywhere() {
    let world = world().await;
    let served = tempfile::tempdir().unwrap();
    // The attacker's server, accepting the service token.
    let server = vynil_testkit::IndexServer::start(served.path(), "the-service-token").await.unwrap();
    let package = vynil_rules::Package::new(
        "r.example",
        "db/pg",
        "1.0.0",
        vynil_rules::PackageContent::minimal("db", "pg", vynil_rules::PackageType::Tenant),
    );
    vynil_index::write_index(&vynil_index::Location::Directory(served.path().join("idx")), &[package], &[])
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(world.api.client().unwrap(), "vynil-system");
    let create_secret = |name: &str, labelled: bool, data: serde_json::Value| {
        let labels = if labelled { json!({vynil_crds::secrets::OPT_IN_LABEL: "true"}) } else { json!({}) };
        serde_json::from_value::<Secret>(json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "labels": labels}, "stringData": data,
        }))
        .unwrap()
    };
    let token = json!({"token": "the-service-token"});
    secrets
        .create(&PostParams::default(), &create_secret("vynil-service-token", true, token.clone()))
        .await
        .unwrap();
    let jukebox: JukeBox = serde_json::from_value(json!({
        "apiVersion": "vynil.solidite.fr/v1", "kind": "JukeBox",
        "metadata": {"name": "box", "annotations": {FORCE_SCAN: "true"}},
        "spec": {"schedule": "0 0 1 1 *", "source": {"http": {"url": format!("{}/idx", server.url()), "secret": "vynil-service-token"}}}
    }))
    .unwrap();
    world.boxes.create(&PostParams::default(), &jukebox).await.unwrap();
    let scanner = world.scanner(&[]).await;
    let refused = world.until("the scan to end", &scanner, no_annotation).await;
    assert!(server.requests().is_empty(), "the service token was sent: {:?}", server.requests());
    let (status, message) = condition(&refused, "Ready").unwrap_or_default();
    assert_eq!(status, "False", "{refused:?}");
    assert!(
        message.starts_with(
            "[E_SECRET_NOT_ALLOWED] Secret vynil-service-token: it is one of the control plane's own"
        ) && message.ends_with("(docs/security.md)"),
        "{message}"
    );

    // A Secret of the user's own: without the label, refused; labelled but
    // bound to another host, refused; bound to the index's host, used.
    let host = server.url().trim_start_matches("http://").to_string();
    secrets.create(&PostParams::default(), &create_secret("index-auth", false, token.clone())).await.unwrap();
    let patch = json!({"spec": {"source": {"http": {"url": format!("{}/idx", server.url()), "secret": "index-auth"}}}});
    world.boxes.patch("box", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let steps = [
        (json!({"metadata": {"labels": {}}}), "it does not carry the label"),
        (
            json!({"metadata": {"labels": {vynil_crds::secrets::OPT_IN_LABEL: "true"}}, "stringData": {"hosts": "index.corp.example"}}),
            "its credentials are not bound to 127.0.0.1:",
        ),
    ];
    for (change, why) in steps {
        secrets.patch("index-auth", &PatchParams::default(), &Patch::Merge(&change)).await.unwrap();
        world.annotate("box", "true").await;
        let refused = world.until("the scan to end", &scanner, no_annotation).await;
        let (status, message) = condition(&refused, "Ready").unwrap_or_default();
        assert_eq!(status, "False", "{refused:?}");
        assert!(
            message.starts_with("[E_SECRET_NOT_ALLOWED] Secret index-auth: ") && message.contains(why),
            "{message}"
        );
        assert!(server.requests().is_empty(), "sent to an unbound host: {:?}", server.requests());
    }
    let bound = json!({"stringData": {"hosts": format!("index.corp.example, {host}")}});
    secrets.patch("index-auth", &PatchParams::default(), &Patch::Merge(&bound)).await.unwrap();
    world.annotate("box", "true").await;
    world
        .until("the index to be scanned", &scanner, |j| {
            j.status.as_ref().is_some_and(|s| !s.packages.is_empty())
        })
        .await;
    assert_eq!(world.tags("box").await, ["pg:1.0.0"]);
    let ready = world.boxes.get("box").await.unwrap();
    assert_eq!(condition(&ready, "Ready").map(|c| c.0).as_deref(), Some("True"), "{ready:?}");
}
