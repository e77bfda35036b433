//! The gateway: the only HTTP/JSON entry point for humans, the CLI and CI.
//! It authenticates, authorises and forwards to the services over gRPC; it
//! never writes to Kubernetes itself and computes no rule.
//!
//! - `/api/v1/…`: the API (`api`), each route with the role it needs
//!   (`routes`), errors in one shape (`error`), credentials (`auth`).
//! - `/openapi.json`: the OpenAPI 3.1 document (`openapi`).
//! - `/`: the web page (`web`), embedded.
//! - `/healthz` (the process), `/readyz` (every configured service answers
//!   its health check, naming those that do not), `/metrics` (Prometheus).
//!
//! The services trust the caller identity the gateway forwards only because
//! it presents the shared service token (`--service-token-file`); see
//! `vynil_runtime::trust`.

pub mod api;
pub mod auth;
pub mod bodies;
pub mod cli;
pub mod connections;
pub mod downstream;
pub mod error;
pub mod metrics;
pub mod openapi;
pub mod routes;
pub mod web;

use std::{future::Future, net::SocketAddr, path::PathBuf, time::Duration};

use axum::{Router, middleware, routing::get};

use crate::{
    api::App,
    auth::{Authenticator, Role, Sessions, TokenBook, Tokens},
    downstream::{Downstreams, Service},
};

