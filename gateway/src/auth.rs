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
//! **Browsers** exchange a token for a session cookie (`POST
//! /api/v1/session`): HttpOnly, SameSite=Strict, Secure with
//! `--secure-cookies`, signed with HMAC-SHA256 under a key shared by the
//! gateway replicas (`--session-key-file`), so any replica accepts it. A
//! state-changing call made with the cookie must also carry the session's
//! CSRF token in `x-csrf-token` (given by the login answer), which a
//! cross-site page cannot read. A token never travels in a URL.
//!
//! Authentication happens before any lookup: a request without a valid
//! credential reaches no service.

use std::{path::Path, time::Duration};

use axum::http::{HeaderMap, HeaderValue, header};
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use utoipa::ToSchema;

use crate::{
    error::ApiError,
    kube_auth::{KubeAuth, KubeUser},
};

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
    Bearer,
    /// A session cookie, with the CSRF token state-changing calls must echo.
    Session {
        csrf: String,
    },
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    tokens: Vec<TokenEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    role: Role,
    sha256: String,
}

/// The configured tokens, by hash.
#[derive(Clone, Default)]
pub struct TokenBook {
    entries: Vec<([u8; 32], String, Role)>,
}

impl std::fmt::Debug for TokenBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.entries.iter().map(|(_, n, _)| n.as_str()).collect();
        f.debug_struct("TokenBook").field("names", &names).finish()
    }
}

pub fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl TokenBook {
    pub fn load(path: &Path) -> Result<Self, AuthConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|source| AuthConfigError::Read { path: shown.clone(), source })?;
        Self::parse(&text).map_err(|problem| AuthConfigError::Invalid { path: shown, problem })
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let file: TokensFile = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        let mut entries = Vec::new();
        for (i, entry) in file.tokens.into_iter().enumerate() {
            let bytes = hex::decode(entry.sha256.trim())
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .ok_or_else(|| format!("tokens[{i}] ({}): sha256 must be 64 hex digits", entry.name))?;
            if entry.name.trim().is_empty() {
                return Err(format!("tokens[{i}]: name is empty"));
            }
            entries.push((bytes, entry.name, entry.role));
        }
        Ok(Self { entries })
    }

    /// A book with one token (local mode's generated admin token).
    pub fn single(name: &str, role: Role, token: &str) -> Self {
        Self { entries: vec![(token_hash(token), name.into(), role)] }
    }

    /// The YAML line of a token, for the tokens file.
    pub fn line(name: &str, role: Role, token: &str) -> String {
        format!("  - {{name: {name}, role: {}, sha256: {}}}", role.as_str(), hex::encode(token_hash(token)))
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry of `token`; every entry is compared, in constant time.
    fn find(&self, token: &str) -> Option<(String, Role)> {
        let presented = token_hash(token);
        let mut found = None;
        for (hash, name, role) in &self.entries {
            if bool::from(hash.ct_eq(&presented)) {
                found = Some((name.clone(), *role));
            }
        }
        found
    }
}

/// Signs and checks session cookies.
#[derive(Clone)]
pub struct Sessions {
    key: Vec<u8>,
    lifetime: Duration,
    secure: bool,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").field("lifetime", &self.lifetime).field("secure", &self.secure).finish()
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct SessionClaims {
    /// Name, role (none for a Kubernetes user), expiry (Unix seconds), CSRF
    /// token, and a Kubernetes user's uid and groups.
    n: String,
    r: Option<Role>,
    e: i64,
    c: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    k: Option<(String, Vec<String>)>,
}

type HmacSha256 = Hmac<Sha256>;
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// What a login answers.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionInfo {
    pub name: String,
    /// `null` for a Kubernetes user (cluster RBAC decides).
    pub role: Option<Role>,
    /// Echo it in `x-csrf-token` on every state-changing call made with the cookie.
    pub csrf_token: String,
    /// RFC 3339.
    pub expires_at: String,
}

