//! P9: the purger's planning path at 1 000 000 tags (1 000 repositories of
//! 1 000), without registry I/O (P2 measures that at 10 000 tags). It runs in
//! a process of its own, this bench started again with `--p9-child`, so the
//! peak RSS is the planning's alone. As the purger plans a JukeBox, each
//! repository's listing is made (as the registry snapshot hands it),
//! planned by `vynil_purger::plan_repository` and dropped; the plans are
//! held, then assembled and encoded as the plan store stores them (one
//! value). Baselines, same process: parsing and sorting the same tags, and
//! the process's RSS holding one listing before any plan.

use std::{process::Stdio, time::Instant};

use semver::Version;
use vynil_registry::RepositoryRef;
use vynil_rules::{RetentionConfig, retention::Usage, tag::versions_newest_first};

use crate::{
    planning::{TAGS, repository},
    report::{Figure, Row},
    scan::resident_mib,
};

const REPOSITORIES: usize = 1_000;
const NAME: &str = "purge planning at size, 1 000 x 1 000 tags";

/// What the child measured.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Measured {
    tags: usize,
    planning_s: f64,
    floor_s: f64,
    encoding_s: f64,
    encoded_bytes: usize,
    deletions: usize,
    start_mib: f64,
    peak_mib: f64,
}

pub async fn at_size() -> Figure {
    Figure::from_result("P9", NAME, run_child().await)
}

async fn run_child() -> anyhow::Result<Vec<Row>> {
    let output = tokio::process::Command::new(std::env::current_exe()?)
        .arg("--p9-child")
        .stderr(Stdio::inherit())
        .output()
        .await?;
    anyhow::ensure!(output.status.success(), "the planning process exited {}", output.status);
    let m: Measured = serde_json::from_slice(&output.stdout)?;
    let mib = |bytes: usize| bytes as f64 / (1024.0 * 1024.0);
    Ok(vec![
        Row::new(format!("plan {} tags, one repository at a time", m.tags), m.planning_s, "s")
            .against("parse + sort the same tags", m.floor_s),
        Row::new("assemble and encode the plan as stored", m.encoding_s, "s"),
        Row::new(format!("plan stored, {} deletions", m.deletions), mib(m.encoded_bytes), "MiB"),
        Row::new("stored bytes per tag", m.encoded_bytes as f64 / m.tags as f64, "B"),
        Row::new("planning process peak RSS", m.peak_mib, "MiB")
            .against("the same process holding one listing", m.start_mib),
    ])
}

/// The child's work: prints [`Measured`] as JSON.
pub fn child() -> anyhow::Result<()> {
    let config = RetentionConfig::new(Version::new(0, 8, 0), &[])?;
    let usage = Usage::Known(vec![]);
    let first = repository(0);
    let start_mib = resident_mib(std::process::id(), "VmRSS:")?;
    drop(first);
    let (mut planning_s, mut floor_s, mut plans) = (0.0, 0.0, Vec::with_capacity(REPOSITORIES));
    for seed in 0..REPOSITORIES {
        let tags = repository(seed);
        let start = Instant::now();
        std::hint::black_box(versions_newest_first(tags.iter().map(|t| t.name.as_str())));
        floor_s += start.elapsed().as_secs_f64();
        let repo = RepositoryRef::new("registry.example", &format!("bench/pkg{seed}"))?;
        let start = Instant::now();
        plans.push(vynil_purger::plan_repository(&repo, &tags, &usage, &config)?);
        planning_s += start.elapsed().as_secs_f64();
    }
    let start = Instant::now();
    let deletions = plans.iter().map(|p| p.deletions.len()).sum();
    let plan = vynil_purger::assemble(
        "plan-bench".into(),
        "jukebox/bench".into(),
        plans,
        jiff::Timestamp::now(),
        std::time::Duration::from_secs(3600),
    );
    let encoded_bytes = serde_json::to_string(&plan)?.len();
    let encoding_s = start.elapsed().as_secs_f64();
    let measured = Measured {
        tags: REPOSITORIES * TAGS,
        planning_s,
        floor_s,
        encoding_s,
        encoded_bytes,
        deletions,
        start_mib,
        peak_mib: resident_mib(std::process::id(), "VmHWM:")?,
    };
    println!("{}", serde_json::to_string(&measured)?);
    Ok(())
}
