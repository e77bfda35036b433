//! Whom a service believes about who is calling.
//!
//! The gateway authenticates humans and pipelines; the services behind it
//! must not take a caller's word for its identity, or anyone reaching the
//! purger's port could execute a purge "as alice". So a service accepts the
//! caller identity (`x-vynil-caller`) only from a caller that also presents
//! the **service token** shared with the gateway (`authorization: Bearer …`,
//! compared in constant time through its SHA-256). Any other caller is
//! "unauthenticated <peer address>" in audit records, and every privileged
//! RPC — one that writes, triggers work or reads credentials
//! (`Scanner.Scan`, `NotifyPush`, `ExportIndex`, `Purger.Plan`, `Execute`,
//! `Lifecycle.AllowDeleteWithoutPackage`) — refuses it with
//! `UNAUTHENTICATED`, unless the service was started with
//! `--allow-unauthenticated`, which is accepted only on a loopback address
//! (local mode on a laptop, where whoever reaches the port is the user).
//!
//! The token travels in clear over plain gRPC: inside a cluster, pair it with
//! a NetworkPolicy admitting only the gateway (deploy/) or with mTLS.

use std::{net::SocketAddr, path::PathBuf};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::{Request, Status, metadata::MetadataValue};

use crate::{Classify, Failure};

/// Who executes, as the gateway tells after authenticating the caller.
pub const CALLER_HEADER: &str = "x-vynil-caller";
const AUTHORIZATION: &str = "authorization";

/// The flags of caller trust, shared by every service (`SharedConfig`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TrustConfig {
    /// A file holding the service token the gateway presents (a Kubernetes
    /// Secret mounted as a file). Without it no caller is authenticated.
    #[arg(long, env = "VYNIL_SERVICE_TOKEN_FILE")]
    pub service_token_file: Option<PathBuf>,
    /// Accept privileged calls (scans, push notices, exports, purge plans
    /// and executions, AllowDeleteWithoutPackage) from unauthenticated
    /// callers. Refused unless the service listens on a loopback address:
    /// for local mode only.
    #[arg(long, env = "VYNIL_ALLOW_UNAUTHENTICATED")]
    pub allow_unauthenticated: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error(
        "cannot read the service token from {path}: {source} (mount the service token Secret there, or unset --service-token-file)"
    )]
    TokenFile { path: PathBuf, source: std::io::Error },
    #[error("the service token file {path} is empty: write the gateway's service token into it")]
    EmptyToken { path: PathBuf },
    #[error(
        "--allow-unauthenticated is only accepted on a loopback address, not {listen}: anyone reaching the port could run privileged calls; set --service-token-file instead"
    )]
    NotLoopback { listen: SocketAddr },
    #[error(
        "{what} refused for {caller}: call it through the gateway, which authenticates you and presents the service token (or start the service with --allow-unauthenticated, local mode only)"
    )]
    Unauthenticated { what: &'static str, caller: String },
}

impl Classify for TrustError {
    fn failure(&self) -> Failure {
        match self {
            TrustError::Unauthenticated { .. } => Failure::Unauthenticated,
            _ => Failure::Refused,
        }
    }
}

/// A service's trust settings, read once at start.
#[derive(Clone, Default)]
pub struct Trust {
    token_hash: Option<[u8; 32]>,
    allow_unauthenticated: bool,
}

impl std::fmt::Debug for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trust")
            .field("service_token", &self.token_hash.map(|_| "<set>"))
            .field("allow_unauthenticated", &self.allow_unauthenticated)
            .finish()
    }
}

fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.trim().as_bytes()).into()
}

/// Reads a token file (surrounding whitespace is not part of the token).
pub fn read_token_file(path: &std::path::Path) -> Result<String, TrustError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| TrustError::TokenFile { path: path.to_path_buf(), source })?;
    let token = text.trim().to_string();
    if token.is_empty() {
        return Err(TrustError::EmptyToken { path: path.to_path_buf() });
    }
    Ok(token)
}

impl Trust {
    /// From the flags of a service listening on `listen`.
    pub fn from_config(config: &TrustConfig, listen: SocketAddr) -> Result<Self, TrustError> {
        if config.allow_unauthenticated && !listen.ip().is_loopback() {
            return Err(TrustError::NotLoopback { listen });
        }
        let token = config.service_token_file.as_deref().map(read_token_file).transpose()?;
        Ok(Self::new(token.as_deref(), config.allow_unauthenticated))
    }

    pub fn new(service_token: Option<&str>, allow_unauthenticated: bool) -> Self {
        Self { token_hash: service_token.map(hash), allow_unauthenticated }
    }

    /// Who is calling, as far as this service can tell.
    pub fn caller<T>(&self, request: &Request<T>) -> Caller {
        let presented = request
            .metadata()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let trusted = match (self.token_hash, presented) {
            (Some(expected), Some(token)) => bool::from(hash(token).ct_eq(&expected)),
            _ => false,
        };
        let named = request.metadata().get(CALLER_HEADER).and_then(|v| v.to_str().ok());
        match (trusted, named) {
            (true, Some(name)) if !name.is_empty() => Caller::Authenticated(name.to_string()),
            (true, _) => Caller::Authenticated("the gateway (no caller named)".into()),
            (false, _) => Caller::Unauthenticated { peer: request.remote_addr() },
        }
    }

