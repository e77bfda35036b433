//! A JukeBox's enforced signature policy, where an instance names a revision
//! itself (`initFrom.version`): selection never offers an unverified
//! revision, but a named one is checked here, with the catalog's verdict
//! when it lists the revision, else read from the registry with the
//! JukeBox's keys as the scanner reads them (inline, and the keys' Secret in
//! the control plane's namespace) and judged by the same rule
//! (`vynil_rules::signature`). Delete Jobs are never refused: removing a key
//! must not make an instance impossible to uninstall (`crate::uninstall_plan`
//! warns instead).

use kube::Api;
use vynil_crds::TrustedRootObject;
use vynil_registry::RepositoryRef;
use vynil_rules::signature::{Verdict, VerifyMode};

use crate::{LifecycleError, context::Context, install_plan::InitVersion, instance::Instance};

/// `found` (an `initFrom.version` found with `verdict` in the catalog, or
/// `None` when read from the registry), unless `mode` enforces a policy it fails.
pub(crate) async fn refusing_unverified(
    found: InitVersion,
    verdict: Option<Verdict>,
    mode: Option<VerifyMode>,
    instance: &Instance,
    (repo, pull_secret): (&RepositoryRef, Option<&str>),
    context: &Context,
) -> Result<InitVersion, LifecycleError> {
    let InitVersion::Found { tag, digest } = &found else { return Ok(found) };
    if mode != Some(VerifyMode::Enforce) {
        return Ok(found);
    }
    let verdict = match (verdict, digest) {
        (Some(verdict), _) => verdict,
        (None, Some(digest)) => match read(instance, repo, digest, pull_secret, context).await? {
            Some(verdict) => verdict,
            None => return Ok(found),
        },
        (None, None) => Verdict::Malformed { problem: "its digest is unknown".into() },
    };
    if verdict.is_verified() {
        return Ok(found);
    }
    Ok(InitVersion::Unverified { tag: tag.clone(), verdict })
}

/// The verdict on `repo@digest` under the JukeBox's keys; `None` when the
/// JukeBox has no policy any more.
pub(crate) async fn read(
    instance: &Instance,
    repo: &RepositoryRef,
    digest: &str,
    pull_secret: Option<&str>,
    context: &Context,
) -> Result<Option<Verdict>, LifecycleError> {
    let jukeboxes: Api<vynil_crds::JukeBox> = Api::all(context.client.clone());
    let jukebox = jukeboxes
        .get_opt(&instance.jukebox)
        .await
        .map_err(LifecycleError::kube(format!("reading JukeBox {}'s signature policy", instance.jukebox)))?;
    let Some(policy) = jukebox.and_then(|j| j.spec.verify) else { return Ok(None) };
    let secret = match policy.keys_secret.as_deref().filter(|s| !s.is_empty()) {
        Some(name) => Some(context.named_secret(name, "the trusted keys' Secret").await?),
        None => None,
    };
    let root = match policy.trusted_root.as_ref().map(vynil_crds::TrustedRootSource::object).transpose() {
        Ok(Some(TrustedRootObject::Secret(name))) => {
            Some(context.named_secret(name, "the trusted root's Secret").await?)
        }
        Ok(Some(TrustedRootObject::ConfigMap(name))) => {
            Some(context.named_config_map(name, "the trusted root's ConfigMap").await?)
        }
        Ok(None) => None,
        Err(e) => {
            return Err(LifecycleError::Invalid(vynil_crds::coded_message("E_VERIFY_KEYS", &e.to_string())));
        }
    };
    let keys = policy
        .keyring(secret.as_ref().map(|s| &s.data), root.as_ref().map(|s| &s.data))
        .map_err(|e| LifecycleError::Invalid(vynil_crds::coded_message("E_VERIFY_KEYS", &e.to_string())))?;
    let client = context.registry_for(pull_secret).await?;
    let verdict = client.signature_verdict(repo, digest, &keys, None).await.map_err(|e| {
        LifecycleError::Unavailable(format!("registry, reading the signature of {repo}@{digest}: {e}"))
    })?;
    Ok(Some(if policy.require_reference { verdict.bound_to(&repo.to_string()) } else { verdict }))
}
