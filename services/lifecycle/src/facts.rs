//! What the cluster says for requirements and recommendations, gathered once
//! per reconcile and only as far as the revision asks (`install::Asks`;
//! most ask nothing, and an instance at rest is then reconciled without
//! these requests): the API server's version, the CRDs, and — from the
//! controllers' own watch caches — the packages installed and the services
//! published, cluster-wide and in the instance's tenant (the namespaces
//! sharing the instance namespace's `TENANT_LABEL` value; only that namespace
//! when it has none). A value script or `prefly` is given all of it. The
//! decision itself is `vynil_rules::install`.

use std::collections::HashSet;

use k8s_openapi::{
    api::core::v1::Namespace, apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ListParams},
    runtime::reflector::Store,
};
use serde_json::Value;
use vynil_rules::{
    install::{Asks, ClusterFacts},
    package::{ClusterVersion, PackageRef, Prefly},
};

use crate::{LifecycleError, instance::InstanceKind, script};

/// The watch caches of the three kinds, and of the JukeBoxes (`crate::jukeboxes`).
#[derive(Clone)]
pub struct Stores {
    pub tenant: Store<DynamicObject>,
    pub service: Store<DynamicObject>,
    pub system: Store<DynamicObject>,
    pub jukeboxes: Store<vynil_crds::JukeBox>,
    /// Every namespace: their labels choose the waves (`crate::fleet`).
    pub namespaces: Store<Namespace>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores").finish_non_exhaustive()
    }
}

/// A store of every object `api` lists, and the watch that fills it (run
/// until `stop`; its errors are retried with backoff, logged as `what`).
pub(crate) fn watched<K>(
    api: Api<K>,
    what: &'static str,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> (Store<K>, impl std::future::Future<Output = ()> + Send + 'static)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let (store, writer) = reflector::store();
    let stream =
        reflector::reflector(writer, watcher(api, Default::default())).default_backoff().touched_objects();
    let run = async move {
        let drained = stream.for_each(|event| async move {
            if let Err(error) = event {
                tracing::warn!(%error, "watching {what} (retried)");
            }
        });
        tokio::select! {
            () = drained => {}
            () = stop => {}
        }
    };
    (store, run)
}

impl Stores {
    pub fn of(&self, kind: InstanceKind) -> &Store<DynamicObject> {
        match kind {
            InstanceKind::Tenant => &self.tenant,
            InstanceKind::Service => &self.service,
            InstanceKind::System => &self.system,
        }
    }
}

/// The facts of one reconcile.
#[derive(Debug, Clone)]
pub struct Facts {
    /// `None` when not asked (nothing consults it then).
    pub version: Option<ClusterVersion>,
    pub crds: HashSet<String>,
    pub system_packages: HashSet<(String, String)>,
    pub tenant_packages: HashSet<(String, String)>,
    pub system_services: HashSet<String>,
    pub tenant_services: HashSet<String>,
    /// Where `prefly` and `value_script` run: the instance, bound as
    /// `instance`, and the facts above for upstream's helpers.
    pub script: script::Host,
}

impl ClusterFacts for Facts {
    fn cluster_version(&self) -> ClusterVersion {
        // Asked whenever a requirement consults it; were it not, the
        // smallest version refuses rather than installs.
        self.version.unwrap_or(ClusterVersion { major: 0, minor: 0 })
    }
    fn has_crd(&self, name: &str) -> bool {
        self.crds.contains(name)
    }
    fn has_system_package(&self, p: &PackageRef) -> bool {
        self.system_packages.contains(&(p.category.clone(), p.name.clone()))
    }
    fn has_tenant_package(&self, p: &PackageRef) -> bool {
        self.tenant_packages.contains(&(p.category.clone(), p.name.clone()))
    }
    fn has_system_service(&self, key: &str) -> bool {
        self.system_services.contains(key)
    }
    fn has_tenant_service(&self, key: &str) -> bool {
        self.tenant_services.contains(key)
    }
    fn prefly(&self, prefly: &Prefly) -> Result<bool, String> {
        self.script.prefly(&prefly.script)
    }
}

/// Where a revision's scripts may read namespaced objects: its instance's
/// namespace and its tenant's, and the namespaces of the instances that
/// publish a service it requires or recommends, or are a package it requires.
fn readable(
    tenant_namespaces: &HashSet<String>,
    stores: &Stores,
    content: &vynil_rules::PackageContent,
) -> Vec<String> {
    let services = content.named_services();
    let packages: Vec<(String, String)> =
        content.named_packages().into_iter().map(|p| (p.category, p.name)).collect();
    let mut readable: std::collections::BTreeSet<String> = tenant_namespaces.iter().cloned().collect();
    for object in [stores.tenant.state(), stores.service.state(), stores.system.state()].concat() {
        let named = published(&object).any(|key| services.contains(&key))
            || spec_package(&object).is_some_and(|p| packages.contains(&p));
        if let Some(namespace) = object.namespace().filter(|_| named) {
            readable.insert(namespace);
        }
    }
    readable.into_iter().collect()
}

