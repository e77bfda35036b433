//! Upstream's Rhai helpers in `value_script` and `prefly`, inside the sealed
//! engine. Upstream's operator evaluates both with `Script::new`
//! (`common/src/rhaihandler.rs`), which registers everything its agent has:
//! files, env, shell, http, S3, OCI, Kubernetes writes, passwords. Package
//! scripts that call the harmless ones must keep working here; the others
//! would let any package author act as the control plane (which is
//! cluster-admin), or change the script's answer at every reconcile (the
//! answer is part of the fingerprint: a new one re-runs the install).
//!
//! So each upstream name has one verdict in [`UPSTREAM`], the table
//! `docs/lifecycle.md` shows: offered with upstream's semantics (pure
//! helpers, instance accessors, the cluster facts lifecycle already watches,
//! and Kubernetes reads through lifecycle's own client — bounded, never a
//! Secret, never a wait), or refused with the reason, which is what a script
//! calling it reads ([`refusal`]). Rhai calls are synchronous: a read blocks
//! on the runtime, so scripts that may read run in [`off_the_runtime`].

use std::{
    cell::Cell,
    io::Read as _,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use base64::{Engine as _, engine::general_purpose::STANDARD};
use kube::{
    Api, ResourceExt,
    api::{ApiResource, DynamicObject, ListParams},
    discovery::{Discovery, Scope},
};
use rhai::{Array, Dynamic, Engine, EvalAltResult, ImmutableString, Map};
use serde_json::Value;
use sha2::Digest as _;

type Res<T> = Result<T, Box<EvalAltResult>>;

/// Why an upstream helper is not offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It changes the cluster or an instance's status.
    Write,
    /// It reaches the network (http, S3, OCI registries).
    Network,
    /// It reads or writes the controller's files.
    File,
    /// It reads the controller's environment.
    Env,
    /// It runs a command.
    Shell,
    /// Its answer changes at every call.
    NonDeterministic,
    /// It waits for the cluster to change: a reconcile never blocks on it.
    Waits,
    /// It reads any URL of the API server, Secrets included.
    RawRead,
    /// It is a method of an object upstream never binds in these scripts.
    NotInScope,
}

impl Refusal {
    pub fn why(self) -> &'static str {
        match self {
            Self::Write => {
                "it writes to the cluster; a package script only computes values, the agent Job does the writing"
            }
            Self::Network => {
                "it reaches the network from the control plane; the agent Job may, the controller may not"
            }
            Self::File => "it touches the controller's files",
            Self::Env => "it reads the controller's environment, which holds its credentials",
            Self::Shell => "it runs a command in the controller",
            Self::NonDeterministic => {
                "its answer changes at every call: the values are part of the fingerprint, so the install would re-run at every reconcile"
            }
            Self::Waits => {
                "it waits for the cluster to change; a reconcile never blocks: read the object with k8s_resource(…).get(name) instead, the reconcile comes back"
            }
            Self::RawRead => {
                "it reads any path of the API server, Secrets included; use k8s_resource(kind, namespace).get(name), which refuses Secrets"
            }
            Self::NotInScope => {
                "it is a method of an object these scripts are never given (upstream binds only `instance`)"
            }
        }
    }
}

/// One upstream helper's verdict here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Offered, with upstream's name and answer.
    Same,
    /// Offered with upstream's name; the difference said.
    Differs(&'static str),
    Refused(Refusal),
}

use Refusal::*;
use Verdict::{Differs, Refused, Same};

