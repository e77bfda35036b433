//! Every upstream helper's verdict here, the table `docs/lifecycle.md` shows: offered with upstream's semantics, offered with a difference said, or refused with the reason a script calling it reads.

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
