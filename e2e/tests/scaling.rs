//! Horizontal scaling shown with processes: 3 catalogs, 2 scanners, 2
//! purgers, 2 lifecycles and 2 gateways (`vynil_e2e::fleet`), each its own
//! binary, on one Redis and the fake Kubernetes API server. Requests go
//! through different gateways; the registry front counts what reached the
//! registry, the fake API server what reached Kubernetes.
//!
//! Time budget on 2 cores (debug build): about 20–30 s per test, most of it
//! lease expiries (3 s leases) and the slowed tag lists that make scans long
//! enough to race, kill and freeze (`docs/scaling.md`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use http::Method;
use kube::api::PostParams;
use serde_json::{Value, json};
use vynil_e2e::{
    CONTROL_PLANE_NAMESPACE, eventually,
    fleet::{Fleet, Shape},
};
use vynil_gateway::auth::{Role, TokenBook};
use vynil_proto::catalog::v1::{GetCatalogRequest, catalog_client::CatalogClient};
use vynil_testkit::{
    Fault, FaultAction, Persistence, RedisSentinels,
    kube_api::{AgentOutcome, FakeAgent},
};

fn token(role: Role) -> String {
    format!("fleet-token-of-the-{}", role.as_str())
}

fn tokens_yaml() -> String {
    let lines: Vec<String> =
        Role::ALL.iter().map(|r| TokenBook::line(&format!("{}-user", r.as_str()), *r, &token(*r))).collect();
    format!("tokens:\n{}\n", lines.join("\n"))
}

/// One gateway of the fleet, over HTTP.
struct Gateway {
    base: String,
    http: reqwest::Client,
}

impl Gateway {
    fn of(fleet: &Fleet, index: usize) -> Self {
        Self { base: fleet.gateway(index), http: reqwest::Client::new() }
    }

    async fn call(&self, method: Method, path: &str, role: Role, body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(token(role));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer = request.send().await.unwrap();
        let status = answer.status().as_u16();
        let text = answer.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.call(Method::GET, path, Role::Viewer, None).await
    }

    /// `get`, again while it answers 503: right after Redis restarts, the
    /// first command on each of a service's connections fails (retry), and
    /// the connection is made again at once.
    async fn read(&self, path: &str) -> (u16, Value) {
        eventually(&format!("{path} to answer other than 503"), || async {
            let answer = self.get(path).await;
            (answer.0 != 503).then_some(answer)
        })
        .await
    }

    async fn scan(&self) -> String {
        let (status, body) =
            self.call(Method::POST, "/api/v1/jukeboxes/box/scans", Role::Operator, Some(json!({}))).await;
        assert_eq!(status, 202, "{body}");
        body["scan_id"].as_str().unwrap().to_string()
    }

    /// The scan's state once final.
    async fn finished(&self, scan_id: &str) -> Value {
        let path = format!("/api/v1/scans/{scan_id}");
        eventually(&format!("scan {scan_id} to finish"), || async {
            let (status, scan) = self.get(&path).await;
            let final_state = ["succeeded", "partially_failed", "failed"].contains(&scan["state"].as_str()?);
            (status == 200 && final_state).then_some(scan)
        })
        .await
    }

    /// Executes `plan` as admin and returns the names of the events it streamed
    /// (or the refusal's status and code).
    async fn execute(&self, plan: &Value) -> Result<Vec<(String, Value)>, (u16, Value)> {
        let path = format!("{}/api/v1/purge/plans/{}/execute", self.base, plan["plan_id"].as_str().unwrap());
        let confirm = json!({"confirm": plan["target"], "fingerprint": plan["fingerprint"]});
        let request = self.http.post(path).bearer_auth(token(Role::Admin)).json(&confirm);
        let mut answer = request.header("accept", "text/event-stream").send().await.unwrap();
        let status = answer.status().as_u16();
        if status != 200 {
            return Err((status, answer.json().await.unwrap_or(Value::Null)));
        }
        let mut text = String::new();
        while let Some(chunk) = answer.chunk().await.unwrap() {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        Ok(text
            .split("\n\n")
            .filter_map(|block| {
                let field = |name: &str| {
                    block.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim_start().to_string()))
                };
                Some((field("event:")?, serde_json::from_str(&field("data:")?).unwrap()))
            })
            .collect())
    }
}

/// What each catalog replica serves for `box`: `<image>:<tag>`, sorted.
async fn served(fleet: &Fleet) -> Vec<BTreeSet<String>> {
    let mut all = Vec::new();
    for catalog in &fleet.catalogs {
        let mut client = CatalogClient::new(catalog.channel().await.unwrap());
        let request = GetCatalogRequest { jukebox: "box".into(), ..Default::default() };
        let tags = match client.get_catalog(request).await {
            Ok(answer) => {
                answer.into_inner().packages.into_iter().map(|p| format!("{}:{}", p.image, p.tag)).collect()
            }
            Err(status) => BTreeSet::from([format!("error: {status}")]),
        };
        all.push(tags);
    }
    all
}

