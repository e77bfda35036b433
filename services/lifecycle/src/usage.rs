//! What instances use, the purger's input (`ListInstalledRevisions`):
//! every installed, installing (`status.target`), rollback-target or
//! `initFrom`-pinned revision. Unknown is not absent: an instance whose
//! repository cannot be told makes the answer `UNAVAILABLE`, never a
//! shorter list.

use vynil_proto::lifecycle::v1::{
    InstalledRevision, InstanceRef, ListInstalledRevisionsRequest, ListInstalledRevisionsResponse,
    RevisionUse,
};

use crate::{
    LifecycleError,
    context::Context,
    instance::{Instance, InstanceKind, proto_reference},
};

fn revision(
    registry: &str,
    image: &str,
    tag: &str,
    digest: Option<&str>,
    usage: RevisionUse,
    instance: InstanceRef,
) -> InstalledRevision {
    InstalledRevision {
        registry: registry.into(),
        repository: image.into(),
        tag: tag.into(),
        digest: digest.unwrap_or_default().into(),
        r#use: usage as i32,
        instance: Some(instance),
    }
}

/// What the instance's status records: installed, installing, and while a
/// Job installs another revision, the installed one as where a failed
/// upgrade goes back to.
fn recorded(instance: &Instance, at: &InstanceRef) -> Vec<InstalledRevision> {
    let of = |p: &vynil_crds::InstalledPackage, usage| {
        revision(&p.registry, &p.image, &p.tag, p.digest.as_deref(), usage, at.clone())
    };
    let (installed, target) = (instance.status.package.as_ref(), instance.status.target.as_ref());
    let mut revisions: Vec<InstalledRevision> =
        installed.map(|p| of(p, RevisionUse::Installed)).into_iter().collect();
    if let Some(target) = target {
        revisions.push(of(&target.revision, RevisionUse::Installing));
        if let Some(installed) = installed.filter(|i| i.tag != target.revision.tag) {
            revisions.push(of(installed, RevisionUse::RollbackTarget));
        }
    }
    revisions
}

pub(crate) async fn installed_revisions(
    context: &Context,
    request: &ListInstalledRevisionsRequest,
) -> Result<ListInstalledRevisionsResponse, LifecycleError> {
    let mut revisions = Vec::new();
    for kind in InstanceKind::ALL {
        for object in context.stores.of(kind).state() {
            let at = proto_reference(kind, &object);
            // An object that does not decode may still run something: unknown, not absent.
            let instance = Instance::decode(kind, &object)?;
            let status = &instance.status;
            revisions.extend(recorded(&instance, &at));
            let pinned =
                instance.init_from.as_ref().and_then(|i| i.version.clone()).filter(|_| status.tag.is_none());
            let unrecorded = status.tag.clone().filter(|_| status.package.is_none());
            if pinned.is_none() && unrecorded.is_none() {
                continue;
            }
            // Installed by upstream (not adopted yet) or pinned: the repository is the catalog's.
            let Some((registry, image)) = context.catalog.repository_of(&instance).await? else {
                return Err(LifecycleError::Unavailable(format!(
                    "{} runs or pins a revision of {}/{} whose repository the catalog does not know: usage unknown",
                    instance.reference(),
                    instance.category,
                    instance.package
                )));
            };
            if let Some(tag) = unrecorded {
                revisions.push(revision(&registry, &image, &tag, None, RevisionUse::Installed, at.clone()));
            }
            if let Some(tag) = pinned {
                revisions.push(revision(&registry, &image, &tag, None, RevisionUse::Pinned, at));
            }
        }
    }
    // A repository under any of its names (`vynil_rules::repository`): a
    // purge planned under an alias must see what is installed.
    revisions.retain(|r| match (request.registry.is_empty(), request.repository.is_empty()) {
        (false, false) => vynil_rules::repository::same(
            (&r.registry, &r.repository),
            (&request.registry, &request.repository),
        ),
        (false, true) => {
            vynil_rules::repository::host(&r.registry) == vynil_rules::repository::host(&request.registry)
        }
        (true, false) => r.repository == request.repository,
        (true, true) => true,
    });
    Ok(ListInstalledRevisionsResponse { revisions })
}
