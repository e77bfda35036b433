//! Admission as a real API server does it, on every write, before the object
//! is stored: what the fake refuses, prunes or defaults here, a real server
//! refuses, prunes or defaults too — so a controller that converges against
//! the fake does not loop against a cluster.
//!
//! - **metadata** (every kind, `apimachinery/pkg/api/validation/objectmeta.go`):
//!   names by kind (RFC 1123 label for namespaces and services, path segment
//!   for RBAC objects, RFC 1123 subdomain otherwise), label keys (qualified
//!   names) and values (63 characters), annotation keys and their 256 KiB
//!   total, finalizer names, owner references; no new finalizer on an object
//!   being deleted; the stored object at most 1.5 MiB (etcd's limit);
//! - **custom resources** against their CRD's structural schema, in the
//!   API server's order: unknown fields pruned (kept under
//!   `x-kubernetes-preserve-unknown-fields`), `null` dropped where the schema
//!   is not `nullable`, defaults applied, then validated with a maintained
//!   JSON Schema validator (`jsonschema`) — one `422 Invalid` naming every
//!   failing field in `details.causes`;
//! - **built-in kinds our product writes**: a Job's `restartPolicy`, its
//!   generated selector and `controller-uid` / `job-name` labels, its
//!   immutable `spec.template`, `spec.selector` and `spec.completions`;
//!   ConfigMap and Secret keys and sizes, Secret data as base64; a Lease's
//!   durations.
//!
//! The messages are the API server's (`field.Error`'s rendering), so a client
//! that reads them is tested against what it will read in a cluster.

use std::collections::BTreeMap;

use base64::Engine;
use serde_json::{Map, Value, json};

use super::resources::ResourceDef;

/// etcd's default `--max-request-bytes`: a larger object is refused by the
/// storage ("etcdserver: request is too large", code 500).
pub(super) const MAX_OBJECT_BYTES: usize = 1536 * 1024;
/// The API server's request body limit for writes.
pub(super) const MAX_REQUEST_BYTES: usize = 3 * 1024 * 1024;
const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;
const MAX_CONFIG_BYTES: usize = 1024 * 1024;
/// `generateName` prefixes are cut so that prefix and suffix fit in 63.
const MAX_GENERATED_PREFIX: usize = 58;

/// `field.ErrorType`: the kind of a failure, its `reason` in a `Status` cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    Required,
    Invalid,
    NotSupported,
    TooLong,
    Forbidden,
    TypeInvalid,
}

impl ErrorType {
    fn reason(self) -> &'static str {
        match self {
            Self::Required => "FieldValueRequired",
            Self::Invalid => "FieldValueInvalid",
            Self::NotSupported => "FieldValueNotSupported",
            Self::TooLong => "FieldValueTooLong",
            Self::Forbidden => "FieldValueForbidden",
            Self::TypeInvalid => "FieldValueTypeInvalid",
        }
    }
}

/// One failing field, as `field.Error` renders it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub kind: ErrorType,
    /// `metadata.labels`, `spec.template.spec.restartPolicy`, `spec.items[2].name`.
    pub field: String,
    pub value: Option<Value>,
    pub detail: String,
}

fn go_value(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

impl FieldError {
    fn new(
        kind: ErrorType,
        field: impl Into<String>,
        value: Option<Value>,
        detail: impl Into<String>,
    ) -> Self {
        Self { kind, field: field.into(), value, detail: detail.into() }
    }
    pub(super) fn invalid(
        field: impl Into<String>,
        value: impl Into<Value>,
        detail: impl Into<String>,
    ) -> Self {
        Self::new(ErrorType::Invalid, field, Some(value.into()), detail)
    }
    fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Required, field, None, detail)
    }
    fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Forbidden, field, None, detail)
    }

    /// The message without the field, as in `details.causes[].message`.
    pub fn message(&self) -> String {
        let head = match (self.kind, &self.value) {
            (ErrorType::Required, _) => "Required value".to_string(),
            (ErrorType::Forbidden, _) => "Forbidden".to_string(),
            (ErrorType::TooLong, _) => "Too long".to_string(),
            (ErrorType::NotSupported, Some(v)) => format!("Unsupported value: {}", go_value(v)),
            (ErrorType::NotSupported, None) => "Unsupported value".to_string(),
            (_, Some(v)) => format!("Invalid value: {}", go_value(v)),
            (_, None) => "Invalid value".to_string(),
        };
        if self.detail.is_empty() { head } else { format!("{head}: {}", self.detail) }
    }

    pub fn cause(&self) -> Value {
        json!({"reason": self.kind.reason(), "message": self.message(), "field": self.field})
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message())
    }
}

