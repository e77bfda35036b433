//! A gRPC server with health and reflection wired the same way in every service.

use std::{future::Future, net::SocketAddr};

use tokio::net::TcpListener;
use tonic::service::{Routes, RoutesBuilder};
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::RuntimeError;

/// The `grpc.health.v1` name under which a service using Redis reports its
/// primary (`vynil_store::primary`): SERVING while it answers, NOT_SERVING
/// while it does not (the service itself stays SERVING: it retries, and
/// follows the sentinels). The gateway's `/readyz` shows it.
pub const REDIS_PRIMARY_HEALTH: &str = "vynil.store.v1.Redis/primary";

/// A service to serve, with the gRPC name its health is reported under.
pub struct ServedService {
    /// Fully qualified gRPC service name, e.g. `vynil.catalog.v1.Catalog`.
    pub name: &'static str,
    /// The encoded `FileDescriptorSet` describing it, for server reflection.
    descriptors: &'static [u8],
    add_to: Box<dyn FnOnce(&mut RoutesBuilder) + Send>,
}

impl std::fmt::Debug for ServedService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedService").field("name", &self.name).finish_non_exhaustive()
    }
}

impl ServedService {
    /// Wraps a generated tonic server (`CatalogServer::new(..)` and the like)
    /// with the encoded `FileDescriptorSet` that describes it (reflection
    /// answers from it: the runtime knows no service of its own).
    pub fn new<S>(service: S, descriptors: &'static [u8]) -> Self
    where
        S: tonic::codegen::Service<http::Request<tonic::body::Body>, Error = std::convert::Infallible>
            + tonic::server::NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        Self {
            name: S::NAME,
            descriptors,
            add_to: Box::new(move |routes: &mut RoutesBuilder| {
                routes.add_service(service);
            }),
        }
    }
}

/// A bound gRPC listener, ready to serve. Binding is separate from serving so
/// callers (and tests) can learn the address of a `127.0.0.1:0` listener.
pub struct GrpcServer {
    listener: TcpListener,
    metrics: Option<std::sync::Arc<prometheus_client::registry::Registry>>,
    components: Vec<(&'static str, tokio::sync::watch::Receiver<bool>)>,
}

impl std::fmt::Debug for GrpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcServer").field("listener", &self.listener).finish_non_exhaustive()
    }
}

impl GrpcServer {
    pub async fn bind(addr: SocketAddr) -> Result<Self, RuntimeError> {
        let listener = TcpListener::bind(addr).await.map_err(|source| RuntimeError::Bind { addr, source })?;
        Ok(Self { listener, metrics: None, components: Vec::new() })
    }

    /// Adds `registry` to what `GET /metrics` answers (OpenMetrics text, on
    /// the same port over HTTP/1.1: one port per service, nothing to collide
    /// in tests) beside the server's own gRPC metrics.
    pub fn with_metrics(mut self, registry: std::sync::Arc<prometheus_client::registry::Registry>) -> Self {
        self.metrics = Some(registry);
        self
    }

    /// Also reports `name` in `grpc.health.v1`: SERVING while `healthy` says
    /// `true`, NOT_SERVING otherwise. A component's trouble (the catalog's
    /// cache, say) shows under its own name while the server as a whole (`""`
    /// and the service names, what readiness probes ask) stays SERVING.
    pub fn with_component(mut self, name: &'static str, healthy: tokio::sync::watch::Receiver<bool>) -> Self {
        self.components.push((name, healthy));
        self
    }

    /// Reports the Redis primary under [`REDIS_PRIMARY_HEALTH`], when the
    /// service uses one (`reachable`: whether it answers).
    pub fn with_redis_primary(mut self, reachable: Option<tokio::sync::watch::Receiver<bool>>) -> Self {
        self.components.extend(reachable.map(|r| (REDIS_PRIMARY_HEALTH, r)));
        self
    }

