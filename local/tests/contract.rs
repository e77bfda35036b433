//! The HTTP contract held by a tester nobody here wrote: local mode as the
//! first command starts it (the embedded example, a fresh state directory:
//! throwaway data, purges included), then schemathesis (PyPI, pinned in
//! `scripts/requirements-test.txt`, installed by `scripts/test.sh`)
//! generates requests from the served `/openapi.json` and checks every
//! answer (`--checks all`, stateful links followed, seed pinned): as the
//! admin, zero failures; as a viewer, no server error, and every
//! state-changing operation refused 403. The document itself validates with
//! `openapi-spec-validator`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use vynil_gateway::{
    auth::{Role, TokenBook},
    routes::{Access, route_table},
};

mod common;
use common::{Local, vynil};

/// The schemathesis the test command installs (`scripts/requirements-test.txt`).
const SCHEMATHESIS: &str = "4.32.5";
/// Generated cases per operation and phase; the seed makes runs repeatable.
const EXAMPLES: &str = "30";
const SEED: &str = "1";

/// Local mode with its embedded example, its state in a directory of its own.
async fn start() -> Local {
    let dir = tempfile::tempdir().unwrap();
    let mut command = vynil(&[]);
    command
        .current_dir(dir.path())
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env_remove("REDIS_URL")
        .env_remove("VYNIL_JUKEBOX_DIR")
        .stderr(Stdio::null());
    let local = Local::spawn(command, dir);
    // Up once the first scan put the example in the catalog.
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(token) = std::fs::read_to_string(local.dir.path().join("state/admin-token")) {
            let url = format!("http://{}/api/v1/jukeboxes/examples/catalog", local.ports[4]);
            let answer = http.get(url).bearer_auth(token.trim()).send().await;
            if let Ok(answer) = answer
                && answer.status() == 200
            {
                break;
            }
        }
        assert!(Instant::now() < deadline, "local mode never showed its example catalog");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    local
}

fn schemathesis_installed() {
    let version = Command::new("schemathesis").arg("--version").output();
    let printed =
        version.as_ref().map(|o| String::from_utf8_lossy(&o.stdout).to_string()).unwrap_or_default();
    assert!(
        printed.contains(SCHEMATHESIS),
        "schemathesis {SCHEMATHESIS} is needed (found {printed:?}): \
         python3 -m pip install -r scripts/requirements-test.txt (scripts/test.sh does)"
    );
}

/// Runs schemathesis against local mode's document as `token`; its output and success.
fn schemathesis(local: &Local, token: &str, checks: &str) -> (String, bool) {
    let output = Command::new("schemathesis")
        .arg("run")
        .arg(format!("http://{}/openapi.json", local.ports[4]))
        .args(["--checks", checks, "--seed", SEED, "--max-examples", EXAMPLES, "--no-color"])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .current_dir(local.dir.path())
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (text, output.status.success())
}

#[tokio::test]
async fn schemathesis_finds_nothing_wrong_with_the_api_as_an_admin_or_a_viewer() {
    schemathesis_installed();
    let local = start().await;
    let admin = std::fs::read_to_string(local.dir.path().join("state/admin-token")).unwrap();

    // The document validates as OpenAPI 3.1.
    let document =
        reqwest::get(format!("http://{}/openapi.json", local.ports[4])).await.unwrap().text().await.unwrap();
    let file = local.dir.path().join("openapi.json");
    std::fs::write(&file, document).unwrap();
    let validated =
        Command::new("python3").args(["-m", "openapi_spec_validator"]).arg(&file).output().unwrap();
    assert!(
        validated.status.success(),
        "openapi-spec-validator: {}{} (install: python3 -m pip install -r scripts/requirements-test.txt)",
        String::from_utf8_lossy(&validated.stdout),
        String::from_utf8_lossy(&validated.stderr)
    );

    let started = Instant::now();
    let (report, passed) = schemathesis(&local, admin.trim(), "all");
    assert!(passed, "schemathesis as the admin:\n{report}");
    let generated = report.lines().find(|l| l.contains("generated")).unwrap_or_default().trim().to_string();
    assert!(generated.contains("passed"), "{report}");
    println!("as the admin: {generated} in {:.1} s", started.elapsed().as_secs_f64());

    // A viewer, added to the tokens file local mode wrote (the gateway reloads it).
    let tokens = local.dir.path().join("state/gateway-tokens.yaml");
    let mut text = std::fs::read_to_string(&tokens).unwrap();
    text.push_str(&format!(
        "{}\n",
        TokenBook::line("watcher", Role::Viewer, "viewer-token-for-the-contract-test")
    ));
    std::fs::write(&tokens, text).unwrap();
    let http = reqwest::Client::new();
    let whoami = format!("http://{}/api/v1/whoami", local.ports[4]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while http.get(&whoami).bearer_auth("viewer-token-for-the-contract-test").send().await.unwrap().status()
        != 200
    {
        assert!(Instant::now() < deadline, "the gateway never took the viewer's token");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (report, passed) = schemathesis(&local, "viewer-token-for-the-contract-test", "not_a_server_error");
    assert!(passed, "schemathesis as a viewer:\n{report}");
    // Every state-changing operation a viewer may not call is refused 403
    // (on fresh connections: the gateway closes idle ones after its header
    // timeout, and a POST is not retried on a closed one).
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    for route in route_table().into_iter().filter(|r| r.method != "GET") {
        let Access::Role(needed) = route.access else { continue };
        if needed == Role::Viewer {
            continue;
        }
        let path = route
            .path
            .replace("{jukebox}", "examples")
            .replace("{plan_id}", "p1")
            .replace("{kind}", "tenant")
            .replace("{namespace}", "apps")
            .replace("{name}", "web");
        let answer = http
            .request(route.method.clone(), format!("http://{}{path}", local.ports[4]))
            .bearer_auth("viewer-token-for-the-contract-test")
            .json(&serde_json::json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 403, "{} {} as a viewer", route.method, route.path);
    }
    assert!(Path::new(&local.dir.path().join("state")).exists());
}
