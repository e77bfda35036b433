//! The gateway over the real services (scanner, catalog, lifecycle on the
//! fake Kubernetes API, purger, a real registry): every API route, its
//! success and its error statuses, with tokens of each role and a browser
//! session.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Stack, channel, eventually};
use kube::api::PostParams;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use vynil_gateway::auth::Role;
use vynil_proto::purger::v1::{ExecuteRequest, purger_client::PurgerClient};
use vynil_testkit::{
    PackageType,
    kube_api::{AgentOutcome, FakeAgent},
};

#[path = "../../gateway/tests/common/mod.rs"]
mod gateway_common;

use gateway_common::{TestGateway, token};

/// The gateway of a test, and an HTTP client for it.
struct Gateway {
    base: String,
    http: reqwest::Client,
    stop: vynil_runtime::Shutdown,
    _gateway: TestGateway,
}

impl Gateway {
    async fn start(stack: &Stack) -> Self {
        Self::start_with(stack, &[]).await
    }

    async fn start_with(stack: &Stack, flags: &[&str]) -> Self {
        let gateway = TestGateway::start_with(stack, flags).await;
        Self {
            base: gateway.url.clone(),
            http: reqwest::Client::new(),
            stop: gateway.stop.clone(),
            _gateway: gateway,
        }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        role: Option<Role>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(role) = role {
            request = request.bearer_auth(token(role));
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer = request.send().await.unwrap();
        let status = answer.status();
        let text = answer.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn get(&self, path: &str, role: Role) -> (StatusCode, Value) {
        self.call(Method::GET, path, Some(role), None).await
    }

    async fn post(&self, path: &str, role: Role, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(role), Some(body)).await
    }

    /// The server-sent events of a GET or POST, until the stream ends.
    async fn events(&self, request: reqwest::RequestBuilder) -> Vec<(String, Value)> {
        let mut answer = request.header("accept", "text/event-stream").send().await.unwrap();
        assert_eq!(answer.status(), 200, "{:?}", answer.headers());
        assert!(answer.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        let mut text = String::new();
        while let Some(chunk) = answer.chunk().await.unwrap() {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        text.split("\n\n")
            .filter_map(|block| {
                let field = |name: &str| {
                    block.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim_start().to_string()))
                };
                Some((field("event:")?, serde_json::from_str(&field("data:")?).unwrap()))
            })
            .collect()
    }
}

/// Asserts an error answer: its status, its stable code, a message that contains `says`.
fn refused(answer: &(StatusCode, Value), status: u16, code: &str, says: &str) {
    assert_eq!(answer.0.as_u16(), status, "{}", answer.1);
    assert_eq!(answer.1["code"], code, "{}", answer.1);
    assert!(answer.1["message"].as_str().unwrap().contains(says), "{}", answer.1);
    assert!(!answer.1["request_id"].as_str().unwrap().is_empty(), "{}", answer.1);
}

fn tags(items: &Value) -> Vec<String> {
    items.as_array().unwrap().iter().map(|p| p["tag"].as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn every_route_over_the_real_services_answers_its_success_and_its_errors() {
    let stack = Stack::start("think/ollama").await;
    let _agent = FakeAgent::start(&stack.api, "vynil-system", |_| AgentOutcome::Succeed {
        children: vec![("vitals".into(), vec![json!({"kind": "Deployment", "name": "ollama"})])],
    })
    .unwrap();
    for (tag, kind) in
        [("0.1.8", PackageType::Tenant), ("0.1.9", PackageType::Tenant), ("0.1.10", PackageType::Service)]
    {
        stack.publish("think", "ollama", kind, tag).await;
    }
    let gw = Gateway::start(&stack).await;
    let (viewer, operator, admin) = (Role::Viewer, Role::Operator, Role::Admin);

    // Scans: start (operator), follow as SSE until the end, read.
    refused(&gw.post("/api/v1/jukeboxes/box/scans", viewer, json!({})).await, 403, "FORBIDDEN", "operator");
    refused(
        &gw.post("/api/v1/jukeboxes/box/scans", operator, json!({"filter": "a/b/c"})).await,
        400,
        "BAD_REQUEST",
        "filter",
    );
    refused(
        &gw.post("/api/v1/jukeboxes/No_Box/scans", operator, json!({})).await,
        400,
        "BAD_REQUEST",
        "jukebox",
    );
    refused(&gw.post("/api/v1/jukeboxes/nobox/scans", operator, json!({})).await, 404, "NOT_FOUND", "nobox");
    let (status, started) = gw.post("/api/v1/jukeboxes/box/scans", operator, json!({})).await;
    assert_eq!(status, 202, "{started}");
    let scan_id = started["scan_id"].as_str().unwrap().to_string();
    let url = format!("{}/api/v1/scans/{scan_id}/events", gw.base);
    let events = gw.events(gw.http.get(&url).bearer_auth(token(viewer))).await;
    assert!(!events.is_empty() && events.iter().all(|(name, _)| name == "progress"), "{events:?}");
    let last = &events.last().unwrap().1;
    assert_eq!(last["state"], "succeeded", "the stream ends with the scan: {events:?}");
    assert_eq!(last["repositories_total"], 1);
    let (status, scan) = gw.get(&format!("/api/v1/scans/{scan_id}"), viewer).await;
    assert_eq!((status.as_u16(), scan["state"].as_str()), (200, Some("succeeded")), "{scan}");
    refused(&gw.get("/api/v1/scans/no%20such", viewer).await, 400, "BAD_REQUEST", "scan_id");
    refused(&gw.get("/api/v1/scans/unknown-scan", viewer).await, 404, "NOT_FOUND", "unknown-scan");
    let (status, latest) = gw.get("/api/v1/jukeboxes/box/scans/latest", viewer).await;
    assert_eq!((status.as_u16(), latest["scan_id"].as_str()), (200, Some(scan_id.as_str())), "{latest}");

    // JukeBoxes and catalogs, with the roles the catalog computed.
    let (status, boxes) = gw.get("/api/v1/jukeboxes", viewer).await;
    assert_eq!(status, 200);
    assert_eq!(boxes["items"][0]["name"], "box", "{boxes}");
    refused(&gw.get("/api/v1/jukeboxes?limit=0", viewer).await, 400, "BAD_REQUEST", "limit");
    let catalog = eventually("the scan in the catalog", || async {
        let (_, page) = gw.get("/api/v1/jukeboxes/box/catalog", viewer).await;
        (tags(&page["items"]) == ["0.1.10", "0.1.9"]).then_some(page)
    })
    .await;
    let roles = |i: usize| -> Vec<String> {
        catalog["items"][i]["roles"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["description"].as_str().unwrap().into())
            .collect()
    };
    assert_eq!(roles(0), ["head", "newest service revision"]);
    assert_eq!(roles(1), ["newest tenant revision"]);
    let (_, tenant) = gw.get("/api/v1/jukeboxes/box/catalog?type=tenant", viewer).await;
    assert_eq!(tags(&tenant["items"]), ["0.1.9"]);
    let (_, first) = gw.get("/api/v1/jukeboxes/box/catalog?limit=1", viewer).await;
    let next = first["next_page_token"].as_str().unwrap();
    let (_, second) =
        gw.get(&format!("/api/v1/jukeboxes/box/catalog?limit=1&page_token={next}"), viewer).await;
    assert_eq!(
        (tags(&first["items"]), tags(&second["items"])),
        (vec!["0.1.10".into()], vec!["0.1.9".into()])
    );
    assert!(second["next_page_token"].is_null());
    refused(&gw.get("/api/v1/jukeboxes/box/catalog?type=widget", viewer).await, 400, "BAD_REQUEST", "query");
    refused(&gw.get("/api/v1/jukeboxes/nobox/catalog", viewer).await, 404, "NOT_FOUND", "nobox");
    let path = "/api/v1/jukeboxes/box/upgrade-path?category=think&name=ollama";
    let (status, up) = gw.get(&format!("{path}&type=tenant&from=0.1.8"), viewer).await;
    assert_eq!(
        (status.as_u16(), tags(&up["steps"]), up["to"].as_str()),
        (200, vec!["0.1.9".into()], Some("0.1.9"))
    );
    let (_, none) = gw.get(&format!("{path}&type=system"), viewer).await;
    assert_eq!(none["blocked"]["excluded_by"], "type", "{none}");
    refused(
        &gw.get("/api/v1/jukeboxes/box/upgrade-path?name=ollama", viewer).await,
        400,
        "BAD_REQUEST",
        "category",
    );

    // An instance installed by lifecycle, listed and explained.
    let instance = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "ollama", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "think", "package": "ollama"}});
    stack
        .tenant_instances()
        .create(&PostParams::default(), &serde_json::from_value(instance).unwrap())
        .await
        .unwrap();
    let listed = eventually("the instance up to date", || async {
        let (_, list) = gw.get("/api/v1/instances?namespace=apps", viewer).await;
        (list["items"][0]["state"] == "up_to_date").then_some(list)
    })
    .await;
    assert_eq!(listed["items"][0]["tag"], "0.1.9", "{listed}");
    refused(&gw.get("/api/v1/instances?kind=widget", viewer).await, 400, "BAD_REQUEST", "kind");
    let explain = "/api/v1/instances/tenant/apps/ollama/explain";
    refused(&gw.get(explain, viewer).await, 403, "FORBIDDEN", "operator");
    let (status, explained) = gw.get(explain, operator).await;
    assert_eq!((status.as_u16(), explained["state"].as_str()), (200, Some("up_to_date")), "{explained}");
    refused(
        &gw.get("/api/v1/instances/tenant/apps/nothere/explain", operator).await,
        404,
        "NOT_FOUND",
        "nothere",
    );
    refused(
        &gw.get("/api/v1/instances/tenant/Apps/ollama/explain", operator).await,
        400,
        "BAD_REQUEST",
        "namespace",
    );

