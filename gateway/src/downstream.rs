//! The services behind the gateway, reached over gRPC.
//!
//! Channels are lazy: the gateway starts (and answers `/healthz`) whether or
//! not the services are up, and a route of a service that is not configured
//! or not reachable answers 503 naming it. Every call carries the service
//! token and the authenticated caller (`vynil_runtime::ServiceCredentials`),
//! the request id (`x-request-id`) and the W3C trace context
//! (`traceparent`/`tracestate`) the HTTP request came with.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use vynil_proto::{
    catalog::v1::catalog_client::CatalogClient, lifecycle::v1::lifecycle_client::LifecycleClient,
    purger::v1::purger_client::PurgerClient, scanner::v1::scanner_client::ScannerClient,
};
use vynil_runtime::{ServiceCredentials, TracedChannel};

use crate::{auth::Principal, error::ApiError};

/// The services, by name, as routes and `/readyz` name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    Catalog,
    Scanner,
    Purger,
    Lifecycle,
}

impl Service {
    pub const ALL: [Service; 4] = [Service::Catalog, Service::Scanner, Service::Purger, Service::Lifecycle];

    pub fn name(self) -> &'static str {
        match self {
            Service::Catalog => "catalog",
            Service::Scanner => "scanner",
            Service::Purger => "purger",
            Service::Lifecycle => "lifecycle",
        }
    }

    fn grpc_name(self) -> &'static str {
        match self {
            Service::Catalog => "vynil.catalog.v1.Catalog",
            Service::Scanner => "vynil.scanner.v1.Scanner",
            Service::Purger => "vynil.purger.v1.Purger",
            Service::Lifecycle => "vynil.lifecycle.v1.Lifecycle",
        }
    }
}

/// What one request carries to the services.
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    pub principal: Option<Principal>,
    pub request_id: String,
    pub trace: Vec<(&'static str, String)>,
    /// The caller's address, for per-address budgets.
    pub from: Option<std::net::IpAddr>,
}

#[derive(Debug, Clone)]
pub struct Downstreams {
    channels: Vec<(Service, Option<(String, Channel)>)>,
    credentials: ServiceCredentials,
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

impl Downstreams {
    /// `endpoints`: each service's URL, `None` when not configured.
    pub fn new(
        endpoints: &[(Service, Option<String>)],
        credentials: ServiceCredentials,
    ) -> Result<Self, (Service, String)> {
        let mut channels = Vec::new();
        for (service, url) in endpoints {
            let channel = match url {
                None => None,
                Some(url) => {
                    let endpoint = Endpoint::from_shared(url.clone())
                        .map_err(|e| (*service, format!("{url}: {e}")))?
                        .connect_timeout(CONNECT_TIMEOUT);
                    Some((url.clone(), endpoint.connect_lazy()))
                }
            };
            channels.push((*service, channel));
        }
        Ok(Self { channels, credentials })
    }

    fn channel(&self, service: Service) -> Result<Channel, ApiError> {
        match self.channels.iter().find(|(s, _)| *s == service) {
            Some((_, Some((_, channel)))) => Ok(channel.clone()),
            _ => Err(ApiError::unavailable(
                service.name(),
                format!("not configured (set --{}-endpoint on the gateway)", service.name()),
            )),
        }
    }

    pub fn catalog(&self) -> Result<CatalogClient<TracedChannel>, ApiError> {
        Ok(CatalogClient::new(vynil_runtime::traced(self.channel(Service::Catalog)?)))
    }

    pub fn scanner(&self) -> Result<ScannerClient<TracedChannel>, ApiError> {
        Ok(ScannerClient::new(vynil_runtime::traced(self.channel(Service::Scanner)?)))
    }

    pub fn purger(&self) -> Result<PurgerClient<TracedChannel>, ApiError> {
        Ok(PurgerClient::new(vynil_runtime::traced(self.channel(Service::Purger)?)))
    }

    pub fn lifecycle(&self) -> Result<LifecycleClient<TracedChannel>, ApiError> {
        Ok(LifecycleClient::new(vynil_runtime::traced(self.channel(Service::Lifecycle)?)))
    }

    /// `message` as a gRPC request from `context`.
    pub fn request<T>(&self, context: &CallContext, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let caller = context.principal.as_ref().map(|p| p.name.as_str()).unwrap_or_default();
        self.credentials.apply(&mut request, caller);
        if let Ok(id) = context.request_id.parse() {
            request.metadata_mut().insert("x-request-id", id);
        }
        // The caller's own trace context, forwarded as it came; the traced
        // channel replaces it with the current span's when spans are exported.
        for (name, value) in &context.trace {
            if let Ok(value) = value.parse() {
                request.metadata_mut().insert(*name, value);
            }
        }
        request
    }

    /// Each configured service's readiness: `Err` says why it is not ready;
    /// `Ok` may carry a note (its Redis primary does not answer: it stays
    /// ready, retries and follows the sentinels).
    pub async fn readiness(&self) -> Vec<(Service, Result<Option<String>, String>)> {
        let checks = self.channels.iter().map(|(service, channel)| async move {
            let Some((url, channel)) = channel else {
                return (*service, Err("not configured".to_string()));
            };
            let mut health = HealthClient::new(channel.clone());
            let request = HealthCheckRequest { service: service.grpc_name().into() };
            let answer = tokio::time::timeout(CONNECT_TIMEOUT * 2, health.check(request)).await;
            let verdict = match answer {
                Ok(Ok(r)) if r.get_ref().status() == ServingStatus::Serving => {
                    // A service without Redis does not know the component (NOT_FOUND).
                    let primary = HealthCheckRequest { service: vynil_runtime::REDIS_PRIMARY_HEALTH.into() };
                    let redis = tokio::time::timeout(CONNECT_TIMEOUT, health.check(primary)).await;
                    Ok(match redis {
                        Ok(Ok(r)) if r.get_ref().status() == ServingStatus::NotServing => Some(
                            "its Redis primary does not answer (it retries, and follows the sentinels)"
                                .to_string(),
                        ),
                        _ => None,
                    })
                }
                Ok(Ok(r)) => Err(format!("{url} reports {:?}", r.get_ref().status())),
                Ok(Err(status)) => Err(format!("{url}: {}", status.message())),
                Err(_) => Err(format!("{url}: no answer within {:?}", CONNECT_TIMEOUT * 2)),
            };
            (*service, verdict)
        });
        futures::future::join_all(checks).await
    }
}
