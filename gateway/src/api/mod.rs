//! The HTTP/JSON API under `/api/v1`: a thin translation of the services'
//! gRPC APIs. No rule is computed here; roles, upgrade paths, plans and
//! explanations all come from the services. What this layer adds: input
//! validated before it reaches a service (names as DNS-1123, scan filters
//! with the rules crate's own parser), JSON shapes with enums as words,
//! pagination of lists, and errors in one shape (`crate::error`).

pub mod catalog;
pub mod hooks;
pub mod inputs;
pub mod instances;
pub mod purge;
pub mod recalls;
pub mod scans;
pub mod session;

use std::sync::Arc;

use axum::extract::{FromRequestParts, Query, rejection::QueryRejection};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use utoipa::{IntoParams, ToSchema};

use crate::{
    auth::Authenticator,
    downstream::{CallContext, Downstreams, Service},
    error::{ApiError, ErrorBody},
    metrics::GatewayMetrics,
};

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct App(Arc<AppInner>);

#[derive(Debug)]
pub struct AppInner {
    pub auth: Authenticator,
    pub services: Downstreams,
    pub metrics: GatewayMetrics,
    pub hooks: hooks::Hooks,
    /// Rendered catalog pages, served again while the catalog is unchanged.
    pub catalog_pages: catalog::RenderedPages,
    pub streams: Streams,
    pub pages: Pages,
}

impl App {
    pub fn new(
        auth: Authenticator,
        services: Downstreams,
        metrics: GatewayMetrics,
        hooks: hooks::Hooks,
        streams: Streams,
        pages: Pages,
    ) -> Self {
        let catalog_pages = catalog::RenderedPages::new(catalog::RenderedPages::CAPACITY);
        Self(Arc::new(AppInner { auth, services, metrics, hooks, catalog_pages, streams, pages }))
    }
}

/// The event streams each client holds open (`--max-streams-per-client`):
/// a stream holds a service's stream and a connection for as long as the
/// client reads, so one client cannot take them all.
#[derive(Debug, Clone)]
pub struct Streams {
    max: usize,
    open: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
}

/// One open stream of a client; dropped with the stream, it frees its place.
#[derive(Debug)]
pub struct StreamPermit {
    client: String,
    open: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
}

impl Streams {
    pub fn new(max: usize) -> Self {
        Self { max: max.max(1), open: Arc::default() }
    }

    /// A place for one more stream of `ctx`'s caller, or 429 once it holds
    /// `--max-streams-per-client`.
    pub fn open(&self, ctx: &CallContext) -> Result<StreamPermit, ApiError> {
        let client = ctx.principal.as_ref().map_or("anonymous", |p| p.name.as_str()).to_string();
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(client.clone()).or_default();
        if *count >= self.max {
            return Err(ApiError::too_many_streams(&client, self.max));
        }
        *count += 1;
        Ok(StreamPermit { client, open: self.open.clone() })
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.client) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.client);
            }
        }
    }
}

impl std::ops::Deref for App {
    type Target = AppInner;
    fn deref(&self) -> &AppInner {
        &self.0
    }
}

/// The caller context the authorization layer put in the request.
#[derive(Debug, Clone)]
pub struct Ctx(pub CallContext);

impl<S: Send + Sync> FromRequestParts<S> for Ctx {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut http::request::Parts, _: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<CallContext>()
            .cloned()
            .map(Ctx)
            .ok_or_else(|| ApiError::internal("the authorization layer did not run for this route"))
    }
}

/// A query string, its errors answered as 400 naming the parameter.
pub fn query<T: DeserializeOwned>(extracted: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    extracted.map(|Query(q)| q).map_err(|e| ApiError::bad_request("query", e.body_text()))
}

/// A JSON body, its errors answered as 400 naming what is wrong.
pub fn body<T>(
    extracted: Result<axum::Json<T>, axum::extract::rejection::JsonRejection>,
) -> Result<T, ApiError> {
    extracted.map(|axum::Json(b)| b).map_err(|e| ApiError::unreadable_body(e.status(), e.body_text()))
}

/// A service's error, as the API answers it.
pub fn failed(service: Service) -> impl Fn(tonic::Status) -> ApiError {
    move |status| ApiError::from_status(service.name(), &status)
}

pub fn check_subdomain(field: &str, value: &str) -> Result<(), ApiError> {
    inputs::Input::Subdomain.check(field, value)
}

pub fn check_label(field: &str, value: &str) -> Result<(), ApiError> {
    inputs::Input::Label.check(field, value)
}

/// An id a service gave (a scan's, a plan's), named by `field`.
pub fn check_id(field: &str, id: &str) -> Result<(), ApiError> {
    inputs::Input::Id.check(field, id)
}