/// Gateway configuration: flags, each with an environment fallback.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "vynil-gateway", version, about = "HTTP/JSON front of the Vynil control plane")]
pub struct Config {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Address the HTTP server listens on.
    #[arg(long, env = "VYNIL_GATEWAY_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// The catalog service, e.g. `http://vynil-catalog:50051`.
    #[arg(long, env = "VYNIL_CATALOG_ENDPOINT")]
    pub catalog_endpoint: Option<String>,
    #[arg(long, env = "VYNIL_SCANNER_ENDPOINT")]
    pub scanner_endpoint: Option<String>,
    #[arg(long, env = "VYNIL_PURGER_ENDPOINT")]
    pub purger_endpoint: Option<String>,
    #[arg(long, env = "VYNIL_LIFECYCLE_ENDPOINT")]
    pub lifecycle_endpoint: Option<String>,
    /// The bearer tokens (YAML: `tokens: [{name, role, sha256}]`); without
    /// it every API route but login answers 401.
    #[arg(long, env = "VYNIL_GATEWAY_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// Request bodies larger than this are refused (413 `TOO_LARGE`).
    #[arg(long, env = "VYNIL_GATEWAY_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,
    /// A connection whose request headers have not all arrived within this
    /// is closed: a client sending them slowly holds no connection.
    #[arg(long, env = "VYNIL_GATEWAY_HEADER_TIMEOUT_SECONDS", default_value_t = 10)]
    pub header_timeout_seconds: u64,
    /// A request whose whole body has not arrived within this is answered
    /// 408 `BODY_TIMEOUT`: a client trickling a body holds no handler.
    #[arg(long, env = "VYNIL_GATEWAY_BODY_TIMEOUT_SECONDS", default_value_t = 30)]
    pub body_timeout_seconds: u64,
    /// Request bodies the gateway holds at once, in bytes (each read only
    /// once its sender is authenticated); past it a request is answered
    /// 503 with `Retry-After`.
    #[arg(long, env = "VYNIL_GATEWAY_MAX_INFLIGHT_BODY_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_inflight_body_bytes: usize,
    /// Connections held at once; one more is closed before anything is read.
    #[arg(long, env = "VYNIL_GATEWAY_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,
    /// Connections one peer (an IPv6 peer by its /64) holds at once; behind
    /// an Ingress, every connection is the Ingress's.
    #[arg(long, env = "VYNIL_GATEWAY_MAX_CONNECTIONS_PER_PEER", default_value_t = 256)]
    pub max_connections_per_peer: usize,
    /// Event streams (following a scan, executing a plan) one client may
    /// hold open at once; one more is refused (429 `TOO_MANY_STREAMS`).
    #[arg(long, env = "VYNIL_GATEWAY_MAX_STREAMS_PER_CLIENT", default_value_t = 8)]
    pub max_streams_per_client: usize,
    /// The largest `limit` a list answers (jukeboxes, catalogs, instances);
    /// a larger one is refused (400 naming `limit` and this flag).
    #[arg(long, env = "VYNIL_GATEWAY_MAX_PAGE_SIZE", default_value_t = 1000)]
    pub max_page_size: usize,
    /// Registry push hooks (`hooks: [{name, format, secret|secretFile}]`):
    /// `POST /api/v1/hooks/<name>` turns a push into a scan of that
    /// repository (`docs/push.md`).
    #[arg(long, env = "VYNIL_GATEWAY_HOOKS_FILE")]
    pub hooks_file: Option<PathBuf>,
    /// The service token the services expect from the gateway.
    #[arg(long, env = "VYNIL_SERVICE_TOKEN_FILE")]
    pub service_token_file: Option<PathBuf>,
    /// The key signing session cookies, the same on every replica (≥ 32
    /// bytes); without it a random key: sessions hold on this replica only.
    #[arg(long, env = "VYNIL_GATEWAY_SESSION_KEY_FILE")]
    pub session_key_file: Option<PathBuf>,
    /// How long a browser session lasts.
    #[arg(long, env = "VYNIL_GATEWAY_SESSION_HOURS", default_value_t = 12)]
    pub session_hours: u64,
    /// Mark session cookies `Secure` (set it when TLS terminates in front of the gateway).
    #[arg(long, env = "VYNIL_GATEWAY_SECURE_COOKIES")]
    pub secure_cookies: bool,
    /// Also accept Kubernetes users: a bearer token the tokens file does not
    /// know is reviewed by the API server (TokenReview) and each call
    /// authorised by RBAC (SubjectAccessReview); see `auth::kubernetes` for the verbs.
    #[arg(long, env = "VYNIL_GATEWAY_KUBERNETES_AUTH")]
    pub kubernetes_auth: bool,
    /// How long a TokenReview answer holds; a Kubernetes user's session is
    /// reviewed again after it (a revoked token ends its sessions).
    #[arg(long, env = "VYNIL_GATEWAY_KUBERNETES_REVIEW_CACHE_SECONDS", default_value_t = 60)]
    pub kubernetes_review_cache_seconds: u64,
    /// Token reviews one source address may cause in a minute (reviews the
    /// cache answers are free); one more is answered 429 `RATE_LIMITED`.
    #[arg(long, env = "VYNIL_GATEWAY_KUBERNETES_REVIEWS_PER_MINUTE", default_value_t = 60)]
    pub kubernetes_reviews_per_minute: u32,
    /// Take a request's source address from the last `X-Forwarded-For`
    /// entry (what the proxy in front appended) rather than the TCP peer.
    /// Set it only when the gateway is reachable through that proxy alone.
    #[arg(long, env = "VYNIL_GATEWAY_TRUST_FORWARDED_FOR")]
    pub trust_forwarded_for: bool,
    /// The addresses (or networks) of the proxy in front: `X-Forwarded-For`
    /// is believed from them only, so `--trust-forwarded-for` needs them.
    #[arg(long, env = "VYNIL_GATEWAY_TRUSTED_PROXIES", value_delimiter = ',', value_parser = auth::parse_proxy)]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    #[command(flatten)]
    pub log: vynil_runtime::LogConfig,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Prints a new random token and the line to add to the tokens file.
    Token {
        #[arg(long)]
        name: String,
        #[arg(long, value_parser = parse_role)]
        role: Role,
    },
}