    /// The caller of a privileged RPC `what` (it writes, triggers work or
    /// reads credentials), or the refusal.
    pub fn privileged<T>(&self, request: &Request<T>, what: &'static str) -> Result<Caller, TrustError> {
        let caller = self.caller(request);
        match caller {
            Caller::Unauthenticated { .. } if !self.allow_unauthenticated => {
                Err(TrustError::Unauthenticated { what, caller: caller.to_string() })
            }
            caller => Ok(caller),
        }
    }
}

/// A caller, as a service sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Named by a caller that presented the service token.
    Authenticated(String),
    /// Anyone else, by peer address when known.
    Unauthenticated { peer: Option<SocketAddr> },
}

impl Caller {
    /// Who to record as having asked: the authenticated identity; a
    /// request's own `caller` field is a claim, recorded beside an
    /// unauthenticated caller's address (local mode), never instead of it.
    pub fn recorded(&self, claimed: &str) -> String {
        match self {
            Caller::Unauthenticated { .. } if !claimed.is_empty() => format!("{self} (claiming {claimed})"),
            _ => self.to_string(),
        }
    }
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Caller::Authenticated(name) => f.write_str(name),
            Caller::Unauthenticated { peer: Some(peer) } => write!(f, "unauthenticated {peer}"),
            Caller::Unauthenticated { peer: None } => f.write_str("unauthenticated (peer unknown)"),
        }
    }
}

/// What a client of the services (the gateway) presents: the service token
/// and the identity it authenticated.
#[derive(Clone, Default)]
pub struct ServiceCredentials {
    token: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl std::fmt::Debug for ServiceCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceCredentials").field("token", &self.token.as_ref().map(|_| "<set>")).finish()
    }
}

impl ServiceCredentials {
    /// `token` must be visible ASCII (what `generate_token` makes).
    pub fn new(token: Option<&str>) -> Result<Self, Status> {
        let token = token
            .map(|t| {
                let mut value: MetadataValue<_> = format!("Bearer {}", t.trim())
                    .parse()
                    .map_err(|_| Status::invalid_argument("the service token must be visible ASCII"))?;
                value.set_sensitive(true);
                Ok::<_, Status>(value)
            })
            .transpose()?;
        Ok(Self { token })
    }

    /// Adds the token and `caller` (dropped when it is not a valid header value) to `request`.
    pub fn apply<T>(&self, request: &mut Request<T>, caller: &str) {
        if let Some(token) = &self.token {
            request.metadata_mut().insert(AUTHORIZATION, token.clone());
        }
        if let Ok(value) = caller.parse() {
            request.metadata_mut().insert(CALLER_HEADER, value);
        }
    }
}

/// A high-entropy random token (256 bits, URL-safe base64 without padding),
/// from the operating system's generator.
pub fn generate_token() -> Result<String, std::io::Error> {
    use base64::Engine;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::ToStatus;

    fn request(token: Option<&str>, caller: &str) -> Request<()> {
        let mut request = Request::new(());
        ServiceCredentials::new(token).unwrap().apply(&mut request, caller);
        request
    }

    #[test]
    fn a_caller_is_believed_only_with_the_service_token() {
        let trust = Trust::new(Some("s3cret"), false);
        assert_eq!(trust.caller(&request(Some("s3cret"), "alice")), Caller::Authenticated("alice".into()));
        let impostor = trust.caller(&request(Some("guess"), "alice"));
        assert_eq!(impostor, Caller::Unauthenticated { peer: None });
        assert_eq!(impostor.to_string(), "unauthenticated (peer unknown)");
        assert!(matches!(trust.caller(&request(None, "alice")), Caller::Unauthenticated { .. }));
        // A service without a token believes nobody.
        let none = Trust::new(None, false);
        assert!(matches!(none.caller(&request(Some("s3cret"), "alice")), Caller::Unauthenticated { .. }));
    }

    #[test]
    fn privileged_calls_refuse_the_unauthenticated_unless_allowed() {
        let strict = Trust::new(Some("s3cret"), false);
        let error = strict.privileged(&request(None, "alice"), "Execute").unwrap_err();
        assert_eq!(error.to_status().code(), tonic::Code::Unauthenticated);
        assert!(error.to_string().contains("through the gateway"), "{error}");
        assert!(strict.privileged(&request(Some("s3cret"), "alice"), "Execute").is_ok());
        let local = Trust::new(None, true);
        let caller = local.privileged(&request(None, "alice"), "Execute").unwrap();
        assert!(matches!(caller, Caller::Unauthenticated { .. }), "still not believed: {caller:?}");
    }

    #[test]
    fn allowing_the_unauthenticated_is_refused_off_loopback() {
        let config = TrustConfig { service_token_file: None, allow_unauthenticated: true };
        assert!(Trust::from_config(&config, "127.0.0.1:1".parse().unwrap()).is_ok());
        let error = Trust::from_config(&config, "0.0.0.0:50053".parse().unwrap()).unwrap_err();
        assert!(matches!(error, TrustError::NotLoopback { .. }), "{error}");
    }

    #[test]
    fn generated_tokens_differ_and_carry_256_bits() {
        let (a, b) = (generate_token().unwrap(), generate_token().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 43);
    }
}
