//! One scan of one JukeBox: which repositories, what each may show, and the
//! new status. Every decision is the rules crate's: the view of a repository
//! (waypoints + type-aware), the partial filter, the merge. This module only
//! reads the registry and reports progress.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use futures::StreamExt;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;
use vynil_crds::{Condition, JukeBoxConditionType, JukeBoxStatus, set_condition};
use vynil_registry::{ManifestMetadata, RegistryClient, RegistryError, RepositoryRef, TaggedManifest};
use vynil_rules::{
    ArtifactTag, Package, ScanScope, Versions, ViewBuilder, Viewer,
    jukebox::{self, ConditionChange, ConditionTransition, JukeboxCondition, ScanVerdict},
    merge_scoped, repositories_for,
    scan::{Repository, RepositoryOutcome},
};

use vynil_rules::signature::Verdict;
use vynil_store::{JukeboxRecord, source_of};

use crate::signatures::Verification;

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
    /// Repositories one JukeBox's source may name.
    pub max_repositories: usize,
    /// What a `source.script` may do.
    pub scripts: vynil_script::ScriptLimits,
    pub repository_concurrency: usize,
    /// Manifests read ahead of the descent within one repository.
    pub read_ahead: usize,
}

/// What a scan found; merged into the status at write time, so a write that
/// lost a race merges again into the fresher status.
#[derive(Debug, Clone)]
pub enum ScanOutput {
    /// A filter that matched no known package: nothing read, nothing changed.
    NothingToScan,
    /// The repository list itself could not be had.
    SourceFailed(String),
    /// The source's configuration is refused (a Secret it may not name):
    /// nothing was asked of it.
    SourceRefused(String),
    Scanned {
        outcomes: Vec<(Repository, RepositoryOutcome)>,
        errors: Vec<(String, String)>,
    },
}

impl From<crate::signatures::Unusable> for ScanOutput {
    /// A signature policy that cannot be used: an object it names refused
    /// or unreadable, or its keys not keys.
    fn from(unusable: crate::signatures::Unusable) -> Self {
        match unusable {
            crate::signatures::Unusable::Unreadable { what, error } => {
                ScanOutput::unreadable(error, Some("E_VERIFY_KEYS"), &format!("{what}: "))
            }
            crate::signatures::Unusable::Keys(why) => ScanOutput::SourceFailed(why),
        }
    }
}

impl ScanOutput {
    /// A source that cannot be read because of `error`: refused when it
    /// names a Secret it may not (`Ready=False`), failed otherwise, with
    /// `code` (if any) and `context` before the store's words.
    pub fn unreadable(error: vynil_store::StoreError, code: Option<&str>, context: &str) -> Self {
        match error {
            vynil_store::StoreError::SecretRefused(refused) => ScanOutput::SourceRefused(refused.to_string()),
            other => {
                let why = format!("{context}{other}");
                ScanOutput::SourceFailed(
                    code.map_or(why.clone(), |code| vynil_crds::coded_message(code, &why)),
                )
            }
        }
    }

    /// Why the source could not be read, if it could not.
    pub fn source_problem(&self) -> Option<&str> {
        match self {
            ScanOutput::SourceFailed(why) | ScanOutput::SourceRefused(why) => Some(why),
            ScanOutput::NothingToScan | ScanOutput::Scanned { .. } => None,
        }
    }

    pub fn errors(&self) -> Vec<(String, String)> {
        match self {
            ScanOutput::NothingToScan => vec![],
            ScanOutput::SourceFailed(why) | ScanOutput::SourceRefused(why) => {
                vec![("source".into(), why.clone())]
            }
            ScanOutput::Scanned { errors, .. } => errors.clone(),
        }
    }
}

