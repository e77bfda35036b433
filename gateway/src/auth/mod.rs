//! Who is calling, and what their role lets them do.
//!
//! **Tokens.** Bearer tokens are configured in a YAML file (`--tokens-file`,
//! a Kubernetes Secret mounted as a file) holding each token's SHA-256, never
//! the token: `tokens: [{name: alice, role: admin, sha256: <hex>}]`. Tokens
//! are high-entropy (`vynil-gateway token` prints one and its line), so
//! an unsalted hash is as good as a password hash and costs nothing per
//! request. A presented token is hashed and compared to every entry in
//! constant time.
//!
//! **Roles** are ordered: `viewer` reads; `operator` also starts scans, makes
//! purge plans and asks for explanations; `admin` also executes purges and
//! allows deletes without package hooks.
//!
//! The file is **reloaded when it changes** (checked at most once a second:
//! a mounted Secret is updated in place), so a removed or downgraded token
//! loses its rights without a restart; a file that no longer parses keeps
//! the tokens last read, and says so in the log.
//!
//! **Browsers** exchange a token for a session cookie (`POST
//! /api/v1/session`): HttpOnly, SameSite=Strict, Secure with
//! `--secure-cookies`, signed with HMAC-SHA256 under a key shared by the
//! gateway replicas (`--session-key-file`), so any replica accepts it. A
//! state-changing call made with the cookie must also carry the session's
//! CSRF token in `x-csrf-token` (given by the login answer), which a
//! cross-site page cannot read. A token never travels in a URL. A session
//! names the token it was opened with (by hash) and holds only while the
//! tokens file still has it, with the role the file gives it now.
//!
//! Authentication happens before any lookup: a request without a valid
//! credential reaches no service.

use std::net::IpAddr;

use axum::http::{HeaderMap, header};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use utoipa::ToSchema;

use crate::error::ApiError;

pub mod kubernetes;
mod sessions;
mod tokens;

pub use kubernetes::{KubeAuth, KubeUser, Payer};
use sessions::Held;
pub use sessions::{SessionInfo, Sessions};
pub use tokens::{TokenBook, Tokens, token_hash};

pub const SESSION_COOKIE: &str = "vynil_session";
pub const CSRF_HEADER: &str = "x-csrf-token";

/// What a principal may do; ordered, each role includes the ones below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Operator,
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

/// How a principal authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// A bearer token; for a tokens-file token, its hash (a session opened
    /// with it names it).
    Bearer { token: Option<[u8; 32]> },
    /// A session cookie, with the CSRF token state-changing calls must echo.
    Session { csrf: String },
}

/// What an authenticated caller is allowed: a role (a token of the tokens
/// file), or what Kubernetes RBAC says (a Kubernetes user).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    Role(Role),
    Kubernetes(KubeUser),
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub grant: Grant,
    pub via: Via,
}

impl Principal {
    /// The role of a token principal; `None` for a Kubernetes user.
    pub fn role(&self) -> Option<Role> {
        match self.grant {
            Grant::Role(role) => Some(role),
            Grant::Kubernetes(_) => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    #[error(
        "cannot read the tokens file {path}: {source} (mount the tokens Secret there, or unset --tokens-file)"
    )]
    Read { path: String, source: std::io::Error },
    #[error(
        "the tokens file {path} is not valid: {problem} (expected `tokens: [{{name: alice, role: admin, sha256: <64 hex digits>}}]`; `vynil-gateway token --name alice --role admin` prints a line)"
    )]
    Invalid { path: String, problem: String },
    #[error(
        "the session key file {path}: {problem} (write at least 32 random bytes into it, the same on every gateway replica)"
    )]
    SessionKey { path: String, problem: String },
}

/// Everything authentication needs.
#[derive(Debug)]
pub struct Authenticator {
    pub tokens: Tokens,
    pub sessions: Sessions,
    /// TokenReview and SubjectAccessReview, with `--kubernetes-auth`.
    pub kube: Option<KubeAuth>,
    /// Where a request comes from: its TCP peer, or the proxy's word.
    pub source: Source,
}