    // Purge: plan (operator), execute (admin, named confirmation, SSE), report.
    refused(
        &gw.post("/api/v1/purge/plans", viewer, json!({"jukebox": "box"})).await,
        403,
        "FORBIDDEN",
        "operator",
    );
    refused(&gw.post("/api/v1/purge/plans", operator, json!({})).await, 400, "BAD_REQUEST", "exactly one");
    let (status, plan) = gw.post("/api/v1/purge/plans", operator, json!({"jukebox": "box"})).await;
    assert_eq!(status, 201, "{plan}");
    let plan_id = plan["plan_id"].as_str().unwrap().to_string();
    let deleted: Vec<&str> = plan["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["keep"] == false)
        .map(|e| e["tag"].as_str().unwrap())
        .collect();
    assert_eq!(deleted, ["0.1.8"], "{plan}");
    let (status, read) = gw.get(&format!("/api/v1/purge/plans/{plan_id}"), viewer).await;
    assert_eq!((status.as_u16(), &read["fingerprint"]), (200, &plan["fingerprint"]));
    refused(&gw.get("/api/v1/purge/plans/unknown-plan", viewer).await, 404, "NOT_FOUND", "unknown-plan");
    let execute = format!("/api/v1/purge/plans/{plan_id}/execute");
    let confirm = json!({"confirm": plan["target"], "fingerprint": plan["fingerprint"]});
    refused(&gw.post(&execute, operator, confirm.clone()).await, 403, "FORBIDDEN", "admin");
    let wrong = json!({"confirm": "jukebox/other", "fingerprint": plan["fingerprint"]});
    let answer = gw.post(&execute, admin, wrong).await;
    assert!([400, 409].contains(&answer.0.as_u16()), "{answer:?}");
    // Straight to the purger, without the gateway's service token: refused.
    let mut purger = PurgerClient::new(channel(stack.purger).await);
    let direct = ExecuteRequest {
        plan_id: plan_id.clone(),
        confirm: plan["target"].as_str().unwrap().into(),
        fingerprint: plan["fingerprint"].as_str().unwrap().into(),
        acknowledge_usage_unknown: false,
    };
    let status = purger.execute(tonic::Request::new(direct.clone())).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let events = gw
        .events(gw.http.post(format!("{}{execute}", gw.base)).bearer_auth(token(admin)).json(&confirm))
        .await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["outcome", "report"], "{events:?}");
    assert_eq!(events[0].1["state"], "deleted");
    assert_eq!(events[1].1["executed_by"], "admin-user", "the authenticated principal, not a claim");
    let (status, report) = gw.get(&format!("/api/v1/purge/plans/{plan_id}/report"), viewer).await;
    assert_eq!((status.as_u16(), report["executed_by"].as_str()), (200, Some("admin-user")), "{report}");
    refused(
        &gw.get("/api/v1/purge/plans/unknown-plan/report", viewer).await,
        404,
        "NOT_FOUND",
        "unknown-plan",
    );
    // A plan made stale by a push since planning is refused with 409.
    let (_, stale) = gw.post("/api/v1/purge/plans", operator, json!({"jukebox": "box"})).await;
    stack.publish("think", "ollama", PackageType::Service, "0.1.11").await;
    let confirm = json!({"confirm": stale["target"], "fingerprint": stale["fingerprint"]});
    let stale_path = format!("/api/v1/purge/plans/{}/execute", stale["plan_id"].as_str().unwrap());
    refused(&gw.post(&stale_path, admin, confirm).await, 409, "REFUSED", "");

