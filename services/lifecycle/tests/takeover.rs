//! The migration step (`docs/migration.md`): the agent image and framework
//! version upstream's operator ran are recorded once in `vynil-config`, an
//! explicit flag wins, and nothing is derived again later.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::json;
use vynil_lifecycle::takeover::{self, Recorded, TakeoverArgs};
use vynil_testkit::kube_api::FakeApiServer;

const NS: &str = "vynil-system";

/// `vynil-controller` as upstream's `box/vynil/systems/controller.yaml.hbs` renders it.
fn upstream_controller(agent_image: &str) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "vynil-controller", "namespace": NS},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "vynil-controller"}},
            "template": {"metadata": {"labels": {"app": "vynil-controller"}}, "spec": {"containers": [{
                "name": "vynil-controller", "image": "docker.io/sebt3/vynil-operator:0.7.8-alpha.4",
                "env": [{"name": "RUST_BACKTRACE", "value": "1"}, {"name": "AGENT_IMAGE", "value": agent_image},
                    {"name": "VYNIL_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]}]}}}
    }))
    .unwrap()
}

fn args() -> TakeoverArgs {
    TakeoverArgs { namespace: NS.into(), agent_image: None, vynil_version: None }
}

async fn recorded(api: &FakeApiServer) -> BTreeMap<String, String> {
    let maps: Api<ConfigMap> = Api::namespaced(api.client().unwrap(), NS);
    maps.get("vynil-config").await.unwrap().data.unwrap()
}

#[tokio::test]
async fn the_agent_image_upstream_ran_is_recorded_once_and_kept_after_its_deployment_is_gone() {
    let api = FakeApiServer::start().await.unwrap();
    api.create_namespaces(&["vynil-system", "apps"]).unwrap();
    let client = api.client().unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let image = "registry.corp/mirror/vynil-agent:0.7.8-alpha.4";
    deployments.create(&PostParams::default(), &upstream_controller(image)).await.unwrap();
    let first = takeover::record(&client, &args()).await.unwrap();
    assert!(
        matches!(&first, Recorded::Written { source, .. } if source.contains("vynil-controller")),
        "{first:?}"
    );
    let expected = BTreeMap::from([
        ("AGENT_IMAGE".to_string(), image.to_string()),
        ("VYNIL_VERSION".to_string(), "0.7.8-alpha.4".to_string()),
    ]);
    assert_eq!(recorded(&api).await, expected);
    // Upstream's Deployment deleted (or changed) later: nothing is derived again.
    deployments.delete("vynil-controller", &DeleteParams::default()).await.unwrap();
    deployments.create(&PostParams::default(), &upstream_controller("other/agent:9.9.9")).await.unwrap();
    assert_eq!(takeover::record(&client, &args()).await.unwrap(), Recorded::Kept(expected.clone()));
    assert_eq!(recorded(&api).await, expected);
}

#[tokio::test]
async fn an_explicit_flag_wins_and_without_upstream_nothing_is_recorded() {
    let api = FakeApiServer::start().await.unwrap();
    api.create_namespaces(&["vynil-system", "apps"]).unwrap();
    let client = api.client().unwrap();
    assert_eq!(takeover::record(&client, &args()).await.unwrap(), Recorded::Nothing);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    assert!(maps.get_opt("vynil-config").await.unwrap().is_none());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    deployments
        .create(&PostParams::default(), &upstream_controller("sebt3/vynil-agent:0.7.7"))
        .await
        .unwrap();
    let flags = TakeoverArgs { agent_image: Some("mine/agent:0.8.0".into()), ..args() };
    takeover::record(&client, &flags).await.unwrap();
    assert_eq!(recorded(&api).await["AGENT_IMAGE"], "mine/agent:0.8.0");
    assert_eq!(recorded(&api).await["VYNIL_VERSION"], "0.8.0");
}

#[tokio::test]
async fn the_subcommand_logs_what_it_recorded() {
    let api = FakeApiServer::start().await.unwrap();
    api.create_namespaces(&["vynil-system", "apps"]).unwrap();
    let deployments: Api<Deployment> = Api::namespaced(api.client().unwrap(), NS);
    deployments
        .create(&PostParams::default(), &upstream_controller("sebt3/vynil-agent:0.7.7"))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path(), NS).unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_vynil-lifecycle"))
        .args(["takeover", "--namespace", NS])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("AGENT_IMAGE=sebt3/vynil-agent:0.7.7") && stdout.contains("VYNIL_VERSION=0.7.7"),
        "{stdout}"
    );
    assert_eq!(recorded(&api).await["AGENT_IMAGE"], "sebt3/vynil-agent:0.7.7");
}
