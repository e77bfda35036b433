//! The catalog's Prometheus metrics (`GET /metrics` on its gRPC port).

use std::sync::Arc;

use vynil_runtime::metrics::{Counter, Gauge, Registry};

#[derive(Debug, Clone, Default)]
pub struct CatalogMetrics {
    /// Entries written to the shared cache.
    pub upserts: Counter,
    /// Status changes whose content was already cached: no write.
    pub skipped_identical: Counter,
    pub removals: Counter,
    /// 1 while the catalog answers from its snapshot because Redis or the
    /// store cannot be reached.
    pub degraded: Gauge,
}

impl CatalogMetrics {
    pub fn register(&self) -> Arc<Registry> {
        let mut exported = Registry::with_prefix("vynil_catalog");
        exported.register("upserts", "Cache entries written", self.upserts.clone());
        exported.register(
            "skipped_identical_writes",
            "Status changes with unchanged content",
            self.skipped_identical.clone(),
        );
        exported.register("removals", "Cache entries removed", self.removals.clone());
        exported.register("degraded", "Serving from the snapshot only", self.degraded.clone());
        Arc::new(exported)
    }
}
