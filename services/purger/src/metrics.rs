//! The purger's Prometheus metrics (`GET /metrics` on its gRPC port); the
//! names and labels are listed in `docs/metrics.md`.

use std::sync::Arc;

use vynil_runtime::metrics::{Counter, EncodeLabelSet, Family, Registry, preset};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct State {
    pub state: String,
}

#[derive(Debug, Clone)]
pub struct PurgerMetrics {
    pub plans: Counter,
    /// Deletions the plans decided (each plan's deletions, counted when stored).
    pub planned_deletions: Counter,
    pub refusals: Counter,
    pub deletions: Family<State, Counter>,
}

impl PurgerMetrics {
    /// Registers the purger's metrics and the registry client's request counts.
    pub fn register(requests: &vynil_registry::RequestCounters) -> (Self, Arc<Registry>) {
        let mut exported = Registry::with_prefix("vynil_purger");
        let metrics = Self {
            plans: Counter::default(),
            planned_deletions: Counter::default(),
            refusals: Counter::default(),
            deletions: Family::default(),
        };
        exported.register("plans", "Plans made", metrics.plans.clone());
        exported.register(
            "planned_deletions",
            "Deletions decided by the plans made",
            metrics.planned_deletions.clone(),
        );
        exported.register(
            "refusals",
            "Executions refused (confirmation, stale plan, busy)",
            metrics.refusals.clone(),
        );
        preset(&metrics.deletions, ["deleted", "already_gone", "failed"].map(|s| State { state: s.into() }));
        exported.register("deletions", "Verified deletion outcomes by state", metrics.deletions.clone());
        exported.register("registry_requests", "Registry requests by kind and outcome", requests.family());
        (metrics, Arc::new(exported))
    }
}
