//! Browser sessions: signed cookies that name the token they were opened
//! with, and the CSRF token a state-changing call must carry.

use std::{path::Path, time::Duration};

use axum::http::HeaderValue;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use super::*;

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
    /// The hash of the token a tokens-file session was opened with (hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    t: Option<String>,
    /// A Kubernetes session's token, sealed (AES-256-GCM under a key derived
    /// from the session key): reviewed again when its review expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    s: Option<String>,
}

/// What a session holds on to, checked again on every call.
pub(crate) enum Held {
    /// The hash of the tokens-file token it was opened with.
    Token([u8; 32]),
    /// The Kubernetes token it was opened with.
    Kubernetes(String),
}

type HmacSha256 = Hmac<Sha256>;
pub(super) const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

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

    pub(crate) fn mac(&self, payload: &str) -> Result<HmacSha256, ApiError> {
        let mut mac = HmacSha256::new_from_slice(&self.key)
            .map_err(|e| ApiError::internal(format!("session key: {e}")))?;
        mac.update(payload.as_bytes());
        Ok(mac)
    }

    /// The key that seals Kubernetes tokens in cookies: derived from the
    /// session key, so every replica that verifies a cookie can open it.
    fn seal_key(&self) -> Result<aws_lc_rs::aead::LessSafeKey, ApiError> {
        let mut derived = Sha256::new();
        derived.update(b"vynil session: sealed Kubernetes token\0");
        derived.update(&self.key);
        let key = aws_lc_rs::aead::UnboundKey::new(&aws_lc_rs::aead::AES_256_GCM, &derived.finalize())
            .map_err(|_| ApiError::internal("cannot derive the session sealing key"))?;
        Ok(aws_lc_rs::aead::LessSafeKey::new(key))
    }

    /// `token` sealed: base64 of a random nonce and the ciphertext with its tag.
    fn seal(&self, token: &str) -> Result<String, ApiError> {
        let mut nonce = [0u8; aws_lc_rs::aead::NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| ApiError::internal(e.to_string()))?;
        let mut sealed = token.as_bytes().to_vec();
        self.seal_key()?
            .seal_in_place_append_tag(
                aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce),
                aws_lc_rs::aead::Aad::from(SESSION_COOKIE.as_bytes()),
                &mut sealed,
            )
            .map_err(|_| ApiError::internal("cannot seal the session's token"))?;
        Ok(B64.encode([nonce.as_slice(), &sealed].concat()))
    }

    fn unseal(&self, sealed: &str) -> Option<String> {
        let bytes = B64.decode(sealed).ok()?;
        let (nonce, ciphertext) = bytes.split_at_checked(aws_lc_rs::aead::NONCE_LEN)?;
        let nonce = aws_lc_rs::aead::Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut opened = ciphertext.to_vec();
        let aad = aws_lc_rs::aead::Aad::from(SESSION_COOKIE.as_bytes());
        let plain = self.seal_key().ok()?.open_in_place(nonce, aad, &mut opened).ok()?;
        String::from_utf8(plain.to_vec()).ok()
    }

    /// A session for `principal`, opened with `bearer` (a tokens-file
    /// session names its token's hash, a Kubernetes one holds its token
    /// sealed): the `Set-Cookie` value and what to tell the client.
    pub fn open(&self, principal: &Principal, bearer: &str) -> Result<(HeaderValue, SessionInfo), ApiError> {
        let csrf = vynil_runtime::trust::generate_token().map_err(|e| ApiError::internal(e.to_string()))?;
        let expires =
            jiff::Timestamp::now() + jiff::SignedDuration::try_from(self.lifetime).unwrap_or_default();
        let kube = match &principal.grant {
            Grant::Kubernetes(user) => Some((user.uid.clone(), user.groups.clone())),
            Grant::Role(_) => None,
        };
        let (name, role) = (principal.name.as_str(), principal.role());
        let token = match &principal.via {
            Via::Bearer { token: Some(hash) } => Some(hex::encode(hash)),
            _ => None,
        };
        let sealed = match &principal.grant {
            Grant::Kubernetes(_) => Some(self.seal(bearer)?),
            Grant::Role(_) => None,
        };
        let claims = SessionClaims {
            n: name.into(),
            r: role,
            e: expires.as_second(),
            c: csrf.clone(),
            k: kube,
            t: token,
            s: sealed,
        };
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

    /// The principal of a session cookie and what it holds on to: the hash
    /// of its token (which must still be configured), or its Kubernetes
    /// token (which must still pass its review).
    pub(crate) fn verify(&self, value: &str) -> Result<(Principal, Held), ApiError> {
        let invalid = || ApiError::unauthenticated("the session cookie is not valid: log in again");
        let (payload, signature) = value.split_once('.').ok_or_else(invalid)?;
        let signature = B64.decode(signature).map_err(|_| invalid())?;
        self.mac(payload)?.verify_slice(&signature).map_err(|_| invalid())?;
        let claims: SessionClaims =
            serde_json::from_slice(&B64.decode(payload).map_err(|_| invalid())?).map_err(|_| invalid())?;
        if claims.e <= jiff::Timestamp::now().as_second() {
            return Err(ApiError::unauthenticated("the session expired: log in again"));
        }
        let token =
            claims.t.as_deref().map(|t| hex::decode(t).ok().and_then(|b| <[u8; 32]>::try_from(b).ok()));
        let sealed = claims.s.as_deref().map(|s| self.unseal(s));
        let (grant, held) = match (claims.r, claims.k, token, sealed) {
            (Some(role), _, Some(Some(hash)), None) => (Grant::Role(role), Held::Token(hash)),
            (None, Some((uid, groups)), None, Some(Some(bearer))) => (
                Grant::Kubernetes(KubeUser { username: claims.n.clone(), uid, groups }),
                Held::Kubernetes(bearer),
            ),
            // A role without the token it came from, a Kubernetes session
            // without its token (or a malformed one).
            _ => return Err(invalid()),
        };
        Ok((Principal { name: claims.n, grant, via: Via::Session { csrf: claims.c } }, held))
    }
}
