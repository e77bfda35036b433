//! The package record: one entry of JukeBox `status.packages[]`, in upstream's
//! exact wire shape (`docs/upstream-vynil.md` §1.1), and the content a manifest's
//! `fr.solidite.vynil.*` annotations carry.
//!
//! Requirements are an externally tagged enum of single-key maps. A kind we do
//! not know is kept verbatim ([`Requirement::Other`]) so that a newer package
//! never breaks an older control plane and a round trip loses nothing.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::tag::Tag;

/// `fr.solidite.vynil.metadata` key `type`: what kind of instance installs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PackageType {
    Tenant,
    Service,
    System,
}

impl PackageType {
    pub const ALL: [PackageType; 3] = [PackageType::Tenant, PackageType::Service, PackageType::System];

    pub fn as_str(self) -> &'static str {
        match self {
            PackageType::Tenant => "tenant",
            PackageType::Service => "service",
            PackageType::System => "system",
        }
    }
}

impl fmt::Display for PackageType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `fr.solidite.vynil.metadata` (upstream `VynilPackageMeta`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PackageMeta {
    pub name: String,
    pub category: String,
    pub description: String,
    #[serde(default)]
    pub app_version: Option<String>,
    #[serde(rename = "type")]
    pub package_type: PackageType,
    /// Upstream's feature names (`upgrade`, `backup`, …), kept as strings so an
    /// unknown feature is carried, not rejected.
    pub features: Vec<String>,
    #[serde(default)]
    pub backup_affinity: Option<String>,
}

/// `{category, name}` of `system_package` / `tenant_package` requirements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PackageRef {
    pub category: String,
    pub name: String,
}

/// `prefly` requirement: a Rhai expression evaluated with `instance` bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prefly {
    pub script: String,
    pub name: String,
}

/// `cluster_version` requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterVersion {
    pub major: u64,
    pub minor: u64,
}

/// One item of `requirements`: a single-key map on the wire.
#[derive(Debug, Clone, PartialEq)]
pub enum Requirement {
    CustomResourceDefinition(String),
    SystemService(String),
    TenantService(String),
    SystemPackage(PackageRef),
    TenantPackage(PackageRef),
    Prefly(Prefly),
    ClusterVersion(ClusterVersion),
    StorageCapability(String),
    /// Raw string: only a valid SemVer value counts (upstream).
    MinimumPreviousVersion(String),
    /// Raw string: only a valid SemVer value counts (upstream).
    VynilVersion(String),
    Cpu(f64),
    /// Megabytes.
    Memory(u64),
    /// Megabytes.
    Disk(u64),
    /// A kind this control plane does not know, kept verbatim.
    Other {
        kind: String,
        value: Value,
    },
}

/// One item of `recommandations` (upstream spelling).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recommandation {
    CustomResourceDefinition(String),
    SystemService(String),
    TenantService(String),
}

/// What a package revision's annotations say: everything of a status entry but
/// where it lives (registry, image, tag).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PackageContent {
    pub metadata: PackageMeta,
    pub requirements: Vec<Requirement>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommandations: Option<Vec<Recommandation>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Map<String, Value>>,
    /// The annotation text as upstream stores it: a JSON string literal (quotes
    /// included). [`PackageContent::value_script_source`] decodes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_script: Option<String>,
}

/// A JukeBox `status.packages[]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Package {
    pub registry: String,
    pub image: String,
    pub tag: String,
    /// Ours (upstream has none): the manifest digest `sha256:…` the tag
    /// resolved to when scanned, so an install records exactly what it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Ours: when the scanner first saw this digest in this repository (RFC
    /// 3339), kept across scans while the digest stays: the revision's age
    /// for a minimum release age ([`crate::upgrade::withheld`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_seen: Option<String>,
    /// Ours: the signature verdict under the JukeBox's `spec.verify`
    /// ([`crate::signature`]), decided by the scanner; `None` without a policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<crate::signature::Verdict>,
    #[serde(flatten)]
    pub content: PackageContent,
}

impl PackageContent {
    /// A revision of `category/name` with only its type: no description,
    /// features, requirements, options or scripts (add requirements with
    /// [`PackageContent::requiring`]). What tests, benchmarks and examples
    /// build on, instead of spelling out every field.
    pub fn minimal(category: &str, name: &str, package_type: PackageType) -> Self {
        PackageContent {
            metadata: PackageMeta {
                name: name.into(),
                category: category.into(),
                description: String::new(),
                app_version: None,
                package_type,
                features: Vec::new(),
                backup_affinity: None,
            },
            requirements: Vec::new(),
            recommandations: None,
            options: None,
            value_script: None,
        }
    }

