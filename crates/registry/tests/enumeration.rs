//! Tag pagination and repository enumeration against in-test servers that
//! speak the documented JSON and pagination headers (distribution 2.8 ignores
//! `n`, so `Link` pagination is tested here).

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use axum::{
    Json, Router,
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
    routing::get,
};
use common::*;
use serde_json::json;
use vynil_registry::{CredentialStore, Credentials, RegistryError, sources::Source};

/// Serves `router` on a loopback port; returns `127.0.0.1:<port>`.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr.to_string()
}

type Seen = Arc<Mutex<Vec<String>>>;

fn auth(headers: &HeaderMap) -> String {
    headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string()
}

#[tokio::test]
async fn tags_are_read_across_every_link_page() {
    let all: Vec<String> = (1..=8).map(|i| format!("1.0.{i}")).collect();
    let pages: Seen = Arc::default();
    let router = Router::new()
        .route(
            "/v2/{ns}/{name}/tags/list",
            get(
                |State((all, pages)): State<(Vec<String>, Seen)>,
                 Query(q): Query<HashMap<String, String>>| async move {
                    pages.lock().unwrap().push(q.get("last").cloned().unwrap_or_default());
                    let start = q
                        .get("last")
                        .and_then(|last| all.iter().position(|t| t == last))
                        .map_or(0, |p| p + 1);
                    let page: Vec<&String> = all.iter().skip(start).take(3).collect();
                    let mut headers = HeaderMap::new();
                    if start + 3 < all.len() {
                        let link =
                            format!("</v2/apps/x/tags/list?last={}&n=3>; rel=\"next\"", page.last().unwrap());
                        headers.insert("link", link.parse().unwrap());
                    }
                    (headers, Json(json!({"name": "apps/x", "tags": page})))
                },
            ),
        )
        .with_state((all.clone(), pages.clone()));
    let host = serve(router).await;
    let tags = client(&host, CredentialStore::default()).list_tags(&repo(&host, "apps/x")).await.unwrap();
    assert_eq!(tags, all, "no silent truncation");
    assert_eq!(pages.lock().unwrap().len(), 3);
}

fn harbor_router(seen: Seen) -> Router {
    Router::new()
        .route(
            "/service/token",
            get(|Query(q): Query<HashMap<String, String>>| async move {
                assert_eq!(q.get("service").map(String::as_str), Some("harbor-registry"));
                assert_eq!(q.get("scope").map(String::as_str), Some("repository:vynil/*:pull"));
                Json(json!({"token": "anonymous-token"}))
            }),
        )
        .route(
            "/api/v2.0/projects/{project}/repositories",
            get(
                |State(seen): State<Seen>,
                 Path(project): Path<String>,
                 Query(q): Query<HashMap<String, String>>,
                 headers: HeaderMap| async move {
                    seen.lock().unwrap().push(auth(&headers));
                    if project != "vynil" {
                        return StatusCode::NOT_FOUND.into_response();
                    }
                    let page: usize = q["page"].parse().unwrap();
                    let size: usize = q["page_size"].parse().unwrap();
                    let names: Vec<_> =
                        (0..23).map(|i| json!({"id": i, "name": format!("vynil/pkg-{i:02}")})).collect();
                    let items: Vec<_> = names.into_iter().skip((page - 1) * size).take(size).collect();
                    ([("x-total-count", "23")], Json(items)).into_response()
                },
            ),
        )
        .with_state(seen)
}

#[tokio::test]
async fn a_harbor_project_is_listed_across_pages_with_an_anonymous_token_or_basic_auth() {
    let seen: Seen = Arc::default();
    let host = serve(harbor_router(seen.clone())).await;
    let source = Source::Harbor { registry: host.clone(), project: "vynil".into() };

    let repos = client(&host, CredentialStore::default()).enumerate(&source).await.unwrap();
    assert_eq!(repos.len(), 23);
    assert_eq!(repos[0].to_string(), format!("{host}/vynil/pkg-00"));
    assert_eq!(repos[22].repository, "vynil/pkg-22");
    assert_eq!(*seen.lock().unwrap(), vec!["Bearer anonymous-token"; 3]);

    seen.lock().unwrap().clear();
    let with_basic = client(&host, CredentialStore::default().with(&host, Credentials::basic("u", "p")));
    assert_eq!(with_basic.enumerate(&source).await.unwrap().len(), 23);
    assert!(seen.lock().unwrap().iter().all(|a| a.starts_with("Basic ")));

    let missing = Source::Harbor { registry: host.clone(), project: "nope".into() };
    let error = client(&host, CredentialStore::default()).enumerate(&missing).await.unwrap_err();
    assert!(matches!(error, RegistryError::NotFound { .. }), "{error:?}");
}

