//! The other instances of an instance's package, for waves
//! (`vynil_rules::upgrade::waves`): read from the controller's own watch
//! cache, each with its namespace's labels (the operator's: a wave is
//! chosen by them, never by the instance's own labels, which its tenant
//! writes) and, from the upgrade records, what lifecycle credited, started
//! and quarantined for it. Read only when the JukeBox's policy has waves.
//! And the watch mapper that wakes the instances behind one that moved: a
//! canary installing a revision (or failing to) is what the waves after it
//! wait for.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject},
    runtime::reflector::{ObjectRef, Store},
};

use crate::{
    LifecycleError, facts::Stores, install_plan::FleetMember, instance::Instance, upgrades::Upgrades,
};

/// What identifies an instance's package: its JukeBox, category and name.
fn package_of(object: &DynamicObject) -> Option<(String, String, String)> {
    let spec = object.data.get("spec")?;
    let text = |key: &str| spec.get(key).and_then(|v| v.as_str()).map(String::from);
    Some((text("jukebox")?, text("category")?, text("package")?))
}

fn installed_tag(object: &DynamicObject) -> Option<&str> {
    object.data.get("status")?.get("package")?.get("tag")?.as_str()
}

/// The namespaces (their labels choose the waves: small objects, whole, so
/// any API server answers the watch), and the watch that fills the store
/// (run until `stop`).
pub fn watch_namespaces(
    client: &Client,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> (Store<Namespace>, impl std::future::Future<Output = ()> + Send + 'static) {
    crate::facts::watched(Api::<Namespace>::all(client.clone()), "namespaces", stop)
}

/// The instances of `instance`'s package in its JukeBox (itself included),
/// as the waves need them. Until the namespaces are listed, unknown: retry.
pub async fn members(
    instance: &Instance,
    stores: &Stores,
    upgrades: &Upgrades,
) -> Result<Vec<FleetMember>, LifecycleError> {
    let ready = std::time::Duration::from_secs(5);
    if !matches!(tokio::time::timeout(ready, stores.namespaces.wait_until_ready()).await, Ok(Ok(()))) {
        return Err(LifecycleError::Pending {
            why: "the namespaces are not listed yet (their labels choose the waves)".into(),
            retry_after: ready,
        });
    }
    let labels_of = |namespace: &str| {
        let namespace = stores.namespaces.get(&ObjectRef::new(namespace));
        namespace.map(|n| n.labels().clone()).unwrap_or_default()
    };
    let records = upgrades.all().await?;
    let wanted = (instance.jukebox.clone(), instance.category.clone(), instance.package.clone());
    let members = stores
        .of(instance.kind)
        .state()
        .iter()
        .filter(|o| o.metadata.deletion_timestamp.is_none() && package_of(o).as_ref() == Some(&wanted))
        .filter_map(|o| Instance::decode(instance.kind, o).ok())
        .map(|peer| {
            // What lifecycle recorded where no tenant writes (a status is the tenant's).
            let record = peer.uid.as_deref().and_then(|uid| records.get(uid));
            let installed = record.and_then(|r| r.installed.as_ref());
            let started = record.and_then(|r| r.ledger.target.as_ref());
            FleetMember {
                name: peer.reference(),
                labels: labels_of(&peer.namespace),
                installed: installed.map(|i| i.tag.clone()),
                installed_at: installed.and_then(|i| i.at.parse().ok()),
                started: started.map(|t| t.revision.tag.clone()),
                quarantined: record.map(|r| r.quarantined_tags()).unwrap_or_default(),
            }
        })
        .collect();
    Ok(members)
}

/// The instances whose upgrades roll out in waves, by uid, as their last
/// reconcile found their policy ([`UnderWaves::mark`]): only they can be
/// held behind a peer, so only they are woken by one ([`Behind`]).
#[derive(Debug, Clone, Default)]
pub struct UnderWaves(Arc<Mutex<HashSet<String>>>);

impl UnderWaves {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records whether the instance `uid` upgrades in waves. Marked before
    /// it reads its peers: an event after that read wakes it.
    pub fn mark(&self, uid: &str, waves: bool) {
        let mut set = self.set();
        if !waves {
            set.remove(uid);
        } else if !set.contains(uid) {
            set.insert(uid.to_string());
        }
    }
}

/// The watch mapper that wakes the instances of a package a wave may hold
/// behind one that moved: the installed peers under waves on another revision than the
/// one it is on, or the one its agent Job installs while it has one in
/// flight (`status.target`: its upgrade may fail and halt them). None at rest
/// (every instance on the same revision), so a fleet that is not rolling
/// out costs nothing. Only installed peers not yet on that revision: a wave
/// holds upgrades, never a first install (`observe`), and a peer already
/// there waits for nothing, so a fleet installed at once wakes nobody
/// (bench P7: every event of 1 000 first installs woke the other instances
/// of its package, each reconciled about six times while the others
/// installed). Only peers under waves ([`UnderWaves`]): a package upgraded
/// without waves wakes nobody (bench P7 at 10 000, 100 instances of a
/// package per JukeBox: each step of each upgrade woke the other 99).
///
/// It keeps its own index of the installed instances by package and
/// revision, fed by the events it maps: an event costs the peers it wakes,
/// not a pass over the whole fleet (a pass per event made a fleet installed
/// at once cost the square of its size).
#[derive(Debug)]
pub struct Behind {
    resource: ApiResource,
    index: Mutex<Index>,
    waves: UnderWaves,
}

type Package = (String, String, String);

#[derive(Debug, Default)]
struct Index {
    /// Where each instance is filed: its package and installed revision.
    filed: HashMap<String, (Package, String)>,
    /// The installed instances of each package, by revision, by uid.
    installed: HashMap<Package, HashMap<String, HashMap<String, ObjectRef<DynamicObject>>>>,
}

impl Index {
    fn unfile(&mut self, uid: &str) {
        let Some((package, tag)) = self.filed.remove(uid) else { return };
        if let Some(revisions) = self.installed.get_mut(&package) {
            if let Some(instances) = revisions.get_mut(&tag) {
                instances.remove(uid);
                if instances.is_empty() {
                    revisions.remove(&tag);
                }
            }
            if revisions.is_empty() {
                self.installed.remove(&package);
            }
        }
    }
}

impl Behind {
    pub fn new(resource: ApiResource, waves: UnderWaves) -> Self {
        Self { resource, index: Mutex::default(), waves }
    }

    /// Files `object` as its event shows it, and names the peers behind it.
    pub fn woken_by(&self, object: &DynamicObject) -> Vec<ObjectRef<DynamicObject>> {
        let (Some(package), Some(uid)) = (package_of(object), object.uid()) else { return Vec::new() };
        let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        index.unfile(&uid);
        let tag = installed_tag(object);
        if let Some(tag) = tag.filter(|_| object.metadata.deletion_timestamp.is_none()) {
            let reference = ObjectRef::new_with(&object.name_any(), self.resource.clone());
            let reference = match object.namespace() {
                Some(namespace) => reference.within(&namespace),
                None => reference,
            };
            index.filed.insert(uid.clone(), (package.clone(), tag.to_string()));
            let revisions = index.installed.entry(package.clone()).or_default();
            revisions.entry(tag.to_string()).or_default().insert(uid.clone(), reference);
        }
        let target = object.data.get("status").and_then(|s| s.get("target")).filter(|t| !t.is_null());
        // A target whose revision cannot be read holds every installed peer.
        let on = match target {
            Some(target) => Some(target.pointer("/revision/tag").and_then(|t| t.as_str())),
            None => tag.map(Some),
        };
        if object.metadata.deletion_timestamp.is_some() {
            self.waves.mark(&uid, false);
        }
        let (Some(on), Some(revisions)) = (on, index.installed.get(&package)) else { return Vec::new() };
        let under_waves = self.waves.set();
        revisions
            .iter()
            .filter(|(revision, _)| on != Some(revision.as_str()))
            .flat_map(|(_, instances)| instances.iter())
            .filter(|(peer, _)| **peer != uid && under_waves.contains(peer.as_str()))
            .map(|(_, reference)| reference.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::instance::InstanceKind;

    /// An instance installed at `tag`, its agent Job installing `target`.
    fn instance(name: &str, tag: Option<&str>, target: Option<&str>) -> DynamicObject {
        let mut status = json!({});
        if let Some(tag) = tag {
            status["package"] = json!({"tag": tag});
        }
        if let Some(target) = target {
            status["target"] = json!({"revision": {"tag": target}, "job": format!("{name}-job")});
        }
        serde_json::from_value(json!({
            "apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
            "metadata": {"name": name, "namespace": "apps", "uid": format!("uid-{name}")},
            "spec": {"jukebox": "box", "category": "apps", "package": "web"},
            "status": status,
        }))
        .unwrap()
    }

    /// Whom `moved` wakes once every event of `peers` was mapped.
    fn woken(peers: &[DynamicObject], moved: &DynamicObject) -> Vec<String> {
        woken_under(peers, moved, |_| true)
    }

    /// Whom `moved` wakes, the peers `waves` names upgrading in waves.
    fn woken_under(
        peers: &[DynamicObject],
        moved: &DynamicObject,
        waves: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let under = UnderWaves::default();
        let behind = Behind::new(InstanceKind::Tenant.api_resource(), under.clone());
        for peer in peers {
            under.mark(&peer.uid().unwrap_or_default(), waves(&peer.name_any()));
            behind.woken_by(peer);
        }
        let mut names: Vec<String> = behind.woken_by(moved).into_iter().map(|r| r.name).collect();
        names.sort();
        names
    }

    #[test]
    fn a_first_install_wakes_no_peer_and_an_upgrade_wakes_the_installed_ones_behind_it() {
        let fresh: Vec<DynamicObject> =
            (0..3).map(|i| instance(&format!("new-{i}"), None, Some("2.0.0"))).collect();
        assert!(woken(&fresh, &fresh[0]).is_empty(), "nobody installed: nobody held");
        assert!(woken(&fresh, &instance("new-0", None, None)).is_empty());
        let fleet = vec![
            instance("canary", Some("2.0.0"), None),
            instance("old", Some("1.0.0"), None),
            instance("new", None, Some("2.0.0")),
            instance("done", Some("2.0.0"), None),
        ];
        assert_eq!(woken(&fleet, &fleet[0]), ["old"], "the installed peer on another revision");
        let moving = instance("canary", Some("1.0.0"), Some("2.0.0"));
        assert_eq!(woken(&fleet, &moving), ["old"], "while it moves: every installed peer not on its target");
        // A fleet installing at once: the others already there wait for nothing.
        assert_eq!(woken(&fleet, &instance("new", None, Some("2.0.0"))), ["old"]);
        let unreadable = serde_json::from_value::<DynamicObject>(json!({
            "apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
            "metadata": {"name": "odd", "namespace": "apps", "uid": "uid-odd"},
            "spec": {"jukebox": "box", "category": "apps", "package": "web"},
            "status": {"target": {"job": "odd-job"}},
        }))
        .unwrap();
        assert_eq!(
            woken(&fleet, &unreadable),
            ["canary", "done", "old"],
            "a target unread holds every installed peer"
        );
        // Each event refiles its instance: one that caught up, or is being
        // deleted, is woken no more.
        let mut later = fleet.clone();
        later.push(instance("old", Some("2.0.0"), None));
        assert!(woken(&later, &fleet[0]).is_empty(), "every installed peer is on 2.0.0 now");
        let mut deleted = instance("old", Some("1.0.0"), None);
        deleted.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        let mut later = fleet.clone();
        later.push(deleted);
        assert!(woken(&later, &fleet[0]).is_empty(), "a peer being deleted is not held");
    }

    #[test]
    fn only_the_peers_upgrading_in_waves_are_woken() {
        let fleet: Vec<DynamicObject> =
            (0..4).map(|i| instance(&format!("old-{i}"), Some("1.0.0"), None)).collect();
        let moving = instance("canary", Some("1.0.0"), Some("2.0.0"));
        assert!(woken_under(&fleet, &moving, |_| false).is_empty(), "no waves: nobody is held");
        assert_eq!(woken_under(&fleet, &moving, |name| name.ends_with("-2")), ["old-2"]);
        // A peer whose policy lost its waves is woken no more.
        let under = UnderWaves::default();
        let behind = Behind::new(InstanceKind::Tenant.api_resource(), under.clone());
        for peer in &fleet {
            under.mark(&peer.uid().unwrap_or_default(), true);
            behind.woken_by(peer);
        }
        under.mark("uid-old-0", false);
        let mut names: Vec<String> = behind.woken_by(&moving).into_iter().map(|r| r.name).collect();
        names.sort();
        assert_eq!(names, ["old-1", "old-2", "old-3"]);
    }
}
