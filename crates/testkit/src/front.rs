//! An HTTP front between a client and a real server (the registry), which
//! counts every request and injects faults on demand: error statuses, `429`
//! with `Retry-After`, answers slower than a timeout, truncated bodies,
//! over-size bodies. Optionally it demands a bearer token, obtained from its
//! own `/token` endpoint with basic credentials, as token-based registries do.
//!
//! Counting at the front, not in the client, is what proves "zero manifest
//! GETs" or "no DELETE sent twice". A request is *seen* when it reaches the
//! front and *answered* once the server behind it answered: a client that
//! gives up on a request may cancel it before the server ever received it,
//! so "the server deleted this twice" is counted on what it answered.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode},
    response::{IntoResponse, Response},
};
use base64::Engine;
use futures::StreamExt;

use crate::{Result, TestkitError, io};

/// What to do to a matching request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultAction {
    /// Answer this status with a distribution error body.
    Status(u16),
    /// `429 Too Many Requests` with `Retry-After: <seconds>`.
    TooManyRequests { retry_after_secs: u64 },
    /// Wait, then proxy.
    Delay(Duration),
    /// Proxy (the server acts at once), then wait before answering: a client
    /// killed meanwhile never learns the outcome.
    DelayAnswer(Duration),
    /// Proxy, but cut the body in half and drop the connection.
    Truncate,
    /// Answer 200 with a manifest-typed body of this many bytes, streamed
    /// without a Content-Length.
    Oversize(usize),
    /// Proxy, but alter one byte of a JSON body's whitespace-free content
    /// (headers kept, `Docker-Content-Digest` included): a body that no
    /// longer matches the digest the registry names.
    Tamper,
}

/// A fault for requests whose method matches (any if `None`) and whose path
/// contains `path_contains`, applied to the next `times` such requests.
#[derive(Debug, Clone)]
pub struct Fault {
    pub method: Option<Method>,
    pub path_contains: String,
    pub times: usize,
    pub action: FaultAction,
}

impl Fault {
    pub fn new(method: Option<Method>, path_contains: &str, times: usize, action: FaultAction) -> Self {
        Self { method, path_contains: path_contains.to_string(), times, action }
    }
}

/// One request seen by the front.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: Method,
    /// Path and query.
    pub path: String,
}

#[derive(Debug, Default)]
struct FrontState {
    upstream: String,
    faults: Mutex<Vec<Fault>>,
    seen: Mutex<Vec<Seen>>,
    /// Requests the server behind the front answered.
    answered: Mutex<Vec<Seen>>,
    bearer: Option<(String, String)>,
    own_url: Mutex<String>,
    /// Tokens issued before the last `expire_tokens` are refused.
    token_generation: std::sync::atomic::AtomicU64,
    /// The `expires_in` the token endpoint announces, if any.
    token_lifetime: Mutex<Option<u64>>,
    /// Whether the front answers the OCI referrers API itself.
    referrers: std::sync::atomic::AtomicBool,
}

