//! The one place where failures become HTTP answers.
//!
//! Every error body is `{code, message, request_id}`. `code` is stable (a
//! client switches on it); `message` says what was wrong and what to do. A
//! service's gRPC status maps by its code, as the services classify their
//! failures in one place too (`vynil_runtime::Classify`):
//!
//! | gRPC | HTTP | code |
//! |---|---|---|
//! | `INVALID_ARGUMENT` | 400 | `BAD_REQUEST` |
//! | (a body over its route's cap, refused before any service) | 413 | `TOO_LARGE` |
//! | (more request bodies in flight than `--max-inflight-body-bytes`) | 503 | `UNAVAILABLE`, with `Retry-After` |
//! | (one more event stream than `--max-streams-per-client`) | 429 | `TOO_MANY_STREAMS` |
//! | (one more token review than `--kubernetes-reviews-per-minute` from an address) | 429 | `RATE_LIMITED`, with `Retry-After` |
//! | `UNAUTHENTICATED` | 401 | `UNAUTHENTICATED` |
//! | `PERMISSION_DENIED` | 403 | `FORBIDDEN` |
//! | `NOT_FOUND` | 404 | `NOT_FOUND` |
//! | `FAILED_PRECONDITION` (a refusal, a stale plan) | 409 | `REFUSED` |
//! | `ABORTED`, `ALREADY_EXISTS` (a concurrent change) | 409 | `CONFLICT` |
//! | `UNAVAILABLE` (the service or its dependency is down), a dropped connection | 503 | `UNAVAILABLE` |
//! | `DEADLINE_EXCEEDED` | 504 | `TIMEOUT` |
//! | anything else | 500 | `INTERNAL` |
//!
//! A 503 names the service, so "which one is down" is never a guess.

use axum::{
    Json,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde::{Deserialize, Serialize};
use tonic::Code;
use utoipa::ToSchema;

/// The body of every error answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// Stable: BAD_REQUEST, UNAUTHENTICATED, FORBIDDEN, NOT_FOUND, BODY_TIMEOUT, TOO_LARGE,
    /// TOO_MANY_STREAMS, RATE_LIMITED, REFUSED, CONFLICT, UNAVAILABLE, TIMEOUT, INTERNAL.
    pub code: String,
    /// What was wrong and what to do.
    pub message: String,
    /// The request's id, as in the `x-request-id` header and the logs.
    pub request_id: String,
}