/// Every name upstream's `Script::new` registers for `value_script` and
/// `prefly` (`upstream-facts.md`, sebt3/vynil 72bc059), with the upstream
/// file, and what this engine does with it.
pub const UPSTREAM: &[(&str, &str, Verdict)] = &[
    // core engine (core/src/engine.rs; common/src/rhaihandler.rs later)
    ("base64_encode", "core/src/engine.rs", Same),
    (
        "base64_decode",
        "common/src/rhaihandler.rs",
        Differs("invalid base64 is an error naming it (upstream panics)"),
    ),
    ("basename", "core/src/engine.rs", Same),
    ("dirname", "core/src/engine.rs", Differs("a path without a parent gives \"\" (upstream panics)")),
    ("create_dir", "core/src/engine.rs", Refused(File)),
    ("file_copy", "core/src/engine.rs", Refused(File)),
    ("file_read", "core/src/engine.rs", Refused(File)),
    ("file_write", "core/src/engine.rs", Refused(File)),
    ("is_dir", "core/src/engine.rs", Refused(File)),
    ("is_file", "core/src/engine.rs", Refused(File)),
    ("read_dir", "core/src/engine.rs", Refused(File)),
    ("get_env", "core/src/engine.rs", Refused(Env)),
    ("json_decode", "core/src/engine.rs", Same),
    ("json_encode", "core/src/engine.rs", Same),
    ("json_encode_escape", "core/src/engine.rs", Same),
    ("log_debug", "core/src/engine.rs", Same),
    ("log_info", "core/src/engine.rs", Same),
    ("log_warn", "core/src/engine.rs", Same),
    ("log_error", "core/src/engine.rs", Same),
    ("sha256", "core/src/engine.rs", Same),
    (
        "to_decimal",
        "core/src/engine.rs",
        Differs("returns an integer (upstream a u32, which Rhai does not compare with integers)"),
    ),
    ("url_encode", "core/src/engine.rs", Same),
    ("assert", "common/src/rhaihandler.rs", Same),
    (
        "vynil_version",
        "vynilpackage.rs",
        Differs(
            "the version this control plane is configured as (`--vynil-version`, which the takeover sets to upstream's)",
        ),
    ),
    // core/src/chrono.rs
    ("date_now", "core/src/chrono.rs", Refused(NonDeterministic)),
    ("format", "core/src/chrono.rs", Refused(NonDeterministic)),
    // core/src/hashes.rs
    ("bcrypt_hash", "core/src/hashes.rs", Refused(NonDeterministic)),
    ("crc32_hash", "core/src/hashes.rs", Differs("returns an integer (upstream a u32)")),
    ("hash", "core/src/hashes.rs", Refused(NonDeterministic)),
    ("new_argon", "core/src/hashes.rs", Refused(NonDeterministic)),
    // core/src/semver.rs
    ("semver_from", "core/src/semver.rs", Same),
    ("inc_major", "core/src/semver.rs", Same),
    ("inc_minor", "core/src/semver.rs", Same),
    ("inc_patch", "core/src/semver.rs", Same),
    ("inc_beta", "core/src/semver.rs", Same),
    ("inc_alpha", "core/src/semver.rs", Same),
    ("to_string", "core/src/semver.rs", Same),
    // core/src/yaml.rs, common/src/yamlhandler.rs
    (
        "yaml_decode",
        "core/src/yaml.rs",
        Differs("a map's keys come back sorted (upstream keeps the document's order)"),
    ),
    ("yaml_encode", "core/src/yaml.rs", Differs("serde_yaml_ng's layout, keys sorted")),
    ("yaml_encode_ordered", "common/src/yamlhandler.rs", Differs("as yaml_encode: keys sorted")),
    ("contains", "common/src/yamlhandler.rs", Same),
    ("is_empty", "common/src/yamlhandler.rs", Same),
    ("keys", "common/src/yamlhandler.rs", Same),
    ("len", "common/src/yamlhandler.rs", Same),
    ("values", "common/src/yamlhandler.rs", Same),
    // passwords, keys, files, shell
    ("gen_password", "core/src/password.rs", Refused(NonDeterministic)),
    ("gen_password_alphanum", "core/src/password.rs", Refused(NonDeterministic)),
    ("gen_private_key", "core/src/key.rs", Refused(NonDeterministic)),
    ("glob", "core/src/glob.rs", Refused(File)),
    ("shell_output", "core/src/shell.rs", Refused(Shell)),
    ("shell_run", "core/src/shell.rs", Refused(Shell)),
    ("new_hbs", "common/src/handlebarshandler.rs", Refused(File)),
    // core/src/http.rs
    ("new_http_client", "core/src/http.rs", Refused(Network)),
    ("add_header", "core/src/http.rs", Refused(Network)),
    ("add_header_basic", "core/src/http.rs", Refused(Network)),
    ("add_header_bearer", "core/src/http.rs", Refused(Network)),
    ("add_header_json", "core/src/http.rs", Refused(Network)),
    ("headers_reset", "core/src/http.rs", Refused(Network)),
    ("set_baseurl", "core/src/http.rs", Refused(Network)),
    ("set_mtls_cert_key", "core/src/http.rs", Refused(Network)),
    ("set_server_ca", "core/src/http.rs", Refused(Network)),
    ("head", "core/src/http.rs", Refused(Network)),
    ("http_get_yaml", "core/src/http.rs", Refused(Network)),
    ("post", "core/src/http.rs", Refused(Network)),
    ("put", "core/src/http.rs", Refused(Network)),
    // core/src/oci.rs, core/src/s3.rs
    ("get_auth_from_file", "core/src/oci.rs", Refused(File)),
    ("new_registry", "core/src/oci.rs", Refused(Network)),
    ("get_manifest", "core/src/oci.rs", Refused(Network)),
    ("list_tags", "core/src/oci.rs", Refused(Network)),
    ("push_image", "core/src/oci.rs", Refused(Network)),
    ("sign_image", "core/src/oci.rs", Refused(Network)),
    ("s3_get_yaml", "core/src/s3.rs", Refused(Network)),
    ("s3_list_keys", "core/src/s3.rs", Refused(Network)),
    // core/src/k8s.rs (and http.rs's get/delete/patch)
    (
        "k8s_resource",
        "core/src/k8s.rs",
        Differs("lifecycle's own client, at most 16 reads per script run, 5 s each; Secrets are refused"),
    ),
    (
        "get",
        "core/src/k8s.rs, core/src/http.rs",
        Differs("the Kubernetes read (`k8s_resource(…).get(name)`); the http client's is refused: network"),
    ),
    ("get_meta", "core/src/k8s.rs", Same),
    (
        "get_obj",
        "core/src/k8s.rs",
        Differs("a map with the object's `kind` and `metadata`; its wait_* methods are refused"),
    ),
    ("exist", "core/src/k8s.rs", Same),
    ("list", "core/src/k8s.rs", Same),
    ("list_meta", "core/src/k8s.rs", Same),
    (
        "get_deployment",
        "core/src/k8s.rs",
        Differs("the Deployment as a map (`metadata`, `spec`, `status`); wait_available is refused"),
    ),
    ("get_statefulset", "core/src/k8s.rs", Differs("the StatefulSet as a map; wait_available is refused")),
    ("get_deamonset", "core/src/k8s.rs", Differs("the DaemonSet as a map; wait_available is refused")),
    ("get_job", "core/src/k8s.rs", Differs("the Job as a map; wait_done is refused")),
    ("new_k8s_raw", "core/src/k8s.rs", Refused(RawRead)),
    ("get_url", "core/src/k8s.rs", Refused(RawRead)),
    ("get_api_resources", "core/src/k8s.rs", Refused(RawRead)),
    ("get_cluster_version", "core/src/k8s.rs", Refused(RawRead)),
    ("update_k8s_crd_cache", "core/src/k8s.rs", Same),
    ("data", "core/src/k8s.rs", Same),
    ("kind", "core/src/k8s.rs", Same),
    ("original_kind", "core/src/k8s.rs", Refused(NotInScope)),
    ("scope", "core/src/k8s.rs", Same),
    ("apply", "core/src/k8s.rs", Refused(Write)),
    ("create", "core/src/k8s.rs", Refused(Write)),
    ("delete", "core/src/k8s.rs, core/src/http.rs", Refused(Write)),
    ("patch", "core/src/k8s.rs, core/src/http.rs", Refused(Write)),
    ("replace", "core/src/k8s.rs", Refused(Write)),
    ("wait_available", "core/src/k8s.rs", Refused(Waits)),
    ("wait_condition", "core/src/k8s.rs", Refused(Waits)),
    ("wait_deleted", "core/src/k8s.rs", Refused(Waits)),
    ("wait_done", "core/src/k8s.rs", Refused(Waits)),
    ("wait_status", "core/src/k8s.rs", Refused(Waits)),
    ("wait_status_prop", "core/src/k8s.rs", Refused(Waits)),
    ("wait_status_string", "core/src/k8s.rs", Refused(Waits)),
    // the instance kinds (common/src/instancetenant.rs, instanceservice.rs, instancesystem.rs)
    ("metadata", "common/src/instancetenant.rs", Same),
    ("spec", "common/src/instancetenant.rs", Same),
    ("status", "common/src/instancetenant.rs", Same),
    ("options_digest", "common/src/instancetenant.rs", Same),
    ("get_tfstate", "common/src/instancetenant.rs", Same),
    ("get_rhaistate", "common/src/instancetenant.rs", Same),
    ("get_services", "common/src/instancetenant.rs", Same),
    ("get_tenant_name", "common/src/instancetenant.rs", Same),
    ("get_tenant_namespaces", "common/src/instancetenant.rs", Same),
    ("get_tenant_services_names", "common/src/instancetenant.rs", Same),
    (
        "get_tenant_instance",
        "common/src/instancetenant.rs",
        Differs("read from lifecycle's watch cache; the instance is a map with the same fields"),
    ),
    (
        "list_tenant_instance",
        "common/src/instancetenant.rs",
        Differs("read from lifecycle's watch cache, sorted by name"),
    ),
    ("get_service_instance", "common/src/instanceservice.rs", Differs("read from lifecycle's watch cache")),
    (
        "list_service_instance",
        "common/src/instanceservice.rs",
        Differs("read from lifecycle's watch cache, sorted by name"),
    ),
    ("list_services_names", "common/src/instanceservice.rs", Differs("read from lifecycle's watch cache")),
    ("get_system_instance", "common/src/instancesystem.rs", Differs("read from lifecycle's watch cache")),
    (
        "list_system_instance",
        "common/src/instancesystem.rs",
        Differs("read from lifecycle's watch cache, sorted by name"),
    ),
    ("set_agent_started", "common/src/instancetenant.rs", Refused(Write)),
    ("set_missing_box", "common/src/instancetenant.rs", Refused(Write)),
    ("set_missing_package", "common/src/instancetenant.rs", Refused(Write)),
    ("set_missing_requirement", "common/src/instancetenant.rs", Refused(Write)),
    ("set_status_ready", "common/src/instancetenant.rs", Refused(Write)),
    ("set_status_befores", "common/src/instancetenant.rs", Refused(Write)),
    ("set_status_before_failed", "common/src/instancetenant.rs", Refused(Write)),
    ("set_status_vitals", "common/src/instancetenant.rs", Refused(Write)),
    ("set_status_vital_failed", "common/src/instancetenant.rs", Refused(Write)),
    ("set_status_scalables", "common/src/instancetenant.rs", Refused(Write)),
    ("set_status_scalable_failed", "common/src/instancetenant.rs", Refused(Write)),
    ("set_status_others", "common/src/instancetenant.rs", Refused(Write)),
    ("set_status_other_failed", "common/src/instancetenant.rs", Refused(Write)),
    ("set_status_crds", "common/src/instanceservice.rs", Refused(Write)),
    ("set_status_crd_failed", "common/src/instanceservice.rs", Refused(Write)),
    ("set_status_systems", "common/src/instancesystem.rs", Refused(Write)),
    ("set_status_system_failed", "common/src/instancesystem.rs", Refused(Write)),
    ("set_tfstate", "common/src/instancetenant.rs", Refused(Write)),
    ("set_status_tofu_failed", "common/src/instancetenant.rs", Refused(Write)),
    ("set_rhaistate", "common/src/instancetenant.rs", Refused(Write)),
    ("set_status_rhai_failed", "common/src/instancetenant.rs", Refused(Write)),
    ("set_services", "common/src/instancetenant.rs", Refused(Write)),
    ("set_status_schedule_backup_failed", "common/src/instancetenant.rs", Refused(Write)),
    ("set_status_init_failed", "common/src/instancetenant.rs", Refused(Write)),
    // common/src/jukebox.rs
    (
        "get_jukebox",
        "common/src/jukebox.rs",
        Differs("through lifecycle's client, counted with the Kubernetes reads"),
    ),
    (
        "list_jukebox",
        "common/src/jukebox.rs",
        Differs("through lifecycle's client, counted with the Kubernetes reads"),
    ),
    ("set_status_updated", "common/src/jukebox.rs", Refused(Write)),
    ("set_status_failed", "common/src/jukebox.rs", Refused(Write)),
    // common/src/vynilpackage.rs
    ("read_package_yaml", "common/src/vynilpackage.rs", Refused(File)),
    ("validate_options", "common/src/vynilpackage.rs", Refused(NotInScope)),
    ("images", "common/src/vynilpackage.rs", Refused(NotInScope)),
    ("options", "common/src/vynilpackage.rs", Refused(NotInScope)),
    ("recommandations", "common/src/vynilpackage.rs", Refused(NotInScope)),
    ("requirements", "common/src/vynilpackage.rs", Refused(NotInScope)),
    ("resources", "common/src/vynilpackage.rs", Refused(NotInScope)),
    ("value_script", "common/src/vynilpackage.rs", Refused(NotInScope)),
];