    /// The address actually bound (resolves port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, RuntimeError> {
        let addr = self
            .listener
            .local_addr()
            .map_err(|source| RuntimeError::Bind { addr: SocketAddr::from(([0, 0, 0, 0], 0)), source })?;
        Ok(addr)
    }

    /// Serves `services` plus `grpc.health.v1` and reflection until `shutdown`
    /// resolves, then reports `NOT_SERVING` and drains in-flight calls.
    pub async fn serve(
        self,
        services: Vec<ServedService>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), RuntimeError> {
        let (health, health_service) = tonic_health::server::health_reporter();
        let reflection = reflection(&services)?;

        let names: Vec<&'static str> = services.iter().map(|s| s.name).collect();
        let mut routes = RoutesBuilder::default();
        routes.add_service(health_service).add_service(reflection);
        for service in services {
            (service.add_to)(&mut routes);
        }
        let mut known = names.clone();
        known.extend(["grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"]);
        let (grpc_metrics, grpc_registry) = crate::metrics::GrpcMetrics::new(known);
        let (grpc_registry, registry) = (std::sync::Arc::new(grpc_registry), self.metrics.clone());
        let scrape = axum::routing::get(move || {
            let (own, service) = (grpc_registry.clone(), registry.clone());
            async move {
                let mut registries = vec![&*own];
                registries.extend(service.as_deref());
                crate::metrics::render(&registries)
            }
        });
        let routes = Routes::from(routes.routes().into_axum_router().route("/metrics", scrape).layer(
            axum::middleware::from_fn_with_state(grpc_metrics, crate::metrics::GrpcMetrics::middleware),
        ));
        set_all(&health, &names, ServingStatus::Serving).await;
        tracing::info!(address = ?self.listener.local_addr().ok(), services = ?names, "serving gRPC");
        let mut followers = tokio::task::JoinSet::new();
        let component_names: Vec<&'static str> = self.components.iter().map(|(name, _)| *name).collect();
        for (name, mut healthy) in self.components {
            let reporter = health.clone();
            followers.spawn(async move {
                loop {
                    let status = if *healthy.borrow_and_update() {
                        ServingStatus::Serving
                    } else {
                        ServingStatus::NotServing
                    };
                    reporter.set_service_status(name, status).await;
                    if healthy.changed().await.is_err() {
                        return;
                    }
                }
            });
        }

        let reporter = health.clone();
        let drain = async move {
            shutdown.await;
            tracing::info!("shutdown requested: reporting NOT_SERVING and draining");
            followers.abort_all();
            set_all(&reporter, &names, ServingStatus::NotServing).await;
            for name in component_names {
                reporter.set_service_status(name, ServingStatus::NotServing).await;
            }
        };
        tonic::transport::Server::builder()
            .accept_http1(true)
            // One span per call, child of the caller's W3C trace context.
            .trace_fn(|request| {
                let span = tracing::info_span!("grpc", rpc = %request.uri().path());
                crate::telemetry::extract(&span, request.headers());
                span
            })
            .add_routes(routes)
            .serve_with_incoming_shutdown(incoming(self.listener), drain)
            .await?;
        Ok(())
    }
}

/// The accepted connections of `listener`, with `TCP_NODELAY`: tonic sets it
/// only on the listeners it binds itself. Without it, a small answer (a page
/// of a catalog, a health check) waited for the peer's delayed ACK, about
/// 40 ms on Linux: bench P8's `GetCatalog` p50 was 48 ms at any size.
fn incoming(listener: TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

async fn set_all(health: &HealthReporter, names: &[&'static str], status: ServingStatus) {
    // "" is the whole server, as grpc_health_probe asks by default.
    health.set_service_status("", status).await;
    for name in names {
        health.set_service_status(*name, status).await;
    }
}

/// Server reflection over health's descriptors and those each service brings
/// (each set once).
fn reflection(
    services: &[ServedService],
) -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<impl tonic_reflection::server::v1::ServerReflection>,
    RuntimeError,
> {
    let mut reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
    let mut described: Vec<&'static [u8]> = Vec::new();
    for service in services {
        if !described.iter().any(|d| std::ptr::eq(*d, service.descriptors)) {
            described.push(service.descriptors);
            reflection = reflection.register_encoded_file_descriptor_set(service.descriptors);
        }
    }
    Ok(reflection.build_v1()?)
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;

    #[tokio::test]
    async fn accepted_connections_send_small_answers_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut accepted = incoming(listener);
        let _client = tokio::net::TcpStream::connect(address).await.unwrap();
        let stream = accepted.next().await.unwrap().unwrap();
        assert!(stream.nodelay().unwrap(), "TCP_NODELAY is set on each accepted connection");
    }
}
