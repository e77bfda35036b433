//! One definition per kind of input the API checks, read by both sides of
//! the contract: the handlers' checks ([`Input::check`]) and the OpenAPI
//! document's schemas ([`declare`], applied to every parameter by name and
//! to the request bodies). A client generated from `/openapi.json` then
//! knows every refusal before it sends, and a test sends values at, just
//! inside and just outside each bound to hold the two equal
//! (`gateway/tests/inputs.rs`).

use crate::error::ApiError;
use serde_json::{Value, json};

/// A kind of input, as the API refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// A DNS-1123 subdomain as `vynil_crds::names` checks it (JukeBox and
    /// instance names): 1–253 of `[a-z0-9.-]`, alphanumeric at both ends.
    Subdomain,
    /// A DNS-1123 label (namespaces): 1–63 of `[a-z0-9-]`, alphanumeric at both ends.
    Label,
    /// An id a service gave (a scan's, a plan's): 1–128 of `[A-Za-z0-9._:-]`.
    Id,
    /// A page size: 1 to the gateway's `--max-page-size`.
    Limit { max: usize },
    /// A list's `next_page_token`, handed back (empty: the first page).
    PageToken,
    /// An OCI tag (the distribution spec's grammar): 1–128 of `[A-Za-z0-9._-]`, not starting with `.` or `-`.
    Tag,
}

/// The pattern of [`Input::Subdomain`].
pub const SUBDOMAIN_PATTERN: &str = "^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$";
/// The pattern of [`Input::Label`].
pub const LABEL_PATTERN: &str = "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$";
/// The pattern of [`Input::Id`].
pub const ID_PATTERN: &str = "^[A-Za-z0-9._:-]+$";
/// A registry as the services parse it (`vynil_registry::RepositoryRef`):
/// a host with an optional port, or a local OCI image layout.
pub const REGISTRY_PATTERN: &str = "^(oci-layout:/?([^/]+/)*[^/]+|[A-Za-z0-9.:\\[\\]-]+)$";
/// A repository as the distribution spec's grammar (and the services) has it:
/// lowercase path components of `[a-z0-9._-]`, alphanumeric at both ends.
pub const REPOSITORY_PATTERN: &str = "^[a-z0-9]([a-z0-9._-]*[a-z0-9])?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$";
/// The pattern of [`Input::Tag`].
pub const TAG_PATTERN: &str = "^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$";
/// The pattern of [`Input::PageToken`].
pub const PAGE_TOKEN_PATTERN: &str = "^[0-9]*$";
/// The page size the document declares as the maximum: the default of
/// `--max-page-size` (a gateway configured lower refuses above its own).
pub const DEFAULT_MAX_PAGE_SIZE: usize = 1000;

impl Input {
    /// The input a parameter or body property named `name` is; `in_path`
    /// for a path parameter (`{name}` is an instance's name; the catalog's
    /// `name` filter is a package name, not checked).
    pub fn of_parameter(name: &str, in_path: bool) -> Option<Self> {
        Some(match name {
            "jukebox" => Input::Subdomain,
            "name" if in_path => Input::Subdomain,
            "namespace" => Input::Label,
            "scan_id" | "plan_id" => Input::Id,
            "tag" if in_path => Input::Tag,
            "limit" => Input::Limit { max: DEFAULT_MAX_PAGE_SIZE },
            "page_token" => Input::PageToken,
            _ => return None,
        })
    }

    /// Its JSON Schema keywords, as the document declares them.
    pub fn schema(self) -> Value {
        match self {
            Input::Subdomain => {
                json!({"type": "string", "minLength": 1, "maxLength": 253, "pattern": SUBDOMAIN_PATTERN})
            }
            Input::Label => {
                json!({"type": "string", "minLength": 1, "maxLength": 63, "pattern": LABEL_PATTERN})
            }
            Input::Id => json!({"type": "string", "minLength": 1, "maxLength": 128, "pattern": ID_PATTERN}),
            Input::Limit { max } => json!({"type": "integer", "minimum": 1, "maximum": max}),
            Input::PageToken => json!({"type": "string", "maxLength": 9, "pattern": PAGE_TOKEN_PATTERN}),
            Input::Tag => json!({"type": "string", "minLength": 1, "maxLength": 128, "pattern": TAG_PATTERN}),
        }
    }

    /// The handlers' check: `field` names the input in the 400's message.
    pub fn check(self, field: &str, value: &str) -> Result<(), ApiError> {
        match self {
            Input::Subdomain => vynil_crds::names::validate_subdomain(field, value)
                .map_err(|e| ApiError::bad_request(field, e)),
            Input::Label => {
                vynil_crds::names::validate_label(field, value).map_err(|e| ApiError::bad_request(field, e))
            }
            Input::Id => {
                let fine = |c: char| c.is_ascii_alphanumeric() || "-_.:".contains(c);
                if value.is_empty() || value.len() > 128 || !value.chars().all(fine) {
                    return Err(ApiError::bad_request(
                        field,
                        "is not an id this API answered (1–128 of A-Z a-z 0-9 . _ : -)",
                    ));
                }
                Ok(())
            }
            Input::PageToken => Self::page_start(field, value).map(drop),
            Input::Tag => {
                let first = |c: char| c.is_ascii_alphanumeric() || c == '_';
                let rest = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
                if value.len() > 128 || !value.starts_with(first) || !value.chars().all(rest) {
                    return Err(ApiError::bad_request(
                        field,
                        format!(
                            "{value:?} is not a tag (1–128 of A-Z a-z 0-9 . _ -, not starting with . or -)"
                        ),
                    ));
                }
                Ok(())
            }
            Input::Limit { max } => match value.parse::<usize>() {
                Ok(limit) if (1..=max).contains(&limit) => Ok(()),
                _ => Err(ApiError::bad_request(
                    field,
                    format!("{value} is not between 1 and {max} (the gateway's --max-page-size)"),
                )),
            },
        }
    }
}