    /// The same revision with one more requirement.
    pub fn requiring(mut self, requirement: Requirement) -> Self {
        self.requirements.push(requirement);
        self
    }

    /// The first `minimum_previous_version` that is valid SemVer (upstream: only
    /// the first valid entry counts).
    pub fn minimum_previous_version(&self) -> Option<semver::Version> {
        Requirement::minimum_previous_version(&self.requirements)
    }

    /// Every `vynil_version` requirement that is valid SemVer.
    /// The services (`system_service`, `tenant_service`) this revision
    /// requires or recommends: whose instances' namespaces its scripts may read.
    pub fn named_services(&self) -> Vec<String> {
        let required = self.requirements.iter().filter_map(|r| match r {
            Requirement::SystemService(s) | Requirement::TenantService(s) => Some(s.clone()),
            _ => None,
        });
        let recommended = self.recommandations.iter().flatten().filter_map(|r| match r {
            Recommandation::SystemService(s) | Recommandation::TenantService(s) => Some(s.clone()),
            Recommandation::CustomResourceDefinition(_) => None,
        });
        required.chain(recommended).collect()
    }

    /// The packages (`system_package`, `tenant_package`) this revision requires.
    pub fn named_packages(&self) -> Vec<PackageRef> {
        self.requirements
            .iter()
            .filter_map(|r| match r {
                Requirement::SystemPackage(p) | Requirement::TenantPackage(p) => Some(p.clone()),
                _ => None,
            })
            .collect()
    }

    pub fn vynil_versions(&self) -> impl Iterator<Item = semver::Version> + '_ {
        Requirement::vynil_versions(&self.requirements)
    }

    pub fn package_type(&self) -> PackageType {
        self.metadata.package_type
    }
}

impl Package {
    pub fn new(registry: &str, image: &str, tag: &str, content: PackageContent) -> Self {
        Self {
            registry: registry.into(),
            image: image.into(),
            tag: tag.into(),
            digest: None,
            first_seen: None,
            signature: None,
            content,
        }
    }

    /// The same package, recorded with the digest its tag resolved to.
    pub fn with_digest(mut self, digest: &str) -> Self {
        self.digest = Some(digest.to_string()).filter(|d| !d.is_empty());
        self
    }

    pub fn name(&self) -> &str {
        &self.content.metadata.name
    }

    pub fn category(&self) -> &str {
        &self.content.metadata.category
    }

    pub fn package_type(&self) -> PackageType {
        self.content.metadata.package_type
    }

    /// Whether this is a revision of `category/name` of `package_type`: what
    /// an instance of that package and kind may install.
    pub fn is_of(&self, category: &str, name: &str, package_type: PackageType) -> bool {
        self.category() == category && self.name() == name && self.package_type() == package_type
    }
}

const REQUIREMENT_KINDS: &[&str] = &[
    "custom_resource_definition",
    "system_service",
    "tenant_service",
    "system_package",
    "tenant_package",
    "prefly",
    "cluster_version",
    "storage_capability",
    "minimum_previous_version",
    "vynil_version",
    "cpu",
    "memory",
    "disk",
];

impl Requirement {
    /// [`PackageContent::minimum_previous_version`] of these requirements.
    pub fn minimum_previous_version(requirements: &[Requirement]) -> Option<semver::Version> {
        Self::minimum_previous_version_by(requirements, Tag::version_of)
    }

    /// The same, each candidate text read by `read` (which must answer as
    /// [`Tag::version_of`]: a caller reading many revisions remembers texts).
    pub(crate) fn minimum_previous_version_by<'a>(
        requirements: &'a [Requirement],
        mut read: impl FnMut(&'a str) -> Option<semver::Version>,
    ) -> Option<semver::Version> {
        requirements.iter().find_map(|r| match r {
            Requirement::MinimumPreviousVersion(v) => read(v),
            _ => None,
        })
    }

