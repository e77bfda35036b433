//! What an install needs besides the revision: the options check, the
//! requirements and recommendations, and the fingerprint that decides re-runs.
//!
//! - **Options** (`spec.options`) are checked against the revision's option
//!   schema (`fr.solidite.vynil.options`, a map option → OpenAPI-ish schema)
//!   before any Job: a value of the wrong type blocks, naming the option and
//!   the expected type; a key the schema does not declare is dropped with a
//!   warning, as upstream's agent drops it (silently there).
//! - **Options hash**: upstream's `status.digest`, sha256 hex of the JSON of
//!   `spec.options` (of `""` when absent), sent to the agent as `OPTIONS_HASH`.
//! - **Requirements** in list order, first failure wins, with upstream's
//!   messages and retry delays (`docs/upstream-vynil.md` §5.4 step 7). The
//!   cluster is asked through [`ClusterFacts`]; `prefly` is evaluated by the
//!   caller (this crate runs no script) and reported back.
//! - **Fingerprint** of (revision, options hash, controller values,
//!   recommendations): the agent Job re-runs exactly when it changes, never on
//!   a Job immutability error as upstream does.

use std::time::Duration;

use semver::Version;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::{
    channel::framework_shortfall,
    package::{ClusterVersion, PackageContent, PackageRef, PackageType, Prefly, Recommandation, Requirement},
};

/// Retry delay after a requirement that may be met soon (a CRD, a `prefly`).
pub const RETRY_SHORT: Duration = Duration::from_secs(300);
/// Retry delay after the other requirements, a missing JukeBox or package.
pub const RETRY_LONG: Duration = Duration::from_secs(900);

/// Upstream's own control plane, as its bootstrap installs it: the package
/// `core/vynil` (SystemInstance `vynil-system/vynil`), or any instance whose
/// recorded CRDs include one of Vynil's own (`*.vynil.solidite.fr`), whatever
/// it was renamed to. Its package ships upstream's CRDs and operator: running
/// its agent (install, upgrade, reinstall or uninstall) would overwrite our
/// CRDs and bring upstream's controller back, and garbage collection of its
/// objects would take the `vynil-agent` ServiceAccount every agent Job runs
/// as. It is never acted on; it is held with a condition saying why.
pub fn is_upstream_control_plane(category: &str, package: &str, recorded_crds: &[String]) -> bool {
    (category == "core" && package == "vynil")
        || recorded_crds.iter().any(|crd| {
            crd.strip_suffix(".vynil.solidite.fr")
                .is_some_and(|plural| !plural.is_empty() && !plural.contains('.'))
        })
}

/// The code and message of the hold on upstream's control plane.
pub const CONTROL_PLANE_CODE: &str = "E_UPSTREAM_CONTROL_PLANE";

/// Why upstream's control-plane instance is held, and what to do.
pub fn control_plane_message(deleting: bool) -> String {
    let what = if deleting {
        "it is being deleted, but its package owns the vynil-agent ServiceAccount every agent Job runs as: its finalizer stays and no Job runs. Take the ownerReferences off the objects it shares (docs/migration.md, \"Removing upstream's control plane\"), then remove the finalizer by hand"
    } else {
        "its package ships upstream's CRDs and operator, which would replace this control plane: it is never installed, upgraded, reinstalled or uninstalled here. Keep it suspended (vynil.solidite.fr/suspend: \"true\") and never delete it (docs/migration.md)"
    };
    format!("[{CONTROL_PLANE_CODE}] upstream's own control plane (core/vynil): {what}")
}

/// Upstream's options hash: sha256 hex of the JSON of `spec.options`.
pub fn options_hash(options: Option<&Map<String, Value>>) -> String {
    let text = options.map(|o| Value::Object(o.clone()).to_string()).unwrap_or_default();
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// An option whose value does not have the type its schema declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionProblem {
    /// Dotted path, e.g. `storage.size` or `models[1]`.
    pub option: String,
    /// The schema's `type`.
    pub expected: String,
    /// The JSON type found.
    pub found: String,
}

impl std::fmt::Display for OptionProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "option `{}` must be of type {} but is {}: fix spec.options",
            self.option, self.expected, self.found
        )
    }
}

