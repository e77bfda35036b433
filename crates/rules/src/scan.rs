//! Partial scans and the status merge (`docs/upstream-vynil.md` §3.3, §3.9; upstream #9).
//!
//! A partial scan filter is `<category>` or `<category>/<name>`, validated
//! (upstream split it differently in two places). It selects the repositories
//! of the known catalog entries it matches, so a filter matching nothing reads
//! nothing. The merge replaces only what the scan owns: entries matching the
//! filter in repositories that were scanned successfully. A repository whose
//! scan failed keeps its previous entries, and everything outside the filter
//! stays where it was.

use std::fmt;

use crate::{RulesError, package::Package};

/// A validated partial-scan filter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScanFilter {
    pub category: String,
    pub name: Option<String>,
}

impl ScanFilter {
    pub fn parse(raw: &str) -> Result<Self, RulesError> {
        let invalid =
            |problem: &str| RulesError::ScanFilter { filter: raw.to_string(), problem: problem.to_string() };
        let segments: Vec<&str> = raw.split('/').collect();
        if segments.len() > 2 {
            return Err(invalid("has more than two segments"));
        }
        if segments.iter().any(|s| s.is_empty()) {
            return Err(invalid("has an empty segment"));
        }
        if segments.iter().any(|s| s.chars().any(|c| c.is_whitespace() || c.is_control())) {
            return Err(invalid("contains whitespace or control characters"));
        }
        Ok(ScanFilter { category: segments[0].to_string(), name: segments.get(1).map(|s| s.to_string()) })
    }

    /// What a scan request asks, read once wherever it comes from (the
    /// `vynil.solidite.fr/force-scan` annotation as upstream reads it, or the
    /// `Scan` RPC's filter): `true` or empty is a full scan (`None`), any
    /// other value a partial scan whose filter must be valid.
    pub fn from_request(value: &str) -> Result<Option<Self>, RulesError> {
        match value.trim() {
            "" | "true" => Ok(None),
            raw => Self::parse(raw).map(Some),
        }
    }

    pub fn matches(&self, package: &Package) -> bool {
        self.names(package.category(), package.name())
    }

    /// Whether the package `category/name` is one this filter names (an
    /// index entry, say, before its revisions are read).
    pub fn names(&self, category: &str, name: &str) -> bool {
        category == self.category && self.name.as_deref().is_none_or(|n| name == n)
    }
}

impl fmt::Display for ScanFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "{}/{name}", self.category),
            None => f.write_str(&self.category),
        }
    }
}

/// A repository to scan: `(registry, image)`.
pub type Repository = (String, String);

/// What one scan reads, and so what its merge replaces.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ScanScope {
    /// Every repository of the JukeBox's source.
    Full,
    /// The repositories of known entries the filter matches (upstream #9).
    Partial(ScanFilter),
    /// Exactly one repository (a registry push event), read only if it
    /// belongs to the JukeBox's source: a repository that is not yet a known
    /// package is discovered, without a full scan.
    Repository(Repository),
}

impl ScanScope {
    /// A full scan, or a partial one.
    pub fn from_filter(filter: Option<ScanFilter>) -> Self {
        filter.map_or(ScanScope::Full, ScanScope::Partial)
    }

    pub fn filter(&self) -> Option<&ScanFilter> {
        match self {
            ScanScope::Partial(filter) => Some(filter),
            _ => None,
        }
    }
}

/// As a scan record shows it: empty for a full scan, the filter, or
/// `registry/repository`.
impl fmt::Display for ScanScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScanScope::Full => Ok(()),
            ScanScope::Partial(filter) => filter.fmt(f),
            ScanScope::Repository((registry, image)) => write!(f, "{registry}/{image}"),
        }
    }
}

/// The repositories a partial scan reads: those of known entries matching the
/// filter, deduplicated, in list order. Empty when nothing matches (never a
/// fallback to a full scan).
pub fn repositories_for(known: &[Package], filter: &ScanFilter) -> Vec<Repository> {
    let mut repositories: Vec<Repository> = Vec::new();
    for package in known.iter().filter(|p| filter.matches(p)) {
        let repository = (package.registry.clone(), package.image.clone());
        if !repositories.contains(&repository) {
            repositories.push(repository);
        }
    }
    repositories
}

/// What scanning one repository gave.
#[derive(Debug, Clone, PartialEq)]
pub enum RepositoryOutcome {
    /// The repository's view, newest first.
    Scanned(Vec<Package>),
    /// The scan failed: previous entries are kept.
    Failed,
}

