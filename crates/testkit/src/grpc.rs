//! What every harness needs to serve and call the services in process: a
//! gRPC server bound before anything dials it, and a request as the gateway
//! sends it.

use std::net::SocketAddr;

use vynil_runtime::{GrpcServer, ServiceCredentials};

use crate::{Result, TestkitError};

/// A gRPC server bound on a port of loopback the system chose, and its
/// address: known before anything dials it, never handed out unbound.
pub async fn bound() -> Result<(GrpcServer, SocketAddr)> {
    let failed =
        |e: vynil_runtime::RuntimeError| TestkitError::Grpc(format!("binding a loopback server: {e}"));
    let server = GrpcServer::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.map_err(failed)?;
    let addr = server.local_addr().map_err(failed)?;
    Ok((server, addr))
}

/// `request` as a gateway sends it: with `service_token`, naming `caller`.
pub fn as_gateway<T>(request: T, service_token: &str, caller: &str) -> Result<tonic::Request<T>> {
    let mut request = tonic::Request::new(request);
    ServiceCredentials::new(Some(service_token))
        .map_err(|e| TestkitError::Grpc(format!("service token: {e}")))?
        .apply(&mut request, caller);
    Ok(request)
}
