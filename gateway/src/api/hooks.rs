//! Registry push events: `POST /api/v1/hooks/{hook}` turns a push (or a
//! delete) into a repository-scoped scan of exactly that repository, for
//! every JukeBox whose source contains it (the scanner's `NotifyPush`).
//!
//! Each hook is declared in `--hooks-file` with its format and secret:
//!
//! ```yaml
//! hooks:
//!   - name: registry          # POST /api/v1/hooks/registry
//!     format: distribution    # distribution | gitlab | harbor | generic
//!     secretFile: /etc/vynil/hooks/registry   # or `secret: ...`
//! ```
//!
//! - `distribution` (CNCF distribution's `notifications.endpoints`) and
//!   `gitlab` (GitLab's container registry, the same envelope): the secret
//!   in an `Authorization` header the endpoint configuration adds
//!   (`Bearer <secret>` or the bare secret); manifest pushes and deletes are
//!   kept, blob events ignored.
//! - `harbor`: Harbor's webhook (`PUSH_ARTIFACT`, `DELETE_ARTIFACT`), the
//!   policy's auth header holding the secret.
//! - `generic`: `{"registry", "repository", "tag", "deleted"?}` for CI
//!   pipelines, signed: `X-Vynil-Timestamp: <unix seconds>` and
//!   `X-Vynil-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`;
//!   a timestamp more than 5 minutes away is refused (a replay).
//!
//! Secrets are compared in constant time. An unknown hook, a missing or
//! wrong secret or signature is 401; a body that is not the hook's format is
//! 400 naming what is wrong. An authenticated event that is a duplicate
//! (same event id or signature, remembered for twice the replay window), that names no repository, or whose
//! repository no JukeBox knows is answered 202 and triggers nothing:
//! distribution re-sends a refused event forever and blocks its queue.

use std::{
    collections::{HashMap, VecDeque},
    path::Path,
    sync::Mutex,
};

use axum::{
    Json,
    body::Bytes,
    extract::{Path as UrlPath, State},
    http::{HeaderMap, StatusCode},
};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use utoipa::ToSchema;
use vynil_proto::scanner::v1 as pb;

use crate::{
    api::{App, Ctx},
    downstream::Service,
    error::ApiError,
};

/// How far a signed event's timestamp may be from now.
const WINDOW_SECONDS: i64 = 300;
/// How long an event id or signature is remembered: a signed event is
/// accepted while its timestamp is within the window either side of now,
/// so a replay can come up to twice the window after the first delivery.
const REMEMBERED_SECONDS: i64 = 2 * WINDOW_SECONDS;
/// Event ids and signatures each hook remembers at most; past it the
/// oldest is forgotten: a flood of one hook neither refuses its own nor
/// another hook's events (a replay of a forgotten id is then accepted, and
/// only asks for a scan again).
const REMEMBERED_MAX: usize = 20_000;

/// The wire format a hook receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Distribution,
    Gitlab,
    Harbor,
    Generic,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HookSpec {
    name: String,
    format: Format,
    secret: Option<String>,
    secret_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HooksFile {
    hooks: Vec<HookSpec>,
}

#[derive(Debug)]
struct Hook {
    format: Format,
    secret: Vec<u8>,
    /// Events of this hook handled at once ([`HOOK_CONCURRENCY`]).
    slots: std::sync::Arc<tokio::sync::Semaphore>,
    /// What this hook already received, apart from the other hooks.
    seen: Mutex<Seen>,
}

impl Hook {
    /// Whether the event `key` is new within the replay window.
    fn first(&self, key: String) -> bool {
        let now = jiff::Timestamp::now().as_second();
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).first(key, now)
    }
}

/// Events one hook handles at once; one more is answered 503 (the registry
/// sends it again) before its body is read.
pub const HOOK_CONCURRENCY: usize = 4;

/// A hook event's place among those its hook handles at once.
#[derive(Debug)]
pub struct HookSlot(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit);

/// The declared hooks.
#[derive(Debug, Default)]
pub struct Hooks {
    hooks: HashMap<String, Hook>,
}

/// Event ids and signatures seen within the replay window, oldest first.
#[derive(Debug, Default)]
struct Seen {
    order: VecDeque<(i64, String)>,
    keys: std::collections::HashSet<String>,
}