    // The escape hatch: admin only, named, with the fingerprint of the explanation.
    let allow = "/api/v1/instances/tenant/apps/ollama/allow-delete-without-package";
    let body = json!({"confirm": "tenant/apps/ollama", "fingerprint": explained["children_fingerprint"], "reason": "test"});
    refused(&gw.post(allow, operator, body.clone()).await, 403, "FORBIDDEN", "admin");
    let wrong = json!({"confirm": "tenant/apps/other", "fingerprint": explained["children_fingerprint"]});
    refused(&gw.post(allow, admin, wrong).await, 400, "BAD_REQUEST", "confirm");
    let (status, done) = gw.post(allow, admin, body).await;
    assert_eq!((status.as_u16(), &done["done"]), (200, &json!(true)), "{done}");

    // A browser session: the cookie authenticates, a state change also needs the CSRF token.
    let (status, _) = gw.call(Method::POST, "/api/v1/session", None, Some(json!({"token": "nope"}))).await;
    assert_eq!(status, 401);
    let login = gw.http.post(format!("{}/api/v1/session", gw.base)).json(&json!({"token": token(operator)}));
    let login = login.send().await.unwrap();
    let cookie = login.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let session: Value = login.json().await.unwrap();
    let pair = cookie.split(';').next().unwrap().to_string();
    let with_cookie = |method: Method, path: &str| {
        gw.http.request(method, format!("{}{path}", gw.base)).header("cookie", &pair)
    };
    let who: Value = with_cookie(Method::GET, "/api/v1/whoami").send().await.unwrap().json().await.unwrap();
    assert_eq!((who["name"].as_str(), who["via"].as_str()), (Some("operator-user"), Some("session")));
    let no_csrf =
        with_cookie(Method::POST, "/api/v1/jukeboxes/box/scans").json(&json!({})).send().await.unwrap();
    assert_eq!(no_csrf.status(), 403);
    let with_csrf = with_cookie(Method::POST, "/api/v1/jukeboxes/box/scans")
        .header("x-csrf-token", session["csrf_token"].as_str().unwrap())
        .json(&json!({"filter": "think/ollama"}));
    assert_eq!(with_csrf.send().await.unwrap().status(), 202);
    let logout = gw.http.delete(format!("{}/api/v1/session", gw.base)).send().await.unwrap();
    assert!(logout.headers()["set-cookie"].to_str().unwrap().contains("Max-Age=0"));

