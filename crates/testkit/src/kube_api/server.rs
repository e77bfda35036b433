//! The HTTP face of the fake API server: path resolution, verbs, discovery,
//! reviews, the request log and fault injection. The semantics of the objects
//! live in `store`, watches in `watch`.

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use axum::{
    body::Bytes,
    extract::{Request, State},
    http::{HeaderMap, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

mod watch;

use super::access::{AccessRule, AccessTable, ApiFault, ApiFaultAction, Identity, RequestRecord, reason_of};
use super::resources::{ResourceDef, Resources, builtin};
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{ApiError, EventType, PatchKind, Propagation, Store, StoredEvent};
use crate::{Result, TestkitError, io};

/// How the fake starts.
#[derive(Debug, Clone)]
pub struct FakeApiOptions {
    /// Install the four `vynil.solidite.fr` CRDs at start.
    pub vynil_crds: bool,
    /// Watch events kept for resuming; older versions get `410 Gone`.
    pub history_limit: usize,
    /// How often a watch that allows bookmarks receives one.
    pub bookmark_interval: Duration,
    /// How late each live watch event is delivered after its write (zero:
    /// at once). A real API server's watch cache trails etcd: a controller
    /// must not expect its own write back on its watch before it reads it.
    pub watch_lag: Duration,
    /// Authenticate every request by its bearer token and authorise it by
    /// the RBAC objects stored (see `rbac`): `401` without a known token,
    /// `403 Forbidden` without a grant. Off: everything is allowed (the
    /// request log still says who asked what).
    pub rbac: bool,
}

impl Default for FakeApiOptions {
    fn default() -> Self {
        Self {
            vynil_crds: true,
            history_limit: 10_000,
            bookmark_interval: Duration::from_secs(1),
            watch_lag: Duration::ZERO,
            rbac: false,
        }
    }
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) store: Mutex<Store>,
    log: Mutex<Vec<RequestRecord>>,
    faults: Mutex<Vec<ApiFault>>,
    access: Mutex<AccessTable>,
    pub(super) bookmark_interval: Duration,
    pub(super) watch_lag: Duration,
    address: String,
    rbac: bool,
    /// Bumped by [`FakeApiServer::close_watches`]: every open watch ends.
    pub(super) watch_generation: tokio::sync::watch::Sender<u64>,
    /// Woken after every write: the garbage collector and namespace
    /// controller run then, after the request was answered.
    controllers: tokio::sync::Notify,
}

fn issue_token(shared: &Shared, namespace: &str, name: &str) -> String {
    let token = format!("fake-sa-token-{namespace}-{name}");
    let identity =
        Identity { username: format!("system:serviceaccount:{namespace}:{name}"), groups: Vec::new() };
    lock(&shared.access).tokens.insert(token.clone(), identity);
    token
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread must not wedge every later request.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A fake Kubernetes API server on a free loopback port (plain HTTP). See the
/// module documentation of [`crate::kube_api`] for what it emulates.
#[derive(Debug)]
pub struct FakeApiServer {
    addr: SocketAddr,
    /// The same API over HTTPS, for in-cluster clients (see `tls`).
    https_addr: SocketAddr,
    ca_pem: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
    https_task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
        self.https_task.abort();
    }
}

impl FakeApiServer {
    /// Starts with the built-in resources and the Vynil CRDs installed.
    pub async fn start() -> Result<Self> {
        Self::start_with(FakeApiOptions::default()).await
    }

    pub async fn start_with(options: FakeApiOptions) -> Result<Self> {
        let listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(io("binding the fake API server"))?;
        let addr = listener.local_addr().map_err(io("reading the fake API server's address"))?;
        let mut store = Store::new(Resources::new(builtin()), options.history_limit);
        // The namespaces every cluster starts with.
        if let Some(def) = builtin().into_iter().find(|d| d.group.is_empty() && d.plural == "namespaces") {
            for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                store
                    .create(&def, None, json!({"metadata": {"name": name}}))
                    .map_err(|e| TestkitError::Fixture(e.message))?;
            }
        }
        if options.vynil_crds {
            let crd_def = builtin().into_iter().find(|d| d.plural == "customresourcedefinitions");
            for crd in vynil_crds::crds() {
                let body = serde_json::to_value(&crd).map_err(|e| TestkitError::Fixture(e.to_string()))?;
                if let Some(def) = &crd_def {
                    store.create(def, None, body).map_err(|e| TestkitError::Fixture(e.message))?;
                }
            }
        }
        for (plural, object) in super::rbac::bootstrap() {
            let def = store.resources.find_by_plural("rbac.authorization.k8s.io", plural).cloned();
            if let Some(def) = def {
                store.create(&def, None, object).map_err(|e| TestkitError::Fixture(e.message))?;
            }
        }
        let mut access = AccessTable::default();
        access.tokens.insert(
            ADMIN_TOKEN.into(),
            Identity { username: "kubernetes-admin".into(), groups: vec!["system:masters".into()] },
        );
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            log: Mutex::default(),
            faults: Mutex::default(),
            access: Mutex::new(access),
            rbac: options.rbac,
            bookmark_interval: options.bookmark_interval,
            watch_lag: options.watch_lag,
            watch_generation: tokio::sync::watch::Sender::new(0),
            address: addr.to_string(),
            controllers: tokio::sync::Notify::new(),
        });
        let app = axum::Router::new().fallback(handle).with_state(shared.clone());
        let tls = super::tls::ClusterTls::generate()?;
        let https = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(io("binding the fake API server (HTTPS)"))?;
        let https_addr = https.local_addr().map_err(io("reading the fake API server's HTTPS address"))?;
        let https_task = tokio::spawn(super::tls::serve(https, tls.acceptor.clone(), app.clone()));
        // Watch events are small writes: without TCP_NODELAY each waits for
        // the client's delayed ACK (tens of milliseconds).
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            if let Err(error) = tcp.set_nodelay(true) {
                tracing::warn!(%error, "fake API server: cannot set TCP_NODELAY");
            }
        });
        let controllers = shared.clone();
        let task = tokio::spawn(async move {
            let collector = async move {
                loop {
                    controllers.controllers.notified().await;
                    while lock(&controllers.store).collect_garbage() {
                        tokio::task::yield_now().await;
                    }
                }
            };
            tokio::select! {
                served = axum::serve(listener, app) => {
                    if let Err(e) = served {
                        tracing::warn!("fake API server stopped: {e}");
                    }
                }
                () = collector => {}
            }
        });
        Ok(Self { addr, https_addr, ca_pem: tls.ca_pem, shared, task, https_task })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The HTTPS endpoint (`127.0.0.1:<port>`): what a pod's
    /// `KUBERNETES_SERVICE_HOST`/`PORT` name.
    pub fn https_addr(&self) -> SocketAddr {
        self.https_addr
    }

    /// The cluster CA, PEM (a pod's `ca.crt`): it signed the HTTPS endpoint's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A real `kube::Client` talking to this server as the cluster's admin
    /// ([`ADMIN_TOKEN`], group `system:masters`), default namespace `default`.
    pub fn client(&self) -> Result<kube::Client> {
        self.client_as(ADMIN_TOKEN)
    }

    /// A `kube::Client` presenting `token` (see [`FakeApiServer::service_account_token`]).
    pub fn client_as(&self, token: &str) -> Result<kube::Client> {
        let url = self.url().parse().map_err(|e| TestkitError::Fixture(format!("fake API URL: {e}")))?;
        let mut config = kube::Config::new(url);
        config.auth_info.token = Some(token.to_string().into());
        kube::Client::try_from(config).map_err(|e| TestkitError::Fixture(format!("kube client: {e}")))
    }

    /// A `kube::Client` as a Deployment of ours runs it: ServiceAccount
    /// `namespace/account`'s token, `namespace` its default, and
    /// `user_agent` (what the request log and audit show).
    pub fn service_client(&self, namespace: &str, account: &str, user_agent: &str) -> Result<kube::Client> {
        let url = self.url().parse().map_err(|e| TestkitError::Fixture(format!("fake API URL: {e}")))?;
        let mut config = kube::Config::new(url);
        config.auth_info.token = Some(self.service_account_token(namespace, account).into());
        config.default_namespace = namespace.to_string();
        let agent = axum::http::HeaderValue::from_str(user_agent)
            .map_err(|e| TestkitError::Fixture(format!("user agent {user_agent:?}: {e}")))?;
        config.headers.push((header::USER_AGENT, agent));
        kube::Client::try_from(config).map_err(|e| TestkitError::Fixture(format!("kube client: {e}")))
    }

    /// The bearer token of ServiceAccount `namespace/name`: the server
    /// authenticates it as `system:serviceaccount:<namespace>:<name>`.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        issue_token(&self.shared, namespace, name)
    }

    /// [`FakeApiServer::service_account_token`], for the Job runner's pods.
    pub(super) fn token_issuer(&self) -> impl Fn(&str, &str) -> String + Send + Sync + 'static {
        let shared = self.shared.clone();
        move |namespace, name| issue_token(&shared, namespace, name)
    }

    /// A kubeconfig for service processes (`KUBECONFIG=<path>`), with `namespace`
    /// as the context's namespace, as the cluster's admin.
    pub fn write_kubeconfig(&self, dir: &Path, namespace: &str) -> Result<PathBuf> {
        self.write_kubeconfig_as(dir, namespace, ADMIN_TOKEN)
    }

    /// [`FakeApiServer::write_kubeconfig`] presenting `token`.
    pub fn write_kubeconfig_as(&self, dir: &Path, namespace: &str, token: &str) -> Result<PathBuf> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\nusers:\n- name: fake\n  \
             user: {{token: {token}}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {namespace}\n\
             current-context: fake\n",
            self.url()
        );
        let path = dir.join("kubeconfig");
        std::fs::write(&path, text).map_err(io("writing the kubeconfig"))?;
        Ok(path)
    }

    /// Creates namespaces, as `kubectl create namespace` does (an existing
    /// one is left as it is): a real server refuses objects in a namespace
    /// that does not exist, and so does this one. `default`, `kube-system`,
    /// `kube-public` and `kube-node-lease` exist from the start.
    pub fn create_namespaces(&self, names: &[&str]) -> Result<()> {
        let mut store = lock(&self.shared.store);
        let Some(def) = store.resources.find_by_plural("", "namespaces").cloned() else {
            return Err(TestkitError::Fixture("the fake serves no namespaces".into()));
        };
        for name in names {
            match store.create(&def, None, json!({"metadata": {"name": name}})) {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => return Err(TestkitError::Fixture(format!("namespace {name}: {}", e.message))),
            }
        }
        Ok(())
    }

    /// Creates the ServiceAccounts, Roles, ClusterRoles and bindings among
    /// `objects` (other kinds are skipped), a namespaced one without a
    /// namespace in `namespace`, as kustomize's `namespace:` puts it.
    pub fn load_rbac(&self, objects: impl IntoIterator<Item = Value>, namespace: &str) -> Result<()> {
        let mut store = lock(&self.shared.store);
        for mut object in objects {
            let kind = object["kind"].as_str().unwrap_or_default().to_string();
            let (group, plural) = match kind.as_str() {
                "ServiceAccount" => ("", "serviceaccounts"),
                "Role" => ("rbac.authorization.k8s.io", "roles"),
                "RoleBinding" => ("rbac.authorization.k8s.io", "rolebindings"),
                "ClusterRole" => ("rbac.authorization.k8s.io", "clusterroles"),
                "ClusterRoleBinding" => ("rbac.authorization.k8s.io", "clusterrolebindings"),
                _ => continue,
            };
            let def = store
                .resources
                .find_by_plural(group, plural)
                .cloned()
                .ok_or_else(|| TestkitError::Fixture(format!("the fake serves no {plural}")))?;
            let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let at = def.namespaced.then(|| {
                let at = object["metadata"]["namespace"].as_str().unwrap_or(namespace).to_string();
                object["metadata"]["namespace"] = at.clone().into();
                at
            });
            store
                .create(&def, at.as_deref(), object)
                .map_err(|e| TestkitError::Fixture(format!("{kind} {name}: {}", e.message)))?;
        }
        Ok(())
    }

    /// A server enforcing RBAC with our deployment's grants
    /// (`deploy/base/rbac.yaml`, in `vynil-system` as kustomize puts them)
    /// and `vynil-system` plus `namespaces` created: a service given its
    /// ServiceAccount's token ([`FakeApiServer::service_account_token`])
    /// fails at any call its Role does not grant, on whatever path makes it.
    pub async fn start_under_deploy_rbac(namespaces: &[&str]) -> Result<Self> {
        const CONTROL_PLANE: &str = "vynil-system";
        let api = Self::start_with(FakeApiOptions { rbac: true, ..Default::default() }).await?;
        api.create_namespaces(&[CONTROL_PLANE])?;
        api.create_namespaces(namespaces)?;
        let rbac = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/base/rbac.yaml");
        api.load_rbac_file(&rbac, CONTROL_PLANE)?;
        Ok(api)
    }

    /// [`FakeApiServer::load_rbac`] of a YAML file's documents (a
    /// `deploy/` manifest).
    pub fn load_rbac_file(&self, path: &Path, namespace: &str) -> Result<()> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| TestkitError::Fixture(format!("cannot read {}: {e}", path.display())))?;
        let mut objects = Vec::new();
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let object: Value = serde::Deserialize::deserialize(document)
                .map_err(|e| TestkitError::Fixture(format!("{}: {e}", path.display())))?;
            if !object.is_null() {
                objects.push(object);
            }
        }
        self.load_rbac(objects, namespace)
    }

    /// Stores a custom resource its CRD's current schema would refuse, as a
    /// cluster can hold one: written under an earlier schema (upstream's CRD
    /// before ours replaced it, or an older version of ours), which the API
    /// server never revalidates. Everything else of admission still applies.
    pub fn create_under_an_older_schema(&self, group: &str, plural: &str, object: Value) -> Result<Value> {
        let mut store = lock(&self.shared.store);
        let def = store
            .resources
            .find_by_plural(group, plural)
            .cloned()
            .ok_or_else(|| TestkitError::Fixture(format!("the fake serves no {plural}.{group}")))?;
        let namespace = object["metadata"]["namespace"].as_str().map(str::to_string);
        store
            .create_unchecked_by_schema(&def, namespace.as_deref(), object)
            .map_err(|e| TestkitError::Fixture(e.message))
    }

    /// Serves one more resource (arbitrary instance children, say).
    pub fn register(&self, def: ResourceDef) {
        lock(&self.shared.store).resources.register(def);
    }

    /// The stored object, read directly (not through the API, not logged).
    pub fn object(&self, group: &str, plural: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let store = lock(&self.shared.store);
        let def = store.resources.find_by_plural(group, plural)?.clone();
        store.get(&def, namespace, name).ok()
    }

    /// Every stored object of a resource.
    pub fn objects(&self, group: &str, plural: &str) -> Vec<Value> {
        let store = lock(&self.shared.store);
        match store.resources.find_by_plural(group, plural).cloned() {
            Some(def) => store.list(&def, None, &LabelSelector::default(), &FieldSelector::default()),
            None => Vec::new(),
        }
    }

    /// How many stored objects of `group`/`plural` `matches` accepts, read
    /// in place (a fleet's poll copies nothing).
    pub fn count(&self, group: &str, plural: &str, matches: impl Fn(&Value) -> bool) -> usize {
        lock(&self.shared.store).count_of(group, plural, matches)
    }

    /// The cluster's current `resourceVersion`.
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared.store).current_rv()
    }

    /// Forgets the watch history, as etcd compaction does.
    pub fn compact(&self) {
        lock(&self.shared.store).compact();
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.shared.log).clone()
    }

    pub fn clear_requests(&self) {
        lock(&self.shared.log).clear();
    }

    pub fn inject(&self, fault: ApiFault) {
        lock(&self.shared.faults).push(fault);
    }

    pub fn clear_faults(&self) {
        lock(&self.shared.faults).clear();
    }

    /// Ends every open watch at once, as an API server restarting or a load
    /// balancer dropping connections does: a watcher must watch again and
    /// miss nothing.
    pub fn close_watches(&self) {
        self.shared.watch_generation.send_modify(|generation| *generation += 1);
    }

    /// TokenReview will authenticate `token` as `username` in `groups`.
    pub fn add_token(&self, token: &str, username: &str, groups: &[&str]) {
        let id =
            Identity { username: username.into(), groups: groups.iter().map(|g| g.to_string()).collect() };
        lock(&self.shared.access).tokens.insert(token.into(), id);
    }

    /// TokenReview will no longer authenticate `token` (a deleted
    /// ServiceAccount, a revoked token).
    pub fn revoke_token(&self, token: &str) {
        lock(&self.shared.access).tokens.remove(token);
    }

    /// SubjectAccessReview will allow this.
    pub fn allow(&self, rule: AccessRule) {
        lock(&self.shared.access).rules.push(rule);
    }
}

