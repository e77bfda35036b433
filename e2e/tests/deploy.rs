//! `deploy/` as a cluster would receive it: the base and the overlays
//! rendered by `kubectl kustomize`, every object parsed into its
//! `k8s-openapi` type, the CRDs equal to `crdgen`'s, every container locked
//! down with limits, the NetworkPolicies allowing exactly the calls `docs/architecture.md` draws,
//! and the Dockerfile building binaries that exist.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, StatefulSet},
        core::v1::{Container, Namespace, PodSpec, Service, ServiceAccount},
        networking::v1::NetworkPolicy,
        policy::v1::PodDisruptionBudget,
        rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `kubectl kustomize <dir>`, as objects.
fn render(dir: &str) -> Vec<Value> {
    let output = Command::new("kubectl")
        .args(["kustomize", &root().join("deploy").join(dir).display().to_string()])
        .output()
        .unwrap_or_else(|e| {
            panic!("kubectl is missing ({e}): apt-get install -y kubernetes-client (scripts/test.sh does)")
        });
    assert!(output.status.success(), "{dir}: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde_json::to_value(serde_yaml_ng::Value::deserialize(doc).unwrap()).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

use serde::Deserialize;

/// Parses `object` into the type its kind names; a kind we do not know fails.
fn typed(object: &Value) -> Option<PodSpec> {
    let kind = object["kind"].as_str().unwrap();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let parse = |what: &str| panic!("{kind} {name} is not a valid {what}");
    macro_rules! check {
        ($type:ty) => {
            serde_json::from_value::<$type>(object.clone()).unwrap_or_else(|e| {
                parse(&format!("{}: {e}", stringify!($type)));
                unreachable!()
            })
        };
    }
    match kind {
        "Deployment" => check!(Deployment).spec.template.spec,
        "StatefulSet" => check!(StatefulSet).spec.template.spec,
        "Namespace" => {
            check!(Namespace);
            None
        }
        "Service" => {
            check!(Service);
            None
        }
        "ServiceAccount" => {
            check!(ServiceAccount);
            None
        }
        "ClusterRole" => {
            check!(ClusterRole);
            None
        }
        "ClusterRoleBinding" => {
            check!(ClusterRoleBinding);
            None
        }
        "Role" => {
            check!(Role);
            None
        }
        "RoleBinding" => {
            check!(RoleBinding);
            None
        }
        "NetworkPolicy" => {
            check!(NetworkPolicy);
            None
        }
        "PodDisruptionBudget" => {
            check!(PodDisruptionBudget);
            None
        }
        "CustomResourceDefinition" => {
            check!(CustomResourceDefinition);
            None
        }
        other => panic!("{other} {name}: a kind this test does not know; add it"),
    }
}

fn locked_down(owner: &str, container: &Container) {
    let security =
        container.security_context.as_ref().unwrap_or_else(|| panic!("{owner}: no securityContext"));
    assert_eq!(security.run_as_non_root, Some(true), "{owner}: runAsNonRoot");
    assert_eq!(security.read_only_root_filesystem, Some(true), "{owner}: readOnlyRootFilesystem");
    assert_eq!(security.allow_privilege_escalation, Some(false), "{owner}: allowPrivilegeEscalation");
    let dropped = security.capabilities.as_ref().and_then(|c| c.drop.clone()).unwrap_or_default();
    assert_eq!(dropped, ["ALL"], "{owner}: capabilities dropped");
    let seccomp = security.seccomp_profile.as_ref().map(|s| s.type_.as_str());
    assert_eq!(seccomp, Some("RuntimeDefault"), "{owner}: seccomp");
    let resources = container.resources.as_ref().unwrap_or_else(|| panic!("{owner}: no resources"));
    for what in ["cpu", "memory"] {
        assert!(resources.limits.as_ref().is_some_and(|l| l.contains_key(what)), "{owner}: {what} limit");
        assert!(resources.requests.as_ref().is_some_and(|r| r.contains_key(what)), "{owner}: {what} request");
    }
    assert!(container.readiness_probe.is_some() && container.liveness_probe.is_some(), "{owner}: probes");
}

/// `value` with every number as a float: YAML writers differ on `65535` vs `65535.0`.
fn numbers_as_floats(value: &Value) -> Value {
    match value {
        Value::Number(n) => n.as_f64().map(Value::from).unwrap_or(Value::Null),
        Value::Array(items) => Value::Array(items.iter().map(numbers_as_floats).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), numbers_as_floats(v))).collect())
        }
        other => other.clone(),
    }
}