fn gitlab_router() -> Router {
    fn authorised(headers: &HeaderMap) -> bool {
        auth(headers) == "Bearer glpat-secret"
    }
    Router::new()
        .route(
            "/api/v4/projects",
            get(|Query(q): Query<HashMap<String, String>>, headers: HeaderMap| async move {
                if !authorised(&headers) {
                    return (StatusCode::UNAUTHORIZED, Json(json!({"message": "401 Unauthorized"}))).into_response();
                }
                assert_eq!(q.get("search").map(String::as_str), Some("vynil"));
                Json(json!([
                    {"id": 7, "path_with_namespace": "other/vynil"},
                    {"id": 42, "path_with_namespace": "infra/vynil"},
                ]))
                .into_response()
            }),
        )
        .route(
            "/api/v4/projects/{id}/registry/repositories",
            get(|Path(id): Path<u64>, Query(q): Query<HashMap<String, String>>, headers: HeaderMap| async move {
                if !authorised(&headers) || id != 42 {
                    return StatusCode::NOT_FOUND.into_response();
                }
                let page: usize = q["page"].parse().unwrap();
                let per_page: usize = q["per_page"].parse().unwrap();
                let items: Vec<_> = (0..45)
                    .map(|i| json!({"id": i, "path": format!("infra/vynil/pkg-{i}"), "location": format!("registry.gitlab.example/infra/vynil/pkg-{i}")}))
                    .skip((page - 1) * per_page)
                    .take(per_page)
                    .collect();
                ([("x-total-pages", "3"), ("x-total", "45")], Json(items)).into_response()
            }),
        )
}

#[tokio::test]
async fn a_gitlab_project_is_found_by_path_and_its_registry_listed_across_pages() {
    let host = serve(gitlab_router()).await;
    let source = Source::Gitlab {
        url: format!("http://{host}"),
        registry: "registry.gitlab.example".into(),
        project: "infra/vynil".into(),
    };
    let creds = || {
        CredentialStore::default()
            .with("registry.gitlab.example", Credentials::basic("gitlab-ci-token", "glpat-secret"))
    };
    // The API is not on the registry's site (here a loopback address): its
    // token is not sent there unless the operator says so.
    let refused = client(&host, creds()).enumerate(&source).await.unwrap_err();
    assert!(
        refused.to_string().contains(&format!("--credential-host registry.gitlab.example={host}")),
        "{refused}"
    );
    let mut config = common::config(&host);
    config.credential_hosts = vec![("registry.gitlab.example".into(), host.clone())];
    let allowed = |creds| {
        let cache = std::sync::Arc::new(vynil_registry::InMemoryMetadataCache::default());
        vynil_registry::RegistryClient::new(config.clone(), creds, cache).unwrap()
    };
    let repos = allowed(creds()).enumerate(&source).await.unwrap();
    assert_eq!(repos.len(), 45);
    assert_eq!(repos[44].to_string(), "registry.gitlab.example/infra/vynil/pkg-44");

    let error = client(&host, CredentialStore::default()).enumerate(&source).await.unwrap_err();
    assert!(error.to_string().contains("needs a pull secret"), "{error}");

    let wrong = CredentialStore::default().with("registry.gitlab.example", Credentials::basic("x", "bad"));
    let error = allowed(wrong).enumerate(&source).await.unwrap_err();
    assert!(matches!(error, RegistryError::Unauthorized { .. }), "{error:?}");
    assert!(!error.to_string().contains("bad"));
}

#[tokio::test]
async fn plain_http_is_refused_for_a_host_not_declared_insecure() {
    let source = Source::Gitlab {
        url: "http://gitlab.example".into(),
        registry: "registry.gitlab.example".into(),
        project: "infra/vynil".into(),
    };
    let creds = CredentialStore::default().with("registry.gitlab.example", Credentials::basic("u", "p"));
    let error = client("elsewhere:1", creds).enumerate(&source).await.unwrap_err();
    assert!(matches!(error, RegistryError::InsecureRefused { .. }), "{error:?}");
}