/// The token [`FakeApiServer::client`] presents: the cluster's admin.
pub const ADMIN_TOKEN: &str = "fake-api-server-admin-token";

/// A request resolved against the resource table.
#[derive(Debug)]
enum Target {
    Version,
    /// `/openapi/v2`, which `kubectl` before 1.27 reads.
    OpenApiV2,
    /// `/openapi/v3` (no group version) and its per-group-version documents.
    OpenApiV3 {
        group_version: Option<(String, String)>,
    },
    CoreVersions,
    Groups,
    ResourceList {
        group: String,
        version: String,
    },
    Object {
        def: ResourceDef,
        namespace: Option<String>,
        name: Option<String>,
        subresource: Option<String>,
    },
}

fn not_found_path(path: &str) -> ApiError {
    ApiError::new(404, "NotFound", format!("the server could not find the requested resource ({path})"))
}

fn resolve(resources: &Resources, path: &str) -> std::result::Result<Target, ApiError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["version"] => return Ok(Target::Version),
        ["openapi", "v2"] => return Ok(Target::OpenApiV2),
        ["openapi", "v3"] => return Ok(Target::OpenApiV3 { group_version: None }),
        ["openapi", "v3", "api", version] => {
            return Ok(Target::OpenApiV3 { group_version: Some((String::new(), version.to_string())) });
        }
        ["openapi", "v3", "apis", group, version] => {
            return Ok(Target::OpenApiV3 { group_version: Some((group.to_string(), version.to_string())) });
        }
        ["api"] => return Ok(Target::CoreVersions),
        ["apis"] => return Ok(Target::Groups),
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(not_found_path(path)),
    };
    let (namespace, plural, tail) = match rest {
        [] => return Ok(Target::ResourceList { group: group.into(), version: version.into() }),
        ["namespaces", ns, plural, tail @ ..] if !matches!(*plural, "status" | "finalize") => {
            (Some(ns.to_string()), *plural, tail)
        }
        [plural, tail @ ..] => (None, *plural, tail),
    };
    let def = resources.find(group, version, plural).ok_or_else(|| not_found_path(path))?.clone();
    if namespace.is_some() && !def.namespaced {
        return Err(not_found_path(path));
    }
    let (name, subresource) = match tail {
        [] => (None, None),
        [name] => (Some(name.to_string()), None),
        [name, "status"] if def.status_subresource => (Some(name.to_string()), Some("status".to_string())),
        _ => return Err(not_found_path(path)),
    };
    if namespace.is_none() && def.namespaced && name.is_some() {
        return Err(not_found_path(path));
    }
    Ok(Target::Object { def, namespace, name, subresource })
}