impl Seen {
    /// `false` when `key` was seen within the window, `true` the first
    /// time; a full table forgets its oldest entry.
    fn first(&mut self, key: String, now: i64) -> bool {
        while self.order.front().is_some_and(|(at, _)| *at <= now - REMEMBERED_SECONDS)
            || self.order.len() >= REMEMBERED_MAX
        {
            if let Some((_, old)) = self.order.pop_front() {
                self.keys.remove(&old);
            }
        }
        if self.keys.contains(&key) {
            return false;
        }
        self.keys.insert(key.clone());
        self.order.push_back((now, key));
        true
    }
}

impl Hooks {
    /// Admits an event to hook `name` from its headers alone, before its
    /// body is read (`crate::bodies`): the hook is declared, a static
    /// secret is the hook's, a signed event carries its signature headers
    /// (checked against the body once read), and the hook handles fewer than
    /// [`HOOK_CONCURRENCY`] events now.
    pub fn admit(&self, name: &str, headers: &HeaderMap) -> Result<HookSlot, ApiError> {
        let hook = self.hooks.get(name).ok_or_else(|| {
            ApiError::unauthenticated(format!("no hook {name:?} is declared in --hooks-file"))
        })?;
        let authenticated = match hook.format {
            Format::Generic => {
                headers.contains_key("x-vynil-timestamp") && headers.contains_key("x-vynil-signature")
            }
            _ => authorized(headers, &hook.secret),
        };
        if !authenticated {
            return Err(ApiError::unauthenticated(format!(
                "hook {name:?} needs its secret in the Authorization header, or a generic hook's signature headers (docs/push.md)"
            )));
        }
        let slot = hook.slots.clone().try_acquire_owned().map_err(|_| {
            ApiError::busy(format!(
                "hook {name:?} is handling {HOOK_CONCURRENCY} events already: send this one again"
            ))
        })?;
        Ok(HookSlot(slot))
    }

    /// The hooks of `path` (none without one). Errors name the file and what to fix.
    pub fn load(path: Option<&Path>) -> Result<Self, String> {
        let Some(path) = path else { return Ok(Self::default()) };
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let file: HooksFile = serde_yaml_ng::from_str(&text).map_err(|e| {
            format!("{}: {e} (expected `hooks: [{{name, format, secret|secretFile}}]`)", path.display())
        })?;
        let mut hooks = HashMap::new();
        for spec in file.hooks {
            let secret = match (spec.secret, spec.secret_file) {
                (Some(secret), None) => secret,
                (None, Some(file)) => std::fs::read_to_string(&file)
                    .map_err(|e| format!("hook {:?}: secretFile {}: {e}", spec.name, file.display()))?
                    .trim()
                    .to_string(),
                _ => return Err(format!("hook {:?}: give exactly one of secret and secretFile", spec.name)),
            };
            if secret.len() < 16 {
                return Err(format!("hook {:?}: the secret is shorter than 16 characters", spec.name));
            }
            let valid = !spec.name.is_empty()
                && spec.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !valid {
                return Err(format!("hook {:?}: names are lower-case letters, digits and dashes", spec.name));
            }
            if hooks
                .insert(
                    spec.name.clone(),
                    Hook {
                        format: spec.format,
                        secret: secret.into_bytes(),
                        slots: std::sync::Arc::new(tokio::sync::Semaphore::new(HOOK_CONCURRENCY)),
                        seen: Mutex::default(),
                    },
                )
                .is_some()
            {
                return Err(format!("hook {:?} is declared twice", spec.name));
            }
        }
        Ok(Self { hooks })
    }
}

/// One pushed or deleted tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Push {
    /// An id to recognise a re-sent event by, when the format has one.
    pub id: Option<String>,
    pub registry: String,
    pub repository: String,
    pub tag: String,
    pub deleted: bool,
}

fn same(secret: &[u8], given: &[u8]) -> bool {
    secret.len() == given.len() && bool::from(secret.ct_eq(given))
}

/// The secret in `Authorization`, bare or as a bearer token.
fn authorized(headers: &HeaderMap, secret: &[u8]) -> bool {
    let Some(value) = headers.get("authorization").map(|v| v.as_bytes()) else { return false };
    let bare = value.strip_prefix(b"Bearer ").or_else(|| value.strip_prefix(b"bearer ")).unwrap_or(value);
    same(secret, bare)
}

