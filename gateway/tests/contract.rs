//! The gateway's contract, checked without any service running: the OpenAPI
//! document matches the route table and the committed copy, and every route
//! answers each role as the authorization matrix below says (authentication
//! and authorization happen before any service is asked).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use axum::http::Method;
use vynil_gateway::{
    Config,
    auth::{Role, TokenBook},
    routes::{Access, route_table},
};

/// The matrix: every route and the access it needs (a role at least; public;
/// a hook's own secret, which no token or session opens).
/// A route added to the gateway without its row here fails
/// `the_matrix_has_one_row_per_route`.
const MATRIX: &[(&str, &str, Access)] = &[
    ("POST", "/api/v1/session", Access::Public),
    ("DELETE", "/api/v1/session", Access::Public),
    ("GET", "/api/v1/whoami", Access::Role(Role::Viewer)),
    ("GET", "/api/v1/version", Access::Role(Role::Viewer)),
    ("GET", "/api/v1/jukeboxes", Access::Role(Role::Viewer)),
    ("GET", "/api/v1/jukeboxes/{jukebox}/catalog", Access::Role(Role::Viewer)),
    ("GET", "/api/v1/jukeboxes/{jukebox}/upgrade-path", Access::Role(Role::Viewer)),
    ("POST", "/api/v1/jukeboxes/{jukebox}/scans", Access::Role(Role::Operator)),
    ("GET", "/api/v1/jukeboxes/{jukebox}/scans/latest", Access::Role(Role::Viewer)),
    ("POST", "/api/v1/jukeboxes/{jukebox}/recalls", Access::Role(Role::Operator)),
    ("DELETE", "/api/v1/jukeboxes/{jukebox}/recalls/{tag}", Access::Role(Role::Operator)),
    ("POST", "/api/v1/jukeboxes/{jukebox}/exports", Access::Role(Role::Admin)),
    ("GET", "/api/v1/scans/{scan_id}", Access::Role(Role::Viewer)),
    ("GET", "/api/v1/scans/{scan_id}/events", Access::Role(Role::Viewer)),
    ("POST", "/api/v1/purge/plans", Access::Role(Role::Operator)),
    ("GET", "/api/v1/purge/plans/{plan_id}", Access::Role(Role::Viewer)),
    ("POST", "/api/v1/purge/plans/{plan_id}/execute", Access::Role(Role::Admin)),
    ("GET", "/api/v1/purge/plans/{plan_id}/report", Access::Role(Role::Viewer)),
    ("POST", "/api/v1/hooks/{hook}", Access::Hook),
    ("GET", "/api/v1/instances", Access::Role(Role::Viewer)),
    ("GET", "/api/v1/instances/{kind}/{namespace}/{name}/explain", Access::Role(Role::Operator)),
    (
        "POST",
        "/api/v1/instances/{kind}/{namespace}/{name}/allow-delete-without-package",
        Access::Role(Role::Admin),
    ),
    ("POST", "/api/v1/instances/{kind}/{namespace}/{name}/rollback", Access::Role(Role::Operator)),
    ("POST", "/api/v1/instances/{kind}/{namespace}/{name}/clear-quarantine", Access::Role(Role::Operator)),
    ("POST", "/api/v1/instances/{kind}/{namespace}/{name}/approve-upgrade", Access::Role(Role::Operator)),
];

fn table() -> BTreeSet<(String, String)> {
    route_table().into_iter().map(|r| (r.method.to_string(), r.path.to_string())).collect()
}

#[test]
fn the_matrix_has_one_row_per_route_with_the_same_access() {
    let rows: BTreeSet<(String, String)> =
        MATRIX.iter().map(|(m, p, _)| (m.to_string(), p.to_string())).collect();
    assert_eq!(rows, table(), "a route without its matrix row, or a row without its route");
    for route in route_table() {
        let row = MATRIX.iter().find(|(m, p, _)| *m == route.method.as_str() && *p == route.path).unwrap();
        assert_eq!(route.access, row.2, "{} {}", route.method, route.path);
    }
}

