//! What an instance recorded of the children its agent applied
//! (`status.<phase>` lists and `status.crds`): the reaper deletes them, an
//! admin's confirmation of a delete without package names their fingerprint,
//! and `Explain` previews them. One reading for all three.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Phases in the order the reaper deletes them (the reverse of install).
pub const PHASES: [&str; 6] = ["posts", "scalables", "others", "vitals", "befores", "systems"];

/// The children recorded in `status`, in deletion order, and the CRD names.
pub fn recorded_children(status: &Value) -> (Vec<(String, Value)>, Vec<String>) {
    let mut children = Vec::new();
    for phase in PHASES {
        for child in status.get(phase).and_then(Value::as_array).into_iter().flatten() {
            children.push((phase.to_string(), child.clone()));
        }
    }
    let crds = status
        .get("crds")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str().map(str::to_string))
        .collect();
    (children, crds)
}

/// What the reaper would delete and leave, before it runs (`Explain`), and
/// the fingerprint of that list (`AllowDeleteWithoutPackage` requires it, so
/// a caller confirms what it saw).
pub fn preview(status: &Value, namespace: &str) -> (Vec<String>, Vec<String>, String) {
    let (children, crds) = recorded_children(status);
    let (mut delete, mut left) = (Vec::new(), Vec::new());
    for (phase, child) in children {
        let text = |key: &str| child.get(key).and_then(Value::as_str).unwrap_or("?").to_string();
        let (kind, name) = (text("kind"), text("name"));
        let ns = child.get("namespace").and_then(Value::as_str).unwrap_or(namespace);
        let label = format!("{phase}: {kind} {ns}/{name}");
        if matches!(kind.as_str(), "CustomResourceDefinition" | "Namespace") {
            left.push(label)
        } else {
            delete.push(label)
        }
    }
    left.extend(crds.into_iter().map(|c| format!("crds: CustomResourceDefinition {c}")));
    let mut hasher = Sha256::new();
    for item in delete.iter().chain(&left) {
        hasher.update((item.len() as u64).to_be_bytes());
        hasher.update(item.as_bytes());
    }
    let fingerprint = hex::encode(&hasher.finalize()[..16]);
    (delete, left, fingerprint)
}
