//! Kubernetes users (`--kubernetes-auth`): a token the tokens file does not
//! know is reviewed by the API server, and each call is authorised by RBAC
//! through SubjectAccessReview with the verbs `auth::kubernetes` documents. The
//! fake API server answers the reviews from the test's table.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use reqwest::StatusCode;
use vynil_testkit::kube_api::{AccessRule, FakeApiServer};

fn rule(user: &str, verb: &str, resource: &str, namespace: Option<&str>) -> AccessRule {
    AccessRule {
        user: user.into(),
        verb: verb.into(),
        resource: resource.into(),
        namespace: namespace.map(Into::into),
    }
}

/// A gateway with `--kubernetes-auth` over `api`, every service at a port
/// nobody listens on (a call RBAC allows answers 503); its URL and stop.
async fn gateway_over(api: &FakeApiServer) -> (String, vynil_runtime::Shutdown) {
    gateway_over_with(api, &[]).await
}

/// [`gateway_over`] with more flags.
async fn gateway_over_with(api: &FakeApiServer, extra: &[&str]) -> (String, vynil_runtime::Shutdown) {
    let nowhere = format!("http://127.0.0.1:{}", vynil_testkit::free_port().unwrap());
    let mut args = vec![
        "vynil-gateway",
        "--listen",
        "127.0.0.1:0",
        "--kubernetes-auth",
        "--catalog-endpoint",
        &nowhere,
        "--lifecycle-endpoint",
        &nowhere,
        "--purger-endpoint",
        &nowhere,
        "--scanner-endpoint",
        &nowhere,
    ];
    args.extend_from_slice(extra);
    let config = <vynil_gateway::Config as clap::Parser>::parse_from(args);
    let gateway = vynil_gateway::Gateway::bind_with(&config, Some(api.client().unwrap())).await.unwrap();
    let base = format!("http://{}", gateway.local_addr().unwrap());
    let stop = vynil_runtime::Shutdown::new();
    tokio::spawn(gateway.serve(stop.signaled()));
    (base, stop)
}

#[tokio::test]
async fn kubernetes_users_are_reviewed_once_and_authorised_per_route_by_rbac() {
    let api = FakeApiServer::start().await.unwrap();
    api.create_namespaces(&["vynil-system"]).unwrap();
    api.add_token("alice-sa-token", "alice", &["devs"]);
    api.allow(rule("alice", "get", "tenantinstances.vynil.solidite.fr", Some("apps")));
    api.allow(rule("alice", "purge", "jukeboxes.vynil.solidite.fr", None));
    let (base, stop) = gateway_over(&api).await;
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, path: &str, token: &str| {
        http.request(method, format!("{base}{path}")).bearer_auth(token).json(&serde_json::json!({})).send()
    };
    use reqwest::Method;

    let who: serde_json::Value =
        call(Method::GET, "/api/v1/whoami", "alice-sa-token").await.unwrap().json().await.unwrap();
    assert_eq!(
        (who["name"].as_str(), &who["role"], &who["groups"][0]),
        (Some("alice"), &serde_json::Value::Null, &"devs".into())
    );
    let allowed =
        call(Method::GET, "/api/v1/instances/tenant/apps/web/explain", "alice-sa-token").await.unwrap();
    assert_eq!(allowed.status(), StatusCode::SERVICE_UNAVAILABLE, "RBAC allows it: the lifecycle is asked");
    let other =
        call(Method::GET, "/api/v1/instances/tenant/prod/web/explain", "alice-sa-token").await.unwrap();
    assert_eq!(other.status(), StatusCode::FORBIDDEN);
    let body: serde_json::Value = other.json().await.unwrap();
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("alice may not get tenantinstances.vynil.solidite.fr web in namespace prod"),
        "{message}"
    );
    let purge = call(Method::POST, "/api/v1/purge/plans/p1/execute", "alice-sa-token").await.unwrap();
    assert_ne!(purge.status(), StatusCode::FORBIDDEN, "the dedicated purge verb is granted");
    let scan = call(Method::POST, "/api/v1/jukeboxes/box/scans", "alice-sa-token").await.unwrap();
    assert_eq!(scan.status(), StatusCode::FORBIDDEN, "no patch on jukeboxes");
    let list =
        call(Method::GET, "/api/v1/instances?namespace=apps&kind=tenant", "alice-sa-token").await.unwrap();
    assert_eq!(list.status(), StatusCode::FORBIDDEN, "get is not list");
    let stranger = call(Method::GET, "/api/v1/whoami", "someone-else").await.unwrap();
    assert_eq!(stranger.status(), StatusCode::UNAUTHORIZED);

    // One TokenReview for alice's token however many calls; one access review per call.
    let reviews: Vec<String> = api.requests().into_iter().map(|r| r.resource).collect();
    assert_eq!(
        reviews.iter().filter(|r| *r == "tokenreviews").count(),
        2,
        "alice once, the stranger once: {reviews:?}"
    );
    assert_eq!(reviews.iter().filter(|r| *r == "subjectaccessreviews").count(), 5, "{reviews:?}");
    stop.trigger();
}