fn name_label(selector: &Value) -> Option<String> {
    selector["matchLabels"]["app.kubernetes.io/name"].as_str().map(String::from)
}

#[test]
fn the_base_and_every_overlay_render_into_valid_locked_down_objects() {
    let crds: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&vynil_crds::crds_yaml().unwrap())
        .map(|doc| serde_json::to_value(serde_yaml_ng::Value::deserialize(doc).unwrap()).unwrap())
        .filter(|v| !v.is_null())
        .collect();
    for dir in
        ["base", "overlays/single", "overlays/ha", "overlays/namespaced-agent", "overlays/redis-sentinel"]
    {
        let objects = render(dir);
        let mut deployments = BTreeMap::new();
        for object in &objects {
            let kind = object["kind"].as_str().unwrap();
            let name = object["metadata"]["name"].as_str().unwrap().to_string();
            if let Some(pod) = typed(object) {
                for container in &pod.containers {
                    locked_down(&format!("{dir}: {kind} {name}/{}", container.name), container);
                }
                assert_eq!(
                    pod.security_context.and_then(|s| s.run_as_non_root),
                    Some(true),
                    "{dir}: {name} pod"
                );
                if kind == "Deployment" {
                    deployments.insert(name.clone(), object["spec"]["replicas"].as_i64().unwrap_or(1));
                }
            }
            let namespaced = !["Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"]
                .contains(&kind);
            // The narrower agent's rights are bound in the tenants' namespaces.
            let tenant_binding =
                kind == "RoleBinding" && object["roleRef"]["name"] == "vynil-agent-namespaced";
            if namespaced && !tenant_binding {
                assert_eq!(object["metadata"]["namespace"], "vynil-system", "{dir}: {kind} {name}");
            }
        }
        // The CRDs are crdgen's (kustomize only adds the common label).
        let rendered: Vec<&Value> =
            objects.iter().filter(|o| o["kind"] == "CustomResourceDefinition").collect();
        assert_eq!(rendered.len(), crds.len(), "{dir}");
        for crd in &crds {
            let found = rendered.iter().find(|r| r["metadata"]["name"] == crd["metadata"]["name"]).unwrap();
            let (found, expected) = (numbers_as_floats(&found["spec"]), numbers_as_floats(&crd["spec"]));
            assert!(found == expected, "{dir}: {} differs from crdgen's", crd["metadata"]["name"]);
        }
        let services: BTreeSet<&str> = deployments.keys().map(String::as_str).collect();
        assert_eq!(
            services,
            BTreeSet::from([
                "vynil-catalog",
                "vynil-gateway",
                "vynil-lifecycle",
                "vynil-purger",
                "vynil-scanner"
            ])
        );
        if dir == "overlays/ha" || dir == "overlays/redis-sentinel" {
            let expected = BTreeMap::from([
                ("vynil-catalog".to_string(), 3),
                ("vynil-gateway".to_string(), 2),
                ("vynil-lifecycle".to_string(), 2),
                ("vynil-purger".to_string(), 2),
                ("vynil-scanner".to_string(), 2),
            ]);
            assert_eq!(deployments, expected);
            let budgets: BTreeSet<String> = objects
                .iter()
                .filter(|o| o["kind"] == "PodDisruptionBudget")
                .filter_map(|o| name_label(&o["spec"]["selector"]))
                .collect();
            let mut budgeted: BTreeSet<String> = deployments.keys().cloned().collect();
            if dir == "overlays/redis-sentinel" {
                budgeted.extend(["vynil-redis".to_string(), "vynil-redis-sentinel".to_string()]);
            }
            assert_eq!(budgets, budgeted, "{dir}: a budget per service");
        } else {
            assert!(deployments.values().all(|r| *r == 1), "{dir}: {deployments:?}");
        }
    }
}

