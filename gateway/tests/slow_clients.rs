//! A client that sends its headers or its body slowly holds neither a
//! connection nor a handler for long (#42 item 8): the gateway closes a
//! connection whose headers have not arrived within `--header-timeout-seconds`
//! and answers 408 `BODY_TIMEOUT` to a body not arrived within
//! `--body-timeout-seconds`. Ordering checks, not timings: the bound waited for
//! is ten times the configured timeout, and without the fix nothing ever comes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vynil_gateway::Config;

const HOOK_SECRET: &str = "0123456789abcdef-hook";

async fn gateway() -> (std::net::SocketAddr, vynil_runtime::Shutdown) {
    // A declared hook: a body is read only once its sender is known.
    let hooks = std::env::temp_dir().join(format!("vynil-slow-clients-{}.yaml", std::process::id()));
    let text = format!("hooks:\n  - name: registry\n    format: distribution\n    secret: {HOOK_SECRET}\n");
    std::fs::write(&hooks, text).unwrap();
    let config = <Config as clap::Parser>::parse_from([
        "vynil-gateway",
        "--listen",
        "127.0.0.1:0",
        "--header-timeout-seconds",
        "1",
        "--body-timeout-seconds",
        "1",
        "--hooks-file",
        hooks.to_str().unwrap(),
    ]);
    let gateway = vynil_gateway::Gateway::bind(&config).await.unwrap();
    let addr = gateway.local_addr().unwrap();
    let stop = vynil_runtime::Shutdown::new();
    tokio::spawn(gateway.serve(stop.signaled()));
    (addr, stop)
}

/// Everything the server sends until it closes, or `None` if it has not
/// closed within the bound.
async fn until_closed(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    match read {
        Ok(Ok(_)) | Ok(Err(_)) => Some(String::from_utf8_lossy(&answer).into_owned()),
        Err(_) => None,
    }
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_loses_its_connection() {
    let (addr, stop) = gateway().await;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Slow: ").await.unwrap();
    let answer = until_closed(&mut stream).await;
    assert!(answer.is_some(), "the connection is still open long after the header timeout");
    // A client that sends its headers at once is served on the same gateway.
    let ok = reqwest::get(format!("http://{addr}/healthz")).await.unwrap();
    assert_eq!(ok.status(), 200);
    stop.trigger();
}

#[tokio::test]
async fn a_client_that_trickles_its_body_is_answered_408_and_holds_no_handler() {
    let (addr, stop) = gateway().await;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /api/v1/hooks/registry HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n\
         Authorization: Bearer {HOOK_SECRET}\r\nContent-Length: 100\r\n\r\n{{\"events\":"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut answer)).await;
    let read = read.expect("no answer long after the body timeout").unwrap();
    let text = String::from_utf8_lossy(&answer[..read]).into_owned();
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("BODY_TIMEOUT"), "{text}");
    stop.trigger();
}