/// `gnostic`'s `openapi_v2.Document`, the two fields an empty document has.
#[derive(Clone, PartialEq, prost::Message)]
struct OpenApiV2Document {
    #[prost(string, tag = "1")]
    swagger: String,
    #[prost(message, optional, tag = "2")]
    info: Option<OpenApiV2Info>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct OpenApiV2Info {
    #[prost(string, tag = "1")]
    title: String,
    #[prost(string, tag = "2")]
    version: String,
}

/// `GET /openapi/v2`: a document without definitions, in the protobuf form
/// `kubectl` asks for. `kubectl` validates an object only against the
/// definition of its kind and skips kinds it has none for, as it does for
/// a CRD without a schema: validation is left to the server (none is
/// emulated), as `/openapi/v3` says to newer versions.
fn openapi_v2() -> Response {
    let document = OpenApiV2Document {
        swagger: "2.0".into(),
        info: Some(OpenApiV2Info { title: "Kubernetes".into(), version: "v1.32.0".into() }),
    };
    let bytes = prost::Message::encode_to_vec(&document);
    let mime = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
    (StatusCode::OK, [(header::CONTENT_TYPE, mime)], bytes).into_response()
}

fn json_response(status: u16, body: &Value) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

pub(super) fn failure(e: &ApiError) -> Response {
    json_response(e.code, &e.to_status())
}

fn verb_of(method: &Method, target: &Target, watch: bool) -> &'static str {
    let named = matches!(target, Target::Object { name: Some(_), .. });
    match (method.as_str(), named) {
        ("GET", true) => "get",
        ("GET", false) if watch && matches!(target, Target::Object { .. }) => "watch",
        ("GET", false) if matches!(target, Target::Object { .. }) => "list",
        ("GET", _) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

fn record(target: Option<&Target>, verb: &str, headers: &HeaderMap) -> RequestRecord {
    let header = |h: header::HeaderName| headers.get(h).and_then(|v| v.to_str().ok()).map(str::to_string);
    let (group, resource, subresource, namespace, name) = match target {
        Some(Target::Object { def, namespace, name, subresource }) => {
            (def.group.clone(), def.plural.clone(), subresource.clone(), namespace.clone(), name.clone())
        }
        _ => Default::default(),
    };
    RequestRecord {
        verb: verb.into(),
        group,
        resource,
        subresource,
        namespace,
        name,
        user_agent: header(header::USER_AGENT).unwrap_or_default(),
        bearer_token: header(header::AUTHORIZATION)
            .and_then(|a| a.strip_prefix("Bearer ").map(str::to_string)),
        status: 0,
    }
}

/// The fault to apply to this request, if any (consuming one of its times).
fn take_fault(shared: &Shared, request: &RequestRecord) -> Option<ApiFaultAction> {
    let mut faults = lock(&shared.faults);
    let fault = faults.iter_mut().find(|f| f.matches(request))?;
    fault.times -= 1;
    Some(fault.action.clone())
}

/// Serves one request and records the status it was answered with.
async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let slot = std::sync::OnceLock::new();
    let writes = request.method() != Method::GET;
    let response = respond(shared.clone(), request, &slot).await;
    if writes {
        shared.controllers.notify_one();
    }
    if let Some(index) = slot.get()
        && let Some(entry) = lock(&shared.log).get_mut(*index)
    {
        entry.status = response.status().as_u16();
    }
    response
}

async fn respond(shared: Arc<Shared>, request: Request, slot: &std::sync::OnceLock<usize>) -> Response {
    let (parts, body) = request.into_parts();
    let query: HashMap<String, String> =
        url::form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes()).into_owned().collect();
    let path = parts.uri.path().to_string();
    let resolved = resolve(&lock(&shared.store).resources, &path);
    let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    let verb = resolved.as_ref().map(|t| verb_of(&parts.method, t, watch)).unwrap_or("unknown");
    let entry = record(resolved.as_ref().ok(), verb, &parts.headers);
    {
        let mut log = lock(&shared.log);
        log.push(entry.clone());
        let _ = slot.set(log.len() - 1);
    }
    let target = match resolved {
        Ok(t) => t,
        Err(e) => return failure(&e),
    };
    if shared.rbac
        && let Err(refused) = authorize(&shared, &target, verb, entry.bearer_token.as_deref(), &path)
    {
        return failure(&refused);
    }
    match take_fault(&shared, &entry) {
        Some(ApiFaultAction::Status(code)) => {
            let message = format!("fault injected by the test ({code})");
            return failure(&ApiError::new(code, reason_of(code), message));
        }
        Some(ApiFaultAction::Delay(d)) => tokio::time::sleep(d).await,
        Some(ApiFaultAction::WriteFirst(patch)) => {
            if let Target::Object { def, namespace, name: Some(name), subresource } = &target {
                let mut store = lock(&shared.store);
                let written = store.patch(
                    def,
                    namespace.as_deref(),
                    name,
                    PatchKind::Merge,
                    &patch,
                    subresource.is_some(),
                );
                if let Err(e) = written {
                    tracing::warn!("the injected concurrent write failed: {}", e.message);
                }
            }
        }
        None => {}
    }
    let limit = super::admission::MAX_REQUEST_BYTES;
    let body = match axum::body::to_bytes(body, 64 * 1024 * 1024).await {
        Ok(b) if b.len() > limit && parts.method != Method::GET => {
            let message = format!("Request entity too large: limit is {limit}");
            return failure(&ApiError::new(413, "RequestEntityTooLarge", message));
        }
        Ok(b) => b,
        Err(e) => return failure(&ApiError::bad_request(format!("cannot read the request body: {e}"))),
    };
    let content_type = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    match target {
        Target::Version => json_response(200, &version_info()),
        Target::OpenApiV2 => openapi_v2(),
        Target::OpenApiV3 { group_version } => {
            let resources = &lock(&shared.store).resources;
            match group_version {
                None => json_response(200, &resources.openapi_v3_index()),
                Some((group, version)) => match resources.openapi_v3(&group, &version) {
                    Some(document) => json_response(200, &document),
                    None => failure(&not_found_path(&path)),
                },
            }
        }
        Target::CoreVersions => {
            json_response(200, &lock(&shared.store).resources.core_versions(&shared.address))
        }
        Target::Groups => json_response(200, &lock(&shared.store).resources.groups()),
        Target::ResourceList { group, version } => {
            match lock(&shared.store).resources.resource_list(&group, &version) {
                Some(list) => json_response(200, &list),
                None => failure(&not_found_path(&path)),
            }
        }
        Target::Object { def, namespace, name, subresource } => {
            let call = Call { def, namespace, name, status_only: subresource.is_some(), query };
            if watch && parts.method == Method::GET && call.name.is_none() {
                return watch::watch_response(shared, call);
            }
            match serve_object(&shared, &parts.method, &call, &body, content_type) {
                Ok((code, value)) => json_response(code, &value),
                Err(e) => failure(&e),
            }
        }
    }
}

