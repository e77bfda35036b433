//! One scan of one JukeBox: which repositories, what each may show, and the
//! new status. Every decision is the rules crate's: the view of a repository
//! (waypoints + type-aware), the partial filter, the merge. This module only
//! reads the registry and reports progress.

use std::sync::Arc;

use futures::StreamExt;
use vynil_crds::{Condition, ConditionStatus, JukeBoxConditionType, JukeBoxStatus, set_condition};
use vynil_registry::{ManifestMetadata, RegistryClient, RepositoryRef};
use vynil_rules::{
    Package, ScanFilter, Versions, ViewBuilder, Viewer, merge_packages, repositories_for,
    scan::{Repository, RepositoryOutcome},
};

use vynil_store::{JukeboxRecord, source_of};

/// Counters of one scan, reported as progress.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    pub repositories_done: u32,
    pub repositories_total: u32,
    pub tags_seen: u64,
    pub manifests_read: u64,
    /// `(registry/repository, what went wrong)`.
    pub errors: Vec<(String, String)>,
}

/// Settings of the engine.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    pub framework: semver::Version,
    pub max_tags_per_repository: usize,
    pub repository_concurrency: usize,
}

/// What a scan found; merged into the status at write time, so a write that
/// lost a race merges again into the fresher status.
#[derive(Debug, Clone)]
pub enum ScanOutput {
    /// A filter that matched no known package: nothing read, nothing changed.
    NothingToScan,
    /// The repository list itself could not be had.
    SourceFailed(String),
    Scanned {
        outcomes: Vec<(Repository, RepositoryOutcome)>,
        errors: Vec<(String, String)>,
    },
}

impl ScanOutput {
    pub fn errors(&self) -> Vec<(String, String)> {
        match self {
            ScanOutput::NothingToScan => vec![],
            ScanOutput::SourceFailed(why) => vec![("source".into(), why.clone())],
            ScanOutput::Scanned { errors, .. } => errors.clone(),
        }
    }
}

/// Scans `record` (all of it, or what `filter` names); `on_progress` is
/// called after each repository.
pub async fn scan(
    client: &RegistryClient,
    settings: &EngineSettings,
    record: &JukeboxRecord,
    filter: Option<&ScanFilter>,
    on_progress: &(dyn Fn(&Progress) + Send + Sync),
) -> ScanOutput {
    let known = record.status.as_ref().map(|s| s.packages.clone()).unwrap_or_default();
    let repositories: Result<Vec<RepositoryRef>, String> = match filter {
        Some(filter) => {
            let selected = repositories_for(&known, filter);
            if selected.is_empty() {
                return ScanOutput::NothingToScan;
            }
            selected.iter().map(|(r, i)| RepositoryRef::new(r, i).map_err(|e| e.to_string())).collect()
        }
        None => match source_of(&record.spec) {
            Ok(source) => client.enumerate(&source).await.map_err(|e| e.to_string()),
            Err(why) => Err(why),
        },
    };
    let repositories = match repositories {
        Ok(repositories) => repositories,
        Err(why) => {
            return ScanOutput::SourceFailed(format!("cannot list the repositories: {why}"));
        }
    };

    let viewer = Viewer { channel: record.spec.channel(), framework: settings.framework.clone() };
    let progress = Arc::new(std::sync::Mutex::new(Progress {
        repositories_total: repositories.len() as u32,
        ..Progress::default()
    }));
    on_progress(&progress.lock().map(|p| p.clone()).unwrap_or_default());
    let outcomes: Vec<(Repository, RepositoryOutcome)> = futures::stream::iter(repositories)
        .map(|repo| {
            let (viewer, progress) = (viewer.clone(), progress.clone());
            async move {
                let outcome = scan_repository(client, settings, &repo, &viewer, &progress).await;
                let snapshot = {
                    let mut p = progress.lock().unwrap_or_else(|e| e.into_inner());
                    p.repositories_done += 1;
                    if let Err(why) = &outcome {
                        p.errors.push((repo.to_string(), why.clone()));
                    }
                    p.clone()
                };
                on_progress(&snapshot);
                let key = (repo.registry.clone(), repo.repository.clone());
                (key, outcome.map_or(RepositoryOutcome::Failed, RepositoryOutcome::Scanned))
            }
        })
        .buffered(settings.repository_concurrency.max(1))
        .collect()
        .await;
    let errors = progress.lock().map(|p| p.errors.clone()).unwrap_or_default();
    ScanOutput::Scanned { outcomes, errors }
}

