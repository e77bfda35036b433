//! The lifecycle's Prometheus metrics (`GET /metrics` on its gRPC port); the
//! names and labels are listed in `docs/metrics.md`.
//!
//! The instance controllers keep upstream's metric names, so dashboards built
//! on upstream keep working: one registry per kind with the prefixes
//! `tenant_instance_reconcile`, `service_instance_reconcile` and
//! `system_instance_reconcile`, each with `runs`, `failures` (labels of the
//! instance and the `error`) and `duration` (seconds, upstream's buckets).
//! The service's own RPCs are counted by the gRPC server (`grpc_server_*`).

use std::sync::Arc;

use vynil_runtime::metrics::{
    Counter, EncodeLabelSet, Family, Registry, TracedHistogram, duration_buckets, trace_exemplar,
};

/// Identity of an instance, as upstream labels it.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InstanceFailure {
    pub name: String,
    pub namespace: String,
    pub jukebox: String,
    pub category: String,
    pub package: String,
    pub error: String,
}

/// The reconcile metrics of one instance kind.
#[derive(Debug, Clone)]
pub struct ReconcileMetrics {
    pub runs: Counter,
    pub failures: Family<InstanceFailure, Counter>,
    /// Seconds, with the reconcile's trace as exemplar (as upstream).
    pub duration: TracedHistogram,
}

impl ReconcileMetrics {
    fn register(exported: &mut Registry) -> Self {
        let metrics = Self {
            runs: Counter::default(),
            failures: Family::default(),
            duration: TracedHistogram::new(duration_buckets()),
        };
        exported.register("runs", "Reconciliations", metrics.runs.clone());
        exported.register(
            "failures",
            "Reconciliations that failed, by instance and error",
            metrics.failures.clone(),
        );
        exported.register("duration", "Duration of reconciliations in seconds", metrics.duration.clone());
        metrics
    }

    /// Records one reconcile's duration in the current span's trace.
    pub fn observe(&self, seconds: f64) {
        self.duration.observe(seconds, trace_exemplar(), None);
    }
}

#[derive(Debug, Clone)]
pub struct LifecycleMetrics {
    pub tenant: ReconcileMetrics,
    pub service: ReconcileMetrics,
    pub system: ReconcileMetrics,
}

impl LifecycleMetrics {
    /// The reconcile metrics of `kind`.
    pub fn of(&self, kind: crate::instance::InstanceKind) -> &ReconcileMetrics {
        match kind {
            crate::instance::InstanceKind::Tenant => &self.tenant,
            crate::instance::InstanceKind::Service => &self.service,
            crate::instance::InstanceKind::System => &self.system,
        }
    }

    pub fn register() -> (Self, Arc<Registry>) {
        let mut exported = Registry::default();
        let tenant =
            ReconcileMetrics::register(exported.sub_registry_with_prefix("tenant_instance_reconcile"));
        let service =
            ReconcileMetrics::register(exported.sub_registry_with_prefix("service_instance_reconcile"));
        let system =
            ReconcileMetrics::register(exported.sub_registry_with_prefix("system_instance_reconcile"));
        (Self { tenant, service, system }, Arc::new(exported))
    }
}
