//! Real-world faults between the client and a real registry, injected and
//! counted by the test kit's front: each has its documented outcome, none
//! panics, and healthy repositories in the same run succeed.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::http::Method;
use common::*;
use vynil_registry::{CredentialStore, Credentials, RegistryError};
use vynil_testkit::{Fault, FaultAction, HttpFront, PackageSpec, PackageType, RegistryServer};

async fn setup() -> (RegistryServer, HttpFront) {
    let registry = RegistryServer::start().await.unwrap();
    let publisher = registry.publisher();
    for repository in ["good/a", "bad/b"] {
        let (category, name) = repository.split_once('/').unwrap();
        for tag in ["1.0.0", "2.0.0"] {
            publisher
                .publish(repository, &PackageSpec::new(category, name, PackageType::Tenant, tag))
                .await
                .unwrap();
        }
    }
    let front = HttpFront::start(&registry.base_url()).await.unwrap();
    (registry, front)
}

#[tokio::test]
async fn transient_500s_are_retried_and_persistent_ones_reported_with_the_status() {
    let (_registry, front) = setup().await;
    let client = client(&front.host(), CredentialStore::default());
    front.inject(Fault::new(Some(Method::GET), "/v2/good/a/tags", 2, FaultAction::Status(500)));
    let mut tags = client.list_tags(&repo(&front.host(), "good/a")).await.unwrap();
    tags.sort();
    assert_eq!(tags, ["1.0.0", "2.0.0"]);
    assert_eq!(front.count(&Method::GET, "/v2/good/a/tags"), 3, "two failures, then success");

    front.inject(Fault::new(Some(Method::GET), "/v2/bad/b/tags", usize::MAX, FaultAction::Status(503)));
    let error = client.list_tags(&repo(&front.host(), "bad/b")).await.unwrap_err();
    assert!(
        matches!(error, RegistryError::Registry { status: 503, ref code, .. } if code == "INJECTED"),
        "{error:?}"
    );
    assert!(error.is_transient());
    assert_eq!(front.count(&Method::GET, "/v2/bad/b/tags"), 3, "bounded attempts");
    // The healthy repository still answers in the same run.
    assert_eq!(client.list_tags(&repo(&front.host(), "good/a")).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_429_is_honoured_with_its_retry_after() {
    let (_registry, front) = setup().await;
    let client = client(&front.host(), CredentialStore::default());
    front.inject(Fault::new(
        None,
        "/v2/good/a/manifests/1.0.0",
        1,
        FaultAction::TooManyRequests { retry_after_secs: 1 },
    ));
    let start = Instant::now();
    let digest = client.head_digest(&repo(&front.host(), "good/a"), "1.0.0").await.unwrap();
    assert!(digest.is_some());
    assert!(start.elapsed() >= Duration::from_millis(950), "waited {:?}", start.elapsed());

    front.inject(Fault::new(
        None,
        "/v2/bad/b/",
        usize::MAX,
        FaultAction::TooManyRequests { retry_after_secs: 0 },
    ));
    let error = client.head_digest(&repo(&front.host(), "bad/b"), "1.0.0").await.unwrap_err();
    assert!(matches!(error, RegistryError::RateLimited { attempts: 3, .. }), "{error:?}");
}

#[tokio::test]
async fn an_answer_slower_than_the_timeout_is_a_timeout_error() {
    let (_registry, front) = setup().await;
    let client = client(&front.host(), CredentialStore::default());
    front.inject(Fault::new(None, "/v2/bad/b/", usize::MAX, FaultAction::Delay(Duration::from_secs(3))));
    let error = client.list_tags(&repo(&front.host(), "bad/b")).await.unwrap_err();
    assert!(matches!(error, RegistryError::Timeout { attempts: 3, .. }), "{error:?}");
    assert_eq!(client.list_tags(&repo(&front.host(), "good/a")).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_truncated_body_is_retried_then_reported() {
    let (_registry, front) = setup().await;
    let client = client(&front.host(), CredentialStore::default());
    let repo_a = repo(&front.host(), "good/a");
    front.inject(Fault::new(Some(Method::GET), "/v2/good/a/manifests/", 1, FaultAction::Truncate));
    let manifest = client.get_manifest(&repo_a, "1.0.0").await.unwrap();
    assert!(manifest.is_some(), "recovered on retry");

    front.inject(Fault::new(Some(Method::GET), "/v2/bad/b/manifests/", usize::MAX, FaultAction::Truncate));
    let error = client.get_manifest(&repo(&front.host(), "bad/b"), "1.0.0").await.unwrap_err();
    assert!(
        matches!(error, RegistryError::Unreachable { ref problem, .. } if problem.contains("truncated")),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_manifest_read_by_tag_must_hash_to_the_digest_the_registry_names() {
    let (_registry, front) = setup().await;
    let client = client(&front.host(), CredentialStore::default());
    front.inject(Fault::new(Some(Method::GET), "/v2/good/a/manifests/", usize::MAX, FaultAction::Tamper));
    let error = client.tag_metadata(&repo(&front.host(), "good/a"), "1.0.0").await.unwrap_err();
    assert!(
        matches!(error, RegistryError::InvalidBody { ref problem, .. } if problem.contains("the registry names digest")),
        "{error:?}"
    );
    assert_eq!(front.count(&Method::HEAD, "/v2/good/a/manifests/"), 0, "a tag never seen: one GET, no HEAD");
}

#[tokio::test]
async fn an_over_size_manifest_is_refused_without_retry() {
    let (_registry, front) = setup().await;
    let client = client(&front.host(), CredentialStore::default());
    front.inject(Fault::new(
        Some(Method::GET),
        "/v2/bad/b/manifests/",
        usize::MAX,
        FaultAction::Oversize(5 * 1024 * 1024),
    ));
    let error = client.get_manifest(&repo(&front.host(), "bad/b"), "1.0.0").await.unwrap_err();
    assert!(matches!(error, RegistryError::TooLarge { limit: 4_194_304, .. }), "{error:?}");
    assert_eq!(front.count(&Method::GET, "/v2/bad/b/manifests/"), 1);
}

#[tokio::test]
async fn metadata_is_read_once_per_digest_counted_at_the_front() {
    let (registry, front) = setup().await;
    let client = client(&front.host(), CredentialStore::default());
    let repo_a = repo(&front.host(), "good/a");
    for tag in ["1.0.0", "2.0.0"] {
        client.tag_metadata(&repo_a, tag).await.unwrap().unwrap();
    }
    assert_eq!(front.count(&Method::GET, "/manifests/"), 2, "first scan reads each manifest once");

    front.reset_counts();
    for tag in ["1.0.0", "2.0.0"] {
        client.tag_metadata(&repo_a, tag).await.unwrap().unwrap();
    }
    assert_eq!(front.count(&Method::GET, "/manifests/"), 0, "rescan of unchanged tags: zero manifest GETs");
    assert_eq!(front.count(&Method::HEAD, "/manifests/"), 2, "tags are resolved by HEAD");

    registry
        .publisher()
        .publish("good/a", &PackageSpec::new("good", "a", PackageType::Service, "2.0.0"))
        .await
        .unwrap();
    front.reset_counts();
    for tag in ["1.0.0", "2.0.0"] {
        client.tag_metadata(&repo_a, tag).await.unwrap().unwrap();
    }
    assert_eq!(front.count(&Method::GET, "/manifests/"), 1, "only the re-pointed tag is read");
}

#[tokio::test]
async fn the_bearer_flow_gets_a_token_from_the_challenge_realm() {
    let (_registry, front) = bearer_front().await;
    let host = front.host();

    let good =
        client(&host, CredentialStore::default().with(&host, Credentials::basic("robot", "token-pass")));
    assert_eq!(good.list_tags(&repo(&host, "apps/t")).await.unwrap(), ["1.0.0"]);
    assert_eq!(good.list_tags(&repo(&host, "apps/t")).await.unwrap(), ["1.0.0"]);
    assert_eq!(front.count(&Method::GET, "/token"), 1, "the token is cached");

    let bad = client(&host, CredentialStore::default().with(&host, Credentials::basic("robot", "nope")));
    let error = bad.list_tags(&repo(&host, "apps/t")).await.unwrap_err();
    assert!(matches!(error, RegistryError::Unauthorized { .. }), "{error:?}");
    assert!(!format!("{error} {error:?}").contains("nope"));
}

/// Security review item 1: a token realm off the registry's site gets no
/// basic credentials unless configured; the error says how.
#[tokio::test]
async fn a_token_realm_on_another_host_gets_no_credentials_unless_configured() {
    let (_registry, front) = bearer_front().await;
    // The registry as `localhost:<port>`; its challenge names `127.0.0.1:<port>`.
    let port = front.host().rsplit_once(':').unwrap().1.to_string();
    let (named, realm) = (format!("localhost:{port}"), front.host());
    let store = || CredentialStore::default().with(&named, Credentials::basic("robot", "token-pass"));
    let refused = client(&named, store()).list_tags(&repo(&named, "apps/t")).await.unwrap_err();
    assert!(matches!(refused, RegistryError::Unauthorized { .. }), "{refused:?}");
    assert!(refused.to_string().contains(&format!("--credential-host {named}={realm}")), "{refused}");
    // The credentials are right: the token service refused because it was not sent them.
    assert!(front.count(&Method::GET, "/token") >= 1);

    let mut config = common::config(&named);
    config.credential_hosts = vec![(named.clone(), realm)];
    let allowed = vynil_registry::RegistryClient::new(
        config,
        store(),
        std::sync::Arc::new(vynil_registry::InMemoryMetadataCache::default()),
    )
    .unwrap();
    assert_eq!(allowed.list_tags(&repo(&named, "apps/t")).await.unwrap(), ["1.0.0"]);
}

async fn bearer_front() -> (RegistryServer, HttpFront) {
    let registry = RegistryServer::start().await.unwrap();
    registry
        .publisher()
        .publish("apps/t", &PackageSpec::new("apps", "t", PackageType::Tenant, "1.0.0"))
        .await
        .unwrap();
    let front = HttpFront::start_with_bearer(&registry.base_url(), "robot", "token-pass").await.unwrap();
    (registry, front)
}

#[tokio::test]
async fn more_concurrent_401s_than_permits_fetch_one_token_and_all_complete() {
    let (_registry, front) = bearer_front().await;
    let host = front.host();
    let mut config = config(&host);
    config.per_registry_concurrency = 2;
    let credentials = CredentialStore::default().with(&host, Credentials::basic("robot", "token-pass"));
    let client = std::sync::Arc::new(
        vynil_registry::RegistryClient::new(
            config,
            credentials,
            std::sync::Arc::new(vynil_registry::InMemoryMetadataCache::default()),
        )
        .unwrap(),
    );
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let client = client.clone();
        let repo = repo(&host, "apps/t");
        requests.spawn(async move { client.list_tags(&repo).await });
    }
    // A deadlock detector, not a performance bound: the requests never end without the fix.
    let all = tokio::time::timeout(Duration::from_secs(30), requests.join_all()).await;
    let all = all.expect("requests holding every permit while waiting for a token deadlock");
    for tags in all {
        assert_eq!(tags.unwrap(), ["1.0.0"]);
    }
    assert_eq!(front.count(&Method::GET, "/token"), 1, "one token request for eight 401s");
}

#[tokio::test]
async fn a_token_is_renewed_after_its_expires_in_without_being_refused_first() {
    let (_registry, front) = bearer_front().await;
    front.set_token_lifetime(1);
    let host = front.host();
    let client =
        client(&host, CredentialStore::default().with(&host, Credentials::basic("robot", "token-pass")));
    assert_eq!(client.list_tags(&repo(&host, "apps/t")).await.unwrap(), ["1.0.0"]);
    assert_eq!(front.seen().len(), 3, "refused, token, served");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    front.expire_tokens();
    front.reset_counts();
    assert_eq!(client.list_tags(&repo(&host, "apps/t")).await.unwrap(), ["1.0.0"]);
    let seen: Vec<_> = front.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(seen.len(), 2, "a new token, then the request, with no 401 in between: {seen:?}");
    assert!(seen[0].starts_with("/token"), "{seen:?}");
}

#[tokio::test]
async fn a_revoked_token_is_replaced_once_and_the_request_succeeds() {
    let (_registry, front) = bearer_front().await;
    let host = front.host();
    let client =
        client(&host, CredentialStore::default().with(&host, Credentials::basic("robot", "token-pass")));
    assert_eq!(client.list_tags(&repo(&host, "apps/t")).await.unwrap(), ["1.0.0"]);
    front.expire_tokens();
    front.reset_counts();
    assert_eq!(client.list_tags(&repo(&host, "apps/t")).await.unwrap(), ["1.0.0"]);
    assert_eq!(front.count(&Method::GET, "/token"), 1);
    assert_eq!(front.count(&Method::GET, "/tags/list"), 2, "refused once, then served");
}

/// A registry's tag list that pages as the distribution spec says (`n`,
/// `last`, a `Link` to the next page), over `count` tags, counting requests.
/// Distribution 2.8 answers every tag in one page whatever `n` asks, so the
/// real registry cannot show where a listing stops.
async fn paging_tag_list(count: usize) -> (String, Arc<AtomicUsize>) {
    use axum::{extract::Query, response::IntoResponse};
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let tags: Vec<String> = (0..count).map(|i| format!("1.{i}.0")).collect();
    let list = move |Query(query): Query<std::collections::HashMap<String, String>>| {
        let (tags, counter) = (tags.clone(), counter.clone());
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            let n: usize = query.get("n").and_then(|n| n.parse().ok()).unwrap_or(tags.len());
            let start =
                query.get("last").and_then(|l| tags.iter().position(|t| t == l)).map_or(0, |at| at + 1);
            let page: Vec<&String> = tags.iter().skip(start).take(n).collect();
            let body = serde_json::json!({ "name": "big/r", "tags": page }).to_string();
            let mut headers = axum::http::HeaderMap::new();
            headers.insert("content-type", "application/json".parse().unwrap());
            if let (Some(last), true) = (page.last(), start + n < tags.len()) {
                let link = format!("</v2/big/r/tags/list?n={n}&last={last}>; rel=\"next\"");
                headers.insert("link", link.parse().unwrap());
            }
            (headers, body).into_response()
        }
    };
    let app = axum::Router::new()
        .route("/v2/", axum::routing::get(|| async { "{}" }))
        .route("/v2/big/r/tags/list", axum::routing::get(list));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (host, asked)
}

#[tokio::test]
async fn a_listing_over_its_cap_stops_at_the_page_that_passes_it() {
    let (host, asked) = paging_tag_list(10).await;
    let client = client(&host, CredentialStore::default());
    let big = repo(&host, "big/r");

    // Pages of cap + 1 = 3 tags: the first already passes the cap, and the
    // other three pages are never asked for.
    let error = client.list_tags_at_most(&big, 2).await.unwrap_err();
    assert_eq!(error, RegistryError::TooManyTags { what: format!("tags of {big}"), listed: 3, cap: 2 });
    assert!(error.to_string().contains("3 tags, over the cap of 2"), "{error}");
    assert_eq!(asked.swap(0, Ordering::SeqCst), 1, "listing stopped at the first page");

    let error = client.list_tags_at_most(&big, 4).await.unwrap_err();
    assert!(matches!(error, RegistryError::TooManyTags { listed: 5, cap: 4, .. }), "{error:?}");
    assert_eq!(asked.swap(0, Ordering::SeqCst), 1);

    let tags = client.list_tags_at_most(&big, 10).await.unwrap();
    assert_eq!(tags.len(), 10, "at the cap is within it");
    assert_eq!(asked.swap(0, Ordering::SeqCst), 1, "one page of 11");

    assert_eq!(client.list_tags_at_most(&big, 12).await.unwrap(), tags);
    let all = client.list_tags(&big).await.unwrap();
    assert_eq!(all, tags, "every page followed without a cap");
}

#[tokio::test]
async fn a_listing_without_pages_is_held_to_its_cap_too() {
    // Distribution 2.8 answers one page whatever `n` asks.
    let registry = RegistryServer::start().await.unwrap();
    let publisher = registry.publisher();
    for tag in ["1.0.0", "1.1.0", "1.2.0"] {
        publisher.publish("big/r", &PackageSpec::new("big", "r", PackageType::Tenant, tag)).await.unwrap();
    }
    let client = client(&registry.host(), CredentialStore::default());
    let big = repo(&registry.host(), "big/r");
    let error = client.list_tags_at_most(&big, 2).await.unwrap_err();
    assert!(matches!(error, RegistryError::TooManyTags { listed: 3, cap: 2, .. }), "{error:?}");
    assert_eq!(client.list_tags_at_most(&big, 3).await.unwrap().len(), 3);
}
