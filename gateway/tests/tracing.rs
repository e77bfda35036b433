//! Traces across processes: gateway, scanner and catalog as separate
//! processes exporting to an in-process OTLP receiver (opentelemetry-proto's
//! tonic trace service, or its messages over HTTP). A scan started over HTTP
//! with a `traceparent` yields spans of gateway, scanner and registry
//! requests in that one trace with the right parents, each under its own
//! `service.name`, and a catalog span linked to the scan; without an
//! endpoint nothing connects to a collector (watched on OTLP's default ports
//! in a network namespace of the test's own, so a collector on the machine
//! neither fails nor fools it); with an unreachable one SIGTERM still exits 0.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
    trace_service_server::{TraceService, TraceServiceServer},
};
use vynil_gateway::auth::{Role, TokenBook};
use vynil_testkit::{
    JukeboxBuilder, PackageSpec, PackageType, Readiness, RegistryServer, ServiceProcess, free_port,
};

/// One span as received.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    trace: String,
    id: String,
    parent: String,
    name: String,
    /// `(trace, span)` of each link.
    links: Vec<(String, String)>,
    attributes: std::collections::BTreeMap<String, String>,
}

fn text(value: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    /// An OTLP/gRPC receiver on a free port, and its URL.
    async fn grpc() -> (Self, String) {
        let receiver = Receiver::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let serving = receiver.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(serving))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap()
        });
        (receiver, url)
    }

    /// An OTLP/HTTP receiver (protobuf bodies at `/v1/traces`) on a free port, and its URL.
    async fn http() -> (Self, String) {
        use prost::Message;
        let receiver = Receiver::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let serving = receiver.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let serving = serving.clone();
                async move {
                    let request = ExportTraceServiceRequest::decode(body).unwrap();
                    serving.0.lock().unwrap().push(request);
                    ExportTraceServiceResponse::default().encode_to_vec()
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (receiver, url)
    }

    fn spans(&self) -> Vec<Received> {
        let mut out = Vec::new();
        for request in self.0.lock().unwrap().iter() {
            for resource in &request.resource_spans {
                let service = resource
                    .resource
                    .as_ref()
                    .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                    .map(|a| text(&a.value))
                    .unwrap_or_default();
                for scope in &resource.scope_spans {
                    for span in &scope.spans {
                        out.push(Received {
                            service: service.clone(),
                            trace: hex::encode(&span.trace_id),
                            id: hex::encode(&span.span_id),
                            parent: hex::encode(&span.parent_span_id),
                            name: span.name.clone(),
                            links: span
                                .links
                                .iter()
                                .map(|l| (hex::encode(&l.trace_id), hex::encode(&l.span_id)))
                                .collect(),
                            attributes: span
                                .attributes
                                .iter()
                                .map(|a| (a.key.clone(), text(&a.value)))
                                .collect(),
                        });
                    }
                }
            }
        }
        out
    }
}