/// Until every catalog replica serves `packages` (`<image>:<tag>`).
async fn every_catalog_serves(fleet: &Fleet, packages: &[&str]) {
    let wanted: BTreeSet<String> = packages.iter().map(|p| p.to_string()).collect();
    let mut last = Vec::new();
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            last = served(fleet).await;
            if last.iter().all(|seen| *seen == wanted) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "every catalog replica should serve {wanted:?}; they serve {last:?}");
}

/// Tag lists slowed, so a scan lasts long enough to race with.
fn slow_scans(fleet: &Fleet, each: Duration) {
    let slow = FaultAction::DelayAnswer(each);
    fleet.front.inject(Fault::new(Some(Method::GET), "/tags/list", usize::MAX, slow));
}

/// JukeBox reads by the catalog replicas (get or list), as the API server saw them.
fn catalog_reads(fleet: &Fleet) -> usize {
    fleet
        .api
        .requests()
        .iter()
        .filter(|r| r.resource == "jukeboxes" && r.user_agent.starts_with("vynil-catalog"))
        .filter(|r| r.verb == "get" || r.verb == "list")
        .count()
}

#[tokio::test]
async fn replicas_share_one_scan_one_execution_and_every_catalog_follows() {
    let fleet = Fleet::start(&Shape::default(), &["apps/web"], &tokens_yaml()).await;
    for tag in ["1.0.0", "1.1.0", "2.0.0"] {
        fleet.publish("web", tag).await;
    }
    let gateways = [Gateway::of(&fleet, 0), Gateway::of(&fleet, 1)];
    let reads_at_start = catalog_reads(&fleet);

    // 20 scan requests at once, alternating gateways (so scanners): one scan
    // runs, at most one more is queued behind it, every request is satisfied.
    slow_scans(&fleet, Duration::from_millis(400));
    fleet.front.reset_counts();
    let requests = (0..20).map(|i| gateways[i % 2].scan());
    let ids: Vec<String> = futures::future::join_all(requests).await;
    let distinct: BTreeSet<&String> = ids.iter().collect();
    for id in &distinct {
        let scan = gateways[0].finished(id).await;
        assert_eq!(scan["state"], "succeeded", "{scan}");
    }
    let lists = fleet.front.count(&Method::GET, "/v2/apps/web/tags/list");
    println!("20 concurrent scan requests -> {} scan ids, {lists} tag lists", distinct.len());
    assert!(distinct.len() <= 2 && (1..=2).contains(&lists), "{} scans, {lists} tag lists", distinct.len());

    // Every catalog replica serves what the scan found, fed by the watch.
    every_catalog_serves(&fleet, &["apps/web:2.0.0"]).await;
    fleet.publish("web", "2.1.0").await;
    let id = gateways[1].scan().await;
    gateways[1].finished(&id).await;
    every_catalog_serves(&fleet, &["apps/web:2.1.0"]).await;
    let reads = catalog_reads(&fleet) - reads_at_start;
    println!("2 status changes -> {reads} JukeBox reads by 3 catalog replicas");
    assert!(reads <= 2, "at most one read per change, {reads} for 2 changes on 3 replicas");

    // One plan executed at once through both gateways (so both purgers):
    // no digest is deleted twice, and there is one report.
    let (status, plan) = gateways[0]
        .call(Method::POST, "/api/v1/purge/plans", Role::Operator, Some(json!({"jukebox": "box"})))
        .await;
    assert_eq!(status, 201, "{plan}");
    let doomed: BTreeSet<&str> = plan["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["keep"] == false)
        .map(|e| e["tag"].as_str().unwrap())
        .collect();
    assert_eq!(doomed, BTreeSet::from(["1.0.0", "1.1.0", "2.0.0"]), "{plan}");
    fleet.front.reset_counts();
    let slow_delete = FaultAction::DelayAnswer(Duration::from_millis(300));
    fleet.front.inject(Fault::new(Some(Method::DELETE), "/manifests/", usize::MAX, slow_delete));
    let (first, second) = tokio::join!(gateways[0].execute(&plan), gateways[1].execute(&plan));
    let summary = |outcome: &Result<Vec<(String, Value)>, (u16, Value)>| match outcome {
        Ok(events) => format!("{} events", events.len()),
        Err((status, body)) => format!("{status} {}", body["code"]),
    };
    println!("2 concurrent executes of one plan -> {}, {}", summary(&first), summary(&second));
    let reported = [&first, &second]
        .iter()
        .filter(|outcome| {
            outcome.as_ref().is_ok_and(|events| events.iter().any(|(name, _)| name == "report"))
        })
        .count();
    assert!(reported >= 1, "at least one execution streams its report: {first:?} {second:?}");
    for refused in [&first, &second].into_iter().filter_map(|outcome| outcome.as_ref().err()) {
        assert_eq!((refused.0, &refused.1["code"]), (409, &json!("CONFLICT")), "{refused:?}");
    }
    let deletes = deletes(&fleet);
    assert_eq!(deletes.len(), 3, "one DELETE per doomed digest: {deletes:?}");
    assert!(deletes.values().all(|n| *n == 1), "a digest deleted twice: {deletes:?}");
    let report_path = format!("/api/v1/purge/plans/{}/report", plan["plan_id"].as_str().unwrap());
    let (a, b) = (gateways[0].get(&report_path).await, gateways[1].get(&report_path).await);
    assert_eq!((a.0, b.0), (200, 200), "{a:?} {b:?}");
    assert_eq!(a.1, b.1, "one report, whichever gateway reads it");
}

/// Writes to Kubernetes by scanner replicas among `requests`.
fn scanner_writes(requests: &[vynil_testkit::kube_api::RequestRecord]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| r.user_agent.starts_with("vynil-scanner"))
        .filter(|r| ["create", "update", "patch", "delete"].contains(&r.verb.as_str()))
        .map(|r| format!("{} {}/{:?} {:?}", r.verb, r.resource, r.subresource, r.name))
        .collect()
}