#[tokio::test]
async fn a_list_source_with_a_hostile_entry_is_refused_by_name() {
    let source = Source::List(vec!["docker.io/sebt3/ok".into(), "docker.io/../../etc".into()]);
    let error = client("x:1", CredentialStore::default()).enumerate(&source).await.unwrap_err();
    assert!(error.to_string().contains("docker.io/../../etc"), "{error}");
    let ok = Source::List(vec!["docker.io/sebt3/ok".into()]);
    let repos = client("x:1", CredentialStore::default()).enumerate(&ok).await.unwrap();
    assert_eq!(repos[0].to_string(), "docker.io/sebt3/ok");
}

#[tokio::test]
async fn the_referrers_api_is_used_where_the_registry_offers_it() {
    let subject = format!("sha256:{}", "a".repeat(64));
    let router = Router::new().route(
        "/v2/{ns}/{name}/referrers/{digest}",
        // distribution-spec v1.1: the answer's Content-Type MUST be the OCI image index's.
        get(|Path((_, _, digest)): Path<(String, String, String)>| async move {
            let index = [("content-type", "application/vnd.oci.image.index.v1+json")];
            (
                index,
                Json(json!({
                    "schemaVersion": 2,
                    "mediaType": "application/vnd.oci.image.index.v1+json",
                    "manifests": [{
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": format!("sha256:{}", "b".repeat(64)),
                        "size": 10,
                        "artifactType": "application/vnd.dev.cosign.artifact.sig.v1+json",
                        "annotations": {"subject": digest},
                    }],
                })),
            )
        }),
    );
    let host = serve(router).await;
    let artifacts = client(&host, CredentialStore::default())
        .artifacts(&repo(&host, "apps/x"), &subject, &[])
        .await
        .unwrap();
    assert_eq!(artifacts.len(), 1);
    assert_eq!(artifacts[0].tag, None);
    assert_eq!(artifacts[0].kind, "application/vnd.dev.cosign.artifact.sig.v1+json");
}

/// Issue "Credentials that stay where they belong" item 2: the host check
/// read the URL's text while the request went to the parsed URL. A GitLab
/// `url` written so that its text ends on the registry's site but parses to
/// another host (an IPv4 integer, a percent-encoded dot, the site hidden in
/// a query, user information, a backslash) must not carry the robot's
/// token there: the API base is parsed once, and refused when it holds a
/// query, a fragment or user information.
#[tokio::test]
async fn a_gitlab_url_spelled_to_pass_the_host_check_never_carries_the_token_elsewhere() {
    let seen: Seen = Arc::default();
    let recorder = seen.clone();
    let evil = serve(Router::new().fallback(move |headers: HeaderMap| {
        let recorder = recorder.clone();
        async move {
            recorder.lock().unwrap().push(auth(&headers));
            StatusCode::NOT_FOUND
        }
    }))
    .await;
    let port = evil.rsplit(':').next().unwrap();
    let creds = CredentialStore::default()
        .with("registry.gitlab.example", Credentials::basic("gitlab-ci-token", "glpat-secret"));
    for url in [
        format!("http://2130706433:{port}?.registry.gitlab.example"),
        format!("http://127.0.0.1:{port}#.registry.gitlab.example"),
        format!("http://registry.gitlab.example@127.0.0.1:{port}"),
        format!("http://127.0.0.1:{port}\\.registry.gitlab.example"),
        format!("http://127%2E0.0.1:{port}/?x=.registry.gitlab.example"),
    ] {
        let source = Source::Gitlab {
            url: url.clone(),
            registry: "registry.gitlab.example".into(),
            project: "infra/vynil".into(),
        };
        let refused = client(&evil, creds.clone()).enumerate(&source).await;
        assert!(refused.is_err(), "{url}: {refused:?}");
        let sent: Vec<String> = seen.lock().unwrap().iter().filter(|a| !a.is_empty()).cloned().collect();
        assert!(sent.is_empty(), "{url}: the token went to another host: {sent:?}");
    }
}
