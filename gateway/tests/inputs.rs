//! The OpenAPI document says what the gateway enforces: for every declared
//! parameter constraint, values at, just inside and just outside its bounds
//! are sent to a gateway and must be accepted or refused (400, naming the
//! parameter) exactly as the served document's schema says; and the
//! patterns declared for request bodies accept exactly what the services'
//! own parsers accept.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use serde_json::{Value, json};
use vynil_gateway::{
    Config,
    api::inputs::{Input, REGISTRY_PATTERN, REPOSITORY_PATTERN, TAG_PATTERN},
    auth::{Role, TokenBook},
};

/// `value` as one URL path segment or query value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Valid values for the other parameters of a route.
fn fill(path: &str, name: &str, value: &str) -> String {
    let mut url = path.to_string();
    for (param, fine) in [
        ("jukebox", "box"),
        ("scan_id", "s1"),
        ("plan_id", "p1"),
        ("kind", "tenant"),
        ("namespace", "apps"),
        ("name", "web"),
        ("hook", "registry"),
    ] {
        let with = if param == name { encode(value) } else { fine.to_string() };
        url = url.replace(&format!("{{{param}}}"), &with);
    }
    url
}

/// Values at and around the bounds `schema` declares.
fn candidates(schema: &Value) -> Vec<Value> {
    let mut values = Vec::new();
    if let (Some(min), Some(max)) = (schema["minimum"].as_i64(), schema["maximum"].as_i64()) {
        for n in [min - 1, min, min + 1, max - 1, max, max + 1] {
            values.push(json!(n));
        }
    }
    if let Some(max) = schema["maxLength"].as_u64() {
        let max = max as usize;
        for n in [max - 1, max, max + 1] {
            values.push(json!("a".repeat(n)));
        }
        for text in ["", "a", "0", "A", "-a", "a-", "a.b", "a..b", "a_b", "a:b", "a b", "a/b", "é", "12"] {
            values.push(json!(text));
        }
    }
    values
}

#[tokio::test]
async fn every_declared_parameter_bound_is_the_one_the_gateway_enforces() {
    let dir = tempfile::tempdir().unwrap();
    let line = TokenBook::line("root", Role::Admin, "token-admin");
    std::fs::write(dir.path().join("tokens.yaml"), format!("tokens:\n{line}\n")).unwrap();
    // Services "configured" nowhere: accepted input answers 503, refused 400.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nowhere = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { while listener.accept().await.is_ok() {} });
    let mut args = vec!["vynil-gateway".to_string(), "--listen".into(), "127.0.0.1:0".into()];
    args.extend(["--tokens-file".into(), dir.path().join("tokens.yaml").display().to_string()]);
    for service in ["catalog", "scanner", "purger", "lifecycle"] {
        args.extend([format!("--{service}-endpoint"), nowhere.clone()]);
    }
    let config = <Config as clap::Parser>::parse_from(args);
    let gateway = vynil_gateway::Gateway::bind(&config).await.unwrap();
    let base = format!("http://{}", gateway.local_addr().unwrap());
    let stop = vynil_runtime::Shutdown::new();
    tokio::spawn(gateway.serve(stop.signaled()));
    let http = reqwest::Client::new();
    let document: Value =
        http.get(format!("{base}/openapi.json")).send().await.unwrap().json().await.unwrap();

    let mut checked = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        let Some(operation) = item.get("get").or_else(|| item.get("post")) else { continue };
        let method = if item.get("get").is_some() { reqwest::Method::GET } else { reqwest::Method::POST };
        if path.contains("/events") || path.contains("/hooks/") || path.ends_with("/execute") {
            continue; // streams and hooks: their parameters are checked where they are declared too
        }
        for parameter in operation["parameters"].as_array().into_iter().flatten() {
            let name = parameter["name"].as_str().unwrap();
            let mut schema = &parameter["schema"];
            if let Some(reference) = schema["$ref"].as_str() {
                schema = document.pointer(reference.trim_start_matches('#')).unwrap();
            }
            let validator = jsonschema::validator_for(schema).unwrap();
            for value in candidates(schema) {
                let text = value.as_str().map(String::from).unwrap_or_else(|| value.to_string());
                // The route's other required query parameters, valid.
                let mut query: Vec<String> = operation["parameters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|p| p["in"] == "query" && p["required"] == true && p["name"] != name)
                    .map(|p| {
                        let other = p["name"].as_str().unwrap_or_default();
                        let fine = match other {
                            "category" => "apps",
                            "name" => "web",
                            "type" => "tenant",
                            _ => "x",
                        };
                        format!("{other}={fine}")
                    })
                    .collect();
                let url = match parameter["in"].as_str() {
                    Some("path") => format!("{base}{}?{}", fill(path, name, &text), query.join("&")),
                    _ => {
                        query.push(format!("{name}={}", encode(&text)));
                        format!("{base}{}?{}", fill(path, "", ""), query.join("&"))
                    }
                };
                // A query parameter of type integer is sent as its text; the
                // document's schema is asked about the typed value.
                let declared_valid = validator.is_valid(&value);
                let mut request = http.request(method.clone(), &url).bearer_auth("token-admin");
                if method == reqwest::Method::POST {
                    request = request.json(&json!({}));
                }
                let answer = request.send().await.unwrap();
                let status = answer.status().as_u16();
                let body: Value = answer.json().await.unwrap_or_default();
                // An empty path segment matches no route: refused too, as 404.
                let empty_segment = text.is_empty() && parameter["in"] == "path";
                let refused_for_it = (status == 400
                    && body["message"].as_str().is_some_and(|m| m.starts_with(&format!("{name}:"))))
                    || (empty_segment && status == 404);
                if declared_valid {
                    // A 400 may still come for the (empty) body of a POST, never for this parameter.
                    let query_refused = body["message"].as_str().is_some_and(|m| m.starts_with("query:"));
                    assert!(
                        !refused_for_it && !query_refused && status != 404 && status != 405,
                        "{method} {path}: {name}={text:?} is valid per the document, the gateway answered {status} {body}"
                    );
                } else {
                    assert!(
                        refused_for_it,
                        "{method} {path}: {name}={text:?} is invalid per the document, the gateway answered {status} {body}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 200, "only {checked} values were checked: the document declares too little");
    stop.trigger();
}

fn matches(pattern: &str, value: &str) -> bool {
    jsonschema::validator_for(&json!({"type": "string", "pattern": pattern})).unwrap().is_valid(&json!(value))
}

proptest! {
    #[test]
    fn the_declared_registry_pattern_is_the_services_grammar(
        registry in "(oci-layout:)?[a-zA-Z0-9._:/\\[\\] -]{0,8}",
    ) {
        let parsed = vynil_registry::RepositoryRef::new(&registry, "apps/web").is_ok();
        prop_assert_eq!(matches(REGISTRY_PATTERN, &registry), parsed, "registry {:?}", registry);
    }

    #[test]
    fn the_declared_tag_pattern_is_what_a_decision_accepts(tag in "[a-zA-Z0-9._ /-]{0,6}|[a-z]{127,130}") {
        prop_assert_eq!(matches(TAG_PATTERN, &tag), Input::Tag.check("tag", &tag).is_ok(), "tag {:?}", tag);
    }

    #[test]
    fn the_declared_repository_pattern_is_the_services_grammar(repository in "[a-zA-Z0-9._/ -]{0,8}") {
        let parsed = vynil_registry::RepositoryRef::new("registry.example", &repository).is_ok();
        prop_assert_eq!(matches(REPOSITORY_PATTERN, &repository), parsed, "repository {:?}", repository);
    }
}