/// Until a scanner holds the scan lease of `box` and the scan has reached the registry.
async fn holder_mid_scan(fleet: &Fleet) -> usize {
    let holder = eventually("a scanner to hold the scan lease", || async {
        let holder = fleet.scan_lease_holder().await?;
        (fleet.front.count(&Method::GET, "/tags/list") > 0).then_some(holder)
    })
    .await;
    Fleet::index_of(&holder)
}

#[tokio::test]
async fn a_scanner_killed_or_frozen_mid_scan_loses_no_request_and_writes_nothing_once_thawed() {
    let shape = Shape::default();
    let repositories = ["apps/web", "apps/db", "apps/cache"];
    let mut fleet = Fleet::start(&shape, &repositories, &tokens_yaml()).await;
    for name in ["web", "db", "cache"] {
        fleet.publish(name, "1.0.0").await;
    }
    slow_scans(&fleet, Duration::from_millis(1500));

    // kill -9 of the replica holding the scan: the other runs the same
    // request once the lease has expired.
    fleet.front.reset_counts();
    let id = Gateway::of(&fleet, 0).scan().await;
    let holder = holder_mid_scan(&fleet).await;
    let killed_at = Instant::now();
    fleet.scanners[holder].kill();
    // What the dead holder's lease has left, read after its death (so no renewal follows).
    let remaining = fleet.scan_lease_remaining().await.expect("the dead holder's lease");
    let other = Gateway::of(&fleet, 1 - holder);
    let scan = other.finished(&id).await;
    println!("scanner-{holder} killed -> scan {id} finished by the other after {:?}", killed_at.elapsed());
    assert_eq!(
        (scan["state"].as_str(), scan["repositories_done"].as_u64()),
        (Some("succeeded"), Some(3)),
        "{scan}"
    );
    assert!(
        killed_at.elapsed() >= remaining,
        "finished before the dead holder's lease ({remaining:?} left) expired"
    );
    every_catalog_serves(&fleet, &["apps/web:1.0.0", "apps/db:1.0.0", "apps/cache:1.0.0"]).await;

    // Restarted on its port, it serves again behind its gateway.
    fleet.scanners[holder].restart().await.unwrap();
    let id = Gateway::of(&fleet, holder).scan().await;
    assert_eq!(Gateway::of(&fleet, holder).finished(&id).await["state"], "succeeded");

    // SIGSTOP of the holder past its lease: the other finishes the scan;
    // after SIGCONT the frozen one writes nothing, in Kubernetes or Redis.
    fleet.publish("web", "1.1.0").await;
    fleet.front.reset_counts();
    let id = Gateway::of(&fleet, 0).scan().await;
    let holder = holder_mid_scan(&fleet).await;
    let metrics = format!("{}/metrics", fleet.scanners[holder].endpoint());
    let scans_ended = || async {
        let text = reqwest::get(&metrics).await.ok()?.text().await.ok()?;
        let counts: BTreeMap<String, u64> = text
            .lines()
            .filter_map(|l| l.strip_prefix("vynil_scanner_scans_total{outcome=\""))
            .filter_map(|l| l.split_once("\"} "))
            .map(|(outcome, n)| (outcome.to_string(), n.parse().unwrap_or(0)))
            .collect();
        Some(counts)
    };
    let ended_before = scans_ended().await.unwrap();
    fleet.scanners[holder].pause().unwrap();
    let paused = fleet.api.requests().len();
    let other = Gateway::of(&fleet, 1 - holder);
    let done = other.finished(&id).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    every_catalog_serves(&fleet, &["apps/web:1.1.0", "apps/db:1.0.0", "apps/cache:1.0.0"]).await;
    // The finisher's last write is its Event, after the record: wait for it
    // (the frozen one writes nothing meanwhile), so what follows is the thawed one's.
    let before = eventually("the finisher's Event", || async {
        let requests = fleet.api.requests();
        scanner_writes(&requests[paused..]).iter().any(|w| w.contains("events")).then_some(requests.len())
    })
    .await;
    // Thawed, it goes on where it stood: its slowed tag lists are answered,
    // it reads on, and its scan ends (abandoned, when it finds its lease lost).
    fleet.scanners[holder].resume().unwrap();
    let ended = eventually("the thawed scanner to end its scan", || async {
        let now = scans_ended().await?;
        (now.values().sum::<u64>() > ended_before.values().sum::<u64>()).then_some(now)
    })
    .await;
    let after = fleet.api.requests();
    let writes = scanner_writes(&after[before..]);
    assert!(
        writes.is_empty(),
        "the thawed scanner wrote after losing its lease: {writes:?}\n{}",
        fleet.scanners[holder].log()
    );
    let abandoned = |counts: &BTreeMap<String, u64>| counts.get("abandoned").copied().unwrap_or(0);
    assert_eq!(abandoned(&ended), abandoned(&ended_before) + 1, "{ended_before:?} -> {ended:?}");
    let (_, record) = other.get(&format!("/api/v1/scans/{id}")).await;
    assert_eq!(record, done, "the scan record is the finisher's");
    every_catalog_serves(&fleet, &["apps/web:1.1.0", "apps/db:1.0.0", "apps/cache:1.0.0"]).await;
}

