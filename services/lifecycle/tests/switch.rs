//! The switch and back (`docs/migration.md`): a cluster as upstream's
//! operator leaves it, the takeover script the doc embeds (run with `kubectl`,
//! as written), the init container's step, our services with the strict fake
//! agent, then the doc's rollback script; every object then decodes with
//! upstream's types (`vynil_testkit::upstream`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::{path::Path, time::Duration};

use common::{APPS, JOBS, World, coded_condition, condition, eventually, package};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Namespace, ServiceAccount},
};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use vynil_testkit::{
    kube_api::FakeApiServer,
    upstream::{decode_instance, decode_jukebox},
};

const UPSTREAM_AGENT: &str = "registry.corp/mirror/vynil-agent:0.7.8-alpha.4";
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The fenced ```` ```sh <name> ```` block of `docs/migration.md`.
fn doc_script(name: &str) -> String {
    let doc = std::fs::read_to_string(Path::new(ROOT).join("docs/migration.md")).unwrap();
    let start = format!("```sh {name}\n");
    let from = doc.find(&start).unwrap_or_else(|| panic!("docs/migration.md has no ```sh {name} block"));
    let body = &doc[from + start.len()..];
    body[..body.find("\n```").unwrap()].to_string()
}

/// Runs `script` with `sh` from the repository's root against `kubeconfig`.
async fn run(script: &str, kubeconfig: &Path, env: &[(&str, &str)]) -> (bool, String) {
    let probe = tokio::process::Command::new("kubectl").args(["version", "--client"]).output().await;
    if !probe.is_ok_and(|o| o.status.success()) {
        panic!(
            "kubectl is needed (docs/migration.md's scripts): apt-get install kubectl (or kubernetes-client)"
        );
    }
    let out = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(ROOT)
        .env("KUBECONFIG", kubeconfig)
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn resource(kind: &str) -> ApiResource {
    let plural = if kind == "JukeBox" { "jukeboxes".into() } else { format!("{}s", kind.to_lowercase()) };
    ApiResource {
        group: "vynil.solidite.fr".into(),
        version: "v1".into(),
        api_version: "vynil.solidite.fr/v1".into(),
        kind: kind.into(),
        plural,
    }
}

/// An instance as upstream's agent leaves it installed: its finalizer, its
/// status (`tag`, options `digest`, its conditions), none of our fields.
async fn upstream_installed(
    client: &Client,
    kind: &str,
    namespace: &str,
    spec: Value,
    tag: &str,
) -> DynamicObject {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource(kind));
    let name = spec["package"].as_str().unwrap().to_string();
    let spec_sent = spec.clone();
    let finalizer = format!("{}s.vynil.solidite.fr", kind.to_lowercase());
    let object = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "finalizers": [finalizer]}, "spec": spec_sent});
    api.create(&PostParams::default(), &serde_json::from_value(object).unwrap()).await.unwrap();
    let at = "2026-01-01T00:00:00Z";
    let options = spec.get("options").and_then(Value::as_object);
    let digest = vynil_rules::install::options_hash(options);
    let mut status = json!({"tag": tag, "digest": digest, "conditions": [
        {"type": "AgentStarted", "status": "True", "message": "Agent started", "generation": 1, "lastTransitionTime": at},
        {"type": "Installed", "status": "True", "message": "Installed succesfully", "generation": 1, "lastTransitionTime": at},
        {"type": "Ready", "status": "True", "message": "Installed succesfully", "generation": 1, "lastTransitionTime": at}]});
    if kind == "SystemInstance" {
        status["crds"] = json!([
            "jukeboxes.vynil.solidite.fr",
            "tenantinstances.vynil.solidite.fr",
            "serviceinstances.vynil.solidite.fr",
            "systeminstances.vynil.solidite.fr"
        ]);
    }
    let patch = json!({"status": status});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap()
}