/// Labels a pod of ours named `name` carries (kustomize's common label included).
fn pod_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), name.to_string()),
        ("app.kubernetes.io/part-of".to_string(), "vynil".to_string()),
    ])
}

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`, ANDed) against `labels`.
fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let match_labels = selector["matchLabels"].as_object().into_iter().flatten();
    let labels_hold = match_labels.into_iter().all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let expressions = selector["matchExpressions"].as_array().into_iter().flatten();
    let expressions_hold = expressions.into_iter().all(|e| {
        let key = e["key"].as_str().unwrap();
        let values: Vec<&str> =
            e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        match e["operator"].as_str().unwrap() {
            "In" => labels.get(key).is_some_and(|v| values.contains(&v.as_str())),
            "NotIn" => labels.get(key).is_none_or(|v| !values.contains(&v.as_str())),
            "Exists" => labels.contains_key(key),
            "DoesNotExist" => !labels.contains_key(key),
            other => panic!("unknown operator {other}"),
        }
    });
    labels_hold && expressions_hold
}

#[test]
fn no_network_policy_selects_a_pod_that_is_not_ours() {
    let observability: Vec<Value> = serde_yaml_ng::Deserializer::from_str(
        &std::fs::read_to_string(root().join("deploy/observability/networkpolicy.yaml")).unwrap(),
    )
    .map(|doc| serde_json::to_value(serde_yaml_ng::Value::deserialize(doc).unwrap()).unwrap())
    .filter(|v| !v.is_null())
    .collect();
    let mut policies: Vec<(String, Value)> =
        observability.into_iter().map(|p| ("observability".into(), p)).collect();
    for dir in ["base", "overlays/single", "overlays/ha", "overlays/redis-sentinel"] {
        policies.extend(
            render(dir).into_iter().filter(|o| o["kind"] == "NetworkPolicy").map(|p| (dir.to_string(), p)),
        );
    }
    // What else runs in vynil-system: upstream's operator and its diagnostic
    // API server (`vynil-diag`, the aggregated v1.diag.vynil.solidite.fr),
    // each with every label of ours but its name, and the agent Jobs' pods.
    let mut foreign: Vec<BTreeMap<String, String>> =
        ["vynil-controller", "vynil-diag", "vynil", "tenant--apps--web"]
            .into_iter()
            .map(pod_labels)
            .collect();
    foreign.push(BTreeMap::new());
    foreign.push(BTreeMap::from([("app".to_string(), "vynil-diag".to_string())]));
    for (dir, policy) in &policies {
        let name = policy["metadata"]["name"].as_str().unwrap();
        for labels in &foreign {
            assert!(
                !selects(&policy["spec"]["podSelector"], labels),
                "{dir}: NetworkPolicy {name} selects a pod that is not ours: {labels:?}"
            );
        }
    }
    assert!(policies.len() >= 8, "{}", policies.len());
}

#[test]
fn the_network_policies_allow_exactly_the_calls_of_the_design() {
    let objects = render("base");
    let mut allowed: BTreeSet<(String, String, i64)> = BTreeSet::new();
    let mut default_deny = false;
    for policy in objects.iter().filter(|o| o["kind"] == "NetworkPolicy") {
        let to = name_label(&policy["spec"]["podSelector"]);
        let rules = policy["spec"]["ingress"].as_array().cloned().unwrap_or_default();
        let Some(to) = to else {
            // Our pods by name, and no rule lets anything in.
            let ours = [
                "vynil-catalog",
                "vynil-scanner",
                "vynil-purger",
                "vynil-lifecycle",
                "vynil-gateway",
                "vynil-redis",
            ];
            let types = policy["spec"]["policyTypes"].clone();
            if policy["spec"]["egress"].is_null() {
                default_deny = rules.is_empty()
                    && types == serde_json::json!(["Ingress", "Egress"])
                    && ours.iter().all(|name| selects(&policy["spec"]["podSelector"], &pod_labels(name)));
            }
            continue;
        };
        for rule in rules {
            let ports: Vec<i64> =
                rule["ports"].as_array().unwrap().iter().map(|p| p["port"].as_i64().unwrap()).collect();
            let sources: Vec<String> = match rule["from"].as_array() {
                None => vec!["anyone".into()],
                Some(from) => from.iter().map(|f| name_label(&f["podSelector"]).unwrap()).collect(),
            };
            for source in sources {
                for port in &ports {
                    allowed.insert((source.clone(), to.clone(), *port));
                }
            }
        }
    }
    assert!(default_deny, "a default-deny policy covers every pod");
    let call = |from: &str, to: &str, port: i64| (from.to_string(), to.to_string(), port);
    assert_eq!(egress_of(&objects), egress_design(), "egress: exactly the design's calls, DNS and HTTPS out");
    // The diagram of `docs/architecture.md`: humans → gateway → the four services; lifecycle →
    // catalog (Resolve*, WatchCatalog) and scanner (NotifyPush, a moved tag); purger → lifecycle
    // (ListInstalledRevisions); the stateful services → Redis.
    let design = BTreeSet::from([
        call("anyone", "vynil-gateway", 8080),
        call("vynil-gateway", "vynil-catalog", 50051),
        call("vynil-gateway", "vynil-scanner", 50052),
        call("vynil-gateway", "vynil-purger", 50053),
        call("vynil-gateway", "vynil-lifecycle", 50054),
        call("vynil-lifecycle", "vynil-catalog", 50051),
        call("vynil-lifecycle", "vynil-scanner", 50052),
        call("vynil-purger", "vynil-lifecycle", 50054),
        call("vynil-catalog", "vynil-redis", 6379),
        call("vynil-scanner", "vynil-redis", 6379),
        call("vynil-purger", "vynil-redis", 6379),
    ]);
    assert_eq!(allowed, design);
}

/// Security review item 9: what each of our pods may open, as `(from, to,
/// port)`: `to` a pod of ours, `dns` (kube-dns in kube-system) or
/// `outside` (an address block that must leave out the cloud metadata
/// service, which a stolen pod would otherwise ask for node credentials).
fn egress_of(objects: &[Value]) -> BTreeSet<(String, String, i64)> {
    let ours =
        ["vynil-catalog", "vynil-scanner", "vynil-purger", "vynil-lifecycle", "vynil-gateway", "vynil-redis"];
    let mut allowed = BTreeSet::new();
    for policy in objects.iter().filter(|o| o["kind"] == "NetworkPolicy") {
        let selected: Vec<&str> = ours
            .iter()
            .copied()
            .filter(|name| selects(&policy["spec"]["podSelector"], &pod_labels(name)))
            .collect();
        for rule in policy["spec"]["egress"].as_array().into_iter().flatten() {
            let ports: Vec<i64> =
                rule["ports"].as_array().unwrap().iter().map(|p| p["port"].as_i64().unwrap()).collect();
            for peer in rule["to"].as_array().expect("an egress rule names its peers") {
                let to = if let Some(name) =
                    name_label(&peer["podSelector"]).filter(|_| peer["namespaceSelector"].is_null())
                {
                    name
                } else if peer["podSelector"]["matchLabels"]["k8s-app"] == "kube-dns" {
                    assert_eq!(
                        peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
                        "kube-system"
                    );
                    "dns".to_string()
                } else if let Some(cidr) = peer["ipBlock"]["cidr"].as_str() {
                    let except: Vec<&str> = peer["ipBlock"]["except"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .collect();
                    let metadata =
                        if cidr.contains(':') { "fd00:ec2::254/128" } else { "169.254.169.254/32" };
                    assert!(
                        except.contains(&metadata),
                        "{cidr} leaves out the metadata address {metadata}: {peer}"
                    );
                    "outside".to_string()
                } else {
                    panic!("an egress peer the design does not name: {peer}")
                };
                for from in &selected {
                    for port in &ports {
                        allowed.insert((from.to_string(), to.clone(), *port));
                    }
                }
            }
        }
    }
    allowed
}

/// The calls of `docs/architecture.md` seen from their caller, DNS for every service, and HTTPS
/// out where a service talks to the API server or registries.
fn egress_design() -> BTreeSet<(String, String, i64)> {
    let call = |from: &str, to: &str, port: i64| (from.to_string(), to.to_string(), port);
    let mut design = BTreeSet::from([
        call("vynil-gateway", "vynil-catalog", 50051),
        call("vynil-gateway", "vynil-scanner", 50052),
        call("vynil-gateway", "vynil-purger", 50053),
        call("vynil-gateway", "vynil-lifecycle", 50054),
        call("vynil-lifecycle", "vynil-catalog", 50051),
        call("vynil-lifecycle", "vynil-scanner", 50052),
        call("vynil-purger", "vynil-lifecycle", 50054),
        call("vynil-catalog", "vynil-redis", 6379),
        call("vynil-scanner", "vynil-redis", 6379),
        call("vynil-purger", "vynil-redis", 6379),
    ]);
    for service in ["vynil-catalog", "vynil-scanner", "vynil-purger", "vynil-lifecycle", "vynil-gateway"] {
        design.insert(call(service, "dns", 53));
        design.insert(call(service, "outside", 443));
        design.insert(call(service, "outside", 6443));
    }
    design
}

/// Security review item 9: as deployed, the gateway marks its session
/// cookies `Secure`, so a browser never sends them over plain HTTP.
#[test]
fn the_deployed_gateway_sends_its_session_cookies_only_over_tls() {
    for dir in
        ["base", "overlays/single", "overlays/ha", "overlays/namespaced-agent", "overlays/redis-sentinel"]
    {
        let gateway = render(dir)
            .into_iter()
            .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "vynil-gateway")
            .unwrap_or_else(|| panic!("{dir}: no gateway Deployment"));
        let args: Vec<String> = gateway["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let config = <vynil_gateway::Config as clap::Parser>::try_parse_from(
            std::iter::once("vynil-gateway".to_string()).chain(args),
        )
        .unwrap_or_else(|e| panic!("{dir}: the gateway's deployed args do not parse: {e}"));
        assert!(config.secure_cookies, "{dir}: --secure-cookies");
    }
}

/// Security review item 9: the deployed Redis requires the password of its
/// Secret. Its container's own args, run by a real redis-server: a client
/// without the password is refused, the URL the install commands put in the
/// Secret gets in.
#[tokio::test]
async fn the_deployed_redis_refuses_a_client_without_the_password_of_its_secret() {
    let redis = render("base")
        .into_iter()
        .find(|o| o["kind"] == "StatefulSet" && o["metadata"]["name"] == "vynil-redis")
        .expect("the base deploys Redis");
    let container = &redis["spec"]["template"]["spec"]["containers"][0];
    let from_secret = |name: &str| {
        container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .map(|e| e["valueFrom"].clone())
    };
    let secret = serde_json::json!({"secretKeyRef": {"name": "vynil-redis", "key": "password"}});
    assert_eq!(from_secret("REDIS_PASSWORD"), Some(secret.clone()), "the password comes from the Secret");
    assert_eq!(from_secret("REDISCLI_AUTH"), Some(secret), "the probes authenticate");
    // The install commands of deploy/README.md put that password in the services' URL.
    let readme = std::fs::read_to_string(root().join("deploy/README.md")).unwrap();
    assert!(
        readme.contains(r#"--from-literal=url="redis://:$password@vynil-redis:6379""#),
        "deploy/README.md"
    );

    let password = "p4ssw0rd-from-the-secret";
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().replace("$(REDIS_PASSWORD)", password))
        .collect();
    let ping = |url: String| async move {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let mut connection = client.get_multiplexed_async_connection().await.map_err(|e| e.to_string())?;
        redis::cmd("PING").query_async::<String>(&mut connection).await.map_err(|e| e.to_string())
    };
    // A port free a moment ago may be taken before redis-server binds it:
    // then it exits, and another port is tried.
    let (mut server, port, answered) = 'started: {
        let mut answered = Err("not started".to_string());
        for _ in 0..3 {
            let port = vynil_testkit::free_port().unwrap();
            let mut args = args.clone();
            if let Some(at) = args.iter().position(|a| a == "--dir") {
                args[at + 1] = dir.path().display().to_string();
            }
            args.extend(["--port".into(), port.to_string(), "--bind".into(), "127.0.0.1".into()]);
            args.extend(["--save".into(), "".into()]);
            let mut server = std::process::Command::new("redis-server")
                .args(&args)
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("redis-server is needed: apt-get install -y redis-server");
            for _ in 0..200 {
                answered = ping(format!("redis://:{password}@127.0.0.1:{port}")).await;
                if answered.is_ok() {
                    break 'started (server, port, answered);
                }
                if server.try_wait().unwrap().is_some() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            let _ = server.kill();
            let _ = server.wait();
        }
        panic!("redis-server never answered: {answered:?}");
    };
    let refused = ping(format!("redis://127.0.0.1:{port}")).await;
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(answered, Ok("PONG".to_string()));
    let refused = refused.expect_err("a client without the password is refused");
    assert!(refused.contains("NOAUTH") || refused.contains("Authentication"), "{refused}");
}

#[test]
fn the_dockerfile_builds_binaries_that_exist() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let listed: BTreeSet<String> = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("# BIN is one of:"))
        .unwrap()
        .split_whitespace()
        .map(String::from)
        .collect();
    let metadata = Command::new(env!("CARGO"))
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .output()
        .unwrap();
    let metadata: Value = serde_json::from_slice(&metadata.stdout).unwrap();
    let binaries: BTreeSet<String> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().clone())
        .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert!(!listed.is_empty());
    let missing: Vec<&String> = listed.difference(&binaries).collect();
    assert!(missing.is_empty(), "the Dockerfile lists binaries the workspace does not build: {missing:?}");
    // Every image the manifests run is built from this Dockerfile.
    for object in render("base").iter().filter(|o| o["kind"] == "Deployment") {
        let image = object["spec"]["template"]["spec"]["containers"][0]["image"].as_str().unwrap();
        let binary = image.rsplit('/').next().unwrap().split(':').next().unwrap();
        assert!(listed.contains(binary), "{image}: no such binary in the Dockerfile's list");
    }
}

