//! Everything the control plane needs from OCI registries, in one place.
//!
//! Built on `oci-client`'s manifest types, with our own HTTP transport because
//! the operations that matter most here are those oci-client has no API for:
//! `DELETE` by digest (then verified), tag lists paginated by `Link` (upstream
//! stopped at 100 tags), the referrers API, and a transport policy we must
//! control — bounded retries with jittered backoff, `429` + `Retry-After`, a
//! per-registry concurrency limit, a manifest size cap, request counters.
//!
//! - [`RegistryClient`]: tags, digests by `HEAD`, manifests and their Vynil
//!   metadata (cached **by digest**: an unchanged tag is never read twice, a
//!   re-pointed one is), artifacts, verified deletes, and cosign signature
//!   verdicts (`signatures`).
//! - [`sources`]: repository enumeration for `list`, `harbor` and `gitlab`
//!   JukeBox sources.
//! - [`Credentials`]: anonymous, basic, or from a `kubernetes.io/dockerconfigjson`
//!   document; bearer tokens are obtained from the `WWW-Authenticate`
//!   challenge. Secrets never appear in `Debug`, logs or errors.

mod auth;
mod client;
mod counters;
pub mod decode;
pub mod layout;
mod metadata;
mod reference;
mod referrers;
mod signatures;
pub mod sources;
mod transport;

pub use auth::{CredentialStore, Credentials};
pub use client::{Artifact, DeletionOutcome, Manifest, RegistryClient, TaggedManifest};
pub use counters::{RequestCounters, RequestLabels};
pub use metadata::{InMemoryMetadataCache, ManifestMetadata, MetadataCache};
pub use reference::RepositoryRef;
pub use signatures::signature_tag;
pub use transport::TransportConfig;

/// What can go wrong talking to a registry. Each message names the registry
/// and what to do; none carries a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("{what}: unauthorized ({status}{detail}); check the pull secret's credentials for {registry}")]
    Unauthorized { registry: String, what: String, status: u16, detail: String },
    #[error("{what}: not found ({code}); check the repository or tag name")]
    NotFound { what: String, code: String },
    #[error("{what}: the registry answered {status} {code}: {message}")]
    Registry { what: String, status: u16, code: String, message: String },
    #[error(
        "{what}: still rate limited (429) after {attempts} attempts; retry later or lower the concurrency"
    )]
    RateLimited { what: String, attempts: u32 },
    #[error(
        "{what}: no answer within {seconds}s after {attempts} attempts; the registry is slow or unreachable, retry later"
    )]
    Timeout { what: String, seconds: u64, attempts: u32 },
    #[error("{what}: cannot reach the registry after {attempts} attempts: {problem}")]
    Unreachable { what: String, attempts: u32, problem: String },
    #[error(
        "{what}: the manifest is larger than {limit} bytes; it is not a Vynil package manifest (the limit is --max-manifest-bytes)"
    )]
    TooLarge { what: String, limit: usize },
    #[error(
        "{what}: {listed} tags, over the cap of {cap} (listing stopped there); raise --max-tags-per-repository to read it"
    )]
    TooManyTags { what: String, listed: usize, cap: usize },
    #[error("{what}: invalid answer: {problem}")]
    InvalidBody { what: String, problem: String },
    #[error("{what}: {problem}; check the OCI image layout (index.json and blobs/sha256)")]
    Layout { what: String, problem: String },
    #[error("invalid image reference {reference:?}: {problem}")]
    InvalidReference { reference: String, problem: String },
    #[error(
        "invalid credentials document: {0}; expected a kubernetes.io/dockerconfigjson `.dockerconfigjson`"
    )]
    Credentials(String),
    #[error("plain http to {registry} is refused: declare it insecure to allow it")]
    InsecureRefused { registry: String },
}

impl vynil_failure::Classify for RegistryError {
    fn failure(&self) -> vynil_failure::Failure {
        use vynil_failure::Failure;
        match self {
            RegistryError::NotFound { .. } => Failure::Missing,
            RegistryError::InvalidReference { .. } => Failure::BadInput,
            // The registry's own test: outages, timeouts, 429s and 5xx.
            e if e.is_transient() => Failure::Transient,
            // Credentials, a refusal, a body that is not what was asked.
            _ => Failure::Refused,
        }
    }
}

impl RegistryError {
    /// Whether the condition may clear by itself (worth a later retry), as
    /// opposed to a definite answer.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RegistryError::RateLimited { .. }
                | RegistryError::Timeout { .. }
                | RegistryError::Unreachable { .. }
        ) || matches!(self, RegistryError::Registry { status, .. } if *status >= 500)
    }
}

pub type Result<T, E = RegistryError> = std::result::Result<T, E>;

#[cfg(test)]
mod failure_tests {
    use vynil_failure::{Classify, Failure};

    use super::RegistryError;

    #[test]
    fn outages_and_5xx_are_transient_refusals_are_not() {
        let timeout = RegistryError::Timeout { what: "tags of r/x".into(), seconds: 30, attempts: 4 };
        assert_eq!(timeout.failure(), Failure::Transient);
        let answered = |status| RegistryError::Registry {
            what: "w".into(),
            status,
            code: String::new(),
            message: String::new(),
        };
        assert_eq!(answered(503).failure(), Failure::Transient, "a 5xx is transient");
        assert_eq!(answered(405).failure(), Failure::Refused, "a refusal is an answer");
        assert_eq!(
            RegistryError::NotFound { what: "w".into(), code: "404".into() }.failure(),
            Failure::Missing
        );
    }
}
