//! The route table: every API route with the role it needs, the one source
//! the router, the authorization layer, the OpenAPI test and the
//! authorization matrix test all read. A route added to the router is added
//! here or it does not exist.
//!
//! Layers, outermost first: the request id and trace context (and the
//! request's metrics and log line), then, for API routes, authentication and
//! authorization before any handler runs: a request without a valid
//! credential reaches no service.

use std::{collections::HashMap, sync::Arc, time::Instant};

use axum::{
    Json, RequestExt, Router,
    extract::{MatchedPath, Path, Query, Request, State, rejection::PathRejection},
    http::{HeaderValue, Method, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{MethodRouter, delete, get, post},
};
use serde_json::json;

use crate::{
    api::{self, App},
    auth::kubernetes::KubeRule,
    auth::{Grant, Role, check_csrf},
    downstream::CallContext,
    error::{ApiError, REQUEST_ID},
};

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone (logging in authenticates by its body).
    Public,
    /// A principal with at least this role.
    Role(Role),
    /// A registry's event: authenticated by the hook's own secret or
    /// signature (`crate::api::hooks`), never by a token or session.
    Hook,
}

/// One API route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub method: Method,
    pub path: &'static str,
    /// With a token of the tokens file.
    pub access: Access,
    /// For a Kubernetes user (`--kubernetes-auth`).
    pub kube: KubeRule,
}

const VIEWER: Access = Access::Role(Role::Viewer);
const OPERATOR: Access = Access::Role(Role::Operator);
const ADMIN: Access = Access::Role(Role::Admin);