/// One grant: (verb, API group, resource[/subresource], namespace or None for cluster-wide).
type Grant = (String, String, String, Option<String>);

/// What each ServiceAccount of the base may do, from its (Cluster)Role(Binding)s.
fn grants() -> BTreeMap<String, Vec<Grant>> {
    let objects = render("base");
    let rules_of = |kind: &str, name: &str| -> Vec<Value> {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .map(|o| o["rules"].as_array().cloned().unwrap_or_default())
            .unwrap_or_default()
    };
    let mut out: BTreeMap<String, Vec<Grant>> = BTreeMap::new();
    for binding in objects.iter().filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding")
    {
        let namespace = (binding["kind"] == "RoleBinding")
            .then(|| binding["metadata"]["namespace"].as_str().unwrap().to_string());
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap();
        let rules = rules_of(role_kind, binding["roleRef"]["name"].as_str().unwrap());
        for subject in binding["subjects"].as_array().unwrap() {
            let account = subject["name"].as_str().unwrap().to_string();
            for rule in &rules {
                for group in rule["apiGroups"].as_array().unwrap() {
                    for resource in rule["resources"].as_array().unwrap() {
                        for verb in rule["verbs"].as_array().unwrap() {
                            let grant = (
                                verb.as_str().unwrap().to_string(),
                                group.as_str().unwrap().to_string(),
                                resource.as_str().unwrap().to_string(),
                                namespace.clone(),
                            );
                            out.entry(account.clone()).or_default().push(grant);
                        }
                    }
                }
            }
        }
    }
    out
}

