//! The front door as an attacker tries it (issue "Credentials that stay
//! where they belong" items 5 and 6): bodies are read only once their
//! sender is known and under their route's cap, connections are capped,
//! and cleartext HTTP/2 no longer escapes the header timeout. A gateway in
//! this very process, so that its memory is the process's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vynil_gateway::Config;

const HOOK_SECRET: &str = "0123456789abcdef-hook";

async fn gateway(extra: &[&str]) -> (std::net::SocketAddr, vynil_runtime::Shutdown, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let hooks = dir.path().join("hooks.yaml");
    let text = format!(
        "hooks:\n  - name: registry\n    format: distribution\n    secret: {HOOK_SECRET}\n  - name: ci\n    format: generic\n    secret: {HOOK_SECRET}\n"
    );
    std::fs::write(&hooks, text).unwrap();
    let hooks = hooks.to_str().unwrap().to_string();
    let mut args = vec!["vynil-gateway", "--listen", "127.0.0.1:0", "--hooks-file", &hooks];
    if !extra.contains(&"--header-timeout-seconds") {
        args.extend(["--header-timeout-seconds", "1"]);
    }
    args.extend_from_slice(extra);
    let config = <Config as clap::Parser>::parse_from(args);
    let gateway = vynil_gateway::Gateway::bind(&config).await.unwrap();
    let addr = gateway.local_addr().unwrap();
    let stop = vynil_runtime::Shutdown::new();
    tokio::spawn(gateway.serve(stop.signaled()));
    (addr, stop, dir)
}

/// Everything the server sends until it closes, or `None` if it has not
/// closed within ten times the header timeout.
async fn until_closed(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    match read {
        Ok(Ok(_)) | Ok(Err(_)) => Some(String::from_utf8_lossy(&answer).into_owned()),
        Err(_) => None,
    }
}

/// The first answer's head and what followed it in the first read.
async fn answer(stream: &mut tokio::net::TcpStream) -> String {
    let mut buffer = vec![0u8; 8192];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer)).await;
    let read = read.expect("no answer within ten times the timeouts").unwrap_or(0);
    String::from_utf8_lossy(&buffer[..read]).into_owned()
}

fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Item 5's figure: 200 unauthenticated connections, each declaring a 1 MiB
/// body and sending all of it but its last byte. Before: the gateway
/// buffered every body before authenticating (about 1 MiB each, held until
/// the body timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_bodies_cost_the_gateway_no_memory() {
    const CONNECTIONS: usize = 200;
    const BODY: usize = 1024 * 1024;
    let (addr, stop, _dir) = gateway(&[]).await;
    let warm = reqwest::get(format!("http://{addr}/healthz")).await.unwrap();
    assert_eq!(warm.status(), 200);
    let before = resident_kib();
    let body: std::sync::Arc<Vec<u8>> = std::sync::Arc::new(vec![b' '; BODY - 1]);
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        let body = body.clone();
        clients.push(tokio::spawn(async move {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let head = format!(
                "POST /api/v1/purge/plans HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\nContent-Length: {BODY}\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            // Refused early, the gateway closes: the rest cannot be sent.
            let _ = tokio::time::timeout(Duration::from_secs(20), stream.write_all(&body)).await;
            stream
        }));
    }
    let mut streams = Vec::new();
    for client in clients {
        streams.push(client.await.unwrap());
    }
    let grown_mib = resident_kib().saturating_sub(before) as f64 / 1024.0;
    println!(
        "resident memory grown by {grown_mib:.1} MiB with {CONNECTIONS} connections declaring 1 MiB each"
    );
    assert!(grown_mib < 16.0, "the gateway grew by {grown_mib:.1} MiB for unauthenticated bodies");
    let answered = answer(&mut streams[0]).await;
    assert!(answered.starts_with("HTTP/1.1 401"), "{answered}");
    drop(streams);
    stop.trigger();
}

/// Item 6: a client sending the HTTP/2 preface and nothing more held its
/// connection for ever; HTTP/1.1 only, it is closed.
#[tokio::test]
async fn a_cleartext_http2_preface_holds_no_connection() {
    let (addr, stop, _dir) = gateway(&[]).await;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    assert!(until_closed(&mut stream).await.is_some(), "the HTTP/2 connection is still open");
    stop.trigger();
}

/// Item 5: a hook's event is admitted from its headers before its body is
/// read, under the hook's cap; a login's body stays small.
#[tokio::test]
async fn hooks_and_logins_read_no_body_before_their_headers_say_who_and_only_a_little() {
    let (addr, stop, _dir) = gateway(&["--body-timeout-seconds", "30"]).await;
    let post = |path: &str, headers: &str, length: usize| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n{headers}Content-Length: {length}\r\n\r\n"
        )
    };
    // A wrong secret: 401 at once, with no body sent at all (before: the
    // gateway waited for the body, then its timeout).
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let wrong = post("/api/v1/hooks/registry", "Authorization: Bearer not-the-secret\r\n", 1024);
    stream.write_all(wrong.as_bytes()).await.unwrap();
    let answered = answer(&mut stream).await;
    assert!(answered.starts_with("HTTP/1.1 401"), "{answered}");
    // The right secret, a body over the hook's 64 KiB: 413 naming the limit.
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let declared = format!("Authorization: Bearer {HOOK_SECRET}\r\n");
    stream.write_all(post("/api/v1/hooks/registry", &declared, 100 * 1024).as_bytes()).await.unwrap();
    let answered = answer(&mut stream).await;
    assert!(answered.starts_with("HTTP/1.1 413") && answered.contains("65536"), "{answered}");
    // A signed hook without its signature headers: 401 before its body.
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(post("/api/v1/hooks/ci", "", 1024).as_bytes()).await.unwrap();
    assert!(answer(&mut stream).await.starts_with("HTTP/1.1 401"));
    // A login over 8 KiB: 413 naming the limit.
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(post("/api/v1/session", "", 9 * 1024).as_bytes()).await.unwrap();
    let answered = answer(&mut stream).await;
    assert!(answered.starts_with("HTTP/1.1 413") && answered.contains("8192"), "{answered}");
    stop.trigger();
}

/// Item 5: connections past `--max-connections-per-peer` are closed before
/// anything is read; one freed makes room again.
#[tokio::test]
async fn a_peer_holds_no_more_connections_than_its_share() {
    let (addr, stop, _dir) =
        gateway(&["--max-connections-per-peer", "4", "--header-timeout-seconds", "30"]).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n").await.unwrap();
        assert!(answer(&mut stream).await.starts_with("HTTP/1.1 200"));
        held.push(stream);
    }
    let mut refused = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = refused.write_all(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n").await;
    assert_eq!(until_closed(&mut refused).await.as_deref(), Some(""), "closed, nothing answered");
    held.pop();
    let served = vynil_testkit::eventually("a freed connection's room", || async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n").await.ok()?;
        let answered = answer(&mut stream).await;
        answered.starts_with("HTTP/1.1 200").then_some(answered)
    })
    .await;
    assert!(served.contains("ok"), "{served}");
    stop.trigger();
}
