//! `vynilctl instance`: what is installed, why it is where it is, an
//! operator's decisions on a failed upgrade, and the admin's way out when a
//! package is gone.

use serde_json::json;

use super::{
    Cli, InstanceCommand,
    client::{CliError, CliResult, Exit},
    confirmation, connect,
    output::{Format, Printer, Tone, cell},
    wire_name,
};
use crate::api::instances::{
    Approved, Explanation, Instance, InstanceList, InstanceState, Quarantine, RollbackState,
};

pub(super) async fn run(cli: &Cli, printer: &Printer, command: &InstanceCommand) -> CliResult<Exit> {
    match command {
        InstanceCommand::List { kind, namespace, jukebox } => {
            list(cli, printer, kind, namespace, jukebox).await
        }
        InstanceCommand::Explain { instance } => explain(cli, printer, instance).await,
        InstanceCommand::AllowDeleteWithoutPackage { instance, confirm, reason } => {
            allow_delete_without_package(cli, printer, instance, confirm, reason).await
        }
        InstanceCommand::Rollback { instance, tag, reason } => {
            decide(cli, printer, instance, Decision::Rollback, tag, reason).await
        }
        InstanceCommand::ClearQuarantine { instance, tag, reason } => {
            decide(cli, printer, instance, Decision::ClearQuarantine, tag, reason).await
        }
        InstanceCommand::Approve { instance, fingerprint, reason } => {
            approve(cli, printer, instance, fingerprint, reason).await
        }
    }
}

/// Approves the pending upgrade: the fingerprint given, else the one
/// `Explain` shows now (printed first, so what is approved is said).
async fn approve(
    cli: &Cli,
    printer: &Printer,
    instance: &str,
    fingerprint: &Option<String>,
    reason: &str,
) -> CliResult<Exit> {
    let reference = instance_path(instance)?;
    let client = connect(cli)?;
    let fingerprint = match fingerprint {
        Some(given) => given.clone(),
        None => {
            let explained: Explanation =
                client.get(&format!("/api/v1/instances/{reference}/explain")).await?;
            let Some(pending) = explained.approval_fingerprint.clone() else {
                return Err(CliError::new(
                    Exit::Refused,
                    format!("{reference}: no upgrade awaits approval ({})", explained.summary),
                ));
            };
            if printer.format == Format::Table {
                println!("{}", explained.summary);
            }
            pending
        }
    };
    let body = json!({"fingerprint": fingerprint, "reason": reason});
    let approved: Approved =
        client.post(&format!("/api/v1/instances/{reference}/approve-upgrade"), &body).await?;
    if !printer.structured(&approved)? {
        println!(
            "{reference}: approved the upgrade {} → {} (fingerprint {})",
            approved.from_tag, approved.to_tag, approved.fingerprint
        );
    }
    Ok(Exit::Ok)
}

/// An operator's decision on a failed upgrade.
#[derive(Debug, Clone, Copy)]
enum Decision {
    Rollback,
    ClearQuarantine,
}

async fn decide(
    cli: &Cli,
    printer: &Printer,
    instance: &str,
    decision: Decision,
    tag: &Option<String>,
    reason: &str,
) -> CliResult<Exit> {
    let reference = instance_path(instance)?;
    let route = match decision {
        Decision::Rollback => "rollback",
        Decision::ClearQuarantine => "clear-quarantine",
    };
    let body = json!({"tag": tag, "reason": reason});
    let quarantine: Quarantine =
        connect(cli)?.post(&format!("/api/v1/instances/{reference}/{route}"), &body).await?;
    if !printer.structured(&quarantine)? {
        match decision {
            Decision::Rollback => println!(
                "{reference}: rolling back from {} to {} (the failed upgrade stays quarantined)",
                quarantine.tag, quarantine.from_tag
            ),
            Decision::ClearQuarantine => {
                println!(
                    "{reference}: {} is no longer quarantined; it may be installed again",
                    quarantine.tag
                )
            }
        }
    }
    Ok(Exit::Ok)
}

async fn list(
    cli: &Cli,
    printer: &Printer,
    kind: &Option<String>,
    namespace: &Option<String>,
    jukebox: &Option<String>,
) -> CliResult<Exit> {
    let mut query = Vec::new();
    query.extend(kind.as_ref().map(|v| format!("kind={v}")));
    query.extend(namespace.as_ref().map(|v| format!("namespace={v}")));
    query.extend(jukebox.as_ref().map(|v| format!("jukebox={v}")));
    let list: InstanceList = connect(cli)?.get_all(&format!("/api/v1/instances?{}", query.join("&"))).await?;
    if !printer.structured(&list)? {
        let rows: Vec<Vec<(String, Tone)>> = list.items.iter().map(instance_row).collect();
        printer.table(&["instance", "package", "tag", "state", "blocked by"], &rows);
    }
    Ok(Exit::Ok)
}