/// One scenario through every service's calls (scan, install, purge,
/// uninstall, the migration step), listing at once each call the API server
/// refused. Every Stack test runs under `deploy/base/rbac.yaml` enforced
/// (`vynil_e2e::api_under_deploy_rbac`), so a call without a grant fails
/// wherever it is made; why each grant is needed is said beside its rule in
/// `rbac.yaml`, rather than in a list of grants no scenario reaches.
#[tokio::test]
async fn every_call_the_services_make_is_granted_by_their_role() {
    use kube::api::{DeleteParams, PostParams};
    use vynil_e2e::{Stack, as_gateway, channel, eventually};
    use vynil_proto::purger::v1::{
        ExecuteRequest, PlanRequest, plan_request::Target, purger_client::PurgerClient,
    };
    use vynil_testkit::{
        PackageType,
        kube_api::{AgentOutcome, FakeAgent},
    };

    let stack = Stack::start("think/ollama").await;
    let _agent = FakeAgent::start(&stack.api, "vynil-system", |_| AgentOutcome::succeed()).unwrap();
    stack.publish("think", "ollama", PackageType::Tenant, "0.1.8").await;
    stack.publish("think", "ollama", PackageType::Tenant, "0.1.9").await;
    stack.scan_until(&["0.1.9"]).await;
    let instance = serde_json::json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "ollama", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "think", "package": "ollama"}});
    let instances = stack.tenant_instances();
    instances.create(&PostParams::default(), &serde_json::from_value(instance).unwrap()).await.unwrap();
    eventually("installed", || async {
        (instances.get("ollama").await.unwrap().data["status"]["package"]["tag"] == "0.1.9").then_some(())
    })
    .await;
    let mut purger = PurgerClient::new(channel(stack.purger).await);
    let plan = purger
        .plan(as_gateway(PlanRequest { target: Some(Target::Jukebox("box".into())) }, "ops"))
        .await
        .unwrap()
        .into_inner();
    let execute = ExecuteRequest {
        plan_id: plan.plan_id,
        confirm: plan.target,
        fingerprint: plan.fingerprint,
        acknowledge_usage_unknown: false,
    };
    let mut progress = purger.execute(as_gateway(execute, "ops")).await.unwrap().into_inner();
    while progress.message().await.unwrap().is_some() {}
    instances.delete("ollama", &DeleteParams::default()).await.unwrap();
    eventually("deleted", || async { instances.get_opt("ollama").await.unwrap().is_none().then_some(()) })
        .await;
    // The migration step, as lifecycle's init container runs it, over upstream's Deployment.
    let controller = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "vynil-controller", "namespace": "vynil-system"},
        "spec": {"selector": {"matchLabels": {"app": "c"}}, "template": {"metadata": {"labels": {"app": "c"}},
            "spec": {"containers": [{"name": "c", "image": "c", "env": [{"name": "AGENT_IMAGE", "value": "a/agent:0.7.7"}]}]}}}});
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(stack.client.clone(), "vynil-system");
    deployments.create(&PostParams::default(), &serde_json::from_value(controller).unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lifecycle_token = stack.api.service_account_token("vynil-system", "vynil-lifecycle");
    let kubeconfig = stack.api.write_kubeconfig_as(dir.path(), "vynil-system", &lifecycle_token).unwrap();
    // A process of its own: the fake API server answers on this test's runtime.
    let binary = vynil_testkit::workspace_binary("vynil-lifecycle", "vynil-lifecycle").unwrap();
    let takeover = tokio::process::Command::new(binary)
        .args(["takeover", "--namespace", "vynil-system"])
        .env("KUBECONFIG", &kubeconfig)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    assert!(takeover.status.success(), "{}", String::from_utf8_lossy(&takeover.stderr));

    let grants = grants();
    let granted = |account: &str, verb: &str, group: &str, resource: &str, namespace: Option<&str>| {
        grants.get(account).into_iter().flatten().any(|(v, g, r, ns)| {
            (v == verb || v == "*")
                && g == group
                && r == resource
                && ns.as_deref().is_none_or(|ns| Some(ns) == namespace)
        })
    };
    let mut refused = Vec::new();
    for request in stack.api.requests() {
        let Some(account) = ["vynil-scanner", "vynil-catalog", "vynil-purger", "vynil-lifecycle"]
            .into_iter()
            .find(|s| request.user_agent.starts_with(&format!("{s}/")))
        else {
            continue;
        };
        if request.resource.is_empty() {
            continue; // discovery: every authenticated user may
        }
        let resource = match &request.subresource {
            Some(sub) => format!("{}/{sub}", request.resource),
            None => request.resource.clone(),
        };
        if !granted(account, &request.verb, &request.group, &resource, request.namespace.as_deref()) {
            refused.push(format!(
                "{account}: {} {}/{resource} in {:?}",
                request.verb, request.group, request.namespace
            ));
        }
    }
    refused.sort();
    refused.dedup();
    assert!(refused.is_empty(), "calls deploy/base/rbac.yaml does not grant:\n{}", refused.join("\n"));
    stack.stop().await;
}

