//! Pre-computed catalogs ("index sources", `docs/upstream-vynil.md` §3.8) as
//! data: which revisions an export holds, and what a consumer's scan of an
//! index gives.
//!
//! An index is read by JukeBoxes of every maturity, on clusters running any
//! framework version, and each must see exactly the view a direct scan of the
//! registry would give it. Upstream's `file-scan` stored the union of the
//! stable, beta and alpha waypoints at the exporter's own framework: a
//! consumer on another framework version could lack a revision, and the
//! newest revision of each type (the type-aware view) was never stored. Here
//! the export is the retention keep set without usage or pins ([`exported`]),
//! planned from a framework below every requirement, so every framework
//! version is covered by a breakpoint; the consumer runs the same descent as
//! a direct scan over what the index holds ([`index_outcomes`]). A property
//! test checks that both views are equal for every channel and framework.

use std::collections::BTreeMap;

use semver::Version;

use crate::{
    Package, RulesError, ScanFilter,
    retention::{ManifestMetadata, RepositoryTag, RetentionConfig, Usage, plan_retention},
    scan::{Repository, RepositoryOutcome},
    view::{Versions, Viewer, view_of_versions},
};

use crate::Channel;

/// What an index holds of one repository.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Exported {
    /// Every revision any consumer could be shown, newest first, each with
    /// its digest.
    pub packages: Vec<Package>,
    /// The version tags without Vynil annotations a consumer's descent needs
    /// to know of: the newest one each channel admits, where the waypoints
    /// stop (upstream's descent ends at such a tag). At most three.
    pub unannotated: Vec<String>,
}

/// What an index holds of `repository`, whose tags are `tags`.
pub fn exported(repository: &Repository, tags: &[RepositoryTag]) -> Result<Exported, RulesError> {
    let config = RetentionConfig::new(Version::new(0, 0, 0), &[])?;
    let plan = plan_retention(tags, &Usage::Known(Vec::new()), &config)?;
    let by_name: BTreeMap<&str, &RepositoryTag> = tags.iter().map(|t| (t.name.as_str(), t)).collect();
    let annotated = |name: &str| match by_name.get(name).map(|t| &t.metadata) {
        Some(ManifestMetadata::Vynil(content)) => Some(content),
        _ => None,
    };
    let packages = plan
        .kept()
        .filter(|entry| crate::Tag::parse(entry.tag).is_some())
        .filter_map(|entry| {
            let content = annotated(entry.tag)?;
            Some(
                Package::new(&repository.0, &repository.1, entry.tag, (**content).clone())
                    .with_digest(entry.digest),
            )
        })
        .collect();
    let versions = Versions::parse(tags.iter().map(|t| t.name.as_str()));
    let mut unannotated: Vec<String> = Vec::new();
    for channel in Channel::ALL {
        let barrier = versions
            .as_slice()
            .iter()
            .filter(|tag| channel.admits(tag.as_str()))
            .find(|tag| annotated(tag.as_str()).is_none());
        if let Some(tag) = barrier
            && !unannotated.iter().any(|t| t == tag.as_str())
        {
            unannotated.push(tag.as_str().to_string());
        }
    }
    Ok(Exported { packages, unannotated })
}

/// One package file (`<category>_<name>.yaml`) of an index, as a scan read it.
#[derive(Debug, Clone, PartialEq)]
pub enum IndexFile {
    /// Its revisions, in any order.
    Read(Vec<Package>),
    /// It could not be read or decoded: what the catalog knew of its package
    /// stays.
    Failed,
}

