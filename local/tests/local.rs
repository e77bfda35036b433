//! Local mode as a newcomer runs it: the `vynil` binary, a directory of
//! JukeBox files, a real registry, no cluster and no Redis. Every service
//! answers on its port; a scan's status reaches the catalog through the one
//! shared store; the purger plans with usage unknown because the lifecycle
//! says "disabled: no cluster"; SIGTERM stops everything cleanly.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    net::SocketAddr,
    process::Stdio,
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use vynil_proto::{
    catalog::v1::{GetCatalogRequest, ListJukeboxesRequest, catalog_client::CatalogClient},
    lifecycle::v1::{ListInstalledRevisionsRequest, lifecycle_client::LifecycleClient},
    purger::v1::{PlanRequest, plan_request::Target, purger_client::PurgerClient},
    scanner::v1::{GetScanRequest, ScanRequest, ScanState, scanner_client::ScannerClient},
};
use vynil_testkit::{JukeboxBuilder, PackageSpec, PackageType, RegistryServer};

mod common;
use common::{Local, vynil};

async fn channel(addr: SocketAddr) -> Option<tonic::transport::Channel> {
    tonic::transport::Channel::from_shared(format!("http://{addr}")).ok()?.connect().await.ok()
}

async fn serving(addr: SocketAddr) -> bool {
    let Some(channel) = channel(addr).await else { return false };
    let answer = HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await;
    matches!(answer, Ok(r) if r.get_ref().status() == ServingStatus::Serving)
}

