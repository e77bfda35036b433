//! Manifest annotations, structure-aware: documents that are nearly the five
//! `fr.solidite.vynil.*` annotations (every requirement kind, each field
//! sometimes dropped, retyped or cut).
//!
//! Properties: a decoded revision survives a round trip through its own
//! serialisation (requirement by requirement, and whole); an error names the
//! annotation it comes from; a revision is read exactly when both the
//! metadata and the requirements are present; `ManifestMetadata::read` says
//! the same as `parse_annotations`.

use std::collections::BTreeMap;

use arbitrary::{Arbitrary, Result, Unstructured};
use serde_json::{Value, json};
use vynil_rules::{
    PackageContent, Requirement,
    annotations::{METADATA, OPTIONS, RECOMMANDATIONS, REQUIREMENTS, VALUE_SCRIPT, parse_annotations},
    retention::ManifestMetadata,
};

use crate::input::{Json, Text, VersionText, spoil};

fn requirement(u: &mut Unstructured<'_>) -> Result<Value> {
    let text = |u: &mut Unstructured<'_>| Text::arbitrary(u).map(|t| t.0);
    Ok(match u.int_in_range(0..=15u8)? {
        0 => json!({"custom_resource_definition": text(u)?}),
        1 => json!({"system_service": text(u)?}),
        2 => json!({"tenant_service": text(u)?}),
        3 => json!({"system_package": {"category": text(u)?, "name": text(u)?}}),
        4 => json!({"tenant_package": {"category": text(u)?, "name": text(u)?}}),
        5 => json!({"prefly": {"name": text(u)?, "script": text(u)?}}),
        6 => json!({"cluster_version": {"major": u64::arbitrary(u)?, "minor": u.int_in_range(0..=40u64)?}}),
        7 => json!({"storage_capability": text(u)?}),
        8 | 9 => json!({"minimum_previous_version": VersionText::arbitrary(u)?.0}),
        10 => json!({"vynil_version": VersionText::arbitrary(u)?.0}),
        11 => json!({"cpu": Json::arbitrary(u)?.0}),
        12 => json!({"memory": u64::arbitrary(u)?}),
        13 => json!({"disk": Json::arbitrary(u)?.0}),
        14 => {
            let mut map = serde_json::Map::new();
            map.insert(text(u)?, Json::arbitrary(u)?.0);
            Value::Object(map)
        }
        _ => Json::arbitrary(u)?.0,
    })
}

fn metadata(u: &mut Unstructured<'_>) -> Result<Value> {
    let text = |u: &mut Unstructured<'_>| Text::arbitrary(u).map(|t| t.0);
    let mut doc = json!({
        "name": text(u)?, "category": text(u)?, "description": text(u)?,
        "type": text(u)?, "features": [text(u)?],
    });
    if bool::arbitrary(u)? {
        doc["app_version"] = json!(VersionText::arbitrary(u)?.0);
    }
    if bool::arbitrary(u)? {
        doc["backup_affinity"] = json!(text(u)?);
    }
    Ok(doc)
}

/// The annotations of one manifest.
#[derive(Debug)]
pub struct Annotations(pub BTreeMap<&'static str, String>);

impl<'a> Arbitrary<'a> for Annotations {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let mut map = BTreeMap::new();
        if u.ratio(9, 10)? {
            let doc = metadata(u)?;
            map.insert(METADATA, spoil(u, doc)?);
        }
        if u.ratio(9, 10)? {
            let n = u.int_in_range(0..=6usize)?;
            let items = (0..n).map(|_| requirement(u)).collect::<Result<Vec<_>>>()?;
            map.insert(REQUIREMENTS, spoil(u, Value::Array(items))?);
        }
        if bool::arbitrary(u)? {
            let doc = Json::arbitrary(u)?.0;
            map.insert(OPTIONS, spoil(u, doc)?);
        }
        if bool::arbitrary(u)? {
            let doc = json!([{"custom_resource_definition": Text::arbitrary(u)?.0}]);
            map.insert(RECOMMANDATIONS, spoil(u, doc)?);
        }
        if bool::arbitrary(u)? {
            let doc = json!(Text::arbitrary(u)?.0);
            map.insert(VALUE_SCRIPT, spoil(u, doc)?);
        }
        Ok(Annotations(map))
    }
}

pub fn run(data: &[u8]) {
    let Ok(Annotations(map)) = Annotations::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    check(&map);
}

pub fn check(map: &BTreeMap<&'static str, String>) {
    let get = |key: &str| map.get(key).map(String::as_str);
    let parsed = parse_annotations(get);
    let read = ManifestMetadata::read(get);
    match parsed {
        Ok(Some(content)) => {
            assert_eq!(read, ManifestMetadata::Vynil(Box::new(content.clone())), "read and parse disagree");
            round_trips(&content);
        }
        Ok(None) => {
            assert!(
                !(map.contains_key(METADATA) && map.contains_key(REQUIREMENTS)),
                "both present, nothing read"
            );
            assert_eq!(read, ManifestMetadata::NotVynil);
        }
        Err(error) => {
            let text = error.to_string();
            assert!(
                [METADATA, REQUIREMENTS, OPTIONS, RECOMMANDATIONS, VALUE_SCRIPT]
                    .iter()
                    .any(|key| text.contains(key)),
                "the error names no annotation: {text}"
            );
            assert!(matches!(read, ManifestMetadata::Malformed(ref why) if *why == text));
        }
    }
}

fn round_trips(content: &PackageContent) {
    for requirement in &content.requirements {
        let wire = serde_json::to_value(requirement).unwrap_or(Value::Null);
        assert_eq!(
            Requirement::from_value(&wire).as_ref(),
            Ok(requirement),
            "requirement round trip via {wire}"
        );
    }
    let whole = serde_json::to_value(content).unwrap_or(Value::Null);
    let again: Result<PackageContent, _> = serde_json::from_value(whole.clone());
    assert_eq!(again.as_ref().ok(), Some(content), "revision round trip via {whole}");
    if let Some(minimum) = content.minimum_previous_version() {
        assert!(content.requirements.iter().any(|r| matches!(r, Requirement::MinimumPreviousVersion(raw)
            if vynil_rules::Tag::version_of(raw).as_ref() == Some(&minimum))));
    }
}