/// What the check kept out: keys the schema does not declare (dotted paths).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckedOptions {
    pub dropped: Vec<String>,
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(expected: &str, value: &Value) -> bool {
    match (expected, value) {
        // An explicit null is "not given": the agent uses the default.
        (_, Value::Null) => true,
        ("number", Value::Number(_)) => true,
        ("integer", Value::Number(n)) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        (expected, value) => {
            !matches!(expected, "boolean" | "integer" | "number" | "string" | "array" | "object")
                || json_type(value) == expected
        }
    }
}

fn check_value(
    path: &str,
    schema: &Value,
    value: &Value,
    checked: &mut CheckedOptions,
) -> Result<(), OptionProblem> {
    let declared = schema.get("type").and_then(Value::as_str);
    if let Some(expected) = declared
        && !type_matches(expected, value)
    {
        return Err(OptionProblem {
            option: path.to_string(),
            expected: expected.to_string(),
            found: json_type(value).to_string(),
        });
    }
    match value {
        Value::Object(map) => {
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                check_map(Some(path), properties, map, checked)?;
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check_value(&format!("{path}[{i}]"), item_schema, item, checked)?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn check_map(
    prefix: Option<&str>,
    schema: &Map<String, Value>,
    options: &Map<String, Value>,
    checked: &mut CheckedOptions,
) -> Result<(), OptionProblem> {
    for (key, value) in options {
        let path = match prefix {
            Some(prefix) => format!("{prefix}.{key}"),
            None => key.clone(),
        };
        match schema.get(key) {
            Some(option_schema) => check_value(&path, option_schema, value, checked)?,
            None => checked.dropped.push(path),
        }
    }
    Ok(())
}

/// Checks `options` against the revision's option `schema` (none declared:
/// every key is dropped).
pub fn check_options(
    schema: Option<&Map<String, Value>>,
    options: Option<&Map<String, Value>>,
) -> Result<CheckedOptions, OptionProblem> {
    let mut checked = CheckedOptions::default();
    if let Some(options) = options {
        check_map(None, schema.unwrap_or(&Map::new()), options, &mut checked)?;
    }
    Ok(checked)
}

/// What deciding an install of a revision asks of the cluster, so that a
/// reconcile gathers those facts and no others: most revisions ask nothing,
/// and an instance at rest is then reconciled without a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Asks {
    /// The API server's version (`cluster_version`).
    pub version: bool,
    /// The CRDs (a requirement or a recommendation).
    pub crds: bool,
    /// The instances and their tenant: packages and services required or
    /// recommended, and `prefly` (its scripts may read them).
    pub instances: bool,
}

impl Asks {
    /// What [`unmet_requirement`] and [`recommended`] consult for `content`.
    pub fn of(content: &PackageContent) -> Self {
        let mut asks = Self::default();
        for requirement in &content.requirements {
            match requirement {
                Requirement::ClusterVersion(_) => asks.version = true,
                Requirement::CustomResourceDefinition(_) => asks.crds = true,
                Requirement::SystemPackage(_)
                | Requirement::TenantPackage(_)
                | Requirement::SystemService(_)
                | Requirement::TenantService(_)
                | Requirement::Prefly(_) => asks.instances = true,
                _ => {}
            }
        }
        for item in content.recommandations.iter().flatten() {
            match item {
                Recommandation::CustomResourceDefinition(_) => asks.crds = true,
                Recommandation::SystemService(_) | Recommandation::TenantService(_) => asks.instances = true,
            }
        }
        asks
    }
}

/// What the cluster says, for requirements and recommendations. Lifecycle
/// answers from its watch caches; `prefly` is evaluated there (Rhai).
pub trait ClusterFacts {
    fn cluster_version(&self) -> ClusterVersion;
    fn has_crd(&self, name: &str) -> bool;
    /// Any SystemInstance of that category/package.
    fn has_system_package(&self, package: &PackageRef) -> bool;
    /// A TenantInstance of that category/package in the instance's tenant.
    fn has_tenant_package(&self, package: &PackageRef) -> bool;
    /// Published by any instance.
    fn has_system_service(&self, key: &str) -> bool;
    /// Published in the instance's tenant.
    fn has_tenant_service(&self, key: &str) -> bool;
    /// The `prefly` expression's truth, or why it could not be evaluated
    /// (a function we do not provide is named there).
    fn prefly(&self, prefly: &Prefly) -> Result<bool, String>;
}

/// A requirement the cluster does not meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmet {
    /// The requirement's wire key, e.g. `custom_resource_definition`.
    pub requirement: String,
    /// Upstream's message (the `AgentStarted=False` condition).
    pub message: String,
    pub retry_after: Duration,
}

/// The first requirement of `content` the cluster does not meet, in list
/// order. Tenant-only requirements pass for other kinds; `storage_capability`,
/// `minimum_previous_version` (a selection criterion), cpu, memory and disk
/// always pass, as upstream.
pub fn unmet_requirement(
    content: &PackageContent,
    kind: PackageType,
    framework: &Version,
    facts: &dyn ClusterFacts,
) -> Option<Unmet> {
    let unmet = |requirement: &Requirement, message: String, retry_after| Unmet {
        requirement: requirement.kind().to_string(),
        message,
        retry_after,
    };
    let tenant = kind == PackageType::Tenant;
    for requirement in &content.requirements {
        let failure = match requirement {
            Requirement::VynilVersion(_) => framework_shortfall(content, framework).map(|required| {
                let message = format!(
                    "Requested vynil version {required} is over current version {framework}. Please upgrade vynil first"
                );
                (message, RETRY_LONG)
            }),
            Requirement::ClusterVersion(wanted) => {
                let current = facts.cluster_version();
                ((current.major, current.minor) < (wanted.major, wanted.minor)).then(|| {
                    let message = format!(
                        "Requested cluster version {}.{} is over current version {}.{}. Please upgrade the cluster first",
                        wanted.major, wanted.minor, current.major, current.minor
                    );
                    (message, RETRY_LONG)
                })
            }
            Requirement::CustomResourceDefinition(crd) => {
                (!facts.has_crd(crd)).then(|| (format!("CRD {crd} is not installed"), RETRY_SHORT))
            }
            Requirement::Prefly(prefly) => match facts.prefly(prefly) {
                Ok(true) => None,
                Ok(false) => Some((format!("Requirement {} failed", prefly.name), RETRY_SHORT)),
                Err(why) => Some((format!("Requirement {} failed: {why}", prefly.name), RETRY_SHORT)),
            },
            Requirement::SystemPackage(p) => (!facts.has_system_package(p)).then(|| {
                (format!("System package {}/{} is not installed", p.category, p.name), RETRY_LONG)
            }),
            Requirement::TenantPackage(p) if tenant => (!facts.has_tenant_package(p)).then(|| {
                (format!("Tenant package {}/{} is not installed in this tenant", p.category, p.name), RETRY_LONG)
            }),
            Requirement::TenantService(key) if tenant => (!facts.has_tenant_service(key))
                .then(|| (format!("Tenant service {key} is not published in this tenant"), RETRY_LONG)),
            Requirement::SystemService(key) => {
                (!facts.has_system_service(key)).then(|| (format!("System service {key} is not published"), RETRY_LONG))
            }
            _ => None,
        };
        if let Some((message, retry_after)) = failure {
            return Some(unmet(requirement, message, retry_after));
        }
    }
    None
}

/// `RECOMMANDED_*` of the agent Job: recommended CRDs and services that
/// exist, each list sorted and comma-joined (tenant services only for tenants).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recommended {
    pub crds: String,
    pub system_services: String,
    pub tenant_services: String,
}