/// What a script calling `name` reads when this engine does not offer it:
/// `None` for a name upstream does not have either.
pub fn refusal(name: &str) -> Option<String> {
    let (_, file, verdict) = UPSTREAM.iter().find(|(n, _, _)| *n == name)?;
    match verdict {
        Refused(why) => {
            Some(format!("upstream's `{name}` ({file}) is refused in value_script and prefly: {}", why.why()))
        }
        // Offered under that name: the call's arguments did not match.
        Same | Differs(_) => None,
    }
}

/// The cluster facts a script may read: those lifecycle gathered for the
/// reconcile (the instance's tenant) and its watch caches of the three kinds.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    /// The namespace of the instance the facts were gathered for.
    pub namespace: String,
    /// The value of the namespace's `TENANT_LABEL`, else the namespace.
    pub tenant_name: String,
    /// The namespaces of that tenant, sorted.
    pub tenant_namespaces: Vec<String>,
    pub tenants: Vec<Arc<DynamicObject>>,
    pub services: Vec<Arc<DynamicObject>>,
    pub systems: Vec<Arc<DynamicObject>>,
}

/// What the helpers are given besides `instance`.
#[derive(Debug, Clone, Default)]
pub struct Given {
    /// `None` where no facts were gathered (a delete Job's values computed
    /// without an install record): the tenant and instance helpers say so.
    pub cluster: Option<Arc<Cluster>>,
    pub vynil_version: String,
    /// Lifecycle's client for upstream's Kubernetes read helpers; `None`
    /// where the script does not run off the runtime ([`off_the_runtime`]).
    pub reads: Option<Reads>,
}

/// Lifecycle's own client and runtime, for upstream's Kubernetes reads
/// (`k8s_resource`, `get_deployment`, `get_jukebox`…): Rhai calls are
/// synchronous, so a read blocks on the runtime, which only a script run by
/// [`off_the_runtime`] may do.
#[derive(Clone)]
pub struct Reads {
    client: kube::Client,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for Reads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reads").finish_non_exhaustive()
    }
}

impl Reads {
    /// `None` outside a Tokio runtime.
    pub fn here(client: kube::Client) -> Option<Self> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        Some(Self { client, runtime })
    }
}

/// How many API requests one script run may make, and how long each may take.
pub const MAX_READS: usize = 16;
const READ_TIMEOUT: Duration = Duration::from_secs(5);

thread_local! {
    static OFF_THE_RUNTIME: Cell<bool> = const { Cell::new(false) };
}

/// Runs `work` (which evaluates package scripts) on a blocking thread, where
/// a Kubernetes read may block on the runtime. A read anywhere else is an
/// error, never a deadlock or a panic.
pub async fn off_the_runtime<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(move || {
        OFF_THE_RUNTIME.with(|flag| flag.set(true));
        let out = work();
        OFF_THE_RUNTIME.with(|flag| flag.set(false));
        out
    })
    .await
    .map_err(|e| format!("a package script's evaluation stopped: {e}"))
}

/// The reads of one script run: counted, bounded in time, discovery once.
struct Session {
    reads: Reads,
    used: AtomicUsize,
    discovery: Mutex<Option<Arc<Discovery>>>,
}

impl Session {
    fn call<T>(&self, what: &str, read: impl Future<Output = Result<T, kube::Error>>) -> Res<T> {
        if !OFF_THE_RUNTIME.with(Cell::get) {
            return error(format!("{what}: internal: a Kubernetes read outside off_the_runtime"));
        }
        if self.used.fetch_add(1, Ordering::Relaxed) >= MAX_READS {
            return error(format!("{what}: over {MAX_READS} Kubernetes reads in one script run"));
        }
        match self.reads.runtime.block_on(tokio::time::timeout(READ_TIMEOUT, read)) {
            Err(_) => error(format!("{what}: the API server did not answer in {}s", READ_TIMEOUT.as_secs())),
            Ok(Err(e)) => error(format!("{what}: {e}")),
            Ok(Ok(value)) => Ok(value),
        }
    }

    fn discovery(&self, refresh: bool) -> Res<Arc<Discovery>> {
        let cached = self.discovery.lock().ok().and_then(|d| d.clone());
        if let Some(discovery) = cached.filter(|_| !refresh) {
            return Ok(discovery);
        }
        let client = self.reads.client.clone();
        let discovery = Arc::new(self.call("discovery", Discovery::new(client).run())?);
        if let Ok(mut slot) = self.discovery.lock() {
            *slot = Some(discovery.clone());
        }
        Ok(discovery)
    }

