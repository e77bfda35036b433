//! The lifecycle service: the controllers of Tenant, Service and System instances, and their agent Jobs.
//!
//! This crate is the library behind the `vynil-lifecycle` binary: its configuration
//! and its gRPC server. RPCs not implemented yet answer `UNIMPLEMENTED`.

mod metrics;

use std::{future::Future, net::SocketAddr};

use tonic::{Request, Response, Status};
use vynil_proto::lifecycle::v1::{
    AllowDeleteWithoutPackageRequest, AllowDeleteWithoutPackageResponse, ExplainRequest, ExplainResponse,
    ListInstalledRevisionsRequest, ListInstalledRevisionsResponse, ListInstancesRequest,
    ListInstancesResponse,
    lifecycle_server::{Lifecycle, LifecycleServer},
};
use vynil_runtime::{GrpcServer, RuntimeError, ServedService};

/// Configuration of the lifecycle service: flags, each with an environment fallback.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "vynil-lifecycle",
    version,
    about = "the controllers of Tenant, Service and System instances, and their agent Jobs."
)]
pub struct Config {
    /// Address the gRPC server listens on.
    #[arg(long, env = "VYNIL_LIFECYCLE_LISTEN", default_value = "0.0.0.0:50054")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub log: vynil_runtime::LogConfig,
}

/// The gRPC service. With `disabled` (local mode: "no cluster") every RPC
/// answers `FAILED_PRECONDITION` naming why; otherwise each still answers
/// `UNIMPLEMENTED`.
#[derive(Debug)]
pub struct LifecycleService {
    disabled: Option<String>,
    metrics: metrics::LifecycleMetrics,
    /// What `GET /metrics` serves.
    exported_metrics: std::sync::Arc<vynil_runtime::metrics::Registry>,
}

impl Default for LifecycleService {
    fn default() -> Self {
        let (metrics, exported_metrics) = metrics::LifecycleMetrics::register();
        Self { disabled: None, metrics, exported_metrics }
    }
}

impl LifecycleService {
    /// Every RPC answers `FAILED_PRECONDITION` naming `why` (local mode: no cluster).
    pub fn disabled(why: impl Into<String>) -> Self {
        Self { disabled: Some(why.into()), ..Self::default() }
    }

    fn refuse<T>(&self, rpc: &str) -> Result<Response<T>, Status> {
        let status = match &self.disabled {
            Some(why) => Status::failed_precondition(format!("lifecycle is disabled: {why}")),
            None => Status::unimplemented(format!("{rpc} is not implemented yet")),
        };
        let code = format!("{:?}", status.code()).to_ascii_lowercase();
        self.metrics.requests.get_or_create(&metrics::Rpc { rpc: rpc.into(), code }).inc();
        Err(status)
    }
}

#[tonic::async_trait]
impl Lifecycle for LifecycleService {
    async fn list_instances(
        &self,
        _: Request<ListInstancesRequest>,
    ) -> Result<Response<ListInstancesResponse>, Status> {
        self.refuse("ListInstances")
    }

    async fn explain(&self, _: Request<ExplainRequest>) -> Result<Response<ExplainResponse>, Status> {
        self.refuse("Explain")
    }

    async fn list_installed_revisions(
        &self,
        _: Request<ListInstalledRevisionsRequest>,
    ) -> Result<Response<ListInstalledRevisionsResponse>, Status> {
        self.refuse("ListInstalledRevisions")
    }

    async fn allow_delete_without_package(
        &self,
        _: Request<AllowDeleteWithoutPackageRequest>,
    ) -> Result<Response<AllowDeleteWithoutPackageResponse>, Status> {
        self.refuse("AllowDeleteWithoutPackage")
    }
}

/// Binds, serves until `shutdown` resolves, then drains.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send) -> Result<(), RuntimeError> {
    serve(config, LifecycleService::default(), shutdown).await
}

/// Serves `service` (local mode passes a disabled one).
pub async fn serve(
    config: Config,
    service: LifecycleService,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RuntimeError> {
    let server = GrpcServer::bind(config.listen).await?.with_metrics(service.exported_metrics.clone());
    server.serve(vec![ServedService::new(LifecycleServer::new(service))], shutdown).await
}
