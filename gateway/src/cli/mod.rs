//! `vynilctl`: the command line for operators and scripts, talking only to
//! the gateway's public API (the same answers the OpenAPI document
//! describes; `-o json` prints them unchanged).
//!
//! Exit codes: 0 ok, 1 failed, 2 usage (or bad input), 3 refused or blocked,
//! 4 unreachable.
//!
//! This module holds the flags, the dispatch and what every area shares
//! (connecting, confirming, progress); each area's commands live in their
//! own module, as the API's routes do: `jukeboxes` (jukebox, catalog, scan,
//! index), `purge` and `instances`.

pub mod client;
pub mod config;
mod instances;
mod jukeboxes;
pub mod output;
mod purge;

use std::{io::IsTerminal, path::PathBuf};

use clap::{CommandFactory, Parser, Subcommand};
use serde_json::json;

use self::{
    client::{CliError, CliResult, Client, Exit},
    output::{Format, Printer},
};
use crate::api::{
    catalog::PackageType,
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
    /// Recalls a revision for the JukeBox's instances: none installs or
    /// upgrades to it; those running it keep it (or, with --move-away, move
    /// to the newest selectable revision).
    Recall {
        jukebox: String,
        tag: String,
        /// Why: shown with the revision in the catalog and in Explain.
        #[arg(long)]
        reason: String,
        #[arg(long)]
        move_away: bool,
    },
    /// Lifts the recall of a revision.
    LiftRecall { jukebox: String, tag: String },
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
    /// Rolls a failed upgrade back to the revision the instance ran (one
    /// that holds `[E_UPGRADE_FAILED]`: its failed run applied something).
    Rollback {
        instance: String,
        /// The quarantined tag; the one failed upgrade awaiting an operator when absent.
        #[arg(long)]
        tag: Option<String>,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Approves the upgrade awaiting approval: shows the step (from → to,
    /// options hash, fingerprint) and approves exactly it.
    Approve {
        instance: String,
        /// The step's fingerprint as reviewed; the one pending now when absent (shown first).
        #[arg(long)]
        fingerprint: Option<String>,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Lifts the quarantine of a revision for one instance: it may be
    /// installed again (with fresh attempts).
    ClearQuarantine {
        instance: String,
        /// The quarantined tag; the one failed upgrade awaiting an operator when absent.
        #[arg(long)]
        tag: Option<String>,
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
    let printer = &printer;
    match &cli.command {
        Command::Completion { shell } => {
            clap_complete::generate(*shell, &mut Cli::command(), "vynilctl", &mut std::io::stdout());
            Ok(Exit::Ok)
        }
        Command::Login { name } => login(&cli, name).await,
        Command::Version => version(&cli, printer).await,
        Command::Jukebox(JukeboxCommand::List) => jukeboxes::list(&cli, printer).await,
        Command::Jukebox(command) => jukeboxes::recall(&cli, printer, command).await,
        Command::Catalog(command) => jukeboxes::catalog(&cli, printer, command).await,
        Command::Scan { jukebox, filter, repository, wait } => {
            jukeboxes::start_scan(&cli, printer, jukebox, filter, repository, *wait).await
        }
        Command::Index(command) => jukeboxes::export(&cli, printer, command).await,
        Command::Purge(command) => purge::run(&cli, printer, command).await,
        Command::Instance(command) => instances::run(&cli, printer, command).await,
    }
}

async fn version(cli: &Cli, printer: &Printer) -> CliResult<Exit> {
    let client = connect(cli)?;
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

/// An enum as the API writes it (`up_to_date`, `partially_failed`).
fn wire_name(value: impl serde::Serialize) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
}
