//! `/metrics` of every service and the gateway, after real work (a scan, a
//! purge plan, catalog reads through the gateway): each parses as
//! OpenMetrics text with a maintained parser (`openmetrics-parser`), and the
//! families each exposes are exactly the ones `docs/metrics.md` lists for it,
//! with the labels it lists. The Grafana dashboard in `deploy/observability/`
//! queries only series that page lists.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::Stack;
use kube::api::PostParams;
use vynil_gateway::auth::Role;
use vynil_testkit::PackageType;

#[path = "../../gateway/tests/common/mod.rs"]
mod gateway_common;

/// `service → family (as queried: counters with `_total`) → (type, labels)`,
/// from the tables of `docs/metrics.md` (one `## <service>` section each).
fn documented() -> BTreeMap<String, BTreeMap<String, (String, BTreeSet<String>)>> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md")).unwrap();
    let mut out: BTreeMap<String, BTreeMap<String, (String, BTreeSet<String>)>> = BTreeMap::new();
    let mut section = None;
    for line in text.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            section = heading.strip_prefix("`").and_then(|h| h.split('`').next()).map(str::to_string);
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(service), true) = (&section, cells.len() >= 5) else { continue };
        let Some(name) = cells[1].strip_prefix('`').and_then(|n| n.strip_suffix('`')) else { continue };
        let labels = cells[3]
            .split(',')
            .map(|l| l.trim().trim_matches('`').to_string())
            .filter(|l| !l.is_empty() && l != "—")
            .collect();
        out.entry(service.clone()).or_default().insert(name.to_string(), (cells[2].to_string(), labels));
    }
    out
}

/// What one `/metrics` answer declares (`# TYPE` lines, families without
/// samples yet included), in the same shape; labels are those of the samples
/// (`None` before the first).
async fn exposed(url: &str) -> BTreeMap<String, (String, Option<BTreeSet<String>>)> {
    use openmetrics_parser::{MetricsExposition, OpenMetricsType, OpenMetricsValue};
    let answer = reqwest::get(url).await.unwrap();
    assert!(answer.status().is_success(), "{url}: {}", answer.status());
    let text = answer.text().await.unwrap();
    let parsed: MetricsExposition<OpenMetricsType, OpenMetricsValue> =
        openmetrics_parser::openmetrics::parse_openmetrics(&text)
            .unwrap_or_else(|e| panic!("{url} is not OpenMetrics text ({e:?}):\n{text}"));
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(declaration) = line.strip_prefix("# TYPE ") else { continue };
        let (name, kind) = declaration.split_once(' ').unwrap();
        let queried = match kind {
            "counter" => format!("{name}_total"),
            "gauge" | "histogram" => name.to_string(),
            other => panic!("{url}: {name} is a {other}, which the docs do not describe"),
        };
        let labels = parsed
            .families
            .get(name)
            .filter(|f| f.iter_samples().next().is_some())
            .map(|f| f.get_label_names().iter().cloned().collect());
        out.insert(queried, (kind.to_string(), labels));
    }
    out
}

