//! Logging and tracing set-up. `RUST_LOG` selects what is printed (default
//! `info`); `--log-format json` (`LOG_FORMAT`) prints one JSON object per
//! line for log collectors. Text lines are coloured only on a terminal (and
//! never with `NO_COLOR` set): a log written to a file or a pipe holds no
//! escape sequences. Lines are written by a thread of their own
//! (`tracing-appender`, never dropping a line: a full queue waits), through
//! a buffer flushed each time the queue is empty: a request does not wait
//! on a `write` to stdout, and a burst is written in few of them.
//!
//! Spans are exported over OTLP only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set: no exporter starts
//! otherwise. gRPC by default, HTTP/protobuf with
//! `OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf`. The standard `OTEL_*` variables apply (`OTEL_SERVICE_NAME`
//! overrides the service's own name, `OTEL_RESOURCE_ATTRIBUTES` adds to the
//! resource, `OTEL_TRACES_SAMPLER` chooses the sampler); the resource carries
//! `service.name`, `service.version` and `service.instance.id` (the pod,
//! else host and process). Spans go through a batch processor that never
//! blocks a request; [`Telemetry`]'s drop flushes them, bounded in time.
//! W3C trace context crosses services with [`inject`] and [`extract`].

use std::{io::IsTerminal, time::Duration};

use opentelemetry::{KeyValue, propagation::TextMapPropagator, trace::TracerProvider as _};
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{EnvFilter, Layer, fmt, layer::SubscriberExt, util::SubscriberInitExt};

/// How log lines are printed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The logging flags every binary takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogConfig {
    /// `text`, or `json` for log collectors.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Flushes exported spans when dropped (5 s at most).
#[derive(Debug, Default)]
#[must_use = "spans are flushed when this is dropped: keep it for the life of the process"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    /// Writes the log lines still queued when dropped.
    _lines: Option<tracing_appender::non_blocking::WorkerGuard>,
}

const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

impl Drop for Telemetry {
    fn drop(&mut self) {
        let Some(provider) = self.provider.take() else { return };
        // Bounded twice: the SDK's shutdown is given the bound, and it runs
        // on a thread of its own that is not waited for past the bound (and
        // a moment), so an unreachable collector never holds the process.
        let (done, wait) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(provider.shutdown_with_timeout(FLUSH_TIMEOUT));
        });
        match wait.recv_timeout(FLUSH_TIMEOUT + Duration::from_secs(1)) {
            Ok(Ok(())) => {}
            Ok(Err(error)) => eprintln!("spans not flushed within {FLUSH_TIMEOUT:?}: {error}"),
            Err(_) => {
                eprintln!("spans not flushed within {FLUSH_TIMEOUT:?}: the OTLP collector did not answer")
            }
        }
    }
}

fn endpoint_configured() -> bool {
    ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|value| !value.trim().is_empty()))
}

fn provider(service: &str) -> Option<SdkTracerProvider> {
    if !endpoint_configured() {
        return None;
    }
    let protocol = ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|p| !p.trim().is_empty()))
        .unwrap_or_else(|| "grpc".to_string());
    let built = match protocol.trim() {
        "grpc" => opentelemetry_otlp::SpanExporter::builder().with_tonic().build(),
        // The blocking HTTP client is built (and later dropped) off the async
        // runtime, as reqwest's blocking client requires.
        "http/protobuf" => std::thread::spawn(|| {
            use opentelemetry_otlp::WithExportConfig;
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .build()
        })
        .join()
        .unwrap_or_else(|_| Err(opentelemetry_otlp::ExporterBuildError::InternalFailure("panicked".into()))),
        other => {
            eprintln!(
                "OTEL_EXPORTER_OTLP_PROTOCOL={other:?} is not supported (use grpc or http/protobuf): spans are not exported"
            );
            return None;
        }
    };
    let exporter = match built {
        Ok(exporter) => exporter,
        Err(error) => {
            eprintln!("OTLP export is configured but cannot start ({error}): spans are not exported");
            return None;
        }
    };
    let name = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("vynil-{service}"));
    let instance = std::env::var("POD_NAME").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
        format!("{host}-{}", std::process::id())
    });
    let resource = Resource::builder()
        .with_service_name(name)
        .with_attributes([
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("service.instance.id", instance),
        ])
        .build();
    Some(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

/// Whether text lines are coloured: on a terminal (the fmt layer writes to
/// stdout), unless `NO_COLOR` is set (no-color.org).
fn colours(terminal: bool) -> bool {
    terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Installs the global subscriber once (later calls install nothing), with
/// OTLP export when configured; keep the returned guard until exit.
pub fn init_tracing(service: &'static str, config: &LogConfig) -> Telemetry {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let provider = provider(service);
    let otel =
        provider.as_ref().map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("vynil")).boxed());
    let ansi = colours(std::io::stdout().is_terminal());
    let (lines, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .finish(std::io::BufWriter::new(std::io::stdout()));
    let fmt = match config.log_format {
        LogFormat::Json => fmt::layer().json().with_writer(lines).boxed(),
        LogFormat::Text => fmt::layer().with_ansi(ansi).with_writer(lines).boxed(),
    };
    let result = tracing_subscriber::registry().with(filter).with(fmt).with(otel).try_init();
    if result.is_err() {
        return Telemetry::default();
    }
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    tracing::debug!(service, exporting = provider.is_some(), "tracing initialised");
    Telemetry { provider, _lines: Some(guard) }
}

struct Headers<'a>(&'a http::HeaderMap);