/// Whether the API server refused `result` for RBAC (403); any other error fails.
fn refused<T>(result: Result<T, kube::Error>) -> bool {
    match result {
        Err(kube::Error::Api(e)) if e.code == 403 => true,
        Err(e) => panic!("not an RBAC answer: {e}"),
        Ok(_) => false,
    }
}

/// Security review item 9, the narrower agent: under
/// `overlays/namespaced-agent`, the account every agent Job and the reaper
/// run as installs and removes a package's namespaced objects in a bound
/// tenant namespace, and reaches neither the control plane's Secrets (the
/// service token) nor the cluster's RBAC nor an unbound namespace. Under the
/// base (cluster-admin, as upstream's agent) it reaches all three: the
/// overlay is what narrows. RBAC as the fake API server enforces it.
#[tokio::test]
async fn the_namespaced_agent_reads_no_control_plane_secret_and_writes_nothing_outside_its_namespaces() {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::api::{Api, DeleteParams, PostParams};
    let reaches = |api: &vynil_testkit::kube_api::FakeApiServer| {
        let agent = api.client_as(&api.service_account_token("vynil-system", "vynil-agent")).unwrap();
        async move {
            let config_map = |name: &str| -> ConfigMap {
                serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "data": {"a": "b"}}))
                    .unwrap()
            };
            let apps: Api<ConfigMap> = Api::namespaced(agent.clone(), "apps");
            let installs = !refused(apps.create(&PostParams::default(), &config_map("web")).await)
                && !refused(apps.delete("web", &DeleteParams::default()).await);
            let secrets: Api<Secret> = Api::namespaced(agent.clone(), "vynil-system");
            let token = !refused(secrets.get("vynil-service-token").await);
            let prod: Api<ConfigMap> = Api::namespaced(agent.clone(), "prod");
            let unbound = !refused(prod.create(&PostParams::default(), &config_map("web")).await);
            let bindings: Api<ClusterRoleBinding> = Api::all(agent.clone());
            let escalation: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "mine"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "vynil-agent", "namespace": "vynil-system"}]}))
            .unwrap();
            let cluster = !refused(bindings.create(&PostParams::default(), &escalation).await);
            let instances: Api<vynil_crds::TenantInstance> = Api::all(agent);
            let reads_instances = !refused(instances.list(&Default::default()).await);
            (installs, reads_instances, token, unbound, cluster)
        }
    };
    let world = |dir: &'static str| async move {
        let options = vynil_testkit::kube_api::FakeApiOptions { rbac: true, ..Default::default() };
        let api = vynil_testkit::kube_api::FakeApiServer::start_with(options).await.unwrap();
        api.create_namespaces(&["vynil-system", "apps", "prod"]).unwrap();
        let secrets: Api<Secret> = Api::namespaced(api.client().unwrap(), "vynil-system");
        let token: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "vynil-service-token"}, "stringData": {"token": "s3cret"}}))
        .unwrap();
        secrets.create(&PostParams::default(), &token).await.unwrap();
        api.load_rbac(render(dir), "vynil-system").unwrap();
        api
    };
    let narrow = world("overlays/namespaced-agent").await;
    assert_eq!(
        reaches(&narrow).await,
        (true, true, false, false, false),
        "(installs in apps, reads instances, reads the service token, writes in prod, binds cluster-admin)"
    );
    let base = world("overlays/single").await;
    assert_eq!(reaches(&base).await, (true, true, true, true, true), "the base's agent is cluster-admin");
}