/// Pagination of a list: `limit` items from the opaque `page_token`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// At most this many items (1 to the gateway's `--max-page-size`, 1000
    /// unless set; default 100).
    pub limit: Option<usize>,
    /// The `next_page_token` of the previous page.
    pub page_token: Option<String>,
}

/// How long a list answer may be (`--max-page-size`).
#[derive(Debug, Clone, Copy)]
pub struct Pages {
    max: usize,
}

impl Pages {
    pub fn new(max: usize) -> Self {
        Self { max: max.max(1) }
    }

    /// The page `query` asks for, checked before any service is asked.
    pub fn slice(self, query: &PageQuery) -> Result<Slice, ApiError> {
        let limit = query.limit.unwrap_or(100.min(self.max));
        inputs::Input::Limit { max: self.max }.check("limit", &limit.to_string())?;
        let start = inputs::Input::page_start("page_token", query.page_token.as_deref().unwrap_or_default())?;
        Ok(Slice { start, limit })
    }
}

/// A checked page: `limit` items from `start`, asked of the service that
/// holds the list (`vynil_runtime::pages`: its `page_token` is the offset).
#[derive(Debug, Clone, Copy)]
pub struct Slice {
    start: usize,
    limit: usize,
}

impl Slice {
    /// The `page_size` to ask.
    pub fn size(self) -> u32 {
        u32::try_from(self.limit).unwrap_or(u32::MAX)
    }

    /// The `page_token` to ask (empty for the first page).
    pub fn token(self) -> String {
        if self.start == 0 { String::new() } else { self.start.to_string() }
    }
}

/// The answer of a call that changed nothing to report but succeeded.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Done {
    pub done: bool,
}

/// Every error status a route may answer, for the OpenAPI document.
#[derive(Debug, utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum Errors {
    /// Bad input: the message names the field.
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// No credential, or one that is not valid.
    #[response(status = 401)]
    Unauthenticated(ErrorBody),
    /// The caller's role does not allow this (or a missing CSRF token).
    #[response(status = 403)]
    Forbidden(ErrorBody),
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// Refused as the state stands (a stale plan, a wrong confirmation) or a concurrent change.
    #[response(status = 409)]
    Conflict(ErrorBody),
    /// A scan or plan the services' shared state lost (a Redis restarted
    /// without persistence): make it again.
    #[response(status = 410)]
    Lost(ErrorBody),
    /// The body is over the gateway's `--max-body-bytes`.
    #[response(status = 413)]
    TooLarge(ErrorBody),
    /// The caller already holds `--max-streams-per-client` event streams open.
    #[response(status = 429)]
    TooManyStreams(ErrorBody),
    /// A service (named in the message) is down or not configured.
    #[response(status = 503)]
    Unavailable(ErrorBody),
}

/// A timestamp or text that is empty when unknown, as `null` in JSON.
pub fn non_empty(value: String) -> Option<String> {
    (!value.is_empty()).then_some(value)
}

/// An SSE event carrying `value` as JSON.
pub fn json_event(name: &str, value: &impl serde::Serialize) -> axum::response::sse::Event {
    axum::response::sse::Event::default()
        .event(name)
        .data(serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_gets_its_streams_back_as_they_close() {
        let streams = Streams::new(2);
        let ctx = CallContext { principal: None, request_id: "r".into(), trace: Vec::new(), from: None };
        let first = streams.open(&ctx).unwrap();
        let _second = streams.open(&ctx).unwrap();
        let refused = streams.open(&ctx).unwrap_err();
        assert_eq!(refused.status(), axum::http::StatusCode::TOO_MANY_REQUESTS);
        assert!(refused.body("r").message.contains("--max-streams-per-client"));
        drop(first);
        assert!(streams.open(&ctx).is_ok(), "a closed stream frees its place");
    }

    #[test]
    fn a_page_longer_than_the_limit_is_refused_naming_the_flag() {
        let pages = Pages::new(5);
        let query = |limit: Option<usize>| PageQuery { limit, page_token: None };
        let first = pages.slice(&query(None)).unwrap();
        assert_eq!((first.size(), first.token()), (5, String::new()), "the default is within the maximum");
        assert_eq!(pages.slice(&query(Some(5))).unwrap().size(), 5);
        for limit in [0, 6] {
            let refused = pages.slice(&query(Some(limit))).unwrap_err();
            let message = refused.body("r").message;
            assert!(message.starts_with("limit:") && message.contains("--max-page-size"), "{message}");
        }
        assert_eq!(Pages::new(1000).slice(&query(Some(1000))).unwrap().size(), 1000);
    }
}