/// What the handlers refuse in request bodies beyond their fields' types
/// (`api::purge::create_plan`, `execute`, `api::scans::start_scan`),
/// merged into those bodies' schemas. A `null` counts as absent, as serde
/// reads an `Option`.
const BODIES: &[(&str, &str)] = &[
    (
        "PlanRequest",
        r#"{"oneOf": [
            {"required": ["repository"], "properties": {"repository": {"type": "object"}}},
            {"required": ["jukebox"], "properties": {"jukebox": {"type": "string"}}}]}"#,
    ),
    (
        "RepositoryTarget",
        r#"{"properties": {"registry": {"minLength": 1, "pattern": "REGISTRY"}, "repository": {"minLength": 1, "pattern": "REPOSITORY"}}}"#,
    ),
    ("ExecuteRequest", r#"{"properties": {"confirm": {"minLength": 1}}}"#),
    ("ExportRequest", r#"{"properties": {"destination": {"minLength": 1}}}"#),
    ("UpgradeDecision", r#"{"properties": {"tag": "TAG"}}"#),
    ("RecallRequest", r#"{"properties": {"tag": "TAG", "reason": {"minLength": 1, "pattern": "\\S"}}}"#),
    ("ApproveRequest", r#"{"properties": {"fingerprint": {"minLength": 1}}}"#),
    (
        "ScanRequest",
        r#"{"properties": {"filter": {"pattern": "^\\s*([^/\\s\\x00-\\x1f\\x7f-\\x9f]+(/[^/\\s\\x00-\\x1f\\x7f-\\x9f]+)?)?\\s*$"}},
            "not": {"required": ["filter", "repository"],
                    "properties": {"filter": {"type": "string", "minLength": 1}, "repository": {"type": "object"}}}}"#,
    ),
];

/// `extra` merged into `value`, objects key by key.
impl Input {
    /// Where the page `token` starts (`0` for none): the token is the
    /// offset of the page's first item, which only this API hands out.
    pub fn page_start(field: &str, token: &str) -> Result<usize, ApiError> {
        vynil_runtime::pages::start(token).map_err(|_| {
            ApiError::bad_request(
                field,
                "not a token this API gave (the `next_page_token` of a list): start from the first page",
            )
        })
    }
}

fn merge_deep(value: &mut Value, extra: &Value) {
    match (value.as_object_mut(), extra.as_object()) {
        (Some(object), Some(extra)) => {
            for (key, more) in extra {
                match object.get_mut(key) {
                    Some(existing) if existing.is_object() && more.is_object() => merge_deep(existing, more),
                    _ => {
                        object.insert(key.clone(), more.clone());
                    }
                }
            }
        }
        _ => *value = extra.clone(),
    }
}

/// `keywords` added to the schema `schema`; an `Option` (`["T", "null"]`)
/// stays nullable (the value may be left out).
fn constrain(schema: &mut Value, keywords: &Value) {
    let nullable = schema["type"].as_array().is_some_and(|t| t.iter().any(|t| t == "null"));
    if let (Some(object), Some(extra)) = (schema.as_object_mut(), keywords.as_object()) {
        object.extend(extra.clone());
        if nullable && let Some(kind) = extra.get("type") {
            object.insert("type".into(), json!([kind, "null"]));
        }
    }
}

/// Declares every [`Input`] in the document `openapi` (JSON: OpenAPI 3.1
/// says more than utoipa's typed model holds): each parameter by its name,
/// each request body property of the same names, and [`BODIES`].
pub fn declare(openapi: &mut Value) {
    if let Some(paths) = openapi.get_mut("paths").and_then(Value::as_object_mut) {
        for operation in
            paths.values_mut().filter_map(Value::as_object_mut).flat_map(|item| item.values_mut())
        {
            for parameter in
                operation.get_mut("parameters").and_then(Value::as_array_mut).into_iter().flatten()
            {
                let in_path = parameter["in"] == "path";
                let input = parameter["name"].as_str().and_then(|name| Input::of_parameter(name, in_path));
                if let (Some(input), Some(schema)) = (input, parameter.get_mut("schema")) {
                    constrain(schema, &input.schema());
                }
            }
        }
    }
    let Some(schemas) = openapi.pointer_mut("/components/schemas").and_then(Value::as_object_mut) else {
        return;
    };
    for (name, extra) in BODIES {
        let extra = extra
            .replace("\"REGISTRY\"", &json!(REGISTRY_PATTERN).to_string())
            .replace("\"REPOSITORY\"", &json!(REPOSITORY_PATTERN).to_string())
            .replace(
                "\"TAG\"",
                &json!({"minLength": 1, "maxLength": 128, "pattern": TAG_PATTERN}).to_string(),
            );
        if let (Some(schema), Ok(extra)) = (schemas.get_mut(*name), serde_json::from_str::<Value>(&extra)) {
            merge_deep(schema, &extra);
        }
    }
    for schema in schemas.values_mut() {
        let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) else { continue };
        for (name, property) in properties.iter_mut() {
            // Plain strings and integers only: a `$ref` or an object of the same name is not this input.
            let plain = property.get("$ref").is_none() && property.get("type").is_some_and(|t| t != "object");
            if let Some(input) = Input::of_parameter(name, false).filter(|_| plain) {
                constrain(property, &input.schema());
            }
        }
    }
}