/// What of `content`'s recommendations the cluster has.
pub fn recommended(content: &PackageContent, kind: PackageType, facts: &dyn ClusterFacts) -> Recommended {
    let (mut crds, mut system, mut tenant) = (Vec::new(), Vec::new(), Vec::new());
    for item in content.recommandations.iter().flatten() {
        match item {
            Recommandation::CustomResourceDefinition(c) if facts.has_crd(c) => crds.push(c.as_str()),
            Recommandation::SystemService(s) if facts.has_system_service(s) => system.push(s.as_str()),
            Recommandation::TenantService(s)
                if kind == PackageType::Tenant && facts.has_tenant_service(s) =>
            {
                tenant.push(s.as_str())
            }
            _ => {}
        }
    }
    let join = |mut v: Vec<&str>| {
        v.sort_unstable();
        v.dedup();
        v.join(",")
    };
    Recommended { crds: join(crds), system_services: join(system), tenant_services: join(tenant) }
}

/// The revision an agent Job installs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    pub registry: &'a str,
    pub image: &'a str,
    pub tag: &'a str,
    /// The manifest digest, when the catalog knows it.
    pub digest: Option<&'a str>,
}

/// Fingerprint of everything that makes an agent run differ: the revision,
/// the options hash, the controller values (JSON text) and the recommendations.
/// 16 bytes of sha256 over length-prefixed fields, as hex.
pub fn fingerprint(
    target: &Target,
    options_hash: &str,
    controller_values: &str,
    recommended: &Recommended,
) -> String {
    fingerprint_with_agent(target, options_hash, controller_values, recommended, None)
}

