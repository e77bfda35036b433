//! Local mode: catalog, scanner, purger, lifecycle and gateway in one
//! process, each serving its real API on its own loopback port and calling
//! the others over gRPC, as they would as separate deployments.
//!
//! JukeBoxes are YAML files in `--jukebox-dir`; their status lives in one
//! local store shared by the services: in process memory (the embedded
//! default: nothing to install) or in Redis with `--redis-url`. There is no
//! cluster, so the lifecycle answers every call with "disabled: no cluster"
//! and the purger plans with usage unknown.

use std::{
    future::Future,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

mod example;
mod first_scans;

use clap::Parser;
use tokio::task::JoinSet;
use vynil_runtime::{GrpcServer, SharedConfig, Shutdown};
use vynil_store::{ScannerStore, StoreConfig};

/// Flags of local mode, each with an environment fallback.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "vynil", version, about = "The Vynil control plane in one process, without a cluster")]
/// Any `--*-listen` may name port 0: the system chooses, and the start
/// banner says what each service was given.
pub struct Config {
    #[arg(long, env = "VYNIL_CATALOG_LISTEN", default_value = "127.0.0.1:50051")]
    pub catalog_listen: SocketAddr,
    #[arg(long, env = "VYNIL_SCANNER_LISTEN", default_value = "127.0.0.1:50052")]
    pub scanner_listen: SocketAddr,
    #[arg(long, env = "VYNIL_PURGER_LISTEN", default_value = "127.0.0.1:50053")]
    pub purger_listen: SocketAddr,
    #[arg(long, env = "VYNIL_LIFECYCLE_LISTEN", default_value = "127.0.0.1:50054")]
    pub lifecycle_listen: SocketAddr,
    #[arg(long, env = "VYNIL_GATEWAY_LISTEN", default_value = "127.0.0.1:8080")]
    pub gateway_listen: SocketAddr,
    /// Where the generated admin token (for the gateway) and service token
    /// are written, mode 0600: `$XDG_STATE_HOME/vynil` or `~/.local/state/vynil`.
    #[arg(long, env = "VYNIL_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(flatten)]
    pub shared: SharedConfig,
    #[command(flatten)]
    pub store: StoreConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("local mode reads JukeBox files; for a cluster run each service with --kubernetes")]
    ClusterRequested,
    #[error("cannot open the local store: {0}")]
    Store(#[from] vynil_store::StoreError),
    #[error("{service}: invalid configuration: {error}")]
    Config { service: &'static str, error: String },
    #[error("{service} stopped: {error}")]
    Service { service: &'static str, error: String },
    #[error("cannot write {path}: {source} (set --state-dir to a writable directory)")]
    State { path: PathBuf, source: std::io::Error },
}

/// The state directory: the flag, else `$XDG_STATE_HOME/vynil`, else
/// `~/.local/state/vynil`, else `.vynil`.
fn state_dir(config: &Config) -> PathBuf {
    if let Some(dir) = &config.state_dir {
        return dir.clone();
    }
    let home = |v: &str| std::env::var_os(v).filter(|v| !v.is_empty()).map(PathBuf::from);
    home("XDG_STATE_HOME")
        .map(|d| d.join("vynil"))
        .or_else(|| home("HOME").map(|h| h.join(".local/state/vynil")))
        .unwrap_or_else(|| PathBuf::from(".vynil"))
}

fn write_private(path: &Path, content: &str) -> Result<(), LocalError> {
    vynil_runtime::files::write_private(path, content.as_bytes())
        .map_err(|source| LocalError::State { path: path.to_path_buf(), source })
}

/// The tokens of this run: a new admin token for the gateway and a new
/// service token between the gateway and the services, each in its file.
#[derive(Clone)]
struct Tokens {
    admin_file: PathBuf,
    tokens_file: PathBuf,
    service_file: PathBuf,
}

fn make_tokens(dir: &Path) -> Result<Tokens, LocalError> {
    let random = || {
        vynil_runtime::trust::generate_token()
            .map_err(|source| LocalError::State { path: dir.to_path_buf(), source })
    };
    let (admin, service) = (random()?, random()?);
    let tokens = Tokens {
        admin_file: dir.join("admin-token"),
        tokens_file: dir.join("gateway-tokens.yaml"),
        service_file: dir.join("service-token"),
    };
    write_private(&tokens.admin_file, &format!("{admin}\n"))?;
    let book = vynil_gateway::auth::TokenBook::line("admin", vynil_gateway::auth::Role::Admin, &admin);
    write_private(&tokens.tokens_file, &format!("tokens:\n{book}\n"))?;
    write_private(&tokens.service_file, &format!("{service}\n"))?;
    Ok(tokens)
}

/// A service's own configuration: its defaults and its own environment
/// variables (`args`: more of its flags), which local mode then completes
/// with typed values. A bad value (from a service's own environment
/// variable, say) is an error naming the service, never an exit of the
/// whole process.
fn service_config<C: Parser>(service: &'static str, args: &[&str]) -> Result<C, LocalError> {
    let program = format!("vynil-{service}");
    C::try_parse_from(std::iter::once(program.as_str()).chain(args.iter().copied()))
        .map_err(|e| LocalError::Config { service, error: e.to_string().trim().to_string() })
}

/// Where each service of a bound local mode listens (a port given as 0 is
/// the one the system chose).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses {
    pub catalog: SocketAddr,
    pub scanner: SocketAddr,
    pub purger: SocketAddr,
    pub lifecycle: SocketAddr,
    pub gateway: SocketAddr,
}

/// Local mode with every port bound, before anything is served: what
/// [`bind`] gives and [`Bound::run`] serves.
pub struct Bound {
    shared: SharedConfig,
    store_config: StoreConfig,
    tokens: Tokens,
    catalog: GrpcServer,
    scanner: GrpcServer,
    purger: GrpcServer,
    lifecycle: GrpcServer,
    gateway: vynil_gateway::Gateway,
    addresses: Addresses,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound").field("addresses", &self.addresses).finish_non_exhaustive()
    }
}

/// Runs every service until `shutdown` resolves (or one of them fails, which
/// stops the others).
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), LocalError> {
    bind(config).await?.run(shutdown).await
}

