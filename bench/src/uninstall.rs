//! P5: a delete Job marked `Failed` → the instance's `Ready=False`
//! condition. The services of a cluster install as processes on the fake
//! Kubernetes API server (a `vynil_e2e::fleet` of one replica each), the
//! fake agent failing every delete Job; [`INSTANCES`] TenantInstances
//! installed, then deleted at once. Each delay runs from the agent's
//! read-back of the Failed Job to a watcher seeing the condition. Baseline,
//! same run: the fake's own watch delivery (a status patch to a bare
//! watcher's event), as often. The lifecycle's peak RSS through all this is
//! P6's loaded figure, beside its own idle one.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::{
    Api,
    api::{DeleteParams, DynamicObject, PostParams},
    runtime::watcher,
};
use serde_json::{Value, json};
use vynil_e2e::fleet::{Fleet, Shape};
use vynil_proto::{
    catalog::v1::{GetCatalogRequest, catalog_client::CatalogClient},
    scanner::v1::{ScanRequest, scanner_client::ScannerClient},
};
use vynil_testkit::kube_api::{AgentOutcome, FakeAgent};

use crate::{
    freshness::percentiles,
    report::{Figure, Row},
    scan::resident_mib,
};

const INSTANCES: usize = 20;
const WAIT: Duration = Duration::from_secs(60);

pub async fn delete_failure() -> Figure {
    let name = "delete Job Failed -> instance condition";
    // The fleet is test infrastructure, which panics on a failed set-up: a
    // task keeps that from taking the whole bench down.
    match tokio::spawn(measure()).await {
        Ok(rows) => Figure::from_result("P5", name, rows),
        Err(panic) => Figure::failed("P5", name, format!("the fleet panicked: {panic}")),
    }
}

fn deleting_failed(object: &DynamicObject) -> bool {
    object.data["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter().any(|c| {
            c["type"] == "Ready"
                && c["status"] == "False"
                && c["message"].as_str().is_some_and(|m| m.starts_with("[E_AGENT_FAILED]"))
        })
    })
}