// ---------------------------------------------------------------- names

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
     '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for \
     validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', \
     and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for \
     validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const QUALIFIED_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end \
     with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is \
     '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', \
     '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or \
     '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const CONFIG_KEY_MSG: &str = "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. \
     'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')";

fn alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && s.starts_with(alnum)
        && s.ends_with(alnum)
}

/// Problems of `s` as an RFC 1123 subdomain (at most 253, dot-separated labels).
fn dns_subdomain(s: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if s.len() > 253 {
        problems.push("must be no more than 253 characters".to_string());
    }
    if !s.split('.').all(is_dns_label) {
        problems.push(SUBDOMAIN_MSG.to_string());
    }
    problems
}

fn dns_label(s: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if s.len() > 63 {
        problems.push("must be no more than 63 characters".to_string());
    }
    if !is_dns_label(s) {
        problems.push(LABEL_MSG.to_string());
    }
    problems
}

fn qualified_part(s: &str) -> bool {
    s.starts_with(alnum) && s.ends_with(alnum) && s.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
}

/// `IsQualifiedName`: `[prefix/]name`, the prefix a subdomain, the name at most 63.
fn qualified_name(s: &str) -> Vec<String> {
    let (prefix, name) = match s.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    let mut problems = Vec::new();
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            problems.push("prefix part must be non-empty".to_string());
        } else {
            problems.extend(dns_subdomain(prefix).into_iter().map(|p| format!("prefix part {p}")));
        }
    }
    if name.is_empty() {
        problems.push("name part must be non-empty".to_string());
    } else {
        if name.len() > 63 {
            problems.push("name part must be no more than 63 characters".to_string());
        }
        if !qualified_part(name) {
            problems.push(format!("name part {QUALIFIED_MSG}"));
        }
    }
    if s.matches('/').count() > 1 {
        problems.push(format!(
            "a qualified name {QUALIFIED_MSG} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ));
    }
    problems
}

fn label_value(s: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if s.len() > 63 {
        problems.push("must be no more than 63 characters".to_string());
    }
    if !s.is_empty() && !qualified_part(s) {
        problems.push(LABEL_VALUE_MSG.to_string());
    }
    problems
}

/// The name rule of a kind (`ValidateObjectMeta`'s name function per registry).
fn name_problems(res: &ResourceDef, name: &str) -> Vec<String> {
    match (res.group.as_str(), res.plural.as_str()) {
        ("", "namespaces" | "services") => dns_label(name),
        ("rbac.authorization.k8s.io", _) => {
            if name == "." || name == ".." {
                vec![format!("may not be '{name}'")]
            } else if let Some(c) = ['/', '%'].into_iter().find(|c| name.contains(*c)) {
                vec![format!("may not contain '{c}'")]
            } else {
                Vec::new()
            }
        }
        _ => dns_subdomain(name),
    }
}

/// The name a `generateName` create gets: the prefix cut to leave room for
/// the five random characters, as the API server's name generator does.
pub(super) fn generated_name(prefix: &str) -> String {
    let cut: String = prefix.chars().take(MAX_GENERATED_PREFIX).collect();
    let suffix: String = (0..5).map(|_| fastrand::lowercase()).collect();
    format!("{cut}{suffix}")
}

// ---------------------------------------------------------------- metadata

fn labels_of<'a>(object: &'a Value, pointer: &str) -> Option<&'a Map<String, Value>> {
    object.pointer(pointer).and_then(Value::as_object)
}

