//! #50 end to end, every part real but the cluster: revisions signed every
//! way in a real registry, judged by the scanner under an enforced policy,
//! served by the catalog, installed by lifecycle (the fake agent runs the
//! Job): only the revision a trusted key signed is offered and installed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Stack, eventually};
use kube::api::{Patch, PostParams};
use serde_json::json;
use vynil_testkit::{
    PackageSpec, PackageType, SignatureLayer, Signer,
    kube_api::{AgentOutcome, FakeAgent},
};

#[tokio::test]
async fn under_enforce_only_the_revision_signed_by_a_trusted_key_is_offered_and_installed() {
    let stack = Stack::start("sec/app").await;
    let agent = FakeAgent::start(&stack.api, "vynil-system", |_| AgentOutcome::succeed()).unwrap();
    let (trusted, other) = (Signer::from_label("release"), Signer::from_label("someone else"));
    let publisher = stack.registry.publisher();
    let reference = format!("{}/sec/app", stack.registry.host());
    let tags = ["0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0"];
    let mut digests = Vec::new();
    for (i, tag) in tags.iter().enumerate() {
        let mut spec = PackageSpec::new("sec", "app", PackageType::Tenant, tag);
        if i > 0 {
            spec = spec.min(tags[i - 1]);
        }
        digests.push(publisher.publish("sec/app", &spec).await.unwrap());
    }
    let sign = |signer: &Signer, digest: &str| SignatureLayer::by(signer, &reference, digest);
    // 0.1.0 by the trusted key; 0.2.0 by another; 0.3.0 unsigned; 0.4.0 a
    // copy of 0.1.0's; 0.5.0 a payload changed after signing; 0.6.0 cut short.
    publisher.sign("sec/app", &digests[0], &[sign(&trusted, &digests[0])]).await.unwrap();
    publisher.sign("sec/app", &digests[1], &[sign(&other, &digests[1])]).await.unwrap();
    publisher.sign("sec/app", &digests[3], &[sign(&trusted, &digests[0])]).await.unwrap();
    let mut tampered = sign(&trusted, &digests[4]);
    tampered.payload = vynil_rules::signature::simple_signing_payload("evil.example/app", &digests[4]);
    publisher.sign("sec/app", &digests[4], &[tampered]).await.unwrap();
    let mut truncated = sign(&trusted, &digests[5]);
    truncated.signature.truncate(24);
    publisher.sign("sec/app", &digests[5], &[truncated]).await.unwrap();
    let policy = json!({"spec": {"verify": {"mode": "enforce", "keys": [
        {"name": "release", "public_key": trusted.public_pem()}]}}});
    stack.boxes.patch("box", &Default::default(), &Patch::Merge(&policy)).await.unwrap();
    // The verified revision, then the unverified ones the descent met, newest first.
    stack.scan_until(&["0.1.0", "0.6.0", "0.5.0", "0.4.0", "0.3.0", "0.2.0"]).await;

    let instances = stack.tenant_instances();
    let instance = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "app", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "sec", "package": "app"}});
    instances.create(&PostParams::default(), &serde_json::from_value(instance).unwrap()).await.unwrap();
    eventually("0.1.0 installed", || async {
        (instances.get("app").await.unwrap().data["status"]["package"]["tag"] == "0.1.0").then_some(())
    })
    .await;
    let runs: Vec<Option<String>> = agent.runs().into_iter().map(|r| r.job.tag).collect();
    assert_eq!(runs, [Some("0.1.0".to_string())], "only the verified revision ran");
    stack.stop().await;
}
