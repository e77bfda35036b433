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

mod reads;
mod register;
mod table;

pub use register::register;
pub use table::refusal;

type Res<T> = Result<T, Box<EvalAltResult>>;

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
    /// Where namespaced objects may be read (`reads::Session::may_read`).
    namespaces: Arc<std::collections::BTreeSet<String>>,
}

impl std::fmt::Debug for Reads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reads").finish_non_exhaustive()
    }
}

impl Reads {
    /// Reads in `namespaces` (and of the cluster-scoped kinds upstream's
    /// helpers read) through `client`; `None` outside a Tokio runtime.
    pub fn here(client: kube::Client, namespaces: impl IntoIterator<Item = String>) -> Option<Self> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        Some(Self { client, runtime, namespaces: Arc::new(namespaces.into_iter().collect()) })
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
        self.may_read(&resource.kind, capabilities.scope == Scope::Cluster, namespace)?;
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

#[cfg(test)]
mod tests {
    //! Expected values are upstream's: its own tests where it has them (the
    //! file named), else the standard vectors of the algorithm upstream
    //! calls, computed outside this code (sha256sum, Python's zlib, gzip and
    //! urllib).
    use super::*;
    use crate::script::Host;
    use serde_json::json;
    use table::{
        UPSTREAM,
        Verdict::{Differs, Refused, Same},
    };
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
        let given = Given { reads: Reads::here(client, ["apps".to_string()]), ..Given::default() };

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
