//! Real parts for tests, started on free loopback ports and stopped on drop.
//!
//! - [`RedisServer`]: a real `redis-server` with no persistence.
//! - [`RegistryServer`]: a real CNCF distribution 2.8 registry (Debian's
//!   `docker-registry`) with delete enabled, filesystem storage in a temp dir,
//!   optionally behind htpasswd basic auth; [`RegistryServer::from_fixture`]
//!   builds a registry's content once and copies it for every later test.
//! - [`Publisher`]: publishes Vynil packages as OCI image manifests carrying the
//!   exact upstream `fr.solidite.vynil.*` annotations, plus the noise real
//!   repositories hold (tags without annotations, aliases, cosign artifacts).
//! - [`ServiceProcess`]: runs a service binary, waits for gRPC health, stops it
//!   with SIGTERM.
//! - [`HttpFront`]: a proxy in front of a real server that counts requests and
//!   injects faults (5xx, 429, slowness, truncation, over-size bodies, bearer auth).
//!
//! - [`kube_api`]: a fake Kubernetes API server that the real `kube::Client`
//!   talks to, and a fake agent that completes or fails agent Jobs.
//!
//! A missing binary is an error that says what to install: tests never skip.

mod examples;
mod fixture;
mod front;
mod grpc;
mod index_server;
mod jukebox;
pub mod kube_api;
mod layout;
mod package;
mod process;
mod publisher;
mod redis_server;
mod registry_server;
mod s3_server;
pub mod sentinel;
mod service_process;
mod signing;
mod sigstore;
pub mod upstream;
mod wait;

pub use examples::{EXAMPLE_REPOSITORIES, Example, examples, publish_examples, write_examples};
pub use front::{Fault, FaultAction, HttpFront, Seen};
pub use grpc::{as_gateway, bound};
pub use index_server::{IndexRequest, IndexServer};
pub use jukebox::{Holder, JukeboxBuilder, write_opted_in};
pub use layout::{LayoutWriter, reachable_blobs, stored_blobs};
pub use package::{ArtifactKind, PackageSpec, PackageType};
pub use process::{free_port, workspace_binary};
pub use publisher::{Publisher, sha256_digest};
pub use redis_server::{Persistence, RedisServer};
pub use registry_server::{LoggedRequest, RegistryOptions, RegistryServer};
pub use s3_server::S3Server;
pub use sentinel::RedisSentinels;
pub use service_process::{Readiness, ServiceProcess, ServingStatus};
pub use signing::{SignatureLayer, Signer, statement};
pub use sigstore::Sigstore;
pub use wait::{channel, eventually};

/// What can go wrong while starting or driving test infrastructure.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error("`{binary}` is not installed: run `{hint}` (or the README's test command, which installs it)")]
    MissingBinary { binary: &'static str, hint: &'static str },
    #[error("{what} did not become ready within {seconds}s; its log:\n{log}")]
    NotReady { what: String, seconds: u64, log: String },
    #[error("{what} exited early ({status}); its log:\n{log}")]
    ExitedEarly { what: String, status: String, log: String },
    #[error("i/o while {doing}: {source}")]
    Io { doing: String, source: std::io::Error },
    #[error("registry call failed: {0}")]
    Oci(#[from] oci_client::errors::OciDistributionError),
    #[error("http call failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("registry answered {status} to {what}: {body}")]
    Registry { what: String, status: u16, body: String },
    #[error("cannot hash the htpasswd password: {0}")]
    Bcrypt(#[from] bcrypt::BcryptError),
    #[error("bad fixture: {0}")]
    Fixture(String),
    #[error("signal: {0}")]
    Signal(#[from] nix::errno::Errno),
    #[error("gRPC: {0}")]
    Grpc(String),
}

pub type Result<T, E = TestkitError> = std::result::Result<T, E>;

pub(crate) fn io(doing: impl Into<String>) -> impl FnOnce(std::io::Error) -> TestkitError {
    let doing = doing.into();
    move |source| TestkitError::Io { doing, source }
}