    /// [`PackageContent::vynil_versions`] of these requirements.
    pub fn vynil_versions(requirements: &[Requirement]) -> impl Iterator<Item = semver::Version> + '_ {
        Self::vynil_versions_by(requirements, Tag::version_of)
    }

    /// The same, each text read by `read` (as in
    /// [`Requirement::minimum_previous_version_by`]).
    pub(crate) fn vynil_versions_by<'a>(
        requirements: &'a [Requirement],
        mut read: impl FnMut(&'a str) -> Option<semver::Version>,
    ) -> impl Iterator<Item = semver::Version> {
        requirements.iter().filter_map(move |r| match r {
            Requirement::VynilVersion(v) => read(v),
            _ => None,
        })
    }

    /// The wire key of this requirement.
    pub fn kind(&self) -> &str {
        match self {
            Requirement::CustomResourceDefinition(_) => REQUIREMENT_KINDS[0],
            Requirement::SystemService(_) => REQUIREMENT_KINDS[1],
            Requirement::TenantService(_) => REQUIREMENT_KINDS[2],
            Requirement::SystemPackage(_) => REQUIREMENT_KINDS[3],
            Requirement::TenantPackage(_) => REQUIREMENT_KINDS[4],
            Requirement::Prefly(_) => REQUIREMENT_KINDS[5],
            Requirement::ClusterVersion(_) => REQUIREMENT_KINDS[6],
            Requirement::StorageCapability(_) => REQUIREMENT_KINDS[7],
            Requirement::MinimumPreviousVersion(_) => REQUIREMENT_KINDS[8],
            Requirement::VynilVersion(_) => REQUIREMENT_KINDS[9],
            Requirement::Cpu(_) => REQUIREMENT_KINDS[10],
            Requirement::Memory(_) => REQUIREMENT_KINDS[11],
            Requirement::Disk(_) => REQUIREMENT_KINDS[12],
            Requirement::Other { kind, .. } => kind,
        }
    }

    fn value(&self) -> Value {
        fn json<T: Serialize>(v: &T) -> Value {
            serde_json::to_value(v).unwrap_or(Value::Null)
        }
        match self {
            Requirement::CustomResourceDefinition(s)
            | Requirement::SystemService(s)
            | Requirement::TenantService(s)
            | Requirement::StorageCapability(s)
            | Requirement::MinimumPreviousVersion(s)
            | Requirement::VynilVersion(s) => Value::String(s.clone()),
            Requirement::SystemPackage(p) | Requirement::TenantPackage(p) => json(p),
            Requirement::Prefly(p) => json(p),
            Requirement::ClusterVersion(c) => json(c),
            Requirement::Cpu(c) => json(c),
            Requirement::Memory(m) | Requirement::Disk(m) => json(m),
            Requirement::Other { value, .. } => value.clone(),
        }
    }

    /// Parses one single-key map; the error names the kind and the problem.
    pub fn from_value(item: &Value) -> Result<Self, String> {
        let map = item
            .as_object()
            .ok_or_else(|| format!("each requirement must be a single-key map, found {}", short(item)))?;
        let mut entries = map.iter();
        let (kind, value) = match (entries.next(), entries.next()) {
            (Some(entry), None) => entry,
            _ => {
                let keys: Vec<&String> = map.keys().collect();
                return Err(format!("each requirement must be a single-key map, found keys {keys:?}"));
            }
        };
        fn parse<T: serde::de::DeserializeOwned>(kind: &str, value: &Value) -> Result<T, String> {
            T::deserialize(value).map_err(|e| format!("requirement `{kind}`: {e}"))
        }
        Ok(match kind.as_str() {
            "custom_resource_definition" => Requirement::CustomResourceDefinition(parse(kind, value)?),
            "system_service" => Requirement::SystemService(parse(kind, value)?),
            "tenant_service" => Requirement::TenantService(parse(kind, value)?),
            "system_package" => Requirement::SystemPackage(parse(kind, value)?),
            "tenant_package" => Requirement::TenantPackage(parse(kind, value)?),
            "prefly" => Requirement::Prefly(parse(kind, value)?),
            "cluster_version" => Requirement::ClusterVersion(parse(kind, value)?),
            "storage_capability" => Requirement::StorageCapability(parse(kind, value)?),
            "minimum_previous_version" => Requirement::MinimumPreviousVersion(parse(kind, value)?),
            "vynil_version" => Requirement::VynilVersion(parse(kind, value)?),
            "cpu" => Requirement::Cpu(parse(kind, value)?),
            "memory" => Requirement::Memory(parse(kind, value)?),
            "disk" => Requirement::Disk(parse(kind, value)?),
            _ => Requirement::Other { kind: kind.clone(), value: value.clone() },
        })
    }
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

impl Serialize for Requirement {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = Map::new();
        map.insert(self.kind().to_string(), self.value());
        map.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Requirement {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Requirement::from_value(&value).map_err(serde::de::Error::custom)
    }
}
