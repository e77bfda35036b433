//! The test kit's real parts do what later tests rely on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use reqwest::StatusCode;
use vynil_testkit::{ArtifactKind, PackageSpec, PackageType, RedisServer, RegistryOptions, RegistryServer};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

async fn get_manifest(registry: &RegistryServer, repository: &str, reference: &str) -> reqwest::Response {
    reqwest::Client::new()
        .get(format!("{}/v2/{repository}/manifests/{reference}", registry.base_url()))
        .header("Accept", OCI_MANIFEST)
        .send()
        .await
        .unwrap()
}

async fn tags(registry: &RegistryServer, repository: &str) -> Vec<String> {
    let body: serde_json::Value = reqwest::get(format!("{}/v2/{repository}/tags/list", registry.base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut tags: Vec<String> = body["tags"]
        .as_array()
        .map(|a| a.iter().filter_map(|t| t.as_str().map(String::from)).collect())
        .unwrap_or_default();
    tags.sort();
    tags
}

#[tokio::test]
async fn published_packages_read_back_with_their_annotations_and_digests() {
    let registry = RegistryServer::start().await.unwrap();
    let publisher = registry.publisher();
    let specs = [
        ("think/ollama", PackageSpec::new("think", "ollama", PackageType::Tenant, "0.1.8").min("0.1.0")),
        ("think/ollama", PackageSpec::new("think", "ollama", PackageType::Service, "0.1.10").vynil("0.7.0")),
        ("db/pg", PackageSpec::new("db", "pg", PackageType::System, "v1.2.0").value_script("#{ a: 1 }")),
    ];
    let items: Vec<(String, PackageSpec)> = specs.iter().map(|(r, s)| (r.to_string(), s.clone())).collect();
    let digests = publisher.publish_all(&items, 4).await.unwrap();

    for ((repository, spec), digest) in specs.iter().zip(&digests) {
        let response = get_manifest(&registry, repository, &spec.tag).await;
        assert_eq!(response.status(), StatusCode::OK);
        let header = response.headers()["Docker-Content-Digest"].to_str().unwrap().to_string();
        assert_eq!(&header, digest);
        let manifest: serde_json::Value = response.json().await.unwrap();
        for (key, value) in spec.annotations() {
            assert_eq!(manifest["annotations"][&key], value, "{repository}:{} {key}", spec.tag);
        }
    }
    assert_ne!(digests[0], digests[1], "each revision has its own digest");
    assert_eq!(tags(&registry, "think/ollama").await, ["0.1.10", "0.1.8"]);
}

#[tokio::test]
async fn deleting_a_digest_removes_it_and_its_alias_tag() {
    let registry = RegistryServer::start().await.unwrap();
    let publisher = registry.publisher();
    let digest = publisher
        .publish("apps/x", &PackageSpec::new("apps", "x", PackageType::Tenant, "1.0.0"))
        .await
        .unwrap();
    let alias_digest = publisher.alias("apps/x", "1.0.0", "latest").await.unwrap();
    assert_eq!(alias_digest, digest);
    publisher.publish_plain("apps/x", "4.0").await.unwrap();
    assert_eq!(tags(&registry, "apps/x").await, ["1.0.0", "4.0", "latest"]);

    let deleted = reqwest::Client::new()
        .delete(format!("{}/v2/apps/x/manifests/{digest}", registry.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::ACCEPTED);

    assert_eq!(get_manifest(&registry, "apps/x", &digest).await.status(), StatusCode::NOT_FOUND);
    assert_eq!(get_manifest(&registry, "apps/x", "latest").await.status(), StatusCode::NOT_FOUND);
    assert_eq!(get_manifest(&registry, "apps/x", "1.0.0").await.status(), StatusCode::NOT_FOUND);
    assert_eq!(tags(&registry, "apps/x").await, ["4.0"]);
}

#[tokio::test]
async fn repointing_a_tag_changes_its_digest() {
    let registry = RegistryServer::start().await.unwrap();
    let publisher = registry.publisher();
    let first = publisher
        .publish("apps/y", &PackageSpec::new("apps", "y", PackageType::Tenant, "1.0.0"))
        .await
        .unwrap();
    let second = publisher
        .publish("apps/y", &PackageSpec::new("apps", "y", PackageType::Service, "1.0.0"))
        .await
        .unwrap();
    assert_ne!(first, second);
    let response = get_manifest(&registry, "apps/y", "1.0.0").await;
    assert_eq!(response.headers()["Docker-Content-Digest"].to_str().unwrap(), second);
}

#[tokio::test]
async fn artifacts_are_tagged_after_their_subject_digest() {
    let registry = RegistryServer::start().await.unwrap();
    let publisher = registry.publisher();
    let digest = publisher
        .publish("apps/z", &PackageSpec::new("apps", "z", PackageType::Tenant, "1.0.0"))
        .await
        .unwrap();
    let sig = publisher.attach("apps/z", &digest, ArtifactKind::Signature).await.unwrap();
    let sbom = publisher.attach("apps/z", &digest, ArtifactKind::Sbom).await.unwrap();
    let hex = digest.trim_start_matches("sha256:");
    assert_eq!(sig, format!("sha256-{hex}.sig"));
    let mut expected = vec!["1.0.0".to_string(), sig, sbom];
    expected.sort();
    assert_eq!(tags(&registry, "apps/z").await, expected);
}

#[tokio::test]
async fn basic_auth_is_refused_without_credentials_and_accepted_with_them() {
    let registry = RegistryServer::start_with(RegistryOptions {
        basic_auth: Some(("vynil".into(), "s3cret-pass".into())),
        ..Default::default()
    })
    .await
    .unwrap();
    let url = format!("{}/v2/", registry.base_url());
    let anonymous = reqwest::get(&url).await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let wrong = reqwest::Client::new().get(&url).basic_auth("vynil", Some("nope")).send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let right =
        reqwest::Client::new().get(&url).basic_auth("vynil", Some("s3cret-pass")).send().await.unwrap();
    assert_eq!(right.status(), StatusCode::OK);

    // The publisher carries the credentials.
    let digest = registry
        .publisher()
        .publish("apps/auth", &PackageSpec::new("apps", "auth", PackageType::Tenant, "1.0.0"))
        .await
        .unwrap();
    assert!(digest.starts_with("sha256:"));
}

#[tokio::test]
async fn two_redis_servers_run_side_by_side_and_stop_on_drop() {
    let a = RedisServer::start().await.unwrap();
    let b = RedisServer::start().await.unwrap();
    assert_ne!(a.port(), b.port());

    let mut ca = redis::Client::open(a.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let mut cb = redis::Client::open(b.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET").arg("k").arg("in-a").query_async(&mut ca).await.unwrap();
    let in_b: Option<String> = redis::cmd("GET").arg("k").query_async(&mut cb).await.unwrap();
    assert_eq!(in_b, None);
    let in_a: Option<String> = redis::cmd("GET").arg("k").query_async(&mut ca).await.unwrap();
    assert_eq!(in_a.as_deref(), Some("in-a"));

    let port = a.port();
    drop(a);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err(), "killed on drop");
}

#[tokio::test]
async fn a_fixture_is_built_once_and_each_test_gets_a_private_copy() {
    let key = format!("testkit-selftest-{}", std::process::id());
    let builds = std::sync::atomic::AtomicUsize::new(0);
    let build = |registry: RegistryServer| {
        builds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            registry
                .publisher()
                .publish("apps/f", &PackageSpec::new("apps", "f", PackageType::Tenant, "1.0.0"))
                .await?;
            Ok(registry)
        }
    };
    let first = RegistryServer::from_fixture(&key, build).await.unwrap();
    let second = RegistryServer::from_fixture(&key, build).await.unwrap();
    assert_eq!(builds.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(tags(&first, "apps/f").await, ["1.0.0"]);

    // Writing to one copy does not touch the other.
    first.publisher().publish_plain("apps/f", "extra").await.unwrap();
    assert_eq!(tags(&second, "apps/f").await, ["1.0.0"]);
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join("vynil-testkit-fixtures").join(&key));
}
