//! Prometheus metrics: each service registers its own in a
//! `prometheus_client` registry, served at `GET /metrics` on its gRPC port
//! beside the gRPC server's own (`grpc_server_handled_total`,
//! `grpc_server_handling_seconds`, go-grpc-prometheus' names). Every name and
//! label is listed in `docs/metrics.md`; labels are bounded (codes, kinds,
//! routes, never message text).

use std::time::Instant;

use prometheus_client::metrics::{exemplar::HistogramWithExemplars, family::MetricConstructor};
pub use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// Buckets for durations from 10 ms to 5 min (as upstream's reconcile metrics).
pub fn duration_buckets() -> impl Iterator<Item = f64> {
    [0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 120.0, 300.0].into_iter()
}

/// Creates `family`'s series for each of a fixed set of `labels`, at 0: a
/// `rate()` over a series that appears only with its first event misses
/// that event.
pub fn preset<S, M, C>(family: &Family<S, M, C>, labels: impl IntoIterator<Item = S>)
where
    S: Clone + std::hash::Hash + Eq,
    C: MetricConstructor<M>,
{
    for label in labels {
        let _ = family.get_or_create(&label);
    }
}

/// The exemplar of an observation: the trace it was made in.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceExemplar {
    pub trace_id: String,
}

/// The current span's trace, when spans are exported.
pub fn trace_exemplar() -> Option<TraceExemplar> {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let context = tracing::Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    span_context.is_valid().then(|| TraceExemplar { trace_id: span_context.trace_id().to_string() })
}

/// A histogram whose observations carry their trace as exemplar.
pub type TracedHistogram = HistogramWithExemplars<TraceExemplar>;

/// Builds [`TracedHistogram`]s of fixed buckets in a [`Family`].
#[derive(Debug, Clone, Copy)]
pub struct Buckets(pub &'static [f64]);

impl MetricConstructor<TracedHistogram> for Buckets {
    fn new_metric(&self) -> TracedHistogram {
        HistogramWithExemplars::new(self.0.iter().copied())
    }
}

/// 1 ms to 60 s: API calls, and the start of streams at the top.
pub const REQUEST_BUCKETS: Buckets = Buckets(&[0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0]);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Handled {
    grpc_service: String,
    grpc_method: String,
    grpc_code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Handling {
    grpc_service: String,
    grpc_method: String,
}

/// The gRPC server's metrics. Methods are labelled only for the services
/// served (anything else is `other`), so a client cannot grow the label set.
#[derive(Debug, Clone)]
pub(crate) struct GrpcMetrics {
    handled: Family<Handled, Counter>,
    handling: Family<Handling, TracedHistogram, Buckets>,
    services: std::sync::Arc<Vec<&'static str>>,
}

impl GrpcMetrics {
    pub(crate) fn new(services: Vec<&'static str>) -> (Self, Registry) {
        let metrics = Self {
            handled: Family::default(),
            handling: Family::new_with_constructor(REQUEST_BUCKETS),
            services: std::sync::Arc::new(services),
        };
        let mut registry = Registry::with_prefix("grpc_server");
        registry.register("handled", "RPCs answered, by service, method and code", metrics.handled.clone());
        registry.register(
            "handling_seconds",
            "Time to answer an RPC (to the first message of a stream)",
            metrics.handling.clone(),
        );
        (metrics, registry)
    }

    /// Records one call of `path` (`/package.Service/Method`) answered `code`.
    fn observe(&self, path: &str, code: tonic::Code, started: Instant) {
        let (service, method) = path.trim_start_matches('/').split_once('/').unwrap_or(("", ""));
        let known = self.services.contains(&service) && code != tonic::Code::Unimplemented;
        let (service, method) = if known { (service, method) } else { ("other", "other") };
        let (grpc_service, grpc_method) = (service.to_string(), method.to_string());
        self.handled
            .get_or_create(&Handled {
                grpc_service: grpc_service.clone(),
                grpc_method: grpc_method.clone(),
                grpc_code: code_name(code),
            })
            .inc();
        self.handling.get_or_create(&Handling { grpc_service, grpc_method }).observe(
            started.elapsed().as_secs_f64(),
            trace_exemplar(),
            None,
        );
    }

    /// An axum middleware recording every call it passes.
    pub(crate) async fn middleware(
        axum::extract::State(metrics): axum::extract::State<GrpcMetrics>,
        request: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        let started = Instant::now();
        let path = request.uri().path().to_string();
        let response = next.run(request).await;
        if path == "/metrics" {
            return response;
        }
        // An error answer is trailers-only: its status is in the headers. A
        // call whose headers carry none went on to answer (OK so far).
        let code = response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i32>().ok())
            .map_or(tonic::Code::Ok, tonic::Code::from);
        metrics.observe(&path, code, started);
        response
    }
}

/// gRPC's code names, as gRPC's own libraries label them.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// The OpenMetrics text of `registries` (one exposition), with its content type.
pub fn render(registries: &[&Registry]) -> impl axum::response::IntoResponse + use<> {
    use prometheus_client::encoding::text::{encode_eof, encode_registry};
    let mut body = String::new();
    let encoded = registries
        .iter()
        .try_for_each(|r| encode_registry(&mut body, r))
        .and_then(|()| encode_eof(&mut body));
    let status = match encoded {
        Ok(()) => http::StatusCode::OK,
        Err(_) => http::StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, [("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
}