/// How the gateway tells where a request comes from (per-address budgets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The TCP peer: the gateway is reached directly.
    Peer,
    /// For a peer among `proxies` (the proxy in front), the last address of
    /// `X-Forwarded-For` (what that proxy appended); any other peer is
    /// itself, whatever it writes.
    ForwardedFor { proxies: Vec<ipnet::IpNet> },
}

impl Source {
    /// The address a request with `headers` from `peer` comes from.
    pub fn of(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Option<IpAddr> {
        match self {
            Source::Peer => peer,
            Source::ForwardedFor { proxies } => {
                let from_proxy = peer.is_some_and(|p| proxies.iter().any(|net| net.contains(&p)));
                if !from_proxy {
                    return peer;
                }
                headers
                    .get_all("x-forwarded-for")
                    .iter()
                    .next_back()
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.rsplit(',').next())
                    .and_then(|v| v.trim().parse().ok())
                    .or(peer)
            }
        }
    }
}

/// A proxy's address as `--trusted-proxies` writes it: an address or a
/// network (`10.0.0.0/8`).
pub fn parse_proxy(text: &str) -> Result<ipnet::IpNet, String> {
    let text = text.trim();
    text.parse::<ipnet::IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{text:?} is neither an address nor a network (10.0.0.1, 10.0.0.0/8, fd00::/8)"))
}

impl Authenticator {
    /// Whether `principal` may do `what` beyond what its route needs: with a
    /// token, at least `role`; as a Kubernetes user, `check` (a verb of its
    /// own on the resource, so that RBAC can grant it apart). `Err(403)`
    /// naming the act and how to get it.
    pub async fn may(
        &self,
        principal: Option<&Principal>,
        what: &str,
        role: Role,
        check: &kubernetes::Check,
    ) -> Result<(), ApiError> {
        let principal =
            principal.ok_or_else(|| ApiError::unauthenticated(format!("{what} needs a credential")))?;
        match &principal.grant {
            Grant::Role(granted) if *granted >= role => Ok(()),
            Grant::Role(granted) => Err(ApiError::forbidden(format!(
                "{what} is an {} act; {} is {}",
                role.as_str(),
                principal.name,
                granted.as_str()
            ))),
            Grant::Kubernetes(user) => match &self.kube {
                Some(reviews) => reviews.authorize(user, check).await,
                None => Err(ApiError::unauthenticated(
                    "Kubernetes users are not accepted here (--kubernetes-auth is off)",
                )),
            },
        }
    }

    /// The principal of a request from `from`, `None` without credentials,
    /// an error for a credential that is not valid (never silently anonymous).
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
        from: Option<IpAddr>,
    ) -> Result<Option<Principal>, ApiError> {
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let token = value
                .to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim)
                .ok_or_else(|| ApiError::unauthenticated("Authorization must be `Bearer <token>`"))?;
            return self.bearer(token, from).await.map(Some);
        }
        let Some(value) = session_cookie(headers) else { return Ok(None) };
        let (mut principal, held) = self.sessions.verify(value)?;
        // Valid only while its token is, as what the token is now.
        match held {
            Held::Token(hash) => {
                let (name, role) = self.tokens.current().by_hash(&hash).ok_or_else(|| {
                    ApiError::unauthenticated(
                        "the token this session was opened with is no longer configured: log in again",
                    )
                })?;
                (principal.name, principal.grant) = (name, Grant::Role(role));
            }
            Held::Kubernetes(bearer) => {
                let refused = || {
                    ApiError::unauthenticated(
                        "the Kubernetes token this session was opened with is no longer valid: log in again",
                    )
                };
                let kube = self.kube.as_ref().ok_or_else(refused)?;
                // Cached: the API server is asked again once the review expires.
                let user = kube.review_token(&bearer, Payer::Session).await?.ok_or_else(refused)?;
                (principal.name, principal.grant) = (user.username.clone(), Grant::Kubernetes(user));
            }
        }
        Ok(Some(principal))
    }

    /// The principal of a bearer token (also what a login checks): a token
    /// of the tokens file, else (with `--kubernetes-auth`) a Kubernetes user.
    pub async fn bearer(&self, token: &str, from: Option<IpAddr>) -> Result<Principal, ApiError> {
        if let Some((name, role)) = self.tokens.current().find(token) {
            let via = Via::Bearer { token: Some(token_hash(token)) };
            return Ok(Principal { name, grant: Grant::Role(role), via });
        }
        let unknown = || ApiError::unauthenticated("the token is not known to this gateway");
        let kube = self.kube.as_ref().ok_or_else(unknown)?;
        let user = kube.review_token(token, Payer::Address(from)).await?.ok_or_else(unknown)?;
        Ok(Principal {
            name: user.username.clone(),
            grant: Grant::Kubernetes(user),
            via: Via::Bearer { token: None },
        })
    }
}

fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value)
        .filter(|v| !v.is_empty())
}

/// Checks the CSRF token of a state-changing call made with a session cookie.
pub fn check_csrf(principal: &Principal, headers: &HeaderMap) -> Result<(), ApiError> {
    let Via::Session { csrf } = &principal.via else {
        return Ok(());
    };
    let presented = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if bool::from(presented.as_bytes().ct_eq(csrf.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "a state-changing call with the session cookie needs the session's CSRF token in {CSRF_HEADER} (the login answer gives it)"
        )))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    use base64::Engine;
    use hmac::Mac;

    use super::sessions::B64;

    fn authenticator() -> Authenticator {
        let book = format!(
            "tokens:\n{}\n{}\n",
            TokenBook::line("ann", Role::Viewer, "t-ann"),
            TokenBook::line("root", Role::Admin, "t-root")
        );
        Authenticator {
            tokens: Tokens::fixed(TokenBook::parse(&book).unwrap()),
            sessions: Sessions::new(None, Duration::from_secs(60), false).unwrap(),
            kube: None,
            source: Source::Peer,
        }
    }

    #[test]
    fn the_source_of_a_request_is_its_peer_unless_the_proxy_in_front_is_trusted() {
        let peer: Option<IpAddr> = Some([10, 0, 0, 9].into());
        let forwarded = headers(&[("x-forwarded-for", "6.6.6.6"), ("x-forwarded-for", "1.2.3.4, 5.6.7.8")]);
        assert_eq!(Source::Peer.of(&forwarded, peer), peer, "a client's own header is not believed");
        let behind = |proxy: &str| Source::ForwardedFor { proxies: vec![parse_proxy(proxy).unwrap()] };
        assert_eq!(
            behind("10.0.0.0/24").of(&forwarded, peer),
            Some([5, 6, 7, 8].into()),
            "what the proxy appended"
        );
        assert_eq!(behind("10.0.0.9").of(&HeaderMap::new(), peer), peer);
        assert_eq!(
            behind("10.0.1.0/24").of(&forwarded, peer),
            peer,
            "a peer that is not the proxy is itself"
        );
        assert!(parse_proxy("10.0.0.0/33").is_err() && parse_proxy("proxy.local").is_err());
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    #[tokio::test]
    async fn tokens_map_to_their_role_and_an_unknown_token_is_refused_not_anonymous() {
        let auth = authenticator();
        let root =
            auth.authenticate(&headers(&[("authorization", "Bearer t-root")]), None).await.unwrap().unwrap();
        assert_eq!((root.name.as_str(), root.role()), ("root", Some(Role::Admin)));
        assert!(auth.authenticate(&headers(&[("authorization", "Bearer nope")]), None).await.is_err());
        assert!(auth.authenticate(&headers(&[("authorization", "Basic eDp5")]), None).await.is_err());
        assert_eq!(auth.authenticate(&HeaderMap::new(), None).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_session_cookie_is_signed_and_a_tampered_one_is_refused() {
        let auth = authenticator();
        let ann = auth.bearer("t-ann", None).await.unwrap();
        let (cookie, info) = auth.sessions.open(&ann, "t-ann").unwrap();
        let cookie = cookie.to_str().unwrap();
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
        let pair = cookie.split(';').next().unwrap();
        let principal = auth.authenticate(&headers(&[("cookie", pair)]), None).await.unwrap().unwrap();
        assert_eq!(principal.role(), Some(Role::Viewer));
        // Claiming admin in the payload breaks the signature.
        let value = pair.trim_start_matches("vynil_session=");
        let (payload, signature) = value.split_once('.').unwrap();
        let mut claims: serde_json::Value = serde_json::from_slice(&B64.decode(payload).unwrap()).unwrap();
        claims["r"] = "admin".into();
        let forged = format!("vynil_session={}.{signature}", B64.encode(claims.to_string()));
        assert!(auth.authenticate(&headers(&[("cookie", &forged)]), None).await.is_err());
        // Another replica with another key refuses it too.
        let other = Sessions::new(None, Duration::from_secs(60), false).unwrap();
        assert!(other.verify(value).is_err());
        // A session cannot drop the token it names (a role without a token is refused).
        claims["r"] = "viewer".into();
        claims.as_object_mut().unwrap().remove("t");
        let payload = B64.encode(claims.to_string());
        let signature = B64.encode(auth.sessions.mac(&payload).unwrap().finalize().into_bytes());
        assert!(auth.sessions.verify(&format!("{payload}.{signature}")).is_err());
        // CSRF: the cookie alone does not change state.
        assert!(check_csrf(&principal, &HeaderMap::new()).is_err());
        assert!(check_csrf(&principal, &headers(&[("x-csrf-token", &info.csrf_token)])).is_ok());
    }

    /// Security review item 7: a removed admin's session ends at once, a
    /// downgraded one has its new role, and both hold across a restart.
    #[tokio::test]
    async fn a_removed_admin_loses_its_session_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.yaml");
        let write =
            |lines: &[String]| std::fs::write(&path, format!("tokens:\n{}\n", lines.join("\n"))).unwrap();
        let (root, ann) =
            (TokenBook::line("root", Role::Admin, "t-root"), TokenBook::line("ann", Role::Admin, "t-ann"));
        write(&[root.clone(), ann]);
        let sessions = Sessions::new(Some(vec![7; 32]), Duration::from_secs(600), false).unwrap();
        let auth = Authenticator {
            tokens: Tokens::watch(&path, Duration::ZERO).unwrap(),
            sessions: sessions.clone(),
            kube: None,
            source: Source::Peer,
        };
        let cookie = |principal: &Principal| {
            let (cookie, _) = auth.sessions.open(principal, "unused for a tokens-file session").unwrap();
            cookie.to_str().unwrap().split(';').next().unwrap().to_string()
        };
        let (root_cookie, ann_cookie) = (
            cookie(&auth.bearer("t-root", None).await.unwrap()),
            cookie(&auth.bearer("t-ann", None).await.unwrap()),
        );
        let role = |cookie: String| {
            let auth = &auth;
            async move {
                auth.authenticate(&headers(&[("cookie", &cookie)]), None).await.map(|p| p.unwrap().role())
            }
        };
        assert_eq!(role(ann_cookie.clone()).await.unwrap(), Some(Role::Admin));

        // ann is removed, root downgraded: no restart.
        write(&[TokenBook::line("root", Role::Viewer, "t-root")]);
        let refused = role(ann_cookie.clone()).await.unwrap_err();
        assert!(format!("{refused:?}").contains("no longer configured"), "{refused:?}");
        assert!(auth.bearer("t-ann", None).await.is_err());
        assert_eq!(role(root_cookie.clone()).await.unwrap(), Some(Role::Viewer));

        // A restart (a new gateway reading the file, same session key) agrees.
        let restarted = Authenticator {
            tokens: Tokens::watch(&path, Duration::ZERO).unwrap(),
            sessions,
            kube: None,
            source: Source::Peer,
        };
        assert!(restarted.authenticate(&headers(&[("cookie", &ann_cookie)]), None).await.is_err());

        // A broken file keeps what was last read.
        std::fs::write(&path, "tokens: [not yaml").unwrap();
        assert_eq!(role(root_cookie).await.unwrap(), Some(Role::Viewer));
    }

    #[test]
    fn a_tokens_file_with_a_bad_hash_is_an_error_naming_the_entry() {
        let error = TokenBook::parse("tokens:\n  - {name: ann, role: viewer, sha256: abc}\n").unwrap_err();
        assert!(error.contains("tokens[0] (ann)"), "{error}");
        assert!(TokenBook::parse("tokens:\n  - {name: ann, role: king, sha256: abc}\n").is_err());
    }
}