fn parse_role(value: &str) -> Result<Role, String> {
    Role::ALL
        .into_iter()
        .find(|r| r.as_str() == value)
        .ok_or_else(|| format!("{value:?} is not viewer, operator or admin"))
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("cannot listen on {addr}: {source} (is another process using that port? set --listen)")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
    #[error(transparent)]
    Auth(#[from] auth::AuthConfigError),
    #[error(transparent)]
    Trust(#[from] vynil_runtime::trust::TrustError),
    #[error("--{service}-endpoint: {problem}")]
    Endpoint { service: &'static str, problem: String },
    #[error("cannot make a random key: {0}")]
    Random(std::io::Error),
    #[error("--kubernetes-auth: {0}")]
    Kubernetes(String),
    #[error("--hooks-file {0}")]
    Hooks(String),
    #[error(
        "--trust-forwarded-for needs --trusted-proxies (VYNIL_GATEWAY_TRUSTED_PROXIES): the addresses of the proxy in front, the only peers whose X-Forwarded-For is believed"
    )]
    Proxies,
}

/// A bound gateway, ready to serve (binding apart so tests learn the port).
#[derive(Debug)]
pub struct Gateway {
    listener: tokio::net::TcpListener,
    router: Router,
    header_timeout: Duration,
    connections: connections::Connections,
}

impl Gateway {
    /// Binds `config.listen`; with `--kubernetes-auth`, reviews go to the
    /// cluster of the kubeconfig or the pod's service account.
    pub async fn bind(config: &Config) -> Result<Self, GatewayError> {
        let kube = match config.kubernetes_auth {
            true => Some(
                vynil_kube::client(vynil_runtime::user_agent!())
                    .await
                    .map_err(|e| GatewayError::Kubernetes(e.to_string()))?,
            ),
            false => None,
        };
        Self::bind_with(config, kube).await
    }

    /// [`Gateway::bind`] with the Kubernetes client given (tests).
    pub async fn bind_with(config: &Config, kube: Option<kube::Client>) -> Result<Self, GatewayError> {
        let router = router(config, kube)?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| GatewayError::Bind { addr: config.listen, source })?;
        let header_timeout = Duration::from_secs(config.header_timeout_seconds.max(1));
        let connections =
            connections::Connections::new(config.max_connections, config.max_connections_per_peer);
        Ok(Self { listener, router, header_timeout, connections })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, GatewayError> {
        self.listener
            .local_addr()
            .map_err(|source| GatewayError::Bind { addr: SocketAddr::from(([0, 0, 0, 0], 0)), source })
    }

    /// Serves until `shutdown` resolves, then drains. The accept loop is
    /// ours rather than `axum::serve`, which has no header read timeout
    /// (`--header-timeout-seconds`) nor connection caps (`crate::connections`).
    /// HTTP/1.1 only, as an Ingress speaks to its backends: cleartext
    /// HTTP/2 would escape the header timeout (a client sending the
    /// preface and nothing more held its connection for ever).
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), GatewayError> {
        use hyper_util::rt::{TokioIo, TokioTimer};
        tracing::info!(address = ?self.listener.local_addr().ok(), "serving HTTP/1.1");
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(TokioTimer::new()).header_read_timeout(self.header_timeout);
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        tokio::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors, say: wait, do not spin.
                        tracing::warn!(%error, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let Some(admitted) = self.connections.admit(peer.ip()) else {
                tracing::debug!(%peer, "a connection past the caps, closed");
                continue;
            };
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "cannot set TCP_NODELAY");
            }
            // The peer, for per-address budgets (`auth::Source`).
            let service = tower::ServiceExt::map_request(
                self.router.clone(),
                move |mut request: http::Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                    request
                },
            );
            let service = hyper_util::service::TowerToHyperService::new(service);
            let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
            tokio::spawn(async move {
                let _admitted = admitted;
                if let Err(error) = connection.await {
                    tracing::debug!(%error, "connection ended with an error");
                }
            });
        }
        graceful.shutdown().await;
        Ok(())
    }
}

