//! `vynilctl jukebox`, `catalog`, `scan` and `index`: what the JukeBoxes offer.

use serde_json::json;

use super::{
    CatalogCommand, Cli, IndexCommand, JukeboxCommand,
    client::{CliError, CliResult, Exit},
    confirmation, connect,
    output::{Printer, Tone, cell},
    progress_bar, type_name, wire_name,
};
use crate::api::{
    catalog::{CatalogPage, JukeboxList, Package, UpgradePath},
    recalls::{RecallRequest, Recalls},
    scans::{ExportDone, Scan, ScanStarted, ScanState},
};

pub(super) async fn list(cli: &Cli, printer: &Printer) -> CliResult<Exit> {
    let list: JukeboxList = connect(cli)?.get_all("/api/v1/jukeboxes?").await?;
    if !printer.structured(&list)? {
        let rows = list
            .items
            .iter()
            .map(|j| {
                let updated = j.conditions.iter().find(|c| c.condition_type == "Updated");
                let state = updated
                    .map(|c| (c.status.clone(), if c.status == "True" { Tone::Good } else { Tone::Bad }));
                vec![
                    cell(&j.name),
                    cell(j.package_count.to_string()),
                    cell(j.last_change_time.clone().unwrap_or_else(|| "never".into())),
                    state.unwrap_or_else(|| cell("-")),
                ]
            })
            .collect::<Vec<_>>();
        printer.table(&["name", "packages", "last change", "updated"], &rows);
        for skipped in &list.skipped {
            eprintln!("skipped {}: {}", skipped.source, skipped.problem);
        }
    }
    Ok(Exit::Ok)
}

/// `jukebox recall` and `lift-recall`: the JukeBox's recalls as read back.
pub(super) async fn recall(cli: &Cli, printer: &Printer, command: &JukeboxCommand) -> CliResult<Exit> {
    let client = connect(cli)?;
    let (recalls, said): (Recalls, String) = match command {
        JukeboxCommand::Recall { jukebox, tag, reason, move_away } => {
            let asked = RecallRequest { tag: tag.clone(), reason: reason.clone(), move_away: *move_away };
            let path = format!("/api/v1/jukeboxes/{jukebox}/recalls");
            let then = if *move_away {
                "its instances move away"
            } else {
                "its instances keep it until a newer one"
            };
            (client.post(&path, &asked).await?, format!("{tag} is recalled for JukeBox {jukebox}: {then}"))
        }
        JukeboxCommand::LiftRecall { jukebox, tag } => {
            let path = format!("/api/v1/jukeboxes/{jukebox}/recalls/{tag}");
            (client.delete(&path).await?, format!("{tag} is no longer recalled for JukeBox {jukebox}"))
        }
        JukeboxCommand::List => return list(cli, printer).await,
    };
    if !printer.structured(&recalls)? {
        println!("{said}");
        let rows: Vec<Vec<(String, Tone)>> = recalls
            .items
            .iter()
            .map(|r| {
                let by = format!("{} {}", r.by.as_deref().unwrap_or("-"), r.at.as_deref().unwrap_or(""));
                vec![
                    cell(&r.tag),
                    cell(&r.reason),
                    cell(if r.move_away { "yes" } else { "no" }),
                    cell(by.trim()),
                ]
            })
            .collect();
        printer.table(&["recalled", "reason", "move away", "by"], &rows);
    }
    Ok(Exit::Ok)
}

pub(super) async fn catalog(cli: &Cli, printer: &Printer, command: &CatalogCommand) -> CliResult<Exit> {
    match command {
        CatalogCommand::Show { jukebox, category, name, package_type } => {
            let mut query = Vec::new();
            query.extend(category.as_ref().map(|c| format!("category={c}")));
            query.extend(name.as_ref().map(|n| format!("name={n}")));
            query.extend(package_type.map(|t| format!("type={}", type_name(Some(t)))));
            let path = format!("/api/v1/jukeboxes/{jukebox}/catalog?{}", query.join("&"));
            let page: CatalogPage = connect(cli)?.get_all(&path).await?;
            if !printer.structured(&page)? {
                print_catalog(printer, &page.items);
            }
            Ok(Exit::Ok)
        }
        CatalogCommand::Path { jukebox, package, package_type, from } => {
            let (category, name) = package.split_once('/').ok_or_else(|| {
                CliError::new(Exit::Usage, format!("{package:?}: expected <category>/<name>"))
            })?;
            let mut path = format!(
                "/api/v1/jukeboxes/{jukebox}/upgrade-path?category={category}&name={name}&type={}",
                type_name(Some(*package_type))
            );
            if let Some(from) = from {
                path.push_str(&format!("&from={from}"));
            }
            let answer: UpgradePath = connect(cli)?.get(&path).await?;
            if printer.structured(&answer)? {
                return Ok(if answer.blocked.is_some() { Exit::Refused } else { Exit::Ok });
            }
            if let Some(blocked) = &answer.blocked {
                println!("{} ({})", printer.paint(&blocked.reason, Tone::Bad), blocked.excluded_by);
                return Ok(Exit::Refused);
            }
            if answer.steps.is_empty() {
                println!("up to date");
            }
            for (i, step) in answer.steps.iter().enumerate() {
                println!("{}. {} ({})", i + 1, step.tag, type_name(step.package_type));
            }
            Ok(Exit::Ok)
        }
    }
}