/// The new `status.packages` after a scan of `scope`: [`merge_packages`]
/// for full and partial scans; for a repository-scoped one, that
/// repository's entries replaced in place by its new view (appended when it
/// had none), everything else untouched, and nothing changed when its scan
/// failed or it was not read.
pub fn merge_scoped(
    previous: &[Package],
    scope: &ScanScope,
    outcomes: &[(Repository, RepositoryOutcome)],
) -> Vec<Package> {
    let ScanScope::Repository(repository) = scope else {
        return merge_packages(previous, scope.filter(), outcomes);
    };
    let found = outcomes.iter().find_map(|(r, outcome)| match outcome {
        RepositoryOutcome::Scanned(found) if r == repository => Some(found),
        _ => None,
    });
    let Some(found) = found else { return previous.to_vec() };
    let ours = |p: &Package| p.registry == repository.0 && p.image == repository.1;
    let mut merged = Vec::with_capacity(previous.len() + found.len());
    let mut placed = false;
    for package in previous {
        if !ours(package) {
            merged.push(package.clone());
        } else if !placed {
            merged.extend(found.iter().cloned());
            placed = true;
        }
    }
    if !placed {
        merged.extend(found.iter().cloned());
    }
    merged
}

/// `merged` (a scan's new `status.packages`) with when the scanner first saw
/// each revision: the time a previous entry of the same repository and
/// digest recorded (the same tag, for entries without a digest), else `now`.
/// So a re-pushed tag (a new digest) is seen now, and an entry that left the
/// catalog and came back starts again: the safe direction for a minimum age.
pub fn with_first_seen(previous: &[Package], mut merged: Vec<Package>, now: jiff::Timestamp) -> Vec<Package> {
    let same = |p: &Package, q: &Package| {
        p.registry == q.registry
            && p.image == q.image
            && match (&p.digest, &q.digest) {
                (Some(a), Some(b)) => a == b,
                (None, None) => p.tag == q.tag,
                _ => false,
            }
    };
    for package in merged.iter_mut().filter(|p| p.first_seen.is_none()) {
        let known = previous.iter().filter(|p| same(p, package)).find_map(|p| p.first_seen.clone());
        package.first_seen = Some(known.unwrap_or_else(|| now.to_string()));
    }
    merged
}

/// The new `status.packages`.
///
/// Full scan (`filter` = `None`): the scanned repositories in scan order, each
/// with its new view, or with its previous entries if its scan failed.
/// Partial scan: previous entries stay in place except those matching the
/// filter in successfully scanned repositories; the new views are appended.
pub fn merge_packages(
    previous: &[Package],
    filter: Option<&ScanFilter>,
    outcomes: &[(Repository, RepositoryOutcome)],
) -> Vec<Package> {
    let in_repository =
        |p: &Package, (registry, image): &Repository| p.registry == *registry && p.image == *image;
    match filter {
        None => outcomes
            .iter()
            .flat_map(|(repository, outcome)| match outcome {
                RepositoryOutcome::Scanned(found) => found.clone(),
                RepositoryOutcome::Failed => {
                    previous.iter().filter(|p| in_repository(p, repository)).cloned().collect()
                }
            })
            .collect(),
        Some(filter) => {
            let replaced = |p: &Package| {
                filter.matches(p)
                    && outcomes
                        .iter()
                        .any(|(r, o)| matches!(o, RepositoryOutcome::Scanned(_)) && in_repository(p, r))
            };
            let mut merged: Vec<Package> = previous.iter().filter(|p| !replaced(p)).cloned().collect();
            for (_, outcome) in outcomes {
                if let RepositoryOutcome::Scanned(found) = outcome {
                    merged.extend(found.iter().cloned());
                }
            }
            merged
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::package::{PackageContent, PackageType};

    fn at(tag: &str, digest: &str, first_seen: Option<&str>) -> Package {
        let content = PackageContent::minimal("c", "n", PackageType::Tenant);
        let mut p = Package::new("reg", "c/n", tag, content).with_digest(digest);
        p.first_seen = first_seen.map(String::from);
        p
    }

    #[test]
    fn a_digest_keeps_its_first_sighting_and_a_re_pushed_tag_starts_again() {
        let earlier = "2026-01-01T00:00:00Z";
        let now: jiff::Timestamp = "2026-02-01T00:00:00Z".parse().unwrap();
        let previous = [at("1.0.0", "sha256:a", Some(earlier)), at("1.1.0", "sha256:b", Some(earlier))];
        let scanned = vec![
            at("1.0.0", "sha256:a", None),
            at("1.1.0", "sha256:c", None),
            at("1.2.0", "sha256:d", None),
            // The same digest under a new tag: the digest was seen before.
            at("1.0", "sha256:a", None),
        ];
        let seen: Vec<String> =
            with_first_seen(&previous, scanned, now).into_iter().filter_map(|p| p.first_seen).collect();
        assert_eq!(seen, [earlier, "2026-02-01T00:00:00Z", "2026-02-01T00:00:00Z", earlier]);
    }
}