/// RBAC for one request (with [`FakeApiOptions::rbac`]): `401` without a
/// known token, `403 Forbidden` in the API server's words without a grant.
fn authorize(
    shared: &Shared,
    target: &Target,
    verb: &str,
    token: Option<&str>,
    path: &str,
) -> std::result::Result<(), ApiError> {
    let user = token.and_then(|t| lock(&shared.access).tokens.get(t).cloned());
    let Some(user) = user else {
        return Err(ApiError::new(401, "Unauthorized", "Unauthorized"));
    };
    let attrs = match target {
        Target::Object { def, namespace, name, subresource } => super::rbac::Attributes {
            verb: verb.into(),
            group: def.group.clone(),
            resource: def.plural.clone(),
            subresource: subresource.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
            path: None,
        },
        _ => super::rbac::Attributes {
            verb: "get".into(),
            group: String::new(),
            resource: String::new(),
            subresource: None,
            namespace: None,
            name: None,
            path: Some(path.to_string()),
        },
    };
    if rbac_allows(shared, &user, &attrs) {
        return Ok(());
    }
    let mut error = ApiError::new(403, "Forbidden", super::rbac::forbidden_message(&user, &attrs));
    error.details =
        Some(json!({"name": attrs.name.unwrap_or_default(), "group": attrs.group, "kind": attrs.resource}));
    Err(error)
}