fn check_labels(labels: Option<&Map<String, Value>>, field: &str, errors: &mut Vec<FieldError>) {
    for (key, value) in labels.into_iter().flatten() {
        for problem in qualified_name(key) {
            errors.push(FieldError::invalid(field, key.as_str(), problem));
        }
        let text = value.as_str().unwrap_or_default();
        for problem in label_value(text) {
            errors.push(FieldError::invalid(field, text, problem));
        }
    }
}

fn check_metadata(res: &ResourceDef, object: &Value, old: Option<&Value>, errors: &mut Vec<FieldError>) {
    let meta = &object["metadata"];
    if old.is_none() {
        let name = meta["name"].as_str().unwrap_or_default();
        for problem in name_problems(res, name) {
            errors.push(FieldError::invalid("metadata.name", name, problem));
        }
    }
    check_labels(labels_of(object, "/metadata/labels"), "metadata.labels", errors);
    let mut annotation_bytes = 0;
    for (key, value) in meta["annotations"].as_object().into_iter().flatten() {
        for problem in qualified_name(&key.to_lowercase()) {
            errors.push(FieldError::invalid("metadata.annotations", key.as_str(), problem));
        }
        annotation_bytes += key.len() + value.as_str().map_or(0, str::len);
    }
    if annotation_bytes > MAX_ANNOTATIONS_BYTES {
        errors.push(FieldError::new(
            ErrorType::TooLong,
            "metadata.annotations",
            None,
            format!("must have at most {MAX_ANNOTATIONS_BYTES} bytes"),
        ));
    }
    let finalizers: Vec<&str> =
        meta["finalizers"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    for (i, finalizer) in finalizers.iter().enumerate() {
        for problem in qualified_name(finalizer) {
            errors.push(FieldError::invalid(format!("metadata.finalizers[{i}]"), *finalizer, problem));
        }
    }
    if let Some(old) = old.filter(|o| o["metadata"]["deletionTimestamp"].is_string()) {
        let before: Vec<&str> = old["metadata"]["finalizers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let added: Vec<&str> = finalizers.iter().filter(|f| !before.contains(f)).copied().collect();
        if !added.is_empty() {
            errors.push(FieldError::forbidden(
                "metadata.finalizers",
                format!("no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"),
            ));
        }
    }
    for (i, owner) in meta["ownerReferences"].as_array().into_iter().flatten().enumerate() {
        for field in ["apiVersion", "kind", "name", "uid"] {
            if owner[field].as_str().is_none_or(str::is_empty) {
                errors.push(FieldError::invalid(
                    format!("metadata.ownerReferences[{i}].{field}"),
                    "",
                    format!("{field} must not be empty"),
                ));
            }
        }
    }
    let controllers = meta["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["controller"].as_bool() == Some(true))
        .count();
    if controllers > 1 {
        errors.push(FieldError::invalid(
            "metadata.ownerReferences",
            meta["ownerReferences"].clone(),
            "Only one reference can have Controller set to true",
        ));
    }
}

// ---------------------------------------------------------------- built-in kinds

fn check_job(object: &mut Value, old: Option<&Value>, errors: &mut Vec<FieldError>) {
    let manual = object.pointer("/spec/manualSelector").and_then(Value::as_bool) == Some(true);
    if old.is_none() && !manual {
        if object.pointer("/spec/selector").is_some_and(|s| !s.is_null()) {
            errors.push(FieldError::invalid(
                "spec.selector",
                object["spec"]["selector"].clone(),
                "`selector` will be auto-generated",
            ));
        }
        let uid = object["metadata"]["uid"].clone();
        let name = object["metadata"]["name"].clone();
        let spec = &mut object["spec"];
        spec["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
        let template_labels = &mut spec["template"]["metadata"]["labels"];
        if !template_labels.is_object() {
            *template_labels = json!({});
        }
        for (key, value) in [
            ("batch.kubernetes.io/controller-uid", &uid),
            ("controller-uid", &uid),
            ("batch.kubernetes.io/job-name", &name),
            ("job-name", &name),
        ] {
            template_labels[key] = value.clone();
        }
    }
    if old.is_none() {
        let spec = &mut object["spec"];
        for (field, default) in
            [("backoffLimit", json!(6)), ("completions", json!(1)), ("parallelism", json!(1))]
        {
            if spec[field].is_null() {
                spec[field] = default;
            }
        }
    }
    match object.pointer("/spec/template/spec/restartPolicy").and_then(Value::as_str) {
        Some("OnFailure" | "Never") => {}
        Some(other) => errors.push(FieldError::new(
            ErrorType::NotSupported,
            "spec.template.spec.restartPolicy",
            Some(json!(other)),
            "supported values: \"OnFailure\", \"Never\"",
        )),
        None => errors.push(FieldError::required(
            "spec.template.spec.restartPolicy",
            "valid values: \"OnFailure\", \"Never\"",
        )),
    }
    if object.pointer("/spec/template/spec/containers").and_then(Value::as_array).is_none_or(Vec::is_empty) {
        errors.push(FieldError::required("spec.template.spec.containers", ""));
    }
    check_labels(
        labels_of(object, "/spec/template/metadata/labels"),
        "spec.template.metadata.labels",
        errors,
    );
    if let Some(old) = old {
        for field in ["template", "selector", "completions"] {
            if object["spec"][field] != old["spec"][field] {
                errors.push(FieldError::invalid(
                    format!("spec.{field}"),
                    object["spec"][field].clone(),
                    "field is immutable",
                ));
            }
        }
    }
}

fn check_config_keys(object: &Value, fields: &[&str], errors: &mut Vec<FieldError>) {
    let mut total = 0;
    for field in fields {
        for (key, value) in object[*field].as_object().into_iter().flatten() {
            if key.is_empty()
                || key == "."
                || key == ".."
                || key.starts_with("..")
                || !key.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
            {
                errors.push(FieldError::invalid(format!("{field}[{key}]"), key.as_str(), CONFIG_KEY_MSG));
            }
            total += value.as_str().map_or(0, str::len);
        }
    }
    if total > MAX_CONFIG_BYTES {
        errors.push(FieldError::new(
            ErrorType::TooLong,
            fields.first().copied().unwrap_or("data"),
            None,
            format!("must have at most {MAX_CONFIG_BYTES} bytes"),
        ));
    }
}

fn check_secret(object: &mut Value, errors: &mut Vec<FieldError>) {
    // `stringData` is write-only: merged into `data`, base64, then dropped.
    if let Some(Value::Object(strings)) = object.as_object_mut().and_then(|o| o.remove("stringData")) {
        if !object["data"].is_object() {
            object["data"] = json!({});
        }
        for (key, value) in strings {
            let text = value.as_str().unwrap_or_default();
            object["data"][key] = json!(base64::engine::general_purpose::STANDARD.encode(text));
        }
    }
    for (key, value) in object["data"].as_object().into_iter().flatten() {
        let decoded = value.as_str().map(|s| base64::engine::general_purpose::STANDARD.decode(s));
        if !matches!(decoded, Some(Ok(_))) {
            errors.push(FieldError::invalid(
                format!("data[{key}]"),
                value.clone(),
                "illegal base64 data in the request body",
            ));
        }
    }
    check_config_keys(object, &["data"], errors);
}

fn check_lease(object: &Value, errors: &mut Vec<FieldError>) {
    for field in ["leaseDurationSeconds", "leaseTransitions"] {
        let Some(n) = object["spec"][field].as_i64() else { continue };
        let positive = field == "leaseDurationSeconds";
        if (positive && n <= 0) || n < 0 {
            let bound =
                if positive { "must be greater than 0" } else { "must be greater than or equal to 0" };
            errors.push(FieldError::invalid(format!("spec.{field}"), n, bound));
        }
    }
}

fn check_builtin(res: &ResourceDef, object: &mut Value, old: Option<&Value>, errors: &mut Vec<FieldError>) {
    match (res.group.as_str(), res.plural.as_str()) {
        ("batch", "jobs") => check_job(object, old, errors),
        ("", "configmaps") => check_config_keys(object, &["data", "binaryData"], errors),
        ("", "secrets") => check_secret(object, errors),
        ("coordination.k8s.io", "leases") => check_lease(object, errors),
        ("", "namespaces") if old.is_none() => {
            object["spec"]["finalizers"] = json!(["kubernetes"]);
            object["status"]["phase"] = json!("Active");
        }
        _ => {}
    }
}

// ---------------------------------------------------------------- structural schemas

/// The structural schema of one CRD version: pruning and defaulting by the
/// API server's rules (written here once), checks by `jsonschema`.
#[derive(Debug)]
pub(super) struct Structural {
    schema: Value,
    validator: jsonschema::Validator,
}

/// OpenAPI v3 as a JSON Schema: `nullable: true` becomes `type: [T, "null"]`,
/// `x-kubernetes-int-or-string` an `anyOf` integer or string.
fn to_json_schema(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut out: Map<String, Value> = Map::new();
            for (key, v) in map {
                let converted = match key.as_str() {
                    "properties" | "patternProperties" | "definitions" => match v {
                        Value::Object(props) => {
                            Value::Object(props.iter().map(|(k, s)| (k.clone(), to_json_schema(s))).collect())
                        }
                        other => other.clone(),
                    },
                    // Values, not schemas.
                    "default" | "enum" | "example" => v.clone(),
                    _ => to_json_schema(v),
                };
                out.insert(key.clone(), converted);
            }
            if map.get("nullable") == Some(&Value::Bool(true))
                && let Some(Value::String(t)) = out.get("type").cloned()
            {
                out.insert("type".into(), json!([t, "null"]));
            }
            if map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
                out.remove("type");
                out.insert("anyOf".into(), json!([{"type": "integer"}, {"type": "string"}]));
            }
            out.remove("nullable");
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(to_json_schema).collect()),
        other => other.clone(),
    }
}

fn preserves(schema: &Value) -> bool {
    schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true)
}

