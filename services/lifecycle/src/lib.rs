//! The lifecycle service: the controllers of Tenant, Service and System
//! instances, their agent Jobs, and a gRPC API over what is installed.
//!
//! It replaces upstream's operator for the three instance kinds with the same
//! CRDs and Jobs the upstream agent image runs unchanged (`job`), and decides
//! re-runs by a recorded fingerprint (`plan`). Which revision to install is
//! the catalog's `ResolveInstall` (the rules crate); options, requirements
//! and the fingerprint are `vynil_rules::install`. Kube I/O stays in
//! `controller` and `facts`; `plan` (install) and `uninstall` (deletion, with
//! the `reaper` for `delete-without-package`) are pure. `fanout` re-reconciles
//! the instances of a changed JukeBox at once; `leader` elects one writer
//! among replicas. With `--kubernetes` it runs the controllers; without a
//! cluster (local mode) every RPC answers `FAILED_PRECONDITION` naming why.
//! See `docs/lifecycle.md`.

mod catalog_client;
pub mod children;
mod config;
pub mod confirmation;
pub mod context;
mod controller;
mod executor;
mod facts;
mod fanout;
mod fleet;
mod grpc;
pub mod install_plan;
pub mod instance;
pub mod job;
mod jukeboxes;
mod leader;
mod ledger;
mod metrics;
mod observe;
mod operator;
pub mod reaper;
mod records;
mod scanner_client;
mod script;
mod signatures;
mod slots;
pub mod takeover;
pub mod uninstall_plan;
pub mod upgrades;
mod usage;

use std::{future::Future, sync::Arc, time::Duration};

use vynil_runtime::{Classify, Failure, GrpcServer, RuntimeError, ServedService, Shutdown};

pub use config::{Command, Config};
pub use grpc::LifecycleService;

/// Errors of the lifecycle service.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("configuration: {0}")]
    Config(String),
    /// The catalog, the API server or a registry did not answer: retry, never "gone".
    #[error("{0} (retrying)")]
    Unavailable(String),
    #[error(transparent)]
    Decode(#[from] instance::DecodeError),
    /// A write was accepted but not (yet) seen done.
    #[error("{0} (retrying)")]
    NotDone(String),
    /// The object changed since it was read (`409 Conflict` on a write that
    /// named its `resourceVersion`, e.g. an agent's status write in between):
    /// read again and retry soon, not as an outage.
    #[error("{0} (changed since it was read; retrying)")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    /// A precondition the caller must fix (a stale fingerprint).
    #[error("{0}")]
    Refused(String),
    /// Deletion goes on, or this replica is not the leader: not a failure,
    /// the reconcile comes back after `retry_after`.
    #[error("{why}")]
    Pending { why: String, retry_after: Duration },
    /// An agent Job waits for a free slot (`--max-running-jobs`): not a failure.
    #[error("{0}")]
    Queued(String),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

impl LifecycleError {
    /// The one mapping of a failed call to the API server while `doing`
    /// something: a conflict is read again soon; anything else is
    /// unavailable, retried (never "gone").
    pub(crate) fn kube(doing: impl std::fmt::Display) -> impl FnOnce(kube::Error) -> Self {
        move |e| match e {
            kube::Error::Api(status) if status.is_conflict() => {
                Self::Conflict(format!("Kubernetes API, {doing}: {}", status.message))
            }
            e => Self::Unavailable(format!("Kubernetes API, {doing}: {e}")),
        }
    }

    /// The `error` label of the failure metric (upstream: the error's kind).
    pub fn label(&self) -> String {
        match self {
            LifecycleError::Config(_) => "config",
            LifecycleError::Unavailable(_) => "unavailable",
            LifecycleError::Decode(_) => "decode",
            LifecycleError::NotDone(_) => "notdone",
            LifecycleError::Conflict(_) => "conflict",
            LifecycleError::Invalid(_) => "invalid",
            LifecycleError::NotFound(_) => "notfound",
            LifecycleError::Refused(_) => "refused",
            LifecycleError::Pending { .. } => "pending",
            LifecycleError::Queued(_) => "queued",
            LifecycleError::Runtime(_) => "runtime",
        }
        .into()
    }

    /// When the reconcile is retried.
    pub fn retry_after(&self) -> Duration {
        match self {
            LifecycleError::Pending { retry_after, .. } => *retry_after,
            // Woken when a slot frees, else by the line's safety net (`slots`).
            LifecycleError::Queued(_) => slots::SAFETY_NET,
            LifecycleError::NotDone(_) => Duration::from_secs(5),
            // The change that made the write conflict usually brings the
            // reconcile back sooner, through the watch.
            LifecycleError::Conflict(_) => Duration::from_secs(1),
            LifecycleError::Unavailable(_) => Duration::from_secs(30),
            _ => Duration::from_secs(300),
        }
    }
}

impl Classify for LifecycleError {
    fn failure(&self) -> Failure {
        match self {
            LifecycleError::Unavailable(_)
            | LifecycleError::NotDone(_)
            | LifecycleError::Pending { .. }
            | LifecycleError::Queued(_) => Failure::Transient,
            LifecycleError::Conflict(_) => Failure::Concurrent,
            LifecycleError::Decode(_) | LifecycleError::Config(_) => Failure::Refused,
            LifecycleError::Invalid(_) => Failure::BadInput,
            LifecycleError::NotFound(_) => Failure::Missing,
            LifecycleError::Refused(_) => Failure::Refused,
            LifecycleError::Runtime(e) => e.failure(),
        }
    }
}

/// How long the controllers may take to stop after the shutdown signal.
const CONTROLLER_DRAIN: Duration = Duration::from_secs(10);

/// Binds, runs the controllers (with `--kubernetes`) and serves until
/// `shutdown` resolves, then drains.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), LifecycleError> {
    match config.command {
        Some(Command::Reap(args)) => return reaper::main(args).await,
        Some(Command::Takeover(args)) => return takeover::main(args).await,
        None => {}
    }
    let server = GrpcServer::bind(config.listen).await?;
    run_on(server, config, shutdown).await
}

