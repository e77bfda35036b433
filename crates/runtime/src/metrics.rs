//! Prometheus metrics: each service registers its own in a
//! `prometheus_client` registry, served at `GET /metrics` on its gRPC port.

pub use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// Buckets for durations from 10 ms to 5 min (as upstream's reconcile metrics).
pub fn duration_buckets() -> impl Iterator<Item = f64> {
    [0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 120.0, 300.0].into_iter()
}

/// The OpenMetrics text of `registry`, with its content type.
pub fn render(registry: &Registry) -> impl axum::response::IntoResponse + use<> {
    let mut body = String::new();
    let status = match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => http::StatusCode::OK,
        Err(_) => http::StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, [("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
}
