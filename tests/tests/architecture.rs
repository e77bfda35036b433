//! The workspace's architecture, guarded: which of our crates may depend on
//! which (`docs/architecture.md`, "Crates, and what may depend on what"),
//! read from `cargo metadata` (normal dependencies: what the product
//! links). A dependency the map does not allow fails here, naming it.
//!
//! What the map does not allow yet and the tree still has is listed in
//! [`KNOWN`], each with the work that removes it; a listed edge that is gone
//! fails too, so the list only shrinks.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::{BTreeMap, BTreeSet},
    process::Command,
};

use serde_json::Value;

/// Domain crates (and the two leaves they share: failure kinds, the script
/// engine): what the rules of the map are about.
const DOMAIN: [&str; 8] = [
    "vynil-failure",
    "vynil-script",
    "vynil-rules",
    "vynil-crds",
    "vynil-registry",
    "vynil-index",
    "vynil-store",
    "vynil-proto",
];
/// One crate per service, and the gateway.
const SERVICES: [&str; 5] =
    ["vynil-catalog", "vynil-scanner", "vynil-purger", "vynil-lifecycle", "vynil-gateway"];

/// Edges the map does not allow that the tree still has, and what removes each.
const KNOWN: [(&str, &str, &str); 0] = [];

/// Our crates, each with where it lives (relative to the workspace) and the
/// crates of ours it depends on (normal dependencies only).
fn workspace() -> BTreeMap<String, (String, BTreeSet<String>)> {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .unwrap();
    assert!(output.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&output.stderr));
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
    let root = metadata["workspace_root"].as_str().unwrap().to_string();
    let packages = metadata["packages"].as_array().unwrap();
    let ours: BTreeSet<String> = packages.iter().map(|p| p["name"].as_str().unwrap().to_string()).collect();
    packages
        .iter()
        .map(|p| {
            let dependencies = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().unwrap().to_string())
                .filter(|d| ours.contains(d))
                .collect();
            let manifest = p["manifest_path"].as_str().unwrap();
            let dir =
                manifest.strip_prefix(&root).unwrap().trim_start_matches('/').trim_end_matches("/Cargo.toml");
            (p["name"].as_str().unwrap().to_string(), (dir.to_string(), dependencies))
        })
        .collect()
}

/// Why `from` may not depend on `to`, if it may not.
fn forbidden(from: &str, from_dir: &str, to: &str) -> Option<&'static str> {
    let allowed = |list: &[&str]| list.contains(&to);
    match from {
        "vynil-failure" | "vynil-script" => {
            Some("the failure kinds and the script engine depend on none of our crates")
        }
        "vynil-rules" => {
            (!allowed(&["vynil-failure"])).then_some("the rules depend on the failure kinds only")
        }
        "vynil-proto" => (!allowed(&["vynil-rules", "vynil-failure"]))
            .then_some("the protos depend on the rules (their one conversion) only"),
        "vynil-crds" | "vynil-registry" | "vynil-index" => (!allowed(&["vynil-rules", "vynil-failure"]))
            .then_some("a domain crate below the store depends on the rules only"),
        "vynil-store" => (!allowed(&[
            "vynil-rules",
            "vynil-crds",
            "vynil-registry",
            "vynil-index",
            "vynil-failure",
            "vynil-script",
        ]))
        .then_some("the store depends on the domain crates below it only"),
        "vynil-runtime" => (!allowed(&["vynil-failure"]))
            .then_some("the runtime is plumbing: it knows no domain crate, only the failure kinds"),
        _ if SERVICES.contains(&from) && SERVICES.contains(&to) => {
            Some("a service (or the gateway) never depends on another: they talk over gRPC")
        }
        _ if from_dir.starts_with("crates/") && (SERVICES.contains(&to) || to == "vynil-local") => {
            Some("nothing under crates/ depends on a service, the gateway or local mode")
        }
        _ if SERVICES.contains(&from) && to == "vynil-local" => {
            Some("local mode runs the services, not the reverse")
        }
        _ => None,
    }
}

