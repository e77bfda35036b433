//! The HTTP transport and its policy: https unless a registry is declared
//! insecure, timeouts, bounded retries with jittered exponential backoff on
//! 5xx, connection errors, timeouts and truncated bodies, `429` honoured with
//! `Retry-After`, a concurrency limit per registry, a body size cap, bearer
//! tokens from the challenge, and a counter per request.
//!
//! The concurrency permit is held for one HTTP exchange only, never across a
//! backoff sleep or a token fetch: a token request goes to the same registry
//! limit, so a request holding its permit while it waits for a token would
//! deadlock as soon as `per_registry_concurrency` requests are answered 401 at
//! once (a token expiring mid-purge). Token fetches are single-flight per
//! (registry, repository, access): N concurrent 401s cause one token request,
//! and the others use its token. A token is used until its `expires_in` (60 s
//! when the token service says nothing, as the distribution token spec
//! defines), then fetched again before the registry has to refuse it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures::StreamExt;
use reqwest::{Method, StatusCode, header::HeaderMap};
use tokio::sync::Semaphore;

use crate::{
    CredentialStore, Credentials, RegistryError, RequestCounters, Result, auth::TokenResponse,
    reference::api_host,
};

/// The transport policy.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// Registries reached over plain http (e.g. a local registry); every other
    /// one over https.
    pub insecure_registries: Vec<String>,
    /// Per request, connection to last byte.
    pub timeout: Duration,
    /// Attempts per request, the first included.
    pub max_attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// A `Retry-After` longer than this is cut to it.
    pub max_retry_after: Duration,
    /// Requests in flight per registry.
    pub per_registry_concurrency: usize,
    /// Larger manifests are refused.
    pub max_manifest_bytes: usize,
    /// An unreferenced blob of an OCI image layout younger than this is
    /// not collected (a copy in progress writes blobs before its index).
    pub layout_gc_grace: Duration,
    /// `(registry, host)`: another host that may receive the registry's
    /// credentials (a token service or an API off its site,
    /// [`crate::auth::may_receive_credentials`]).
    pub credential_hosts: Vec<(String, String)>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            insecure_registries: Vec::new(),
            timeout: Duration::from_secs(30),
            max_attempts: 4,
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
            max_retry_after: Duration::from_secs(60),
            per_registry_concurrency: 8,
            max_manifest_bytes: 4 * 1024 * 1024,
            layout_gc_grace: Duration::from_secs(3600),
            credential_hosts: Vec::new(),
        }
    }
}

/// Which token an authenticated request needs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Access {
    Read,
    Delete,
}

/// One logical request (retried as one).
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// Counter kind, e.g. `get_manifest`.
    pub kind: &'static str,
    /// For errors: what was being done, e.g. `tags of r/x`.
    pub what: String,
    pub registry: String,
    pub method: Method,
    pub url: String,
    pub accept: &'static [&'static str],
    /// Registry repository and access, for the token cache; `None` for
    /// requests that are not distribution API calls.
    pub token_scope: Option<(String, Access)>,
    /// An explicit `Authorization` value (REST APIs), instead of the registry's credentials.
    pub authorization: Option<String>,
    pub max_body: usize,
    /// Attempts for this request, when not the policy's (`max_attempts`).
    pub max_attempts: Option<u32>,
}

#[derive(Debug)]
pub(crate) struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The distribution error envelope's first `(code, message)`, if any.
    pub fn error_code(&self) -> (String, String) {
        crate::decode::error_envelope(&self.body)
    }
}

/// Whose token: registry, repository, access.
type TokenKey = (String, String, Access);

#[derive(Debug, Clone)]
struct CachedToken {
    value: String,
    expires_at: Instant,
    /// The challenge it answered, to renew it before the registry refuses it.
    challenge: HashMap<String, String>,
}

/// How long a token lives when the token service gives no `expires_in`.
const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(60);