/// What a consumer's scan of an index gives, per repository, for
/// [`crate::merge_scoped`]: each repository's view recomputed for `viewer`
/// from the revisions the read files hold; the repositories a failed file's
/// package had (from `known`, the current catalog) marked failed, so they
/// keep their entries; and for a partial scan (`filter`), the known matching
/// repositories the index no longer lists scanned empty, so their entries go
/// (upstream: an empty result deletes the matching entries of an index
/// source). `files` are the index's entries the scan selected, with
/// `(category, name)`; `unannotated`, the index's [`Exported::unannotated`]
/// tags by repository.
pub fn index_outcomes(
    known: &[Package],
    filter: Option<&ScanFilter>,
    files: &[((String, String), IndexFile)],
    unannotated: &[(Repository, Vec<String>)],
    viewer: &Viewer,
) -> Vec<(Repository, RepositoryOutcome)> {
    // Revisions by repository, in order of first appearance, the first of
    // each tag kept.
    let mut revisions: Vec<(Repository, Vec<&Package>)> = Vec::new();
    for (_, file) in files {
        let IndexFile::Read(packages) = file else { continue };
        for package in packages {
            let repository = (package.registry.clone(), package.image.clone());
            let slot = match revisions.iter().position(|(r, _)| *r == repository) {
                Some(at) => &mut revisions[at].1,
                None => {
                    revisions.push((repository, Vec::new()));
                    let last = revisions.len() - 1;
                    &mut revisions[last].1
                }
            };
            if !slot.iter().any(|p| p.tag == package.tag) {
                slot.push(package);
            }
        }
    }
    let failed: Vec<Repository> = files
        .iter()
        .filter(|(_, file)| matches!(file, IndexFile::Failed))
        .flat_map(|((category, name), _)| {
            known
                .iter()
                .filter(move |p| p.category() == category && p.name() == name)
                .map(|p| (p.registry.clone(), p.image.clone()))
        })
        .collect();

    let mut outcomes: Vec<(Repository, RepositoryOutcome)> = Vec::new();
    let mut push = |repository: Repository, outcome: RepositoryOutcome| {
        if !outcomes.iter().any(|(r, _)| *r == repository) {
            outcomes.push((repository, outcome));
        }
    };
    for (repository, packages) in &revisions {
        if failed.contains(repository) {
            push(repository.clone(), RepositoryOutcome::Failed);
            continue;
        }
        let by_tag: BTreeMap<&str, &Package> = packages.iter().map(|p| (p.tag.as_str(), *p)).collect();
        let stops = unannotated.iter().filter(|(r, _)| r == repository).flat_map(|(_, tags)| tags);
        // An unannotated tag is looked up as "no Vynil annotations".
        let names =
            by_tag.keys().copied().chain(stops.map(String::as_str).filter(|t| !by_tag.contains_key(t)));
        let versions = Versions::parse(names);
        let view =
            view_of_versions(&versions, viewer, true, |tag| by_tag.get(tag.as_str()).map(|p| &p.content));
        let shown = view.entries.iter().filter_map(|e| by_tag.get(e.tag.as_str()).map(|p| (*p).clone()));
        push(repository.clone(), RepositoryOutcome::Scanned(shown.collect()));
    }
    for repository in failed {
        push(repository, RepositoryOutcome::Failed);
    }
    if let Some(filter) = filter {
        for package in known.iter().filter(|p| filter.matches(p)) {
            push((package.registry.clone(), package.image.clone()), RepositoryOutcome::Scanned(Vec::new()));
        }
    }
    outcomes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PackageContent, PackageType, merge_packages};

    fn package(image: &str, tag: &str, category: &str, name: &str) -> Package {
        Package::new("r.example", image, tag, PackageContent::minimal(category, name, PackageType::Tenant))
    }

    fn viewer() -> Viewer {
        Viewer { channel: Channel::Stable, framework: Version::new(0, 8, 0) }
    }

    fn tags(outcome: &RepositoryOutcome) -> Vec<&str> {
        match outcome {
            RepositoryOutcome::Scanned(found) => found.iter().map(|p| p.tag.as_str()).collect(),
            RepositoryOutcome::Failed => vec!["<failed>"],
        }
    }

    #[test]
    fn each_repository_gets_its_own_view_newest_first_and_channels_apply() {
        let files = vec![(
            ("db".to_string(), "pg".to_string()),
            IndexFile::Read(vec![
                package("db/pg", "1.0.0", "db", "pg"),
                package("db/pg", "2.0.0-beta.1", "db", "pg"),
                package("db/pg", "1.1.0", "db", "pg"),
            ]),
        )];
        let outcomes = index_outcomes(&[], None, &files, &[], &viewer());
        assert_eq!(outcomes.len(), 1);
        // No minimum: the descent stops after the head.
        assert_eq!(tags(&outcomes[0].1), ["1.1.0"]);
        let beta = Viewer { channel: Channel::Beta, framework: Version::new(0, 8, 0) };
        assert_eq!(tags(&index_outcomes(&[], None, &files, &[], &beta)[0].1), ["2.0.0-beta.1"]);
    }

    #[test]
    fn a_failed_file_keeps_what_was_known_of_its_package() {
        let known = vec![package("db/pg", "1.0.0", "db", "pg"), package("web/app", "3.0.0", "web", "app")];
        let files = vec![
            (("db".to_string(), "pg".to_string()), IndexFile::Failed),
            (
                ("web".to_string(), "app".to_string()),
                IndexFile::Read(vec![package("web/app", "3.1.0", "web", "app")]),
            ),
        ];
        let outcomes = index_outcomes(&known, None, &files, &[], &viewer());
        let merged = merge_packages(&known, None, &outcomes);
        let merged: Vec<(&str, &str)> = merged.iter().map(|p| (p.image.as_str(), p.tag.as_str())).collect();
        assert_eq!(merged, [("web/app", "3.1.0"), ("db/pg", "1.0.0")]);
    }

    #[test]
    fn a_partial_scan_removes_matching_entries_the_index_no_longer_lists() {
        let known = vec![
            package("db/pg", "1.0.0", "db", "pg"),
            package("db/mysql", "8.0.0", "db", "mysql"),
            package("web/app", "3.0.0", "web", "app"),
        ];
        let filter = ScanFilter::parse("db").unwrap();
        let files = vec![(
            ("db".to_string(), "pg".to_string()),
            IndexFile::Read(vec![package("db/pg", "1.2.0", "db", "pg")]),
        )];
        let outcomes = index_outcomes(&known, Some(&filter), &files, &[], &viewer());
        let merged = merge_packages(&known, Some(&filter), &outcomes);
        let merged: Vec<(&str, &str)> = merged.iter().map(|p| (p.image.as_str(), p.tag.as_str())).collect();
        assert_eq!(merged, [("web/app", "3.0.0"), ("db/pg", "1.2.0")]);
    }
}
