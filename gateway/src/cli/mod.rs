//! `vynilctl`: the command line for operators and scripts, talking only to
//! the gateway's public API (the same answers the OpenAPI document
//! describes; `-o json` prints them unchanged).
//!
//! Exit codes: 0 ok, 1 failed, 2 usage (or bad input), 3 refused or blocked,
//! 4 unreachable.

pub mod client;
pub mod config;
pub mod output;

use std::{io::IsTerminal, path::PathBuf};

use clap::{CommandFactory, Parser, Subcommand};
use serde_json::json;

use self::{
    client::{CliError, CliResult, Client, Exit},
    output::{Format, Printer, Tone, cell},
};
use crate::api::{
    catalog::{CatalogPage, JukeboxList, Package, PackageType, UpgradePath},
    instances::{Explanation, Instance, InstanceList, InstanceState},
    purge::{DeletionOutcome, DeletionState, Plan, Report},
    scans::{ExportDone, Scan, ScanStarted, ScanState},
    session::{Version, WhoAmI},
};

#[derive(Debug, Parser)]
#[command(
    name = "vynilctl",
    version,
    about = "The command line of the Vynil control plane (through its gateway)"
)]
#[command(
    after_help = "Exit codes: 0 ok, 1 failed, 2 usage or bad input, 3 refused or blocked, 4 unreachable."
)]
pub struct Cli {
    /// The gateway, e.g. http://127.0.0.1:8080 (else the context's).
    #[arg(long, env = "VYNIL_URL", global = true)]
    pub url: Option<String>,
    /// A bearer token (else the context's).
    #[arg(long, env = "VYNIL_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// A context of the config file (else its current one).
    #[arg(long, env = "VYNIL_CONTEXT", global = true)]
    pub context: Option<String>,
    /// The config file (default: ~/.config/vynil/vynilctl.yaml).
    #[arg(long, env = "VYNILCTL_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// Output: aligned tables, or the API's JSON or YAML for scripts.
    #[arg(short, long, value_enum, default_value = "table", global = true)]
    pub output: Format,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Stores a gateway URL and token (read from --token, VYNIL_TOKEN or stdin) in a context.
    Login {
        /// The context to write (default: "default").
        #[arg(long = "name", default_value = "default")]
        name: String,
    },
    /// Client and server versions.
    Version,
    /// JukeBoxes.
    #[command(subcommand)]
    Jukebox(JukeboxCommand),
    /// Catalogs: each revision with its type and role.
    #[command(subcommand)]
    Catalog(CatalogCommand),
    /// Starts a scan of a JukeBox (full, partial with `<category>[/<name>]`,
    /// or of one repository with `--repository`).
    Scan {
        jukebox: String,
        filter: Option<String>,
        /// Only this `<registry>/<repository>` of the JukeBox's source (what a
        /// registry push triggers): only its entries are replaced.
        #[arg(long, value_parser = parse_repository, conflicts_with = "filter")]
        repository: Option<(String, String)>,
        /// Follow the scan to its end, with a progress bar on a terminal.
        #[arg(long)]
        wait: bool,
    },
    /// Registry retention: plan, execute, report.
    #[command(subcommand)]
    Purge(PurgeCommand),
    /// Package indexes: a JukeBox's catalog written as an index.
    #[command(subcommand)]
    Index(IndexCommand),
    /// Instances: state, explanation, the delete-without-package escape hatch.
    #[command(subcommand)]
    Instance(InstanceCommand),
    /// Prints a shell completion script.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum JukeboxCommand {
    /// Every JukeBox with its package count and last change.
    List,
}