impl Sessions {
    /// `key`: the shared key file's content; `None` makes a random key, so
    /// sessions hold on this replica only until it restarts.
    pub fn new(key: Option<Vec<u8>>, lifetime: Duration, secure: bool) -> Result<Self, std::io::Error> {
        let key = match key {
            Some(key) => key,
            None => {
                let mut key = vec![0u8; 32];
                getrandom::fill(&mut key).map_err(|e| std::io::Error::other(e.to_string()))?;
                key
            }
        };
        Ok(Self { key, lifetime, secure })
    }

    pub fn load_key(path: &Path) -> Result<Vec<u8>, AuthConfigError> {
        let shown = path.display().to_string();
        let key = std::fs::read(path)
            .map_err(|e| AuthConfigError::SessionKey { path: shown.clone(), problem: e.to_string() })?;
        if key.len() < 32 {
            return Err(AuthConfigError::SessionKey {
                path: shown,
                problem: format!("it holds {} bytes", key.len()),
            });
        }
        Ok(key)
    }

    fn mac(&self, payload: &str) -> Result<HmacSha256, ApiError> {
        let mut mac = HmacSha256::new_from_slice(&self.key)
            .map_err(|e| ApiError::internal(format!("session key: {e}")))?;
        mac.update(payload.as_bytes());
        Ok(mac)
    }

    /// A session for `principal`: the `Set-Cookie` value and what to tell the client.
    pub fn open(&self, principal: &Principal) -> Result<(HeaderValue, SessionInfo), ApiError> {
        let csrf = vynil_runtime::trust::generate_token().map_err(|e| ApiError::internal(e.to_string()))?;
        let expires =
            jiff::Timestamp::now() + jiff::SignedDuration::try_from(self.lifetime).unwrap_or_default();
        let kube = match &principal.grant {
            Grant::Kubernetes(user) => Some((user.uid.clone(), user.groups.clone())),
            Grant::Role(_) => None,
        };
        let (name, role) = (principal.name.as_str(), principal.role());
        let claims =
            SessionClaims { n: name.into(), r: role, e: expires.as_second(), c: csrf.clone(), k: kube };
        let payload = B64.encode(serde_json::to_vec(&claims).map_err(|e| ApiError::internal(e.to_string()))?);
        let signature = B64.encode(self.mac(&payload)?.finalize().into_bytes());
        let cookie = format!(
            "{SESSION_COOKIE}={payload}.{signature}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
            self.lifetime.as_secs(),
            if self.secure { "; Secure" } else { "" }
        );
        let cookie = HeaderValue::from_str(&cookie).map_err(|e| ApiError::internal(e.to_string()))?;
        let info = SessionInfo { name: name.into(), role, csrf_token: csrf, expires_at: expires.to_string() };
        Ok((cookie, info))
    }

    /// The `Set-Cookie` value that ends a session in the browser.
    pub fn close(&self) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        HeaderValue::from_str(&format!(
            "{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}"
        ))
        .unwrap_or(HeaderValue::from_static("vynil_session=; Path=/; Max-Age=0"))
    }

    fn verify(&self, value: &str) -> Result<Principal, ApiError> {
        let invalid = || ApiError::unauthenticated("the session cookie is not valid: log in again");
        let (payload, signature) = value.split_once('.').ok_or_else(invalid)?;
        let signature = B64.decode(signature).map_err(|_| invalid())?;
        self.mac(payload)?.verify_slice(&signature).map_err(|_| invalid())?;
        let claims: SessionClaims =
            serde_json::from_slice(&B64.decode(payload).map_err(|_| invalid())?).map_err(|_| invalid())?;
        if claims.e <= jiff::Timestamp::now().as_second() {
            return Err(ApiError::unauthenticated("the session expired: log in again"));
        }
        let grant = match (claims.r, claims.k) {
            (Some(role), _) => Grant::Role(role),
            (None, Some((uid, groups))) => {
                Grant::Kubernetes(KubeUser { username: claims.n.clone(), uid, groups })
            }
            (None, None) => return Err(invalid()),
        };
        Ok(Principal { name: claims.n, grant, via: Via::Session { csrf: claims.c } })
    }
}

/// Everything authentication needs.
#[derive(Debug)]
pub struct Authenticator {
    pub tokens: TokenBook,
    pub sessions: Sessions,
    /// TokenReview and SubjectAccessReview, with `--kubernetes-auth`.
    pub kube: Option<KubeAuth>,
}