/// Security review item 8: made-up bearer tokens (each one a TokenReview
/// the API server refuses) fill a bounded list of their own and never keep
/// a real user's review from being cached.
#[tokio::test]
async fn a_flood_of_made_up_tokens_does_not_cost_a_real_user_a_review_per_call() {
    use futures::StreamExt as _;
    let api = FakeApiServer::start().await.unwrap();
    api.create_namespaces(&["vynil-system"]).unwrap();
    api.add_token("bob-sa-token", "bob", &["devs"]);
    // One address sends them all: lift its review budget (tested below).
    let (base, stop) = gateway_over_with(&api, &["--kubernetes-reviews-per-minute", "100000"]).await;
    let http = reqwest::Client::new();
    let whoami = |token: String| {
        let request = http.get(format!("{base}/api/v1/whoami")).bearer_auth(token);
        async move { request.send().await.unwrap().status() }
    };
    // More made-up tokens than the cache holds.
    let refused: Vec<StatusCode> = futures::stream::iter((0..4200).map(|i| whoami(format!("made-up-{i}"))))
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(refused.iter().all(|s| *s == StatusCode::UNAUTHORIZED));
    api.clear_requests();
    for _ in 0..3 {
        assert_eq!(whoami("bob-sa-token".into()).await, StatusCode::OK);
    }
    let reviews = api.requests().into_iter().filter(|r| r.resource == "tokenreviews").count();
    assert_eq!(reviews, 1, "bob reviewed once, then cached");
    stop.trigger();
}

/// Security review item 8: random bearer tokens from one address cost the
/// API server at most that address's review budget; past it the address is
/// answered 429 `RATE_LIMITED` with `Retry-After` and the API server is not
/// asked, while users whose review is cached, and other addresses, go on.
#[tokio::test]
async fn made_up_tokens_from_one_address_cost_the_api_server_at_most_its_review_budget() {
    use std::net::{IpAddr, Ipv4Addr};
    let api = FakeApiServer::start().await.unwrap();
    api.create_namespaces(&["vynil-system"]).unwrap();
    api.add_token("bob-sa-token", "bob", &["devs"]);
    api.add_token("carol-sa-token", "carol", &["devs"]);
    let (base, stop) = gateway_over_with(&api, &["--kubernetes-reviews-per-minute", "5"]).await;
    let from =
        |address: Ipv4Addr| reqwest::Client::builder().local_address(IpAddr::V4(address)).build().unwrap();
    let (attacker, elsewhere) = (from(Ipv4Addr::new(127, 0, 0, 1)), from(Ipv4Addr::new(127, 0, 0, 2)));
    let whoami = |http: &reqwest::Client, token: &str| {
        http.get(format!("{base}/api/v1/whoami")).bearer_auth(token).send()
    };
    // Bob, on the attacker's address, is reviewed once (one of its five).
    assert_eq!(whoami(&attacker, "bob-sa-token").await.unwrap().status(), StatusCode::OK);
    api.clear_requests();
    let started = std::time::Instant::now();
    let (mut refused, mut limited) = (0, 0);
    for i in 0..20 {
        let answer = whoami(&attacker, &format!("made-up-{i}")).await.unwrap();
        match answer.status() {
            StatusCode::UNAUTHORIZED => refused += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                limited += 1;
                let wait: u64 = answer.headers()["retry-after"].to_str().unwrap().parse().unwrap();
                assert!((1..=60).contains(&wait), "Retry-After {wait}");
                let body: serde_json::Value = answer.json().await.unwrap();
                assert_eq!(body["code"], "RATE_LIMITED", "{body}");
                assert!(
                    body["message"].as_str().unwrap().contains("--kubernetes-reviews-per-minute"),
                    "{body}"
                );
            }
            other => panic!("made-up token answered {other}"),
        }
    }
    let reviews = api.requests().into_iter().filter(|r| r.resource == "tokenreviews").count();
    assert_eq!(reviews, refused, "each 401 is one review, a 429 asks nothing");
    // Four left of five, and one more each 12 s the loop took.
    let replenished = (started.elapsed().as_secs() / 12) as usize;
    assert!(refused <= 4 + replenished, "{refused} reviews for one address");
    assert!(limited >= 20 - 4 - replenished, "{limited} answered 429");
    // Bob's review is cached: the spent budget does not touch him.
    assert_eq!(whoami(&attacker, "bob-sa-token").await.unwrap().status(), StatusCode::OK);
    // Another address has its own budget.
    assert_eq!(whoami(&elsewhere, "carol-sa-token").await.unwrap().status(), StatusCode::OK);
    stop.trigger();
}

