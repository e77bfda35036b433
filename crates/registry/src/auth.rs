//! Credentials, and the bearer-token flow of the distribution spec.
//!
//! A registry that wants a token answers `401` with
//! `WWW-Authenticate: Bearer realm="…",service="…",scope="…"`; we ask the realm
//! for a token (with basic credentials when we have some) and retry. Tokens
//! are cached per registry and access. Credentials and tokens are never
//! printed: `Debug` redacts them and errors never include them.

use std::collections::HashMap;

use base64::Engine;
use serde::Deserialize;

use crate::RegistryError;

/// How to authenticate to one registry.
#[derive(Clone, PartialEq, Eq, Default)]
pub enum Credentials {
    #[default]
    Anonymous,
    Basic {
        username: String,
        password: String,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Anonymous => f.write_str("Anonymous"),
            Credentials::Basic { .. } => f.write_str("Basic(<redacted>)"),
        }
    }
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: HashMap<String, DockerAuth>,
}

#[derive(Deserialize)]
struct DockerAuth {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

impl Credentials {
    pub fn basic(username: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials::Basic { username: username.into(), password: password.into() }
    }

    /// The credentials for `registry` in a `.dockerconfigjson` document;
    /// anonymous when it has no entry for that registry (as upstream).
    pub fn from_dockerconfigjson(document: &[u8], registry: &str) -> Result<Self, RegistryError> {
        let config: DockerConfig = serde_json::from_slice(document).map_err(|e| {
            RegistryError::Credentials(format!("not a dockerconfigjson document ({})", e.classify_name()))
        })?;
        let wanted = normalise_host(registry);
        let Some(entry) = config.auths.iter().find(|(key, _)| normalise_host(key) == wanted).map(|(_, v)| v)
        else {
            return Ok(Credentials::Anonymous);
        };
        if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|_| RegistryError::Credentials(format!("auths[{registry}].auth is not base64")))?;
            let text = String::from_utf8(decoded)
                .map_err(|_| RegistryError::Credentials(format!("auths[{registry}].auth is not UTF-8")))?;
            let (username, password) = text.split_once(':').ok_or_else(|| {
                RegistryError::Credentials(format!("auths[{registry}].auth is not `user:password`"))
            })?;
            return Ok(Credentials::basic(username, password));
        }
        match (&entry.username, &entry.password) {
            (Some(u), Some(p)) if !u.is_empty() => Ok(Credentials::basic(u.clone(), p.clone())),
            _ => Ok(Credentials::Anonymous),
        }
    }

    pub(crate) fn basic_header(&self) -> Option<String> {
        match self {
            Credentials::Anonymous => None,
            Credentials::Basic { username, password } => {
                let encoded =
                    base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
                Some(format!("Basic {encoded}"))
            }
        }
    }
}

trait ClassifyName {
    fn classify_name(&self) -> &'static str;
}

impl ClassifyName for serde_json::Error {
    fn classify_name(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Io => "i/o error",
            serde_json::error::Category::Syntax => "invalid JSON",
            serde_json::error::Category::Data => "unexpected shape",
            serde_json::error::Category::Eof => "truncated JSON",
        }
    }
}

/// Whether `registry`'s credentials may be sent to `host` (a token realm, a
/// GitLab API): its own host, a host of the same site — one a parent domain
/// of the other, or both under the same parent domain, as Docker Hub
/// (`docker.io`, `auth.docker.io`) and GitLab (`registry.gitlab.com`,
/// `gitlab.com`) are — or a pair `allowed` names (`--credential-host
/// registry=host`). Ports are ignored; an IP address is only itself. The
/// public suffix list is not consulted: `a.co.uk` and `b.co.uk` count as one
/// site, so declare such registries' other hosts instead of relying on it.
pub fn may_receive_credentials(registry: &str, host: &str, allowed: &[(String, String)]) -> bool {
    let registry = normalise_host(registry);
    let host = normalise_host(host);
    if registry == host
        || allowed.iter().any(|(r, h)| normalise_host(r) == registry && normalise_host(h) == host)
    {
        return true;
    }
    let name = |h: &str| {
        h.rsplit_once(':')
            .filter(|(_, p)| p.chars().all(|c| c.is_ascii_digit()))
            .map_or(h, |(n, _)| n)
            .to_string()
    };
    let (r, h) = (name(&registry), name(&host));
    let is_ip = |n: &str| n.parse::<std::net::IpAddr>().is_ok() || n.starts_with('[');
    if is_ip(&r) || is_ip(&h) {
        return r == h;
    }
    // A parent with at least two labels (`gitlab.com`, not `com`).
    let parent = |n: &str| n.split_once('.').map(|(_, rest)| rest.to_string()).filter(|p| p.contains('.'));
    r == h
        || parent(&r).is_some_and(|p| p == h)
        || parent(&h).is_some_and(|p| p == r)
        || parent(&r).is_some_and(|p| parent(&h).as_ref() == Some(&p))
}

/// `https://index.docker.io/v1/`, `docker.io` and `registry-1.docker.io` are one
/// registry; a scheme and a trailing path are ignored (the rules' identity).
fn normalise_host(key: &str) -> String {
    vynil_rules::repository::host(key)
}

/// Credentials per registry host.
#[derive(Debug, Clone, Default)]
pub struct CredentialStore {
    by_registry: HashMap<String, Credentials>,
}

