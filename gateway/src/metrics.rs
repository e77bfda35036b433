//! The gateway's own metrics: requests by route, method and status, and
//! their duration (with the request's trace as exemplar), served at
//! `GET /metrics`; listed in `docs/metrics.md`.

use std::sync::Arc;

use vynil_runtime::metrics::{
    Buckets, Counter, EncodeLabelSet, Family, REQUEST_BUCKETS, Registry, TracedHistogram, trace_exemplar,
};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The route's template (`/api/v1/scans/{scan_id}`), never the raw path.
    pub route: String,
    pub method: String,
    pub status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
    pub method: String,
}

/// The `method` label: the methods HTTP defines, else `other` (anyone can
/// send a made-up method, and each would otherwise be a new label set
/// kept for the life of the process).
fn method_label(method: &http::Method) -> &'static str {
    match method.as_str() {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "OPTIONS" => "OPTIONS",
        "CONNECT" => "CONNECT",
        "TRACE" => "TRACE",
        _ => "other",
    }
}

#[derive(Debug, Clone)]
pub struct GatewayMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: Family<RouteLabels, TracedHistogram, Buckets>,
}

impl GatewayMetrics {
    pub fn register() -> (Self, Arc<Registry>) {
        let mut registry = Registry::with_prefix("vynil_gateway");
        let metrics =
            Self { requests: Family::default(), duration: Family::new_with_constructor(REQUEST_BUCKETS) };
        registry.register("requests", "HTTP requests answered", metrics.requests.clone());
        registry.register(
            "request_duration_seconds",
            "Time to answer (to the first byte of a stream)",
            metrics.duration.clone(),
        );
        (metrics, Arc::new(registry))
    }

    pub fn observe(&self, route: &str, method: &http::Method, status: u16, seconds: f64) {
        let (route, method) = (route.to_string(), method_label(method).to_string());
        self.requests
            .get_or_create(&RequestLabels { route: route.clone(), method: method.clone(), status })
            .inc();
        self.duration.get_or_create(&RouteLabels { route, method }).observe(seconds, trace_exemplar(), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_up_methods_do_not_grow_the_metrics() {
        let (metrics, registry) = GatewayMetrics::register();
        for i in 0..30 {
            let method = http::Method::from_bytes(format!("MADEUP{i}").as_bytes()).unwrap();
            metrics.observe("unmatched", &method, 405, 0.001);
        }
        metrics.observe("/healthz", &http::Method::GET, 200, 0.001);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let counted: Vec<&str> =
            text.lines().filter(|l| l.starts_with("vynil_gateway_requests_total{")).collect();
        assert_eq!(counted.len(), 2, "one label set for every made-up method, one for GET:\n{text}");
        assert!(counted.iter().any(|l| l.contains("method=\"other\"") && l.ends_with(" 30")), "{text}");
    }
}