/// The status after `output`, merged into `previous`; `None` when nothing
/// changes. Conditions are upstream's: success keeps only `Updated`/`Ready`,
/// both True "Updated succesfully" (sic); a failure keeps the others, sets
/// `Updated=False <why>` and `Ready=False` only if no `Ready` exists. A
/// schedule that cannot run makes `Ready=False` with its reason whatever the
/// outcome, so a successful manual scan cannot hide it.
///
/// Conditions follow Kubernetes conventions (`lastTransitionTime` moves only
/// when `status` does), so a scan that changes nothing computes exactly the
/// previous status and nothing is written. One exception, on purpose: when
/// the packages change, `Updated` is stamped anew, so its time is the last
/// change of the catalog (what the catalog's `last_change_time` serves).
pub fn new_status(
    previous: Option<&JukeBoxStatus>,
    output: &ScanOutput,
    filter: Option<&ScanFilter>,
    schedule_problem: Option<&str>,
    generation: i64,
    now: jiff::Timestamp,
) -> Option<JukeBoxStatus> {
    let previous = previous.cloned().unwrap_or_default();
    let status = match output {
        ScanOutput::NothingToScan => return None,
        ScanOutput::SourceFailed(why) => failed_status(previous, why, generation, now),
        ScanOutput::Scanned { outcomes, errors } => {
            let packages = merge_packages(&previous.packages, filter, outcomes);
            let mut conditions = previous.conditions.clone();
            if packages != previous.packages {
                conditions.retain(|c| c.condition_type != JukeBoxConditionType::Updated);
            }
            let status = JukeBoxStatus { conditions, packages };
            if errors.is_empty() {
                let mut status = status;
                status.conditions.retain(|c| {
                    matches!(c.condition_type, JukeBoxConditionType::Updated | JukeBoxConditionType::Ready)
                });
                for kind in [JukeBoxConditionType::Updated, JukeBoxConditionType::Ready] {
                    let ok = match (kind, schedule_problem) {
                        (JukeBoxConditionType::Ready, Some(problem)) => {
                            Condition::new(kind, ConditionStatus::False, problem, generation, now)
                        }
                        _ => Condition::new(
                            kind,
                            ConditionStatus::True,
                            "Updated succesfully",
                            generation,
                            now,
                        ),
                    };
                    set_condition(&mut status.conditions, ok);
                }
                return Some(status);
            }
            let detail =
                errors.iter().map(|(repo, why)| format!("{repo}: {why}")).collect::<Vec<_>>().join("; ");
            let why = format!(
                "{} of {} repositories failed, their previous entries are kept: {detail}",
                errors.len(),
                outcomes.len()
            );
            failed_status(status, &why, generation, now)
        }
    };
    Some(with_schedule_problem(status, schedule_problem, generation, now))
}

/// Every status the scanner writes tells when the JukeBox's schedule cannot
/// run (`Ready=False` with the reason), so a successful manual scan cannot
/// hide it.
pub fn with_schedule_problem(
    mut status: JukeBoxStatus,
    problem: Option<&str>,
    generation: i64,
    now: jiff::Timestamp,
) -> JukeBoxStatus {
    if let Some(problem) = problem {
        let ready =
            Condition::new(JukeBoxConditionType::Ready, ConditionStatus::False, problem, generation, now);
        set_condition(&mut status.conditions, ready);
    }
    status
}

/// Upstream's failure: `Updated=False` with the reason, other conditions
/// kept, `Ready=False` only when there was no `Ready` yet.
pub fn failed_status(
    mut status: JukeBoxStatus,
    why: &str,
    generation: i64,
    now: jiff::Timestamp,
) -> JukeBoxStatus {
    set_condition(
        &mut status.conditions,
        Condition::new(JukeBoxConditionType::Updated, ConditionStatus::False, why, generation, now),
    );
    if !status.conditions.iter().any(|c| c.condition_type == JukeBoxConditionType::Ready) {
        let ready = Condition::new(
            JukeBoxConditionType::Ready,
            ConditionStatus::False,
            "No successful update",
            generation,
            now,
        );
        set_condition(&mut status.conditions, ready);
    }
    status
}

/// The view of one repository, reading only the manifests the descent needs.
#[tracing::instrument(skip_all, fields(repository = %repo))]
async fn scan_repository(
    client: &RegistryClient,
    settings: &EngineSettings,
    repo: &RepositoryRef,
    viewer: &Viewer,
    progress: &std::sync::Mutex<Progress>,
) -> Result<Vec<Package>, String> {
    let tags = client.list_tags(repo).await.map_err(|e| e.to_string())?;
    if let Ok(mut p) = progress.lock() {
        p.tags_seen += tags.len() as u64;
    }
    if tags.len() > settings.max_tags_per_repository {
        return Err(format!(
            "{} tags, over the cap of {}: not scanned (raise --max-tags-per-repository or clean the repository)",
            tags.len(),
            settings.max_tags_per_repository
        ));
    }
    let versions = Versions::parse(tags.iter().map(String::as_str));
    let mut builder = ViewBuilder::new(&versions, viewer.clone(), true);
    let mut contents = Vec::new();
    while let Some(tag) = builder.next_needed() {
        let found = client.tag_metadata(repo, tag.as_str()).await.map_err(|e| e.to_string())?;
        if found.as_ref().is_some_and(|f| f.manifest_read)
            && let Ok(mut p) = progress.lock()
        {
            p.manifests_read += 1;
        }
        match found.map(|f| (f.metadata, f.digest)) {
            Some((ManifestMetadata::Vynil(content), digest)) => {
                builder.provide(Some(content.as_ref()));
                contents.push((tag.as_str().to_string(), digest, *content));
            }
            Some((ManifestMetadata::Malformed(why), _)) => return Err(format!("tag {tag}: {why}")),
            Some((ManifestMetadata::NotVynil, _)) | None => {
                builder.provide(None::<&vynil_rules::PackageContent>)
            }
        }
    }
    let view = builder.finish();
    Ok(view
        .entries
        .iter()
        .filter_map(|entry| {
            let (_, digest, content) = contents.iter().find(|(t, _, _)| t == entry.tag.as_str())?;
            let package = Package::new(&repo.registry, &repo.repository, entry.tag.as_str(), content.clone());
            Some(package.with_digest(digest))
        })
        .collect())
}