#[tokio::test]
async fn every_service_exposes_exactly_the_documented_series_and_the_dashboard_queries_only_those() {
    let stack = Stack::start("apps/web").await;
    stack.publish("apps", "web", PackageType::Tenant, "1.0.0").await;
    stack.scan_until(&["1.0.0"]).await;
    let gateway = gateway_common::TestGateway::start(&stack).await;
    let http = reqwest::Client::new();
    for path in ["/api/v1/jukeboxes", "/api/v1/jukeboxes/box/packages", "/api/v1/jukeboxes/nope/packages"] {
        http.get(format!("{}{path}", gateway.url))
            .bearer_auth(gateway_common::token(Role::Viewer))
            .send()
            .await
            .unwrap();
    }
    let plan = http
        .post(format!("{}/api/v1/purge/plans", gateway.url))
        .bearer_auth(gateway_common::token(Role::Operator))
        .json(&serde_json::json!({"jukebox": "box"}))
        .send()
        .await
        .unwrap();
    assert!(plan.status().is_success(), "{}", plan.text().await.unwrap());
    let scan = http
        .post(format!("{}/api/v1/jukeboxes/box/scans", gateway.url))
        .bearer_auth(gateway_common::token(Role::Operator))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(scan.status(), 202, "{}", scan.text().await.unwrap());
    // Failures, for the series that exist only once something failed: a
    // JukeBox listing a repository that is not there, an instance that does
    // not decode (no package).
    let mut broken = vynil_testkit::JukeboxBuilder::new("broken")
        .list([format!("{}/nothing/here", stack.registry.host())])
        .schedule("0 0 1 1 *")
        .json();
    broken["metadata"]["annotations"] = serde_json::json!({"vynil.solidite.fr/force-scan": "true"});
    stack.boxes.create(&PostParams::default(), &serde_json::from_value(broken).unwrap()).await.unwrap();
    let ghost = serde_json::json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "ghost", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "apps", "package": 42}});
    // Stored under an older schema: the API server does not revalidate what it stored.
    stack.api.create_under_an_older_schema("vynil.solidite.fr", "tenantinstances", ghost).unwrap();
    for (kind, plural) in [("ServiceInstance", "serviceinstances"), ("SystemInstance", "systeminstances")] {
        let ghost = serde_json::json!({"apiVersion": "vynil.solidite.fr/v1", "kind": kind,
            "metadata": {"name": "ghost", "namespace": "apps"},
            "spec": {"jukebox": "box", "category": "apps", "package": 42}});
        stack.api.create_under_an_older_schema("vynil.solidite.fr", plural, ghost).unwrap();
    }
    for (addr, series) in [
        (stack.scanner, "jukebox_reconcile_failures_total{"),
        (stack.lifecycle, "tenant_instance_reconcile_failures_total{"),
        (stack.lifecycle, "service_instance_reconcile_failures_total{"),
        (stack.lifecycle, "system_instance_reconcile_failures_total{"),
        (stack.scanner, "grpc_server_handled_total{"),
    ] {
        common::eventually(series, || async move {
            let text = reqwest::get(format!("http://{addr}/metrics")).await.ok()?.text().await.ok()?;
            text.contains(series).then_some(())
        })
        .await;
    }

    let docs = documented();
    let urls = [
        ("gateway", format!("{}/metrics", gateway.url)),
        ("scanner", format!("http://{}/metrics", stack.scanner)),
        ("catalog", format!("http://{}/metrics", stack.catalog)),
        ("purger", format!("http://{}/metrics", stack.purger)),
        ("lifecycle", format!("http://{}/metrics", stack.lifecycle)),
    ];
    let mut problems = Vec::new();
    for (service, url) in &urls {
        let exposed = exposed(url).await;
        let mut listed = docs.get(*service).cloned().unwrap_or_default();
        if *service != "gateway" {
            listed.extend(docs.get("every gRPC service").cloned().unwrap_or_default());
        }
        for (name, (kind, labels)) in &listed {
            match exposed.get(name) {
                None => problems.push(format!("{service}: documented {name} is not exposed")),
                Some((found, _)) if found != kind => {
                    problems.push(format!("{service}: {name} is a {found}, documented as a {kind}"))
                }
                Some((_, Some(found))) if found != labels => {
                    problems.push(format!("{service}: {name} has labels {found:?}, documented {labels:?}"))
                }
                Some(_) => {}
            }
        }
        for name in exposed.keys().filter(|n| !listed.contains_key(*n)) {
            problems.push(format!("{service}: {name} is exposed but not in docs/metrics.md"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    let known: BTreeSet<String> = docs.values().flat_map(|d| d.keys().cloned()).collect();
    let queried = dashboard_series();
    assert!(!queried.is_empty(), "the dashboard queries nothing");
    let unknown: Vec<&String> = queried.iter().filter(|s| !known.contains(&family_of(s, &known))).collect();
    assert!(unknown.is_empty(), "the dashboard queries series docs/metrics.md does not list: {unknown:?}");
    gateway.stop.trigger();
    stack.stop().await;
}

/// A queried series' documented name: histograms are queried by their
/// `_bucket`, `_sum` and `_count` series.
fn family_of(series: &str, known: &BTreeSet<String>) -> String {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = series.strip_suffix(suffix)
            && known.contains(base)
        {
            return base.to_string();
        }
    }
    series.to_string()
}

/// Every metric name the dashboard's PromQL expressions read.
fn dashboard_series() -> BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/observability/grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut expressions = Vec::new();
    collect_expressions(&dashboard, &mut expressions);
    expressions.iter().flat_map(|e| metric_names(e)).collect()
}

fn collect_expressions(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", serde_json::Value::String(expr)) => out.push(expr.clone()),
                    _ => collect_expressions(value, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_expressions(v, out)),
        _ => {}
    }
}