/// [`run`] on a server the caller bound (on port 0, its address known
/// before anything dials it).
pub async fn run_on(
    server: GrpcServer,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), LifecycleError> {
    if !config.store.kubernetes {
        let service =
            LifecycleService::disabled("no cluster: start with --kubernetes (and --catalog-endpoint)");
        return Ok(serve(server, config, service, shutdown).await?);
    }
    // Replicas are told apart in audit logs by their pod.
    let user_agent = match &config.store.pod_name {
        Some(pod) => format!("{} pod/{pod}", vynil_runtime::user_agent!()),
        None => vynil_runtime::user_agent!().to_string(),
    };
    let client =
        vynil_kube::client(&user_agent).await.map_err(|e| LifecycleError::Unavailable(e.to_string()))?;
    run_with_client(server, config, client, shutdown).await
}

/// [`run_on`] in a cluster, over a client made by the caller.
pub async fn run_with_client(
    server: GrpcServer,
    config: Config,
    client: kube::Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), LifecycleError> {
    let endpoint = config.catalog_endpoint.as_deref().ok_or_else(|| {
        LifecycleError::Config("--kubernetes needs --catalog-endpoint (VYNIL_CATALOG_ENDPOINT)".into())
    })?;
    let shutdown_token = Shutdown::new();
    let stop = shutdown_token.clone();
    let outer = shutdown_token.after(shutdown);
    let namespace = config.namespace.clone().unwrap_or_else(|| client.default_namespace().to_string());
    let (queue, mut woken) = slots::JobQueue::new(config.max_running_jobs);
    let queue = Arc::new(queue);
    let waves = fleet::UnderWaves::default();
    let wakes = (queue.clone(), waves.clone());
    let settings = settings(&config, endpoint, &client, &namespace, &shutdown_token, wakes)?;
    let elected = settings.leader.clone();
    let watched = settings.catalog.clone();
    let controllers: Vec<_> = instance::InstanceKind::ALL
        .into_iter()
        .map(|kind| {
            let concurrency = config.concurrent_reconciles;
            let controller =
                controller::controller(&client, &namespace, kind, queue.clone(), waves.clone(), concurrency);
            let triggers = fanout::triggers(
                watched.clone(),
                controller.store(),
                kind.api_resource(),
                shutdown_token.child(),
            );
            let controller = controller.reconcile_on(triggers);
            let controller = match woken.iter().position(|(k, _)| *k == kind) {
                Some(at) => controller.reconcile_on(woken.swap_remove(at).1),
                None => controller,
            };
            (kind, controller.reconcile_all_on(elected.elected()))
        })
        .collect();
    let (jukeboxes, watching) = jukeboxes::watch(&client, stop.signaled());
    let (namespaces, watching_namespaces) = fleet::watch_namespaces(&client, stop.signaled());
    let stores = facts::Stores {
        tenant: controllers[0].1.store(),
        service: controllers[1].1.store(),
        system: controllers[2].1.store(),
        jukeboxes,
        namespaces,
    };
    let (metrics, exported) = metrics::LifecycleMetrics::register();
    let context = Arc::new(context::Context::new(client, stores.clone(), metrics.clone(), settings));
    let service = LifecycleService::running(context.clone(), exported);
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(watching);
    tasks.spawn(watching_namespaces);
    let recorder = context.clone();
    tasks.spawn(async move {
        // Recorded as soon as may be (`crate::ledger`); else at the first meeting.
        if let Err(error) = recorder.upgrades.taken_over_at().await {
            tracing::warn!(%error, "the takeover time is not recorded yet: the first reconcile records it");
        }
    });
    for (kind, controller) in controllers {
        tasks.spawn(controller::run(controller, kind, context.clone(), stop.signaled()));
    }
    tasks.spawn(queue.ticking(stop.signaled()));
    let served = serve(server, config, service, outer).await;
    stop.trigger();
    // Reconciles in flight may finish; a controller still waiting for its
    // first list (an API server that never answered) is stopped.
    let drained =
        tokio::time::timeout(CONTROLLER_DRAIN, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!("controllers still running after {CONTROLLER_DRAIN:?}: stopped");
        tasks.abort_all();
    }
    Ok(served?)
}

