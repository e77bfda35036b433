//! Logging in and out (browsers), and who the caller is.

use axum::{
    Json,
    extract::{State, rejection::JsonRejection},
    http::{HeaderMap, header},
    response::IntoResponse,
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{App, Ctx, Done, Errors, body};
use crate::{
    auth::{Grant, Role, SessionInfo, Via},
    error::ApiError,
};

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct LoginRequest {
    /// A bearer token; it is exchanged for the session cookie and never stored by the browser.
    pub token: String,
}

/// Exchanges a token for an HttpOnly session cookie.
#[utoipa::path(post, path = "/api/v1/session", tag = "session", request_body = LoginRequest,
    responses((status = 200, body = SessionInfo, description = "The cookie is set (Set-Cookie)"), Errors))]
pub async fn login(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    request: Result<Json<LoginRequest>, JsonRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let request = body(request)?;
    let principal = app.auth.bearer(request.token.trim(), ctx.from).await?;
    let (cookie, info) = app.auth.sessions.open(&principal, request.token.trim())?;
    tracing::info!(principal = %principal.name, role = ?principal.role(), "session opened");
    let mut headers = HeaderMap::new();
    headers.insert(header::SET_COOKIE, cookie);
    Ok((headers, Json(info)))
}

/// Ends the session in the browser (the cookie is cleared).
#[utoipa::path(delete, path = "/api/v1/session", tag = "session",
    responses((status = 200, body = Done), Errors))]
pub async fn logout(State(app): State<App>) -> impl IntoResponse {
    let mut headers = HeaderMap::new();
    headers.insert(header::SET_COOKIE, app.auth.sessions.close());
    (headers, Json(Done { done: true }))
}

/// How the caller authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Credential {
    Bearer,
    Session,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WhoAmI {
    pub name: String,
    /// `null` for a Kubernetes user: cluster RBAC decides.
    pub role: Option<Role>,
    /// A Kubernetes user's groups.
    pub groups: Vec<String>,
    pub via: Credential,
    /// With a session: what state-changing calls must echo in `x-csrf-token`.
    pub csrf_token: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/whoami", tag = "session",
    responses((status = 200, body = WhoAmI), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn whoami(Ctx(ctx): Ctx) -> Result<Json<WhoAmI>, ApiError> {
    let principal = ctx.principal.ok_or_else(|| ApiError::unauthenticated("no credential"))?;
    let role = principal.role();
    let groups = match &principal.grant {
        Grant::Kubernetes(user) => user.groups.clone(),
        Grant::Role(_) => Vec::new(),
    };
    let (via, csrf_token) = match principal.via {
        Via::Bearer { .. } => (Credential::Bearer, None),
        Via::Session { csrf } => (Credential::Session, Some(csrf)),
    };
    Ok(Json(WhoAmI { name: principal.name, role, groups, via, csrf_token }))
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Version {
    pub gateway: String,
    pub api: String,
}

#[utoipa::path(get, path = "/api/v1/version", tag = "session",
    responses((status = 200, body = Version), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn version() -> Json<Version> {
    Json(Version { gateway: env!("CARGO_PKG_VERSION").into(), api: "v1".into() })
}