/// The leader killed with a pending instance: the other replica takes the
/// Lease only once the dead one's last renewal has expired, and the install
/// follows its taking over. Ordering, not a figure (the time taken is printed).
#[tokio::test]
async fn the_lifecycle_leader_killed_is_replaced_once_its_lease_expired() {
    let shape = Shape::default();
    let mut fleet = Fleet::start(&shape, &["apps/web"], &tokens_yaml()).await;
    fleet.publish("web", "1.0.0").await;
    let id = Gateway::of(&fleet, 0).scan().await;
    Gateway::of(&fleet, 0).finished(&id).await;
    every_catalog_serves(&fleet, &["apps/web:1.0.0"]).await;
    let _agent = FakeAgent::start(&fleet.api, CONTROL_PLANE_NAMESPACE, |_| AgentOutcome::succeed()).unwrap();
    let leader = eventually("a lifecycle leader", || async { fleet.lifecycle_leader() }).await;
    let leader = Fleet::index_of(&leader);
    let killed_at = Instant::now();
    fleet.lifecycles[leader].kill();
    // What the dead leader left (a renewal still in flight can only make it later).
    let lease = |fleet: &Fleet| {
        fleet
            .api
            .object("coordination.k8s.io", "leases", Some(CONTROL_PLANE_NAMESPACE), "vynil-lifecycle")
            .unwrap()
    };
    let left = lease(&fleet);
    let micro = |v: &Value| v.as_str().unwrap().parse::<jiff::Timestamp>().unwrap();
    let expires = micro(&left["spec"]["renewTime"])
        + jiff::SignedDuration::from_secs(left["spec"]["leaseDurationSeconds"].as_i64().unwrap());
    let instances = vynil_e2e::tenant_instances(&fleet.api.client().unwrap());
    let instance = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "web", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "apps", "package": "web"}});
    instances.create(&PostParams::default(), &serde_json::from_value(instance).unwrap()).await.unwrap();
    eventually("the pending instance installed by the other replica", || async {
        let object = instances.get("web").await.ok()?;
        (object.data["status"]["package"]["tag"] == "1.0.0").then_some(())
    })
    .await;
    println!(
        "lifecycle-{leader} killed -> the other installed the pending instance after {:?}",
        killed_at.elapsed()
    );
    let taken = lease(&fleet);
    let holder = taken["spec"]["holderIdentity"].as_str().unwrap();
    assert_ne!(Fleet::index_of(holder), leader, "{taken}");
    let acquired = micro(&taken["spec"]["acquireTime"]);
    assert!(acquired >= expires, "taken at {acquired}, before the dead leader's lease expired at {expires}");
    assert_eq!(
        taken["spec"]["leaseTransitions"].as_i64(),
        left["spec"]["leaseTransitions"].as_i64().map(|n| n + 1),
        "{left} -> {taken}"
    );
    // The install's Job was made by the new leader, after it took the Lease
    // (creation times have the second as their unit).
    let jobs = fleet.api.objects("batch", "jobs");
    assert!(!jobs.is_empty());
    for job in &jobs {
        let created = micro(&job["metadata"]["creationTimestamp"]);
        assert!(
            created.as_second() >= acquired.as_second(),
            "{} made at {created}, before the Lease was taken at {acquired}",
            job["metadata"]["name"]
        );
    }
}