/// What upstream's bootstrap and agents leave: its control plane
/// `vynil-system/vynil` owning the `vynil-controller` Deployment (with
/// `AGENT_IMAGE`) and the `vynil-agent` ServiceAccount; two tenant instances
/// it installed; a JukeBox with our `layout` source (from an earlier switch).
async fn as_upstream_leaves_it(client: &Client) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for name in [JOBS, APPS] {
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        namespaces.create(&PostParams::default(), &serde_json::from_value(namespace).unwrap()).await.unwrap();
    }
    let core = json!({"jukebox": "box", "category": "core", "package": "vynil"});
    let vynil = upstream_installed(client, "SystemInstance", JOBS, core, "0.7.8-alpha.4").await;
    let owner = json!([{"apiVersion": "vynil.solidite.fr/v1", "kind": "SystemInstance", "name": "vynil",
        "uid": vynil.metadata.uid.clone().unwrap(), "controller": true, "blockOwnerDeletion": true}]);
    // box/vynil/systems/controller.yaml.hbs and rbac.yaml.hbs, as the agent applied them.
    let controller = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "vynil-controller", "namespace": JOBS, "ownerReferences": owner},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "vynil-controller"}},
            "template": {"metadata": {"labels": {"app": "vynil-controller"}}, "spec": {"containers": [{
                "name": "vynil-controller", "image": "docker.io/sebt3/vynil-operator:0.7.8-alpha.4",
                "env": [{"name": "AGENT_IMAGE", "value": UPSTREAM_AGENT}]}]}}}});
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), JOBS);
    deployments.create(&PostParams::default(), &serde_json::from_value(controller).unwrap()).await.unwrap();
    let account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "vynil-agent", "namespace": JOBS, "ownerReferences": owner}});
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), JOBS);
    accounts.create(&PostParams::default(), &serde_json::from_value(account).unwrap()).await.unwrap();
    let web = json!({"jukebox": "box", "category": "apps", "package": "web"});
    upstream_installed(client, "TenantInstance", APPS, web, "2.5.0").await;
    // An option of the wrong type (the package says integer): upstream passed it through.
    let blog =
        json!({"jukebox": "box", "category": "apps", "package": "blog", "options": {"replicas": "two"}});
    upstream_installed(client, "TenantInstance", APPS, blog, "1.0.0").await;
    let boxes: Api<DynamicObject> = Api::all_with(client.clone(), &resource("JukeBox"));
    let mirror = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "JukeBox", "metadata": {"name": "mirror"},
        "spec": {"source": {"layout": {"path": "/mirror"}}, "schedule": "0 3 * * *"}});
    boxes.create(&PostParams::default(), &serde_json::from_value(mirror).unwrap()).await.unwrap();
    // Secrets upstream's JukeBoxes name, without our opt-in label: an index
    // source's credentials (read from two hosts), a pull secret, and the
    // service token's Secret a JukeBox should never have named.
    let indexed = |name: &str, url: &str, secret: &str| {
        json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "JukeBox", "metadata": {"name": name},
            "spec": {"source": {"http": {"url": url, "secret": secret}}, "pull_secret": "regcred", "schedule": "0 3 * * *"}})
    };
    let sources = [
        indexed("charts", "https://charts.corp.example/vynil/", "index-auth"),
        indexed("charts-mirror", "http://mirror.corp.example:8080/vynil?x=1", "index-auth"),
        indexed("sneaky", "https://evil.example/", "vynil-service-token"),
    ];
    for jukebox in sources {
        boxes.create(&PostParams::default(), &serde_json::from_value(jukebox).unwrap()).await.unwrap();
    }
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), JOBS);
    let secret = |name: &str, type_: &str, key: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": type_,
            "stringData": {key: "{\"auths\":{}}"}})
    };
    for (name, type_, key) in [
        ("index-auth", "Opaque", "token"),
        ("regcred", "kubernetes.io/dockerconfigjson", ".dockerconfigjson"),
        ("vynil-service-token", "Opaque", "token"),
    ] {
        secrets
            .create(&PostParams::default(), &serde_json::from_value(secret(name, type_, key)).unwrap())
            .await
            .unwrap();
    }
}