/// Security review item 8, the other side: a signed-in Kubernetes user's
/// session, reviewed again as its review expires, never spends an address's
/// budget (users behind one proxy share an address), so a spent budget does
/// not log anyone out.
#[tokio::test]
async fn a_spent_review_budget_does_not_end_the_sessions_of_signed_in_users() {
    let api = FakeApiServer::start().await.unwrap();
    api.create_namespaces(&["vynil-system"]).unwrap();
    api.add_token("dave-sa-token", "dave", &["devs"]);
    let flags = ["--kubernetes-review-cache-seconds", "1", "--kubernetes-reviews-per-minute", "1"];
    let (base, stop) = gateway_over_with(&api, &flags).await;
    let http = reqwest::Client::new();
    // The login spends the address's only review of the minute.
    let login = http
        .post(format!("{base}/api/v1/session"))
        .json(&serde_json::json!({"token": "dave-sa-token"}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), StatusCode::OK);
    let cookie = login.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    let spent = http.get(format!("{base}/api/v1/whoami")).bearer_auth("made-up").send().await.unwrap();
    assert_eq!(spent.status(), StatusCode::TOO_MANY_REQUESTS, "the budget is spent");
    api.clear_requests();
    // Past the review's lifetime the session is reviewed again, budget or not.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let again = http.get(format!("{base}/api/v1/whoami")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    let reviews = api.requests().into_iter().filter(|r| r.resource == "tokenreviews").count();
    assert_eq!(reviews, 1, "reviewed again, with the API server");
    stop.trigger();
}

/// Security review item 7: a Kubernetes user's session holds only while its
/// token passes TokenReview; once the cached review expires, a revoked token
/// ends the session without a restart.
#[tokio::test]
async fn a_revoked_kubernetes_token_ends_its_session_once_its_review_expires() {
    let api = FakeApiServer::start().await.unwrap();
    api.create_namespaces(&["vynil-system"]).unwrap();
    api.add_token("carol-sa-token", "carol", &["devs"]);
    let (base, stop) = gateway_over_with(&api, &["--kubernetes-review-cache-seconds", "1"]).await;
    let http = reqwest::Client::new();
    let login = http
        .post(format!("{base}/api/v1/session"))
        .json(&serde_json::json!({"token": "carol-sa-token"}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), StatusCode::OK);
    let cookie = login.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    assert!(!cookie.contains("carol-sa-token"), "the token is sealed, not in clear: {cookie}");
    let whoami = || http.get(format!("{base}/api/v1/whoami")).header("cookie", &cookie).send();
    let who: serde_json::Value = whoami().await.unwrap().json().await.unwrap();
    assert_eq!(who["name"], "carol");
    api.revoke_token("carol-sa-token");
    // Past the review's lifetime (1 s), the next call reviews it again.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let after = whoami().await.unwrap();
    assert_eq!(after.status(), StatusCode::UNAUTHORIZED);
    let body: serde_json::Value = after.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("no longer valid: log in again"), "{body}");
    stop.trigger();
}

