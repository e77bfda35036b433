//! Typed descriptions of Vynil packages, rendered to the exact manifest
//! annotations upstream's `package build` writes (`docs/upstream-vynil.md` §2): each value is a
//! JSON document serialised to a string, `value_script` a JSON string literal.
//!
//! This is written independently of the rules crate on purpose: it is the
//! oracle the parser is tested against, so a shared mistake cannot hide.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

/// `fr.solidite.vynil.metadata` key `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PackageType {
    Tenant,
    Service,
    System,
}

/// Cosign-convention artifacts attached to a digest by tag name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactKind {
    Signature,
    Attestation,
    Sbom,
}

impl ArtifactKind {
    pub fn suffix(self) -> &'static str {
        match self {
            ArtifactKind::Signature => "sig",
            ArtifactKind::Attestation => "att",
            ArtifactKind::Sbom => "sbom",
        }
    }

    /// `sha256-<hex>.<suffix>` for the subject digest `sha256:<hex>`.
    pub fn tag_for(self, subject_digest: &str) -> String {
        format!("{}.{}", subject_digest.replacen(':', "-", 1), self.suffix())
    }
}

/// One package revision to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct PackageSpec {
    pub category: String,
    pub name: String,
    pub package_type: PackageType,
    pub tag: String,
    pub description: String,
    pub app_version: Option<String>,
    pub features: Vec<String>,
    pub backup_affinity: Option<String>,
    pub minimum_previous_version: Option<String>,
    pub vynil_version: Option<String>,
    /// Further requirement maps, appended as given (e.g. `{"memory": 4096}`).
    pub other_requirements: Vec<Value>,
    /// Option schema map, when the package has options.
    pub options: Option<Value>,
    pub recommandations: Option<Value>,
    /// Rhai source of `value_script`.
    pub value_script: Option<String>,
}

/// Serialised exactly in upstream's field order, `null` for absent optionals.
#[derive(Serialize)]
struct Metadata<'a> {
    name: &'a str,
    category: &'a str,
    description: &'a str,
    app_version: Option<&'a str>,
    #[serde(rename = "type")]
    package_type: PackageType,
    features: &'a [String],
    backup_affinity: Option<&'a str>,
}

impl PackageSpec {
    pub fn new(category: &str, name: &str, package_type: PackageType, tag: &str) -> Self {
        Self {
            category: category.into(),
            name: name.into(),
            package_type,
            tag: tag.into(),
            description: format!("{category}/{name} test package"),
            app_version: None,
            features: Vec::new(),
            backup_affinity: None,
            minimum_previous_version: None,
            vynil_version: None,
            other_requirements: Vec::new(),
            options: None,
            recommandations: None,
            value_script: None,
        }
    }

    pub fn min(mut self, version: &str) -> Self {
        self.minimum_previous_version = Some(version.into());
        self
    }

    pub fn vynil(mut self, version: &str) -> Self {
        self.vynil_version = Some(version.into());
        self
    }

    pub fn feature(mut self, feature: &str) -> Self {
        self.features.push(feature.into());
        self
    }

    pub fn options(mut self, schema: Value) -> Self {
        self.options = Some(schema);
        self
    }

    pub fn value_script(mut self, script: &str) -> Self {
        self.value_script = Some(script.into());
        self
    }

    pub fn requirements(&self) -> Vec<Value> {
        let mut list = Vec::new();
        if let Some(v) = &self.vynil_version {
            list.push(json!({ "vynil_version": v }));
        }
        if let Some(v) = &self.minimum_previous_version {
            list.push(json!({ "minimum_previous_version": v }));
        }
        list.extend(self.other_requirements.iter().cloned());
        list
    }

    /// The manifest annotations, keyed as upstream writes them.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        let metadata = Metadata {
            name: &self.name,
            category: &self.category,
            description: &self.description,
            app_version: self.app_version.as_deref(),
            package_type: self.package_type,
            features: &self.features,
            backup_affinity: self.backup_affinity.as_deref(),
        };
        let mut annotations = BTreeMap::new();
        annotations.insert("fr.solidite.vynil.metadata".into(), to_json(&metadata));
        annotations.insert("fr.solidite.vynil.requirements".into(), to_json(&self.requirements()));
        if let Some(options) = &self.options {
            annotations.insert("fr.solidite.vynil.options".into(), to_json(options));
        }
        if let Some(recommandations) = &self.recommandations {
            annotations.insert("fr.solidite.vynil.recommandations".into(), to_json(recommandations));
        }
        if let Some(script) = self.value_script.as_deref().filter(|s| !s.is_empty()) {
            annotations.insert("fr.solidite.vynil.value_script".into(), to_json(&script));
        }
        annotations
    }
}

fn to_json<T: Serialize + ?Sized>(value: &T) -> String {
    // Serialising plain data (strings, maps, lists) to a String cannot fail.
    serde_json::to_string(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_have_upstream_shapes() {
        let spec = PackageSpec::new("think", "ollama", PackageType::Tenant, "0.1.8")
            .min("0.1.0")
            .vynil("0.7.0")
            .feature("upgrade")
            .value_script("#{ gpu: true }");
        let a = spec.annotations();
        assert_eq!(
            a["fr.solidite.vynil.metadata"],
            r#"{"name":"ollama","category":"think","description":"think/ollama test package","app_version":null,"type":"tenant","features":["upgrade"],"backup_affinity":null}"#
        );
        assert_eq!(
            a["fr.solidite.vynil.requirements"],
            r#"[{"vynil_version":"0.7.0"},{"minimum_previous_version":"0.1.0"}]"#
        );
        assert_eq!(a["fr.solidite.vynil.value_script"], r##""#{ gpu: true }""##);
        assert!(!a.contains_key("fr.solidite.vynil.options"));
    }

    #[test]
    fn artifact_tags_follow_the_cosign_convention() {
        assert_eq!(ArtifactKind::Signature.tag_for("sha256:abc"), "sha256-abc.sig");
        assert_eq!(ArtifactKind::Sbom.tag_for("sha256:abc"), "sha256-abc.sbom");
    }
}