impl opentelemetry::propagation::Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct HeadersMut<'a>(&'a mut http::HeaderMap);

impl opentelemetry::propagation::Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) =
            (http::HeaderName::from_bytes(key.as_bytes()), http::HeaderValue::from_str(&value))
        {
            self.0.insert(name, value);
        }
    }
}

/// Makes `span` a child of the W3C trace context in `headers` (HTTP or gRPC
/// metadata), when there is one.
pub fn extract(span: &tracing::Span, headers: &http::HeaderMap) {
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    let _ = span.set_parent(parent);
}

fn context_of(traceparent: &str) -> Option<opentelemetry::Context> {
    use opentelemetry::trace::TraceContextExt;
    let mut headers = http::HeaderMap::new();
    headers.insert("traceparent", http::HeaderValue::from_str(traceparent).ok()?);
    let context = TraceContextPropagator::new().extract(&Headers(&headers));
    context.span().span_context().is_valid().then_some(context)
}

/// The current span's W3C `traceparent`, to carry where no header goes (a
/// queued request, a status written for a watcher); `None` when spans are
/// not exported.
pub fn traceparent() -> Option<String> {
    let mut headers = http::HeaderMap::new();
    if !inject(&mut headers) {
        return None;
    }
    headers.get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// Makes `span` a child of `traceparent` (work done later for a request
/// that carried it); nothing when it does not parse.
pub fn follow(span: &tracing::Span, traceparent: &str) {
    if let Some(parent) = context_of(traceparent) {
        let _ = span.set_parent(parent);
    }
}

/// Links `span` to `traceparent`: work caused by another trace's work
/// without being called by it (a watch seeing a status another service
/// wrote). Nothing when it does not parse.
pub fn link(span: &tracing::Span, traceparent: &str) {
    use opentelemetry::trace::TraceContextExt;
    if let Some(context) = context_of(traceparent) {
        span.add_link(context.span().span_context().clone());
    }
}

/// The client half of W3C propagation over gRPC: every call made through
/// a [`TracedChannel`] carries the calling span's context (the server half is
/// [`crate::GrpcServer`]'s per-call span).
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceContext;

impl tonic::service::Interceptor for TraceContext {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let mut headers = http::HeaderMap::new();
        if inject(&mut headers) {
            for (name, value) in &headers {
                if let (Ok(name), Ok(value)) = (
                    tonic::metadata::MetadataKey::from_bytes(name.as_str().as_bytes()),
                    tonic::metadata::MetadataValue::try_from(value.as_bytes()),
                ) {
                    request.metadata_mut().insert(name, value);
                }
            }
        }
        Ok(request)
    }
}

/// A channel whose calls carry the caller's trace context.
pub type TracedChannel =
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, TraceContext>;

/// `channel`, propagating trace context on every call.
pub fn traced(channel: tonic::transport::Channel) -> TracedChannel {
    tonic::service::interceptor::InterceptedService::new(channel, TraceContext)
}

/// Writes the current span's W3C trace context into `headers`; `false` when
/// there is none to write (tracing without OpenTelemetry).
pub fn inject(headers: &mut http::HeaderMap) -> bool {
    use opentelemetry::trace::TraceContextExt;
    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        return false;
    }
    TraceContextPropagator::new().inject_context(&context, &mut HeadersMut(headers));
    true
}