/// A running front, stopped on drop.
#[derive(Debug)]
pub struct HttpFront {
    addr: SocketAddr,
    state: Arc<FrontState>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpFront {
    /// Proxies to `upstream` (`http://127.0.0.1:<port>`).
    pub async fn start(upstream: &str) -> Result<Self> {
        Self::start_inner(upstream, None).await
    }

    /// Also demands `Authorization: Bearer …` on `/v2/`, issuing the token at
    /// `/token` to requests carrying these basic credentials.
    pub async fn start_with_bearer(upstream: &str, user: &str, password: &str) -> Result<Self> {
        Self::start_inner(upstream, Some((user.to_string(), password.to_string()))).await
    }

    async fn start_inner(upstream: &str, bearer: Option<(String, String)>) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(io("binding the front"))?;
        let addr = listener.local_addr().map_err(io("binding the front"))?;
        let state = Arc::new(FrontState {
            upstream: upstream.trim_end_matches('/').to_string(),
            bearer,
            own_url: Mutex::new(format!("http://{addr}")),
            ..FrontState::default()
        });
        let app = axum::Router::new().fallback(handle).with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, state, task })
    }

    /// `127.0.0.1:<port>`, to use as the registry host.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    pub fn inject(&self, fault: Fault) {
        if let Ok(mut faults) = self.state.faults.lock() {
            faults.push(fault);
        }
    }

    pub fn clear_faults(&self) {
        if let Ok(mut faults) = self.state.faults.lock() {
            faults.clear();
        }
    }

    /// Every request seen so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Every request the server behind the front answered, in order: what it
    /// acted on, whether or not the client waited for the answer.
    pub fn answered(&self) -> Vec<Seen> {
        self.state.answered.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Requests of `method` whose path contains `fragment`.
    pub fn count(&self, method: &Method, fragment: &str) -> usize {
        self.seen().iter().filter(|s| s.method == *method && s.path.contains(fragment)).count()
    }

    /// Every token issued so far is refused from now on (as when tokens
    /// expire on the registry's side).
    pub fn expire_tokens(&self) {
        self.state.token_generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Tokens issued from now on announce `expires_in: seconds`.
    pub fn set_token_lifetime(&self, seconds: u64) {
        if let Ok(mut lifetime) = self.state.token_lifetime.lock() {
            *lifetime = Some(seconds);
        }
    }

    /// From now on the front answers `GET /v2/<name>/referrers/<digest>`
    /// as a registry implementing OCI distribution-spec v1.1 does (`200`, an
    /// image index of the subject's referrers, empty when it has none),
    /// from the real registry's content: the index the referrers tag schema
    /// keeps at `sha256-<hex>`. Without it the request reaches the registry
    /// (distribution 2.8 answers 404: no referrers API).
    pub fn serve_referrers(&self) {
        self.state.referrers.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn reset_counts(&self) {
        for list in [&self.state.seen, &self.state.answered] {
            if let Ok(mut list) = list.lock() {
                list.clear();
            }
        }
    }
}

impl Drop for HttpFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn take_fault(state: &FrontState, method: &Method, path: &str) -> Option<FaultAction> {
    let mut faults = state.faults.lock().ok()?;
    let fault = faults.iter_mut().find(|f| {
        f.times > 0 && f.method.as_ref().is_none_or(|m| m == method) && path.contains(&f.path_contains)
    })?;
    fault.times -= 1;
    Some(fault.action.clone())
}

fn error_body(status: StatusCode, code: &str, message: &str) -> Response {
    let body = format!(r#"{{"errors":[{{"code":"{code}","message":"{message}"}}]}}"#);
    (status, [("content-type", "application/json")], body).into_response()
}

async fn handle(State(state): State<Arc<FrontState>>, request: Request) -> Response {
    let method = request.method().clone();
    let path = request.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
    if let Ok(mut seen) = state.seen.lock() {
        seen.push(Seen { method: method.clone(), path: path.clone() });
    }
    if let Some((user, password)) = &state.bearer {
        if path.starts_with("/token") {
            return issue_token(&state, request.headers(), user, password);
        }
        let authorised = request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == format!("Bearer {}", current_token(&state)));
        if !authorised {
            let realm = state.own_url.lock().map(|u| format!("{u}/token")).unwrap_or_default();
            let challenge =
                format!(r#"Bearer realm="{realm}",service="testkit-front",scope="repository:any:pull""#);
            let mut response =
                error_body(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", "authentication required");
            if let Ok(value) = HeaderValue::from_str(&challenge) {
                response.headers_mut().insert("www-authenticate", value);
            }
            return response;
        }
    }
    if method == Method::GET
        && state.referrers.load(std::sync::atomic::Ordering::SeqCst)
        && let Some((name, subject)) = referrers_path(&path)
    {
        return referrers(&state, name, subject).await;
    }
    let fault = take_fault(&state, &method, &path);
    let seen = Seen { method: method.clone(), path: path.clone() };
    match &fault {
        Some(FaultAction::Status(code)) => {
            let status = StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return error_body(status, "INJECTED", "fault injected by the test front");
        }
        Some(FaultAction::TooManyRequests { retry_after_secs }) => {
            let mut response = error_body(StatusCode::TOO_MANY_REQUESTS, "TOOMANYREQUESTS", "slow down");
            response.headers_mut().insert("retry-after", HeaderValue::from(*retry_after_secs));
            return response;
        }
        Some(FaultAction::Oversize(size)) => {
            let chunk = Bytes::from(vec![b' '; 64 * 1024]);
            let count = size.div_ceil(chunk.len());
            let stream =
                futures::stream::iter((0..count).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
            return Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/vnd.oci.image.manifest.v1+json")
                .body(Body::from_stream(stream))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
        }
        Some(FaultAction::Delay(delay)) => tokio::time::sleep(*delay).await,
        Some(FaultAction::Truncate | FaultAction::DelayAnswer(_) | FaultAction::Tamper) | None => {}
    }
    let answer = proxy(&state, request).await;
    if answer.is_ok()
        && let Ok(mut answered) = state.answered.lock()
    {
        answered.push(seen);
    }
    match answer {
        Ok(response) if fault == Some(FaultAction::Truncate) => truncate(response).await,
        Ok(response) if fault == Some(FaultAction::Tamper) => tamper(response).await,
        Ok(response) => {
            if let Some(FaultAction::DelayAnswer(delay)) = fault {
                tokio::time::sleep(delay).await;
            }
            response
        }
        Err(error) => error_body(StatusCode::BAD_GATEWAY, "FRONT", &error.to_string()),
    }
}

/// `(name, digest)` of `/v2/<name>/referrers/<digest>[?query]`.
fn referrers_path(path: &str) -> Option<(&str, &str)> {
    let path = path.split('?').next()?;
    let (name, subject) = path.strip_prefix("/v2/")?.rsplit_once("/referrers/")?;
    subject.starts_with("sha256:").then_some((name, subject))
}

/// The referrers API's answer for `subject`: the tag schema's index read
/// from the registry, or an empty index (distribution-spec v1.1 "Listing
/// Referrers": a subject without referrers is `200` with no manifests).
async fn referrers(state: &FrontState, name: &str, subject: &str) -> Response {
    const INDEX: &str = "application/vnd.oci.image.index.v1+json";
    let tag = subject.replacen(':', "-", 1);
    let url = format!("{}/v2/{name}/manifests/{tag}", state.upstream);
    let answer = reqwest::Client::new().get(url).header("accept", INDEX).send().await;
    let body = match answer {
        Ok(answer) if answer.status() == StatusCode::NOT_FOUND => {
            format!(r#"{{"schemaVersion":2,"mediaType":"{INDEX}","manifests":[]}}"#).into_bytes()
        }
        Ok(answer) if answer.status().is_success() => match answer.bytes().await {
            Ok(bytes) => bytes.to_vec(),
            Err(e) => return error_body(StatusCode::BAD_GATEWAY, "FRONT", &e.to_string()),
        },
        Ok(answer) => return error_body(answer.status(), "FRONT", "the registry did not answer the index"),
        Err(e) => return error_body(StatusCode::BAD_GATEWAY, "FRONT", &e.to_string()),
    };
    (StatusCode::OK, [("content-type", INDEX)], body).into_response()
}

fn current_token(state: &FrontState) -> String {
    format!("front-token-{}", state.token_generation.load(std::sync::atomic::Ordering::SeqCst))
}

fn issue_token(state: &FrontState, headers: &HeaderMap, user: &str, password: &str) -> Response {
    let expected =
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")));
    let ok = headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(expected.as_str());
    if ok {
        let token = current_token(state);
        let body = match state.token_lifetime.lock().ok().and_then(|l| *l) {
            Some(seconds) => format!(r#"{{"token":"{token}","expires_in":{seconds}}}"#),
            None => format!(r#"{{"token":"{token}"}}"#),
        };
        (StatusCode::OK, [("content-type", "application/json")], body).into_response()
    } else {
        error_body(StatusCode::UNAUTHORIZED, "DENIED", "bad credentials")
    }
}

async fn proxy(state: &FrontState, request: Request) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 256 * 1024 * 1024)
        .await
        .map_err(|e| TestkitError::Fixture(format!("front cannot read a request body: {e}")))?;
    let path = parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_default();
    let mut outgoing =
        reqwest::Client::new().request(parts.method.clone(), format!("{}{path}", state.upstream));
    for (name, value) in &parts.headers {
        if name != "host" && !(state.bearer.is_some() && name == "authorization") {
            outgoing = outgoing.header(name, value);
        }
    }
    let answer = outgoing.body(body).send().await?;
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if name != "transfer-encoding" && name != "connection" {
            response = response.header(name, value);
        }
    }
    let bytes = answer.bytes().await?;
    response
        .body(Body::from(bytes))
        .map_err(|e| TestkitError::Fixture(format!("front cannot build a response: {e}")))
}

/// Half the body, then a broken connection (the declared length is kept).
async fn tamper(response: Response) -> Response {
    let (parts, body) = response.into_parts();
    let mut bytes = axum::body::to_bytes(body, 256 * 1024 * 1024).await.unwrap_or_default().to_vec();
    // A key's first letter, upper-cased: still JSON, another hash.
    if let Some(at) = bytes.windows(2).position(|w| w[0] == b'"' && w[1].is_ascii_lowercase()) {
        bytes[at + 1] = bytes[at + 1].to_ascii_uppercase();
    }
    Response::from_parts(parts, Body::from(bytes))
}

async fn truncate(response: Response) -> Response {
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 256 * 1024 * 1024).await.unwrap_or_default();
    let half = bytes.slice(..bytes.len() / 2);
    // The pause lets the headers and the first half reach the client first.
    let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(half) }).chain(
        futures::stream::once(async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "truncated by the test front"))
        }),
    );
    let mut response = Response::from_parts(parts, Body::from_stream(stream));
    response.headers_mut().insert("content-length", HeaderValue::from(bytes.len()));
    response
}
