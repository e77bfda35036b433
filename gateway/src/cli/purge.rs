//! `vynilctl purge`: plans, their execution with progress, and reports.

use serde_json::json;

use super::{
    Cli, PurgeCommand,
    client::{CliError, CliResult, Exit},
    confirmation, connect,
    output::{Format, Printer, Tone, cell},
    progress_bar,
};
use crate::api::purge::{DeletionOutcome, DeletionState, Plan, Report};

pub(super) async fn run(cli: &Cli, printer: &Printer, command: &PurgeCommand) -> CliResult<Exit> {
    match command {
        PurgeCommand::Plan { target } => plan(cli, printer, target).await,
        PurgeCommand::Execute { plan, confirm, acknowledge_usage_unknown } => {
            execute(cli, printer, plan, confirm.as_deref(), *acknowledge_usage_unknown).await
        }
        PurgeCommand::Report { plan } => report(cli, printer, plan).await,
    }
}

async fn plan(cli: &Cli, printer: &Printer, target: &str) -> CliResult<Exit> {
    let body = match target.strip_prefix("jukebox/") {
        Some(name) => json!({"jukebox": name}),
        None if !target.contains('/') => json!({"jukebox": target}),
        None => {
            let (registry, repository) = target.split_once('/').unwrap_or_default();
            json!({"repository": {"registry": registry, "repository": repository}})
        }
    };
    let plan: Plan = connect(cli)?.post("/api/v1/purge/plans", &body).await?;
    if !printer.structured(&plan)? {
        print_plan(printer, &plan);
    }
    Ok(Exit::Ok)
}

async fn report(cli: &Cli, printer: &Printer, plan: &str) -> CliResult<Exit> {
    let report: Report = connect(cli)?.get(&format!("/api/v1/purge/plans/{plan}/report")).await?;
    if !printer.structured(&report)? {
        print_report(printer, &report);
    }
    Ok(report_exit(&report))
}

async fn execute(
    cli: &Cli,
    printer: &Printer,
    plan_id: &str,
    confirm: Option<&str>,
    acknowledge: bool,
) -> CliResult<Exit> {
    let client = connect(cli)?;
    let plan: Plan = client.get(&format!("/api/v1/purge/plans/{plan_id}")).await?;
    if printer.format == Format::Table {
        println!(
            "plan {} of {}: {} to delete, {} to keep",
            plan.plan_id, plan.target, plan.delete_count, plan.keep_count
        );
    }
    let confirm = confirmation(confirm, &plan.target)?;
    let body = json!({"confirm": confirm, "fingerprint": plan.fingerprint, "acknowledge_usage_unknown": acknowledge});
    let digests =
        plan.entries.iter().filter(|e| !e.keep).map(|e| &e.digest).collect::<std::collections::BTreeSet<_>>();
    let bar = progress_bar(digests.len() as u64, &format!("purging {}", plan.target));
    let mut report: Option<Report> = None;
    let mut failure: Option<String> = None;
    client
        .events(
            reqwest::Method::POST,
            &format!("/api/v1/purge/plans/{plan_id}/execute"),
            Some(&body),
            |event, data| match event {
                "outcome" => {
                    if let Ok(outcome) = serde_json::from_str::<DeletionOutcome>(data) {
                        bar.inc(1);
                        bar.set_message(format!("{} {}", outcome.repository, outcome.tags.join(",")));
                    }
                }
                "report" => report = serde_json::from_str(data).ok(),
                "error" => failure = Some(data.to_string()),
                _ => {}
            },
        )
        .await?;
    bar.finish_and_clear();
    if let Some(failure) = failure {
        let body: crate::error::ErrorBody =
            serde_json::from_str(&failure).unwrap_or(crate::error::ErrorBody {
                code: "INTERNAL".into(),
                message: failure,
                request_id: String::new(),
            });
        return Err(CliError::new(
            Exit::Failed,
            format!("{}: {} [request {}]", body.code, body.message, body.request_id),
        ));
    }
    let report = report.ok_or_else(|| CliError::new(Exit::Failed, "the execution ended without a report"))?;
    if !printer.structured(&report)? {
        print_report(printer, &report);
    }
    Ok(report_exit(&report))
}

fn report_exit(report: &Report) -> Exit {
    if report.outcomes.iter().any(|o| o.state == DeletionState::Failed) { Exit::Failed } else { Exit::Ok }
}

fn print_plan(printer: &Printer, plan: &Plan) {
    let rows: Vec<Vec<(String, Tone)>> = plan
        .entries
        .iter()
        .map(|e| {
            let decision =
                if e.keep { ("keep".to_string(), Tone::Good) } else { ("delete".to_string(), Tone::Bad) };
            vec![cell(&e.repository), cell(&e.tag), decision, cell(e.reasons.join("; "))]
        })
        .collect();
    printer.table(&["repository", "tag", "decision", "reasons"], &rows);
    println!(
        "\nplan {}: {} to delete, {} to keep; expires {}\nexecute: vynilctl purge execute {} --confirm {}",
        plan.plan_id, plan.delete_count, plan.keep_count, plan.expires_at, plan.plan_id, plan.target
    );
    if plan.usage_unknown {
        println!(
            "{}",
            printer.paint(
                "installed revisions are unknown: executing needs --acknowledge-usage-unknown",
                Tone::Warn
            )
        );
    }
}

fn print_report(printer: &Printer, report: &Report) {
    let rows: Vec<Vec<(String, Tone)>> = report
        .outcomes
        .iter()
        .map(|o| {
            let (state, tone) = match o.state {
                DeletionState::Deleted => ("deleted", Tone::Good),
                DeletionState::AlreadyGone => ("already gone", Tone::Plain),
                DeletionState::Failed => ("failed", Tone::Bad),
                DeletionState::Unknown => ("unknown", Tone::Warn),
            };
            let detail = o.error_message.clone().or(o.note.clone()).unwrap_or_default();
            vec![cell(&o.repository), cell(o.tags.join(",")), (state.to_string(), tone), cell(detail)]
        })
        .collect();
    printer.table(&["repository", "tags", "outcome", "detail"], &rows);
    let count = |s: DeletionState| report.outcomes.iter().filter(|o| o.state == s).count();
    println!(
        "\n{} executed by {}: {} deleted (eligible for the registry's garbage collection), {} already gone, {} failed",
        report.target,
        report.executed_by,
        count(DeletionState::Deleted),
        count(DeletionState::AlreadyGone),
        count(DeletionState::Failed)
    );
    if let Some(note) = &report.note {
        println!("{note}");
    }
}