#[derive(Debug, Subcommand)]
pub enum CatalogCommand {
    /// The revisions of a JukeBox, grouped per package.
    Show {
        jukebox: String,
        #[arg(long)]
        category: Option<String>,
        #[arg(long)]
        name: Option<String>,
        #[arg(long = "type", value_parser = parse_type)]
        package_type: Option<PackageType>,
    },
    /// The revisions an instance installs in turn from `--from` (or fresh).
    Path {
        jukebox: String,
        /// `<category>/<name>`.
        package: String,
        #[arg(long = "type", value_parser = parse_type)]
        package_type: PackageType,
        #[arg(long)]
        from: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum IndexCommand {
    /// Writes the JukeBox's index (`index.yaml` and its package files) at a
    /// destination the scanner allows, replacing the one there; asks for the
    /// JukeBox's name on a terminal when --confirm is absent.
    Export {
        jukebox: String,
        /// `s3://<bucket>[/<prefix>]`, `http(s)://…` or a directory.
        #[arg(long = "to")]
        destination: String,
        /// A Secret (labelled for exports) with the destination's credentials.
        #[arg(long)]
        secret: Option<String>,
        /// The JukeBox's name, typed exactly.
        #[arg(long)]
        confirm: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum PurgeCommand {
    /// A plan for a JukeBox (`jukebox/<name>` or `<name>`) or a repository (`<registry>/<repository>`).
    Plan { target: String },
    /// Executes a plan; asks for its target on a terminal when --confirm is absent.
    Execute {
        plan: String,
        /// The plan's target, typed exactly.
        #[arg(long)]
        confirm: Option<String>,
        /// Execute although installed revisions could not be obtained.
        #[arg(long)]
        acknowledge_usage_unknown: bool,
    },
    /// The verified report of an execution.
    Report { plan: String },
}

#[derive(Debug, Subcommand)]
pub enum InstanceCommand {
    /// Instances with their state and blocking reason.
    List {
        #[arg(long)]
        kind: Option<String>,
        #[arg(long)]
        namespace: Option<String>,
        #[arg(long)]
        jukebox: Option<String>,
    },
    /// Why an instance is where it is (`<kind>/<namespace>/<name>`); exit 3 when blocked.
    Explain { instance: String },
    /// Allows deleting an instance's recorded children without package hooks.
    AllowDeleteWithoutPackage {
        instance: String,
        /// `<kind>/<namespace>/<name>` again, typed exactly.
        #[arg(long)]
        confirm: Option<String>,
        #[arg(long, default_value = "")]
        reason: String,
    },
}

fn parse_repository(value: &str) -> Result<(String, String), String> {
    match value.split_once('/') {
        Some((registry, repository)) if !registry.is_empty() && !repository.is_empty() => {
            Ok((registry.to_string(), repository.to_string()))
        }
        _ => Err(format!("{value:?} is not <registry>/<repository> (e.g. registry.example:5000/apps/web)")),
    }
}

fn parse_type(value: &str) -> Result<PackageType, String> {
    match value {
        "tenant" => Ok(PackageType::Tenant),
        "service" => Ok(PackageType::Service),
        "system" => Ok(PackageType::System),
        other => Err(format!("{other:?} is not tenant, service or system")),
    }
}

fn type_name(t: Option<PackageType>) -> &'static str {
    match t {
        Some(PackageType::Tenant) => "tenant",
        Some(PackageType::Service) => "service",
        Some(PackageType::System) => "system",
        None => "-",
    }
}

/// Runs the command line; returns the exit code.
pub async fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { Exit::Usage as i32 } else { Exit::Ok as i32 };
        }
    };
    match run(cli).await {
        Ok(exit) => exit as i32,
        Err(error) => {
            eprintln!("error: {error}");
            error.exit as i32
        }
    }
}

/// The gateway and token the flags, environment and config file name.
fn connect(cli: &Cli) -> CliResult<Client> {
    let file = config::load(config::path(cli.config.as_ref()).as_ref())?;
    let name = cli.context.clone().or(file.current.clone());
    let context = name.as_ref().and_then(|n| file.contexts.get(n));
    if let (Some(name), None, Some(_)) = (&name, context, &cli.context) {
        return Err(CliError::new(
            Exit::Usage,
            format!("no context {name:?} in the config file: `vynilctl login --name {name}`"),
        ));
    }
    let url = cli.url.clone().or(context.map(|c| c.url.clone())).ok_or_else(|| {
        CliError::new(
            Exit::Usage,
            "no gateway: pass --url, set VYNIL_URL, or `vynilctl login --url <gateway>`",
        )
    })?;
    let token = cli.token.clone().or(context.and_then(|c| c.token.clone()));
    Client::new(&url, token)
}