async fn explain(cli: &Cli, printer: &Printer, instance: &str) -> CliResult<Exit> {
    let path = format!("/api/v1/instances/{}/explain", instance_path(instance)?);
    let explained: Explanation = connect(cli)?.get(&path).await?;
    if !printer.structured(&explained)? {
        print_explanation(printer, &explained);
    }
    Ok(if explained.blocked.is_some() { Exit::Refused } else { Exit::Ok })
}

async fn allow_delete_without_package(
    cli: &Cli,
    printer: &Printer,
    instance: &str,
    confirm: &Option<String>,
    reason: &str,
) -> CliResult<Exit> {
    let reference = instance_path(instance)?;
    let client = connect(cli)?;
    let explained: Explanation = client.get(&format!("/api/v1/instances/{reference}/explain")).await?;
    if printer.format == Format::Table {
        println!("Without package hooks, this deletes:");
        for child in &explained.children_to_delete {
            println!("  {child}");
        }
        for child in &explained.children_left {
            println!("  left for a human: {child}");
        }
    }
    let confirm = confirmation(confirm.as_deref(), &reference)?;
    let body = json!({"confirm": confirm, "fingerprint": explained.children_fingerprint, "reason": reason});
    let done: serde_json::Value =
        client.post(&format!("/api/v1/instances/{reference}/allow-delete-without-package"), &body).await?;
    if !printer.structured(&done)? {
        println!("{reference}: delete without package allowed; lifecycle starts the reaper");
    }
    Ok(Exit::Ok)
}

fn instance_path(instance: &str) -> CliResult<String> {
    match instance.split('/').collect::<Vec<_>>().as_slice() {
        [kind, namespace, name] if !kind.is_empty() && !namespace.is_empty() && !name.is_empty() => {
            Ok(instance.to_string())
        }
        _ => Err(CliError::new(
            Exit::Usage,
            format!("{instance:?}: expected <kind>/<namespace>/<name>, e.g. tenant/apps/web"),
        )),
    }
}

fn state_tone(state: InstanceState) -> Tone {
    match state {
        InstanceState::UpToDate => Tone::Good,
        InstanceState::Blocked | InstanceState::Invalid | InstanceState::Retrying => Tone::Bad,
        _ => Tone::Warn,
    }
}

fn instance_row(i: &Instance) -> Vec<(String, Tone)> {
    let kind = i.reference.kind.map(|k| format!("{k:?}").to_lowercase()).unwrap_or_default();
    vec![
        cell(format!("{kind}/{}/{}", i.reference.namespace, i.reference.name)),
        cell(format!("{}/{}", i.category, i.package)),
        cell(i.tag.clone().unwrap_or_else(|| "-".into())),
        (wire_name(i.state), state_tone(i.state)),
        cell(i.blocked.as_ref().map(|b| b.reason.clone()).unwrap_or_default()),
    ]
}

fn print_explanation(printer: &Printer, e: &Explanation) {
    let state = wire_name(e.state);
    println!("{}: {}", printer.paint(&state, state_tone(e.state)), e.summary);
    for detail in &e.details {
        println!("  {detail}");
    }
    if let Some(blocked) = &e.blocked {
        // Most reasons already start with their code: said once.
        let code = blocked
            .code
            .as_ref()
            .filter(|c| !blocked.reason.starts_with(&format!("[{c}]")))
            .map(|c| format!("[{c}] "))
            .unwrap_or_default();
        println!("blocked by {}: {code}{}", blocked.criterion, printer.paint(&blocked.reason, Tone::Bad));
    }
    let tags = [("installed", &e.from_tag), ("next", &e.to_tag), ("latest", &e.latest_tag)];
    let known: Vec<String> =
        tags.iter().filter_map(|(what, tag)| tag.as_ref().map(|t| format!("{what} {t}"))).collect();
    if !known.is_empty() {
        println!("{}", known.join(", "));
    }
    for q in &e.quarantined {
        let state = match q.rollback {
            RollbackState::Automatic => "rolled back on its own".to_string(),
            RollbackState::AwaitingOperator => format!(
                "awaiting an operator ({}): `vynilctl instance rollback` or `clear-quarantine`",
                q.rollback_detail.clone().unwrap_or_default()
            ),
            RollbackState::Approved => {
                q.rollback_detail.clone().unwrap_or_else(|| "rollback approved".into())
            }
            RollbackState::Unknown => "unknown".into(),
        };
        let line = format!("quarantined {} (from {}, {}): {}; {state}", q.tag, q.from_tag, q.at, q.reason);
        println!("{}", printer.paint(&line, Tone::Warn));
    }
    if !e.children_to_delete.is_empty() {
        println!("a delete without package would delete: {}", e.children_to_delete.join("; "));
    }
}