type Row = (Method, &'static str, Access, KubeRule, MethodRouter<App>);

fn table() -> Vec<Row> {
    use KubeRule::{Authenticated, Jukeboxes};
    use api::{catalog, purge, recalls, scans, session};
    let read = Jukeboxes("get");
    vec![
        (Method::POST, "/api/v1/session", Access::Public, Authenticated, post(session::login)),
        (Method::DELETE, "/api/v1/session", Access::Public, Authenticated, delete(session::logout)),
        (Method::GET, "/api/v1/whoami", VIEWER, Authenticated, get(session::whoami)),
        (Method::GET, "/api/v1/version", VIEWER, Authenticated, get(session::version)),
        (Method::GET, "/api/v1/jukeboxes", VIEWER, read, get(catalog::list_jukeboxes)),
        (Method::GET, "/api/v1/jukeboxes/{jukebox}/catalog", VIEWER, read, get(catalog::get_catalog)),
        (Method::GET, "/api/v1/jukeboxes/{jukebox}/upgrade-path", VIEWER, read, get(catalog::upgrade_path)),
        (
            Method::POST,
            "/api/v1/jukeboxes/{jukebox}/scans",
            OPERATOR,
            Jukeboxes("patch"),
            post(scans::start_scan),
        ),
        (Method::GET, "/api/v1/jukeboxes/{jukebox}/scans/latest", VIEWER, read, get(scans::latest_scan)),
        (
            Method::POST,
            "/api/v1/jukeboxes/{jukebox}/recalls",
            OPERATOR,
            Jukeboxes("recall"),
            post(recalls::recall),
        ),
        (
            Method::DELETE,
            "/api/v1/jukeboxes/{jukebox}/recalls/{tag}",
            OPERATOR,
            Jukeboxes("recall"),
            delete(recalls::lift_recall),
        ),
        (
            Method::POST,
            "/api/v1/jukeboxes/{jukebox}/exports",
            ADMIN,
            Jukeboxes("export"),
            post(scans::export_index),
        ),
        (Method::GET, "/api/v1/scans/{scan_id}", VIEWER, read, get(scans::get_scan)),
        (Method::GET, "/api/v1/scans/{scan_id}/events", VIEWER, read, get(scans::follow_scan)),
        (Method::POST, "/api/v1/purge/plans", OPERATOR, Jukeboxes("list"), post(purge::create_plan)),
        (Method::GET, "/api/v1/purge/plans/{plan_id}", VIEWER, read, get(purge::get_plan)),
        (
            Method::POST,
            "/api/v1/purge/plans/{plan_id}/execute",
            ADMIN,
            Jukeboxes("purge"),
            post(purge::execute),
        ),
        (Method::GET, "/api/v1/purge/plans/{plan_id}/report", VIEWER, read, get(purge::get_report)),
        (Method::POST, "/api/v1/hooks/{hook}", Access::Hook, Authenticated, post(crate::api::hooks::receive)),
    ]
    .into_iter()
    .chain(instance_rows())
    .collect()
}

/// The routes of instances: explanations and operators' decisions.
fn instance_rows() -> Vec<Row> {
    use KubeRule::{Instance, Instances, Jukeboxes};
    use api::instances;
    vec![
        (Method::GET, "/api/v1/instances", VIEWER, Instances("list"), get(instances::list_instances)),
        (
            Method::GET,
            "/api/v1/instances/{kind}/{namespace}/{name}/explain",
            OPERATOR,
            Instance("get"),
            get(instances::explain),
        ),
        (
            Method::POST,
            "/api/v1/instances/{kind}/{namespace}/{name}/allow-delete-without-package",
            ADMIN,
            Jukeboxes("delete-without-package"),
            post(instances::allow_delete_without_package),
        ),
        (
            Method::POST,
            "/api/v1/instances/{kind}/{namespace}/{name}/rollback",
            OPERATOR,
            Jukeboxes("rollback"),
            post(instances::roll_back),
        ),
        (
            Method::POST,
            "/api/v1/instances/{kind}/{namespace}/{name}/clear-quarantine",
            OPERATOR,
            Jukeboxes("clear-quarantine"),
            post(instances::clear_quarantine),
        ),
        (
            Method::POST,
            "/api/v1/instances/{kind}/{namespace}/{name}/approve-upgrade",
            OPERATOR,
            Jukeboxes("approve-upgrade"),
            post(instances::approve_upgrade),
        ),
    ]
}

/// Every API route and the access it needs.
pub fn route_table() -> Vec<RouteSpec> {
    table()
        .into_iter()
        .map(|(method, path, access, kube, _)| RouteSpec { method, path, access, kube })
        .collect()
}

/// Each path's methods and what they need: looked up by the matched path.
type AccessMap = Arc<HashMap<&'static str, Vec<(Method, Access, KubeRule)>>>;

/// The API routes behind authentication and authorization.
pub fn api_router(app: App, bodies: crate::bodies::Bodies) -> Router {
    let mut access: HashMap<&'static str, Vec<(Method, Access, KubeRule)>> = HashMap::new();
    let mut router: Router<App> = Router::new();
    for (method, path, needed, kube, handler) in table() {
        access.entry(path).or_default().push((method, needed, kube));
        router = router.route(path, handler);
    }
    let guard = Guard { app: app.clone(), access: Arc::new(access), bodies };
    router.route_layer(middleware::from_fn_with_state(guard, authorize)).with_state(app)
}

#[derive(Debug, Clone)]
struct Guard {
    app: App,
    access: AccessMap,
    bodies: crate::bodies::Bodies,
}

/// What the request-id layer learnt of a request.
#[derive(Debug, Clone)]
pub struct RequestMeta {
    pub id: String,
    pub trace: Vec<(&'static str, String)>,
    /// Where the request comes from (`auth::Source`).
    pub from: Option<std::net::IpAddr>,
}

async fn authorize(
    State(guard): State<Guard>,
    matched: Option<MatchedPath>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let path = matched.as_ref().map(MatchedPath::as_str).unwrap_or_default();
    // `HEAD` is answered as `GET` is (axum's `get` serves both).
    let method = if request.method() == Method::HEAD { Method::GET } else { request.method().clone() };
    let found = guard.access.get(path).and_then(|routes| {
        routes.iter().find(|(m, _, _)| *m == method).map(|(_, needed, kube)| (*needed, *kube))
    });
    let Some((needed, kube)) = found else {
        return undeclared(&guard.access, path, request.method());
    };
    let meta = request.extensions().get::<RequestMeta>().cloned();
    let from = meta.as_ref().and_then(|m| m.from);
    let principal = match needed {
        Access::Hook => None,
        _ => guard.app.auth.authenticate(request.headers(), from).await?,
    };
    if let Access::Role(role) = needed {
        let principal = principal.as_ref().ok_or_else(|| {
            ApiError::unauthenticated(
                "this route needs a credential: send `Authorization: Bearer <token>` or log in",
            )
        })?;
        match &principal.grant {
            Grant::Role(granted) if *granted < role => {
                return Err(ApiError::forbidden(format!(
                    "{} {path} needs the {} role; {} is {}",
                    request.method(),
                    role.as_str(),
                    principal.name,
                    granted.as_str()
                )));
            }
            Grant::Role(_) => {}
            Grant::Kubernetes(user) => {
                let reviews = guard.app.auth.kube.as_ref().ok_or_else(|| {
                    ApiError::unauthenticated(
                        "Kubernetes users are not accepted here (--kubernetes-auth is off)",
                    )
                })?;
                // Read here only: the other grants do not need them.
                let params: Result<Path<HashMap<String, String>>, PathRejection> =
                    request.extract_parts().await;
                let params = params.map(|Path(p)| p).unwrap_or_default();
                let query: HashMap<String, String> =
                    Query::try_from_uri(request.uri()).map(|Query(q)| q).unwrap_or_default();
                for check in kube.checks(&params, &query) {
                    reviews.authorize(user, &check).await?;
                }
            }
        }
        if !matches!(*request.method(), Method::GET | Method::HEAD) {
            check_csrf(principal, request.headers())?;
        }
    }
    let context = CallContext {
        principal,
        request_id: meta.as_ref().map(|m| m.id.clone()).unwrap_or_default(),
        trace: meta.map(|m| m.trace).unwrap_or_default(),
        from,
    };
    request.extensions_mut().insert(context);
    // Only now, the sender known, is its body read (`crate::bodies`); what
    // it holds is counted until the answer.
    let (request, _held, _slot) = read_body(&guard, needed, request).await?;
    Ok(next.run(request).await)
}

/// A method the path does not declare: what it answers, before any
/// authentication work. A path missing from the table is closed.
fn undeclared(access: &AccessMap, path: &str, method: &Method) -> Result<Response, ApiError> {
    let allow = allowed_methods(access, path)
        .ok_or_else(|| ApiError::internal(format!("route {method} {path} has no access rule")))?;
    if method == Method::OPTIONS {
        let mut response = StatusCode::NO_CONTENT.into_response();
        if let Ok(value) = HeaderValue::from_str(&allow) {
            response.headers_mut().insert(axum::http::header::ALLOW, value);
        }
        return Ok(response);
    }
    Err(ApiError::method_not_allowed(method.as_str(), path, allow))
}

/// The body of an authenticated request, under its route's cap; a hook's
/// event is first admitted from its headers (`Hooks::admit`).
async fn read_body(
    guard: &Guard,
    needed: Access,
    mut request: Request,
) -> Result<(Request, crate::bodies::Held, Option<crate::api::hooks::HookSlot>), ApiError> {
    use crate::bodies::Cap;
    let (cap, slot) = match needed {
        Access::Hook => {
            let params: Result<Path<HashMap<String, String>>, PathRejection> = request.extract_parts().await;
            let hook = params.map(|Path(p)| p.get("hook").cloned().unwrap_or_default()).unwrap_or_default();
            (Cap::Hook, Some(guard.app.hooks.admit(&hook, request.headers())?))
        }
        Access::Public => (Cap::Login, None),
        Access::Role(_) => (Cap::Api, None),
    };
    let (request, held) = guard.bodies.read(request, cap).await?;
    Ok((request, held, slot))
}

/// The `Allow` value of `path` as the route table declares it (`HEAD` with
/// `GET`, and `OPTIONS`), `None` for a path the table does not hold.
fn allowed_methods(access: &AccessMap, path: &str) -> Option<String> {
    let mut methods: Vec<&str> = access.get(path)?.iter().map(|(m, _, _)| m.as_str()).collect();
    if methods.contains(&"GET") {
        methods.push("HEAD");
    }
    methods.push("OPTIONS");
    methods.sort_unstable();
    Some(methods.join(", "))
}

/// A W3C `traceparent` as the spec writes it: `00-<32 hex>-<16 hex>-<2 hex>`.
fn valid_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.chars().all(|c| c.is_ascii_hexdigit());
    parts.len() == 4 && hex(parts[0], 2) && hex(parts[1], 32) && hex(parts[2], 16) && hex(parts[3], 2)
}

/// A new request id: this process's random prefix and a counter, so ids
/// stay unique across replicas without asking the OS for randomness per
/// request.
fn new_request_id() -> String {
    use std::sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    };
    static PREFIX: OnceLock<String> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        vynil_runtime::trust::generate_token()
            .map(|t| t.chars().filter(char::is_ascii_alphanumeric).take(8).collect())
            .unwrap_or_else(|_| format!("{:08x}", nanos as u32 ^ std::process::id()))
    });
    format!("{prefix}{:08x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The outer layer: request id (from `x-request-id` when it is sane, else
/// new), trace context, one log line and the request metrics.
pub async fn observe(State(app): State<App>, mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let headers = request.headers();
    let id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty()
                && v.len() <= 64
                && v.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
        .map(String::from)
        .unwrap_or_else(new_request_id);
    let mut trace = Vec::new();
    if let Some(parent) =
        headers.get("traceparent").and_then(|v| v.to_str().ok()).filter(|v| valid_traceparent(v))
    {
        trace.push(("traceparent", parent.to_string()));
        if let Some(state) = headers.get("tracestate").and_then(|v| v.to_str().ok()) {
            trace.push(("tracestate", state.to_string()));
        }
    }
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = request.method().clone();
    let peer =
        request.extensions().get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|c| c.0.ip());
    let from = app.auth.source.of(request.headers(), peer);
    request.extensions_mut().insert(RequestMeta { id: id.clone(), trace, from });
    let span = tracing::info_span!("http", request_id = %id, method = %method, route = %route);
    vynil_runtime::extract(&span, request.headers());
    let mut response = {
        use tracing::Instrument;
        REQUEST_ID.scope(id.clone(), next.run(request)).instrument(span.clone()).await
    };
    let status = response.status().as_u16();
    let seconds = started.elapsed().as_secs_f64();
    app.metrics.observe(&route, &method, status, seconds);
    let duration_ms = (seconds * 1000.0) as u64;
    // A read that succeeded is counted (metrics) and traced; the log line is
    // for what changed something or failed (a read at debug: formatting one
    // line per catalog read costs more than serving it from rendered bytes).
    let read = matches!(method, Method::GET | Method::HEAD) && status < 400;
    span.in_scope(|| match read {
        true => tracing::debug!(status, duration_ms, "answered"),
        false => tracing::info!(status, duration_ms, "answered"),
    });
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", value);
    }
    response
}

/// Unknown paths under `/api`: a JSON 404, not an HTML one.
pub async fn api_not_found() -> ApiError {
    ApiError::not_found("no such API route: see /openapi.json")
}

/// `/readyz`: every configured service answers its health check.
pub async fn readyz(State(app): State<App>) -> Response {
    let checks = app.services.readiness().await;
    let mut ready = true;
    let mut services = serde_json::Map::new();
    for (service, verdict) in checks {
        let text = match verdict {
            Ok(None) => "ready".to_string(),
            Ok(Some(note)) => format!("ready; {note}"),
            Err(why) if why == "not configured" => why,
            Err(why) => {
                ready = false;
                why
            }
        };
        services.insert(service.name().into(), text.into());
    }
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(json!({"ready": ready, "services": services}))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_request_ids_are_distinct_and_pass_the_sanity_check_of_a_forwarded_id() {
        let ids: Vec<String> = (0..1000).map(|_| new_request_id()).collect();
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len(), "a repeated request id");
        for id in &ids {
            assert!(
                id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric()),
                "{id} would not be kept when a client sends it back"
            );
        }
        assert_eq!(ids[0][..8], ids[999][..8], "one prefix per process");
    }
}