/// The takeover's Secret step: those JukeBoxes name opt in, an index's bound
/// to the hosts it is read from, each listed; the service token's never.
async fn secrets_opted_in(client: &Client, output: &str) {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), JOBS);
    let label = |s: &k8s_openapi::api::core::v1::Secret| {
        kube::ResourceExt::labels(s).get(vynil_crds::secrets::OPT_IN_LABEL).cloned()
    };
    for name in ["index-auth", "regcred"] {
        assert_eq!(label(&secrets.get(name).await.unwrap()).as_deref(), Some("true"), "{name}:\n{output}");
        assert!(output.contains(&format!("Secret {name}: labelled")), "{output}");
    }
    let index = secrets.get("index-auth").await.unwrap();
    let admitted = vynil_crds::secrets::admit(&index).unwrap().hosts().unwrap();
    for url in
        ["https://charts.corp.example/vynil/index.yaml", "http://mirror.corp.example:8080/vynil/index.yaml"]
    {
        assert!(admitted.allows(&url::Url::parse(url).unwrap()), "{url}:\n{output}");
    }
    assert!(!admitted.allows(&url::Url::parse("https://evil.example/").unwrap()));
    assert!(
        output.contains("Secret index-auth: hosts charts.corp.example mirror.corp.example:8080"),
        "{output}"
    );
    let token = secrets.get("vynil-service-token").await.unwrap();
    assert_eq!(label(&token), None, "the service token's Secret is never labelled:\n{output}");
    assert!(!output.contains("vynil-service-token"), "{output}");
}

fn packages() -> Vec<Value> {
    let registry = "registry.example";
    vec![
        package(registry, "apps", "web", "tenant", "3.5.0", json!([{"minimum_previous_version": "2.0.0"}])),
        package(registry, "apps", "web", "tenant", "2.5.0", json!([])),
        package(registry, "apps", "blog", "tenant", "1.0.0", json!([])),
        // A newer upstream control plane in the catalog: never installed by us.
        package(registry, "core", "vynil", "system", "0.8.0", json!([])),
    ]
}