impl Structural {
    /// The schema of the CRD's first served version (the version the fake serves).
    pub(super) fn from_crd(crd: &Value) -> Result<Option<Self>, String> {
        let Some(version) = crd["spec"]["versions"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["served"].as_bool().unwrap_or(true)))
        else {
            return Ok(None);
        };
        let Some(schema) = version.pointer("/schema/openAPIV3Schema").filter(|s| s.is_object()) else {
            return Ok(None);
        };
        let validator = jsonschema::validator_for(&to_json_schema(schema)).map_err(|e| e.to_string())?;
        Ok(Some(Self { schema: schema.clone(), validator }))
    }

    /// Prunes, defaults and validates `object` (apiVersion, kind and metadata
    /// are the server's, outside the schema). On update, a failing value the
    /// stored object already had is let through (validation ratcheting, on
    /// by default since Kubernetes 1.30): an object stored under an older
    /// schema can still be written where it did not change.
    pub(super) fn admit(&self, object: &mut Value, old: Option<&Value>, errors: &mut Vec<FieldError>) {
        let Some(map) = object.as_object_mut() else { return };
        let server_owned: Vec<(String, Value)> = ["apiVersion", "kind", "metadata"]
            .iter()
            .filter_map(|k| map.remove(*k).map(|v| (k.to_string(), v)))
            .collect();
        let mut body = Value::Object(std::mem::take(map));
        prune(&self.schema, &mut body);
        default(&self.schema, &mut body);
        for error in self.validator.iter_errors(&body) {
            let pointer = error.instance_path().as_str().to_string();
            let pointer = match error.kind() {
                jsonschema::error::ValidationErrorKind::Required { property } => {
                    format!("{pointer}/{}", property.as_str().unwrap_or_default())
                }
                _ => pointer,
            };
            let unchanged = old.is_some_and(|old| old.pointer(&pointer) == body.pointer(&pointer));
            if !unchanged {
                errors.push(schema_error(&error));
            }
        }
        if let Value::Object(mut kept) = body {
            for (k, v) in server_owned {
                kept.insert(k, v);
            }
            *object = Value::Object(kept);
        }
    }
}

