//! P6: the resident memory of each gRPC service idle, as a process started
//! with its defaults, beside the smallest tonic server (health only) on the
//! same stack, measured in the same run. The loaded figures: the scanner's
//! and the purger's in P2, the lifecycle's in P5, the catalog's and the
//! gateway's under P4's load.

use std::path::Path;

use vynil_testkit::ServiceProcess;

use crate::{
    report::{Figure, Row},
    scan::{resident_mib, sibling},
};

pub async fn idle() -> Figure {
    Figure::from_result("P6", "idle RSS of each service", measure().await)
}

async fn rss_of(binary: &Path) -> anyhow::Result<f64> {
    let process = ServiceProcess::start(binary, &[]).await?;
    // Let start-up allocations settle.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    resident_mib(process.pid(), "VmRSS:")
}

async fn measure() -> anyhow::Result<Vec<Row>> {
    let baseline = rss_of(&sibling("vynil-health-only")?).await?;
    let mut rows = Vec::new();
    for service in ["vynil-catalog", "vynil-scanner", "vynil-purger", "vynil-lifecycle"] {
        let rss = rss_of(&sibling(service)?).await?;
        rows.push(
            Row::new(format!("{service}, idle"), rss, "MiB").against("a health-only tonic server", baseline),
        );
    }
    Ok(rows)
}