pub(crate) struct Transport {
    http: reqwest::Client,
    config: TransportConfig,
    credentials: CredentialStore,
    tokens: Mutex<HashMap<TokenKey, CachedToken>>,
    /// One token fetch in flight per key; waiters reuse its token.
    token_flights: Mutex<HashMap<TokenKey, Arc<tokio::sync::Mutex<()>>>>,
    limits: Mutex<HashMap<String, Arc<Semaphore>>>,
    pub counters: RequestCounters,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport").field("config", &self.config).finish_non_exhaustive()
    }
}

enum Failure {
    Timeout,
    Unreachable(String),
}

impl Transport {
    pub fn new(config: TransportConfig, credentials: CredentialStore) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .user_agent(concat!("vynil-control-plane/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| RegistryError::Unreachable {
                what: "building the HTTP client".into(),
                attempts: 0,
                problem: e.to_string(),
            })?;
        Ok(Self {
            http,
            config,
            credentials,
            tokens: Mutex::default(),
            token_flights: Mutex::default(),
            limits: Mutex::default(),
            counters: RequestCounters::default(),
        })
    }

    /// A transport with other credentials (and its own token cache, since
    /// tokens belong to the credentials that obtained them), counting into
    /// the same counters.
    pub fn with_credentials(&self, extra: &CredentialStore) -> Result<Self> {
        let mut transport = Self::new(self.config.clone(), self.credentials.overlaid_with(extra))?;
        transport.counters = self.counters.clone();
        Ok(transport)
    }

    pub fn config(&self) -> &TransportConfig {
        &self.config
    }

    /// `https://<API host>`, or `http://` for a registry declared insecure;
    /// the API host of Docker Hub is not its name ([`crate::reference::api_host`]).
    pub fn base_url(&self, registry: &str) -> String {
        let wanted = vynil_rules::repository::host(registry);
        let insecure =
            self.config.insecure_registries.iter().any(|r| vynil_rules::repository::host(r) == wanted);
        format!("{}://{}", if insecure { "http" } else { "https" }, api_host(registry))
    }

    fn limit(&self, registry: &str) -> Arc<Semaphore> {
        let mut limits = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        limits
            .entry(registry.to_string())
            .or_insert_with(|| {
                Arc::new(Semaphore::new(
                    self.config.per_registry_concurrency.clamp(1, Semaphore::MAX_PERMITS),
                ))
            })
            .clone()
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let exponential =
            self.config.backoff_base.saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1)));
        let capped = exponential.min(self.config.backoff_max);
        capped.mul_f64(0.5 + fastrand::f64() * 0.5)
    }

    fn retry_after(&self, headers: &HeaderMap) -> Duration {
        let value = headers.get("retry-after").and_then(|v| v.to_str().ok()).unwrap_or_default();
        let wait = value.trim().parse::<u64>().map(Duration::from_secs).ok().or_else(|| {
            httpdate::parse_http_date(value)
                .ok()
                .and_then(|at| at.duration_since(std::time::SystemTime::now()).ok())
        });
        wait.unwrap_or(self.config.backoff_base).min(self.config.max_retry_after)
    }

    fn token_key(request: &Request) -> Option<TokenKey> {
        let (repository, access) = request.token_scope.as_ref()?;
        Some((request.registry.clone(), repository.clone(), access.clone()))
    }

    /// The cached, unexpired token for this request's scope.
    fn cached_token(&self, request: &Request) -> Option<String> {
        let key = Self::token_key(request)?;
        let tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        tokens.get(&key).filter(|t| t.expires_at > Instant::now()).map(|t| t.value.clone())
    }

    /// The challenge of this scope's expired token, if it has one.
    fn expired_challenge(&self, request: &Request) -> Option<HashMap<String, String>> {
        let key = Self::token_key(request)?;
        let tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        tokens.get(&key).filter(|t| t.expires_at <= Instant::now()).map(|t| t.challenge.clone())
    }

    fn authorization(&self, request: &Request, token: Option<&str>) -> Option<String> {
        if let Some(explicit) = &request.authorization {
            return Some(explicit.clone());
        }
        if let Some(token) = token {
            return Some(format!("Bearer {token}"));
        }
        self.credentials.get(&request.registry).basic_header()
    }

    /// Sends `request`, retrying per the policy; any final HTTP status is
    /// returned to the caller except 401 (after the token flow), 429 and 5xx.
    pub async fn send(&self, request: &Request) -> Result<Response> {
        let mut attempt = 0;
        let mut token_fetched = false;
        if let Some(challenge) = self.expired_challenge(request) {
            token_fetched = true;
            self.refresh_token(request, None, &challenge).await?;
        }
        loop {
            attempt += 1;
            let token = self.cached_token(request);
            let outcome = self.attempt(request, token.as_deref()).await;
            let last = attempt >= request.max_attempts.unwrap_or(self.config.max_attempts);
            match outcome {
                Ok(response) if response.status == StatusCode::UNAUTHORIZED => {
                    if !token_fetched
                        && request.token_scope.is_some()
                        && let Some(challenge) =
                            response.header("www-authenticate").and_then(crate::decode::challenge)
                        && challenge.scheme == "bearer"
                    {
                        token_fetched = true;
                        self.refresh_token(request, token.as_deref(), &challenge.params).await?;
                        attempt -= 1;
                        continue;
                    }
                    let (code, message) = response.error_code();
                    let detail = if code.is_empty() { String::new() } else { format!(" {code}: {message}") };
                    return Err(RegistryError::Unauthorized {
                        registry: request.registry.clone(),
                        what: request.what.clone(),
                        status: 401,
                        detail,
                    });
                }
                Ok(response) if response.status == StatusCode::TOO_MANY_REQUESTS => {
                    if last {
                        return Err(RegistryError::RateLimited {
                            what: request.what.clone(),
                            attempts: attempt,
                        });
                    }
                    let wait = self.retry_after(&response.headers);
                    tracing::debug!(what = %request.what, ?wait, "rate limited, waiting");
                    tokio::time::sleep(wait).await;
                }
                Ok(response) if response.status.is_server_error() => {
                    if last {
                        let (code, message) = response.error_code();
                        return Err(RegistryError::Registry {
                            what: request.what.clone(),
                            status: response.status.as_u16(),
                            code,
                            message,
                        });
                    }
                    tokio::time::sleep(self.backoff(attempt)).await;
                }
                Ok(response) => return Ok(response),
                Err(Ok(too_large)) => return Err(too_large),
                Err(Err(failure)) => {
                    if last {
                        return Err(match failure {
                            Failure::Timeout => RegistryError::Timeout {
                                what: request.what.clone(),
                                seconds: self.config.timeout.as_secs(),
                                attempts: attempt,
                            },
                            Failure::Unreachable(problem) => RegistryError::Unreachable {
                                what: request.what.clone(),
                                attempts: attempt,
                                problem,
                            },
                        });
                    }
                    tokio::time::sleep(self.backoff(attempt)).await;
                }
            }
        }
    }

    /// One HTTP exchange in a client span of its own (OpenTelemetry's HTTP
    /// conventions: method, `server.address`, `url.full`, status).
    /// `Err(Ok(e))` is final (too large); `Err(Err(f))` may be retried.
    async fn attempt(
        &self,
        request: &Request,
        token: Option<&str>,
    ) -> std::result::Result<Response, std::result::Result<RegistryError, Failure>> {
        use tracing::Instrument;
        let parsed = url::Url::parse(&request.url).ok();
        let span = tracing::info_span!(
            "registry_request",
            otel.name = %format!("{} {}", request.method, request.kind),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            http.request.method = %request.method,
            http.response.status_code = tracing::field::Empty,
            server.address = parsed.as_ref().and_then(|u| u.host_str()).unwrap_or_default(),
            server.port = parsed.as_ref().and_then(|u| u.port_or_known_default()).unwrap_or_default(),
            url.full = %request.url,
            vynil.registry.request = request.kind,
            "error.type" = tracing::field::Empty,
        );
        let outcome = self.exchange(request, token).instrument(span.clone()).await;
        match &outcome {
            Ok(response) => {
                span.record("http.response.status_code", response.status.as_u16());
                if response.status.is_client_error() || response.status.is_server_error() {
                    span.record("otel.status_code", "error");
                    span.record("error.type", response.status.as_str());
                }
            }
            Err(failure) => {
                span.record("otel.status_code", "error");
                let kind = match failure {
                    Ok(_) => "too_large",
                    Err(Failure::Timeout) => "timeout",
                    Err(Failure::Unreachable(_)) => "unreachable",
                };
                span.record("error.type", kind);
            }
        }
        outcome
    }

    async fn exchange(
        &self,
        request: &Request,
        token: Option<&str>,
    ) -> std::result::Result<Response, std::result::Result<RegistryError, Failure>> {
        let limit = self.limit(&request.registry);
        let Ok(_permit) = limit.acquire().await else {
            return Err(Ok(RegistryError::Unreachable {
                what: request.what.clone(),
                attempts: 0,
                problem: "transport shut down".into(),
            }));
        };
        let mut builder = self.http.request(request.method.clone(), &request.url);
        if !request.accept.is_empty() {
            builder = builder.header("Accept", request.accept.join(", "));
        }
        if let Some(authorization) = self.authorization(request, token) {
            builder = builder.header("Authorization", authorization);
        }
        let response = match builder.send().await {
            Ok(response) => response,
            Err(error) => {
                self.counters.record(request.kind, "error");
                return Err(Err(classify(&error)));
            }
        };
        let status = response.status();
        self.counters.record(request.kind, status.as_str());
        let headers = response.headers().clone();
        let too_large =
            || Err(Ok(RegistryError::TooLarge { what: request.what.clone(), limit: request.max_body }));
        if response.content_length().is_some_and(|length| length > request.max_body as u64) {
            return too_large();
        }
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(chunk) => {
                    body.extend_from_slice(&chunk);
                    if body.len() > request.max_body {
                        return too_large();
                    }
                }
                Err(error) => {
                    let failure = match classify(&error) {
                        Failure::Timeout => Failure::Timeout,
                        Failure::Unreachable(problem) => {
                            Failure::Unreachable(format!("truncated answer: {problem}"))
                        }
                    };
                    return Err(Err(failure));
                }
            }
        }
        Ok(Response { status, headers, body: Bytes::from(body) })
    }

    /// Replaces `rejected` (the token a 401 refused, or none) once: the
    /// first caller fetches, the ones waiting meanwhile find its token.
    async fn refresh_token(
        &self,
        request: &Request,
        rejected: Option<&str>,
        params: &HashMap<String, String>,
    ) -> Result<()> {
        let Some(key) = Self::token_key(request) else {
            return Ok(());
        };
        let flight = {
            let mut flights = self.token_flights.lock().unwrap_or_else(|p| p.into_inner());
            flights.entry(key.clone()).or_default().clone()
        };
        let _flight = flight.lock().await;
        if let Some(current) = self.cached_token(request)
            && Some(current.as_str()) != rejected
        {
            return Ok(());
        }
        self.fetch_token(request, &key, params).await
    }

    async fn fetch_token(
        &self,
        request: &Request,
        key: &TokenKey,
        params: &HashMap<String, String>,
    ) -> Result<()> {
        let url = token_url(request, key, params)?;
        // The registry's credentials go to its own site only (or where configured).
        let realm_host =
            url.host_str().map(|h| url.port().map_or_else(|| h.to_string(), |p| format!("{h}:{p}")));
        let credentials = self.credentials.get(&request.registry).basic_header();
        let withheld = credentials.is_some()
            && !realm_host.as_deref().is_some_and(|h| {
                crate::auth::may_receive_credentials(&request.registry, h, &self.config.credential_hosts)
            });
        let token_request = Request {
            kind: "token",
            what: format!("token for {} ({})", request.registry, request.what),
            // Withheld: asked as the realm's own host, with whatever
            // credentials are configured for that host, if any.
            registry: match (&realm_host, withheld) {
                (Some(host), true) => host.clone(),
                _ => request.registry.clone(),
            },
            method: Method::GET,
            url: url.to_string(),
            accept: &["application/json"],
            token_scope: None,
            authorization: if withheld { None } else { credentials },
            max_body: 1024 * 1024,
            max_attempts: None,
        };
        let refused = |status: u16| {
            let detail = match (&realm_host, withheld) {
                (Some(host), true) => format!(
                    " from the token service {host}, which is not on {registry}'s site: its credentials were not sent there (allow it with --credential-host {registry}={host})",
                    registry = request.registry
                ),
                _ => " from the token service".into(),
            };
            RegistryError::Unauthorized {
                registry: request.registry.clone(),
                what: token_request.what.clone(),
                status,
                detail,
            }
        };
        let response = match Box::pin(self.send(&token_request)).await {
            Ok(response) => response,
            Err(RegistryError::Unauthorized { status, .. }) => return Err(refused(status)),
            Err(other) => return Err(other),
        };
        if !response.status.is_success() {
            return Err(refused(response.status.as_u16()));
        }
        let (value, lifetime) = read_token(&response.body, &token_request.what)?;
        // Renewed a little before the end, so a request in flight is not refused.
        let expires_at = Instant::now() + lifetime.mul_f64(0.9);
        self.tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), CachedToken { value, expires_at, challenge: params.clone() });
        Ok(())
    }

    pub fn credentials(&self, registry: &str) -> Credentials {
        self.credentials.get(registry)
    }
}

