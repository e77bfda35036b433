//! What the API server says of an instance's JukeBox, from lifecycle's own
//! watch of JukeBoxes: what Redis cannot write (#65 item 6).
//!
//! The catalog answers from its Redis cache, so whoever may write Redis (a
//! `SET` and a `PUBLISH`) could make it answer any registry, digest,
//! signature verdict or script for a revision, any pull secret, and no
//! upgrade policy or signature policy at all. Here the catalog only
//! chooses: the revision a Job runs is the JukeBox's status entry of the
//! chosen tag (the scanner writes it to the API server), and the pull
//! secret, the upgrade policy and the signature mode are the JukeBox's spec.
//! A tag the status does not list, or lists at another digest, is
//! `[E_UNCONFIRMED]` until the two agree (a scan lands in the API server
//! first, then in Redis: a moment apart). What Redis can still do is said in
//! `docs/security.md`.

use std::{sync::Arc, time::Duration};

use kube::{
    Api, Client,
    runtime::reflector::{ObjectRef, Store},
};
use vynil_crds::JukeBox;
use vynil_rules::Package;

use crate::{
    LifecycleError, catalog_client::Answer, context::Context, install_plan::Resolution, instance::Instance,
};

/// How long a reconcile waits for the first list of JukeBoxes.
const READY: Duration = Duration::from_secs(5);

/// A store of every JukeBox, and the watch that fills it (run until `stop`).
pub fn watch(
    client: &Client,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> (Store<JukeBox>, impl std::future::Future<Output = ()> + Send + 'static) {
    crate::facts::watched(Api::<JukeBox>::all(client.clone()), "JukeBoxes", stop)
}

/// The instance's JukeBox as the API server has it (`None`: it has none).
pub(crate) async fn of(
    instance: &Instance,
    context: &Context,
) -> Result<Option<Arc<JukeBox>>, LifecycleError> {
    let store = &context.stores.jukeboxes;
    if !matches!(tokio::time::timeout(READY, store.wait_until_ready()).await, Ok(Ok(()))) {
        return Err(LifecycleError::Pending {
            why: "the JukeBoxes are not listed yet (lifecycle's watch of them)".into(),
            retry_after: READY,
        });
    }
    Ok(store.get(&ObjectRef::new(&instance.jukebox)))
}

/// The revision `registry/image:tag` as the JukeBox's status lists it.
pub(crate) fn listed<'a>(
    jukebox: &'a JukeBox,
    registry: &str,
    image: &str,
    tag: &str,
) -> Option<&'a Package> {
    let packages = jukebox.status.as_ref().map(|s| s.packages.as_slice()).unwrap_or_default();
    packages.iter().find(|p| p.registry == registry && p.image == image && p.tag == tag)
}

/// Why the catalog's cleanup revision `package` is not the one `jukebox`'s
/// status lists (its location, digest and `value_script`, what a delete
/// Job runs), in words; `None`: it is.
pub(crate) fn unlisted_cleanup(
    jukebox: Option<&JukeBox>,
    name: &str,
    package: &vynil_proto::catalog::v1::Package,
) -> Option<String> {
    let (registry, image, tag) = (&package.registry, &package.image, &package.tag);
    let listed = jukebox.and_then(|j| listed(j, registry, image, tag));
    let Some(listed) = listed else {
        return Some(format!(
            "the catalog's cleanup revision {registry}/{image}:{tag} is not listed in JukeBox {name}'s status"
        ));
    };
    let digest_agrees =
        package.digest.is_empty() || listed.digest.as_deref() == Some(package.digest.as_str());
    let script = listed.content.value_script_source().ok().flatten().unwrap_or_default();
    (!digest_agrees || script != package.value_script).then(|| {
        format!(
            "the catalog's cleanup revision {registry}/{image}:{tag} is not the one JukeBox {name}'s status lists (digest or value_script differ)"
        )
    })
}