/// Scans what `scope` names of `record`; `on_progress` is called after
/// each repository.
pub async fn scan(
    client: &RegistryClient,
    settings: &EngineSettings,
    record: &JukeboxRecord,
    scope: &ScanScope,
    verification: Option<&Verification>,
    on_progress: &(dyn Fn(&Progress) + Send + Sync),
) -> ScanOutput {
    let known = record.status.as_ref().map(|s| s.packages.clone()).unwrap_or_default();
    let repositories: Result<Vec<RepositoryRef>, String> = match scope {
        ScanScope::Partial(filter) => {
            let selected = repositories_for(&known, filter);
            if selected.is_empty() {
                return ScanOutput::NothingToScan;
            }
            selected.iter().map(|(r, i)| RepositoryRef::new(r, i).map_err(|e| e.to_string())).collect()
        }
        ScanScope::Repository((registry, image)) => {
            let repository = match RepositoryRef::new(registry, image) {
                Ok(repository) => repository,
                Err(why) => return ScanOutput::SourceFailed(why.to_string()),
            };
            // Only a repository of this JukeBox's source: anything else
            // reads nothing (a push event for another JukeBox's package).
            match source_of(&record.spec, settings.scripts) {
                Ok(source) if source.contains(&repository) => Ok(vec![repository]),
                Ok(_) => return ScanOutput::NothingToScan,
                Err(why) => Err(why),
            }
        }
        ScanScope::Full => match source_of(&record.spec, settings.scripts) {
            Ok(source) => client.enumerate(&source).await.map_err(|e| e.to_string()),
            Err(why) => Err(why),
        },
    };
    let repositories = match repositories {
        Ok(repositories) if repositories.len() > settings.max_repositories => {
            return ScanOutput::SourceFailed(format!(
                "the source names {} repositories, over the cap of {}: nothing scanned, the catalog is kept \
                 (narrow the source, or raise --max-repositories-per-jukebox)",
                repositories.len(),
                settings.max_repositories
            ));
        }
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
    let viewer = &viewer;
    let outcomes: Vec<(Repository, RepositoryOutcome)> = futures::stream::iter(repositories)
        .map(|repo| {
            let progress = progress.clone();
            async move {
                let outcome =
                    scan_repository(client, settings, &repo, viewer, verification, progress.clone()).await;
                let snapshot = repository_done(&progress, &repo, &outcome);
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

/// `repo` counted done in `progress`, with its error: the progress to report.
fn repository_done(
    progress: &std::sync::Mutex<Progress>,
    repo: &RepositoryRef,
    outcome: &Result<Vec<Package>, String>,
) -> Progress {
    let mut p = progress.lock().unwrap_or_else(|e| e.into_inner());
    p.repositories_done += 1;
    if let Err(why) = outcome {
        p.errors.push((repo.to_string(), why.clone()));
    }
    p.clone()
}

/// The status after `output`, merged into `previous`; `None` when nothing
/// changes. The conditions are the rules' ([`vynil_rules::jukebox`]), applied
/// with Kubernetes' transition rule, so a scan that changes nothing computes
/// exactly the previous status and nothing is written.
pub fn new_status(
    previous: Option<&JukeBoxStatus>,
    output: &ScanOutput,
    scope: &ScanScope,
    schedule_problem: Option<&str>,
    generation: i64,
    now: jiff::Timestamp,
) -> Option<JukeBoxStatus> {
    let previous = previous.cloned().unwrap_or_default();
    let (packages, verdict) = match output {
        ScanOutput::NothingToScan => return None,
        ScanOutput::SourceFailed(why) => (previous.packages.clone(), ScanVerdict::Failed(why.clone())),
        ScanOutput::SourceRefused(why) => (previous.packages.clone(), ScanVerdict::Refused(why.clone())),
        ScanOutput::Scanned { outcomes, errors } => {
            let merged = merge_scoped(&previous.packages, scope, outcomes);
            let packages = vynil_rules::scan::with_first_seen(&previous.packages, merged, now);
            let verdict = if errors.is_empty() {
                ScanVerdict::Succeeded
            } else {
                ScanVerdict::Failed(jukebox::partial_failure(errors, outcomes.len()))
            };
            (packages, verdict)
        }
    };
    let has_ready = previous.conditions.iter().any(|c| c.condition_type == JukeBoxConditionType::Ready);
    let transition =
        jukebox::after_scan(&verdict, has_ready, packages != previous.packages, schedule_problem);
    let mut conditions = previous.conditions;
    apply(&mut conditions, &transition, generation, now);
    Some(JukeBoxStatus { conditions, packages, traceparent: None })
}

/// A failure that is no scan (an invalid force-scan value): the rules'
/// conditions of a failed scan, packages untouched.
pub fn failed_status(
    mut status: JukeBoxStatus,
    why: &str,
    generation: i64,
    now: jiff::Timestamp,
) -> JukeBoxStatus {
    let has_ready = status.conditions.iter().any(|c| c.condition_type == JukeBoxConditionType::Ready);
    let transition = jukebox::after_scan(&ScanVerdict::Failed(why.to_string()), has_ready, false, None);
    apply(&mut status.conditions, &transition, generation, now);
    status
}

/// The schedule cannot run: `Ready=False` naming why.
pub fn with_schedule_problem(
    mut status: JukeBoxStatus,
    problem: &str,
    generation: i64,
    now: jiff::Timestamp,
) -> JukeBoxStatus {
    set(&mut status.conditions, &jukebox::schedule_problem_condition(problem), generation, now);
    status
}

fn kind(condition: JukeboxCondition) -> JukeBoxConditionType {
    match condition {
        JukeboxCondition::Updated => JukeBoxConditionType::Updated,
        JukeboxCondition::Ready => JukeBoxConditionType::Ready,
    }
}

fn set(
    conditions: &mut Vec<Condition<JukeBoxConditionType>>,
    change: &ConditionChange,
    generation: i64,
    now: jiff::Timestamp,
) {
    let condition =
        Condition::new(kind(change.condition), change.ok, change.message.clone(), generation, now);
    set_condition(conditions, condition);
}

fn apply(
    conditions: &mut Vec<Condition<JukeBoxConditionType>>,
    transition: &ConditionTransition,
    generation: i64,
    now: jiff::Timestamp,
) {
    if transition.only_ours {
        conditions.retain(|c| {
            matches!(c.condition_type, JukeBoxConditionType::Updated | JukeBoxConditionType::Ready)
        });
    }
    if transition.restamp_updated {
        conditions.retain(|c| c.condition_type != JukeBoxConditionType::Updated);
    }
    for change in &transition.set {
        set(conditions, change, generation, now);
    }
}

/// Unverified revisions an enforced policy keeps out of a repository's view
/// but records (newest first, at most this many), so the catalog can say why
/// they are not offered.
const MAX_REFUSED: usize = 10;

/// What the descent was told of one tag: its manifest, and under an
/// enforced signature policy the verdict on a package revision.
type Read = Option<(TaggedManifest, Option<Verdict>)>;

/// The view of one repository, reading the manifests the descent needs, up
/// to `settings.read_ahead` of them at once: the descent asks one tag at a
/// time, but the next tags it may ask are known (`ViewBuilder::upcoming`),
/// so they are read while it decides. A first scan then costs about its
/// manifest reads divided by the window, and extra reads are bounded by it.
///
/// Under a signature policy each revision kept carries its verdict; under
/// `enforce` the descent skips an unverified revision (the view is that of
/// the verified revisions, as the catalog's roles compute it) and the newest
/// of them are recorded beside it ([`MAX_REFUSED`]).
#[tracing::instrument(skip_all, fields(repository = %repo))]
async fn scan_repository(
    client: &RegistryClient,
    settings: &EngineSettings,
    repo: &RepositoryRef,
    viewer: &Viewer,
    verification: Option<&Verification>,
    progress: Arc<std::sync::Mutex<Progress>>,
) -> Result<Vec<Package>, String> {
    let tags =
        client.list_tags_at_most(repo, settings.max_tags_per_repository).await.map_err(|e| match e {
            RegistryError::TooManyTags { .. } => {
                format!("{e}: not scanned (raise --max-tags-per-repository or clean the repository)")
            }
            e => e.to_string(),
        })?;
    if let Ok(mut p) = progress.lock() {
        p.tags_seen += tags.len() as u64;
    }
    let signed = Arc::new(signature_tags(&tags));
    let versions = Versions::parse(tags.iter().map(String::as_str));
    let mut builder = ViewBuilder::new(&versions, viewer.clone(), true);
    let mut contents = Vec::new();
    let mut refused: Vec<Package> = Vec::new();
    let mut ahead: HashMap<String, AbortOnDropHandle<Result<Read, String>>> = HashMap::new();
    let enforced = verification.filter(|v| v.enforced()).map(|v| (v.clone(), signed.clone()));
    let read = |tag: String| spawn_read(client, repo, tag, progress.clone(), enforced.clone());
    while let Some(tag) = builder.next_needed() {
        for next in builder.upcoming(settings.read_ahead.max(1)) {
            if !ahead.contains_key(next.as_str()) {
                ahead.insert(next.as_str().to_string(), read(next.as_str().to_string()));
            }
        }
        let task = ahead.remove(tag.as_str()).unwrap_or_else(|| read(tag.as_str().to_string()));
        let found = task.await.map_err(|e| format!("tag {tag}: the read was lost: {e}"))??;
        match found.map(|(f, verdict)| (f.metadata, f.digest, verdict)) {
            Some((ManifestMetadata::Vynil(content), digest, Some(verdict))) if !verdict.is_verified() => {
                builder.skip();
                if refused.len() < MAX_REFUSED {
                    let package = Package::new(&repo.registry, &repo.repository, tag.as_str(), *content);
                    refused.push(Package { signature: Some(verdict), ..package.with_digest(&digest) });
                }
            }
            Some((ManifestMetadata::Vynil(content), digest, verdict)) => {
                builder.provide(Some(content.as_ref()));
                contents.push((tag.as_str().to_string(), digest, *content, verdict));
            }
            Some((ManifestMetadata::Malformed(why), _, _)) => return Err(format!("tag {tag}: {why}")),
            Some((ManifestMetadata::NotVynil, _, _)) | None => {
                builder.provide(None::<&vynil_rules::PackageContent>)
            }
        }
    }
    // Reads already in flight finish (they are counted, and cached for the
    // next scan); at most the window.
    for (_, task) in ahead {
        let _ = task.await;
    }
    let view = builder.finish();
    let mut packages = Vec::new();
    for entry in &view.entries {
        let Some((_, digest, content, verdict)) = contents.iter().find(|(t, ..)| t == entry.tag.as_str())
        else {
            continue;
        };
        let package = Package::new(&repo.registry, &repo.repository, entry.tag.as_str(), content.clone());
        let signature = match (verdict, verification) {
            (Some(verdict), _) => Some(verdict.clone()),
            (None, Some(v)) => Some(verdict_of(client, repo, digest, v, &signed).await?),
            (None, None) => None,
        };
        packages.push(Package { signature, ..package.with_digest(digest) });
    }
    packages.extend(refused);
    Ok(packages)
}

/// One tag's read, spawned: its manifest (through the metadata cache,
/// counted when read) and, under an enforced signature policy (its keys and
/// the signature tags listed), the verdict on a package revision.
fn spawn_read(
    client: &RegistryClient,
    repo: &RepositoryRef,
    tag: String,
    progress: Arc<std::sync::Mutex<Progress>>,
    enforced: Option<(Verification, Arc<HashSet<String>>)>,
) -> AbortOnDropHandle<Result<Read, String>> {
    let (client, repo) = (client.clone(), repo.clone());
    let task = async move {
        let found = client.tag_metadata(&repo, &tag).await.map_err(|e| e.to_string())?;
        if found.as_ref().is_some_and(|f| f.manifest_read)
            && let Ok(mut p) = progress.lock()
        {
            p.manifests_read += 1;
        }
        let Some(found) = found else { return Ok(None) };
        let verdict = match (&found.metadata, enforced) {
            (ManifestMetadata::Vynil(_), Some((verification, signed))) => {
                Some(verdict_of(&client, &repo, &found.digest, &verification, &signed).await?)
            }
            _ => None,
        };
        Ok(Some((found, verdict)))
    };
    AbortOnDropHandle::new(tokio::spawn(task.instrument(tracing::Span::current())))
}

/// The verdict on the revision at `digest` under `verification` (`signed`:
/// the signature tags listed).
async fn verdict_of(
    client: &RegistryClient,
    repo: &RepositoryRef,
    digest: &str,
    verification: &Verification,
    signed: &HashSet<String>,
) -> Result<Verdict, String> {
    let verdict = client
        .signature_verdict(repo, digest, &verification.keys, Some(signed))
        .await
        .map_err(|e| format!("the signature of {repo}@{digest}: {e}"))?;
    Ok(if verification.require_reference { verdict.bound_to(&repo.to_string()) } else { verdict })
}

/// The tags signatures may be under: cosign's `.sig`, the referrers tag
/// schema's index.
fn signature_tags(tags: &[String]) -> HashSet<String> {
    tags.iter().filter(|t| ArtifactTag::parse(t).is_some_and(|a| a.holds_signatures())).cloned().collect()
}
