//! The purger: type-aware, usage-aware registry retention (upstream #12 A).
//!
//! `Plan` reads a repository and asks the rules crate what to keep — exactly
//! the rules the scanner uses, so a purge never deletes what any consumer
//! could be shown — plus what lifecycle says instances use. `Execute` deletes
//! only after a confirmation naming the target and the plan's fingerprint,
//! refuses a stale plan, and reports only deletions it verified. Registry
//! space returns after the registry's own garbage collection: deleted
//! manifests are "eligible for garbage collection" (see `docs/purger.md`).

mod config;
mod executor;
mod grpc;
mod metrics;
mod plan_store;
mod planner;
mod purger;
mod schedule;

use std::{future::Future, sync::Arc};

use vynil_proto::purger::v1::purger_server::PurgerServer;
use vynil_runtime::{GrpcServer, ServedService, Shutdown};

pub use config::{Config, RetentionFile};
pub use grpc::PurgerService;
pub use plan_store::{
    DeletionState, MemoryStore, PlanStore, RedisStore, ReportState, RepositoryPlan, StoredOutcome,
    StoredPlan, StoredReport,
};
pub use planner::{assemble, plan_repository};
pub use purger::{LeasedPlan, Purger};
use vynil_store::JukeboxStore;

/// Errors of the purger, mapped to gRPC codes in one place (`grpc.rs`).
#[derive(Debug, thiserror::Error)]
pub enum PurgerError {
    #[error("{0}")]
    Config(String),
    #[error("store unavailable: {0}; retry when it is back")]
    Store(String),
    #[error(transparent)]
    Registry(#[from] vynil_registry::RegistryError),
    #[error(transparent)]
    Rules(#[from] vynil_rules::RulesError),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("refused: {0}")]
    Refused(String),
    #[error("refused: the repository changed since planning ({}); make a new plan", .0.join("; "))]
    Stale(Vec<String>),
    #[error("refused: {0} is excluded from purges by the retention config")]
    Excluded(String),
    #[error("{0}")]
    Busy(String),
    #[error("the execution lease on {0} was lost to another replica; this execution stopped")]
    LeaseLost(String),
    /// A record the shared state lost (`vynil_store::epoch`).
    #[error("{0}")]
    Lost(String),
    #[error("the status of {0} changed concurrently; retry")]
    Conflict(String),
    #[error(transparent)]
    Serve(#[from] vynil_runtime::RuntimeError),
}

impl From<vynil_store::lease::LeaseError> for PurgerError {
    fn from(error: vynil_store::lease::LeaseError) -> Self {
        match error {
            vynil_store::lease::LeaseError::Lost(what) => PurgerError::LeaseLost(what),
            vynil_store::lease::LeaseError::Store(store) => store.into(),
        }
    }
}

impl From<vynil_store::StoreError> for PurgerError {
    fn from(error: vynil_store::StoreError) -> Self {
        match error {
            vynil_store::StoreError::Config(why) => PurgerError::Config(why),
            vynil_store::StoreError::SecretRefused(refused) => PurgerError::Config(refused.to_string()),
            vynil_store::StoreError::Conflict(name) => PurgerError::Conflict(name),
            vynil_store::StoreError::Lost(what) => PurgerError::Lost(what),
            vynil_store::StoreError::Unavailable(why) => PurgerError::Store(why),
        }
    }
}

/// Binds, serves until `shutdown` resolves, then drains.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send) -> Result<(), PurgerError> {
    let server = GrpcServer::bind(config.listen).await?;
    run_on(server, config, shutdown).await
}

/// [`run`] on a server the caller bound (on port 0, its address known
/// before anything dials it).
pub async fn run_on(
    server: GrpcServer,
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), PurgerError> {
    let purger = Purger::from_config(&config).await?;
    serve(server, config, purger, shutdown).await
}

/// [`run_on`] over a JukeBox store opened by the caller.
pub async fn run_with_store(
    server: GrpcServer,
    config: Config,
    jukeboxes: Arc<dyn JukeboxStore>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), PurgerError> {
    let purger = Purger::from_config_with_store(&config, jukeboxes).await?;
    serve(server, config, purger, shutdown).await
}

async fn serve(
    server: GrpcServer,
    config: Config,
    purger: Purger,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), PurgerError> {
    let trust = vynil_runtime::Trust::from_config(&config.shared.trust, server.local_addr()?)
        .map_err(|e| PurgerError::Config(e.to_string()))?;
    let purger = Arc::new(purger);
    let server =
        server.with_metrics(purger.exported_metrics.clone()).with_redis_primary(config.store.redis_health());
    let drain = Shutdown::new();
    let scheduler = tokio::spawn(schedule::run_all(purger.clone(), drain.clone()));
    let service = ServedService::new(
        PurgerServer::new(PurgerService::new(purger, trust)),
        vynil_proto::FILE_DESCRIPTOR_SET,
    );
    let served = server.serve(vec![service], drain.after(shutdown)).await;
    drain.trigger();
    let _ = scheduler.await;
    served?;
    Ok(())
}