fn classify(error: &reqwest::Error) -> Failure {
    if error.is_timeout() {
        Failure::Timeout
    } else {
        // Credentials travel in headers, never in URLs: the text is safe to show.
        let mut text = error.to_string();
        if let Some(source) = std::error::Error::source(error) {
            text.push_str(&format!(": {source}"));
        }
        Failure::Unreachable(text)
    }
}

/// Where to ask a bearer challenge's token: its realm, with its service and
/// scope (the scope this access needs when the challenge names none).
fn token_url(request: &Request, key: &TokenKey, params: &HashMap<String, String>) -> Result<url::Url> {
    let (_, repository, access) = key;
    let realm = params.get("realm").ok_or_else(|| RegistryError::InvalidBody {
        what: request.what.clone(),
        problem: "bearer challenge without realm".into(),
    })?;
    let mut url = url::Url::parse(realm).map_err(|_| RegistryError::InvalidBody {
        what: request.what.clone(),
        problem: "bearer challenge with an invalid realm".into(),
    })?;
    {
        let mut query = url.query_pairs_mut();
        if let Some(service) = params.get("service") {
            query.append_pair("service", service);
        }
        let scope = params.get("scope").cloned().unwrap_or_else(|| match access {
            Access::Read => format!("repository:{repository}:pull"),
            Access::Delete => format!("repository:{repository}:delete"),
        });
        query.append_pair("scope", &scope);
    }
    Ok(url)
}

/// A token service's answer: the token and how long it lives.
fn read_token(body: &[u8], what: &str) -> Result<(String, Duration)> {
    let token: TokenResponse = serde_json::from_slice(body).map_err(|_| RegistryError::InvalidBody {
        what: what.to_string(),
        problem: "the token service did not answer a token".into(),
    })?;
    let lifetime = token.expires_in.map(Duration::from_secs).unwrap_or(DEFAULT_TOKEN_LIFETIME);
    let value = token.token.or(token.access_token).ok_or_else(|| RegistryError::InvalidBody {
        what: what.to_string(),
        problem: "the token service answered no token".into(),
    })?;
    Ok((value, lifetime))
}
