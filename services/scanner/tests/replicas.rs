//! Two scanner processes on one Redis: one scan per JukeBox across replicas,
//! and a request that survives the death of the replica running it.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::{path::Path, time::Duration};

use axum::http::Method;
use vynil_proto::scanner::v1::{
    GetScanRequest, ScanRequest, ScanState, WatchScanRequest, scanner_client::ScannerClient,
};
use vynil_testkit::{
    Fault, FaultAction, HttpFront, PackageSpec, PackageType, RedisServer, RegistryServer, ServiceProcess,
};

const REPOSITORIES: [&str; 3] = ["apps/a", "apps/b", "apps/c"];

struct World {
    _registry: RegistryServer,
    front: HttpFront,
    redis: RedisServer,
    dir: tempfile::TempDir,
}

async fn world() -> World {
    let registry = RegistryServer::start().await.unwrap();
    for repository in REPOSITORIES {
        let name = repository.trim_start_matches("apps/");
        registry
            .publisher()
            .publish(repository, &PackageSpec::new("apps", name, PackageType::Tenant, "1.0.0"))
            .await
            .unwrap();
    }
    let front = HttpFront::start(&registry.base_url()).await.unwrap();
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let list: Vec<String> = REPOSITORIES.iter().map(|r| format!("{}/{r}", front.host())).collect();
    vynil_testkit::JukeboxBuilder::new("box").list(list).write_to(dir.path()).unwrap();
    // Slow tag lists make the scans long enough to race and to kill.
    front.inject(Fault::new(
        Some(Method::GET),
        "/tags/list",
        usize::MAX,
        FaultAction::DelayAnswer(Duration::from_millis(600)),
    ));
    World { _registry: registry, front, redis, dir }
}

async fn replica(world: &World) -> ServiceProcess {
    let (redis, front, dir) =
        (world.redis.url(), world.front.host(), world.dir.path().to_str().unwrap().to_string());
    let args = [
        "--allow-unauthenticated",
        "--jukebox-dir",
        &dir,
        "--redis-url",
        &redis,
        "--insecure-registry",
        &front,
        "--scan-lease-seconds",
        "2",
        "--poll-milliseconds",
        "100",
        "--repository-concurrency",
        "1",
    ];
    ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-scanner")), &args).await.unwrap()
}

async fn wait_final(client: &mut ScannerClient<tonic::transport::Channel>, id: &str) -> i32 {
    for _ in 0..600 {
        let status = client
            .get_scan(GetScanRequest { scan_id: id.into(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        if [ScanState::Succeeded, ScanState::PartiallyFailed, ScanState::Failed]
            .iter()
            .any(|s| *s as i32 == status.state)
        {
            return status.state;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("scan {id} never finished");
}

fn full() -> ScanRequest {
    ScanRequest { jukebox: "box".into(), ..Default::default() }
}

#[tokio::test]
async fn requests_made_on_two_replicas_during_a_scan_share_one_scan_queued_behind_it() {
    let world = world().await;
    let (a, b) = (replica(&world).await, replica(&world).await);
    let mut client_a = ScannerClient::new(a.channel().await.unwrap());
    let mut client_b = ScannerClient::new(b.channel().await.unwrap());
    let running = client_a.scan(full()).await.unwrap().into_inner();
    for _ in 0..200 {
        if world.front.count(&Method::GET, "/tags/list") >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut client_c = client_b.clone();
    let (first, second, third) =
        tokio::join!(client_a.scan(full()), client_b.scan(full()), client_c.scan(full()));
    let queued: Vec<_> = [first, second, third].into_iter().map(|r| r.unwrap().into_inner()).collect();
    assert!(
        queued.iter().all(|q| q.scan_id != running.scan_id),
        "a running scan started before them: {queued:?}"
    );
    assert!(
        queued.iter().all(|q| q.scan_id == queued[0].scan_id),
        "one queued scan serves them all: {queued:?}"
    );
    assert_eq!(queued.iter().filter(|q| !q.joined_existing).count(), 1, "{queued:?}");
    assert_eq!(wait_final(&mut client_b, &running.scan_id).await, ScanState::Succeeded as i32);
    assert_eq!(wait_final(&mut client_a, &queued[0].scan_id).await, ScanState::Succeeded as i32);
    for repository in REPOSITORIES {
        assert_eq!(
            world.front.count(&Method::GET, &format!("/v2/{repository}/tags/list")),
            2,
            "{repository}: the running scan and the queued one"
        );
    }
}

#[tokio::test]
async fn when_the_lease_holder_dies_mid_scan_another_replica_finishes_the_same_request() {
    let world = world().await;
    let holder = replica(&world).await;
    let mut client = ScannerClient::new(holder.channel().await.unwrap());
    let id = client.scan(full()).await.unwrap().into_inner().scan_id;
    for _ in 0..200 {
        if world.front.count(&Method::GET, "/tags/list") >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other = replica(&world).await;
    drop(holder); // SIGKILL, mid-scan
    let mut client = ScannerClient::new(other.channel().await.unwrap());
    assert_eq!(wait_final(&mut client, &id).await, ScanState::Succeeded as i32);
    let status =
        client.get_scan(GetScanRequest { scan_id: id, ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(status.repositories_done, 3);
    assert!(world.front.count(&Method::GET, "/tags/list") >= 4, "the scan ran again from the start");
}

#[tokio::test]
async fn watch_scan_streams_progress_until_the_scan_ends() {
    let world = world().await;
    let a = replica(&world).await;
    let mut client = ScannerClient::new(a.channel().await.unwrap());
    let id = client.scan(full()).await.unwrap().into_inner().scan_id;
    let mut stream = client.watch_scan(WatchScanRequest { scan_id: id }).await.unwrap().into_inner();
    let mut seen = Vec::new();
    while let Some(status) = stream.message().await.unwrap() {
        seen.push((status.state, status.repositories_done));
    }
    let last = *seen.last().unwrap();
    assert_eq!(last, (ScanState::Succeeded as i32, 3));
    let done: Vec<u32> = seen.iter().map(|(_, d)| *d).collect();
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "progress only grows: {done:?}");
    assert!(done.contains(&1) || done.contains(&2), "intermediate progress was streamed: {seen:?}");
}
