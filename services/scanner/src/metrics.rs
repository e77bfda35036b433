//! The scanner's Prometheus metrics (`GET /metrics` on its gRPC port); the
//! names and labels are listed in `docs/metrics.md`.

use std::sync::Arc;

use vynil_runtime::metrics::{
    Counter, EncodeLabelSet, Family, Gauge, Registry, TracedHistogram, duration_buckets, preset,
    trace_exemplar,
};

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

/// Upstream's `failures` labels of `jukebox_reconcile`: the JukeBox and a
/// bounded error (the scan's outcome, never message text).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JukeboxFailure {
    pub instance: String,
    pub error: String,
}

/// Upstream's JukeBox reconcile metrics (`jukebox_reconcile_*`), counted
/// per scan: dashboards built on upstream keep working.
#[derive(Debug, Clone)]
pub struct JukeboxReconcile {
    pub runs: Counter,
    pub failures: Family<JukeboxFailure, Counter>,
    pub duration: TracedHistogram,
}

#[derive(Debug, Clone)]
pub struct ScannerMetrics {
    /// Unix time each JukeBox's last scan ended, whatever its outcome: an
    /// unchanged scan writes no status, so this is where scans are seen.
    pub last_scan: Family<Jukebox, Gauge>,
    pub scans: Family<Outcome, Counter>,
    pub duration: TracedHistogram,
    pub tags_seen: Counter,
    pub manifests_read: Counter,
    pub repository_failures: Family<Cause, Counter>,
    pub reconcile: JukeboxReconcile,
}

impl ScannerMetrics {
    /// Registers the scanner's metrics and the registry client's request counts.
    pub fn register(requests: &vynil_registry::RequestCounters) -> (Self, Arc<Registry>) {
        let mut root = Registry::default();
        let exported = root.sub_registry_with_prefix("vynil_scanner");
        let metrics = Self {
            last_scan: Family::default(),
            scans: Family::default(),
            duration: TracedHistogram::new(duration_buckets()),
            tags_seen: Counter::default(),
            manifests_read: Counter::default(),
            repository_failures: Family::default(),
            reconcile: JukeboxReconcile {
                runs: Counter::default(),
                failures: Family::default(),
                duration: TracedHistogram::new(duration_buckets()),
            },
        };
        let outcomes = ["succeeded", "partially_failed", "failed", "abandoned"];
        preset(&metrics.scans, outcomes.map(|o| Outcome { outcome: o.into() }));
        let causes = CAUSES.iter().map(|(_, cause)| *cause).chain(["other"]);
        preset(&metrics.repository_failures, causes.map(|c| Cause { cause: c.into() }));
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
        let upstream = root.sub_registry_with_prefix("jukebox_reconcile");
        upstream.register(
            "runs",
            "Scans run (upstream's JukeBox reconciles)",
            metrics.reconcile.runs.clone(),
        );
        upstream.register(
            "failures",
            "Scans that did not succeed, by JukeBox and outcome",
            metrics.reconcile.failures.clone(),
        );
        upstream.register("duration", "Duration of scans in seconds", metrics.reconcile.duration.clone());
        (metrics, Arc::new(root))
    }
}

impl ScannerMetrics {
    /// Counts one scan of `jukebox` ended in `outcome` after `seconds`.
    pub fn scanned(&self, jukebox: &str, outcome: &str, seconds: f64) {
        self.scans.get_or_create(&Outcome { outcome: outcome.into() }).inc();
        self.duration.observe(seconds, trace_exemplar(), None);
        self.reconcile.runs.inc();
        self.reconcile.duration.observe(seconds, trace_exemplar(), None);
        if outcome != "succeeded" {
            let failure = JukeboxFailure { instance: jukebox.into(), error: outcome.into() };
            self.reconcile.failures.get_or_create(&failure).inc();
        }
    }
}

/// What a repository failure message says, as a bounded label.
const CAUSES: [(&str, &str); 9] = [
    ("over the cap", "tag_cap"),
    ("unauthorized", "unauthorized"),
    ("rate limited", "rate_limited"),
    ("no answer within", "timeout"),
    ("cannot reach", "unreachable"),
    ("not found", "not_found"),
    ("malformed", "malformed_annotations"),
    ("larger than", "too_large"),
    ("answered 5", "registry_error"),
];

/// A short cause for a repository failure message.
pub fn cause(message: &str) -> &'static str {
    let lower = message.to_ascii_lowercase();
    CAUSES.into_iter().find(|(needle, _)| lower.contains(needle)).map_or("other", |(_, cause)| cause)
}