/// Every route of the gateway, as `config` sets it up.
pub fn router(config: &Config, kube: Option<kube::Client>) -> Result<Router, GatewayError> {
    let tokens = match &config.tokens_file {
        Some(path) => Tokens::watch(path, Duration::from_secs(1))?,
        None => Tokens::fixed(TokenBook::default()),
    };
    if tokens.current().is_empty() {
        tracing::warn!(
            "no bearer token is configured (--tokens-file): every API route but login answers 401"
        );
    }
    let key = config.session_key_file.as_deref().map(Sessions::load_key).transpose()?;
    if key.is_none() {
        tracing::info!(
            "no --session-key-file: sessions are signed with a random key and hold on this replica only"
        );
    }
    let sessions =
        Sessions::new(key, Duration::from_secs(config.session_hours.max(1) * 3600), config.secure_cookies)
            .map_err(GatewayError::Random)?;
    let service_token =
        config.service_token_file.as_deref().map(vynil_runtime::trust::read_token_file).transpose()?;
    let credentials = vynil_runtime::ServiceCredentials::new(service_token.as_deref())
        .map_err(|e| GatewayError::Endpoint { service: "service-token", problem: e.message().to_string() })?;
    let endpoints = [
        (Service::Catalog, config.catalog_endpoint.clone()),
        (Service::Scanner, config.scanner_endpoint.clone()),
        (Service::Purger, config.purger_endpoint.clone()),
        (Service::Lifecycle, config.lifecycle_endpoint.clone()),
    ];
    let services = Downstreams::new(&endpoints, credentials)
        .map_err(|(service, problem)| GatewayError::Endpoint { service: service.name(), problem })?;
    let (metrics, registry) = metrics::GatewayMetrics::register();
    let review_for = Duration::from_secs(config.kubernetes_review_cache_seconds.max(1));
    let kube =
        kube.map(|client| auth::KubeAuth::new(client, review_for, config.kubernetes_reviews_per_minute));
    let source = match (config.trust_forwarded_for, config.trusted_proxies.is_empty()) {
        (false, _) => auth::Source::Peer,
        (true, false) => auth::Source::ForwardedFor { proxies: config.trusted_proxies.clone() },
        (true, true) => return Err(GatewayError::Proxies),
    };
    let hooks = api::hooks::Hooks::load(config.hooks_file.as_deref()).map_err(GatewayError::Hooks)?;
    let streams = api::Streams::new(config.max_streams_per_client);
    let pages = api::Pages::new(config.max_page_size);
    let app =
        App::new(Authenticator { tokens, sessions, kube, source }, services, metrics, hooks, streams, pages);
    let scrape = get(move || {
        let registry = registry.clone();
        async move { vynil_runtime::metrics::render(&[&registry]) }
    });
    let openapi = openapi::document();
    let bodies = bodies::Bodies::new(
        Duration::from_secs(config.body_timeout_seconds.max(1)),
        config.max_body_bytes,
        config.max_inflight_body_bytes,
    );
    let router = Router::new()
        .merge(routes::api_router(app.clone(), bodies))
        .merge(web::routes())
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(routes::readyz).with_state(app.clone()))
        .route("/metrics", scrape)
        .route(
            "/openapi.json",
            get(move || {
                let openapi = openapi.clone();
                async move { ([(http::header::CONTENT_TYPE, "application/json")], openapi) }
            }),
        )
        .nest("/api", Router::new().fallback(routes::api_not_found))
        .layer(axum::extract::DefaultBodyLimit::max(config.max_body_bytes))
        .layer(middleware::from_fn_with_state(app, routes::observe));
    Ok(router)
}

/// Runs the command line: serves, or prints a new token.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), GatewayError> {
    if let Some(Command::Token { name, role }) = &config.command {
        let token = vynil_runtime::trust::generate_token().map_err(GatewayError::Random)?;
        println!("token: {token}\ntokens file line:\n{}", TokenBook::line(name, *role, &token));
        return Ok(());
    }
    Gateway::bind(&config).await?.serve(shutdown).await
}