/// A fleet whose JukeBox has one package with a superseded revision, a plan
/// to delete it, and one scan running (slowed) with one queued behind it.
async fn mid_scan_with_a_plan(shape: Shape) -> (Fleet, Value, [String; 2]) {
    let fleet = Fleet::start(&shape, &["apps/web"], &tokens_yaml()).await;
    fleet.publish("web", "1.0.0").await;
    fleet.publish("web", "1.1.0").await;
    let gateways = [Gateway::of(&fleet, 0), Gateway::of(&fleet, 1)];
    let id = gateways[0].scan().await;
    gateways[0].finished(&id).await;
    every_catalog_serves(&fleet, &["apps/web:1.1.0"]).await;
    let (status, plan) = gateways[0]
        .call(Method::POST, "/api/v1/purge/plans", Role::Operator, Some(json!({"jukebox": "box"})))
        .await;
    assert_eq!(status, 201, "{plan}");
    slow_scans(&fleet, Duration::from_millis(1500));
    fleet.front.reset_counts();
    let running = gateways[0].scan().await;
    holder_mid_scan(&fleet).await;
    let queued = gateways[1].scan().await;
    assert_ne!(running, queued, "the second request queues behind the running scan");
    (fleet, plan, [running, queued])
}

/// After Redis came back: a new push is scanned and reaches every catalog
/// replica, through both gateways — no service was restarted.
async fn every_service_recovered(fleet: &Fleet, tag: &str) {
    fleet.front.clear_faults();
    fleet.publish("web", tag).await;
    for index in [1, 0] {
        let gateway = Gateway::of(fleet, index);
        let id = eventually("a scan request accepted again", || async {
            let (status, body) = gateway
                .call(Method::POST, "/api/v1/jukeboxes/box/scans", Role::Operator, Some(json!({})))
                .await;
            (status == 202).then(|| body["scan_id"].as_str().unwrap().to_string())
        })
        .await;
        assert_eq!(gateway.finished(&id).await["state"], "succeeded");
    }
    every_catalog_serves(fleet, &[&format!("apps/web:{tag}")]).await;
}

#[tokio::test]
async fn a_redis_restarted_with_its_append_only_file_keeps_every_request_and_plan() {
    let (mut fleet, plan, scans) =
        mid_scan_with_a_plan(Shape { persistence: Persistence::AppendOnly, ..Shape::default() }).await;
    fleet.redis.single().restart().await.unwrap();
    let gateway = Gateway::of(&fleet, 1);
    for id in &scans {
        let scan = gateway.finished(id).await;
        assert_eq!(scan["state"], "succeeded", "{scan}");
    }
    let plan_path = format!("/api/v1/purge/plans/{}", plan["plan_id"].as_str().unwrap());
    let (status, kept) = gateway.read(&plan_path).await;
    assert_eq!((status, &kept["fingerprint"]), (200, &plan["fingerprint"]), "{kept}");
    fleet.front.clear_faults(); // the purger re-lists within its 1 s registry timeout
    let events = gateway.execute(&plan).await.unwrap();
    assert_eq!(events.last().map(|(name, _)| name.as_str()), Some("report"), "{events:?}");
    every_service_recovered(&fleet, "1.2.0").await;
}