fn document() -> oas3::OpenApiV3Spec {
    oas3::from_json(vynil_gateway::openapi::document()).expect("the served document parses as OpenAPI")
}

#[test]
fn the_openapi_document_lists_exactly_the_routes_of_the_route_table() {
    let spec = document();
    assert!(spec.openapi.starts_with("3.1"), "{}", spec.openapi);
    let mut documented = BTreeSet::new();
    for (path, item) in spec.paths.unwrap_or_default() {
        for (method, _) in item.methods() {
            documented.insert((method.to_string(), path.clone()));
        }
    }
    assert_eq!(documented, table());
}

#[test]
fn the_committed_openapi_document_is_the_one_the_code_serves() {
    let committed_path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
    let served = vynil_gateway::openapi::document();
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(committed_path, &served).unwrap();
    }
    let committed = std::fs::read_to_string(committed_path).unwrap_or_default();
    assert!(
        committed == served,
        "gateway/openapi.json differs from the code's document: run `UPDATE_OPENAPI=1 cargo test -p vynil-gateway --test contract` and commit it"
    );
}

/// A concrete URL for a route template (valid names, so that only access decides).
fn concrete(path: &str) -> String {
    path.replace("{jukebox}", "box")
        .replace("{scan_id}", "s1")
        .replace("{plan_id}", "p1")
        .replace("{kind}", "tenant")
        .replace("{namespace}", "apps")
        .replace("{name}", "web")
        .replace("{hook}", "registry")
}