    // Operations: every service ready, requests counted by route template.
    let ready: Value = gw.http.get(format!("{}/readyz", gw.base)).send().await.unwrap().json().await.unwrap();
    assert_eq!(ready["ready"], true, "{ready}");
    let metrics = gw.http.get(format!("{}/metrics", gw.base)).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains(r#"route="/api/v1/purge/plans/{plan_id}/execute",method="POST",status="403""#),
        "{metrics}"
    );
    gw.stop.trigger();
    stack.stop().await;
}

#[tokio::test]
async fn a_rendered_catalog_page_is_served_again_only_while_the_catalog_is_unchanged() {
    let stack = Stack::start("think/ollama").await;
    stack.publish("think", "ollama", PackageType::Tenant, "0.1.8").await;
    stack.scan_until(&["0.1.8"]).await;
    let gw = Gateway::start(&stack).await;
    let read = |query: &'static str| {
        let request = gw
            .http
            .get(format!("{}/api/v1/jukeboxes/box/catalog{query}", gw.base))
            .bearer_auth(token(Role::Viewer));
        async move {
            let answer = request.send().await.unwrap();
            assert_eq!(answer.status(), 200);
            assert!(answer.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
            answer.text().await.unwrap()
        }
    };
    let tags = |body: &str| -> Vec<String> {
        let page: Value = serde_json::from_str(body).unwrap();
        page["items"].as_array().unwrap().iter().map(|p| p["tag"].as_str().unwrap().to_string()).collect()
    };
    let first = read("").await;
    assert_eq!(tags(&first), ["0.1.8"]);
    assert_eq!(read("").await, first, "the same catalog, the same bytes");
    assert_eq!(tags(&read("?type=service").await), Vec::<String>::new(), "filters are part of the page");

    stack.publish("think", "ollama", PackageType::Tenant, "0.1.9").await;
    stack.scan_until(&["0.1.9"]).await;
    let after = read("").await;
    assert_eq!(tags(&after), ["0.1.9"], "a changed catalog is rendered again: {after}");
    let page: Value = serde_json::from_str(&after).unwrap();
    let before: Value = serde_json::from_str(&first).unwrap();
    assert_ne!(page["content_hash"], before["content_hash"]);
    gw.stop.trigger();
    stack.stop().await;
}

