//! The `vynil-gateway` binary as a real process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{process::Command, time::Duration};

use nix::{sys::signal::Signal, unistd::Pid};

#[tokio::test]
async fn the_binary_serves_healthz_refuses_the_api_without_a_token_and_exits_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    // A token made by the binary's own subcommand, in the file it reads.
    let made = Command::new(env!("CARGO_BIN_EXE_vynil-gateway"))
        .args(["token", "--name", "ci", "--role", "viewer"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let text = String::from_utf8(made.stdout).unwrap();
    let token = text.lines().next().unwrap().strip_prefix("token: ").unwrap().to_string();
    let line = text.lines().last().unwrap();
    std::fs::write(dir.path().join("tokens.yaml"), format!("tokens:\n{line}\n")).unwrap();

    let port = vynil_testkit::free_port().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vynil-gateway"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--tokens-file"])
        .arg(dir.path().join("tokens.yaml"))
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let mut healthy = false;
    for _ in 0..400 {
        if let Ok(r) = reqwest::get(format!("{base}/healthz")).await {
            healthy = r.status() == 200;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(healthy, "gateway did not answer /healthz");
    let api = reqwest::get(format!("{base}/api/v1/jukeboxes")).await.unwrap();
    assert_eq!(api.status(), 401);
    let id = api.headers()["x-request-id"].to_str().unwrap().to_string();
    let body: serde_json::Value = api.json().await.unwrap();
    assert_eq!(body["code"], "UNAUTHENTICATED");
    assert_eq!(body["request_id"], id.as_str(), "the error names the request");
    // With the token: authenticated, and the catalog (not configured) is named.
    let client = reqwest::Client::new();
    let who = client.get(format!("{base}/api/v1/whoami")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(who.json::<serde_json::Value>().await.unwrap()["name"], "ci");
    let down = client.get(format!("{base}/api/v1/jukeboxes")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(down.status(), 503);
    let body: serde_json::Value = down.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().starts_with("catalog is unavailable"), "{body}");

    nix::sys::signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "exit status {status}");
}
