//! Hand-written schemas where the Rust type is not the whole story.
//!
//! The package record lives in the pure rules crate, which knows nothing of
//! Kubernetes; its CRD schema is written here. Free-form values (package
//! options, requirement maps) must be marked `x-kubernetes-preserve-unknown-fields`
//! or the API server would prune them.

use schemars::{Schema, SchemaGenerator, json_schema};

/// Any JSON object or null, kept as is.
pub fn optional_free_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "nullable": true,
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

fn string() -> serde_json::Value {
    serde_json::json!({"type": "string"})
}

fn nullable_string() -> serde_json::Value {
    serde_json::json!({"type": "string", "nullable": true})
}

/// `status.packages[]`: upstream's `VynilPackage`.
pub fn packages(_: &mut SchemaGenerator) -> Schema {
    let single_key_maps = serde_json::json!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
    });
    json_schema!({
        "type": "array",
        "items": {
            "type": "object",
            "required": ["registry", "image", "tag", "metadata", "requirements"],
            "properties": {
                "registry": string(),
                "image": string(),
                "tag": string(),
                "digest": nullable_string(),
                "first_seen": nullable_string(),
                "signature": {"type": "object", "nullable": true, "x-kubernetes-preserve-unknown-fields": true},
                "metadata": {
                    "type": "object",
                    "required": ["name", "category", "description", "type", "features"],
                    "properties": {
                        "name": string(),
                        "category": string(),
                        "description": string(),
                        "app_version": nullable_string(),
                        "type": {"type": "string", "enum": ["tenant", "system", "service"]},
                        "features": {"type": "array", "items": string()},
                        "backup_affinity": nullable_string(),
                    },
                },
                "requirements": single_key_maps,
                "recommandations": {
                    "type": "array",
                    "nullable": true,
                    "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                },
                "options": {"type": "object", "nullable": true, "x-kubernetes-preserve-unknown-fields": true},
                "value_script": nullable_string(),
            },
        },
    })
}