    /// Upstream's `K8sGeneric::new`: the resource whose kind or plural is
    /// `name` (any case), in `api_version` when given, the first group by
    /// name when several serve it.
    fn resource(&self, api_version: Option<&str>, name: &str, namespace: Option<&str>) -> Res<Resource> {
        let discovery = self.discovery(false)?;
        let wanted = api_version.and_then(|v| v.split_once('/'));
        let found = discovery
            .groups()
            .flat_map(|group| group.resources_by_stability().into_iter().map(move |r| (group.name(), r)))
            .filter(|(_, (r, _))| name.eq_ignore_ascii_case(&r.kind) || name.eq_ignore_ascii_case(&r.plural))
            .filter(|(_, (r, _))| wanted.is_none_or(|(g, v)| r.group == g && r.version == v))
            .min_by_key(|(group, _)| group.to_string())
            .map(|(_, found)| found);
        let Some((resource, capabilities)) = found else {
            return Ok(Resource { api: None, kind: String::new(), scope: Scope::Cluster });
        };
        if resource.group.is_empty() && resource.kind == "Secret" {
            return error("k8s_resource: Secrets are never read by package scripts in the control plane");
        }
        let client = self.reads.client.clone();
        let api = match namespace {
            Some(ns) if capabilities.scope == Scope::Namespaced => {
                Api::namespaced_with(client, ns, &resource)
            }
            _ => Api::all_with(client, &resource),
        };
        Ok(Resource { api: Some(api), kind: resource.kind.clone(), scope: capabilities.scope })
    }
}

/// Upstream's `K8sGeneric`: one resource kind, perhaps in a namespace.
#[derive(Clone)]
pub struct Resource {
    api: Option<Api<DynamicObject>>,
    kind: String,
    scope: Scope,
}

impl Resource {
    fn api(&self, what: &str) -> Res<&Api<DynamicObject>> {
        self.api.as_ref().ok_or_else(|| format!("{what}: no such resource kind is served").into())
    }
}

fn error<T>(message: impl Into<String>) -> Res<T> {
    Err(message.into().into())
}

fn json_of<T: serde::Serialize>(value: &T) -> Res<Dynamic> {
    rhai::serde::to_dynamic(value)
}

fn object_value(object: &DynamicObject) -> Value {
    let mut value = object.data.clone();
    if let Value::Object(map) = &mut value {
        if let Some(types) = &object.types {
            map.insert("apiVersion".into(), Value::String(types.api_version.clone()));
            map.insert("kind".into(), Value::String(types.kind.clone()));
        }
        map.insert("metadata".into(), serde_json::to_value(&object.metadata).unwrap_or(Value::Null));
    }
    value
}

fn instance_str(instance: &Map, field: &str, key: &str) -> Option<String> {
    instance.get(field)?.read_lock::<Map>()?.get(key)?.clone().into_string().ok()
}

/// Upstream's `base64_gz_decode` (`common/src/tools.rs`).
fn gunzip_base64(text: &str) -> Res<String> {
    let bytes = STANDARD.decode(text).map_err(|e| format!("the state is not base64: {e}"))?;
    let mut out = String::new();
    flate2::read::GzDecoder::new(&bytes[..])
        .read_to_string(&mut out)
        .map_err(|e| format!("the state is not gzip text: {e}"))?;
    Ok(out)
}

fn status_state(instance: &Map, field: &str) -> Res<Dynamic> {
    match instance_str(instance, "status", field) {
        Some(text) => gunzip_base64(&text).map(Dynamic::from),
        None => Ok(Dynamic::UNIT),
    }
}

fn published(instance: &Value) -> Vec<String> {
    instance
        .pointer("/status/services")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("key").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// Upstream's `Semver` (`common/src/semverhandler.rs`): a version that
/// remembers a leading `v`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Semver {
    version: semver::Version,
    use_v: bool,
}

impl Semver {
    fn parse(text: &str) -> Res<Self> {
        let (use_v, rest) = match text.strip_prefix('v') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let version = semver::Version::parse(rest).map_err(|e| format!("semver_from({text:?}): {e}"))?;
        Ok(Self { version, use_v })
    }

    fn inc_major(&mut self) {
        self.version = semver::Version::new(self.version.major + 1, 0, 0);
    }

    fn inc_minor(&mut self) {
        self.version = semver::Version::new(self.version.major, self.version.minor + 1, 0);
    }

    fn inc_patch(&mut self) {
        if self.version.pre.is_empty() {
            self.version.patch += 1;
        } else {
            self.version.pre = semver::Prerelease::EMPTY;
        }
    }

    /// `inc_beta`/`inc_alpha`: `<label>.1` on the next patch, else the
    /// counter plus one.
    fn inc_pre(&mut self, label: &str) -> Res<()> {
        let counter = self
            .version
            .pre
            .as_str()
            .strip_prefix(label)
            .and_then(|rest| rest.strip_prefix('.'))
            .map(|n| n.parse::<u64>().map_err(|e| format!("inc_{label}: {n:?} is not a counter: {e}")))
            .transpose()?;
        let next = match counter {
            Some(n) => n + 1,
            None => {
                self.version.patch += 1;
                1
            }
        };
        self.version.pre =
            semver::Prerelease::new(&format!("{label}.{next}")).map_err(|e| format!("inc_{label}: {e}"))?;
        Ok(())
    }

    fn text(&self) -> String {
        if self.use_v { format!("v{}", self.version) } else { self.version.to_string() }
    }
}

