//! The scanner's Prometheus metrics (`GET /metrics` on its gRPC port).

use std::sync::Arc;

use vynil_runtime::metrics::{Counter, EncodeLabelSet, Family, Gauge, Histogram, Registry, duration_buckets};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Cause {
    pub cause: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Jukebox {
    pub jukebox: String,
}

#[derive(Debug, Clone)]
pub struct ScannerMetrics {
    /// Unix time each JukeBox's last scan ended, whatever its outcome: an
    /// unchanged scan writes no status, so this is where scans are seen.
    pub last_scan: Family<Jukebox, Gauge>,
    pub scans: Family<Outcome, Counter>,
    pub duration: Histogram,
    pub tags_seen: Counter,
    pub manifests_read: Counter,
    pub repository_failures: Family<Cause, Counter>,
}

impl ScannerMetrics {
    /// Registers the scanner's metrics and the registry client's request counts.
    pub fn register(requests: &vynil_registry::RequestCounters) -> (Self, Arc<Registry>) {
        let mut exported = Registry::with_prefix("vynil_scanner");
        let metrics = Self {
            last_scan: Family::default(),
            scans: Family::default(),
            duration: Histogram::new(duration_buckets()),
            tags_seen: Counter::default(),
            manifests_read: Counter::default(),
            repository_failures: Family::default(),
        };
        exported.register("scans", "Scans by outcome", metrics.scans.clone());
        exported.register(
            "last_scan_timestamp_seconds",
            "Unix time the last scan of each JukeBox ended",
            metrics.last_scan.clone(),
        );
        exported.register("scan_duration_seconds", "Duration of scans", metrics.duration.clone());
        exported.register("tags_seen", "Tags listed", metrics.tags_seen.clone());
        exported.register(
            "manifests_read",
            "Manifests read (digests not seen before)",
            metrics.manifests_read.clone(),
        );
        exported.register(
            "repository_failures",
            "Repositories that failed, by cause",
            metrics.repository_failures.clone(),
        );
        exported.register("registry_requests", "Registry requests by kind and outcome", requests.family());
        (metrics, Arc::new(exported))
    }
}

/// A short cause for a repository failure message.
pub fn cause(message: &str) -> &'static str {
    let lower = message.to_ascii_lowercase();
    [
        ("over the cap", "tag_cap"),
        ("unauthorized", "unauthorized"),
        ("rate limited", "rate_limited"),
        ("no answer within", "timeout"),
        ("cannot reach", "unreachable"),
        ("not found", "not_found"),
        ("malformed", "malformed_annotations"),
        ("larger than", "too_large"),
        ("answered 5", "registry_error"),
    ]
    .into_iter()
    .find(|(needle, _)| lower.contains(needle))
    .map_or("other", |(_, cause)| cause)
}