/// An error answer; the request id is added by the request-id layer.
#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Seconds, sent as `Retry-After`.
    retry_after: Option<u64>,
    /// The methods a path answers, sent as `Allow` with a 405.
    allow: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), retry_after: None, allow: None }
    }

    /// A request that cannot be right: `field` names what to fix.
    pub fn bad_request(field: &str, problem: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", format!("{field}: {problem}"))
    }

    /// A body over `limit` bytes, the cap of `what`.
    pub fn too_large(limit: usize, what: &str) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "TOO_LARGE",
            format!("the request body is over {limit} bytes, the limit of {what}: send less"),
        )
    }

    /// The gateway holds as much as it may now: retry shortly.
    pub fn busy(message: impl Into<String>) -> Self {
        let mut error = Self::new(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", message);
        error.retry_after = Some(1);
        error
    }

    pub fn slow_body(seconds: u64) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "BODY_TIMEOUT",
            format!(
                "the request body did not arrive within {seconds} s: send it at once, or raise \
                 --body-timeout-seconds (VYNIL_GATEWAY_BODY_TIMEOUT_SECONDS) on the gateway"
            ),
        )
    }

    /// One event stream more than a client may hold.
    pub fn too_many_streams(client: &str, max: usize) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TOO_MANY_STREAMS",
            format!(
                "{client} already holds {max} event streams open: close one, or raise --max-streams-per-client \
                 (VYNIL_GATEWAY_MAX_STREAMS_PER_CLIENT) on the gateway"
            ),
        )
    }

    /// More than a source address may cause; `retry_after` is when it may again.
    pub fn rate_limited(message: impl Into<String>, retry_after: std::time::Duration) -> Self {
        let mut error = Self::new(StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED", message);
        error.retry_after = Some(retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0));
        error
    }

    /// A body that could not be read: over the limit, or cut.
    pub fn unreadable_body(status: StatusCode, problem: impl std::fmt::Display) -> Self {
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "TOO_LARGE",
                format!("{problem}: send less, or raise --max-body-bytes (VYNIL_GATEWAY_MAX_BODY_BYTES)"),
            )
        } else {
            Self::bad_request("body", problem)
        }
    }

    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "FORBIDDEN", message)
    }

    /// Refused as things stand (a confirmation that does not name the target).
    pub fn refused(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "REFUSED", message)
    }

    /// `method` is not one `path` answers; `allow` lists those it does.
    pub fn method_not_allowed(method: &str, path: &str, allow: String) -> Self {
        let mut error = Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "METHOD_NOT_ALLOWED",
            format!(
                "{path} does not answer {method}: use one of {allow} (the API is described at /openapi.json)"
            ),
        );
        error.allow = Some(allow);
        error
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NOT_FOUND", message)
    }

    /// `service` is not configured or not reachable.
    pub fn unavailable(service: &str, message: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            format!("{service} is unavailable: {message}"),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", message)
    }

    /// What `service` answered.
    pub fn from_status(service: &str, status: &tonic::Status) -> Self {
        let message = status.message().to_string();
        let (http, code) = match status.code() {
            Code::InvalidArgument | Code::OutOfRange => (StatusCode::BAD_REQUEST, "BAD_REQUEST"),
            Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
            Code::PermissionDenied => (StatusCode::FORBIDDEN, "FORBIDDEN"),
            Code::NotFound => (StatusCode::NOT_FOUND, "NOT_FOUND"),
            // A record the services' shared state lost: gone, make it again.
            Code::DataLoss => (StatusCode::GONE, "LOST"),
            Code::FailedPrecondition => (StatusCode::CONFLICT, "REFUSED"),
            Code::Aborted | Code::AlreadyExists => (StatusCode::CONFLICT, "CONFLICT"),
            // The connection failed or dropped: the service did not answer.
            Code::Unavailable | Code::Cancelled => return Self::unavailable(service, message),
            Code::Unknown if std::error::Error::source(status).is_some() => {
                return Self::unavailable(service, message);
            }
            Code::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "TIMEOUT"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
        };
        Self::new(http, code, message)
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn body(&self, request_id: &str) -> ErrorBody {
        ErrorBody { code: self.code.into(), message: self.message.clone(), request_id: request_id.into() }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.message)
    }
}

// The request id of the request being answered, set by the request-id
// layer in a task-local so that every error body carries it.
tokio::task_local! {
    pub static REQUEST_ID: String;
}

pub fn current_request_id() -> String {
    REQUEST_ID.try_with(Clone::clone).unwrap_or_default()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body(&current_request_id());
        let mut response = (self.status, Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        if let Some(allow) = self.allow.and_then(|a| axum::http::HeaderValue::from_str(&a).ok()) {
            response.headers_mut().insert(axum::http::header::ALLOW, allow);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_grpc_code_has_one_http_answer_and_a_503_names_the_service() {
        let stale = tonic::Status::failed_precondition("the plan is stale");
        assert_eq!(ApiError::from_status("purger", &stale).status(), StatusCode::CONFLICT);
        let bad = tonic::Status::invalid_argument("filter: 3 segments");
        assert_eq!(ApiError::from_status("scanner", &bad).status(), StatusCode::BAD_REQUEST);
        let down = ApiError::from_status("purger", &tonic::Status::unavailable("tcp connect error"));
        assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(down.body("r1").message.starts_with("purger is unavailable"), "{down}");
        let missing = tonic::Status::not_found("no plan p1");
        assert_eq!(ApiError::from_status("purger", &missing).body("r1").code, "NOT_FOUND");
    }
}