/// A binary of the workspace, built beside this crate's (cargo test --workspace builds it).
fn sibling(binary: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_vynil-gateway")).with_file_name(binary);
    assert!(
        path.is_file(),
        "{} is missing: cargo build -p {binary} (cargo test --workspace builds it)",
        path.display()
    );
    path
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
/// What the gateway presents and the scanner's privileged RPCs require.
const SERVICE_TOKEN: &str = "tracing-service-token";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// Starts a gateway in front of `scanner_endpoint` with `otel` in its
/// environment (on a port it binds and keeps), and its port.
async fn gateway(dir: &Path, scanner_endpoint: &str, otel: &[(&str, &str)]) -> (ServiceProcess, u16) {
    std::fs::write(dir.join("service-token"), SERVICE_TOKEN).unwrap();
    let (token, tokens) = (dir.join("service-token"), dir.join("tokens.yaml"));
    let args = [
        "--scanner-endpoint",
        scanner_endpoint,
        "--service-token-file",
        token.to_str().unwrap(),
        "--tokens-file",
        tokens.to_str().unwrap(),
    ];
    let binary = Path::new(env!("CARGO_BIN_EXE_vynil-gateway"));
    let gateway =
        ServiceProcess::launch(binary, &args, otel, Readiness::Http("/healthz".into())).await.unwrap();
    let port = gateway.endpoint().rsplit_once(':').unwrap().1.parse().unwrap();
    (gateway, port)
}

/// A JukeBox `box` listing `apps/web` of a fresh registry, and a token file.
async fn world() -> (RegistryServer, tempfile::TempDir) {
    let registry = RegistryServer::start().await.unwrap();
    registry
        .publisher()
        .publish("apps/web", &PackageSpec::new("apps", "web", PackageType::Tenant, "1.0.0"))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    JukeboxBuilder::new("box").list([format!("{}/apps/web", registry.host())]).write_to(dir.path()).unwrap();
    std::fs::write(
        dir.path().join("tokens.yaml"),
        format!("tokens:\n{}\n", TokenBook::line("ops", Role::Operator, "t-ops")),
    )
    .unwrap();
    (registry, dir)
}

/// Starts a scan of `box` through the gateway at `port`, as a caller in trace [`TRACE`].
async fn start_scan(port: u16) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = http
            .post(format!("http://127.0.0.1:{port}/api/v1/jukeboxes/box/scans"))
            .bearer_auth("t-ops")
            .header("traceparent", format!("00-{TRACE}-{CALLER_SPAN}-01"))
            .json(&serde_json::json!({}))
            .send()
            .await;
        if answer.is_ok_and(|a| a.status() == 202) {
            return;
        }
        assert!(Instant::now() < deadline, "the gateway never started a scan");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `done` holds of the spans received.
async fn until(receiver: &Receiver, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let spans = receiver.spans();
        if done(&spans) {
            return spans;
        }
        assert!(Instant::now() < deadline, "{what} never arrived: {spans:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_scan_started_over_http_is_one_trace_across_gateway_scanner_and_registry_linked_from_the_catalog() {
    let (receiver, collector) = Receiver::grpc().await;
    let (registry, dir) = world().await;
    let redis = vynil_testkit::RedisServer::start().await.unwrap();
    let otel = [("OTEL_EXPORTER_OTLP_ENDPOINT", collector.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "200")];
    let jukeboxes = dir.path().to_str().unwrap();
    let redis_url = redis.url();
    let shared = ["--jukebox-dir", jukeboxes, "--redis-url", &redis_url];
    // The service token the gateway presents and the scanner's Scan requires.
    let token = dir.path().join("service-token");
    std::fs::write(&token, SERVICE_TOKEN).unwrap();
    let token = token.display().to_string();
    let scanner = ServiceProcess::start_with_env(
        &sibling("vynil-scanner"),
        &[&shared[..], &["--insecure-registry", &registry.host(), "--service-token-file", &token]].concat(),
        &otel,
    )
    .await
    .unwrap();
    let catalog = ServiceProcess::start_with_env(&sibling("vynil-catalog"), &shared, &otel).await.unwrap();
    let (mut gateway, port) = gateway(dir.path(), &scanner.endpoint(), &otel).await;

    start_scan(port).await;
    // Causal: the spans of the test's own trace (a readiness probe's span,
    // or another scan's, must not satisfy it), each service's root span
    // last (a parent ends, so is exported, after its children), and the
    // catalog's ingest linked to that trace.
    let spans = until(&receiver, "the gateway's, scanner's, registry's and catalog's spans", |spans| {
        let of = |service: &str, name: &str| {
            spans.iter().any(|s| s.trace == TRACE && s.service == service && s.name.starts_with(name))
        };
        let linked = spans.iter().any(|s| {
            s.service == "vynil-catalog"
                && s.name == "catalog_ingest"
                && s.links.iter().any(|(t, _)| t == TRACE)
        });
        of("vynil-gateway", "http")
            && of("vynil-scanner", "grpc")
            && of("vynil-scanner", "scan")
            && of("vynil-scanner", "GET")
            && linked
    })
    .await;
    let one = |service: &str, name: &str| {
        spans
            .iter()
            .find(|s| s.trace == TRACE && s.service == service && s.name == name)
            .unwrap_or_else(|| panic!("no {name} span of {service} in trace {TRACE}: {spans:#?}"))
            .clone()
    };
    let http = one("vynil-gateway", "http");
    assert_eq!(http.parent, CALLER_SPAN, "the gateway's span is the caller's child");
    let gateway_spans: Vec<&str> =
        spans.iter().filter(|s| s.service == "vynil-gateway").map(|s| s.id.as_str()).collect();
    let start = one("vynil-scanner", "grpc");
    assert!(
        gateway_spans.contains(&start.parent.as_str()),
        "StartScan's parent is a gateway span: {start:?}"
    );
    let scan = one("vynil-scanner", "scan");
    assert_eq!(scan.parent, start.id, "the queued scan continues the StartScan call's trace");
    let requests: Vec<&Received> = spans
        .iter()
        .filter(|s| s.trace == TRACE && s.attributes.contains_key("http.request.method"))
        .collect();
    assert!(!requests.is_empty(), "no registry request span in the trace: {spans:#?}");
    let (host, registry_port) =
        registry.host().split_once(':').map(|(h, p)| (h.to_string(), p.to_string())).unwrap();
    for request in &requests {
        assert_eq!(request.service, "vynil-scanner");
        assert_eq!(request.attributes.get("server.address"), Some(&host), "{request:?}");
        assert_eq!(request.attributes.get("server.port"), Some(&registry_port), "{request:?}");
        assert!(request.attributes.contains_key("http.response.status_code"), "{request:?}");
        // Under the scan, whatever spans lie between.
        let mut at = request.parent.clone();
        while at != scan.id {
            at = spans
                .iter()
                .find(|s| s.id == at)
                .map(|s| s.parent.clone())
                .unwrap_or_else(|| panic!("{request:?} is not under the scan span {}", scan.id));
        }
    }
    assert!(requests.iter().any(|r| r.name == "GET list_tags"), "{requests:#?}");
    let scanner_spans: Vec<&str> =
        spans.iter().filter(|s| s.service == "vynil-scanner").map(|s| s.id.as_str()).collect();
    let ingest = spans
        .iter()
        .find(|s| {
            s.service == "vynil-catalog"
                && s.name == "catalog_ingest"
                && s.links.iter().any(|(t, _)| t == TRACE)
        })
        .unwrap_or_else(|| panic!("no linked catalog_ingest span: {spans:#?}"));
    assert_ne!(ingest.trace, TRACE, "the ingest follows a watch: its own trace, linked");
    let linked_span = ingest.links.iter().find(|(t, _)| t == TRACE).map(|(_, span)| span).unwrap();
    assert!(scanner_spans.contains(&linked_span.as_str()), "linked to a scanner span: {ingest:?}");

    assert!(gateway.terminate(Duration::from_secs(60)).await.unwrap().success());
    for mut service in [scanner, catalog] {
        assert!(service.terminate(Duration::from_secs(60)).await.unwrap().success());
    }
}

#[tokio::test]
async fn spans_go_over_http_protobuf_when_the_protocol_says_so() {
    let (receiver, collector) = Receiver::http().await;
    let (_registry, dir) = world().await;
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_BSP_SCHEDULE_DELAY", "200"),
    ];
    // No scanner: the gateway answers 503 naming it, in a span all the same.
    let closed = format!("http://127.0.0.1:{}", free_port().unwrap());
    let (mut gateway, port) = gateway(dir.path(), &closed, &otel).await;
    start_scan_once(port).await;
    let spans = until(&receiver, "the gateway's span over HTTP", |spans| {
        spans.iter().any(|s| s.trace == TRACE && s.service == "vynil-gateway" && s.name == "http")
    })
    .await;
    assert!(spans.iter().all(|s| s.service == "vynil-gateway"), "{spans:#?}");
    assert!(gateway.terminate(Duration::from_secs(60)).await.unwrap().success());
}

/// One scan request in trace [`TRACE`] once the gateway answers, whatever it answers.
async fn start_scan_once(port: u16) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while http
        .post(format!("http://127.0.0.1:{port}/api/v1/jukeboxes/box/scans"))
        .bearer_auth("t-ops")
        .header("traceparent", format!("00-{TRACE}-{CALLER_SPAN}-01"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the gateway never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether this process is the run of `test` in a network namespace of its
/// own (`unshare --net`, loopback up), where OTLP's default ports are free
/// whatever runs on the machine (a collector, another test). Called from
/// the outside, it runs `test` there, fails with its output if it failed,
/// and answers false.
fn in_own_network(test: &str) -> bool {
    const INSIDE: &str = "VYNIL_TEST_OWN_NETWORK";
    if std::env::var_os(INSIDE).is_some() {
        return true;
    }
    let output = Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(INSIDE, "1")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .output()
        .unwrap_or_else(|e| panic!("unshare is missing ({e}): apt-get install -y util-linux iproute2"));
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{test}, in a network namespace of its own:\n{stdout}\n{stderr}"
    );
    false
}

/// Connections accepted on the OTLP default ports (4317 gRPC, 4318 HTTP) of loopback.
async fn count_default_ports() -> Arc<std::sync::atomic::AtomicUsize> {
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for port in [4317, 4318] {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap_or_else(|e| {
            panic!("cannot listen on OTLP's default port {port} in this test's own network namespace: {e}")
        });
        let accepted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((_stream, _)) = listener.accept().await {
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
    }
    accepted
}

#[tokio::test]
async fn without_an_endpoint_no_otlp_connection_is_attempted() {
    if !in_own_network("without_an_endpoint_no_otlp_connection_is_attempted") {
        return;
    }
    let accepted = count_default_ports().await;
    let (_registry, dir) = world().await;
    let nowhere = format!("http://127.0.0.1:{}", free_port().unwrap());
    let quiet = [("OTEL_BSP_SCHEDULE_DELAY", "100"), ("OTEL_SERVICE_NAME", "quiet")];
    // No endpoint in its environment: `in_own_network` ran this process without one.
    let (mut silent, port) = gateway(dir.path(), &nowhere, &quiet).await;
    for _ in 0..5 {
        start_scan_once(port).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(silent.terminate(Duration::from_secs(60)).await.unwrap().success());
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 0, "an OTLP connection was attempted");

    // The same gateway told to export does connect there: the count can see it.
    let (mut exporting, port) =
        gateway(dir.path(), &nowhere, &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"), quiet[0]])
            .await;
    start_scan_once(port).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while accepted.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "a configured exporter never connected to 4317");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    exporting.kill();
}

/// A collector that accepts connections and never answers holds a flush
/// for as long as the exporter's own timeout (here an hour): the gateway
/// still exits 0 on SIGTERM, and it is its own flush bound that lets it go
/// (it says so), not the exporter giving up or finishing. No figure is
/// asserted: the wait below only guards against a hang.
#[tokio::test]
async fn with_a_collector_that_never_answers_sigterm_exits_zero_by_the_flush_bound() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let collector = format!("http://{}", silent.local_addr().unwrap());
    let otel =
        [("OTEL_EXPORTER_OTLP_ENDPOINT", collector.as_str()), ("OTEL_EXPORTER_OTLP_TIMEOUT", "3600000")];
    let binary = Path::new(env!("CARGO_BIN_EXE_vynil-gateway"));
    let mut gateway =
        ServiceProcess::launch(binary, &[], &otel, Readiness::Http("/healthz".into())).await.unwrap();
    let _ = reqwest::get(format!("{}/api/v1/jukeboxes", gateway.endpoint())).await;
    // A hang guard, not a figure: SIGTERM that waited on the exporter would wait an hour.
    let status = gateway.terminate(Duration::from_secs(120)).await;
    let said = gateway.log();
    let status = status.unwrap_or_else(|e| panic!("SIGTERM did not end the gateway: {e}"));
    assert!(status.success(), "{status:?}\n{said}");
    assert!(said.contains("spans not flushed within"), "the exit was not the flush bound's doing:\n{said}");
    drop(silent);
}
