//! The `vynil-gateway` binary as a real process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{process::Command, time::Duration};

use vynil_testkit::{Readiness, ServiceProcess};

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

    // On a port it binds and keeps (another is tried if one is lost), up once /healthz answers.
    let tokens = dir.path().join("tokens.yaml").display().to_string();
    let mut gateway = ServiceProcess::launch(
        std::path::Path::new(env!("CARGO_BIN_EXE_vynil-gateway")),
        &["--tokens-file", &tokens],
        &[],
        Readiness::Http("/healthz".into()),
    )
    .await
    .unwrap();
    let base = gateway.endpoint();
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

    let status = gateway.terminate(Duration::from_secs(60)).await.unwrap();
    assert!(status.success(), "exit status {status}");
}