fn rbac_allows(shared: &Shared, user: &Identity, attrs: &super::rbac::Attributes) -> bool {
    let store = lock(&shared.store);
    let objects = |plural: &str| store.objects_of("rbac.authorization.k8s.io", plural);
    super::rbac::allows(&objects, user, attrs)
}

fn version_info() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-vynil-fake", "gitCommit": "fake",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
        "compiler": "gc", "platform": "linux/amd64",
    })
}

#[derive(Debug)]
pub(super) struct Call {
    pub(super) def: ResourceDef,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    pub(super) status_only: bool,
    pub(super) query: HashMap<String, String>,
}

impl Call {
    pub(super) fn selectors(&self) -> std::result::Result<(LabelSelector, FieldSelector), ApiError> {
        let labels = LabelSelector::parse(self.query.get("labelSelector").map(String::as_str).unwrap_or(""))
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(self.query.get("fieldSelector").map(String::as_str).unwrap_or(""))
            .map_err(ApiError::bad_request)?;
        Ok((labels, fields))
    }

    /// The type this watch sees `event` as, if it sees it: with selectors, a
    /// change that makes an object match is `ADDED`, one that makes it stop
    /// matching `DELETED` (with the object as it now is), as a real server
    /// sends them.
    pub(super) fn sees(
        &self,
        event: &StoredEvent,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> Option<&'static str> {
        let ours = event.key.group == self.def.group
            && event.key.plural == self.def.plural
            && self.namespace.as_ref().is_none_or(|ns| *ns == event.key.namespace);
        if !ours {
            return None;
        }
        let matches = |object: &Value| labels.matches(object) && fields.matches(object);
        let now = matches(&event.object);
        match (&event.kind, &event.previous) {
            (EventType::Modified, Some(before)) => match (matches(before), now) {
                (true, true) => Some("MODIFIED"),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            },
            (kind, _) => now.then_some(kind.as_str()),
        }
    }
}