#[tokio::test]
async fn a_redis_restarted_empty_reports_each_lost_request_and_plan_as_lost() {
    let (mut fleet, plan, scans) =
        mid_scan_with_a_plan(Shape { persistence: Persistence::Off, ..Shape::default() }).await;
    let gateway = Gateway::of(&fleet, 1);
    let follow = gateway.http.get(format!("{}/api/v1/scans/{}/events", gateway.base, scans[1]));
    let following = tokio::spawn(follow.bearer_auth(token(Role::Viewer)).send());
    tokio::time::sleep(Duration::from_millis(300)).await;
    fleet.redis.single().restart().await.unwrap();
    for id in &scans {
        let (status, body) = eventually(&format!("scan {id} reported lost"), || async {
            let answer = gateway.read(&format!("/api/v1/scans/{id}")).await;
            (answer.0 != 200).then_some(answer)
        })
        .await;
        assert_eq!((status, body["code"].as_str()), (410, Some("LOST")), "{body}");
        assert!(body["message"].as_str().unwrap().contains("request a new scan"), "{body}");
    }
    // Whoever was following the queued scan is told, not left with a stream that just ends.
    let mut answer = following.await.unwrap().unwrap();
    let mut text = String::new();
    while let Some(chunk) = answer.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.contains("event: error") && text.contains("LOST"), "{text}");
    let plan_path = format!("/api/v1/purge/plans/{}", plan["plan_id"].as_str().unwrap());
    for path in [plan_path.clone(), format!("{plan_path}/report")] {
        let (status, body) = gateway.read(&path).await;
        assert_eq!((status, body["code"].as_str()), (410, Some("LOST")), "{path}: {body}");
    }
    let refused = gateway.execute(&plan).await.unwrap_err();
    assert_eq!((refused.0, refused.1["code"].as_str()), (410, Some("LOST")), "{refused:?}");
    every_service_recovered(&fleet, "1.2.0").await;
}

/// Whether tag `tag` of `apps/web` is still in the registry (read past the front).
async fn present(fleet: &Fleet, tag: &str) -> bool {
    let url = format!("{}/v2/apps/web/manifests/{tag}", fleet.registry.base_url());
    let accept = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json";
    let answer = reqwest::Client::new().head(url).header("accept", accept).send().await.unwrap();
    match answer.status().as_u16() {
        200 => true,
        404 => false,
        other => panic!("the registry answered {other} for {tag}"),
    }
}

/// What happens to Redis while an execution is in flight.
enum RedisFault {
    /// Restarted with its append-only file.
    Restart,
    /// Its primary killed (SIGKILL); the sentinels promote a replica.
    KillPrimary,
}

impl RedisFault {
    async fn strike(&self, fleet: &mut Fleet) {
        match self {
            RedisFault::Restart => fleet.redis.single().restart().await.unwrap(),
            RedisFault::KillPrimary => {
                let set = fleet.redis.sentinels();
                let primary = set.primary().await.unwrap();
                set.kill(primary).unwrap();
                set.failed_over_from(primary, Duration::from_secs(60)).await.unwrap();
            }
        }
    }
}

#[tokio::test]
async fn a_redis_restarted_mid_execute_deletes_nothing_twice_and_the_execution_converges() {
    let shape = Shape { persistence: Persistence::AppendOnly, ..Shape::default() };
    mid_execute(&shape, RedisFault::Restart).await;
}

#[tokio::test]
async fn a_redis_primary_killed_mid_execute_deletes_nothing_twice_and_the_execution_converges() {
    mid_execute(&Shape { sentinel: true, ..Shape::default() }, RedisFault::KillPrimary).await;
}

/// A fleet whose JukeBox has four revisions of one package, scanned, and a
/// plan deleting three of them.
async fn with_a_plan_of_three(shape: &Shape) -> (Fleet, Value) {
    let fleet = Fleet::start(shape, &["apps/web"], &tokens_yaml()).await;
    for tag in ["1.0.0", "1.1.0", "2.0.0", "2.1.0"] {
        fleet.publish("web", tag).await;
    }
    let gateway = Gateway::of(&fleet, 0);
    let id = gateway.scan().await;
    gateway.finished(&id).await;
    every_catalog_serves(&fleet, &["apps/web:2.1.0"]).await;
    let (status, plan) = gateway
        .call(Method::POST, "/api/v1/purge/plans", Role::Operator, Some(json!({"jukebox": "box"})))
        .await;
    assert_eq!(status, 201, "{plan}");
    (fleet, plan)
}

/// Executes `plan` through gateway 1 until it streams its report.
async fn executed_again(fleet: &Fleet, plan: &Value) -> Vec<(String, Value)> {
    let again = Gateway::of(fleet, 1);
    eventually("the plan executed again to its report", || async {
        match again.execute(plan).await {
            Ok(events) if events.iter().any(|(name, _)| name == "report") => Some(events),
            _ => None,
        }
    })
    .await
}

