//! Who may do what, as a test declares it: bearer tokens TokenReview accepts,
//! and rules SubjectAccessReview allows. Also the request log (who asked for
//! what), which RBAC checks read, and the faults a test injects.

use std::{collections::HashMap, time::Duration};

use serde_json::{Value, json};

/// A known bearer token and the identity TokenReview answers for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub username: String,
    pub groups: Vec<String>,
}

/// One allowed action: `"*"` matches anything; `resource` is `jobs.batch`,
/// `configmaps` (core) or `jukeboxes.vynil.solidite.fr`; `namespace` `None`
/// means every namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessRule {
    pub user: String,
    pub verb: String,
    pub resource: String,
    pub namespace: Option<String>,
}

/// The table reviews are answered from.
#[derive(Debug, Clone, Default)]
pub struct AccessTable {
    pub tokens: HashMap<String, Identity>,
    pub rules: Vec<AccessRule>,
}

impl AccessTable {
    /// The `status` of a TokenReview whose spec is `spec`.
    pub fn token_review(&self, spec: &Value) -> Value {
        match spec["token"].as_str().and_then(|t| self.tokens.get(t)) {
            Some(id) => {
                json!({"authenticated": true, "user": {"username": id.username, "groups": id.groups}})
            }
            None => json!({"authenticated": false, "error": "the token is not known to the fake API server"}),
        }
    }

    /// The `status` of a SubjectAccessReview whose spec is `spec`.
    pub fn access_review(&self, spec: &Value) -> Value {
        let user = spec["user"].as_str().unwrap_or_default();
        let attrs = &spec["resourceAttributes"];
        let verb = attrs["verb"].as_str().unwrap_or_default();
        let group = attrs["group"].as_str().unwrap_or_default();
        let plural = attrs["resource"].as_str().unwrap_or_default();
        let resource = if group.is_empty() { plural.to_string() } else { format!("{plural}.{group}") };
        let namespace = attrs["namespace"].as_str().filter(|n| !n.is_empty());
        let hit = |pattern: &str, value: &str| pattern == "*" || pattern == value;
        let allowed = self.rules.iter().any(|r| {
            hit(&r.user, user)
                && hit(&r.verb, verb)
                && hit(&r.resource, &resource)
                && r.namespace.as_deref().is_none_or(|n| Some(n) == namespace)
        });
        let reason =
            if allowed { "allowed by the test's access table" } else { "no rule of the test's access table" };
        json!({"allowed": allowed, "reason": reason})
    }
}

/// One request as the server understood it. `verb` is the RBAC verb (`get`,
/// `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`);
/// `discovery` requests have `verb` `get` and an empty resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub user_agent: String,
    pub bearer_token: Option<String>,
    /// The HTTP status answered (0 while the request is being served).
    pub status: u16,
}

/// What an injected fault does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiFaultAction {
    /// Answer this status (`409` as a Conflict, `500` as an InternalError…).
    Status(u16),
    /// Wait, then serve the request.
    Delay(Duration),
    /// A concurrent writer: this JSON merge patch is applied to the
    /// request's object (through `status` for a status request) just before
    /// the request is served, so a precondition it carries is stale for real.
    WriteFirst(serde_json::Value),
}

/// A fault for the next `times` requests whose verb and resource (plural, and
/// `/status` for the subresource: `jukeboxes/status`) match; `None` matches any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiFault {
    pub verb: Option<String>,
    pub resource: Option<String>,
    /// Only requests whose user agent contains this (one replica of several).
    pub user_agent: Option<String>,
    pub times: usize,
    pub action: ApiFaultAction,
}

impl ApiFault {
    pub fn new(verb: Option<&str>, resource: Option<&str>, times: usize, action: ApiFaultAction) -> Self {
        Self {
            verb: verb.map(Into::into),
            resource: resource.map(Into::into),
            user_agent: None,
            times,
            action,
        }
    }

    /// The same fault, for requests whose user agent contains `fragment` only.
    pub fn for_user_agent(mut self, fragment: &str) -> Self {
        self.user_agent = Some(fragment.into());
        self
    }

    pub(crate) fn matches(&self, request: &RequestRecord) -> bool {
        let resource = match &request.subresource {
            Some(sub) => format!("{}/{sub}", request.resource),
            None => request.resource.clone(),
        };
        self.times > 0
            && self.verb.as_deref().is_none_or(|v| v == request.verb)
            && self.resource.as_deref().is_none_or(|r| r == resource)
            && self.user_agent.as_deref().is_none_or(|ua| request.user_agent.contains(ua))
    }
}

/// The reason a real server gives with each status code.
pub fn reason_of(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}
