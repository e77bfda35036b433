//! Fixture builders for this crate's tests.

use crate::package::{PackageContent, PackageMeta, PackageType, Requirement};

pub fn package_type(name: &str) -> PackageType {
    match name {
        "tenant" => PackageType::Tenant,
        "service" => PackageType::Service,
        "system" => PackageType::System,
        other => panic!("unknown type {other}"),
    }
}

/// A revision of `think/ollama` of type `kind`, with optional minimum and
/// framework requirement.
pub fn content(kind: &str, min: Option<&str>, vynil: Option<&str>) -> PackageContent {
    let mut requirements = Vec::new();
    if let Some(v) = vynil {
        requirements.push(Requirement::VynilVersion(v.into()));
    }
    if let Some(m) = min {
        requirements.push(Requirement::MinimumPreviousVersion(m.into()));
    }
    PackageContent {
        metadata: PackageMeta {
            name: "ollama".into(),
            category: "think".into(),
            description: "test".into(),
            app_version: None,
            package_type: package_type(kind),
            features: vec![],
            backup_affinity: None,
        },
        requirements,
        recommandations: None,
        options: None,
        value_script: None,
    }
}
