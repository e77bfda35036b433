//! Watches (`watch=true`), as the real server streams them: newline-delimited
//! `{"type", "object"}` events, replayed from the history then live, with
//! bookmarks, `sendInitialEvents`, `timeoutSeconds`, and `410 Expired` for a
//! version older than the history.

use std::{sync::Arc, time::Duration};

use axum::{
    body::{Body, Bytes},
    http::header,
    response::Response,
};
use serde_json::{Value, json};
use tokio::sync::{broadcast::error::RecvError, mpsc};

use super::{Call, Shared, failure, lock};
use crate::kube_api::{resources::ResourceDef, store::ApiError};

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// `watch=true`: replays what the client missed since `resourceVersion` (or
/// every object as `ADDED` without one), then streams live events, with
/// bookmarks when allowed, until `timeoutSeconds`. A version older than the
/// history answers one `ERROR` event carrying `410 Expired`, as the real
/// server does.
pub(super) fn watch_response(shared: Arc<Shared>, call: Call) -> Response {
    let (labels, fields) = match call.selectors() {
        Ok(s) => s,
        Err(e) => return failure(&e),
    };
    let bookmarks = call.query.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let initial_events = call.query.get("sendInitialEvents").is_some_and(|v| v == "true");
    let timeout = call.query.get("timeoutSeconds").and_then(|t| t.parse().ok()).unwrap_or(1800u64);
    let from = call.query.get("resourceVersion").filter(|rv| !rv.is_empty() && *rv != "0");
    let (tx, rx) = mpsc::channel::<std::result::Result<Bytes, std::convert::Infallible>>(256);
    let mut first: Vec<Bytes> = Vec::new();
    let (mut live, mut last_rv) = {
        let store = lock(&shared.store);
        let live = store.subscribe();
        match from.filter(|_| !initial_events) {
            Some(rv) => {
                let replay = rv
                    .parse::<u64>()
                    .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))
                    .and_then(|rv| store.events_since(rv));
                match replay {
                    Ok(events) => first.extend(events.iter().filter_map(|e| {
                        call.sees(e, &labels, &fields).map(|kind| event_line(kind, &e.object))
                    })),
                    Err(e) => first.push(event_line("ERROR", &e.to_status())),
                }
            }
            None => {
                let ns = call.namespace.as_deref();
                first.extend(
                    store.list(&call.def, ns, &labels, &fields).iter().map(|o| event_line("ADDED", o)),
                );
                if initial_events {
                    let mark = bookmark(&call.def, store.current_rv(), true);
                    first.push(event_line("BOOKMARK", &mark));
                }
            }
        }
        (live, store.current_rv())
    };
    let expired = first.last().is_some_and(|l| l.starts_with(b"{\"type\":\"ERROR\""));
    let interval = shared.bookmark_interval;
    let lag = shared.watch_lag;
    let mut closed = shared.watch_generation.subscribe();
    closed.mark_unchanged();
    tokio::spawn(async move {
        for line in first {
            if tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
        if expired {
            return;
        }
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        let mut ticks = tokio::time::interval(interval);
        ticks.tick().await;
        loop {
            let line = tokio::select! {
                _ = &mut deadline => return,
                _ = closed.changed() => return,
                _ = ticks.tick(), if bookmarks => event_line("BOOKMARK", &bookmark(&call.def, last_rv, false)),
                event = live.recv() => match event {
                    Ok(e) if e.rv <= last_rv => continue,
                    Ok(e) => {
                        last_rv = e.rv;
                        let Some(kind) = call.sees(&e, &labels, &fields) else { continue };
                        // Held until `lag` after its write, in order.
                        if !lag.is_zero() {
                            tokio::time::sleep_until((e.at + lag).into()).await;
                        }
                        event_line(kind, &e.object)
                    }
                    Err(RecvError::Lagged(_)) => {
                        let gone = ApiError::gone("the watch fell behind; list again");
                        let _ = tx.send(Ok(event_line("ERROR", &gone.to_status()))).await;
                        return;
                    }
                    Err(RecvError::Closed) => return,
                },
            };
            if tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| failure(&ApiError::new(500, "InternalError", "cannot build the watch response")))
}

fn bookmark(def: &ResourceDef, rv: u64, initial_events_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"kind": def.kind, "apiVersion": def.api_version(), "metadata": metadata})
}