#[tokio::test]
async fn every_route_answers_each_role_as_the_matrix_says_before_asking_any_service() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> =
        Role::ALL.iter().map(|r| TokenBook::line(r.as_str(), *r, &format!("token-{}", r.as_str()))).collect();
    std::fs::write(dir.path().join("tokens.yaml"), format!("tokens:\n{}\n", lines.join("\n"))).unwrap();
    // Every service "configured" at a listener that counts connections and
    // drops them: a request that passes authorization answers 503 (or 400
    // for an empty body), never 401/403; one that does not connects nowhere.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nowhere = format!("http://{}", listener.local_addr().unwrap());
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(socket);
        }
    });
    let config = <Config as clap::Parser>::parse_from([
        "vynil-gateway",
        "--listen",
        "127.0.0.1:0",
        "--tokens-file",
        dir.path().join("tokens.yaml").to_str().unwrap(),
        "--catalog-endpoint",
        &nowhere,
        "--scanner-endpoint",
        &nowhere,
        "--purger-endpoint",
        &nowhere,
        "--lifecycle-endpoint",
        &nowhere,
    ]);
    let gateway = vynil_gateway::Gateway::bind(&config).await.unwrap();
    let base = format!("http://{}", gateway.local_addr().unwrap());
    let stop = vynil_runtime::Shutdown::new();
    let serving = tokio::spawn(gateway.serve(stop.signaled()));
    let http = reqwest::Client::new();
    for (method, path, _) in MATRIX.iter().filter(|row| row.2 != Access::Public) {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        for bad in [None, Some("Bearer not-a-token"), Some("Basic YTpi")] {
            let mut request = http.request(method.clone(), format!("{base}{}", concrete(path)));
            if let Some(bad) = bad {
                request = request.header("authorization", bad);
            }
            let answer = request.json(&serde_json::json!({})).send().await.unwrap();
            assert_eq!(answer.status(), 401, "{method} {path} with {bad:?}");
        }
    }
    assert_eq!(
        connections.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "an unauthenticated request reached a service"
    );
    let down = http.get(format!("{base}/api/v1/jukeboxes")).bearer_auth("token-viewer").send().await.unwrap();
    let status = down.status();
    let body: serde_json::Value = down.json().await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body["message"].as_str().unwrap().starts_with("catalog is unavailable"), "{body}");
    for (method, path, needed) in MATRIX {
        for role in [None, Some(Role::Viewer), Some(Role::Operator), Some(Role::Admin)] {
            let method = Method::from_bytes(method.as_bytes()).unwrap();
            let mut request = http.request(method.clone(), format!("{base}{}", concrete(path)));
            if let Some(role) = role {
                request = request.bearer_auth(format!("token-{}", role.as_str()));
            }
            if method == Method::POST {
                request = request.json(&serde_json::json!({}));
            }
            let status = request.send().await.unwrap().status().as_u16();
            let expected = match (needed, role) {
                (Access::Public, _) => None,
                // No token opens a hook: unknown hook or no secret, 401.
                (Access::Hook, _) | (Access::Role(_), None) => Some(401),
                (Access::Role(needed), Some(role)) if role < *needed => Some(403),
                _ => None,
            };
            match expected {
                Some(code) => assert_eq!(status, code, "{method} {path} as {role:?}"),
                None => assert!(
                    ![401, 403, 404, 405, 500].contains(&status),
                    "{method} {path} as {role:?} answered {status}: access should have been granted"
                ),
            }
        }
    }
    // A method a path does not declare: 405 with `Allow` as the matrix says
    // (HEAD with GET, OPTIONS always), before any authentication and without
    // asking a service; OPTIONS answers 204 with the same `Allow`.
    let before = connections.load(std::sync::atomic::Ordering::SeqCst);
    let paths: BTreeSet<&str> = MATRIX.iter().map(|(_, p, _)| *p).collect();
    for path in paths {
        let mut expected: BTreeSet<String> =
            MATRIX.iter().filter(|(_, p, _)| *p == path).map(|(m, _, _)| m.to_string()).collect();
        if expected.contains("GET") {
            expected.insert("HEAD".into());
        }
        expected.insert("OPTIONS".into());
        let allow = |answer: &reqwest::Response| -> BTreeSet<String> {
            let header = answer.headers().get("allow").and_then(|v| v.to_str().ok()).unwrap_or_default();
            header.split(',').map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect()
        };
        for method in ["TRACE", "PUT", "PATCH", "DELETE", "GET", "POST"] {
            if expected.contains(method) {
                continue;
            }
            let method = Method::from_bytes(method.as_bytes()).unwrap();
            let answer =
                http.request(method.clone(), format!("{base}{}", concrete(path))).send().await.unwrap();
            assert_eq!(answer.status(), 405, "{method} {path}");
            assert_eq!(allow(&answer), expected, "{method} {path}");
            let body: serde_json::Value = answer.json().await.unwrap();
            assert_eq!(body["code"], "METHOD_NOT_ALLOWED", "{body}");
        }
        let options =
            http.request(Method::OPTIONS, format!("{base}{}", concrete(path))).send().await.unwrap();
        assert_eq!(options.status(), 204, "OPTIONS {path}");
        assert_eq!(allow(&options), expected, "OPTIONS {path}");
    }
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), before, "a 405 asked a service");
    // HEAD where GET is declared: answered as GET, without a body.
    let head = http.head(format!("{base}/api/v1/whoami")).bearer_auth("token-viewer").send().await.unwrap();
    assert_eq!(head.status(), 200);
    let unauthenticated = http.head(format!("{base}/api/v1/whoami")).send().await.unwrap();
    assert_eq!(unauthenticated.status(), 401, "HEAD is authorised as GET is");
    stop.trigger();
    serving.await.unwrap().unwrap();
}

