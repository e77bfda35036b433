//! Taking a cluster over from upstream's operator (scaled to zero first,
//! `docs/migration.md`). Two things it leaves behind would bring upstream's
//! bugs back or block users:
//!
//! - its scan CronJob and Job `scan-<jukebox>` in the control plane's
//!   namespace, which keep rewriting `status.packages` blind to package
//!   types (upstream #12) on their own schedule: deleted, and verified gone;
//! - its JukeBox finalizer `jukeboxes.vynil.solidite.fr`, which nobody
//!   would remove once its operator is gone, so a deleted JukeBox would hang:
//!   released (after the CronJob and Job are gone, which is all upstream's
//!   cleanup did), by a JSON patch that tests the array first.
//!
//! Only objects that are upstream's are touched: the CronJob and Job named
//! `scan-<jukebox>` whose container runs `box scan` (we never create either).

use std::time::Duration;

use k8s_openapi::api::batch::v1::{CronJob, Job};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PropagationPolicy},
};
use serde_json::json;
use vynil_crds::JukeBox;

use crate::{StoreError, kube_error};

/// Upstream's JukeBox finalizer.
pub const UPSTREAM_FINALIZER: &str = "jukeboxes.vynil.solidite.fr";

/// What a takeover did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retired {
    pub cronjob: bool,
    pub job: bool,
    pub finalizer: bool,
}

/// Whether a container of the pod template at `pointer` in `object` runs `box scan`.
fn runs_box_scan(object: &impl serde::Serialize, pointer: &str) -> bool {
    let Ok(value) = serde_json::to_value(object) else { return false };
    let containers = value.pointer(pointer).and_then(|c| c.as_array()).cloned().unwrap_or_default();
    containers.iter().any(|c| {
        let args: Vec<&str> = c["args"].as_array().into_iter().flatten().filter_map(|a| a.as_str()).collect();
        args.contains(&"box") && args.contains(&"scan")
    })
}

/// Deletes `scan-<name>` (CronJob and Job) when they are upstream's, and
/// releases upstream's finalizer of a JukeBox being deleted.
pub(crate) async fn retire(
    jukeboxes: &Api<JukeBox>,
    cronjobs: &Api<CronJob>,
    jobs: &Api<Job>,
    name: &str,
) -> Result<Retired, StoreError> {
    let scan = format!("scan-{name}");
    let mut retired = Retired::default();
    let background =
        DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..Default::default() };
    let cronjob =
        cronjobs.get_opt(&scan).await.map_err(|e| kube_error("reading upstream's scan CronJob", e))?;
    if cronjob.is_some_and(|c| runs_box_scan(&c, "/spec/jobTemplate/spec/template/spec/containers")) {
        cronjobs
            .delete(&scan, &background)
            .await
            .map_err(|e| kube_error("deleting upstream's scan CronJob", e))?;
        gone(cronjobs, &scan).await?;
        tracing::info!(cronjob = %scan, "upstream's scan CronJob deleted: this control plane scans now");
        retired.cronjob = true;
    }
    let job = jobs.get_opt(&scan).await.map_err(|e| kube_error("reading upstream's scan Job", e))?;
    if job.is_some_and(|j| runs_box_scan(&j, "/spec/template/spec/containers")) {
        jobs.delete(&scan, &background).await.map_err(|e| kube_error("deleting upstream's scan Job", e))?;
        gone(jobs, &scan).await?;
        retired.job = true;
    }
    let Some(jukebox) = jukeboxes.get_opt(name).await.map_err(|e| kube_error("reading a JukeBox", e))? else {
        return Ok(retired);
    };
    let finalizers = jukebox.finalizers().to_vec();
    let Some(index) = finalizers.iter().position(|f| f == UPSTREAM_FINALIZER) else {
        return Ok(retired);
    };
    if jukebox.metadata.deletion_timestamp.is_none() {
        return Ok(retired);
    }
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": UPSTREAM_FINALIZER},
        {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
    ]))
    .map_err(|e| StoreError::Config(format!("finalizer patch: {e}")))?;
    match jukeboxes.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch)).await {
        Ok(_) => {}
        // Changed meanwhile (another replica): the next pass looks again.
        Err(kube::Error::Api(status)) if status.code == 422 || status.code == 404 => return Ok(retired),
        Err(e) => return Err(kube_error("releasing upstream's JukeBox finalizer", e)),
    }
    let after = jukeboxes.get_opt(name).await.map_err(|e| kube_error("reading a JukeBox back", e))?;
    retired.finalizer = after.is_none_or(|j| !j.finalizers().iter().any(|f| f == UPSTREAM_FINALIZER));
    if retired.finalizer {
        tracing::info!(jukebox = %name, "upstream's JukeBox finalizer released");
    }
    Ok(retired)
}

/// Waits (10 s at most) until `name` reads as absent: accepted is not done.
async fn gone<K>(api: &Api<K>, name: &str) -> Result<(), StoreError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for _ in 0..100 {
        if api.get_opt(name).await.map_err(|e| kube_error("reading back a delete", e))?.is_none() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(StoreError::Unavailable(format!(
        "{name} still exists 10 s after its delete; retrying at the next pass"
    )))
}