fn parse_body(body: &Bytes, content_type: &str) -> std::result::Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body).or_else(|json_error| {
        if content_type.contains("yaml") {
            serde_yaml_ng::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid YAML body: {e}")))
        } else {
            Err(ApiError::bad_request(format!("invalid JSON body: {json_error}")))
        }
    })
}

fn propagation(call: &Call, body: &Value) -> Propagation {
    let policy =
        body["propagationPolicy"].as_str().or(call.query.get("propagationPolicy").map(String::as_str));
    match policy {
        Some("Orphan") => Propagation::Orphan,
        Some("Foreground") => Propagation::Foreground,
        _ => Propagation::Background,
    }
}

fn serve_object(
    shared: &Shared,
    method: &Method,
    call: &Call,
    body: &Bytes,
    content_type: &str,
) -> std::result::Result<(u16, Value), ApiError> {
    let def = &call.def;
    let ns = call.namespace.as_deref();
    let body = parse_body(body, content_type)?;
    if *method == Method::POST
        && matches!(def.group.as_str(), "authentication.k8s.io" | "authorization.k8s.io")
    {
        return review(shared, def, body);
    }
    let mut store = lock(&shared.store);
    match (method.as_str(), call.name.as_deref()) {
        ("GET", Some(name)) => Ok((200, store.get(def, ns, name)?)),
        ("GET", None) => {
            let (labels, fields) = call.selectors()?;
            let items = store.list(def, ns, &labels, &fields);
            let (page, next) = paginate(items, &call.query)?;
            let mut body = list_body(def, store.current_rv(), page);
            if let Some((token, remaining)) = next {
                body["metadata"]["continue"] = json!(token);
                body["metadata"]["remainingItemCount"] = json!(remaining);
            }
            Ok((200, body))
        }
        ("POST", None) => Ok((201, store.create(def, ns, body)?)),
        ("PUT", Some(name)) => Ok((200, store.replace(def, ns, name, body, call.status_only)?)),
        ("PATCH", Some(name)) => {
            let kind = PatchKind::from_content_type(content_type).ok_or_else(|| {
                ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("the patch type {content_type:?} is not supported"),
                )
            })?;
            let (object, created) = store.patch(def, ns, name, kind, &body, call.status_only)?;
            Ok((if created { 201 } else { 200 }, object))
        }
        ("DELETE", Some(name)) => {
            // `preconditions.uid` (and `resourceVersion`): 409 when the object is another.
            let current = store.get(def, ns, name)?;
            for (field, key) in [("uid", "uid"), ("resourceVersion", "resourceVersion")] {
                let wanted = body.pointer(&format!("/preconditions/{field}")).and_then(Value::as_str);
                let actual = current["metadata"][key].as_str().unwrap_or_default();
                if let Some(wanted) = wanted.filter(|w| *w != actual) {
                    return Err(ApiError::new(
                        409,
                        "Conflict",
                        format!(
                            "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: {field} in precondition: {wanted}, {field} in object meta: {actual}",
                            def.qualified()
                        ),
                    ));
                }
            }
            Ok((200, store.delete(def, ns, name, propagation(call, &body))?))
        }
        ("DELETE", None) => {
            let (labels, fields) = call.selectors()?;
            let names: Vec<(Option<String>, String)> = store
                .list(def, ns, &labels, &fields)
                .iter()
                .map(|o| {
                    let m = &o["metadata"];
                    (
                        m["namespace"].as_str().map(str::to_string),
                        m["name"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect();
            let mut items = Vec::new();
            for (ns, name) in names {
                items.push(store.delete(def, ns.as_deref(), &name, propagation(call, &body))?);
            }
            Ok((200, list_body(def, store.current_rv(), items)))
        }
        _ => Err(ApiError::new(405, "MethodNotAllowed", format!("{method} is not supported on this path"))),
    }
}

/// One page of a list, and the continue token and remaining count when more follow.
type Page = (Vec<Value>, Option<(String, usize)>);

/// `limit` and `continue`: at most `limit` items, and a token naming where
/// the next page starts (the items come in key order: namespace, name).
/// Unlike a real server, later pages are read from the current state, not
/// from the first page's snapshot.
fn paginate(items: Vec<Value>, query: &HashMap<String, String>) -> std::result::Result<Page, ApiError> {
    use base64::Engine;
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let position = |o: &Value| {
        let m = &o["metadata"];
        (
            m["namespace"].as_str().unwrap_or_default().to_string(),
            m["name"].as_str().unwrap_or_default().to_string(),
        )
    };
    let mut items = items;
    if let Some(token) = query.get("continue").filter(|t| !t.is_empty()) {
        let after: (String, String) = engine
            .decode(token)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| ApiError::bad_request("continue key is not valid: invalid continue token"))?;
        items.retain(|o| position(o) > after);
    }
    let limit = query.get("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0);
    match limit {
        Some(limit) if items.len() > limit => {
            let remaining = items.len() - limit;
            items.truncate(limit);
            let last = items.last().map(position).unwrap_or_default();
            let token = engine.encode(serde_json::to_vec(&last).unwrap_or_default());
            Ok((items, Some((token, remaining))))
        }
        _ => Ok((items, None)),
    }
}

fn list_body(def: &ResourceDef, rv: u64, items: Vec<Value>) -> Value {
    json!({
        "apiVersion": def.api_version(),
        "kind": format!("{}List", def.kind),
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    })
}

fn review(
    shared: &Shared,
    def: &ResourceDef,
    mut body: Value,
) -> std::result::Result<(u16, Value), ApiError> {
    let status = match def.plural.as_str() {
        "tokenreviews" => lock(&shared.access).token_review(&body["spec"]),
        "subjectaccessreviews" => {
            let mut status = lock(&shared.access).access_review(&body["spec"]);
            // With RBAC on, the stored roles answer too (the table's rules still allow).
            if shared.rbac && status["allowed"] != json!(true) {
                let spec = &body["spec"];
                let user = Identity {
                    username: spec["user"].as_str().unwrap_or_default().into(),
                    groups: spec["groups"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect(),
                };
                let a = &spec["resourceAttributes"];
                let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
                let attrs = super::rbac::Attributes {
                    verb: text(&a["verb"]).unwrap_or_default(),
                    group: text(&a["group"]).unwrap_or_default(),
                    resource: text(&a["resource"]).unwrap_or_default(),
                    subresource: text(&a["subresource"]),
                    namespace: text(&a["namespace"]),
                    name: text(&a["name"]),
                    path: None,
                };
                if rbac_allows(shared, &user, &attrs) {
                    status = json!({"allowed": true, "reason": "allowed by RBAC"});
                }
            }
            status
        }
        other => {
            return Err(ApiError::new(405, "MethodNotAllowed", format!("{other} are answered, not stored")));
        }
    };
    body["apiVersion"] = json!(def.api_version());
    body["kind"] = json!(def.kind);
    body["status"] = status;
    Ok((201, body))
}
