//! Retention planning, structure-aware: repositories whose tags are mostly
//! versions of two or three types with minimums and framework requirements,
//! share digests, carry cosign artifacts of each other, and are used, pinned
//! or unreadable.
//!
//! Properties: a plan names every tag once; no deleted digest is a kept
//! one's (deletion is by digest); used, pinned and unmanaged tags are kept;
//! the plan and its fingerprint do not depend on the input order; a plan is
//! refused only for an unreadable version.

use std::collections::BTreeSet;

use arbitrary::{Arbitrary, Result, Unstructured};
use semver::Version;
use vynil_rules::{
    PackageContent, PackageType, Requirement, RetentionConfig, Tag, plan_retention,
    retention::{InstalledRevision, ManifestMetadata, RepositoryTag, RevisionUse, Usage},
};

use crate::input::{Text, VersionText};

#[derive(Debug)]
pub struct Repository {
    pub tags: Vec<RepositoryTag>,
    pub usage: Usage,
    pub pins: Vec<String>,
    pub framework: Version,
}

fn digest(n: u8) -> String {
    format!("sha256:{}", format!("{n:02x}").repeat(32))
}

impl<'a> Arbitrary<'a> for Repository {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let count = u.int_in_range(0..=24usize)?;
        let mut tags: Vec<RepositoryTag> = Vec::with_capacity(count);
        for _ in 0..count {
            let digest_of = digest(u.int_in_range(0..=20u8)?);
            let name = match u.int_in_range(0..=9u8)? {
                0 => match tags.len() {
                    0 => "latest".to_string(),
                    n => format!("{}.sig", tags[u.int_in_range(0..=n - 1)?].digest.replace(':', "-")),
                },
                1 => Text::arbitrary(u)?.0,
                _ => VersionText::arbitrary(u)?.0,
            };
            let metadata = match u.int_in_range(0..=9u8)? {
                0 => ManifestMetadata::NotVynil,
                1 if u.ratio(1, 3)? => ManifestMetadata::Malformed("unreadable".into()),
                _ => {
                    let package_type = *u.choose(&PackageType::ALL)?;
                    let mut content = PackageContent::minimal("fuzz", "pkg", package_type);
                    if bool::arbitrary(u)? {
                        content = content
                            .requiring(Requirement::MinimumPreviousVersion(VersionText::arbitrary(u)?.0));
                    }
                    if u.ratio(1, 4)? {
                        content = content.requiring(Requirement::VynilVersion(format!(
                            "0.{}.0",
                            u.int_in_range(6..=10u8)?
                        )));
                    }
                    ManifestMetadata::Vynil(Box::new(content))
                }
            };
            tags.push(RepositoryTag { name, digest: digest_of, metadata });
        }
        let usage = if u.ratio(1, 5)? {
            Usage::Unknown
        } else {
            let n = u.int_in_range(0..=3usize)?;
            let mut used = Vec::with_capacity(n);
            for i in 0..n {
                let tag = match tags.len() {
                    0 => VersionText::arbitrary(u)?.0,
                    len => tags[u.int_in_range(0..=len - 1)?].name.clone(),
                };
                let digest = bool::arbitrary(u)?.then(|| digest(i as u8));
                let usage = *u.choose(&[
                    RevisionUse::Installed,
                    RevisionUse::Installing,
                    RevisionUse::Pinned,
                    RevisionUse::RollbackTarget,
                ])?;
                used.push(InstalledRevision { tag, digest, instance: format!("tenant ns/i{i}"), usage });
            }
            Usage::Known(used)
        };
        let pins = if u.ratio(1, 4)? { vec![Text::arbitrary(u)?.0] } else { Vec::new() };
        let framework = Version::new(0, u.int_in_range(6..=10u64)?, 0);
        Ok(Repository { tags, usage, pins, framework })
    }
}

pub fn run(data: &[u8]) {
    let Ok(repository) = Repository::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    check(&repository);
}

pub fn check(repository: &Repository) {
    let Repository { tags, usage, pins, framework } = repository;
    let Ok(config) = RetentionConfig::new(framework.clone(), pins) else {
        return;
    };
    let plan = match plan_retention(tags, usage, &config) {
        Ok(plan) => plan,
        Err(error) => {
            let unreadable = tags.iter().any(|t| {
                Tag::parse(&t.name).is_some() && matches!(t.metadata, ManifestMetadata::Malformed(_))
            });
            assert!(unreadable, "refused without an unreadable version: {error}");
            return;
        }
    };
    let names: BTreeSet<&str> = tags.iter().map(|t| t.name.as_str()).collect();
    let planned: Vec<&str> = plan.entries.iter().map(|e| e.tag).collect();
    assert_eq!(planned.len(), names.len(), "every tag once: {planned:?}");
    assert_eq!(planned.iter().copied().collect::<BTreeSet<_>>(), names);
    let kept: BTreeSet<&str> = plan.kept().map(|e| e.digest).collect();
    for deleted in plan.deleted() {
        assert!(!kept.contains(deleted.digest), "{} deleted with a kept digest", deleted.tag);
        // When in doubt, keep: only a managed version or an artifact goes.
        let managed = tags.iter().any(|t| {
            t.name == deleted.tag
                && Tag::parse(&t.name).is_some()
                && matches!(t.metadata, ManifestMetadata::Vynil(_))
        });
        assert!(
            managed || vynil_rules::ArtifactTag::parse(deleted.tag).is_some(),
            "{} deleted though unmanaged",
            deleted.tag
        );
        if let Usage::Known(used) = usage {
            assert!(!used.iter().any(|r| r.uses(deleted.digest, &[deleted.tag])), "{} is used", deleted.tag);
        }
    }
    for deletion in plan.deletions() {
        assert!(!kept.contains(deletion.digest.as_str()));
    }
    let mut reversed = tags.clone();
    reversed.reverse();
    let again = plan_retention(&reversed, usage, &config).map(|p| (p.fingerprint, p.entries));
    assert_eq!(
        again.as_ref().ok(),
        Some(&(plan.fingerprint.clone(), plan.entries.clone())),
        "input order changed the plan"
    );
}