/// Writes the tokens and binds every port. Every port is bound before
/// anything is told where to dial, so any of them may be given as 0.
pub async fn bind(config: Config) -> Result<Bound, LocalError> {
    if config.store.kubernetes {
        return Err(LocalError::ClusterRequested);
    }
    let state = state_dir(&config);
    let tokens = make_tokens(&state)?;
    let mut shared = config.shared.clone();
    let mut store_config = config.store.clone();
    if !store_config.jukebox_dir.exists() {
        let embedded = example::write(&state)?;
        println!(
            "No {} directory: showing the embedded example JukeBox `examples` ({}; its packages are an OCI image layout beside it).",
            store_config.jukebox_dir.display(),
            embedded.join("examples.yaml").display()
        );
        store_config.jukebox_dir = embedded;
    }
    // The services believe the gateway (service token); anyone else on
    // this machine reaching a loopback port is the user, and may run
    // destructive calls. Listening beyond loopback, only the gateway may.
    shared.trust.service_token_file = Some(tokens.service_file.clone());
    let services =
        [config.catalog_listen, config.scanner_listen, config.purger_listen, config.lifecycle_listen];
    shared.trust.allow_unauthenticated = services.iter().all(|a| a.ip().is_loopback());
    if !shared.trust.allow_unauthenticated {
        println!(
            "A service listens beyond loopback: purge executions and deletes without package go through the gateway only."
        );
    }
    let failed = |service: &'static str, e: &dyn std::fmt::Display| LocalError::Service {
        service,
        error: e.to_string(),
    };
    let bind = |service: &'static str, addr: SocketAddr| async move {
        let server = GrpcServer::bind(addr).await.map_err(|e| failed(service, &e))?;
        let bound = server.local_addr().map_err(|e| failed(service, &e))?;
        Ok::<_, LocalError>((server, bound))
    };
    let (catalog, catalog_at) = bind("catalog", config.catalog_listen).await?;
    let (scanner, scanner_at) = bind("scanner", config.scanner_listen).await?;
    let (purger, purger_at) = bind("purger", config.purger_listen).await?;
    let (lifecycle, lifecycle_at) = bind("lifecycle", config.lifecycle_listen).await?;
    let endpoint = |addr: SocketAddr| Some(format!("http://{addr}"));
    let mut gateway: vynil_gateway::Config = service_config("gateway", &[])?;
    gateway.listen = config.gateway_listen;
    gateway.catalog_endpoint = endpoint(catalog_at);
    gateway.scanner_endpoint = endpoint(scanner_at);
    gateway.purger_endpoint = endpoint(purger_at);
    gateway.lifecycle_endpoint = endpoint(lifecycle_at);
    gateway.tokens_file = Some(tokens.tokens_file.clone());
    gateway.service_token_file = Some(tokens.service_file.clone());
    let gateway = vynil_gateway::Gateway::bind(&gateway).await.map_err(|e| failed("gateway", &e))?;
    let gateway_at = gateway.local_addr().map_err(|e| failed("gateway", &e))?;
    let addresses = Addresses {
        catalog: catalog_at,
        scanner: scanner_at,
        purger: purger_at,
        lifecycle: lifecycle_at,
        gateway: gateway_at,
    };
    Ok(Bound { shared, store_config, tokens, catalog, scanner, purger, lifecycle, gateway, addresses })
}

impl Bound {
    pub fn addresses(&self) -> Addresses {
        self.addresses
    }