/// #44: a tenant with every right on its own instances can see them
/// explained, but can neither roll back, clear a quarantine, approve an
/// upgrade, nor recall or un-recall a revision: those are verbs on
/// JukeBoxes, which only an operator holds.
#[tokio::test]
async fn a_tenant_with_every_right_on_its_instances_cannot_make_an_operators_upgrade_decisions() {
    let api = FakeApiServer::start().await.unwrap();
    api.create_namespaces(&["vynil-system"]).unwrap();
    api.add_token("tina-token", "tina", &["tenants"]);
    for verb in ["get", "list", "watch", "create", "update", "patch", "delete"] {
        for resource in ["tenantinstances.vynil.solidite.fr", "tenantinstances/status.vynil.solidite.fr"] {
            api.allow(rule("tina", verb, resource, Some("apps")));
        }
    }
    let (base, stop) = gateway_over(&api).await;
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, path: &str| {
        http.request(method, format!("{base}{path}"))
            .bearer_auth("tina-token")
            .json(&serde_json::json!({"tag": "0.1.0", "reason": "mine", "fingerprint": "0123abcd"}))
            .send()
    };
    use reqwest::Method;
    let explained = call(Method::GET, "/api/v1/instances/tenant/apps/web/explain").await.unwrap();
    assert_eq!(explained.status(), StatusCode::SERVICE_UNAVAILABLE, "her own instance: lifecycle is asked");
    for (method, path) in [
        (Method::POST, "/api/v1/instances/tenant/apps/web/rollback"),
        (Method::POST, "/api/v1/instances/tenant/apps/web/clear-quarantine"),
        (Method::POST, "/api/v1/instances/tenant/apps/web/approve-upgrade"),
        (Method::POST, "/api/v1/jukeboxes/box/recalls"),
        (Method::DELETE, "/api/v1/jukeboxes/box/recalls/0.1.0"),
    ] {
        let refused = call(method.clone(), path).await.unwrap();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{method} {path}");
        let body: serde_json::Value = refused.json().await.unwrap();
        assert!(body["message"].as_str().unwrap().contains("jukeboxes.vynil.solidite.fr"), "{body}");
    }
    stop.trigger();
}

/// Issue "Credentials that stay where they belong" item 8: the review
/// budget was per address, so an IPv6 client (one host holds a whole /64)
/// got a fresh budget per address it chose; and `X-Forwarded-For` was
/// believed from any peer. Here the proxy in front (127.0.0.1, trusted)
/// forwards one IPv6 host's requests from rotating addresses of its /64:
/// they share one budget. A peer that is not the proxy (127.0.0.2) is
/// its own source whatever it writes in `X-Forwarded-For`.
#[tokio::test]
async fn an_ipv6_host_and_a_forged_forwarded_for_share_their_review_budget() {
    use std::net::{IpAddr, Ipv4Addr};
    let api = FakeApiServer::start().await.unwrap();
    api.create_namespaces(&["vynil-system"]).unwrap();
    let flags =
        ["--kubernetes-reviews-per-minute", "3", "--trust-forwarded-for", "--trusted-proxies", "127.0.0.1"];
    let (base, stop) = gateway_over_with(&api, &flags).await;
    let from =
        |address: Ipv4Addr| reqwest::Client::builder().local_address(IpAddr::V4(address)).build().unwrap();
    let (proxy, forger) = (from(Ipv4Addr::new(127, 0, 0, 1)), from(Ipv4Addr::new(127, 0, 0, 2)));
    // Tokens never sent before: a refused one is cached, and then free.
    let limited = |http: reqwest::Client, forwarded: fn(usize) -> String, tokens: &'static str| {
        let base = base.clone();
        async move {
            let mut limited = 0;
            for i in 0..10 {
                let answer = http
                    .get(format!("{base}/api/v1/whoami"))
                    .bearer_auth(format!("{tokens}-{i}"))
                    .header("x-forwarded-for", forwarded(i))
                    .send()
                    .await
                    .unwrap();
                limited += usize::from(answer.status() == StatusCode::TOO_MANY_REQUESTS);
            }
            limited
        }
    };
    let rotating = limited(proxy, |i| format!("2001:db8:0:1::{:x}", i + 1), "rotating").await;
    assert!(rotating >= 6, "one /64 got a budget per address: only {rotating} of 10 limited");
    let forged = limited(forger, |i| format!("198.51.100.{}", i + 1), "forged").await;
    assert!(forged >= 6, "a forged X-Forwarded-For got a budget per address: only {forged} of 10 limited");
    stop.trigger();
}

/// Item 8, the cost of a page: its burst of calls by one user asks the API
/// server one access review per check, reused for a few seconds.
#[tokio::test]
async fn a_burst_of_calls_costs_one_access_review_per_check() {
    let api = FakeApiServer::start().await.unwrap();
    api.create_namespaces(&["vynil-system"]).unwrap();
    api.add_token("bob-sa-token", "bob", &["devs"]);
    let (base, stop) = gateway_over_with(&api, &[]).await;
    let http = reqwest::Client::new();
    api.clear_requests();
    for _ in 0..5 {
        let answer =
            http.get(format!("{base}/api/v1/jukeboxes")).bearer_auth("bob-sa-token").send().await.unwrap();
        assert_ne!(answer.status(), StatusCode::UNAUTHORIZED);
    }
    let reviews = api.requests().into_iter().filter(|r| r.resource == "subjectaccessreviews").count();
    assert_eq!(reviews, 1, "five calls, one check");
    stop.trigger();
}
