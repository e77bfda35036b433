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

    pub fn observe(&self, route: &str, method: &str, status: u16, seconds: f64) {
        let (route, method) = (route.to_string(), method.to_string());
        self.requests
            .get_or_create(&RequestLabels { route: route.clone(), method: method.clone(), status })
            .inc();
        self.duration.get_or_create(&RouteLabels { route, method }).observe(seconds, trace_exemplar(), None);
    }
}