#[tokio::test]
async fn a_client_holds_at_most_its_streams_open_and_another_client_is_not_refused() {
    let stack = Stack::start("think/ollama").await;
    // A registry that accepts connections and never answers: its scan runs
    // until its timeouts, so the streams following it stay open.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_host = silent.local_addr().unwrap().to_string();
    let _silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let boxes: kube::Api<vynil_crds::JukeBox> = kube::Api::all(stack.client.clone());
    let jukebox = vynil_testkit::JukeboxBuilder::new("silent").list([format!("{silent_host}/x/y")]).json();
    boxes.create(&kube::api::PostParams::default(), &serde_json::from_value(jukebox).unwrap()).await.unwrap();
    let gw = Gateway::start_with(&stack, &["--max-streams-per-client", "2"]).await;
    let mut started = (StatusCode::NOT_FOUND, Value::Null);
    for _ in 0..100 {
        started = gw.post("/api/v1/jukeboxes/silent/scans", Role::Operator, json!({})).await;
        if started.0 == StatusCode::ACCEPTED {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(started.0, StatusCode::ACCEPTED, "{}", started.1);
    let url = format!("{}/api/v1/scans/{}/events", gw.base, started.1["scan_id"].as_str().unwrap());
    let follow =
        |role: Role| gw.http.get(&url).bearer_auth(token(role)).header("accept", "text/event-stream").send();
    let first = follow(Role::Viewer).await.unwrap();
    let second = follow(Role::Viewer).await.unwrap();
    assert_eq!((first.status(), second.status()), (StatusCode::OK, StatusCode::OK));
    let third = follow(Role::Viewer).await.unwrap();
    let status = third.status();
    let body: Value = third.json().await.unwrap();
    refused(&(status, body), 429, "TOO_MANY_STREAMS", "--max-streams-per-client");
    let other = follow(Role::Operator).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK, "another client has its own streams");
    drop((first, second, other));
}
