//! The client against a real CNCF distribution registry.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use common::*;
use vynil_registry::{CredentialStore, Credentials, DeletionOutcome, ManifestMetadata, RegistryError};
use vynil_testkit::{ArtifactKind, PackageSpec, PackageType, RegistryOptions, RegistryServer};

#[tokio::test]
async fn tags_digests_annotations_and_aliases_read_back() {
    let registry = RegistryServer::start().await.unwrap();
    let publisher = registry.publisher();
    let spec = PackageSpec::new("think", "ollama", PackageType::Tenant, "0.1.8")
        .min("0.1.0")
        .value_script("#{ a: 1 }");
    let digest = publisher.publish("think/ollama", &spec).await.unwrap();
    publisher.alias("think/ollama", "0.1.8", "latest").await.unwrap();
    publisher.publish_plain("think/ollama", "4.0").await.unwrap();

    let client = client(&registry.host(), CredentialStore::default());
    let repo = repo(&registry.host(), "think/ollama");
    let mut tags = client.list_tags(&repo).await.unwrap();
    tags.sort();
    assert_eq!(tags, ["0.1.8", "4.0", "latest"]);
    assert_eq!(client.head_digest(&repo, "0.1.8").await.unwrap().as_deref(), Some(digest.as_str()));
    assert_eq!(client.head_digest(&repo, "latest").await.unwrap().as_deref(), Some(digest.as_str()));
    assert_eq!(client.head_digest(&repo, "9.9.9").await.unwrap(), None);

    let manifest = client.get_manifest(&repo, "0.1.8").await.unwrap().unwrap();
    assert_eq!(manifest.digest, digest);
    for (key, value) in spec.annotations() {
        assert_eq!(manifest.annotations.get(&key), Some(&value), "{key}");
    }

    let meta = client.tag_metadata(&repo, "0.1.8").await.unwrap().unwrap();
    let ManifestMetadata::Vynil(content) = meta.metadata else { panic!("not vynil: {meta:?}") };
    assert_eq!(content.metadata.package_type, vynil_rules::PackageType::Tenant);
    assert_eq!(content.value_script_source().unwrap().as_deref(), Some("#{ a: 1 }"));
    let plain = client.tag_metadata(&repo, "4.0").await.unwrap().unwrap();
    assert_eq!(plain.metadata, ManifestMetadata::NotVynil);
}

#[tokio::test]
async fn deleting_a_shared_digest_is_verified_and_reports_both_tags_gone() {
    let registry = RegistryServer::start().await.unwrap();
    let publisher = registry.publisher();
    let digest = publisher
        .publish("apps/x", &PackageSpec::new("apps", "x", PackageType::Tenant, "1.0.0"))
        .await
        .unwrap();
    publisher.alias("apps/x", "1.0.0", "stable").await.unwrap();
    publisher.publish("apps/x", &PackageSpec::new("apps", "x", PackageType::Tenant, "2.0.0")).await.unwrap();

    let client = client(&registry.host(), CredentialStore::default());
    let repo = repo(&registry.host(), "apps/x");
    let tags = vec!["1.0.0".to_string(), "stable".to_string()];
    let outcome = client.delete_digest(&repo, &digest, &tags).await;
    assert_eq!(outcome, DeletionOutcome::Deleted { tags: tags.clone() });
    assert_eq!(client.list_tags(&repo).await.unwrap(), ["2.0.0"]);
    assert_eq!(client.head_digest(&repo, &digest).await.unwrap(), None);

    assert_eq!(client.delete_digest(&repo, &digest, &tags).await, DeletionOutcome::AlreadyGone);
}

#[tokio::test]
async fn a_delete_that_did_not_happen_is_never_reported_done() {
    let registry = RegistryServer::start().await.unwrap();
    let publisher = registry.publisher();
    let digest = publisher
        .publish("apps/y", &PackageSpec::new("apps", "y", PackageType::Tenant, "1.0.0"))
        .await
        .unwrap();
    let client = client(&registry.host(), CredentialStore::default());
    let repo = repo(&registry.host(), "apps/y");
    // Deleting by tag is refused by distribution; by a digest of the wrong form too.
    let outcome = client.delete_digest(&repo, "1.0.0", &["1.0.0".into()]).await;
    assert!(matches!(outcome, DeletionOutcome::Failed { status: Some(400..=499), .. }), "{outcome:?}");
    assert_eq!(client.head_digest(&repo, &digest).await.unwrap().as_deref(), Some(digest.as_str()));
}

