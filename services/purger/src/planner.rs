//! Making a plan: read the repository (tags, digests, metadata from the
//! registry client's cache by digest), ask lifecycle what instances use, and
//! let the rules crate decide. Nothing here decides what to keep.

use vynil_proto::lifecycle::v1::{
    InstanceKind, ListInstalledRevisionsRequest, RevisionUse as ProtoUse, lifecycle_client::LifecycleClient,
};
use vynil_registry::{RegistryClient, RepositoryRef};
use vynil_rules::{
    RetentionConfig, plan_retention,
    retention::{InstalledRevision, RepositoryTag, RevisionUse, Usage},
};

use crate::{
    PurgerError,
    plan_store::{RepositoryPlan, StoredDeletion, StoredEntry, StoredPlan},
};

const READ_CONCURRENCY: usize = 8;

/// Every tag of `repo` with its digest, and metadata for version tags; a
/// repository of more than `max_tags` tags is refused before it is read.
pub async fn snapshot(
    client: &RegistryClient,
    repo: &RepositoryRef,
    max_tags: usize,
) -> Result<Vec<RepositoryTag>, PurgerError> {
    Ok(client.snapshot(repo, READ_CONCURRENCY, max_tags).await?)
}

/// What instances use in `repo`, as every lifecycle (one per cluster) says;
/// `Unknown` when there is none or any of them cannot say.
pub async fn usage(lifecycles: &[String], repo: &RepositoryRef) -> Usage {
    if lifecycles.is_empty() {
        return Usage::Unknown;
    }
    let mut revisions = Vec::new();
    for endpoint in lifecycles {
        match installed_revisions(endpoint, repo).await {
            Ok(found) => revisions.extend(found),
            Err(why) => {
                tracing::warn!(%repo, %endpoint, %why, "installed revisions unknown: plans will require an acknowledgement");
                return Usage::Unknown;
            }
        }
    }
    Usage::Known(revisions)
}

async fn installed_revisions(endpoint: &str, repo: &RepositoryRef) -> Result<Vec<InstalledRevision>, String> {
    let channel = tonic::transport::Channel::from_shared(endpoint.to_string())
        .map_err(|e| e.to_string())?
        .connect_timeout(std::time::Duration::from_secs(5))
        .timeout(std::time::Duration::from_secs(30))
        .connect()
        .await
        .map_err(|e| format!("cannot reach lifecycle at {endpoint}: {e}"))?;
    let response = LifecycleClient::new(vynil_runtime::traced(channel))
        .list_installed_revisions(ListInstalledRevisionsRequest {
            registry: repo.registry.clone(),
            repository: repo.repository.clone(),
        })
        .await
        .map_err(|status| format!("lifecycle answered {:?}: {}", status.code(), status.message()))?;
    Ok(response
        .into_inner()
        .revisions
        .into_iter()
        // Whatever name the instance was installed under (an alias of this repository).
        .filter(|r| {
            vynil_rules::repository::same((&r.registry, &r.repository), (&repo.registry, &repo.repository))
        })
        .map(|r| {
            let instance = r
                .instance
                .map(|i| {
                    let kind = match InstanceKind::try_from(i.kind) {
                        Ok(InstanceKind::Tenant) => "tenant",
                        Ok(InstanceKind::Service) => "service",
                        Ok(InstanceKind::System) => "system",
                        _ => "instance",
                    };
                    format!("{kind} {}/{}", i.namespace, i.name)
                })
                .unwrap_or_else(|| "an instance".into());
            let usage = match ProtoUse::try_from(r.r#use) {
                Ok(ProtoUse::Installing) => RevisionUse::Installing,
                Ok(ProtoUse::Pinned) => RevisionUse::Pinned,
                Ok(ProtoUse::RollbackTarget) => RevisionUse::RollbackTarget,
                _ => RevisionUse::Installed,
            };
            InstalledRevision {
                tag: r.tag,
                digest: Some(r.digest).filter(|d| !d.is_empty()),
                instance,
                usage,
            }
        })
        .collect())
}

/// The rules' plan of one repository, in storable form.
pub fn plan_repository(
    repo: &RepositoryRef,
    tags: &[RepositoryTag],
    usage: &Usage,
    retention: &RetentionConfig,
) -> Result<RepositoryPlan, PurgerError> {
    let plan = plan_retention(tags, usage, retention)?;
    Ok(RepositoryPlan {
        registry: repo.registry.clone(),
        repository: repo.repository.clone(),
        fingerprint: plan.fingerprint.clone(),
        config_fingerprint: retention.fingerprint(),
        usage_unknown: plan.usage_unknown,
        entries: plan
            .entries
            .iter()
            .map(|e| StoredEntry {
                tag: e.tag.to_string(),
                digest: e.digest.to_string(),
                keep: e.is_kept(),
                reasons: e.reasons(),
            })
            .collect(),
        deletions: plan
            .deletions()
            .into_iter()
            .map(|d| StoredDeletion { digest: d.digest, tags: d.tags, artifacts_only: d.artifacts_only })
            .collect(),
    })
}

/// Plan `id` over `repositories`, named `target`, valid for `ttl`.
pub fn assemble(
    id: String,
    target: String,
    repositories: Vec<RepositoryPlan>,
    now: jiff::Timestamp,
    ttl: std::time::Duration,
) -> StoredPlan {
    let expires = now.checked_add(jiff::SignedDuration::try_from(ttl).unwrap_or_default()).unwrap_or(now);
    let names: Vec<String> = repositories.iter().map(RepositoryPlan::name).collect();
    let parts: Vec<(&str, &str)> =
        names.iter().zip(&repositories).map(|(n, r)| (n.as_str(), r.fingerprint.as_str())).collect();
    let fingerprint = vynil_rules::retention::combined_fingerprint(&parts);
    StoredPlan {
        id,
        target,
        fingerprint,
        usage_unknown: repositories.iter().any(|r| r.usage_unknown),
        created_at: now.to_string(),
        expires_at: expires.to_string(),
        repositories,
    }
}