/// [`fingerprint`], with the agent image as one more input when `agent_image`
/// is given (upstream re-runs every install when `AGENT_IMAGE` changes; an
/// opt-in here). `None` gives exactly [`fingerprint`].
pub fn fingerprint_with_agent(
    target: &Target,
    options_hash: &str,
    controller_values: &str,
    recommended: &Recommended,
    agent_image: Option<&str>,
) -> String {
    let mut hasher = Sha256::new();
    if let Some(image) = agent_image {
        hasher.update(b"agent-image");
        hasher.update((image.len() as u64).to_be_bytes());
        hasher.update(image.as_bytes());
    }
    let fields = [
        target.registry,
        target.image,
        target.tag,
        target.digest.unwrap_or(""),
        options_hash,
        controller_values,
        &recommended.crds,
        &recommended.system_services,
        &recommended.tenant_services,
    ];
    for field in fields {
        hasher.update((field.len() as u64).to_be_bytes());
        hasher.update(field.as_bytes());
    }
    hex::encode(&hasher.finalize()[..16])
}

#[cfg(test)]
mod control_plane_tests {
    use super::*;

    #[test]
    fn upstreams_control_plane_is_its_package_or_any_instance_recording_vynils_crds() {
        let none: &[String] = &[];
        assert!(is_upstream_control_plane("core", "vynil", none));
        let crds = ["jukeboxes.vynil.solidite.fr".to_string()];
        assert!(is_upstream_control_plane("mine", "renamed", &crds));
        assert!(!is_upstream_control_plane("core", "vynil-extra", none));
        assert!(!is_upstream_control_plane("apps", "vynil", none));
        let others = ["certificates.cert-manager.io".to_string(), "x.sub.vynil.solidite.fr".to_string()];
        assert!(!is_upstream_control_plane("apps", "web", &others));
        assert!(control_plane_message(true).starts_with("[E_UPSTREAM_CONTROL_PLANE]"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn the_options_hash_is_upstreams_sha256_of_the_options_json() {
        // sha256("") for absent options, as upstream's agent writes `status.digest`.
        assert_eq!(options_hash(None), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        // sha256 of the compact JSON text `{"a":1}` (computed independently with sha256sum).
        assert_eq!(
            options_hash(Some(&map(json!({"a": 1})))),
            "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"
        );
    }

    #[test]
    fn options_of_the_wrong_type_block_and_name_the_option_and_the_type() {
        let schema = map(json!({
            "use_rocm": {"type": "boolean", "default": false},
            "models": {"type": "array", "items": {"type": "string"}},
            "storage": {"type": "object", "properties": {"size": {"type": "string"}, "replicas": {"type": "integer"}}},
            "ratio": {"type": "number"},
        }));
        let table = [
            (json!({"use_rocm": "yes"}), Some(("use_rocm", "boolean", "string"))),
            (json!({"models": ["a", 3]}), Some(("models[1]", "string", "integer"))),
            (json!({"storage": {"replicas": 1.5}}), Some(("storage.replicas", "integer", "number"))),
            (json!({"storage": "big"}), Some(("storage", "object", "string"))),
            (json!({"ratio": 2}), None),
            (json!({"use_rocm": null}), None),
            (json!({"use_rocm": true, "models": ["a"], "storage": {"size": "1Gi", "replicas": 2}}), None),
        ];
        for (options, expected) in table {
            let got = check_options(Some(&schema), Some(&map(options.clone())));
            match expected {
                None => assert!(got.is_ok(), "{options}: {got:?}"),
                Some((option, expected, found)) => {
                    let problem = got.expect_err(&options.to_string());
                    assert_eq!(
                        (problem.option.as_str(), problem.expected.as_str(), problem.found.as_str()),
                        (option, expected, found)
                    );
                    assert!(problem.to_string().contains(option), "{problem}");
                }
            }
        }
    }

    #[test]
    fn undeclared_keys_are_dropped_not_blocking_at_every_depth() {
        let schema = map(json!({"storage": {"type": "object", "properties": {"size": {"type": "string"}}}}));
        let options = map(json!({"colour": "red", "storage": {"size": "1Gi", "class": "fast"}}));
        let checked = check_options(Some(&schema), Some(&options)).unwrap();
        assert_eq!(checked.dropped, ["colour", "storage.class"]);
        let none = check_options(None, Some(&map(json!({"x": 1})))).unwrap();
        assert_eq!(none.dropped, ["x"]);
        assert_eq!(check_options(Some(&schema), None).unwrap(), CheckedOptions::default());
    }

    struct Facts {
        crds: Vec<&'static str>,
        version: ClusterVersion,
        services: Vec<&'static str>,
        prefly: Result<bool, String>,
    }

    impl ClusterFacts for Facts {
        fn cluster_version(&self) -> ClusterVersion {
            self.version
        }
        fn has_crd(&self, name: &str) -> bool {
            self.crds.contains(&name)
        }
        fn has_system_package(&self, p: &PackageRef) -> bool {
            p.name == "present"
        }
        fn has_tenant_package(&self, p: &PackageRef) -> bool {
            p.name == "present"
        }
        fn has_system_service(&self, key: &str) -> bool {
            self.services.contains(&key)
        }
        fn has_tenant_service(&self, key: &str) -> bool {
            self.services.contains(&key)
        }
        fn prefly(&self, _: &Prefly) -> Result<bool, String> {
            self.prefly.clone()
        }
    }

    fn facts() -> Facts {
        Facts {
            crds: vec!["present.example.io"],
            version: ClusterVersion { major: 1, minor: 30 },
            services: vec!["sso"],
            prefly: Ok(true),
        }
    }

    fn requiring(requirements: Vec<Requirement>) -> PackageContent {
        requirements
            .into_iter()
            .fold(PackageContent::minimal("apps", "x", PackageType::Tenant), PackageContent::requiring)
    }

    #[test]
    fn requirements_fail_with_upstreams_messages_and_delays() {
        let framework = Version::new(0, 7, 7);
        let table = [
            (Requirement::CustomResourceDefinition("x.y".into()), "CRD x.y is not installed", RETRY_SHORT),
            (
                Requirement::VynilVersion("0.8.0".into()),
                "Requested vynil version 0.8.0 is over current version 0.7.7. Please upgrade vynil first",
                RETRY_LONG,
            ),
            (
                Requirement::Prefly(Prefly { script: "false".into(), name: "gpu".into() }),
                "Requirement gpu failed",
                RETRY_SHORT,
            ),
        ];
        let mut f = facts();
        f.prefly = Ok(false);
        for (requirement, message, delay) in table {
            let unmet = unmet_requirement(&requiring(vec![requirement]), PackageType::Tenant, &framework, &f)
                .expect(message);
            assert_eq!((unmet.message.as_str(), unmet.retry_after), (message, delay));
        }
        let cluster = Requirement::ClusterVersion(ClusterVersion { major: 1, minor: 31 });
        let unmet =
            unmet_requirement(&requiring(vec![cluster]), PackageType::Tenant, &framework, &f).unwrap();
        assert!(unmet.message.contains("1.31") && unmet.message.contains("1.30"), "{}", unmet.message);
    }

    #[test]
    fn the_first_failure_in_list_order_wins_and_met_requirements_pass() {
        let framework = Version::new(0, 7, 7);
        let content = requiring(vec![
            Requirement::CustomResourceDefinition("present.example.io".into()),
            Requirement::ClusterVersion(ClusterVersion { major: 1, minor: 28 }),
            Requirement::SystemService("sso".into()),
            Requirement::Memory(4096),
            Requirement::CustomResourceDefinition("absent.example.io".into()),
            Requirement::SystemService("absent".into()),
        ]);
        let unmet = unmet_requirement(&content, PackageType::Tenant, &framework, &facts()).unwrap();
        assert_eq!(unmet.message, "CRD absent.example.io is not installed");
        assert_eq!(unmet.requirement, "custom_resource_definition");
        let met = requiring(vec![Requirement::CustomResourceDefinition("present.example.io".into())]);
        assert_eq!(unmet_requirement(&met, PackageType::Tenant, &framework, &facts()), None);
    }

    #[test]
    fn tenant_only_requirements_pass_for_other_kinds_and_a_script_error_is_named() {
        let framework = Version::new(0, 7, 7);
        let content = requiring(vec![Requirement::TenantService("absent".into())]);
        assert!(unmet_requirement(&content, PackageType::Tenant, &framework, &facts()).is_some());
        assert_eq!(unmet_requirement(&content, PackageType::Service, &framework, &facts()), None);
        let mut f = facts();
        f.prefly = Err("Function not found: gpu_count ()".into());
        let prefly = requiring(vec![Requirement::Prefly(Prefly {
            script: "gpu_count() > 0".into(),
            name: "gpu".into(),
        })]);
        let unmet = unmet_requirement(&prefly, PackageType::Tenant, &framework, &f).unwrap();
        assert!(unmet.message.contains("gpu_count"), "{}", unmet.message);
    }

    #[test]
    fn recommendations_list_what_exists_sorted_and_tenant_services_only_for_tenants() {
        let mut content = PackageContent::minimal("apps", "x", PackageType::Tenant);
        content.recommandations = Some(vec![
            Recommandation::TenantService("sso".into()),
            Recommandation::CustomResourceDefinition("present.example.io".into()),
            Recommandation::CustomResourceDefinition("absent.example.io".into()),
            Recommandation::SystemService("sso".into()),
        ]);
        let tenant = recommended(&content, PackageType::Tenant, &facts());
        assert_eq!(
            tenant,
            Recommended {
                crds: "present.example.io".into(),
                system_services: "sso".into(),
                tenant_services: "sso".into()
            }
        );
        assert_eq!(recommended(&content, PackageType::Service, &facts()).tenant_services, "");
    }

    #[test]
    fn the_fingerprint_moves_with_each_input_and_only_with_them() {
        let target = Target { registry: "r", image: "i", tag: "1.0.0", digest: Some("sha256:a") };
        let base = fingerprint(&target, "h", "{}", &Recommended::default());
        assert_eq!(base, fingerprint(&target.clone(), "h", "{}", &Recommended::default()));
        let changed = [
            fingerprint(&Target { tag: "1.0.1", ..target.clone() }, "h", "{}", &Recommended::default()),
            fingerprint(
                &Target { digest: Some("sha256:b"), ..target.clone() },
                "h",
                "{}",
                &Recommended::default(),
            ),
            fingerprint(&target, "h2", "{}", &Recommended::default()),
            fingerprint(&target, "h", "{\"a\":1}", &Recommended::default()),
            fingerprint(&target, "h", "{}", &Recommended { crds: "x".into(), ..Recommended::default() }),
        ];
        for other in changed {
            assert_ne!(base, other);
        }
        // Field boundaries count: "ab"+"c" differs from "a"+"bc".
        let a = fingerprint(
            &Target { registry: "ab", image: "c", ..target.clone() },
            "h",
            "{}",
            &Recommended::default(),
        );
        let b = fingerprint(
            &Target { registry: "a", image: "bc", ..target.clone() },
            "h",
            "{}",
            &Recommended::default(),
        );
        assert_ne!(a, b);
    }
}
