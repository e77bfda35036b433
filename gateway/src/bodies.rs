//! Request bodies, read only once the sender is known (issue "Credentials
//! that stay where they belong" item 5).
//!
//! Buffering a body costs memory its sender chooses; so no body is read
//! before the request is authenticated from its headers (a bearer token, a
//! session, a hook's static secret), and then only up to the route's cap:
//! [`LOGIN_BODY_BYTES`] for logging in, [`HOOK_BODY_BYTES`] for a signed
//! hook (its signature covers the body, so it is read first), the gateway's
//! `--max-body-bytes` for the rest. Every body held counts toward one
//! budget, `--max-inflight-body-bytes`: past it a request is answered 503,
//! retried by its sender, instead of growing the gateway until the kernel
//! kills it. A body still arriving after `--body-timeout-seconds` is 408.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{body::HttpBody as _, extract::Request};
use futures::StreamExt;

use crate::error::ApiError;

/// A login's body: a name and a token.
pub const LOGIN_BODY_BYTES: usize = 8 * 1024;
/// A hook's body: a registry's batch of events (distribution sends up to
/// its `threshold`, 10 by default, a few KiB).
pub const HOOK_BODY_BYTES: usize = 64 * 1024;

/// Which cap a body is read under, named in the 413 it gets.
#[derive(Debug, Clone, Copy)]
pub enum Cap {
    Login,
    Hook,
    Api,
}

/// The gateway's bodies in flight and their bounds.
#[derive(Debug, Clone)]
pub struct Bodies {
    within: Duration,
    max_body: usize,
    max_in_flight: usize,
    in_flight: Arc<AtomicUsize>,
}

/// Bytes of a body held until the request is answered.
#[derive(Debug)]
pub struct Held {
    bytes: usize,
    in_flight: Arc<AtomicUsize>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl Bodies {
    pub fn new(within: Duration, max_body: usize, max_in_flight: usize) -> Self {
        Self { within, max_body, max_in_flight, in_flight: Arc::new(AtomicUsize::new(0)) }
    }

    /// The bytes held now (tests, metrics).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    fn limit(&self, cap: Cap) -> (usize, &'static str) {
        match cap {
            Cap::Login => (LOGIN_BODY_BYTES.min(self.max_body), "a login"),
            Cap::Hook => (
                HOOK_BODY_BYTES.min(self.max_body),
                "a hook's event batch (lower the registry's notification threshold, docs/push.md)",
            ),
            Cap::Api => (self.max_body, "the API (--max-body-bytes, VYNIL_GATEWAY_MAX_BODY_BYTES)"),
        }
    }

    /// Reads `request`'s whole body under `cap`, counting it in flight
    /// until the returned [`Held`] is dropped.
    pub async fn read(&self, request: Request, cap: Cap) -> Result<(Request, Held), ApiError> {
        let mut held = Held { bytes: 0, in_flight: self.in_flight.clone() };
        if request.body().is_end_stream() {
            return Ok((request, held));
        }
        let (limit, what) = self.limit(cap);
        let declared = request
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|length| length > limit) {
            return Err(ApiError::too_large(limit, what));
        }
        let (parts, body) = request.into_parts();
        let read = async {
            let mut data = body.into_data_stream();
            let mut buffer = bytes::BytesMut::new();
            while let Some(chunk) = data.next().await {
                let chunk = chunk.map_err(|e| ApiError::bad_request("body", e))?;
                if buffer.len() + chunk.len() > limit {
                    return Err(ApiError::too_large(limit, what));
                }
                self.reserve(&mut held, chunk.len())?;
                buffer.extend_from_slice(&chunk);
            }
            Ok(buffer.freeze())
        };
        match tokio::time::timeout(self.within, read).await {
            Ok(Ok(bytes)) => Ok((Request::from_parts(parts, axum::body::Body::from(bytes)), held)),
            Ok(Err(refused)) => Err(refused),
            Err(_) => Err(ApiError::slow_body(self.within.as_secs())),
        }
    }

    /// Counts `bytes` more in flight, or refuses when the budget is spent.
    fn reserve(&self, held: &mut Held, bytes: usize) -> Result<(), ApiError> {
        let before = self.in_flight.fetch_add(bytes, Ordering::AcqRel);
        held.bytes += bytes;
        if before.saturating_add(bytes) > self.max_in_flight {
            return Err(ApiError::busy(format!(
                "the gateway holds {} bytes of request bodies, its budget (--max-inflight-body-bytes, \
                 VYNIL_GATEWAY_MAX_INFLIGHT_BODY_BYTES): retry shortly",
                self.max_in_flight
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn post(body: Vec<u8>) -> Request {
        Request::builder().method("POST").uri("/x").body(axum::body::Body::from(body)).unwrap()
    }

    #[tokio::test]
    async fn bodies_count_while_held_and_the_budget_refuses_past_it() {
        let bodies = Bodies::new(Duration::from_secs(5), 1024 * 1024, 3000);
        let (_, first) = bodies.read(post(vec![0; 2000]), Cap::Api).await.unwrap();
        assert_eq!(bodies.in_flight(), 2000);
        let refused = bodies.read(post(vec![0; 2000]), Cap::Api).await.unwrap_err();
        assert_eq!(refused.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(bodies.in_flight(), 2000, "a refused body is released at once");
        drop(first);
        assert_eq!(bodies.in_flight(), 0);
        let login = bodies.read(post(vec![0; LOGIN_BODY_BYTES + 1]), Cap::Login).await.unwrap_err();
        assert_eq!(login.status(), http::StatusCode::PAYLOAD_TOO_LARGE);
        assert!(login.to_string().contains(&LOGIN_BODY_BYTES.to_string()), "{login}");
    }
}