pub async fn run(cli: Cli) -> CliResult<Exit> {
    let printer = Printer::new(cli.output);
    match &cli.command {
        Command::Completion { shell } => {
            clap_complete::generate(*shell, &mut Cli::command(), "vynilctl", &mut std::io::stdout());
            Ok(Exit::Ok)
        }
        Command::Login { name } => login(&cli, name).await,
        Command::Version => {
            let client = connect(&cli)?;
            let server: Version = client.get("/api/v1/version").await?;
            let versions = json!({"client": env!("CARGO_PKG_VERSION"), "server": server});
            if !printer.structured(&versions)? {
                println!(
                    "client: {}\nserver: {} (API {}) at {}",
                    env!("CARGO_PKG_VERSION"),
                    server.gateway,
                    server.api,
                    client.url()
                );
            }
            Ok(Exit::Ok)
        }
        Command::Jukebox(JukeboxCommand::List) => {
            let list: JukeboxList = connect(&cli)?.get_all("/api/v1/jukeboxes?").await?;
            if !printer.structured(&list)? {
                let rows = list
                    .items
                    .iter()
                    .map(|j| {
                        let updated = j.conditions.iter().find(|c| c.condition_type == "Updated");
                        let state = updated.map(|c| {
                            (c.status.clone(), if c.status == "True" { Tone::Good } else { Tone::Bad })
                        });
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
        Command::Catalog(CatalogCommand::Show { jukebox, category, name, package_type }) => {
            let mut query = Vec::new();
            query.extend(category.as_ref().map(|c| format!("category={c}")));
            query.extend(name.as_ref().map(|n| format!("name={n}")));
            query.extend(package_type.map(|t| format!("type={}", type_name(Some(t)))));
            let path = format!("/api/v1/jukeboxes/{jukebox}/catalog?{}", query.join("&"));
            let page: CatalogPage = connect(&cli)?.get_all(&path).await?;
            if !printer.structured(&page)? {
                print_catalog(&printer, &page.items);
            }
            Ok(Exit::Ok)
        }
        Command::Catalog(CatalogCommand::Path { jukebox, package, package_type, from }) => {
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
            let answer: UpgradePath = connect(&cli)?.get(&path).await?;
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
        Command::Scan { jukebox, filter, repository, wait } => {
            let body = match repository {
                Some((registry, repository)) => {
                    json!({"repository": {"registry": registry, "repository": repository}})
                }
                None => json!({"filter": filter}),
            };
            scan(&cli, &printer, jukebox, &body, *wait).await
        }
        Command::Purge(PurgeCommand::Plan { target }) => {
            let body = match target.strip_prefix("jukebox/") {
                Some(name) => json!({"jukebox": name}),
                None if !target.contains('/') => json!({"jukebox": target}),
                None => {
                    let (registry, repository) = target.split_once('/').unwrap_or_default();
                    json!({"repository": {"registry": registry, "repository": repository}})
                }
            };
            let plan: Plan = connect(&cli)?.post("/api/v1/purge/plans", &body).await?;
            if !printer.structured(&plan)? {
                print_plan(&printer, &plan);
            }
            Ok(Exit::Ok)
        }
        Command::Index(IndexCommand::Export { jukebox, destination, secret, confirm }) => {
            let confirm = confirmation(confirm.as_deref(), jukebox)?;
            let body = json!({"destination": destination, "secret": secret, "confirm": confirm});
            let done: ExportDone =
                connect(&cli)?.post(&format!("/api/v1/jukeboxes/{jukebox}/exports"), &body).await?;
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
        Command::Purge(PurgeCommand::Execute { plan, confirm, acknowledge_usage_unknown }) => {
            execute(&cli, &printer, plan, confirm.as_deref(), *acknowledge_usage_unknown).await
        }
        Command::Purge(PurgeCommand::Report { plan }) => {
            let report: Report = connect(&cli)?.get(&format!("/api/v1/purge/plans/{plan}/report")).await?;
            if !printer.structured(&report)? {
                print_report(&printer, &report);
            }
            Ok(report_exit(&report))
        }
        Command::Instance(InstanceCommand::List { kind, namespace, jukebox }) => {
            let mut query = Vec::new();
            query.extend(kind.as_ref().map(|v| format!("kind={v}")));
            query.extend(namespace.as_ref().map(|v| format!("namespace={v}")));
            query.extend(jukebox.as_ref().map(|v| format!("jukebox={v}")));
            let list: InstanceList =
                connect(&cli)?.get_all(&format!("/api/v1/instances?{}", query.join("&"))).await?;
            if !printer.structured(&list)? {
                let rows: Vec<Vec<(String, Tone)>> = list.items.iter().map(instance_row).collect();
                printer.table(&["instance", "package", "tag", "state", "blocked by"], &rows);
            }
            Ok(Exit::Ok)
        }
        Command::Instance(InstanceCommand::Explain { instance }) => {
            let path = format!("/api/v1/instances/{}/explain", instance_path(instance)?);
            let explained: Explanation = connect(&cli)?.get(&path).await?;
            if !printer.structured(&explained)? {
                print_explanation(&printer, &explained);
            }
            Ok(if explained.blocked.is_some() { Exit::Refused } else { Exit::Ok })
        }
        Command::Instance(InstanceCommand::AllowDeleteWithoutPackage { instance, confirm, reason }) => {
            let reference = instance_path(instance)?;
            let client = connect(&cli)?;
            let explained: Explanation =
                client.get(&format!("/api/v1/instances/{reference}/explain")).await?;
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
            let body =
                json!({"confirm": confirm, "fingerprint": explained.children_fingerprint, "reason": reason});
            let done: serde_json::Value = client
                .post(&format!("/api/v1/instances/{reference}/allow-delete-without-package"), &body)
                .await?;
            if !printer.structured(&done)? {
                println!("{reference}: delete without package allowed; lifecycle starts the reaper");
            }
            Ok(Exit::Ok)
        }
    }
}

async fn login(cli: &Cli, name: &str) -> CliResult<Exit> {
    let path = config::path(cli.config.as_ref())
        .ok_or_else(|| CliError::new(Exit::Usage, "no config directory (HOME is unset): pass --config"))?;
    let mut file = config::load(Some(&path))?;
    let url = cli
        .url
        .clone()
        .or(file.contexts.get(name).map(|c| c.url.clone()))
        .ok_or_else(|| CliError::new(Exit::Usage, "pass --url <gateway> (or VYNIL_URL)"))?;
    let token = match &cli.token {
        Some(token) => token.clone(),
        None => {
            if std::io::stdin().is_terminal() {
                eprint!("token for {url}: ");
            }
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map_err(|e| CliError::new(Exit::Usage, e.to_string()))?;
            line.trim().to_string()
        }
    };
    if token.is_empty() {
        return Err(CliError::new(Exit::Usage, "no token given (--token, VYNIL_TOKEN or stdin)"));
    }
    let who: WhoAmI = Client::new(&url, Some(token.clone()))?.get("/api/v1/whoami").await?;
    file.contexts.insert(name.to_string(), config::Context { url: url.clone(), token: Some(token) });
    file.current = Some(name.to_string());
    config::save(&path, &file)?;
    let role = who.role.map(|r| r.as_str().to_string()).unwrap_or_else(|| "Kubernetes RBAC".into());
    println!("logged in to {url} as {} ({role}); context {name:?} saved in {}", who.name, path.display());
    Ok(Exit::Ok)
}

/// The confirmation of a destructive command: `--confirm`, else typed on a
/// terminal; refused without one.
fn confirmation(given: Option<&str>, target: &str) -> CliResult<String> {
    if let Some(given) = given {
        return Ok(given.to_string());
    }
    if !std::io::stdin().is_terminal() {
        return Err(CliError::new(
            Exit::Refused,
            format!("refused: pass --confirm {target} (no terminal to ask on)"),
        ));
    }
    eprint!("type {target} to confirm: ");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).map_err(|e| CliError::new(Exit::Usage, e.to_string()))?;
    Ok(line.trim().to_string())
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

fn progress_bar(total: u64, what: &str) -> indicatif::ProgressBar {
    let bar = if std::io::stderr().is_terminal() {
        indicatif::ProgressBar::new(total)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let style = indicatif::ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len}")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style.progress_chars("=> "));
    bar.set_message(what.to_string());
    bar
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
                vec![cell(format!("  {}", p.tag)), cell(type_name(p.package_type)), cell(roles.join(", "))]
            })
            .collect();
        printer.table(&["  tag", "type", "role"], &rows);
    }
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

/// An enum as the API writes it (`up_to_date`, `partially_failed`).
fn wire_name(value: impl serde::Serialize) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
}

fn print_explanation(printer: &Printer, e: &Explanation) {
    let state = wire_name(e.state);
    println!("{}: {}", printer.paint(&state, state_tone(e.state)), e.summary);
    for detail in &e.details {
        println!("  {detail}");
    }
    if let Some(blocked) = &e.blocked {
        let code = blocked.code.as_ref().map(|c| format!("[{c}] ")).unwrap_or_default();
        println!("blocked by {}: {code}{}", blocked.criterion, printer.paint(&blocked.reason, Tone::Bad));
    }
    let tags = [("installed", &e.from_tag), ("next", &e.to_tag), ("latest", &e.latest_tag)];
    let known: Vec<String> =
        tags.iter().filter_map(|(what, tag)| tag.as_ref().map(|t| format!("{what} {t}"))).collect();
    if !known.is_empty() {
        println!("{}", known.join(", "));
    }
    if !e.children_to_delete.is_empty() {
        println!("a delete without package would delete: {}", e.children_to_delete.join("; "));
    }
}
