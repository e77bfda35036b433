//! The catalog's Prometheus metrics (`GET /metrics` on its gRPC port); the
//! names and labels are listed in `docs/metrics.md`.

use std::sync::Arc;

use vynil_runtime::metrics::{Counter, EncodeLabelSet, Family, Gauge, Histogram, Registry, preset};

/// How a lookup of one JukeBox's entry went.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum LookupResult {
    /// In the snapshot.
    hit,
    /// Loaded, but no entry for that JukeBox.
    miss,
    /// Nothing loaded yet: answered UNAVAILABLE.
    not_loaded,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Lookup {
    pub result: LookupResult,
}

#[derive(Debug, Clone)]
pub struct CatalogMetrics {
    /// Entries written to the shared cache.
    pub upserts: Counter,
    /// Status changes whose content was already cached: no write.
    pub skipped_identical: Counter,
    pub removals: Counter,
    /// 1 while the catalog answers from its snapshot because Redis or the
    /// store cannot be reached.
    pub degraded: Gauge,
    pub lookups: Family<Lookup, Counter>,
    /// From a status's last package change to the catalog's write of it.
    pub freshness_lag: Histogram,
}

impl Default for CatalogMetrics {
    fn default() -> Self {
        Self {
            upserts: Counter::default(),
            skipped_identical: Counter::default(),
            removals: Counter::default(),
            degraded: Gauge::default(),
            lookups: Family::default(),
            // Status timestamps have second resolution: 1 s to 10 min.
            freshness_lag: Histogram::new([1.0, 2.0, 5.0, 15.0, 60.0, 300.0, 600.0]),
        }
    }
}

impl CatalogMetrics {
    pub fn register(&self) -> Arc<Registry> {
        let results = [LookupResult::hit, LookupResult::miss, LookupResult::not_loaded];
        preset(&self.lookups, results.map(|result| Lookup { result }));
        let mut exported = Registry::with_prefix("vynil_catalog");
        exported.register("upserts", "Cache entries written", self.upserts.clone());
        exported.register(
            "skipped_identical_writes",
            "Status changes with unchanged content",
            self.skipped_identical.clone(),
        );
        exported.register("removals", "Cache entries removed", self.removals.clone());
        exported.register("degraded", "Serving from the snapshot only", self.degraded.clone());
        exported.register("lookups", "Entry lookups by result (hit, miss, not_loaded)", self.lookups.clone());
        exported.register(
            "freshness_lag_seconds",
            "From a JukeBox's last package change to the catalog writing it",
            self.freshness_lag.clone(),
        );
        Arc::new(exported)
    }

    pub fn lookup(&self, result: LookupResult) {
        self.lookups.get_or_create(&Lookup { result }).inc();
    }
}
