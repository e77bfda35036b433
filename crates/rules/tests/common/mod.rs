//! Fixture builders shared by the rules crate's integration tests.

#![allow(dead_code, clippy::unwrap_used, clippy::panic)]

use semver::Version;
use vynil_rules::{
    Package, PackageContent, PackageType, Requirement,
    retention::{ManifestMetadata, RepositoryTag},
};

pub fn kind(name: &str) -> PackageType {
    match name {
        "tenant" => PackageType::Tenant,
        "service" => PackageType::Service,
        "system" => PackageType::System,
        other => panic!("unknown type {other}"),
    }
}

/// Content of `category/name` of type `kind`, with optional minimum and framework requirement.
pub fn content_of(
    category: &str,
    name: &str,
    kind_name: &str,
    min: Option<&str>,
    vynil: Option<&str>,
) -> PackageContent {
    let mut content = PackageContent::minimal(category, name, kind(kind_name));
    if let Some(v) = vynil {
        content = content.requiring(Requirement::VynilVersion(v.into()));
    }
    if let Some(m) = min {
        content = content.requiring(Requirement::MinimumPreviousVersion(m.into()));
    }
    content
}

pub fn content(kind_name: &str, min: Option<&str>, vynil: Option<&str>) -> PackageContent {
    content_of("think", "ollama", kind_name, min, vynil)
}

pub fn package(tag: &str, kind_name: &str, min: Option<&str>, vynil: Option<&str>) -> Package {
    Package::new("registry.example", "think/ollama", tag, content(kind_name, min, vynil))
}

/// A fake digest `sha256:<n repeated>` for a short label.
pub fn digest(label: &str) -> String {
    use std::fmt::Write;
    let mut hex = String::new();
    for byte in label.bytes().cycle().take(32) {
        let _ = write!(hex, "{byte:02x}");
    }
    format!("sha256:{hex}")
}

pub fn vynil_tag(
    name: &str,
    digest_label: &str,
    kind_name: &str,
    min: Option<&str>,
    vynil: Option<&str>,
) -> RepositoryTag {
    RepositoryTag {
        name: name.into(),
        digest: digest(digest_label),
        metadata: ManifestMetadata::Vynil(Box::new(content(kind_name, min, vynil))),
    }
}

pub fn plain_tag(name: &str, digest_label: &str) -> RepositoryTag {
    RepositoryTag { name: name.into(), digest: digest(digest_label), metadata: ManifestMetadata::NotVynil }
}

/// `sha256-<hex of digest(subject_label)>.<suffix>` on its own digest.
/// An artifact tag of `subject_label`'s digest: `sha256-<hex>.<suffix>`, or
/// the referrers tag schema's `sha256-<hex>` for an empty suffix.
pub fn artifact_tag(subject_label: &str, suffix: &str, own_label: &str) -> RepositoryTag {
    let base = digest(subject_label).replacen(':', "-", 1);
    let name = if suffix.is_empty() { base } else { format!("{base}.{suffix}") };
    plain_tag(&name, own_label)
}

pub fn framework(v: &str) -> Version {
    Version::parse(v).unwrap()
}