/// Registers the offered helpers on `engine`.
pub fn register(engine: &mut Engine, given: &Given) {
    engine
        .register_fn("base64_encode", |s: ImmutableString| STANDARD.encode(s.as_str()))
        .register_fn("base64_decode", |s: ImmutableString| -> Res<String> {
            let bytes = STANDARD.decode(s.as_str()).map_err(|e| format!("base64_decode: {e}"))?;
            String::from_utf8(bytes).map_err(|e| format!("base64_decode: not UTF-8 text: {e}").into())
        })
        .register_fn("basename", |s: ImmutableString| {
            Path::new(s.as_str()).file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string()
        })
        .register_fn("dirname", |s: ImmutableString| {
            Path::new(s.as_str()).parent().and_then(|n| n.to_str()).unwrap_or_default().to_string()
        })
        .register_fn("json_encode", |v: Dynamic| -> Res<String> {
            serde_json::to_string(&v).map_err(|e| format!("json_encode: {e}").into())
        })
        .register_fn("json_encode_escape", |v: Dynamic| -> Res<String> {
            let text = serde_json::to_string(&v).map_err(|e| format!("json_encode_escape: {e}"))?;
            Ok(format!("{text:?}"))
        })
        .register_fn("json_decode", |s: ImmutableString| -> Res<Dynamic> {
            serde_json::from_str(s.as_str()).map_err(|e| format!("json_decode: {e}").into())
        })
        .register_fn("yaml_decode", |s: ImmutableString| -> Res<Dynamic> {
            let value: Value =
                serde_yaml_ng::from_str(s.as_str()).map_err(|e| format!("yaml_decode: {e}"))?;
            json_of(&value)
        })
        .register_fn("yaml_encode", |v: Dynamic| -> Res<String> {
            serde_yaml_ng::to_string(&v).map_err(|e| format!("yaml_encode: {e}").into())
        })
        .register_fn("yaml_encode_ordered", |v: Dynamic| -> Res<String> {
            serde_yaml_ng::to_string(&v).map_err(|e| format!("yaml_encode_ordered: {e}").into())
        })
        .register_fn("sha256", |s: ImmutableString| hex::encode(sha2::Sha256::digest(s.as_bytes())))
        .register_fn("crc32_hash", |s: ImmutableString| i64::from(crc32fast::hash(s.as_bytes())))
        .register_fn("url_encode", |s: ImmutableString| {
            url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()
        })
        .register_fn("to_decimal", |s: ImmutableString| {
            i64::from_str_radix(s.as_str(), 8).unwrap_or_else(|_| {
                tracing::warn!("to_decimal received a non-valid parameter: {s:?}");
                0
            })
        })
        .register_fn("log_debug", |s: ImmutableString| tracing::debug!("{s}"))
        .register_fn("log_info", |s: ImmutableString| tracing::info!("{s}"))
        .register_fn("log_warn", |s: ImmutableString| tracing::warn!("{s}"))
        .register_fn("log_error", |s: ImmutableString| tracing::error!("{s}"))
        .register_fn("assert", |holds: bool, message: Dynamic| -> Res<()> {
            if holds {
                Ok(())
            } else {
                Err(EvalAltResult::ErrorRuntime(message, rhai::Position::NONE).into())
            }
        });
    let version = given.vynil_version.clone();
    engine.register_fn("vynil_version", move || version.clone());

    engine
        .register_type_with_name::<Semver>("Semver")
        .register_fn("semver_from", |s: ImmutableString| Semver::parse(s.as_str()))
        .register_fn("inc_major", Semver::inc_major)
        .register_fn("inc_minor", Semver::inc_minor)
        .register_fn("inc_patch", Semver::inc_patch)
        .register_fn("inc_beta", |v: &mut Semver| v.inc_pre("beta"))
        .register_fn("inc_alpha", |v: &mut Semver| v.inc_pre("alpha"))
        .register_fn("to_string", |v: &mut Semver| v.text())
        .register_fn("==", |a: Semver, b: Semver| a == b)
        .register_fn("!=", |a: Semver, b: Semver| a != b)
        .register_fn("<", |a: Semver, b: Semver| a < b)
        .register_fn(">", |a: Semver, b: Semver| a > b)
        .register_fn("<=", |a: Semver, b: Semver| a <= b)
        .register_fn(">=", |a: Semver, b: Semver| a >= b);

    // Instance accessors: `instance` is the object as a map.
    engine
        .register_fn("options_digest", |instance: Map| -> Res<String> {
            let value: Value = rhai::serde::from_dynamic(&Dynamic::from_map(instance))?;
            let options = value.pointer("/spec/options").and_then(Value::as_object);
            Ok(vynil_rules::install::options_hash(options))
        })
        .register_fn("get_tfstate", |instance: Map| status_state(&instance, "tfstate"))
        .register_fn("get_rhaistate", |instance: Map| status_state(&instance, "rhaistate"))
        .register_fn("get_services", |instance: Map| -> Res<String> {
            let value: Value = rhai::serde::from_dynamic(&Dynamic::from_map(instance))?;
            let mut keys = published(&value);
            keys.sort();
            Ok(keys.join(","))
        });

    let cluster = given.cluster.clone();
    let tenant = move |instance: &Map, helper: &str| -> Res<Arc<Cluster>> {
        let Some(cluster) = cluster.clone() else {
            return error(format!(
                "{helper}: the tenant is not known when a delete Job's values are computed without the install's record"
            ));
        };
        let namespace = instance_str(instance, "metadata", "namespace").unwrap_or_default();
        if namespace != cluster.namespace {
            return error(format!(
                "{helper}: only the tenant of the instance being reconciled is known (namespace {:?}, not {namespace:?})",
                cluster.namespace
            ));
        }
        Ok(cluster)
    };
    let t = tenant.clone();
    engine.register_fn("get_tenant_name", move |instance: Map| -> Res<String> {
        Ok(t(&instance, "get_tenant_name")?.tenant_name.clone())
    });
    let t = tenant.clone();
    engine.register_fn("get_tenant_namespaces", move |instance: Map| -> Res<Array> {
        Ok(t(&instance, "get_tenant_namespaces")?
            .tenant_namespaces
            .iter()
            .map(|n| Dynamic::from(n.clone()))
            .collect())
    });
    let t = tenant;
    engine.register_fn("get_tenant_services_names", move |instance: Map| -> Res<Array> {
        let cluster = t(&instance, "get_tenant_services_names")?;
        let mut keys: Vec<String> = cluster
            .tenants
            .iter()
            .filter(|o| o.namespace().is_some_and(|ns| cluster.tenant_namespaces.contains(&ns)))
            .flat_map(|o| published(&o.data))
            .collect();
        keys.sort();
        Ok(keys.into_iter().map(Dynamic::from).collect())
    });

    match &given.reads {
        Some(reads) => register_reads(engine, reads),
        None => register_no_reads(engine),
    }
    register_kind(engine, given, "tenant", |c| &c.tenants);
    register_kind(engine, given, "service", |c| &c.services);
    register_kind(engine, given, "system", |c| &c.systems);
    let cluster = given.cluster.clone();
    engine.register_fn("list_services_names", move || -> Res<Array> {
        let Some(cluster) = &cluster else {
            return error("list_services_names: the cluster's instances are not known here");
        };
        let mut keys: Vec<String> = cluster.services.iter().flat_map(|o| published(&o.data)).collect();
        keys.sort();
        Ok(keys.into_iter().map(Dynamic::from).collect())
    });
}

fn list_value<T: serde::Serialize + Clone>(list: &kube::api::ObjectList<T>) -> Res<Dynamic> {
    json_of(&serde_json::to_value(list).map_err(|e| e.to_string())?)
}

/// Where no client is given: each read helper says why it cannot answer.
fn register_no_reads(engine: &mut Engine) {
    fn unavailable(name: &str) -> Res<Dynamic> {
        error(format!(
            "{name}: Kubernetes reads are not available here (a delete Job's values computed without the install's record)"
        ))
    }
    type S = ImmutableString;
    engine
        .register_fn("k8s_resource", |_: S| unavailable("k8s_resource"))
        .register_fn("k8s_resource", |_: S, _: S| unavailable("k8s_resource"))
        .register_fn("k8s_resource", |_: S, _: S, _: S| unavailable("k8s_resource"))
        .register_fn("get_deployment", |_: S, _: S| unavailable("get_deployment"))
        .register_fn("get_statefulset", |_: S, _: S| unavailable("get_statefulset"))
        .register_fn("get_deamonset", |_: S, _: S| unavailable("get_deamonset"))
        .register_fn("get_job", |_: S, _: S| unavailable("get_job"))
        .register_fn("get_jukebox", |_: S| unavailable("get_jukebox"))
        .register_fn("list_jukebox", || unavailable("list_jukebox"))
        .register_fn("update_k8s_crd_cache", || unavailable("update_k8s_crd_cache"));
}