/// A stand-in catalog: answers every gRPC call "not found" and records the
/// metadata it was sent.
async fn recording_catalog() -> (String, std::sync::Arc<std::sync::Mutex<Vec<axum::http::HeaderMap>>>) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
        let record = record.clone();
        async move {
            record.lock().unwrap().push(headers);
            // A trailers-only gRPC answer: NOT_FOUND.
            ([("content-type", "application/grpc"), ("grpc-status", "5"), ("grpc-message", "recorded")], "")
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

#[tokio::test]
async fn a_call_carries_the_service_token_the_principal_the_request_id_and_the_trace_context() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tokens.yaml"),
        format!("tokens:\n{}\n", TokenBook::line("ann", Role::Viewer, "t-ann")),
    )
    .unwrap();
    std::fs::write(dir.path().join("service-token"), "the-service-token\n").unwrap();
    let (catalog, seen) = recording_catalog().await;
    let config = <Config as clap::Parser>::parse_from([
        "vynil-gateway",
        "--listen",
        "127.0.0.1:0",
        "--tokens-file",
        dir.path().join("tokens.yaml").to_str().unwrap(),
        "--service-token-file",
        dir.path().join("service-token").to_str().unwrap(),
        "--catalog-endpoint",
        &catalog,
    ]);
    let gateway = vynil_gateway::Gateway::bind(&config).await.unwrap();
    let base = format!("http://{}", gateway.local_addr().unwrap());
    let stop = vynil_runtime::Shutdown::new();
    tokio::spawn(gateway.serve(stop.signaled()));
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let answer = reqwest::Client::new()
        .get(format!("{base}/api/v1/jukeboxes/box/catalog"))
        .bearer_auth("t-ann")
        .header("traceparent", traceparent)
        .header("x-request-id", "req-42")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 404, "the catalog's NOT_FOUND");
    assert_eq!(answer.headers()["x-request-id"], "req-42");
    let body: serde_json::Value = answer.json().await.unwrap();
    assert_eq!((body["message"].as_str(), body["request_id"].as_str()), (Some("recorded"), Some("req-42")));
    let headers = seen.lock().unwrap()[0].clone();
    assert_eq!(headers["authorization"], "Bearer the-service-token");
    assert_eq!(headers["x-vynil-caller"], "ann");
    assert_eq!(headers["x-request-id"], "req-42");
    assert_eq!(headers["traceparent"], traceparent);
    // The caller's own token never travels further than the gateway.
    assert!(headers.values().all(|v| !v.to_str().unwrap_or_default().contains("t-ann")));
    stop.trigger();
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_with_413_naming_the_flag_before_any_service() {
    let dir = tempfile::tempdir().unwrap();
    let line = TokenBook::line("ops", Role::Operator, "token-ops");
    std::fs::write(dir.path().join("tokens.yaml"), format!("tokens:\n{line}\n")).unwrap();
    std::fs::write(
        dir.path().join("hooks.yaml"),
        "hooks:\n  - name: ci\n    format: generic\n    secret: a-secret-of-16-chars\n",
    )
    .unwrap();
    let nowhere = format!("http://127.0.0.1:{}", vynil_testkit::free_port().unwrap());
    let config = <Config as clap::Parser>::parse_from([
        "vynil-gateway",
        "--listen",
        "127.0.0.1:0",
        "--tokens-file",
        dir.path().join("tokens.yaml").to_str().unwrap(),
        "--hooks-file",
        dir.path().join("hooks.yaml").to_str().unwrap(),
        "--scanner-endpoint",
        &nowhere,
        "--max-body-bytes",
        "1024",
    ]);
    let gateway = vynil_gateway::Gateway::bind(&config).await.unwrap();
    let base = format!("http://{}", gateway.local_addr().unwrap());
    let stop = vynil_runtime::Shutdown::new();
    let serving = tokio::spawn(gateway.serve(stop.signaled()));
    let http = reqwest::Client::new();
    let big = serde_json::json!({"filter": "a".repeat(2048)});
    // A hook's event is admitted from its headers first (its signature is
    // checked once the body is read): here, headers that say it is signed.
    for path in ["/api/v1/jukeboxes/box/scans", "/api/v1/hooks/ci"] {
        let answer = http
            .post(format!("{base}{path}"))
            .bearer_auth("token-ops")
            .header("x-vynil-timestamp", "0")
            .header("x-vynil-signature", "sha256=00")
            .json(&big)
            .send()
            .await
            .unwrap();
        let status = answer.status();
        let body: serde_json::Value = answer.json().await.unwrap();
        assert_eq!((status.as_u16(), body["code"].as_str()), (413, Some("TOO_LARGE")), "{path}: {body}");
        assert!(body["message"].as_str().unwrap().contains("over 1024 bytes"), "{body}");
    }
    // Under the limit, the same route goes on to the (absent) scanner.
    let small = http
        .post(format!("{base}/api/v1/jukeboxes/box/scans"))
        .bearer_auth("token-ops")
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(small.status(), 503);
    stop.trigger();
    serving.await.unwrap().unwrap();
}