/// Drops what the schema does not declare, and `null` where it is not nullable.
fn prune(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(map) => {
            let properties = schema["properties"].as_object();
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let keep_unknown =
                preserves(schema) || schema["x-kubernetes-embedded-resource"].as_bool() == Some(true);
            // A `null` where the schema is not nullable is dropped (and
            // defaulted next, when the schema has a default).
            map.retain(|key, child| match properties.and_then(|p| p.get(key)).or(additional) {
                Some(child_schema) => child_schema["nullable"].as_bool() == Some(true) || !child.is_null(),
                None => keep_unknown,
            });
            for (key, child) in map.iter_mut() {
                if let Some(child_schema) = properties.and_then(|p| p.get(key)).or(additional) {
                    prune(child_schema, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items").filter(|i| i.is_object()) {
                items.iter_mut().for_each(|item| prune(item_schema, item));
            }
        }
        _ => {}
    }
}

/// Applies `default`s to absent properties, then to what lies under them.
fn default(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(properties) = schema["properties"].as_object() {
                for (key, child_schema) in properties {
                    if let Some(default) = child_schema.get("default")
                        && !map.contains_key(key)
                    {
                        map.insert(key.clone(), default.clone());
                    }
                }
                for (key, child) in map.iter_mut() {
                    if let Some(child_schema) = properties.get(key) {
                        default(child_schema, child);
                    }
                }
            } else if let Some(additional) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                map.values_mut().for_each(|child| default(additional, child));
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items").filter(|i| i.is_object()) {
                items.iter_mut().for_each(|item| default(item_schema, item));
            }
        }
        _ => {}
    }
}