/// The catalog's `answer`, with what the API server says of `jukebox` in
/// place of what Redis may have written: its revision, pull secret,
/// upgrade policy and signature mode.
pub(crate) fn confirmed(mut answer: Answer, jukebox: Option<&JukeBox>, name: &str) -> Answer {
    let Some(jukebox) = jukebox else {
        answer.resolution = Resolution::JukeboxMissing;
        answer.jukebox_policy = None;
        return answer;
    };
    answer.jukebox_policy = jukebox.spec.upgrade_policy.clone();
    answer.held_back.verify = jukebox.spec.verify_mode();
    if let Resolution::Package { package, .. } = &answer.resolution {
        let (registry, image, tag) = (&package.registry, &package.image, &package.tag);
        answer.resolution = match listed(jukebox, registry, image, tag) {
            Some(listed) if package.digest.is_none() || listed.digest == package.digest => {
                Resolution::Package {
                    package: Box::new(listed.clone()),
                    pull_secret: jukebox.spec.pull_secret.clone(),
                }
            }
            Some(listed) => Resolution::Unconfirmed {
                reason: format!(
                    "the catalog offers {registry}/{image}:{tag} at {}, JukeBox {name}'s status lists it at {}: nothing runs until they agree (a scan in progress settles it; if not, check who writes Redis)",
                    package.digest.as_deref().unwrap_or("no digest"),
                    listed.digest.as_deref().unwrap_or("no digest"),
                ),
            },
            None => Resolution::Unconfirmed {
                reason: format!(
                    "the catalog offers {registry}/{image}:{tag}, which JukeBox {name}'s status does not list: nothing runs until it does (a scan in progress settles it; if not, check who writes Redis)"
                ),
            },
        };
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::install_plan::HeldBack;
    use vynil_rules::{PackageContent, PackageType};

    fn revision(tag: &str, digest: &str) -> Package {
        Package::new(
            "r.example",
            "apps/web",
            tag,
            PackageContent::minimal("apps", "web", PackageType::Tenant),
        )
        .with_digest(digest)
    }

    /// JukeBox `box` as the API server has it: its status lists `listed`.
    fn jukebox(listed: Vec<Package>) -> JukeBox {
        let spec = serde_json::json!({"schedule": "0 * * * *", "pull_secret": "box-pull",
            "upgrade_policy": {"approval": "manual"}, "verify": {"mode": "enforce"}});
        let mut jukebox = JukeBox::new("box", serde_json::from_value(spec).unwrap());
        jukebox.status = Some(vynil_crds::JukeBoxStatus { packages: listed, ..Default::default() });
        jukebox
    }

    /// What a Redis writer made the catalog answer: `package`, no policy.
    fn answer(package: Package) -> Answer {
        Answer {
            resolution: Resolution::Package {
                package: Box::new(package),
                pull_secret: Some("theirs".into()),
            },
            jukebox_policy: None,
            held_back: HeldBack::default(),
        }
    }

    #[test]
    fn what_runs_is_the_jukeboxs_status_entry_with_its_spec_whatever_the_catalog_says() {
        let listed = revision("0.2.0", "sha256:aa");
        let mut scripted = listed.clone();
        scripted.content.value_script = Some("\"evil\"".into());
        let confirmed = confirmed(answer(scripted), Some(&jukebox(vec![listed.clone()])), "box");
        let Resolution::Package { package, pull_secret } = &confirmed.resolution else {
            panic!("{:?}", confirmed.resolution)
        };
        assert_eq!((**package == listed, pull_secret.as_deref()), (true, Some("box-pull")));
        assert_eq!(confirmed.jukebox_policy.and_then(|p| p.approval), Some(vynil_crds::ApprovalMode::Manual));
        assert_eq!(confirmed.held_back.verify, Some(vynil_rules::signature::VerifyMode::Enforce));
    }

    #[test]
    fn a_tag_the_status_does_not_list_or_lists_at_another_digest_is_unconfirmed() {
        let status = jukebox(vec![revision("0.2.0", "sha256:aa")]);
        for (offered, says) in [
            (revision("0.3.0", "sha256:ee"), "does not list"),
            (revision("0.2.0", "sha256:ee"), "lists it at sha256:aa"),
        ] {
            let confirmed = confirmed(answer(offered), Some(&status), "box");
            let Resolution::Unconfirmed { reason } = &confirmed.resolution else {
                panic!("{:?}", confirmed.resolution)
            };
            assert!(reason.contains(says), "{reason}");
        }
        let gone = confirmed(answer(revision("0.2.0", "sha256:aa")), None, "box");
        assert_eq!(gone.resolution, Resolution::JukeboxMissing);
    }

    #[test]
    fn a_cleanup_revision_runs_only_as_the_status_lists_it() {
        let status = jukebox(vec![revision("0.2.0", "sha256:aa")]);
        let proto = |tag: &str, digest: &str, script: &str| vynil_proto::catalog::v1::Package {
            registry: "r.example".into(),
            image: "apps/web".into(),
            tag: tag.into(),
            digest: digest.into(),
            value_script: script.into(),
            ..Default::default()
        };
        assert_eq!(unlisted_cleanup(Some(&status), "box", &proto("0.2.0", "sha256:aa", "")), None);
        for forged in [
            proto("0.3.0", "sha256:aa", ""),
            proto("0.2.0", "sha256:ee", ""),
            proto("0.2.0", "sha256:aa", "1"),
        ] {
            assert!(unlisted_cleanup(Some(&status), "box", &forged).is_some(), "{forged:?}");
        }
        assert!(unlisted_cleanup(None, "box", &proto("0.2.0", "sha256:aa", "")).is_some());
    }
}