/// How many DELETEs of each digest the registry answered. A DELETE the
/// purger gave up on (its execution failed while it was in flight) may reach
/// the front and never the registry: sending it again is no second deletion.
fn deletes(fleet: &Fleet) -> BTreeMap<String, usize> {
    let mut deletes: BTreeMap<String, usize> = BTreeMap::new();
    for seen in fleet.front.answered().iter().filter(|s| s.method == Method::DELETE) {
        *deletes.entry(seen.path.clone()).or_default() += 1;
    }
    deletes
}

/// A plan deleting three tags, executed with slow DELETE answers, `fault`
/// striking after the first DELETE: what was reported deleted is gone, the
/// plan executed again converges, and no digest is deleted twice.
async fn mid_execute(shape: &Shape, fault: RedisFault) {
    let (mut fleet, plan) = with_a_plan_of_three(shape).await;
    let doomed: Vec<String> = plan["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["keep"] == false)
        .map(|e| e["tag"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(doomed.len(), 3, "{plan}");

    // Each DELETE is applied at once and answered late: Redis restarts while
    // the execution holds its lease and journals its outcomes.
    fleet.front.reset_counts();
    let slow = FaultAction::DelayAnswer(Duration::from_millis(700));
    fleet.front.inject(Fault::new(Some(Method::DELETE), "/manifests/", usize::MAX, slow));
    let first = {
        let (gateway, plan) = (Gateway::of(&fleet, 0), plan.clone());
        tokio::spawn(async move { gateway.execute(&plan).await })
    };
    eventually("the first DELETE to reach the registry", || async {
        fleet.front.seen().iter().any(|s| s.method == Method::DELETE).then_some(())
    })
    .await;
    fault.strike(&mut fleet).await;
    let first = first.await.unwrap();
    // What the first execution reported deleted is gone, whatever else it said.
    if let Ok(events) = &first {
        for (_, outcome) in
            events.iter().filter(|(name, outcome)| name == "outcome" && outcome["state"] == "deleted")
        {
            for tag in outcome["tags"].as_array().into_iter().flatten() {
                assert!(
                    !present(&fleet, tag.as_str().unwrap()).await,
                    "{outcome} reported deleted but present"
                );
            }
        }
    }

    // Executing the same plan again converges: every doomed tag gone, every
    // kept one present, no digest deleted twice.
    fleet.front.clear_faults();
    let events = executed_again(&fleet, &plan).await;
    let names = |events: &[(String, Value)]| events.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    println!("first execution: {:?}; second: {:?}", first.as_ref().map(|e| names(e)), names(&events));
    for tag in &doomed {
        assert!(!present(&fleet, tag).await, "{tag} still present after executing again");
    }
    assert!(present(&fleet, "2.1.0").await, "the head is kept");
    let deletes = deletes(&fleet);
    assert!(deletes.values().all(|n| *n == 1), "a digest deleted twice: {deletes:?}");
}

/// A scan record's key in Redis (`services/scanner/src/requests/redis_queue.rs`).
fn scan_key(id: &str) -> String {
    format!("vynil:v1:scanner:scan:{id}")
}

/// Whether `key` is on the Redis node at `url`, read past every service.
async fn on_node(url: &str, key: &str) -> bool {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("EXISTS").arg(key).query_async::<i64>(&mut c).await.unwrap() == 1
}

#[tokio::test]
async fn a_redis_primary_killed_mid_scan_is_followed_by_every_service_and_loses_nothing_silently() {
    let (mut fleet, plan, scans) = mid_scan_with_a_plan(Shape { sentinel: true, ..Shape::default() }).await;
    let _agent = FakeAgent::start(&fleet.api, CONTROL_PLANE_NAMESPACE, |_| AgentOutcome::succeed()).unwrap();
    let leader = eventually("a lifecycle leader", || async { fleet.lifecycle_leader() }).await;
    let set = fleet.redis.sentinels();
    let old = set.primary().await.unwrap();
    set.kill(old).unwrap();
    let killed_at = Instant::now();
    // Ready still (they retry), and saying their primary does not answer.
    let readyz = format!("{}/readyz", fleet.gateway(0));
    let ready = || async { reqwest::get(&readyz).await.unwrap().json::<Value>().await.unwrap() };
    eventually("the gateway's /readyz to say the scanner's primary does not answer", || async {
        let ready = ready().await;
        let scanner = ready["services"]["scanner"].as_str().unwrap_or_default().to_string();
        (ready["ready"] == true && scanner.starts_with("ready; its Redis primary does not answer"))
            .then_some(())
    })
    .await;
    let set = fleet.redis.sentinels();
    let new = set.failed_over_from(old, Duration::from_secs(60)).await.unwrap();
    println!("primary :{old} killed -> the sentinels promoted :{new} after {:?}", killed_at.elapsed());

    // Each scan completes, or is reported lost: never "not found", never stuck.
    let gateway = Gateway::of(&fleet, 1);
    for id in &scans {
        let (status, body) = eventually(&format!("scan {id} final or lost"), || async {
            let (status, body) = gateway.read(&format!("/api/v1/scans/{id}")).await;
            let done =
                ["succeeded", "partially_failed", "failed"].contains(&body["state"].as_str().unwrap_or(""));
            (done || status == 410).then_some((status, body))
        })
        .await;
        assert!(
            (status == 200 && body["state"] == "succeeded") || (status == 410 && body["code"] == "LOST"),
            "scan {id}: {status} {body}"
        );
    }
    let plan_path = format!("/api/v1/purge/plans/{}", plan["plan_id"].as_str().unwrap());
    let (status, kept) = gateway.read(&plan_path).await;
    assert!(
        (status == 200 && kept["fingerprint"] == plan["fingerprint"])
            || (status == 410 && kept["code"] == "LOST"),
        "the plan: {status} {kept}"
    );

    // Every service follows the new primary: a new scan through each
    // gateway reaches every catalog replica, and its record is on the new
    // primary (an ordering check; the time it took is printed).
    every_service_recovered(&fleet, "1.2.0").await;
    println!("a new push scanned and served by every catalog {:?} after the kill", killed_at.elapsed());
    let ready = ready().await;
    for service in ["catalog", "scanner", "purger"] {
        assert_eq!(ready["services"][service], "ready", "{ready}");
    }
    let id = Gateway::of(&fleet, 0).scan().await;
    Gateway::of(&fleet, 0).finished(&id).await;
    assert!(
        on_node(&RedisSentinels::url(new), &scan_key(&id)).await,
        "scan {id} is recorded on the new primary"
    );

    // The lifecycle keeps its leader (its Lease is Kubernetes') and installs
    // from the catalogs that now read the new primary.
    let instances = vynil_e2e::tenant_instances(&fleet.api.client().unwrap());
    let instance = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "web", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "apps", "package": "web"}});
    instances.create(&PostParams::default(), &serde_json::from_value(instance).unwrap()).await.unwrap();
    eventually("the instance installed after the failover", || async {
        let object = instances.get("web").await.ok()?;
        (object.data["status"]["package"]["tag"] == "1.2.0").then_some(())
    })
    .await;
    // Its Lease is Kubernetes', untouched by the failover; a 3 s lease on 2
    // busy cores may still change hands, which is not what this shows.
    println!("lifecycle leader before the kill: {leader}; after: {:?}", fleet.lifecycle_leader());
}