/// Checks a generic event's signature and freshness; its signature is its id.
fn signed(headers: &HeaderMap, secret: &[u8], body: &[u8], now: i64) -> Result<String, ApiError> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let (Some(timestamp), Some(signature)) = (text("x-vynil-timestamp"), text("x-vynil-signature")) else {
        return Err(ApiError::unauthenticated(
            "a generic hook event is signed: send X-Vynil-Timestamp and X-Vynil-Signature (docs/push.md)",
        ));
    };
    let at: i64 = timestamp
        .parse()
        .map_err(|_| ApiError::unauthenticated("X-Vynil-Timestamp is not a Unix time in seconds"))?;
    let given = signature
        .strip_prefix("sha256=")
        .and_then(|h| hex::decode(h).ok())
        .ok_or_else(|| ApiError::unauthenticated("X-Vynil-Signature is not sha256=<hex>"))?;
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|e| ApiError::internal(e.to_string()))?;
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    if mac.verify_slice(&given).is_err() {
        return Err(ApiError::unauthenticated("the signature does not match this hook's secret"));
    }
    if (now - at).abs() > WINDOW_SECONDS {
        return Err(ApiError::unauthenticated(format!(
            "the event was signed {}s from now, outside the {WINDOW_SECONDS}s window: a replay, or a clock to fix",
            now - at
        )));
    }
    Ok(format!("signature:{}", hex::encode(given)))
}

fn malformed(format: Format, problem: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request("body", format!("not a {format:?} event: {problem}").to_lowercase())
}

#[derive(Debug, Deserialize)]
struct Envelope {
    events: Vec<DistributionEvent>,
}

#[derive(Debug, Deserialize)]
struct DistributionEvent {
    #[serde(default)]
    id: String,
    action: String,
    target: DistributionTarget,
    #[serde(default)]
    request: DistributionRequest,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DistributionTarget {
    #[serde(default)]
    media_type: String,
    repository: String,
    #[serde(default)]
    tag: String,
    #[serde(default)]
    url: String,
}

#[derive(Debug, Default, Deserialize)]
struct DistributionRequest {
    #[serde(default)]
    host: String,
}

/// Manifest media types (a blob event is no new tag).
fn is_manifest(media_type: &str) -> bool {
    media_type.contains("manifest") || media_type.contains("image.index") || media_type.is_empty()
}

fn distribution(format: Format, body: &[u8]) -> Result<Vec<Push>, ApiError> {
    let envelope: Envelope = serde_json::from_slice(body).map_err(|e| malformed(format, e))?;
    Ok(envelope
        .events
        .into_iter()
        .filter(|e| matches!(e.action.as_str(), "push" | "delete") && is_manifest(&e.target.media_type))
        .filter_map(|event| {
            // The host the pusher used, as JukeBox sources name it; else the
            // target URL's.
            let registry = if event.request.host.is_empty() {
                url::Url::parse(&event.target.url).ok().and_then(|u| {
                    u.host_str().map(|h| u.port().map_or_else(|| h.to_string(), |p| format!("{h}:{p}")))
                })?
            } else {
                event.request.host
            };
            Some(Push {
                id: (!event.id.is_empty()).then(|| format!("event:{}", event.id)),
                registry,
                repository: event.target.repository,
                tag: event.target.tag,
                deleted: event.action == "delete",
            })
        })
        .collect())
}

#[derive(Debug, Deserialize)]
struct HarborEvent {
    r#type: String,
    #[serde(default)]
    occur_at: i64,
    event_data: HarborData,
}

#[derive(Debug, Deserialize)]
struct HarborData {
    resources: Vec<HarborResource>,
    repository: HarborRepository,
}

#[derive(Debug, Deserialize)]
struct HarborResource {
    #[serde(default)]
    digest: String,
    #[serde(default)]
    tag: String,
    resource_url: String,
}

#[derive(Debug, Deserialize)]
struct HarborRepository {
    repo_full_name: String,
}

fn harbor(body: &[u8]) -> Result<Vec<Push>, ApiError> {
    let event: HarborEvent = serde_json::from_slice(body).map_err(|e| malformed(Format::Harbor, e))?;
    let deleted = match event.r#type.as_str() {
        "PUSH_ARTIFACT" => false,
        "DELETE_ARTIFACT" => true,
        _ => return Ok(Vec::new()),
    };
    let repository = event.event_data.repository.repo_full_name;
    event
        .event_data
        .resources
        .into_iter()
        .map(|resource| {
            let registry = resource
                .resource_url
                .split_once('/')
                .map(|(host, _)| host.to_string())
                .filter(|h| !h.is_empty())
                .ok_or_else(|| malformed(Format::Harbor, "resource_url has no registry host"))?;
            Ok(Push {
                id: Some(format!(
                    "harbor:{}:{}:{}:{}",
                    event.r#type, event.occur_at, repository, resource.digest
                )),
                registry,
                repository: repository.clone(),
                tag: resource.tag,
                deleted,
            })
        })
        .collect()
}

