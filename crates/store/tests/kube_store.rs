//! The Kubernetes store against the fake API server, through the real kube client.

use std::time::Duration;

use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use vynil_crds::{JukeBox, JukeBoxStatus};
use vynil_store::{JukeboxStore, KubeStore, ScannerStore, StoreChange, StoreError};
use vynil_testkit::kube_api::{ApiFault, ApiFaultAction, FakeApiServer};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn jukebox(name: &str) -> Result<JukeBox, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "vynil.solidite.fr/v1", "kind": "JukeBox",
        "metadata": {"name": name, "annotations": {"vynil.solidite.fr/force-scan": "apps/x"}},
        "spec": {"source": {"list": ["registry.example/apps/x"]}, "schedule": "0 * * * *"},
    }))
}

/// The next change of the feed about `wanted`.
async fn next_change(
    changes: &mut tokio::sync::broadcast::Receiver<StoreChange>,
    wanted: &str,
) -> Option<StoreChange> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while let Ok(Ok(change)) = tokio::time::timeout_at(deadline, changes.recv()).await {
        if change.name() == Some(wanted) {
            return Some(change);
        }
    }
    None
}

#[tokio::test]
async fn status_writes_are_compare_and_set_on_the_resource_version() -> TestResult {
    let server = FakeApiServer::start().await?;
    server.create_namespaces(&["vynil-system", "apps"])?;
    let client = server.client()?;
    let store = KubeStore::new(client.clone());
    let mut changes = store.subscribe();
    Api::<JukeBox>::all(client.clone()).create(&PostParams::default(), &jukebox("box")?).await?;
    let created = next_change(&mut changes, "box").await;
    assert!(
        matches!(created, Some(StoreChange::Applied(_))),
        "the watcher announces the new JukeBox: {created:?}"
    );

    let read = store.get("box").await?.ok_or("no record")?;
    assert_eq!(read.annotations.get("vynil.solidite.fr/force-scan").map(String::as_str), Some("apps/x"));
    assert!(read.status.is_none());
    let version = store.write_status("box", &read.status_version, &JukeBoxStatus::default()).await?;
    assert_ne!(version, read.status_version, "a write moves the version (opaque: compared, never ordered)");
    // The watch's object is the record a read gives: replicas need no GET.
    let announced = next_change(&mut changes, "box").await;
    let reread = store.get("box").await?.ok_or("no record")?;
    assert_eq!(announced, Some(StoreChange::Applied(Box::new(reread))), "the status change is announced");

    // The version read before is stale now: a conflict, the stored status untouched.
    let stale = store.write_status("box", &read.status_version, &JukeBoxStatus::default()).await;
    assert!(matches!(stale, Err(StoreError::Conflict(_))), "{stale:?}");
    // A conflict injected by the API server is a conflict too; an outage is not.
    server.inject(ApiFault::new(Some("update"), Some("jukeboxes/status"), 1, ApiFaultAction::Status(409)));
    let injected = store.write_status("box", &version, &JukeBoxStatus::default()).await;
    assert!(matches!(injected, Err(StoreError::Conflict(_))), "{injected:?}");
    server.inject(ApiFault::new(Some("update"), Some("jukeboxes/status"), 1, ApiFaultAction::Status(500)));
    let outage = store.write_status("box", &version, &JukeBoxStatus::default()).await;
    assert!(matches!(outage, Err(StoreError::Unavailable(_))), "{outage:?}");
    assert_eq!(store.list().await?.len(), 1);

    // A JukeBox deleted meanwhile: a conflict, and the re-read finds it gone.
    Api::<JukeBox>::all(client.clone()).delete("box", &Default::default()).await?;
    assert!(matches!(
        store.write_status("box", &version, &JukeBoxStatus::default()).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(store.get("box").await?.is_none());
    let mut deleted = None;
    while let Some(change) = next_change(&mut changes, "box").await {
        if matches!(change, StoreChange::Deleted(_)) {
            deleted = Some(change);
            break;
        }
    }
    assert_eq!(deleted, Some(StoreChange::Deleted("box".into())), "the deletion is announced");
    Ok(())
}

#[tokio::test]
async fn an_annotation_is_removed_only_while_it_keeps_its_value() -> TestResult {
    let server = FakeApiServer::start().await?;
    server.create_namespaces(&["vynil-system", "apps"])?;
    let client = server.client()?;
    let store = KubeStore::new(client.clone());
    let api = Api::<JukeBox>::all(client.clone());
    api.create(&PostParams::default(), &jukebox("box")?).await?;
    // A newer request replaced the value: removing the old one keeps it.
    let newer = json!({"metadata": {"annotations": {"vynil.solidite.fr/force-scan": "true"}}});
    api.patch("box", &PatchParams::default(), &Patch::Merge(&newer)).await?;
    assert!(!store.remove_annotation("box", "vynil.solidite.fr/force-scan", "apps/x").await?);
    assert!(store.remove_annotation("box", "vynil.solidite.fr/force-scan", "true").await?);
    let annotations = store.get("box").await?.map(|r| r.annotations).unwrap_or_default();
    assert!(annotations.is_empty(), "{annotations:?}");
    assert!(!store.remove_annotation("gone", "vynil.solidite.fr/force-scan", "true").await?);
    // Nobody subscribed to this store (as the purger's): it never watched.
    assert!(!server.requests().iter().any(|r| r.verb == "watch"), "{:?}", server.requests());
    Ok(())
}

/// A trusted root's ConfigMap (`spec.verify.trustedRoot.configMap`) is read
/// in the control plane's namespace only when it opted in, as a Secret.
#[tokio::test]
async fn a_config_map_is_read_only_once_it_opted_in() -> TestResult {
    use k8s_openapi::api::core::v1::ConfigMap;
    let server = FakeApiServer::start().await?;
    server.create_namespaces(&["vynil-system"])?;
    let client = server.client()?;
    let store = KubeStore::new(client.clone());
    // The client's namespace is the control plane's.
    let config_maps: Api<ConfigMap> = Api::default_namespaced(client);
    let absent = store.config_map("sigstore").await.map(|_| ()).unwrap_err().to_string();
    assert!(absent.contains("does not exist in namespace"), "{absent}");
    let mut root: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "sigstore"},
        "data": {"trusted_root.json": "{}"},
    }))?;
    config_maps.create(&PostParams::default(), &root).await?;
    let refused = store.config_map("sigstore").await.map(|_| ()).unwrap_err().to_string();
    assert!(refused.contains("[E_SECRET_NOT_ALLOWED] ConfigMap sigstore"), "{refused}");
    root.metadata.labels = Some([(vynil_crds::secrets::OPT_IN_LABEL.to_string(), "true".to_string())].into());
    config_maps.patch("sigstore", &PatchParams::default(), &Patch::Merge(&root)).await?;
    let read = store.config_map("sigstore").await?;
    assert_eq!(read.data.get("trusted_root.json").map(Vec::as_slice), Some(&b"{}"[..]));
    Ok(())
}