/// The lost-lease case, forced: the replicas are cut off before purger-0
/// takes the execution lease, so the old primary alone could have it; the
/// primary is then killed and a replica that never had it promoted. purger-0
/// must not have started (its lease was never replicated); purger-1 takes
/// the lease on the new primary and executes the plan: no digest is deleted
/// twice. Without the replication wait, purger-0 deletes under a lease the
/// failover loses, and purger-1 deletes the same digests again.
#[tokio::test]
async fn a_purge_lease_no_replica_has_is_not_held_and_nothing_is_deleted_twice() {
    let (mut fleet, plan) = with_a_plan_of_three(&Shape { sentinel: true, ..Shape::default() }).await;

    fleet.front.reset_counts();
    let slow = FaultAction::DelayAnswer(Duration::from_millis(700));
    fleet.front.inject(Fault::new(Some(Method::DELETE), "/manifests/", usize::MAX, slow));
    let set = fleet.redis.sentinels();
    let old = set.primary().await.unwrap();
    let replicas = set.cut_off_replicas(old).await.unwrap();
    let first = Gateway::of(&fleet, 0).execute(&plan).await;
    // Long enough for purger-0 to have deleted, had it taken the lease.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let deleted_before = fleet.front.seen().iter().filter(|s| s.method == Method::DELETE).count();
    let set = fleet.redis.sentinels();
    set.kill(old).unwrap();
    for port in &replicas {
        set.thaw(*port).unwrap();
    }
    set.failed_over_from(old, Duration::from_secs(60)).await.unwrap();
    assert_eq!(deleted_before, 0, "purger-0 deleted under a lease no replica had: {first:?}");
    let refused = first.expect_err("purger-0 executes nothing without a replicated lease");
    assert_eq!(refused.0, 503, "{refused:?}");

    fleet.front.clear_faults();
    executed_again(&fleet, &plan).await;
    assert!(present(&fleet, "2.1.0").await, "the head is kept");
    let deletes = deletes(&fleet);
    assert_eq!(deletes.len(), 3, "{deletes:?}");
    assert!(deletes.values().all(|n| *n == 1), "a digest deleted twice: {deletes:?}");
}