pub(super) async fn start_scan(
    cli: &Cli,
    printer: &Printer,
    jukebox: &str,
    filter: &Option<String>,
    repository: &Option<(String, String)>,
    wait: bool,
) -> CliResult<Exit> {
    let body = match repository {
        Some((registry, repository)) => {
            json!({"repository": {"registry": registry, "repository": repository}})
        }
        None => json!({"filter": filter}),
    };
    scan(cli, printer, jukebox, &body, wait).await
}

pub(super) async fn export(cli: &Cli, printer: &Printer, command: &IndexCommand) -> CliResult<Exit> {
    let IndexCommand::Export { jukebox, destination, secret, confirm } = command;
    let confirm = confirmation(confirm.as_deref(), jukebox)?;
    let body = json!({"destination": destination, "secret": secret, "confirm": confirm});
    let done: ExportDone = connect(cli)?.post(&format!("/api/v1/jukeboxes/{jukebox}/exports"), &body).await?;
    if !printer.structured(&done)? {
        println!(
            "{jukebox}: {} packages of {} repositories exported to {destination}: {} files written, {} removed",
            done.packages,
            done.repositories,
            done.written.len(),
            done.removed.len()
        );
    }
    Ok(Exit::Ok)
}

async fn scan(
    cli: &Cli,
    printer: &Printer,
    jukebox: &str,
    body: &serde_json::Value,
    wait: bool,
) -> CliResult<Exit> {
    let client = connect(cli)?;
    let started: ScanStarted = client.post(&format!("/api/v1/jukeboxes/{jukebox}/scans"), body).await?;
    if !wait {
        if !printer.structured(&started)? {
            let joined = if started.joined_existing { " (joined a scan already covering it)" } else { "" };
            println!("scan {} of {jukebox} requested{joined}", started.scan_id);
        }
        return Ok(Exit::Ok);
    }
    let bar = progress_bar(0, &format!("scanning {jukebox}"));
    let mut last: Option<Scan> = None;
    let path = format!("/api/v1/scans/{}/events", started.scan_id);
    client
        .events(reqwest::Method::GET, &path, None, |event, data| {
            if event == "progress"
                && let Ok(scan) = serde_json::from_str::<Scan>(data)
            {
                bar.set_length(u64::from(scan.repositories_total));
                bar.set_position(u64::from(scan.repositories_done));
                last = Some(scan);
            }
        })
        .await?;
    bar.finish_and_clear();
    let scan = match last {
        Some(scan) => scan,
        None => client.get(&format!("/api/v1/scans/{}", started.scan_id)).await?,
    };
    if !printer.structured(&scan)? {
        let state = wire_name(scan.state);
        let tone = if scan.state == ScanState::Succeeded { Tone::Good } else { Tone::Bad };
        let scope = match (&scan.repository, &scan.filter) {
            (Some(r), _) => format!(" ({}/{})", r.registry, r.repository),
            (None, Some(filter)) => format!(" ({filter})"),
            (None, None) => String::new(),
        };
        println!(
            "scan {} of {jukebox}{scope}: {}, {}/{} repositories, {} tags, {} manifests read",
            scan.scan_id,
            printer.paint(&state, tone),
            scan.repositories_done,
            scan.repositories_total,
            scan.tags_seen,
            scan.manifests_read
        );
        for error in &scan.errors {
            println!("  {}: {}", error.repository, error.message);
        }
    }
    Ok(match scan.state {
        ScanState::Succeeded => Exit::Ok,
        _ => Exit::Failed,
    })
}

fn print_catalog(printer: &Printer, items: &[Package]) {
    let mut groups: Vec<(String, Vec<&Package>)> = Vec::new();
    for p in items {
        let key = format!("{}/{} ({}/{})", p.category, p.name, p.registry, p.image);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, list)) => list.push(p),
            None => groups.push((key, vec![p])),
        }
    }
    for (key, revisions) in groups {
        println!("{key}");
        let rows: Vec<Vec<(String, Tone)>> = revisions
            .iter()
            .map(|p| {
                let roles: Vec<String> = p.roles.iter().map(|r| r.description.clone()).collect();
                let seen = p.first_seen.clone().unwrap_or_else(|| "-".into());
                let signature = p.signature.as_ref().map_or("-".to_string(), |s| s.description.clone());
                vec![
                    cell(format!("  {}", p.tag)),
                    cell(type_name(p.package_type)),
                    cell(roles.join(", ")),
                    cell(seen),
                    cell(signature),
                ]
            })
            .collect();
        printer.table(&["  tag", "type", "role", "first seen", "signature"], &rows);
    }
}