/// The metric names of a PromQL expression: identifiers that are neither
/// functions (followed by `(`), keywords, label names (inside `{}` or a
/// `by`/`without` list), durations (inside `[]`), nor Grafana variables.
fn metric_names(expr: &str) -> Vec<String> {
    const KEYWORDS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "and",
        "or",
        "unless",
        // Aggregations, which may come before their `by (...)`.
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ];
    let mut names = Vec::new();
    let chars: Vec<char> = expr.chars().collect();
    let (mut i, mut braces, mut brackets, mut grouping, mut quoted) = (0, 0, 0, false, false);
    while i < chars.len() {
        let c = chars[i];
        if quoted {
            quoted = c != '"';
            i += 1;
            continue;
        }
        match c {
            '"' => quoted = true,
            '{' => braces += 1,
            '}' => braces -= 1,
            '[' => brackets += 1,
            ']' => brackets -= 1,
            ')' if grouping => grouping = false,
            '$' => {
                // A Grafana variable: skip its name.
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                continue;
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let next = chars[i..].iter().find(|c| !c.is_whitespace());
                if KEYWORDS.contains(&word.as_str()) {
                    grouping = next == Some(&'(')
                        && matches!(
                            word.as_str(),
                            "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                        );
                } else if braces == 0 && brackets == 0 && !grouping && next != Some(&'(') {
                    names.push(word);
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    names
}

#[test]
fn the_promql_reader_finds_metric_names_and_nothing_else() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (le, route) (rate(vynil_gateway_request_duration_seconds_bucket{route=~"$route", method="GET"}[5m]))) / on (job) group_left up"#,
    );
    assert_eq!(names, ["vynil_gateway_request_duration_seconds_bucket", "up"]);
    assert_eq!(metric_names("sum(rate(a_total[1m])) by (x) + b"), ["a_total", "b"]);
}

#[test]
fn the_collector_configuration_wires_what_it_defines_and_scrapes_the_ports_deploy_names() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");
    let config: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(format!("{dir}/observability/otel-collector.yaml")).unwrap(),
    )
    .unwrap();
    let pipelines = config["service"]["pipelines"].as_mapping().unwrap();
    assert!(pipelines.contains_key("traces") && pipelines.contains_key("metrics"), "{pipelines:?}");
    for (name, pipeline) in pipelines {
        for section in ["receivers", "processors", "exporters"] {
            for component in pipeline[section].as_sequence().unwrap() {
                let component = component.as_str().unwrap();
                assert!(
                    config[section].as_mapping().unwrap().contains_key(component),
                    "pipeline {name:?} uses {section} {component:?}, which is not defined"
                );
            }
        }
    }
    // The scrape keeps the container ports named grpc or http: every
    // Deployment of deploy/base names its serving port so.
    let relabels = serde_yaml_ng::to_string(&config["receivers"]["prometheus"]).unwrap();
    assert!(relabels.contains("regex: grpc|http"), "{relabels}");
    for service in ["catalog", "scanner", "purger", "lifecycle", "gateway"] {
        let manifest = std::fs::read_to_string(format!("{dir}/base/{service}.yaml")).unwrap();
        assert!(
            manifest.contains("- name: grpc") || manifest.contains("- name: http"),
            "{service}: no port named grpc or http for the collector to scrape"
        );
    }
}
