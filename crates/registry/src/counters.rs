//! Requests counted by kind and outcome, for metrics and for tests.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

/// Cheap to clone; clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct RequestCounters {
    counts: Arc<Mutex<BTreeMap<(String, String), u64>>>,
}

impl RequestCounters {
    /// `kind` e.g. `get_manifest`; `outcome` an HTTP status or `error`.
    pub fn record(&self, kind: &str, outcome: &str) {
        if let Ok(mut counts) = self.counts.lock() {
            *counts.entry((kind.to_string(), outcome.to_string())).or_default() += 1;
        }
    }

    /// Every `(kind, outcome) → count`.
    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        self.counts.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Total requests of one kind, whatever their outcome.
    pub fn total(&self, kind: &str) -> u64 {
        self.snapshot().iter().filter(|((k, _), _)| k == kind).map(|(_, n)| n).sum()
    }
}