fn spec_package(object: &DynamicObject) -> Option<(String, String)> {
    let spec = object.data.get("spec")?;
    Some((spec.get("category")?.as_str()?.to_string(), spec.get("package")?.as_str()?.to_string()))
}

fn published(object: &DynamicObject) -> impl Iterator<Item = String> + '_ {
    object
        .data
        .pointer("/status/services")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("key").and_then(Value::as_str).map(str::to_string))
}

/// The API server's `/version`.
async fn version(client: &Client) -> Result<ClusterVersion, LifecycleError> {
    let info = client.apiserver_version().await.map_err(LifecycleError::kube("reading /version"))?;
    leading_number(&info.major)
        .zip(leading_number(&info.minor))
        .map(|(major, minor)| ClusterVersion { major, minor })
        .ok_or_else(|| {
            LifecycleError::Unavailable(format!(
                "the API server's /version says major {:?} minor {:?}: not numbers",
                info.major, info.minor
            ))
        })
}

/// `"28+"` (some providers) → 28.
fn leading_number(text: &str) -> Option<u64> {
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// What `gather` is asked about: the instance, the tenant label, and what
/// its scripts may do.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    pub namespace: &'a str,
    pub instance: &'a Value,
    pub tenant_label: &'a str,
    pub scripts: vynil_script::ScriptLimits,
    pub vynil_version: &'a semver::Version,
    /// What the revision's decision consults (a value script: everything).
    pub asks: Asks,
    /// The revision, whose required and recommended services' namespaces
    /// its scripts may read (`script::upstream::Reads`).
    pub content: &'a vynil_rules::PackageContent,
}

/// Gathers the facts for the instance `asked.instance`.
pub async fn gather(client: &Client, stores: &Stores, asked: Asked<'_>) -> Result<Facts, LifecycleError> {
    let Asked { namespace, instance, tenant_label, scripts, vynil_version, asks, content } = asked;
    let version = if asks.version { Some(version(client).await?) } else { None };
    let crds = if asks.crds {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let list = crds.list(&ListParams::default()).await.map_err(LifecycleError::kube("listing CRDs"))?;
        list.items.iter().map(|c| c.name_any()).collect()
    } else {
        HashSet::new()
    };
    let mut facts = Facts {
        version,
        crds,
        system_packages: HashSet::new(),
        tenant_packages: HashSet::new(),
        system_services: HashSet::new(),
        tenant_services: HashSet::new(),
        script: script::Host::new(instance.clone(), scripts, script::upstream::Given::default()),
    };
    if !asks.instances {
        return Ok(facts);
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let tenant = namespaces
        .get_opt(namespace)
        .await
        .map_err(LifecycleError::kube("reading the instance's namespace"))?
        .and_then(|n| n.labels().get(tenant_label).cloned());
    let tenant_namespaces: HashSet<String> = match tenant.clone() {
        Some(value) => {
            let selector = ListParams::default().labels(&format!("{tenant_label}={value}"));
            let list = namespaces
                .list(&selector)
                .await
                .map_err(LifecycleError::kube("listing the tenant's namespaces"))?;
            list.items.iter().map(|n| n.name_any()).chain([namespace.to_string()]).collect()
        }
        None => HashSet::from([namespace.to_string()]),
    };
    let in_tenant = |o: &DynamicObject| o.namespace().is_some_and(|ns| tenant_namespaces.contains(&ns));
    let mut sorted: Vec<String> = tenant_namespaces.iter().cloned().collect();
    sorted.sort();
    let cluster = script::upstream::Cluster {
        namespace: namespace.to_string(),
        tenant_name: tenant.clone().unwrap_or_else(|| namespace.to_string()),
        tenant_namespaces: sorted,
        tenants: stores.tenant.state(),
        services: stores.service.state(),
        systems: stores.system.state(),
    };
    let given = script::upstream::Given {
        cluster: Some(std::sync::Arc::new(cluster)),
        vynil_version: vynil_version.to_string(),
        reads: script::upstream::Reads::here(client.clone(), readable(&tenant_namespaces, stores, content)),
    };
    facts.script = script::Host::new(instance.clone(), scripts, given);
    for object in stores.system.state() {
        facts.system_packages.extend(spec_package(&object));
    }
    for object in stores.tenant.state() {
        if in_tenant(&object) {
            facts.tenant_packages.extend(spec_package(&object));
            facts.tenant_services.extend(published(&object));
        }
    }
    for object in stores.service.state() {
        facts.system_services.extend(published(&object));
        if in_tenant(&object) {
            facts.tenant_services.extend(published(&object));
        }
    }
    Ok(facts)
}
