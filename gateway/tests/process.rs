//! The `vynil-gateway` binary as a real process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{process::Command, time::Duration};

use nix::{sys::signal::Signal, unistd::Pid};

#[tokio::test]
async fn the_binary_serves_healthz_answers_501_elsewhere_and_exits_cleanly_on_sigterm() {
    let port = vynil_testkit::free_port().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vynil-gateway"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let mut healthy = false;
    for _ in 0..200 {
        if let Ok(r) = reqwest::get(format!("{base}/healthz")).await {
            healthy = r.status() == 200;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(healthy, "gateway did not answer /healthz");
    let api = reqwest::get(format!("{base}/api/v1/jukeboxes")).await.unwrap();
    assert_eq!(api.status(), 501);
    let body: serde_json::Value = api.json().await.unwrap();
    assert_eq!(body["code"], "NOT_IMPLEMENTED");

    nix::sys::signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "exit status {status}");
}