/// What every reconcile shares, as the flags say: the catalog and registry
/// clients, the agent's settings, the leader election.
fn settings(
    config: &Config,
    endpoint: &str,
    client: &kube::Client,
    namespace: &str,
    shutdown: &Shutdown,
    (job_queue, under_waves): (Arc<slots::JobQueue>, fleet::UnderWaves),
) -> Result<context::Settings, LifecycleError> {
    let catalog = catalog_client::Catalog::connect(endpoint)?;
    let scanner = match config.scanner_endpoint.as_deref() {
        Some(endpoint) => {
            let token =
                config.shared.trust.service_token_file.as_deref().map(vynil_runtime::trust::read_token_file);
            let token = token.transpose().map_err(|e| LifecycleError::Config(e.to_string()))?;
            Some(scanner_client::Scanner::connect(endpoint, token.as_deref())?)
        }
        None => None,
    };
    let credentials = vynil_registry::CredentialStore::from_file(config.store.dockerconfig.as_deref())
        .map_err(|e| LifecycleError::Config(e.to_string()))?;
    let registry = vynil_registry::RegistryClient::new(
        config.store.transport(),
        credentials,
        Arc::new(vynil_registry::InMemoryMetadataCache::default()),
    )
    .map_err(|e| LifecycleError::Config(e.to_string()))?;
    Ok(context::Settings {
        namespace: namespace.to_string(),
        catalog,
        scanner,
        registry,
        agent: job::AgentSettings {
            image: config.agent_image.clone(),
            reaper_image: config.reaper_image.clone(),
            service_account: config.agent_account.clone(),
            log_level: config.agent_log_level.clone(),
            tenant_label: config.tenant_label.clone(),
        },
        framework: config.store.vynil_version.clone(),
        scripts: config.store.scripts(),
        max_attempts: config.max_install_attempts,
        rollback: config.rollback_failed_upgrades,
        reruns: install_plan::Reruns {
            recreate_deleted_jobs: config.recreate_deleted_jobs,
            agent_image: config.rerun_on_agent_image_change.then(|| config.agent_image.clone()),
        },
        reporter: kube::runtime::events::Reporter {
            controller: "vynil-lifecycle".into(),
            instance: config.store.pod_name.clone(),
        },
        leader: leader::campaign(
            client.clone(),
            namespace,
            config.store.replica_name("vynil-lifecycle"),
            Duration::from_secs(config.lease_seconds.max(1)),
            shutdown.child(),
        ),
        requeue: Duration::from_secs(config.requeue_seconds.max(1)),
        job_queue,
        under_waves,
    })
}

/// Serves `service` on `server` (local mode passes a disabled one).
pub async fn serve(
    server: GrpcServer,
    config: Config,
    service: LifecycleService,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RuntimeError> {
    let service =
        service.with_trust(vynil_runtime::Trust::from_config(&config.shared.trust, server.local_addr()?)?);
    let server = server.with_metrics(service.exported_metrics());
    server
        .serve(
            vec![ServedService::new(
                vynil_proto::lifecycle::v1::lifecycle_server::LifecycleServer::new(service),
                vynil_proto::FILE_DESCRIPTOR_SET,
            )],
            shutdown,
        )
        .await
}
