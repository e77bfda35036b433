//! Gateway request bodies: every JSON body the API takes, sent with any
//! content type and any bytes (mostly near-valid documents), through axum's
//! own extractor and the gateway's one rejection mapping.
//!
//! Properties: a body that cannot be read is a 4xx answer with a stable code
//! and a message, never a 5xx; a scan filter that decodes is either a valid
//! filter or a 400 naming `filter`.

use arbitrary::{Arbitrary, Result, Unstructured};
use axum::{Json, extract::FromRequest};
use http::{Request, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use vynil_gateway::{
    api::{
        body,
        instances::AllowDeleteRequest,
        purge::{ExecuteRequest, PlanRequest},
        scans::ScanRequest,
        session::LoginRequest,
    },
    error::ApiError,
};

use crate::input::{Json as AnyJson, Text, spoil};

#[derive(Debug)]
pub struct Call {
    pub route: u8,
    pub content_type: Option<&'static str>,
    pub body: Vec<u8>,
}

const CONTENT_TYPES: &[&str] = &[
    "application/json",
    "application/json; charset=utf-8",
    "text/plain",
    "application/x-www-form-urlencoded",
    "",
];

impl<'a> Arbitrary<'a> for Call {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let route = u.int_in_range(0..=4u8)?;
        let text = |u: &mut Unstructured<'a>| Text::arbitrary(u).map(|t| t.0);
        let doc: Value = match route {
            0 => json!({"filter": text(u)?, "repository": {"registry": text(u)?, "repository": text(u)?}}),
            1 => json!({"jukebox": text(u)?, "repository": {"registry": text(u)?, "repository": text(u)?}}),
            2 => {
                json!({"confirm": text(u)?, "fingerprint": text(u)?, "acknowledge_usage_unknown": AnyJson::arbitrary(u)?.0})
            }
            3 => json!({"confirm": text(u)?, "fingerprint": text(u)?, "reason": text(u)?}),
            _ => json!({"token": text(u)?}),
        };
        let body = if u.ratio(1, 8)? { Vec::arbitrary(u)? } else { spoil(u, doc)?.into_bytes() };
        let content_type = if u.ratio(7, 8)? { Some(*u.choose(CONTENT_TYPES)?) } else { None };
        Ok(Call { route, content_type, body })
    }
}

fn decode<T: DeserializeOwned + Send + 'static>(call: &Call) -> std::result::Result<T, ApiError> {
    let mut request = Request::builder().method("POST").uri("/");
    if let Some(content_type) = call.content_type {
        request = request.header("content-type", content_type);
    }
    let Ok(request) = request.body(axum::body::Body::from(call.body.clone())) else {
        return Err(ApiError::internal("request not built"));
    };
    body(futures::executor::block_on(Json::<T>::from_request(request, &())))
}

fn answered(result: std::result::Result<(), ApiError>) {
    if let Err(error) = result {
        let status = error.status();
        assert!(status.is_client_error(), "a body the client sent answered {status}");
        let answer = error.body("fuzz");
        assert!(!answer.code.is_empty() && !answer.message.is_empty());
        if status == StatusCode::BAD_REQUEST {
            assert_eq!(answer.code, "BAD_REQUEST");
        }
    }
}

pub fn run(data: &[u8]) {
    let Ok(call) = Call::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    check(&call);
}

pub fn check(call: &Call) {
    answered(match call.route {
        0 => decode::<ScanRequest>(call).and_then(|scan| {
            let filter = scan.filter.unwrap_or_default();
            vynil_rules::ScanFilter::from_request(&filter)
                .map(drop)
                .map_err(|e| ApiError::bad_request("filter", e))
        }),
        1 => decode::<PlanRequest>(call).map(drop),
        2 => decode::<ExecuteRequest>(call).map(drop),
        3 => decode::<AllowDeleteRequest>(call).map(drop),
        _ => decode::<LoginRequest>(call).map(drop),
    });
}