    /// Serves every service until `shutdown` resolves (or one of them
    /// fails, which stops the others).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), LocalError> {
        let store =
            vynil_store::open(&self.store_config.store_settings(vynil_runtime::user_agent!())).await?;
        let drain = vynil_runtime::Shutdown::new();
        let at = self.addresses;
        let (tokens, jukeboxes) = (self.tokens.clone(), self.store_config.jukebox_dir.clone());
        let mut services = self.spawn(&store, &drain)?;
        announce(at, &tokens, &jukeboxes);
        let url = format!("http://{}", at.gateway);
        services.spawn(first_scans::run(store, at.scanner, url, tokens.admin_file, drain.signaled()));
        until_stopped(services, shutdown, drain).await
    }

    /// Spawns every service, each with its own configuration completed by
    /// local mode's shared flags, over the one `store`.
    fn spawn(self, store: &Arc<dyn ScannerStore>, drain: &Shutdown) -> Result<Running, LocalError> {
        let Self {
            shared, store_config, catalog, scanner, purger, lifecycle, gateway, addresses: at, ..
        } = self;
        let mut services = Running::new();
        macro_rules! configured {
            ($config:ty, $service:literal, $at:expr) => {{
                let mut config: $config = service_config($service, &[])?;
                config.listen = $at;
                config.shared = shared.clone();
                config.store = store_config.clone();
                config
            }};
        }
        let config = configured!(vynil_catalog::Config, "catalog", at.catalog);
        let served = vynil_catalog::run_with_store(catalog, config, store.clone(), drain.signaled());
        services.spawn(async move { ("catalog", served.await.map_err(|e| e.to_string())) });
        let config = configured!(vynil_scanner::Config, "scanner", at.scanner);
        let served = vynil_scanner::run_with_store(scanner, config, store.clone(), drain.signaled());
        services.spawn(async move { ("scanner", served.await.map_err(|e| e.to_string())) });
        let mut config = configured!(vynil_purger::Config, "purger", at.purger);
        config.lifecycle_endpoint = vec![format!("http://{}", at.lifecycle)];
        let served = vynil_purger::run_with_store(purger, config, store.clone(), drain.signaled());
        services.spawn(async move { ("purger", served.await.map_err(|e| e.to_string())) });
        let config = configured!(vynil_lifecycle::Config, "lifecycle", at.lifecycle);
        let disabled = vynil_lifecycle::LifecycleService::disabled("no cluster (local mode)");
        let served = vynil_lifecycle::serve(lifecycle, config, disabled, drain.signaled());
        services.spawn(async move { ("lifecycle", served.await.map_err(|e| e.to_string())) });
        let served = gateway.serve(drain.signaled());
        services.spawn(async move { ("gateway", served.await.map_err(|e| e.to_string())) });
        Ok(services)
    }
}

/// The tasks of a running local mode: each ends with its service's name.
type Running = JoinSet<(&'static str, Result<(), String>)>;

/// Says where everything is: in the log, and on the terminal for the user.
fn announce(at: Addresses, tokens: &Tokens, jukeboxes: &Path) {
    tracing::info!(
        catalog = %at.catalog,
        scanner = %at.scanner,
        purger = %at.purger,
        lifecycle = %at.lifecycle,
        gateway = %at.gateway,
        jukeboxes = %jukeboxes.display(),
        "local mode: starting every service"
    );
    let url = format!("http://{}", at.gateway);
    let admin = tokens.admin_file.display().to_string();
    println!(
        "Vynil is starting.\n  gateway:     {url}\n  services:    catalog {}, scanner {}, purger {}, lifecycle {} (gRPC)\n  admin token: {admin} (mode 0600; a new one each start)\n  try:         curl -H \"Authorization: Bearer $(cat {admin})\" {url}/api/v1/jukeboxes",
        at.catalog, at.scanner, at.purger, at.lifecycle
    );
}

/// Waits for `shutdown` or the first service to end, stops the others, and
/// answers the first failure.
async fn until_stopped(
    mut services: Running,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Shutdown,
) -> Result<(), LocalError> {
    tokio::pin!(shutdown);
    let mut failure = None;
    tokio::select! {
        _ = &mut shutdown => {}
        Some(ended) = services.join_next() => failure = Some(ended),
    }
    drain.trigger();
    let mut first_error = None;
    let mut record = |ended: Result<(&'static str, Result<(), String>), tokio::task::JoinError>| {
        let error = match ended {
            Ok((_, Ok(()))) => return,
            Ok((service, Err(error))) => LocalError::Service { service, error },
            Err(error) => LocalError::Service { service: "a service task", error: error.to_string() },
        };
        tracing::error!(%error, "local mode is stopping");
        first_error.get_or_insert(error);
    };
    if let Some(ended) = failure {
        record(ended);
    }
    while let Some(ended) = services.join_next().await {
        record(ended);
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_service_flag_is_an_error_naming_the_service_not_an_exit() {
        let extra = ["--repository-concurrency", "many"];
        let error = service_config::<vynil_scanner::Config>("scanner", &extra).unwrap_err();
        let text = error.to_string();
        assert!(text.starts_with("scanner: invalid configuration"), "{text}");
        assert!(text.contains("many") && text.contains("--repository-concurrency"), "{text}");
    }
}