/// Upstream's Kubernetes reads (`core/src/k8s.rs`), through lifecycle's client.
fn register_reads(engine: &mut Engine, reads: &Reads) {
    let session =
        Arc::new(Session { reads: reads.clone(), used: AtomicUsize::new(0), discovery: Mutex::new(None) });
    let s = session.clone();
    engine.register_type_with_name::<Resource>("K8sGeneric");
    engine.register_fn("k8s_resource", move |kind: ImmutableString| s.resource(None, &kind, None));
    let s = session.clone();
    engine.register_fn("k8s_resource", move |kind: ImmutableString, ns: ImmutableString| {
        s.resource(None, &kind, Some(&ns))
    });
    let s = session.clone();
    engine.register_fn(
        "k8s_resource",
        move |api_version: ImmutableString, kind: ImmutableString, ns: ImmutableString| {
            s.resource(Some(&api_version), &kind, Some(&ns))
        },
    );
    let s = session.clone();
    engine.register_fn("update_k8s_crd_cache", move || s.discovery(true).map(drop));
    engine
        .register_fn("exist", |r: &mut Resource| r.api.is_some())
        .register_get("scope", |r: &mut Resource| {
            if r.scope == Scope::Cluster { "cluster".to_string() } else { "namespace".to_string() }
        })
        .register_get("kind", |r: &mut Resource| r.kind.clone());
    let s = session.clone();
    engine.register_fn("get", move |r: &mut Resource, name: ImmutableString| -> Res<Dynamic> {
        let object = s.call("get", r.api("get")?.get(&name))?;
        json_of(&object_value(&object))
    });
    let s = session.clone();
    engine.register_fn("get_meta", move |r: &mut Resource, name: ImmutableString| -> Res<Dynamic> {
        let meta = s.call("get_meta", r.api("get_meta")?.get_metadata(&name))?;
        json_of(&serde_json::to_value(&meta).map_err(|e| e.to_string())?)
    });
    let s = session.clone();
    engine.register_fn("get_obj", move |r: &mut Resource, name: ImmutableString| -> Res<Dynamic> {
        let meta = s.call("get_obj", r.api("get_obj")?.get_metadata(&name))?;
        json_of(&serde_json::json!({"kind": r.kind, "metadata": meta.metadata}))
    });
    let s = session.clone();
    engine.register_fn("list", move |r: &mut Resource| -> Res<Dynamic> {
        list_value(&s.call("list", r.api("list")?.list(&ListParams::default()))?)
    });
    let s = session.clone();
    engine.register_fn("list", move |r: &mut Resource, labels: ImmutableString| -> Res<Dynamic> {
        list_value(&s.call("list", r.api("list")?.list(&ListParams::default().labels(&labels)))?)
    });
    let s = session.clone();
    engine.register_fn("list_meta", move |r: &mut Resource| -> Res<Dynamic> {
        list_value(&s.call("list_meta", r.api("list_meta")?.list_metadata(&ListParams::default()))?)
    });
    // k8sworkload.rs: the object, read by namespace and name.
    let workloads: [(&str, ApiResource); 4] = [
        ("get_deployment", ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&())),
        ("get_statefulset", ApiResource::erase::<k8s_openapi::api::apps::v1::StatefulSet>(&())),
        ("get_deamonset", ApiResource::erase::<k8s_openapi::api::apps::v1::DaemonSet>(&())),
        ("get_job", ApiResource::erase::<k8s_openapi::api::batch::v1::Job>(&())),
    ];
    for (name, resource) in workloads {
        let s = session.clone();
        engine.register_fn(name, move |ns: ImmutableString, wanted: ImmutableString| -> Res<Dynamic> {
            let api: Api<DynamicObject> = Api::namespaced_with(s.reads.client.clone(), &ns, &resource);
            json_of(&object_value(&s.call(name, api.get(&wanted))?))
        });
    }
    // jukebox.rs
    let jukebox = ApiResource {
        group: "vynil.solidite.fr".into(),
        version: "v1".into(),
        api_version: "vynil.solidite.fr/v1".into(),
        kind: "JukeBox".into(),
        plural: "jukeboxes".into(),
    };
    let (s, resource) = (session.clone(), jukebox.clone());
    engine.register_fn("get_jukebox", move |wanted: ImmutableString| -> Res<Dynamic> {
        let api: Api<DynamicObject> = Api::all_with(s.reads.client.clone(), &resource);
        json_of(&object_value(&s.call("get_jukebox", api.get(&wanted))?))
    });
    let s = session;
    engine.register_fn("list_jukebox", move || -> Res<Array> {
        let api: Api<DynamicObject> = Api::all_with(s.reads.client.clone(), &jukebox);
        let list = s.call("list_jukebox", api.list(&ListParams::default()))?;
        list.items.iter().map(|o| json_of(&object_value(o))).collect()
    });
}

/// `get_<kind>_instance(namespace, name)` and `list_<kind>_instance(namespace)`
/// over lifecycle's watch cache of that kind.
fn register_kind(
    engine: &mut Engine,
    given: &Given,
    kind: &'static str,
    of: fn(&Cluster) -> &Vec<Arc<DynamicObject>>,
) {
    let cluster = given.cluster.clone();
    let get = format!("get_{kind}_instance");
    let name = get.clone();
    engine.register_fn(&get, move |namespace: ImmutableString, wanted: ImmutableString| -> Res<Dynamic> {
        let Some(cluster) = &cluster else {
            return error(format!("{name}: the cluster's instances are not known here"));
        };
        let object = of(cluster)
            .iter()
            .find(|o| o.namespace().as_deref() == Some(namespace.as_str()) && o.name_any() == wanted.as_str())
            .ok_or_else(|| format!("{name}: no {kind} instance {namespace}/{wanted}"))?;
        json_of(&object_value(object))
    });
    let cluster = given.cluster.clone();
    let list = format!("list_{kind}_instance");
    let name = list.clone();
    engine.register_fn(&list, move |namespace: ImmutableString| -> Res<Array> {
        let Some(cluster) = &cluster else {
            return error(format!("{name}: the cluster's instances are not known here"));
        };
        let mut objects: Vec<&Arc<DynamicObject>> =
            of(cluster).iter().filter(|o| o.namespace().as_deref() == Some(namespace.as_str())).collect();
        objects.sort_by_key(|o| o.name_any());
        objects.into_iter().map(|o| json_of(&object_value(o))).collect()
    });
}

#[cfg(test)]
mod tests {
    //! Expected values are upstream's: its own tests where it has them (the
    //! file named), else the standard vectors of the algorithm upstream
    //! calls, computed outside this code (sha256sum, Python's zlib, gzip and
    //! urllib).
    use super::*;
    use crate::script::Host;
    use serde_json::json;
    use vynil_script::ScriptLimits;

    fn values(source: &str, instance: Value, given: Given) -> Result<Value, String> {
        let text = Host::new(instance, ScriptLimits::default(), given).controller_values(Some(source))?;
        serde_json::from_str(&text).map_err(|e| e.to_string())
    }

    fn value(source: &str) -> Value {
        let out = values(&format!("#{{ v: {source} }}"), json!({}), Given::default()).unwrap();
        out["v"].clone()
    }

