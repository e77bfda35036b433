//! Traces across processes: the gateway and the scanner as separate
//! processes exporting to an in-process OTLP receiver (opentelemetry-proto's
//! tonic trace service). A scan started over HTTP with a `traceparent` yields
//! spans of both services in that one trace, each under its own
//! `service.name`; with an unreachable collector SIGTERM still exits 0.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
    trace_service_server::{TraceService, TraceServiceServer},
};
use vynil_gateway::auth::{Role, TokenBook};
use vynil_testkit::{JukeboxBuilder, PackageSpec, PackageType, RegistryServer, free_port};

/// A child process killed when the test ends, passed or not.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
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
    /// `(service.name, trace id hex, span name)` of every span received.
    fn spans(&self) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        for request in self.0.lock().unwrap().iter() {
            for resource in &request.resource_spans {
                let service = resource
                    .resource
                    .as_ref()
                    .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                    .and_then(|a| a.value.as_ref())
                    .map(|v| format!("{:?}", v.value))
                    .unwrap_or_default();
                for scope in &resource.scope_spans {
                    for span in &scope.spans {
                        out.push((service.clone(), hex::encode(&span.trace_id), span.name.clone()));
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

#[tokio::test]
async fn a_scan_started_over_http_is_one_trace_across_the_gateway_and_the_scanner() {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector = format!("http://{}", listener.local_addr().unwrap());
    let serving = receiver.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(serving))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap()
    });

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
    let (scanner_port, gateway_port) = (free_port().unwrap(), free_port().unwrap());
    let otel = [("OTEL_EXPORTER_OTLP_ENDPOINT", collector.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "200")];
    let scanner = Command::new(sibling("vynil-scanner"))
        .args(["--listen", &format!("127.0.0.1:{scanner_port}"), "--insecure-registry", &registry.host()])
        .arg("--jukebox-dir")
        .arg(dir.path())
        .envs(otel)
        .env_remove("OTEL_SERVICE_NAME")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut scanner = Killed(scanner);
    let gateway = Command::new(env!("CARGO_BIN_EXE_vynil-gateway"))
        .args(["--listen", &format!("127.0.0.1:{gateway_port}")])
        .args(["--scanner-endpoint", &format!("http://127.0.0.1:{scanner_port}")])
        .arg("--tokens-file")
        .arg(dir.path().join("tokens.yaml"))
        .envs(otel)
        .env_remove("OTEL_SERVICE_NAME")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut gateway = Killed(gateway);

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = http
            .post(format!("http://127.0.0.1:{gateway_port}/api/v1/jukeboxes/box/scans"))
            .bearer_auth("t-ops")
            .header("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01"))
            .json(&serde_json::json!({}))
            .send()
            .await;
        if answer.is_ok_and(|a| a.status() == 202) {
            break;
        }
        assert!(Instant::now() < deadline, "the gateway never started a scan");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let in_trace = loop {
        let spans: Vec<_> = receiver.spans().into_iter().filter(|(_, trace, _)| trace == trace_id).collect();
        let services: std::collections::BTreeSet<&str> = spans.iter().map(|(s, _, _)| s.as_str()).collect();
        if services.iter().any(|s| s.contains("vynil-gateway"))
            && services.iter().any(|s| s.contains("vynil-scanner"))
        {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "spans of both services never arrived in trace {trace_id}: {:?}",
            receiver.spans()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        in_trace.iter().any(|(s, _, name)| s.contains("vynil-gateway") && name == "http"),
        "{in_trace:?}"
    );
    assert!(
        in_trace.iter().any(|(s, _, name)| s.contains("vynil-scanner") && name == "grpc"),
        "{in_trace:?}"
    );

    for child in [&mut gateway.0, &mut scanner.0] {
        nix::sys::signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
        assert!(child.wait().unwrap().success());
    }
}

#[tokio::test]
async fn with_an_unreachable_collector_sigterm_still_exits_zero_in_bounded_time() {
    let port = free_port().unwrap();
    let nowhere = format!("http://127.0.0.1:{}", free_port().unwrap());
    let mut gateway = Command::new(env!("CARGO_BIN_EXE_vynil-gateway"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &nowhere)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while reqwest::get(format!("http://127.0.0.1:{port}/healthz")).await.is_err() {
        assert!(Instant::now() < deadline, "the gateway never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = reqwest::get(format!("http://127.0.0.1:{port}/api/v1/jukeboxes")).await;
    let stopped = Instant::now();
    nix::sys::signal::kill(Pid::from_raw(gateway.id() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::task::spawn_blocking(move || gateway.wait().unwrap()).await.unwrap();
    assert!(status.success(), "{status:?}");
    assert!(stopped.elapsed() < Duration::from_secs(15), "stopping took {:?}", stopped.elapsed());
}