async fn measure() -> anyhow::Result<Vec<Row>> {
    let shape =
        Shape { catalogs: 1, scanners: 1, purgers: 0, lifecycles: 1, gateways: 0, ..Shape::default() };
    let fleet = Fleet::start(&shape, &["apps/web"], "tokens: []\n").await;
    fleet.publish("web", "1.0.0").await;
    let mut scanner = ScannerClient::new(fleet.scanners[0].channel().await?);
    let request = vynil_e2e::as_gateway(ScanRequest { jukebox: "box".into(), ..Default::default() }, "bench");
    let scan = scanner.scan(request).await?.into_inner();
    let mut catalog = CatalogClient::new(fleet.catalogs[0].channel().await?);
    let deadline = Instant::now() + WAIT;
    // NOT_FOUND until the catalog has followed the first status write.
    let request = GetCatalogRequest { jukebox: "box".into(), ..Default::default() };
    while !catalog.get_catalog(request.clone()).await.is_ok_and(|a| !a.into_inner().packages.is_empty()) {
        anyhow::ensure!(Instant::now() < deadline, "scan {} showed nothing within {WAIT:?}", scan.scan_id);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lifecycle = fleet.lifecycles[0].pid();
    let idle_rss = resident_mib(lifecycle, "VmHWM:")?;
    let client = fleet.api.client()?;
    let agent = FakeAgent::start(&fleet.api, vynil_e2e::CONTROL_PLANE_NAMESPACE, |job| {
        if job.action == "delete" {
            AgentOutcome::fail("the delete hook exited 1")
        } else {
            AgentOutcome::succeed()
        }
    })?;
    let instances = vynil_e2e::tenant_instances(&client);

    // When a watcher first sees each instance's failure condition.
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let (watched, record) = (instances.clone(), seen.clone());
    let follower = tokio::spawn(async move {
        let mut objects = watcher(watched, watcher::Config::default()).boxed();
        while let Some(event) = objects.next().await {
            if let Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) = event
                && deleting_failed(&object)
                && let (Some(name), Ok(mut seen)) = (object.metadata.name.clone(), record.lock())
            {
                seen.entry(name).or_insert_with(Instant::now);
            }
        }
    });

    // When a watcher first sees each delete Job marked Failed (by the test
    // kit's Job runner, once its pods spent the backoff limit).
    let failed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let jobs: Api<Job> = Api::namespaced(client.clone(), vynil_e2e::CONTROL_PLANE_NAMESPACE);
    let record = failed.clone();
    let job_follower = tokio::spawn(async move {
        let config = watcher::Config::default().labels("vynil.solidite.fr/action=delete");
        let mut objects = watcher(jobs, config).boxed();
        while let Some(event) = objects.next().await {
            if let Ok(watcher::Event::Apply(job) | watcher::Event::InitApply(job)) = event
                && job
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Failed" && c.status == "True"))
                && let (Some(name), Ok(mut failed)) =
                    (job.metadata.labels.as_ref().and_then(|l| l.get("instance")).cloned(), record.lock())
            {
                failed.entry(name).or_insert_with(Instant::now);
            }
        }
    });

    let names: Vec<String> = (0..INSTANCES).map(|i| format!("web-{i}")).collect();
    for name in &names {
        let instance = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
            "metadata": {"name": name, "namespace": "apps"},
            "spec": {"jukebox": "box", "category": "apps", "package": "web"}});
        instances.create(&PostParams::default(), &serde_json::from_value(instance)?).await?;
    }
    let deadline = Instant::now() + WAIT;
    for name in &names {
        while instances.get(name).await?.data["status"]["package"]["tag"] != "1.0.0" {
            anyhow::ensure!(Instant::now() < deadline, "{name} was not installed within {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for name in &names {
        instances.delete(name, &DeleteParams::default()).await?;
    }
    agent.wait_for_runs(2 * INSTANCES, WAIT).await?;
    let deadline = Instant::now() + WAIT;
    let marked: HashMap<String, Instant> = loop {
        let marked = failed.lock().map(|f| f.clone()).unwrap_or_default();
        if marked.len() >= INSTANCES || Instant::now() > deadline {
            break marked;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    job_follower.abort();
    anyhow::ensure!(
        marked.len() == INSTANCES,
        "{} of {INSTANCES} delete Jobs were marked Failed",
        marked.len()
    );
    let mut delays = Vec::new();
    let deadline = Instant::now() + WAIT;
    while delays.is_empty() {
        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        if seen.len() >= INSTANCES {
            for (name, failed_at) in &marked {
                let shown = seen.get(name).ok_or_else(|| anyhow::anyhow!("no condition seen on {name}"))?;
                delays.push(shown.saturating_duration_since(*failed_at));
            }
        } else {
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} of {INSTANCES} instances showed Ready=False within {WAIT:?}",
                seen.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    follower.abort();

    let patches: Vec<Value> = (0..INSTANCES)
        .map(|i| {
            json!({"status": {"conditions": [
                {"type": "Updated", "status": "True", "message": format!("Updated succesfully ({i})"), "generation": 1}]}})
        })
        .collect();
    let bare = crate::freshness::watch_delivery(&fleet.boxes, &patches).await?;
    let loaded_rss = resident_mib(lifecycle, "VmHWM:")?;
    let (fail50, fail99) = percentiles(delays);
    let (bare50, bare99) = percentiles(bare);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(vec![
        Row::new(format!("Failed Job -> Ready=False, p50 of {INSTANCES}"), ms(fail50), "ms")
            .against("the fake API server's watch delivery, p50", ms(bare50)),
        Row::new(format!("Failed Job -> Ready=False, p99 of {INSTANCES}"), ms(fail99), "ms")
            .against("the fake API server's watch delivery, p99", ms(bare99)),
        Row::new(
            format!("vynil-lifecycle peak RSS, {INSTANCES} installs and failed deletes"),
            loaded_rss,
            "MiB",
        )
        .against("the same process idle", idle_rss),
    ])
}