impl CredentialStore {
    /// Every registry of a `.dockerconfigjson` document with its credentials.
    pub fn from_dockerconfigjson(document: &[u8]) -> Result<Self, RegistryError> {
        let config: DockerConfig = serde_json::from_slice(document).map_err(|e| {
            RegistryError::Credentials(format!("not a dockerconfigjson document ({})", e.classify_name()))
        })?;
        let mut store = Self::default();
        for registry in config.auths.keys() {
            store.set(registry, Credentials::from_dockerconfigjson(document, registry)?);
        }
        Ok(store)
    }

    /// The credentials of a `.dockerconfigjson` file, or none without a file.
    pub fn from_file(path: Option<&std::path::Path>) -> Result<Self, RegistryError> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let document = std::fs::read(path).map_err(|e| {
            RegistryError::Credentials(format!("cannot read {}: {}", path.display(), e.kind()))
        })?;
        Self::from_dockerconfigjson(&document)
    }

    pub fn with(mut self, registry: &str, credentials: Credentials) -> Self {
        self.set(registry, credentials);
        self
    }

    pub fn set(&mut self, registry: &str, credentials: Credentials) {
        self.by_registry.insert(normalise_host(registry), credentials);
    }

    pub fn get(&self, registry: &str) -> Credentials {
        self.by_registry.get(&normalise_host(registry)).cloned().unwrap_or_default()
    }

    /// These credentials, with `other`'s taking precedence for the registries it names.
    pub fn overlaid_with(&self, other: &CredentialStore) -> Self {
        let mut merged = self.clone();
        merged.by_registry.extend(other.by_registry.iter().map(|(k, v)| (k.clone(), v.clone())));
        merged
    }
}

#[derive(Deserialize)]
pub(crate) struct TokenResponse {
    pub token: Option<String>,
    pub access_token: Option<String>,
    /// Seconds the token stays valid.
    pub expires_in: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_go_to_their_registrys_site_or_where_configured_only() {
        let none: &[(String, String)] = &[];
        for (registry, host) in [
            ("docker.io", "auth.docker.io"),
            ("registry.gitlab.com", "gitlab.com"),
            ("registry.example.com", "gitlab.example.com"),
            ("harbor.example.com:8443", "harbor.example.com"),
        ] {
            assert!(may_receive_credentials(registry, host, none), "{registry} -> {host}");
        }
        for (registry, host) in [
            ("registry.example.com", "collector.attacker.net"),
            ("ghcr.io", "ghcr.io.attacker.net"),
            ("localhost:5000", "127.0.0.1:5000"),
            ("10.0.0.1", "10.0.0.2"),
            ("registry.example.com", "com"),
        ] {
            assert!(!may_receive_credentials(registry, host, none), "{registry} -> {host}");
        }
        let allowed = vec![("localhost:5000".to_string(), "127.0.0.1:5000".to_string())];
        assert!(may_receive_credentials("localhost:5000", "127.0.0.1:5000", &allowed));
    }

    #[test]
    fn dockerconfigjson_credentials_are_found_by_host_and_never_printed() {
        let auth = base64::engine::general_purpose::STANDARD.encode("robot:s3cret");
        let doc = format!(
            r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{auth}"}},"ghcr.io":{{"username":"u","password":"p"}}}}}}"#
        );
        let hub = Credentials::from_dockerconfigjson(doc.as_bytes(), "docker.io").unwrap();
        assert_eq!(hub, Credentials::basic("robot", "s3cret"));
        assert_eq!(format!("{hub:?}"), "Basic(<redacted>)");
        assert_eq!(
            Credentials::from_dockerconfigjson(doc.as_bytes(), "ghcr.io").unwrap(),
            Credentials::basic("u", "p")
        );
        assert_eq!(
            Credentials::from_dockerconfigjson(doc.as_bytes(), "quay.io").unwrap(),
            Credentials::Anonymous
        );
    }

    #[test]
    fn a_credential_store_holds_every_registry_of_a_document() {
        let auth = base64::engine::general_purpose::STANDARD.encode("robot:s3cret");
        let doc = format!(
            r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{auth}"}},"ghcr.io":{{"username":"u","password":"p"}}}}}}"#
        );
        let store = CredentialStore::from_dockerconfigjson(doc.as_bytes()).unwrap();
        assert_eq!(store.get("docker.io"), Credentials::basic("robot", "s3cret"));
        assert_eq!(store.get("ghcr.io"), Credentials::basic("u", "p"));
        assert_eq!(store.get("quay.io"), Credentials::Anonymous);
        assert!(!format!("{store:?}").contains("s3cret"));
    }

    #[test]
    fn a_malformed_dockerconfigjson_is_a_clear_error_without_its_content() {
        let error =
            Credentials::from_dockerconfigjson(br#"{"auths":{"r":{"auth":"!!notbase64 s3cret"}}}"#, "r")
                .unwrap_err();
        assert!(error.to_string().contains("auths[r].auth is not base64"), "{error}");
        assert!(!error.to_string().contains("s3cret"));
        let error = Credentials::from_dockerconfigjson(b"password=s3cret", "r").unwrap_err();
        assert!(error.to_string().contains("invalid JSON"), "{error}");
        assert!(!error.to_string().contains("s3cret"));
    }
}
