//! Fixture builders for this crate's tests.

use crate::package::{PackageContent, PackageType, Requirement};

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
    let mut content = PackageContent::minimal("think", "ollama", package_type(kind));
    if let Some(v) = vynil {
        content = content.requiring(Requirement::VynilVersion(v.into()));
    }
    if let Some(m) = min {
        content = content.requiring(Requirement::MinimumPreviousVersion(m.into()));
    }
    content
}