async fn start(registry: &RegistryServer) -> Local {
    let dir = tempfile::tempdir().unwrap();
    let images = [format!("{}/apps/web", registry.host())];
    JukeboxBuilder::new("box").list(images).schedule("0 0 1 1 *").write_to(dir.path()).unwrap();
    // A typo a newcomer makes: `sources` for `source`.
    let broken =
        "apiVersion: vynil.solidite.fr/v1\nkind: JukeBox\nmetadata:\n  name: broken\nspec:\n  sources: {}\n";
    std::fs::write(dir.path().join("broken.yaml"), broken).unwrap();
    let mut command = vynil(&[]);
    command
        .arg("--jukebox-dir")
        .arg(dir.path())
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--insecure-registry")
        .arg(registry.host())
        .env_remove("REDIS_URL")
        .stderr(Stdio::null());
    let local = Local::spawn(command, dir);
    // Generous: the binary may start slowly while other test binaries build.
    let deadline = Instant::now() + Duration::from_secs(90);
    for addr in &local.ports[..4] {
        while !serving(*addr).await {
            assert!(Instant::now() < deadline, "{addr} never served");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    local
}

/// The generated admin token, from the file local mode names.
fn admin_token(local: &Local) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = local.dir.path().join("state/admin-token");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the admin token is readable by its owner only");
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

#[tokio::test]
async fn one_process_serves_every_service_and_they_work_together() {
    let registry = RegistryServer::start().await.unwrap();
    let spec = PackageSpec::new("apps", "web", PackageType::Tenant, "1.2.0");
    registry.publisher().publish("apps/web", &spec).await.unwrap();
    let mut local = start(&registry).await;
    let [catalog, scanner, purger, lifecycle, gateway] = local.ports;

    let health = reqwest::get(format!("http://{gateway}/healthz")).await.unwrap();
    assert!(health.status().is_success());

    // A file that is not a JukeBox is named, with its error, where users look.
    let mut scans = ScannerClient::new(channel(scanner).await.unwrap());
    let missing =
        scans.scan(ScanRequest { jukebox: "broken".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    assert!(
        missing.message().contains("broken.yaml") && missing.message().contains("missing field"),
        "{missing:?}"
    );
    let listed = CatalogClient::new(channel(catalog).await.unwrap())
        .list_jukeboxes(ListJukeboxesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.skipped.len(), 1, "{listed:?}");
    assert!(listed.skipped[0].source.ends_with("broken.yaml"), "{listed:?}");

    // A scan through the scanner's API…
    let id = scans
        .scan(ScanRequest { jukebox: "box".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .scan_id;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = scans
            .get_scan(GetScanRequest { scan_id: id.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner()
            .state;
        if state == ScanState::Succeeded as i32 {
            break;
        }
        assert!(Instant::now() < deadline, "the scan never succeeded (state {state})");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // …is in the catalog's answers: they share one store.
    let mut catalog = CatalogClient::new(channel(catalog).await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer =
            catalog.get_catalog(GetCatalogRequest { jukebox: "box".into(), ..Default::default() }).await;
        if let Ok(answer) = answer
            && answer.get_ref().packages.iter().any(|p| p.tag == "1.2.0")
        {
            break;
        }
        assert!(Instant::now() < deadline, "the catalog never showed the scanned package");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // …and in the gateway's, with the admin token local mode generated.
    let http = reqwest::Client::new();
    let url = format!("http://{gateway}/api/v1/jukeboxes/box/catalog");
    assert_eq!(http.get(&url).send().await.unwrap().status(), 401, "no token, no answer");
    let answer = http.get(&url).bearer_auth(admin_token(&local)).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let page: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(page["items"][0]["tag"], "1.2.0", "{page}");
    assert_eq!(page["items"][0]["roles"][0]["kind"], "head", "{page}");

    // No cluster: the lifecycle says so, and the purger plans with usage unknown.
    let mut lifecycle = LifecycleClient::new(channel(lifecycle).await.unwrap());
    let refused =
        lifecycle.list_installed_revisions(ListInstalledRevisionsRequest::default()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(refused.message().contains("no cluster"), "{refused:?}");
    let mut purger = PurgerClient::new(channel(purger).await.unwrap());
    let plan =
        purger.plan(PlanRequest { target: Some(Target::Jukebox("box".into())) }).await.unwrap().into_inner();
    assert!(plan.usage_unknown, "{plan:?}");

    // SIGTERM stops every service and the process exits 0.
    nix::sys::signal::kill(Pid::from_raw(local.child.id() as i32), Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = local.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "local mode did not stop on SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn a_port_in_use_stops_local_mode_with_an_error() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let output = vynil(&[("--gateway-listen", &port)])
        .arg("--jukebox-dir")
        .arg(dir.path())
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("gateway stopped") && stderr.contains(&port), "{stderr}");
}

/// The README's first command, as a newcomer runs it in an empty directory:
/// no JukeBox directory, no network, no Redis. (Ports are moved off the
/// defaults only so that tests never collide with a developer's services.)
#[tokio::test]
async fn the_first_command_shows_the_embedded_examples_offline_and_sigterm_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = vynil(&[]);
    command
        .current_dir(dir.path())
        .env("HOME", dir.path().join("home"))
        .env_remove("XDG_STATE_HOME")
        .env_remove("VYNIL_JUKEBOX_DIR")
        .env_remove("REDIS_URL")
        .stderr(Stdio::null());
    let token_file = dir.path().join("home/.local/state/vynil/admin-token");
    // What the user reads, as it is printed.
    let mut local = Local::spawn(command, dir);
    let (gateway, ports) = (local.gateway(), local.ports);
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    let items = loop {
        if let Ok(token) = std::fs::read_to_string(&token_file) {
            let url = format!("http://{gateway}/api/v1/jukeboxes/examples/catalog");
            if let Ok(answer) = http.get(url).bearer_auth(token.trim()).send().await
                && answer.status() == 200
            {
                let page: serde_json::Value = answer.json().await.unwrap();
                if page["items"].as_array().is_some_and(|i| !i.is_empty()) {
                    break page["items"].as_array().unwrap().clone();
                }
            }
        }
        assert!(Instant::now() < deadline, "the example catalog never showed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ollama: Vec<(String, String)> = items
        .iter()
        .filter(|p| p["image"] == "think/ollama")
        .map(|p| (p["tag"].as_str().unwrap().into(), p["type"].as_str().unwrap().into()))
        .collect();
    assert_eq!(
        ollama,
        [("0.1.10".into(), "service".into()), ("0.1.9".into(), "tenant".into())],
        "{items:#?}"
    );
    assert!(items.iter().any(|p| p["image"] == "apps/web"), "{items:#?}");
    // The newcomer is told where to look once the first scan is done.
    while !local.printed().contains("/api/v1/jukeboxes/examples/catalog") {
        assert!(Instant::now() < deadline, "never said what to look at: {}", local.printed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    nix::sys::signal::kill(Pid::from_raw(local.child.id() as i32), Signal::SIGTERM).unwrap();
    // A hang guard, not a figure: the flush bound is 5 s.
    let status = local.wait_stopped(Duration::from_secs(60));
    assert!(status.success(), "{status:?}");
    let stdout = local.printed();
    assert!(stdout.contains("embedded example") && stdout.contains("admin-token"), "{stdout}");
    // Its log lines too, written to a pipe: no colour escapes.
    assert!(stdout.contains("INFO") && stdout.contains("serving"), "{stdout}");
    assert!(!stdout.contains('\u{1b}'), "escape sequences in a log written to a pipe: {stdout:?}");
    assert!(!stdout.contains(std::fs::read_to_string(&token_file).unwrap().trim()), "never the token itself");
    for port in ports {
        std::net::TcpListener::bind(port).unwrap_or_else(|e| panic!("{port} still held after exit: {e}"));
    }
}

/// Local mode with a service reachable beyond loopback still starts, but
/// its destructive calls are then the gateway's alone.
#[tokio::test]
async fn a_service_listening_beyond_loopback_refuses_unauthenticated_purges() {
    use vynil_proto::purger::v1::ExecuteRequest;
    let dir = tempfile::tempdir().unwrap();
    let mut command = vynil(&[("--purger-listen", "0.0.0.0:0")]);
    command.arg("--state-dir").arg(dir.path().join("state")).arg("--jukebox-dir").arg(dir.path());
    command.stderr(Stdio::null());
    let local = Local::spawn(command, dir);
    let purger = SocketAddr::from(([127, 0, 0, 1], local.ports[2].port()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !serving(purger).await {
        assert!(Instant::now() < deadline, "the purger never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let request = ExecuteRequest { plan_id: "p".into(), confirm: "x".into(), ..Default::default() };
    let refused = PurgerClient::new(channel(purger).await.unwrap()).execute(request).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
}