/// `/spec/items/0/name` → `spec.items[0].name`.
fn field_path(pointer: &str) -> String {
    let mut out = String::new();
    for segment in pointer.split('/').filter(|s| !s.is_empty()) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if segment.parse::<usize>().is_ok() {
            out.push_str(&format!("[{segment}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&segment);
        }
    }
    out
}

fn schema_error(error: &jsonschema::ValidationError<'_>) -> FieldError {
    use jsonschema::error::ValidationErrorKind as Kind;
    let field = field_path(error.instance_path().as_str());
    let value = error.instance().clone().into_owned();
    match error.kind() {
        Kind::Required { property } => {
            let name = property.as_str().unwrap_or_default();
            let full = if field.is_empty() { name.to_string() } else { format!("{field}.{name}") };
            FieldError::required(full, "")
        }
        Kind::Enum { options } => {
            let supported: Vec<String> = options.as_array().into_iter().flatten().map(go_value).collect();
            FieldError::new(
                ErrorType::NotSupported,
                field,
                Some(value),
                format!("supported values: {}", supported.join(", ")),
            )
        }
        Kind::Type { .. } => FieldError::new(
            ErrorType::TypeInvalid,
            field.clone(),
            Some(value),
            format!("{field} in body: {error}"),
        ),
        _ => FieldError::invalid(field.clone(), value, format!("{field} in body: {error}")),
    }
}

// ---------------------------------------------------------------- the entry point

/// What a write must pass. `schemas` are the installed CRDs' schemas by
/// `(group, plural)`; `old` is the stored object on update.
pub(super) fn admit(
    res: &ResourceDef,
    schemas: &BTreeMap<(String, String), Structural>,
    object: &mut Value,
    old: Option<&Value>,
) -> Result<(), Vec<FieldError>> {
    let mut errors = Vec::new();
    if let Some(schema) = schemas.get(&(res.group.clone(), res.plural.clone())) {
        schema.admit(object, old, &mut errors);
    }
    check_builtin(res, object, old, &mut errors);
    check_metadata(res, object, old, &mut errors);
    if res.plural == "customresourcedefinitions"
        && let Err(problem) = Structural::from_crd(object)
    {
        errors.push(FieldError::invalid("spec.versions[0].schema.openAPIV3Schema", "", problem));
    }
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names_follow_the_api_servers_rules() {
        assert!(qualified_name("app.kubernetes.io/name").is_empty());
        assert!(qualified_name("job-name").is_empty());
        assert!(!qualified_name("a/b/c").is_empty());
        assert!(!qualified_name("Bad_Prefix/x").is_empty());
        assert!(!qualified_name(&"x".repeat(64)).is_empty());
        assert!(label_value("").is_empty());
        assert!(!label_value("-x").is_empty());
        assert!(!label_value(&"a".repeat(64)).is_empty());
    }

    #[test]
    fn a_pointer_renders_as_a_field_path() {
        assert_eq!(field_path("/spec/items/0/name"), "spec.items[0].name");
        assert_eq!(field_path(""), "");
    }
}
