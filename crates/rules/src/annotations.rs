//! Package content from manifest annotations (`docs/upstream-vynil.md` §2).
//!
//! Each value is a JSON document serialised to a string. A manifest without the
//! `metadata` or the `requirements` annotation is not a Vynil package revision
//! (`Ok(None)`); one whose annotations are present but malformed is an error
//! naming the key and the problem, so the scan can report it.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{
    RulesError,
    package::{PackageContent, Recommandation, Requirement},
};

pub const METADATA: &str = "fr.solidite.vynil.metadata";
pub const REQUIREMENTS: &str = "fr.solidite.vynil.requirements";
pub const OPTIONS: &str = "fr.solidite.vynil.options";
pub const RECOMMANDATIONS: &str = "fr.solidite.vynil.recommandations";
pub const VALUE_SCRIPT: &str = "fr.solidite.vynil.value_script";

impl PackageContent {
    /// The Rhai source of `value_script`, JSON-decoded as upstream's operator does.
    pub fn value_script_source(&self) -> Result<Option<String>, RulesError> {
        match &self.value_script {
            None => Ok(None),
            Some(raw) => serde_json::from_str::<String>(raw).map(Some).map_err(|e| RulesError::Annotation {
                key: VALUE_SCRIPT.into(),
                problem: format!("must be a JSON string literal: {e}"),
            }),
        }
    }
}

/// What a manifest's annotations say: the one metadata type every consumer
/// (scanner, purger, the registry client's cache) shares.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum ManifestMetadata {
    Vynil(Box<PackageContent>),
    /// No `fr.solidite.vynil.metadata`/`requirements` annotation.
    NotVynil,
    /// The annotations are present but malformed, or the manifest could not be
    /// read: the reason, kept as text. Planning refuses to guess over it.
    Malformed(String),
}

impl ManifestMetadata {
    /// Reads the Vynil annotations found through `get` (a map lookup).
    pub fn read<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Self {
        match parse_annotations(get) {
            Ok(Some(content)) => ManifestMetadata::Vynil(Box::new(content)),
            Ok(None) => ManifestMetadata::NotVynil,
            Err(error) => ManifestMetadata::Malformed(error.to_string()),
        }
    }
}

