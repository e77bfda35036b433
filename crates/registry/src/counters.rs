//! Requests counted by kind and outcome, for Prometheus (the services
//! register [`RequestCounters::family`]) and for tests.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};

/// Labels of `registry_requests_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `list_tags`, `head_manifest`, `get_manifest`, `delete`, `token`, `api`.
    pub kind: String,
    /// An HTTP status, or `error` when no answer came.
    pub outcome: String,
}

/// Cheap to clone; clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct RequestCounters {
    counts: Arc<Mutex<BTreeMap<(String, String), u64>>>,
    family: Family<RequestLabels, Counter>,
}

impl RequestCounters {
    /// `kind` e.g. `get_manifest`; `outcome` an HTTP status or `error`.
    pub fn record(&self, kind: &str, outcome: &str) {
        if let Ok(mut counts) = self.counts.lock() {
            *counts.entry((kind.to_string(), outcome.to_string())).or_default() += 1;
        }
        self.family.get_or_create(&RequestLabels { kind: kind.into(), outcome: outcome.into() }).inc();
    }

    /// The same counts as a Prometheus counter family, to register.
    pub fn family(&self) -> Family<RequestLabels, Counter> {
        self.family.clone()
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
