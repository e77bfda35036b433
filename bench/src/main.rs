//! `cargo run --release -p vynil-bench`: every performance figure beside a
//! baseline measured in the same run, on real Redis and registry instances
//! (these machines are 2 shared, noisy cores: only ratios measured together
//! mean anything). Prints a table, writes `bench/results/latest.json` and
//! appends one dated line with the core count to `bench/results/history.jsonl`.
//! A figure that could not be measured is listed as failed, with why, and
//! the command then exits non-zero.

mod catalog_size;
mod fleet_scale;
mod freshness;
mod gateway;
mod memory;
mod planning;
mod purge_size;
mod report;
mod scan;
mod signed;
mod uninstall;

use clap::Parser;
use report::Report;

#[derive(Debug, Parser)]
#[command(name = "vynil-bench", about = "Every performance figure beside its baseline, in one run")]
struct Args {
    /// Only these figures (P1, P2, P2v, P3…); all by default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Tags of P2's large repository (and a tenth of it, for the growth).
    #[arg(long, default_value_t = 10_000)]
    tags: usize,
    /// P7's TenantInstances (and a tenth of them, for the growth).
    #[arg(long, default_value_t = 1_000)]
    instances: usize,
    /// P9's planning process (internal: the bench starts itself with it).
    #[arg(long, hide = true)]
    p9_child: bool,
    /// P4's static handler in a process of its own, serving this file's
    /// bytes (internal: the bench starts itself with it).
    #[arg(long, hide = true)]
    static_child: Option<std::path::PathBuf>,
    /// Where results are written.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results"))]
    results: std::path::PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.p9_child {
        return purge_size::child();
    }
    if let Some(body) = args.static_child {
        return gateway::static_child(&body).await;
    }
    let wanted = |id: &str| args.only.is_empty() || args.only.iter().any(|o| o.eq_ignore_ascii_case(id));
    let mut report = Report::new();
    if wanted("P1") {
        for figure in freshness::local().await {
            report.add(figure);
        }
        report.add(freshness::cluster().await);
    }
    if wanted("P2") {
        report.add(scan::scan_cost(args.tags).await);
    }
    if wanted("P2v") {
        report.add(signed::scan_cost(args.tags).await);
    }
    if wanted("P3") {
        report.add(planning::planning());
    }
    if wanted("P4") || wanted("P6") {
        let (reads, loaded) = gateway::reads_under_load().await;
        if wanted("P4") {
            report.add(reads);
        }
        if wanted("P6") {
            report.add(memory::idle().await);
            report.add(loaded);
        }
    }
    if wanted("P5") {
        report.add(uninstall::delete_failure().await);
    }
    if wanted("P7") {
        report.add(fleet_scale::fleet_scale(args.instances).await);
    }
    if wanted("P8") {
        report.add(catalog_size::catalog_size().await);
    }
    if wanted("P9") {
        report.add(purge_size::at_size().await);
    }
    report.print();
    report.write(&args.results)?;
    if report.failed() {
        anyhow::bail!("some figures could not be measured (see above)");
    }
    Ok(())
}
