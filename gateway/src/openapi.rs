//! The OpenAPI 3.1 document, generated from the handlers' annotations and
//! served at `/openapi.json`; the committed copy (`gateway/openapi.json`)
//! is compared with it by a test, so the document cannot drift from the code.

use utoipa::{
    Modify, OpenApi,
    openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme},
};

use crate::api::{catalog, instances, purge, scans, session};

#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "Vynil control plane",
        description = "The HTTP/JSON API of the Vynil control plane gateway: JukeBoxes and their catalogs, scans, purges, instances. Errors are `{code, message, request_id}`.",
    ),
    paths(
        session::login, session::logout, session::whoami, session::version,
        catalog::list_jukeboxes, catalog::get_catalog, catalog::upgrade_path,
        crate::api::recalls::recall, crate::api::recalls::lift_recall,
        scans::start_scan, scans::latest_scan, scans::export_index, scans::get_scan, scans::follow_scan,
        purge::create_plan, purge::get_plan, purge::execute, purge::get_report,
        instances::list_instances, instances::explain, instances::allow_delete_without_package,
        instances::roll_back, instances::clear_quarantine, instances::approve_upgrade,
        crate::api::hooks::receive,
    ),
    modifiers(&Security),
    tags(
        (name = "session", description = "Logging in (browsers) and who is calling"),
        (name = "catalog", description = "JukeBoxes, catalogs with revision roles, upgrade paths"),
        (name = "scans", description = "Full and partial scans, followed as server-sent events"),
        (name = "purge", description = "Retention plans with reasons, confirmed execution, reports"),
        (name = "instances", description = "Instance state, explanations, the delete-without-package escape hatch"),
        (name = "hooks", description = "Registry push events (distribution, GitLab, Harbor, generic signed JSON): a push becomes a scan of that repository"),
    )
)]
pub struct ApiDoc;

#[derive(Debug)]
struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components.add_security_scheme(
            "session",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::new(crate::auth::SESSION_COOKIE))),
        );
    }
}

/// What one answer gives the next call (OpenAPI links): a client, or a
/// stateful tester, follows a created scan or plan by its id, and a listed
/// JukeBox by its name. `(path, method, status, link, operationId, link body)`.
const LINKS: &[(&str, &str, &str, &str, &str, &str)] = &[
    (
        "/api/v1/jukeboxes/{jukebox}/scans",
        "post",
        "202",
        "GetScan",
        "get_scan",
        r#"{"parameters": {"scan_id": "$response.body#/scan_id"}}"#,
    ),
    (
        "/api/v1/jukeboxes/{jukebox}/scans",
        "post",
        "202",
        "FollowScan",
        "follow_scan",
        r#"{"parameters": {"scan_id": "$response.body#/scan_id"}}"#,
    ),
    (
        "/api/v1/purge/plans",
        "post",
        "201",
        "GetPlan",
        "get_plan",
        r#"{"parameters": {"plan_id": "$response.body#/plan_id"}}"#,
    ),
    (
        "/api/v1/purge/plans",
        "post",
        "201",
        "GetReport",
        "get_report",
        r#"{"parameters": {"plan_id": "$response.body#/plan_id"}}"#,
    ),
    (
        "/api/v1/purge/plans",
        "post",
        "201",
        "Execute",
        "execute",
        r#"{"parameters": {"plan_id": "$response.body#/plan_id"},
            "requestBody": {"confirm": "$response.body#/target", "fingerprint": "$response.body#/fingerprint"}}"#,
    ),
    (
        "/api/v1/jukeboxes",
        "get",
        "200",
        "GetCatalog",
        "get_catalog",
        r#"{"parameters": {"jukebox": "$response.body#/items/0/name"}}"#,
    ),
    (
        "/api/v1/jukeboxes",
        "get",
        "200",
        "LatestScan",
        "latest_scan",
        r#"{"parameters": {"jukebox": "$response.body#/items/0/name"}}"#,
    ),
    (
        "/api/v1/jukeboxes",
        "get",
        "200",
        "StartScan",
        "start_scan",
        r#"{"parameters": {"jukebox": "$response.body#/items/0/name"}}"#,
    ),
];

fn link(document: &mut serde_json::Value) {
    for (path, method, status, name, operation, body) in LINKS {
        let pointer = format!("/paths/{}/{method}/responses/{status}", path.replace('/', "~1"));
        let (Some(response), Ok(mut link)) =
            (document.pointer_mut(&pointer), serde_json::from_str::<serde_json::Value>(body))
        else {
            continue;
        };
        link["operationId"] = (*operation).into();
        response["links"][*name] = link;
    }
}

/// The events of each event stream, as server-sent events: each has an
/// `event` name and a `data` line holding the JSON of its schema (`error`
/// an `ErrorBody`).
/// An event stream: its path, method, and each event's name and schema.
type EventStream = (&'static str, &'static str, &'static [(&'static str, &'static str)]);

const EVENTS: &[EventStream] = &[
    ("/api/v1/scans/{scan_id}/events", "get", &[("progress", "Scan"), ("error", "ErrorBody")]),
    (
        "/api/v1/purge/plans/{plan_id}/execute",
        "post",
        &[("outcome", "DeletionOutcome"), ("report", "Report"), ("error", "ErrorBody")],
    ),
];

fn type_events(document: &mut serde_json::Value) {
    for (path, method, events) in EVENTS {
        let pointer =
            format!("/paths/{}/{method}/responses/200/content/text~1event-stream", path.replace('/', "~1"));
        if let Some(content) = document.pointer_mut(&pointer) {
            let kinds: Vec<serde_json::Value> = events
                .iter()
                .map(|(event, schema)| {
                    serde_json::json!({
                        "type": "object",
                        "required": ["event", "data"],
                        "properties": {
                            "event": {"const": event},
                            "data": {
                                "type": "string",
                                "contentMediaType": "application/json",
                                "contentSchema": {"$ref": format!("#/components/schemas/{schema}")},
                            },
                        },
                    })
                })
                .collect();
            content["schema"] = serde_json::json!({"oneOf": kinds});
        }
    }
}

/// OpenAPI requires a description on every response: one utoipa left
/// without gets its status' reason phrase ("Bad Request").
fn describe_responses(document: &mut serde_json::Value) {
    let Some(paths) = document.get_mut("paths").and_then(serde_json::Value::as_object_mut) else { return };
    for operation in
        paths.values_mut().filter_map(serde_json::Value::as_object_mut).flat_map(|i| i.values_mut())
    {
        let Some(responses) = operation.get_mut("responses").and_then(serde_json::Value::as_object_mut)
        else {
            continue;
        };
        for (status, response) in responses.iter_mut() {
            let Some(response) = response.as_object_mut() else { continue };
            if !response.contains_key("description") {
                let reason = status
                    .parse::<u16>()
                    .ok()
                    .and_then(|code| axum::http::StatusCode::from_u16(code).ok())
                    .and_then(|code| code.canonical_reason())
                    .unwrap_or("Answer");
                response.insert("description".into(), reason.into());
            }
        }
    }
}

/// The document as served and committed (pretty JSON, trailing newline),
/// with every input constraint the handlers enforce declared
/// (`crate::api::inputs`).
pub fn document() -> String {
    let mut text = serde_json::to_value(ApiDoc::openapi())
        .and_then(|mut value| {
            crate::api::inputs::declare(&mut value);
            describe_responses(&mut value);
            link(&mut value);
            type_events(&mut value);
            serde_json::to_string_pretty(&value)
        })
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}