#[tokio::test]
async fn a_cluster_switches_from_upstream_and_back_with_the_documented_scripts() {
    let api = FakeApiServer::start().await.unwrap();
    let client = api.client().unwrap();
    as_upstream_leaves_it(&client).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path(), JOBS).unwrap();

    // The takeover, as docs/migration.md writes it.
    let (ok, output) = run(&doc_script("takeover"), &kubeconfig, &[]).await;
    assert!(ok, "the takeover script failed:\n{output}");
    secrets_opted_in(&client, &output).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), JOBS);
    let upstream = deployments.get("vynil-controller").await.unwrap();
    assert_eq!(upstream.spec.replicas, Some(0), "upstream's operator is stopped");
    assert!(deployments.get_opt("vynil-lifecycle").await.unwrap().is_some(), "our control plane is applied");
    // Lifecycle's init container: the agent image upstream ran, recorded once.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_vynil-lifecycle"))
        .arg("takeover")
        .env("KUBECONFIG", &kubeconfig)
        .env("VYNIL_NAMESPACE", JOBS)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "takeover: {}", String::from_utf8_lossy(&out.stderr));
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), JOBS);
    let recorded = maps.get("vynil-config").await.unwrap().data.unwrap();
    assert_eq!(recorded["AGENT_IMAGE"], UPSTREAM_AGENT);
    // What the Deployments' envFrom gives each container.
    let (image, version) = (recorded["AGENT_IMAGE"].clone(), recorded["VYNIL_VERSION"].clone());
    let flags = ["--agent-image", image.as_str(), "--vynil-version", version.as_str()];
    let (world, _) = World::start_on(api, packages(), &flags).await;

    // Upstream's control plane: left alone, saying why, suspended or not.
    let held = eventually("the control plane's condition", || async {
        let object = world.instances_in("SystemInstance", JOBS).get("vynil").await.unwrap();
        let object = serde_json::to_value(object).unwrap();
        coded_condition(&object, "Ready").cloned()
    })
    .await;
    assert!(held["message"].as_str().unwrap().contains("[E_UPSTREAM_CONTROL_PLANE]"), "{held}");
    // What upstream installed at the revision we would install: adopted, no
    // Job, its mistyped option kept and warned about.
    eventually("blog adopted", || async {
        let object = world.get("TenantInstance", "blog").await;
        object["status"].get("package").filter(|p| !p.is_null()).cloned()
    })
    .await;
    let warned = eventually("the OptionTypeMismatch warning", || async {
        let events = world.api.objects("events.k8s.io", "events");
        events.into_iter().find(|e| e["reason"] == "OptionTypeMismatch" && e["regarding"]["name"] == "blog")
    })
    .await;
    assert_eq!(warned["type"], "Warning", "{warned}");
    // An upgrade through the strict fake agent, with upstream's agent image.
    eventually("web upgraded", || async {
        let object = world.get("TenantInstance", "web").await;
        (object["status"]["package"]["tag"] == "3.5.0" && object["status"]["tag"] == "3.5.0").then_some(())
    })
    .await;
    let web_job = world.agent.runs().into_iter().find(|r| r.job.instance_name == "web").unwrap();
    let job = world.jobs().get(&web_job.job.job_name).await.unwrap();
    let container = &job.spec.unwrap().template.spec.unwrap().containers[0];
    assert_eq!(container.image.as_deref(), Some(UPSTREAM_AGENT));
    assert!(web_job.job.upstream_agent, "upstream's agent contract");
    // An uninstall through the strict fake agent.
    world.instances("TenantInstance").delete("blog", &DeleteParams::default()).await.unwrap();
    eventually("blog uninstalled", || async {
        world.instances("TenantInstance").get_opt("blog").await.unwrap().is_none().then_some(())
    })
    .await;
    let runs: Vec<(String, String)> =
        world.agent.runs().into_iter().map(|r| (r.job.instance_name, r.job.action)).collect();
    assert_eq!(
        runs,
        [("web".to_string(), "install".to_string()), ("blog".to_string(), "delete".to_string())],
        "nothing upstream already ran is run again, the control plane never"
    );
    for run in world.agent.runs() {
        assert_eq!(run.exit_code, Some(0), "the strict agent read its instance: {:?}", run.stderr);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let api = world.stop().await;

    // The rollback, as docs/migration.md writes it. Upstream's crd.yaml is not
    // in this repository: ours stands in (the API server here prunes nothing,
    // so what upstream decodes below does not depend on it).
    let crds = [("UPSTREAM_CRDS", "deploy/crds/vynil.yaml")];
    let (ok, output) = run(&doc_script("rollback"), &kubeconfig, &crds).await;
    assert!(!ok && output.contains("mirror"), "the rollback must stop at the layout JukeBox:\n{output}");
    // The operator does what it says: the layout pushed to a registry, the JukeBox listing it.
    let boxes: Api<DynamicObject> = Api::all_with(client.clone(), &resource("JukeBox"));
    let converted = json!({"spec": {"source": {"layout": null, "list": ["registry.example/apps/mirror"]}}});
    boxes.patch("mirror", &PatchParams::default(), &Patch::Merge(&converted)).await.unwrap();
    let (ok, output) = run(&doc_script("rollback"), &kubeconfig, &crds).await;
    assert!(ok, "the rollback script failed:\n{output}");

    // Every object as upstream's operator reads it.
    let instances: Vec<Value> = ["tenantinstances", "serviceinstances", "systeminstances"]
        .into_iter()
        .flat_map(|plural| api.objects("vynil.solidite.fr", plural))
        .collect();
    assert_eq!(instances.len(), 2, "web and upstream's control plane are left");
    for object in &instances {
        decode_instance(object).unwrap_or_else(|e| panic!("after the rollback: {e}"));
    }
    for object in api.objects("vynil.solidite.fr", "jukeboxes") {
        decode_jukebox(&object).unwrap_or_else(|e| panic!("after the rollback: {e}"));
    }
    let vynil = api.object("vynil.solidite.fr", "systeminstances", Some(JOBS), "vynil").unwrap();
    assert!(vynil["metadata"]["annotations"].get("vynil.solidite.fr/suspend").is_none(), "unsuspended");
    assert!(condition(&vynil, "Ready").is_some());
    let upstream = deployments.get("vynil-controller").await.unwrap();
    assert_eq!(upstream.spec.replicas, Some(1), "upstream's operator is back");
    let ours = deployments.get("vynil-lifecycle").await.unwrap();
    assert_eq!(ours.spec.replicas, Some(0), "ours is stopped");
    let account = Api::<ServiceAccount>::namespaced(client.clone(), JOBS).get("vynil-agent").await.unwrap();
    assert_eq!(account.metadata.owner_references.unwrap()[0].uid, vynil["metadata"]["uid"].as_str().unwrap());
}
