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
        scans::start_scan, scans::latest_scan, scans::get_scan, scans::follow_scan,
        purge::create_plan, purge::get_plan, purge::execute, purge::get_report,
        instances::list_instances, instances::explain, instances::allow_delete_without_package,
        crate::hooks::receive,
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

/// The document as served and committed (pretty JSON, trailing newline).
pub fn document() -> String {
    let mut text = ApiDoc::openapi().to_pretty_json().unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}