    #[test]
    fn core_helpers_give_upstreams_answers() {
        // common/src/rhaihandler.rs: STANDARD base64, sha256 hex, form_urlencoded, octal to_decimal.
        assert_eq!(value(r#"base64_encode("hello")"#), "aGVsbG8=");
        assert_eq!(value(r#"base64_decode("aGVsbG8=")"#), "hello");
        assert_eq!(
            value(r#"sha256("abc")"#),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(value(r#"url_encode("a b&c=d/é")"#), "a+b%26c%3Dd%2F%C3%A9");
        assert_eq!(value(r#"to_decimal("755")"#), 493);
        assert_eq!(value(r#"to_decimal("9")"#), 0, "upstream answers 0 (and warns) for a non-octal text");
        // common/src/hasheshandlers.rs: crc32fast::hash, the CRC-32 check value.
        assert_eq!(value(r#"crc32_hash("123456789")"#), 3_421_780_262_i64);
        assert_eq!(value(r#"json_encode(#{a: 1})"#), r#"{"a":1}"#);
        assert_eq!(value(r#"json_encode_escape(#{a: 1})"#), r#""{\"a\":1}""#);
        assert_eq!(value(r#"json_decode("{\"a\":[1,2]}").a[1]"#), 2);
        assert_eq!(value(r#"yaml_decode("a:\n  b: [1, x]\n").a.b[1]"#), "x");
        assert_eq!(value(r#"yaml_decode(yaml_encode(#{k: "v", n: 2}))"#), json!({"k": "v", "n": 2}));
        assert_eq!(value(r#"basename("/a/b/c.txt")"#), "c.txt");
        assert_eq!(value(r#"dirname("/a/b/c.txt")"#), "/a/b");
        let given = Given { vynil_version: "0.7.8-alpha.4".into(), ..Given::default() };
        assert_eq!(values("#{ v: vynil_version() }", json!({}), given).unwrap()["v"], "0.7.8-alpha.4");
        let error =
            values(r#"assert(1 == 2, "one is not two"); #{}"#, json!({}), Given::default()).unwrap_err();
        assert!(error.contains("one is not two"), "{error}");
    }

    #[test]
    fn semver_helpers_follow_upstreams_tests() {
        // common/src/semverhandler.rs's own tests.
        let cases = [
            ("1.2.3", "inc_major", "2.0.0"),
            ("1.2.3", "inc_minor", "1.3.0"),
            ("1.2.3", "inc_patch", "1.2.4"),
            ("1.2.3-beta.1", "inc_patch", "1.2.3"),
            ("1.2.3", "inc_beta", "1.2.4-beta.1"),
            ("1.2.4-beta.1", "inc_beta", "1.2.4-beta.2"),
            ("1.2.3", "inc_alpha", "1.2.4-alpha.1"),
            ("1.2.4-alpha.2", "inc_alpha", "1.2.4-alpha.3"),
            ("v1.2.3", "inc_patch", "v1.2.4"),
        ];
        for (from, step, to) in cases {
            let got = value(&format!(r#"{{ let v = semver_from("{from}"); v.{step}(); v.to_string() }}"#));
            assert_eq!(got, to, "{from}.{step}()");
        }
        assert_eq!(value(r#"semver_from("1.2.3") < semver_from("1.2.4")"#), true);
        assert_eq!(value(r#"semver_from("2.0.0") > semver_from("1.99.99")"#), true);
        assert_eq!(value(r#"semver_from("v1.2.3") < semver_from("2.0.0")"#), true);
        assert_eq!(value(r#"semver_from("1.2.3-alpha.1") < semver_from("1.2.3")"#), true);
        assert_eq!(value(r#"semver_from("1.2.3") == semver_from("1.2.3")"#), true);
        for bad in ["not-semver", "1.2", ""] {
            assert!(
                values(&format!(r#"#{{ v: semver_from("{bad}") }}"#), json!({}), Given::default()).is_err()
            );
        }
    }

    #[test]
    fn instance_accessors_read_the_instance_as_upstream_does() {
        // common/src/tools.rs: status.tfstate/rhaistate are gzip+base64; the
        // text is upstream's own round-trip case, encoded by Python's gzip.
        let state = "H4sIAKdQEWsC/8tIzcnJVyjPL8pJ4SrOz01VqEzMzbHiUlDITq20UihLzClN5QIAVVapaiQAAAA=";
        let instance = json!({
            "metadata": {"name": "web", "namespace": "apps"},
            "spec": {"options": {"a": 1}},
            "status": {"rhaistate": state, "services": [{"key": "b"}, {"key": "a"}]},
        });
        let out = values(
            "#{ digest: instance.options_digest(), rhai: instance.get_rhaistate(), \
               tf: instance.get_tfstate(), services: instance.get_services() }",
            instance,
            Given::default(),
        )
        .unwrap();
        // sha256 of the compact JSON `{"a":1}` (sha256sum), as upstream's get_options_digest.
        assert_eq!(out["digest"], "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862");
        assert_eq!(out["rhai"], "hello world\nsome yaml:\n  key: value\n");
        assert_eq!(out["tf"], Value::Null, "no tfstate: unit");
        assert_eq!(out["services"], "a,b", "sorted keys joined by commas (get_services_string)");
        let none =
            values("#{ d: instance.options_digest() }", json!({"spec": {}}), Given::default()).unwrap();
        assert_eq!(none["d"], "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    fn object(kind: &str, namespace: &str, name: &str, services: &[&str]) -> Arc<DynamicObject> {
        let services: Vec<Value> = services.iter().map(|k| json!({"key": k})).collect();
        let value = json!({
            "apiVersion": "vynil.solidite.fr/v1", "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"category": "c", "package": name},
            "status": {"services": services},
        });
        Arc::new(serde_json::from_value(value).unwrap())
    }

    #[test]
    fn tenant_and_instance_helpers_answer_from_the_gathered_facts() {
        let cluster = Cluster {
            namespace: "apps".into(),
            tenant_name: "acme".into(),
            tenant_namespaces: vec!["apps".into(), "apps-db".into()],
            tenants: vec![
                object("TenantInstance", "apps-db", "pg", &["postgres"]),
                object("TenantInstance", "apps", "web", &["http"]),
                object("TenantInstance", "other", "x", &["elsewhere"]),
            ],
            services: vec![object("ServiceInstance", "infra", "s3", &["s3", "minio"])],
            systems: vec![object("SystemInstance", "vynil-system", "vynil", &[])],
        };
        let given = Given { cluster: Some(Arc::new(cluster)), vynil_version: String::new(), reads: None };
        let instance = json!({"metadata": {"name": "web", "namespace": "apps"}});
        let out = values(
            r#"#{ tenant: instance.get_tenant_name(), namespaces: instance.get_tenant_namespaces(),
                  services: instance.get_tenant_services_names(),
                  pg: get_tenant_instance("apps-db", "pg").metadata.name,
                  listed: list_tenant_instance("apps").map(|i| i.metadata.name),
                  system: get_system_instance("vynil-system", "vynil").kind,
                  all: list_services_names() }"#,
            instance.clone(),
            given.clone(),
        )
        .unwrap();
        assert_eq!(out["tenant"], "acme");
        assert_eq!(out["namespaces"], json!(["apps", "apps-db"]));
        assert_eq!(out["services"], json!(["http", "postgres"]));
        assert_eq!(out["pg"], "pg");
        assert_eq!(out["listed"], json!(["web"]));
        assert_eq!(out["system"], "SystemInstance");
        assert_eq!(out["all"], json!(["minio", "s3"]));
        let missing =
            values(r#"#{ x: get_tenant_instance("apps", "nope") }"#, instance.clone(), given.clone());
        assert!(missing.unwrap_err().contains("no tenant instance apps/nope"));
        let unknown = values("#{ t: instance.get_tenant_name() }", instance, Given::default()).unwrap_err();
        assert!(unknown.contains("get_tenant_name") && unknown.contains("not known"), "{unknown}");
    }

    #[test]
    fn a_refused_helper_names_itself_and_why() {
        let cases = [
            ("gen_password(16)", "gen_password", "changes at every call"),
            ("date_now()", "date_now", "changes at every call"),
            (r#"file_read("/etc/passwd")"#, "file_read", "files"),
            (r#"get_env("VYNIL_TOKEN")"#, "get_env", "environment"),
            (r#"shell_output("id")"#, "shell_output", "runs a command"),
            ("new_http_client()", "new_http_client", "network"),
            (r#"new_k8s_raw().get_url("/api/v1/secrets")"#, "new_k8s_raw", "Secrets included"),
            ("date_now().format(\"%Y\")", "date_now", "changes at every call"),
            (r#"instance.set_status_ready("1.0.0")"#, "set_status_ready", "writes"),
        ];
        for (call, name, why) in cases {
            let error = values(&format!("#{{ v: {call} }}"), json!({}), Given::default()).unwrap_err();
            assert!(error.contains(&format!("`{name}`")) && error.contains(why), "{call}: {error}");
        }
        // Inside a script function too.
        let error =
            values("fn pw() { gen_password(8) } #{ v: pw() }", json!({}), Given::default()).unwrap_err();
        assert!(error.contains("`gen_password`"), "{error}");
        // A name upstream does not have either keeps Rhai's message.
        let error = values("#{ v: gpu_count() }", json!({}), Given::default()).unwrap_err();
        assert!(error.contains("gpu_count") && !error.contains("upstream"), "{error}");
    }

    async fn read(given: &Given, source: &str) -> Result<Value, String> {
        let (given, source) = (given.clone(), format!("#{{ v: {source} }}"));
        let text = off_the_runtime(move || {
            Host::new(json!({}), ScriptLimits::default(), given).controller_values(Some(&source))
        })
        .await??;
        let out: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        Ok(out["v"].clone())
    }

    #[tokio::test]
    async fn kubernetes_reads_go_through_lifecycles_client_bounded_and_never_to_secrets() {
        use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap, core::v1::Secret};
        use kube::api::PostParams;
        let api = vynil_testkit::kube_api::FakeApiServer::start().await.unwrap();
        api.create_namespaces(&["apps", "vynil-system"]).unwrap();
        let client = api.client().unwrap();
        let config: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "settings",
            "namespace": "apps", "labels": {"tier": "db"}}, "data": {"mode": "fast"}}))
        .unwrap();
        Api::<ConfigMap>::namespaced(client.clone(), "apps")
            .create(&PostParams::default(), &config)
            .await
            .unwrap();
        let secret: Secret =
            serde_json::from_value(json!({"metadata": {"name": "token", "namespace": "apps"},
            "stringData": {"token": "s3cret"}}))
            .unwrap();
        Api::<Secret>::namespaced(client.clone(), "apps")
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let web: Deployment = serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "apps"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "web"}]}}}}))
        .unwrap();
        Api::<Deployment>::namespaced(client.clone(), "apps")
            .create(&PostParams::default(), &web)
            .await
            .unwrap();
        let given = Given { reads: Reads::here(client), ..Given::default() };

        // core/src/k8s.rs: a kind by name or plural, any case; exist() says whether it is served.
        assert_eq!(
            read(&given, r#"k8s_resource("ConfigMap", "apps").get("settings").data.mode"#).await.unwrap(),
            "fast"
        );
        assert_eq!(
            read(&given, r#"k8s_resource("configmaps", "apps").list().items.len()"#).await.unwrap(),
            1
        );
        assert_eq!(
            read(&given, r#"k8s_resource("ConfigMap", "apps").list("tier=web").items.len()"#).await.unwrap(),
            0
        );
        assert_eq!(
            read(&given, r#"k8s_resource("ConfigMap", "apps").get_obj("settings").kind"#).await.unwrap(),
            "ConfigMap"
        );
        assert_eq!(
            read(&given, r#"k8s_resource("ConfigMap", "apps").get_meta("settings").metadata.labels.tier"#)
                .await
                .unwrap(),
            "db"
        );
        assert_eq!(read(&given, r#"k8s_resource("Nothing").exist()"#).await.unwrap(), false);
        assert_eq!(read(&given, r#"k8s_resource("Namespace").scope"#).await.unwrap(), "cluster");
        assert_eq!(
            read(&given, r#"k8s_resource("apps/v1", "Deployment", "apps").scope"#).await.unwrap(),
            "namespace"
        );
        // core/src/k8sworkload.rs.
        assert_eq!(read(&given, r#"get_deployment("apps", "web").spec.replicas"#).await.unwrap(), 2);
        let missing = read(&given, r#"get_deployment("apps", "nope")"#).await.unwrap_err();
        assert!(missing.contains("get_deployment"), "{missing}");
        // Never a Secret, whichever way it is named.
        for call in [
            r#"k8s_resource("Secret", "apps").get("token")"#,
            r#"k8s_resource("v1", "secrets", "apps").list()"#,
        ] {
            let refused = read(&given, call).await.unwrap_err();
            assert!(refused.contains("Secrets are never read"), "{call}: {refused}");
        }
        // Bounded: a loop of reads stops at the limit and says so.
        let many = format!(r#"{{ for i in 0..{} {{ get_deployment("apps", "web"); }} 1 }}"#, MAX_READS + 4);
        let stopped = read(&given, &many).await.unwrap_err();
        assert!(stopped.contains(&format!("over {MAX_READS} Kubernetes reads")), "{stopped}");
        // On the runtime itself a read is an error, not a deadlock or a panic.
        let host = Host::new(json!({}), ScriptLimits::default(), given.clone());
        let error = host.controller_values(Some(r#"#{ v: get_deployment("apps", "web") }"#)).unwrap_err();
        assert!(error.contains("outside off_the_runtime"), "{error}");
    }

    /// The names `upstream-facts.md` lists for `Script::new` (sebt3/vynil
    /// 72bc059), transcribed: each has a verdict, and `docs/lifecycle.md`
    /// shows it.
    const LISTED: &str = "base64_encode basename create_dir dirname file_copy file_read \
        file_write get_env is_dir is_file json_decode json_encode json_encode_escape log_debug log_error \
        log_info log_warn read_dir sha256 to_decimal url_encode date_now format bcrypt_hash crc32_hash hash \
        new_argon inc_alpha inc_beta inc_major inc_minor inc_patch semver_from to_string yaml_decode \
        yaml_encode gen_password gen_password_alphanum gen_private_key glob shell_output shell_run \
        add_header add_header_basic add_header_bearer add_header_json delete get head headers_reset \
        http_get_yaml new_http_client patch post put set_baseurl set_mtls_cert_key set_server_ca \
        get_auth_from_file get_manifest list_tags new_registry push_image sign_image s3_get_yaml \
        s3_list_keys apply create data delete exist get get_api_resources get_cluster_version \
        get_deamonset get_deployment get_job get_meta get_obj get_statefulset get_url k8s_resource kind \
        list list_meta metadata new_k8s_raw original_kind patch replace scope spec status \
        update_k8s_crd_cache wait_available wait_condition wait_deleted wait_done wait_status \
        wait_status_prop wait_status_string contains is_empty keys len to_string values \
        yaml_encode_ordered new_hbs get_rhaistate get_services get_tenant_instance get_tenant_name \
        get_tfstate list_tenant_instance metadata options_digest spec status get_jukebox list_jukebox \
        images metadata options read_package_yaml recommandations requirements resources \
        validate_options value_script vynil_version";

    #[test]
    fn every_upstream_helper_has_one_verdict_and_a_row_in_the_docs() {
        let docs =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/lifecycle.md")).unwrap();
        for name in LISTED.split_whitespace() {
            assert!(UPSTREAM.iter().any(|(n, _, _)| *n == name), "{name} has no verdict");
        }
        for (i, (name, _, verdict)) in UPSTREAM.iter().enumerate() {
            assert!(UPSTREAM[..i].iter().all(|(n, _, _)| n != name), "{name} twice");
            let word = match verdict {
                Same => "same".to_string(),
                Differs(_) => "same name".to_string(),
                Refused(why) => format!("refused: {}", why.why()),
            };
            let row = docs.lines().find(|l| l.starts_with(&format!("| `{name}` |")));
            let row = row.unwrap_or_else(|| panic!("docs/lifecycle.md has no row for `{name}`"));
            assert!(row.contains(&word), "the row of `{name}` must say {word:?}: {row}");
        }
    }
}