/// #46: `overlays/redis-sentinel` runs three Redis pods and three sentinels,
/// one per node, each set with a budget that keeps a quorum and a replica;
/// every Redis user of the services names the three sentinels by the names
/// their StatefulSet gives them, and the primary by the name the sentinels
/// monitor; the services' flags parse those settings into a Sentinel target.
#[test]
fn the_sentinel_overlay_points_every_redis_user_at_three_sentinels_that_keep_a_quorum() {
    let objects = render("overlays/redis-sentinel");
    let find = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
            .clone()
    };
    let mut sentinel_pods = Vec::new();
    for name in ["vynil-redis", "vynil-redis-sentinel"] {
        let set = find("StatefulSet", name);
        let replicas = set["spec"]["replicas"].as_i64().unwrap();
        assert_eq!(replicas, 3, "{name}");
        let spread = &set["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            [0];
        assert_eq!(spread["topologyKey"], "kubernetes.io/hostname", "{name}: one pod per node");
        assert_eq!(name_label(&spread["labelSelector"]).as_deref(), Some(name), "{name}");
        assert_eq!(find("PodDisruptionBudget", name)["spec"]["minAvailable"], 2, "{name}");
        let headless = set["spec"]["serviceName"].as_str().unwrap().to_string();
        assert_eq!(
            find("Service", &headless)["spec"]["clusterIP"],
            "None",
            "{name}: pod names need a headless Service"
        );
        if name == "vynil-redis-sentinel" {
            sentinel_pods = (0..replicas).map(|i| format!("{name}-{i}.{headless}:26379")).collect();
        }
    }
    let script =
        find("StatefulSet", "vynil-redis-sentinel")["spec"]["template"]["spec"]["containers"][0]["args"][0]
            .as_str()
            .unwrap()
            .to_string();
    let monitored = script
        .lines()
        .find_map(|l| l.trim().strip_prefix("sentinel monitor "))
        .and_then(|l| l.split_whitespace().next())
        .expect("the sentinels monitor a primary")
        .to_string();
    for service in ["vynil-catalog", "vynil-scanner", "vynil-purger"] {
        let deployment = find("Deployment", service);
        let env: BTreeMap<String, Value> = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
            .collect();
        let value = |name: &str| {
            env[name]["value"].as_str().unwrap_or_else(|| panic!("{service}: {name}")).to_string()
        };
        assert_eq!(value("REDIS_SENTINELS").split(',').collect::<Vec<_>>(), sentinel_pods, "{service}");
        assert_eq!(value("REDIS_MASTER_NAME"), monitored, "{service}");
        let password = serde_json::json!({"secretKeyRef": {"name": "vynil-redis", "key": "password"}});
        assert_eq!(env["REDIS_SENTINEL_PASSWORD"]["valueFrom"], password, "{service}");
        // What the service makes of them: its own flags, parsed.
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            store: vynil_store::StoreConfig,
        }
        let flags = <Flags as clap::Parser>::try_parse_from([
            "service".to_string(),
            "--redis-url".into(),
            "redis://:secret@vynil-redis:6379".into(),
            "--redis-sentinels".into(),
            value("REDIS_SENTINELS"),
            "--redis-master-name".into(),
            value("REDIS_MASTER_NAME"),
        ])
        .unwrap();
        let target = flags.store.redis().unwrap();
        assert_eq!(target.replication().replicas, 1, "{service}: waits for one replica");
        assert!(target.describe().contains(&format!("the primary {monitored:?}")), "{}", target.describe());
        assert!(!format!("{target:?}").contains("secret"), "the password is never printed");
    }
}