/// The generic event of CI pipelines.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GenericEvent {
    /// Registry host with optional port, as JukeBox sources name it.
    pub registry: String,
    pub repository: String,
    #[serde(default)]
    pub tag: String,
    #[serde(default)]
    pub deleted: bool,
}

fn generic(body: &[u8], id: String) -> Result<Vec<Push>, ApiError> {
    let event: GenericEvent = serde_json::from_slice(body).map_err(|e| malformed(Format::Generic, e))?;
    Ok(vec![Push {
        id: Some(id),
        registry: event.registry,
        repository: event.repository,
        tag: event.tag,
        deleted: event.deleted,
    }])
}

/// What an accepted event caused.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HookAnswer {
    /// Events in the body that name a tag pushed or deleted.
    pub events: usize,
    /// Of those, re-sent ones (already received): ignored.
    pub duplicates: usize,
    /// The scans requested (a repository-scoped scan per JukeBox whose source
    /// contains the repository; a burst joins the queued one).
    pub scans: Vec<HookScan>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HookScan {
    pub jukebox: String,
    pub registry: String,
    pub repository: String,
    pub scan_id: String,
    pub joined_existing: bool,
}

/// Receives one event of hook `hook`.
#[utoipa::path(post, path = "/api/v1/hooks/{hook}", tag = "hooks",
    params(("hook" = String, Path, description = "The hook's name in --hooks-file")),
    request_body(content = String, description = "The registry's event, in the hook's format"),
    responses(
        (status = 202, body = HookAnswer, description = "The event was accepted: the scans it started (or joined), and what it ignored"),
        (status = 400, body = crate::error::ErrorBody),
        (status = 401, body = crate::error::ErrorBody),
        (status = 413, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody),
    ))]