#[tokio::test]
async fn artifacts_fall_back_to_the_cosign_tag_convention_when_referrers_are_not_offered() {
    let registry = RegistryServer::start().await.unwrap();
    let publisher = registry.publisher();
    let digest = publisher
        .publish("apps/s", &PackageSpec::new("apps", "s", PackageType::Tenant, "1.0.0"))
        .await
        .unwrap();
    let sig = publisher.attach("apps/s", &digest, ArtifactKind::Signature).await.unwrap();
    let sbom = publisher.attach("apps/s", &digest, ArtifactKind::Sbom).await.unwrap();
    let client = client(&registry.host(), CredentialStore::default());
    let repo = repo(&registry.host(), "apps/s");
    let tags = client.list_tags(&repo).await.unwrap();
    let mut artifacts: Vec<(Option<String>, String)> =
        client.artifacts(&repo, &digest, &tags).await.unwrap().into_iter().map(|a| (a.tag, a.kind)).collect();
    artifacts.sort();
    let mut expected = vec![(Some(sig), "signature".to_string()), (Some(sbom), "SBOM".to_string())];
    expected.sort();
    assert_eq!(artifacts, expected);
}

#[tokio::test]
async fn basic_auth_works_with_the_right_credentials_and_fails_clearly_without_leaking_them() {
    let registry = RegistryServer::start_with(RegistryOptions {
        basic_auth: Some(("robot".into(), "correct-horse".into())),
        ..Default::default()
    })
    .await
    .unwrap();
    registry
        .publisher()
        .publish("apps/a", &PackageSpec::new("apps", "a", PackageType::Tenant, "1.0.0"))
        .await
        .unwrap();
    let host = registry.host();

    let good =
        client(&host, CredentialStore::default().with(&host, Credentials::basic("robot", "correct-horse")));
    assert_eq!(good.list_tags(&repo(&host, "apps/a")).await.unwrap(), ["1.0.0"]);

    let bad =
        client(&host, CredentialStore::default().with(&host, Credentials::basic("robot", "wrong-battery")));
    let error = bad.list_tags(&repo(&host, "apps/a")).await.unwrap_err();
    assert!(matches!(error, RegistryError::Unauthorized { status: 401, .. }), "{error:?}");
    for text in [error.to_string(), format!("{error:?}"), format!("{bad:?}")] {
        assert!(!text.contains("wrong-battery") && !text.contains("correct-horse"), "secret leaked: {text}");
    }
    assert!(error.to_string().contains("check the pull secret"), "{error}");
}

#[tokio::test]
async fn an_oci_index_without_annotations_takes_those_of_its_image() {
    let registry = RegistryServer::start().await.unwrap();
    let publisher = registry.publisher();
    let spec = PackageSpec::new("apps", "i", PackageType::System, "1.0.0");
    let image = publisher.publish("apps/i", &spec).await.unwrap();
    let index = publisher.push_index("apps/i", "1.0.0-multi", std::slice::from_ref(&image)).await.unwrap();
    assert_ne!(index, image);

    let client = client(&registry.host(), CredentialStore::default());
    let repo = repo(&registry.host(), "apps/i");
    assert_eq!(client.head_digest(&repo, "1.0.0-multi").await.unwrap().as_deref(), Some(index.as_str()));
    let meta = client.tag_metadata(&repo, "1.0.0-multi").await.unwrap().unwrap();
    assert_eq!(meta.digest, index);
    let ManifestMetadata::Vynil(content) = meta.metadata else { panic!("index not resolved: {meta:?}") };
    assert_eq!(content.metadata.package_type, vynil_rules::PackageType::System);
}