#[test]
fn our_crates_depend_only_on_what_the_map_allows() {
    let crates = workspace();
    for name in DOMAIN.iter().chain(&SERVICES).chain(&["vynil-runtime", "vynil-testkit", "vynil-local"]) {
        assert!(crates.contains_key(*name), "{name} is not in the workspace: update this guard and the map");
    }
    let mut found = BTreeSet::new();
    let mut broken = Vec::new();
    for (from, (dir, dependencies)) in &crates {
        for to in dependencies {
            if let Some(why) = forbidden(from, dir, to) {
                if KNOWN.iter().any(|(f, t, _)| f == from && t == to) {
                    found.insert((from.clone(), to.clone()));
                } else {
                    broken.push(format!("{from} ({dir}) depends on {to}: {why}"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "dependencies docs/architecture.md does not allow:\n{}", broken.join("\n"));
    let gone: Vec<String> = KNOWN
        .iter()
        .filter(|(f, t, _)| !found.contains(&(f.to_string(), t.to_string())))
        .map(|(f, t, work)| format!("{f} -> {t} ({work})"))
        .collect();
    assert!(
        gone.is_empty(),
        "gone from the tree: remove from KNOWN (the list only shrinks):\n{}",
        gone.join("\n")
    );
}

/// The guard itself catches what it names: a service depending on another,
/// a crate under crates/ depending on the gateway, the runtime on the rules.
#[test]
fn the_guard_refuses_the_edges_the_map_forbids() {
    assert!(forbidden("vynil-scanner", "services/scanner", "vynil-catalog").is_some());
    assert!(forbidden("vynil-gateway", "gateway", "vynil-lifecycle").is_some());
    assert!(forbidden("vynil-testkit", "crates/testkit", "vynil-gateway").is_some());
    assert!(forbidden("vynil-runtime", "crates/runtime", "vynil-rules").is_some());
    assert!(forbidden("vynil-runtime", "crates/runtime", "vynil-proto").is_some());
    assert!(forbidden("vynil-runtime", "crates/runtime", "vynil-failure").is_none());
    assert!(forbidden("vynil-failure", "crates/failure", "vynil-rules").is_some());
    assert!(forbidden("vynil-registry", "crates/registry", "vynil-store").is_some());
    assert!(forbidden("vynil-scanner", "services/scanner", "vynil-rules").is_none());
    assert!(forbidden("vynil-local", "local", "vynil-scanner").is_none());
}

/// Product code: our libraries and services, not tests, the test kit, the
/// bench or the fuzzing harness.
fn product_files() -> Vec<String> {
    let output = Command::new("git")
        .args(["ls-files", "*.rs"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("git is needed: apt-get install -y git");
    let product = ["crates/rules/", "crates/crds/", "crates/registry/", "crates/store/", "crates/runtime/"];
    let product = [&product[..], &["crates/failure/", "crates/script/"]].concat();
    let product = [&product[..], &["crates/index/", "services/", "gateway/", "local/", "proto/"]].concat();
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter(|f| product.iter().any(|p| f.starts_with(p)) && f.contains("/src/"))
        .map(String::from)
        .collect()
}

/// Lines of `path` before its test module, and each function's length (from
/// its `fn` line to the brace that closes it at the same indentation).
fn sizes(path: &str) -> (usize, Vec<(String, usize)>) {
    let text = std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let lines: Vec<&str> = text.lines().take_while(|l| !l.starts_with("#[cfg(test)]")).collect();
    let mut functions = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let signature = ["pub(crate) ", "pub(super) ", "pub ", "async ", "const "]
            .iter()
            .fold(body, |rest, prefix| rest.strip_prefix(prefix).unwrap_or(rest));
        let Some(name) = signature.strip_prefix("fn ") else { continue };
        if line.trim_end().ends_with(';') {
            continue;
        }
        let name: String = name.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let close = format!("{indent}}}");
        if let Some(end) = lines[at..].iter().position(|l| *l == close) {
            functions.push((name, end + 1));
        }
    }
    (lines.len(), functions)
}

const MAX_FILE_LINES: usize = 600;
const MAX_FUNCTION_LINES: usize = 80;

/// Product files and functions over their bound today, with their size
/// then: none may grow, a new one fails, and one brought under its bound
/// must leave the list (#49: split each into named steps).
const LONG_FILES: [(&str, usize); 5] = [
    ("services/lifecycle/src/script/upstream.rs", 917),
    ("gateway/src/cli/mod.rs", 770),
    ("services/lifecycle/src/install_plan.rs", 756),
    ("crates/registry/src/client.rs", 640),
    ("gateway/src/auth.rs", 613),
];
const LONG_FUNCTIONS: [(&str, &str, usize); 12] = [
    ("services/lifecycle/src/install_plan.rs", "plan", 272),
    ("gateway/src/cli/mod.rs", "run", 186),
    ("services/lifecycle/src/uninstall_plan.rs", "cleanup", 156),
    ("services/lifecycle/src/script/upstream.rs", "register", 149),
    ("services/lifecycle/src/executor.rs", "execute", 119),
    ("services/scanner/src/worker.rs", "run_scan", 114),
    ("services/lifecycle/src/job.rs", "render", 104),
    ("services/lifecycle/src/reaper.rs", "reap", 94),
    ("services/lifecycle/src/lib.rs", "run_with_client", 93),
        ("crates/registry/src/transport.rs", "fetch_token", 92),
    ("crates/rules/src/retention/plan.rs", "plan_retention", 89),
    ("services/lifecycle/src/script/upstream.rs", "register_reads", 86),
];

#[test]
fn no_product_file_or_function_grows_past_its_bound() {
    let (mut over, mut known_seen) = (Vec::new(), BTreeSet::new());
    for path in product_files() {
        let (lines, functions) = sizes(&path);
        if lines > MAX_FILE_LINES {
            match LONG_FILES.iter().find(|(f, _)| *f == path) {
                Some((_, then)) if lines <= *then => {
                    known_seen.insert(path.clone());
                }
                _ => over.push(format!("{path}: {lines} lines (at most {MAX_FILE_LINES})")),
            }
        }
        for (name, length) in functions.into_iter().filter(|(_, l)| *l > MAX_FUNCTION_LINES) {
            match LONG_FUNCTIONS.iter().find(|(f, n, _)| *f == path && *n == name) {
                Some((_, _, then)) if length <= *then => {
                    known_seen.insert(format!("{path}::{name}"));
                }
                _ => over.push(format!("{path}: fn {name} is {length} lines (at most {MAX_FUNCTION_LINES})")),
            }
        }
    }
    assert!(over.is_empty(), "split these into named steps:\n{}", over.join("\n"));
    let listed = LONG_FILES
        .iter()
        .map(|(f, _)| f.to_string())
        .chain(LONG_FUNCTIONS.iter().map(|(f, n, _)| format!("{f}::{n}")));
    let fixed: Vec<String> = listed.filter(|l| !known_seen.contains(l)).collect();
    assert!(
        fixed.is_empty(),
        "within their bound now: remove from the list (it only shrinks):\n{}",
        fixed.join("\n")
    );
}