pub async fn receive(
    State(app): State<App>,
    Ctx(context): Ctx,
    UrlPath(hook): UrlPath<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<(StatusCode, Json<HookAnswer>), ApiError> {
    let body = body.map_err(|e| ApiError::unreadable_body(e.status(), e.body_text()))?;
    let hooks = &app.hooks;
    let unknown = || ApiError::unauthenticated(format!("no hook {hook:?} is declared in --hooks-file"));
    let declared = hooks.hooks.get(&hook).ok_or_else(unknown)?;
    let pushes = match declared.format {
        Format::Generic => {
            let id = signed(&headers, &declared.secret, &body, jiff::Timestamp::now().as_second())?;
            generic(&body, id)?
        }
        format => {
            if !authorized(&headers, &declared.secret) {
                return Err(ApiError::unauthenticated(format!(
                    "hook {hook:?} needs its secret in the Authorization header (docs/push.md)"
                )));
            }
            match format {
                Format::Harbor => harbor(&body)?,
                _ => distribution(format, &body)?,
            }
        }
    };
    let events = pushes.len();
    let mut fresh: Vec<Push> = Vec::new();
    for push in pushes {
        let new = match &push.id {
            Some(id) => declared.first(id.clone()),
            None => true,
        };
        if new {
            fresh.push(push);
        }
    }
    let duplicates = events - fresh.len();
    // One notification per repository: a burst of tags is one request.
    let mut repositories: Vec<(String, String, String, bool)> = Vec::new();
    for push in fresh {
        if !repositories.iter().any(|(r, n, _, _)| *r == push.registry && *n == push.repository) {
            repositories.push((push.registry, push.repository, push.tag, push.deleted));
        }
    }
    let mut scans = Vec::new();
    for (registry, repository, tag, deleted) in repositories {
        let request = pb::NotifyPushRequest {
            repository: Some(pb::Repository { registry: registry.clone(), repository: repository.clone() }),
            tag,
            deleted,
        };
        let answer = app
            .services
            .scanner()?
            .notify_push(app.services.request(&context, request))
            .await
            .map_err(|status| ApiError::from_status(Service::Scanner.name(), &status))?
            .into_inner();
        scans.extend(answer.scans.into_iter().map(|s| HookScan {
            jukebox: s.jukebox,
            registry: registry.clone(),
            repository: repository.clone(),
            scan_id: s.scan_id,
            joined_existing: s.joined_existing,
        }));
    }
    Ok((StatusCode::ACCEPTED, Json(HookAnswer { events, duplicates, scans })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_distribution_envelope_keeps_manifest_events_with_the_pushers_host() {
        let body = serde_json::json!({"events": [
            {"id": "e1", "action": "push", "target": {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                "repository": "apps/web", "tag": "1.0.0", "url": "http://other:1/v2/apps/web/manifests/sha256:x"},
             "request": {"host": "127.0.0.1:5000"}},
            {"id": "e2", "action": "push", "target": {"mediaType": "application/octet-stream",
                "repository": "apps/web"}, "request": {"host": "127.0.0.1:5000"}},
            {"id": "e3", "action": "pull", "target": {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                "repository": "apps/web"}},
        ]});
        let pushes = distribution(Format::Distribution, body.to_string().as_bytes()).unwrap();
        assert_eq!(
            pushes,
            [Push {
                id: Some("event:e1".into()),
                registry: "127.0.0.1:5000".into(),
                repository: "apps/web".into(),
                tag: "1.0.0".into(),
                deleted: false
            }]
        );
    }

    /// Security review item 8: an event id is remembered for the whole
    /// replay window, however many others arrive meanwhile.
    #[test]
    fn a_replay_within_the_window_is_a_duplicate_whatever_came_between() {
        let mut seen = Seen::default();
        assert!(seen.first("hook:first".into(), 1_000));
        for i in 0..5_000 {
            assert!(seen.first(format!("hook:{i}"), 1_000 + i / 100));
        }
        assert!(!seen.first("hook:first".into(), 1_000 + REMEMBERED_SECONDS - 1), "a replay");
        assert!(seen.first("hook:first".into(), 1_000 + REMEMBERED_SECONDS), "past the window");
    }

    /// Issue #66 item 7: one table shared by all hooks answered 503 to all
    /// of them once a flood filled it. Each hook has its own, and a full
    /// one forgets its oldest entry instead of refusing.
    #[test]
    fn a_flooded_hook_refuses_nothing_and_blinds_no_other_hook() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hooks.yaml");
        let hook = |name: &str| {
            format!("  - name: {name}\n    format: distribution\n    secret: 0123456789abcdef\n")
        };
        std::fs::write(&file, format!("hooks:\n{}{}", hook("flooded"), hook("quiet"))).unwrap();
        let hooks = Hooks::load(Some(&file)).unwrap();
        let (flooded, quiet) = (&hooks.hooks["flooded"], &hooks.hooks["quiet"]);
        assert!(quiet.first("before-the-flood".into()));
        for i in 0..=REMEMBERED_MAX {
            assert!(flooded.first(format!("flood-{i}")), "event {i} of the flood refused or mistaken");
        }
        assert!(flooded.first("after-the-flood".into()), "the flooded hook still takes new events");
        assert!(quiet.first("during-the-flood".into()), "another hook takes its events");
        assert!(!quiet.first("before-the-flood".into()), "and still knows its own");
    }

    #[test]
    fn a_signature_is_checked_against_the_secret_and_the_window() {
        let secret = b"0123456789abcdef";
        let body = br#"{"registry":"r:1","repository":"a/b"}"#;
        let sign = |at: i64| {
            let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
            mac.update(format!("{at}.").as_bytes());
            mac.update(body);
            let mut headers = HeaderMap::new();
            headers.insert("x-vynil-timestamp", at.to_string().parse().unwrap());
            let signature = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
            headers.insert("x-vynil-signature", signature.parse().unwrap());
            headers
        };
        assert!(signed(&sign(1000), secret, body, 1000).is_ok());
        assert!(signed(&sign(1000), b"another-secret-00", body, 1000).is_err(), "wrong secret");
        assert!(signed(&sign(1000), secret, b"{}", 1000).is_err(), "another body");
        assert!(signed(&sign(1000), secret, body, 1000 + WINDOW_SECONDS + 1).is_err(), "a replay");
        assert!(signed(&HeaderMap::new(), secret, body, 1000).is_err(), "unsigned");
    }

    #[test]
    fn the_secret_must_match_exactly() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer 0123456789abcdef".parse().unwrap());
        assert!(authorized(&headers, b"0123456789abcdef"));
        assert!(!authorized(&headers, b"0123456789abcdeX"));
        assert!(!authorized(&headers, b"0123456789abcde"));
        headers.insert("authorization", "0123456789abcdef".parse().unwrap());
        assert!(authorized(&headers, b"0123456789abcdef"), "Harbor sends the bare value");
        assert!(!authorized(&HeaderMap::new(), b"0123456789abcdef"));
    }
}