/// Parses the Vynil annotations found through `get` (a map lookup).
pub fn parse_annotations<'a>(
    get: impl Fn(&str) -> Option<&'a str>,
) -> Result<Option<PackageContent>, RulesError> {
    let (Some(metadata), Some(requirements)) = (get(METADATA), get(REQUIREMENTS)) else {
        return Ok(None);
    };
    let metadata = decode(METADATA, metadata)?;
    let requirements = decode::<Vec<Value>>(REQUIREMENTS, requirements)?
        .iter()
        .enumerate()
        .map(|(index, item)| {
            Requirement::from_value(item).map_err(|problem| RulesError::Annotation {
                key: REQUIREMENTS.into(),
                problem: format!("item {index}: {problem}"),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let options = get(OPTIONS).map(|raw| decode(OPTIONS, raw)).transpose()?;
    let recommandations =
        get(RECOMMANDATIONS).map(|raw| decode::<Vec<Recommandation>>(RECOMMANDATIONS, raw)).transpose()?;
    let value_script = match get(VALUE_SCRIPT) {
        Some(raw) => {
            decode::<String>(VALUE_SCRIPT, raw)?;
            Some(raw.to_string())
        }
        None => None,
    };
    Ok(Some(PackageContent { metadata, requirements, recommandations, options, value_script }))
}

fn decode<T: DeserializeOwned>(key: &str, raw: &str) -> Result<T, RulesError> {
    serde_json::from_str(raw).map_err(|e| RulesError::Annotation {
        key: key.into(),
        problem: format!("{e} (value starts {:?})", raw.chars().take(40).collect::<String>()),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::package::{ClusterVersion, PackageType};

    fn parse(pairs: &[(&str, &str)]) -> Result<Option<PackageContent>, RulesError> {
        let map: BTreeMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        parse_annotations(|key| map.get(key).map(String::as_str))
    }

    const META: &str = r#"{"name":"ollama","category":"think","description":"Local LLM inference server","app_version":"0.24.0","type":"tenant","features":["upgrade","backup"],"backup_affinity":null}"#;

    #[test]
    fn upstreams_realistic_annotation_set_parses_completely() {
        let content = parse(&[
            (METADATA, META),
            (REQUIREMENTS, r#"[{"vynil_version":"0.7.0"},{"minimum_previous_version":"0.1.0"},{"custom_resource_definition":"middlewares.traefik.io"},{"cluster_version":{"major":1,"minor":28}},{"memory":4096}]"#),
            (OPTIONS, r#"{"use_rocm":{"type":"boolean","default":false,"description":"Use the ROCm image"},"models":{"type":"array","default":["qwen3:14b"],"items":{"type":"string"}}}"#),
            (RECOMMANDATIONS, r#"[{"custom_resource_definition":"servicemonitors.monitoring.coreos.com"},{"tenant_service":"sso"}]"#),
            (VALUE_SCRIPT, r##""#{ gpu: true }""##),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(content.metadata.package_type, PackageType::Tenant);
        assert_eq!(content.metadata.app_version.as_deref(), Some("0.24.0"));
        assert_eq!(
            content.requirements[3],
            Requirement::ClusterVersion(ClusterVersion { major: 1, minor: 28 })
        );
        assert_eq!(content.minimum_previous_version(), Some(semver::Version::new(0, 1, 0)));
        assert_eq!(content.options.as_ref().unwrap().len(), 2);
        assert_eq!(content.recommandations.as_ref().unwrap()[1], Recommandation::TenantService("sso".into()));
        assert_eq!(content.value_script.as_deref(), Some(r##""#{ gpu: true }""##), "stored as upstream does");
        assert_eq!(content.value_script_source().unwrap().as_deref(), Some("#{ gpu: true }"));
    }

    #[test]
    fn a_manifest_without_metadata_or_requirements_is_not_a_vynil_revision() {
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(parse(&[(METADATA, META)]).unwrap(), None);
        assert_eq!(parse(&[(REQUIREMENTS, "[]")]).unwrap(), None);
    }

    #[test]
    fn malformed_annotations_name_the_key_and_the_problem() {
        let daemon = META.replace("tenant", "daemon");
        let cases = [
            (vec![(METADATA, "{not json"), (REQUIREMENTS, "[]")], METADATA, ""),
            (vec![(METADATA, r#"{"name":"x"}"#), (REQUIREMENTS, "[]")], METADATA, "missing field `category`"),
            (vec![(METADATA, META), (REQUIREMENTS, r#"{"a":1}"#)], REQUIREMENTS, "expected a sequence"),
            (
                vec![(METADATA, META), (REQUIREMENTS, r#"[{"memory":"lots"}]"#)],
                REQUIREMENTS,
                "requirement `memory`",
            ),
            (vec![(METADATA, META), (REQUIREMENTS, r#"[{"a":1,"b":2}]"#)], REQUIREMENTS, "single-key map"),
            (vec![(METADATA, META), (REQUIREMENTS, "[]"), (VALUE_SCRIPT, "#{ a: 1 }")], VALUE_SCRIPT, ""),
            (vec![(METADATA, daemon.as_str()), (REQUIREMENTS, "[]")], METADATA, "unknown variant `daemon`"),
        ];
        for (pairs, key, fragment) in cases {
            let error = parse(&pairs).unwrap_err();
            let RulesError::Annotation { key: found, problem } = &error else {
                panic!("unexpected error {error:?}");
            };
            assert_eq!(found, key, "{pairs:?}");
            assert!(problem.contains(fragment), "{problem}");
            assert!(error.to_string().contains(key));
        }
    }

    #[test]
    fn unknown_requirement_kinds_are_kept_verbatim() {
        let content =
            parse(&[(METADATA, META), (REQUIREMENTS, r#"[{"gpu":{"vendor":"amd"}},{"memory":512}]"#)])
                .unwrap()
                .unwrap();
        assert_eq!(content.requirements[0].kind(), "gpu");
        let back = serde_json::to_string(&content.requirements).unwrap();
        assert_eq!(back, r#"[{"gpu":{"vendor":"amd"}},{"memory":512}]"#);
    }
}
