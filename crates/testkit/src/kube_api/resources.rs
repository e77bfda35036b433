//! The resource table of the fake API server: which kinds exist, under which
//! group/version and plural, namespaced or not, with a `status` subresource or
//! not. Discovery is answered from it, paths are resolved through it, and it
//! grows when a CustomResourceDefinition is created (as a real server's does).

use serde_json::{Value, json};

/// One served resource (a single version per resource: the fake keeps no
/// conversion between versions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceDef {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
    pub status_subresource: bool,
}

impl ResourceDef {
    pub fn new(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool, status: bool) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
            status_subresource: status,
        }
    }

    /// `v1` for the core group, `<group>/<version>` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// `jobs.batch`, `configmaps` (the name RBAC and error messages use).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() { self.plural.clone() } else { format!("{}.{}", self.plural, self.group) }
    }

    /// The resource a CustomResourceDefinition declares (its first served version).
    pub fn from_crd(crd: &Value) -> Option<Self> {
        let spec = crd.get("spec")?;
        let version = spec["versions"].as_array()?.iter().find(|v| v["served"].as_bool().unwrap_or(true))?;
        Some(Self {
            group: spec["group"].as_str()?.into(),
            version: version["name"].as_str()?.into(),
            kind: spec["names"]["kind"].as_str()?.into(),
            plural: spec["names"]["plural"].as_str()?.into(),
            namespaced: spec["scope"].as_str() == Some("Namespaced"),
            status_subresource: version.pointer("/subresources/status").is_some(),
        })
    }

    fn discovery_entries(&self) -> Vec<Value> {
        let verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
        let mut entries = vec![json!({
            "name": self.plural,
            "singularName": self.kind.to_lowercase(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": verbs,
        })];
        if self.status_subresource {
            entries.push(json!({
                "name": format!("{}/status", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        entries
    }
}

/// Built-in resources the control plane and its tests use. Reviews are
/// answered by the server itself (see `access`), never stored.
pub fn builtin() -> Vec<ResourceDef> {
    let r = ResourceDef::new;
    vec![
        r("", "v1", "Namespace", "namespaces", false, true),
        r("", "v1", "ConfigMap", "configmaps", true, false),
        r("", "v1", "Secret", "secrets", true, false),
        r("", "v1", "Service", "services", true, true),
        r("", "v1", "ServiceAccount", "serviceaccounts", true, false),
        r("", "v1", "Pod", "pods", true, true),
        r("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", true, true),
        r("", "v1", "Event", "events", true, false),
        r("events.k8s.io", "v1", "Event", "events", true, false),
        r("batch", "v1", "Job", "jobs", true, true),
        r("batch", "v1", "CronJob", "cronjobs", true, true),
        r("apps", "v1", "Deployment", "deployments", true, true),
        r("apps", "v1", "StatefulSet", "statefulsets", true, true),
        r("coordination.k8s.io", "v1", "Lease", "leases", true, false),
        r("rbac.authorization.k8s.io", "v1", "Role", "roles", true, false),
        r("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", true, false),
        r("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", false, false),
        r("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", false, false),
        r("networking.k8s.io", "v1", "Ingress", "ingresses", true, true),
        r("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", true, false),
        r("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", false, true),
        r("authentication.k8s.io", "v1", "TokenReview", "tokenreviews", false, false),
        r("authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews", false, false),
    ]
}

/// The served resources, in registration order.
#[derive(Debug, Clone, Default)]
pub struct Resources {
    defs: Vec<ResourceDef>,
}

impl Resources {
    pub fn new(defs: Vec<ResourceDef>) -> Self {
        Self { defs }
    }

    /// Adds or replaces (same group and plural) a resource.
    pub fn register(&mut self, def: ResourceDef) {
        self.defs.retain(|d| !(d.group == def.group && d.plural == def.plural));
        self.defs.push(def);
    }

    pub fn unregister(&mut self, group: &str, plural: &str) {
        self.defs.retain(|d| !(d.group == group && d.plural == plural));
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceDef> {
        self.defs.iter().find(|d| d.group == group && d.version == version && d.plural == plural)
    }

    /// The resource of `kind` in the group of `api_version` (`v1`, `batch/v1`).
    pub fn find_kind(&self, api_version: &str, kind: &str) -> Option<&ResourceDef> {
        let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
        self.defs.iter().find(|d| d.group == group && d.kind == kind)
    }

    pub fn find_by_plural(&self, group: &str, plural: &str) -> Option<&ResourceDef> {
        self.defs.iter().find(|d| d.group == group && d.plural == plural)
    }

    /// `GET /api`.
    pub fn core_versions(&self, address: &str) -> Value {
        json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
        })
    }

    /// `GET /apis`.
    pub fn groups(&self) -> Value {
        let mut groups: Vec<(String, String)> = Vec::new();
        for d in self.defs.iter().filter(|d| !d.group.is_empty()) {
            if !groups.iter().any(|(g, _)| *g == d.group) {
                groups.push((d.group.clone(), d.version.clone()));
            }
        }
        let groups: Vec<Value> = groups
            .iter()
            .map(|(group, version)| {
                let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
                json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
            })
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `GET /openapi/v3`: one document per served group version.
    pub fn openapi_v3_index(&self) -> Value {
        let mut paths = serde_json::Map::new();
        for d in &self.defs {
            let key = gv_path(&d.group, &d.version);
            paths.insert(key.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{key}")}));
        }
        json!({"paths": paths})
    }

    /// `GET /openapi/v3/api/v1` or `/openapi/v3/apis/<group>/<version>`, as far
    /// as `kubectl` reads it: the PATCH of each resource, with its kind and
    /// the `fieldValidation` parameter, which tells `kubectl` to leave
    /// validation to the server instead of validating against schemas
    /// (there are none here: no schema validation is emulated, and the
    /// parameter is accepted and ignored). `None` when unknown.
    pub fn openapi_v3(&self, group: &str, version: &str) -> Option<Value> {
        let mut paths = serde_json::Map::new();
        for d in self.defs.iter().filter(|d| d.group == group && d.version == version) {
            let namespace = if d.namespaced { "/namespaces/{namespace}" } else { "" };
            let path = format!("/{}{namespace}/{}/{{name}}", gv_path(group, version), d.plural);
            let patch = json!({
                "x-kubernetes-group-version-kind": {"group": d.group, "version": d.version, "kind": d.kind},
                "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
                "responses": {"200": {"description": "OK"}},
            });
            paths.insert(path, json!({"patch": patch}));
        }
        if paths.is_empty() {
            return None;
        }
        Some(
            json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": paths}),
        )
    }

    /// `GET /api/v1` or `GET /apis/<group>/<version>`; `None` when unknown.
    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let defs: Vec<&ResourceDef> =
            self.defs.iter().filter(|d| d.group == group && d.version == version).collect();
        if defs.is_empty() {
            return None;
        }
        let group_version = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
        let resources: Vec<Value> = defs.iter().flat_map(|d| d.discovery_entries()).collect();
        Some(json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }))
    }
}

/// `api/v1`, `apis/<group>/<version>`.
fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") }
}