impl Authenticator {
    /// The principal of a request, `None` without credentials, an error for
    /// a credential that is not valid (never silently anonymous).
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Option<Principal>, ApiError> {
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let token = value
                .to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim)
                .ok_or_else(|| ApiError::unauthenticated("Authorization must be `Bearer <token>`"))?;
            return self.bearer(token).await.map(Some);
        }
        match session_cookie(headers) {
            Some(value) => self.sessions.verify(value).map(Some),
            None => Ok(None),
        }
    }

    /// The principal of a bearer token (also what a login checks): a token
    /// of the tokens file, else (with `--kubernetes-auth`) a Kubernetes user.
    pub async fn bearer(&self, token: &str) -> Result<Principal, ApiError> {
        if let Some((name, role)) = self.tokens.find(token) {
            return Ok(Principal { name, grant: Grant::Role(role), via: Via::Bearer });
        }
        let unknown = || ApiError::unauthenticated("the token is not known to this gateway");
        let kube = self.kube.as_ref().ok_or_else(unknown)?;
        let user = kube.review_token(token).await?.ok_or_else(unknown)?;
        Ok(Principal { name: user.username.clone(), grant: Grant::Kubernetes(user), via: Via::Bearer })
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

    fn authenticator() -> Authenticator {
        let book = format!(
            "tokens:\n{}\n{}\n",
            TokenBook::line("ann", Role::Viewer, "t-ann"),
            TokenBook::line("root", Role::Admin, "t-root")
        );
        Authenticator {
            tokens: TokenBook::parse(&book).unwrap(),
            sessions: Sessions::new(None, Duration::from_secs(60), false).unwrap(),
            kube: None,
        }
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
        let root = auth.authenticate(&headers(&[("authorization", "Bearer t-root")])).await.unwrap().unwrap();
        assert_eq!((root.name.as_str(), root.role()), ("root", Some(Role::Admin)));
        assert!(auth.authenticate(&headers(&[("authorization", "Bearer nope")])).await.is_err());
        assert!(auth.authenticate(&headers(&[("authorization", "Basic eDp5")])).await.is_err());
        assert_eq!(auth.authenticate(&HeaderMap::new()).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_session_cookie_is_signed_and_a_tampered_one_is_refused() {
        let auth = authenticator();
        let ann = auth.bearer("t-ann").await.unwrap();
        let (cookie, info) = auth.sessions.open(&ann).unwrap();
        let cookie = cookie.to_str().unwrap();
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
        let pair = cookie.split(';').next().unwrap();
        let principal = auth.authenticate(&headers(&[("cookie", pair)])).await.unwrap().unwrap();
        assert_eq!(principal.role(), Some(Role::Viewer));
        // Claiming admin in the payload breaks the signature.
        let value = pair.trim_start_matches("vynil_session=");
        let (payload, signature) = value.split_once('.').unwrap();
        let mut claims: serde_json::Value = serde_json::from_slice(&B64.decode(payload).unwrap()).unwrap();
        claims["r"] = "admin".into();
        let forged = format!("vynil_session={}.{signature}", B64.encode(claims.to_string()));
        assert!(auth.authenticate(&headers(&[("cookie", &forged)])).await.is_err());
        // Another replica with another key refuses it too.
        let other = Sessions::new(None, Duration::from_secs(60), false).unwrap();
        assert!(other.verify(value).is_err());
        // CSRF: the cookie alone does not change state.
        assert!(check_csrf(&principal, &HeaderMap::new()).is_err());
        assert!(check_csrf(&principal, &headers(&[("x-csrf-token", &info.csrf_token)])).is_ok());
    }

    #[test]
    fn a_tokens_file_with_a_bad_hash_is_an_error_naming_the_entry() {
        let error = TokenBook::parse("tokens:\n  - {name: ann, role: viewer, sha256: abc}\n").unwrap_err();
        assert!(error.contains("tokens[0] (ann)"), "{error}");
        assert!(TokenBook::parse("tokens:\n  - {name: ann, role: king, sha256: abc}\n").is_err());
    }
}
