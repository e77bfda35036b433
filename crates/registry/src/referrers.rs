//! What is known of registries' OCI referrers API: those that answered 404
//! (distribution 2.8, GHCR, Docker Hub: no API, the referrers tag schema
//! stands in) are not asked again for [`REFERRERS_ABSENT_FOR`], so a scan
//! of a thousand revisions sends one 404, not a thousand.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// How long a registry whose referrers API answered 404 is not asked again.
pub const REFERRERS_ABSENT_FOR: Duration = Duration::from_secs(600);

/// Registries whose referrers API answered 404, and when: shared by the
/// clones of one client.
#[derive(Debug, Default, Clone)]
pub(crate) struct ReferrersAbsent(Arc<Mutex<HashMap<String, Instant>>>);

impl ReferrersAbsent {
    pub(crate) fn known(&self, registry: &str) -> bool {
        self.0
            .lock()
            .ok()
            .and_then(|m| m.get(registry).copied())
            .is_some_and(|at| at.elapsed() < REFERRERS_ABSENT_FOR)
    }

    pub(crate) fn remember(&self, registry: &str) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(registry.to_string(), Instant::now());
        }
    }
}
