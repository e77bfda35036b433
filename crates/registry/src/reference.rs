//! A repository's reference, `registry/repository` (or an OCI image layout's
//! `oci-layout:<directory>//repository`), as every part of the client names it.

use std::{fmt, path::Path};

use crate::{RegistryError, Result};

/// How a registry name says "this is an OCI image layout directory".
pub const LAYOUT_SCHEME: &str = vynil_rules::repository::LAYOUT_SCHEME;

/// The directory of a layout registry name, `None` for a real registry.
pub fn layout_root(registry: &str) -> Option<&Path> {
    registry.strip_prefix(LAYOUT_SCHEME).map(Path::new)
}

/// Where Docker Hub's API answers.
const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// Whether `registry` is one of Docker Hub's names, however written (the
/// rules' repository identity).
pub(crate) fn is_docker_hub(registry: &str) -> bool {
    vynil_rules::repository::host(registry) == vynil_rules::repository::DOCKER_HUB_HOST
}

/// The host serving `registry`'s distribution API: Docker Hub's names
/// (`docker.io`, `index.docker.io`, in any case) resolve to
/// `registry-1.docker.io`, as every OCI client does; any other registry
/// serves its own name.
pub fn api_host(registry: &str) -> &str {
    if is_docker_hub(registry) { DOCKER_HUB_API } else { registry }
}

/// `registry/repository`, split at the first `/` as upstream does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepositoryRef {
    pub registry: String,
    pub repository: String,
}

impl RepositoryRef {
    pub fn new(registry: &str, repository: &str) -> Result<Self> {
        if layout_root(registry).is_some() {
            return Self::parse(&format!("{registry}//{repository}"));
        }
        // A `/` would move part of the registry into the repository.
        if registry.contains('/') {
            return Err(RegistryError::InvalidReference {
                reference: format!("{registry}/{repository}").chars().take(200).collect(),
                problem: "the registry must be a host name with an optional port".into(),
            });
        }
        Self::parse(&format!("{registry}/{repository}"))
    }

    /// Parses `registry/path/repo` (no tag, no digest), or for an OCI image
    /// layout `oci-layout:<directory>//path/repo`.
    pub fn parse(image: &str) -> Result<Self> {
        let invalid = |problem: &str| RegistryError::InvalidReference {
            reference: image.chars().take(200).collect(),
            problem: problem.to_string(),
        };
        let layout = image.starts_with(LAYOUT_SCHEME);
        let split = if layout { image.split_once("//") } else { image.split_once('/') };
        let (registry, repository) = split.ok_or_else(|| {
            invalid(if layout {
                "expected oci-layout:<directory>//repository"
            } else {
                "expected registry/repository"
            })
        })?;
        let host_ok = layout && registry.len() > LAYOUT_SCHEME.len()
            || !registry.is_empty()
                && registry
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
        if !host_ok {
            return Err(invalid("the registry must be a host name with an optional port"));
        }
        // The distribution spec's repository name grammar.
        let path_ok = !repository.is_empty()
            && repository.split('/').all(|component| {
                !component.is_empty()
                    && component
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
                    && component.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && component.ends_with(|c: char| c.is_ascii_alphanumeric())
            });
        if !path_ok {
            return Err(invalid("the repository must be lowercase path components [a-z0-9._-]"));
        }
        Ok(Self { registry: registry.to_string(), repository: repository.to_string() })
    }
}

impl RepositoryRef {
    /// The repository name the distribution API knows: on Docker Hub an
    /// official image `docker.io/redis` is `library/redis`. Statuses and
    /// errors keep the name as the user wrote it (`Display`).
    pub fn api_repository(&self) -> std::borrow::Cow<'_, str> {
        if is_docker_hub(&self.registry) && !self.repository.contains('/') {
            format!("library/{}", self.repository).into()
        } else {
            self.repository.as_str().into()
        }
    }
}

impl fmt::Display for RepositoryRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let separator = if layout_root(&self.registry).is_some() { "//" } else { "/" };
        write!(f, "{}{separator}{}", self.registry, self.repository)
    }
}
