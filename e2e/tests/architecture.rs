//! The workspace's architecture, guarded: which of our crates may depend on
//! which (`docs/architecture.md`, "Crates, and what may depend on what"),
//! read from `cargo metadata` (normal dependencies: what the product
//! links). A dependency the map does not allow fails here, naming it.
//!
//! What the map does not allow yet and the tree still has is listed in
//! [`KNOWN`], each with the work that removes it; a listed edge that is gone
//! fails too, so the list only shrinks.
//!
//! Within a crate, no two files import each other, even through others
//! (`no_import_loop_between_files`): a name both need lives where both can
//! import it.

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
            "vynil-kube",
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
    let crates = ["rules", "crds", "registry", "store", "runtime", "failure", "script", "kube", "index"];
    let crates: Vec<String> = crates.iter().map(|c| format!("crates/{c}/")).collect();
    let others = ["services/", "gateway/", "local/", "proto/"];
    source_files(&[crates.iter().map(String::as_str).collect::<Vec<_>>(), others.to_vec()].concat())
}

/// The `src/` files of the crates under `roots`, as git knows them.
fn source_files(roots: &[&str]) -> Vec<String> {
    // Tracked files and new ones not yet added (CI's clean clone has only the first).
    let output = Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard", "*.rs"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("git is needed: apt-get install -y git");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter(|f| roots.iter().any(|p| f.starts_with(p)) && f.contains("/src/"))
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

/// Product files and functions allowed over their bound, each with its size
/// and why: generated code (the protos, built in `OUT_DIR`, is not read) and
/// the rules' tables would go here. None is today; a file or function added
/// here may not grow, and one brought under its bound must leave the list.
const LONG_FILES: [(&str, usize); 0] = [];
const LONG_FUNCTIONS: [(&str, &str, usize); 0] = [];

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

/// A file's crate directory and module path (`lib.rs` and `mod.rs` name
/// their directory's module); binaries are not modules of their crate.
fn module_of(path: &str) -> Option<(String, Vec<String>)> {
    let (krate, rest) = path.split_once("/src/")?;
    if rest.starts_with("bin/") || rest == "main.rs" {
        return None;
    }
    let mut parts: Vec<String> = rest.strip_suffix(".rs")?.split('/').map(String::from).collect();
    if matches!(parts.last().map(String::as_str), Some("lib" | "mod")) {
        parts.pop();
    }
    Some((krate.to_string(), parts))
}

/// `a::{b, c::{d as e}, f::*}` as paths: `a::b`, `a::c::d`, `a::f::*`.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else {
        return vec![tree.split("as").next().unwrap_or(&tree).to_string()];
    };
    let (prefix, inner) = (&tree[..open], &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())]);
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (at, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts.into_iter().filter(|p| !p.is_empty()).flat_map(expand).map(|p| format!("{prefix}{p}")).collect()
}

/// The paths into its own crate a file's code names (`crate::`, `super::`,
/// `self::`, in `use` items and inline), and those it re-exports (`pub use`).
fn crate_paths(code: &str) -> (Vec<String>, Vec<String>) {
    let (mut named, mut exported) = (Vec::new(), Vec::new());
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].rsplit('\n').next().unwrap_or("").trim();
        let item = &rest[at + 4..];
        let public = before == "pub" || (before.starts_with("pub(") && before.ends_with(')'));
        if !before.is_empty() && !public {
            rest = item;
            continue;
        }
        let end = item.find(';').unwrap_or(item.len());
        for path in expand(&item[..end]) {
            if public {
                exported.push(path.clone());
            }
            named.push(path);
        }
        rest = &item[end..];
    }
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    for root in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(root) {
            if code[..at].chars().next_back().is_some_and(|c| ident(c) || c == ':') {
                continue;
            }
            let path = &code[at..];
            let mut end = 0;
            for segment in path.split("::") {
                let length = segment.find(|c: char| !ident(c)).unwrap_or(segment.len());
                end += length + 2;
                if length < segment.len() || length == 0 {
                    break;
                }
            }
            named.push(path[..end.saturating_sub(2).min(path.len())].trim_end_matches(':').to_string());
        }
    }
    (named, exported)
}

/// Product code before its test module, without comments.
fn code_of(path: &str) -> String {
    let text = std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let mut code = String::new();
    for line in text.lines().take_while(|l| !l.starts_with("#[cfg(test)]")) {
        let line = match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        };
        code.push_str(line);
        code.push('\n');
    }
    code
}

/// The module `path` (as named from `here`) lands in, and the names left
/// after it; `None` for another crate's path.
fn resolve(
    modules: &BTreeSet<Vec<String>>,
    here: &[String],
    path: &str,
) -> Option<(Vec<String>, Vec<String>)> {
    let mut segments = path.split("::").map(String::from).peekable();
    let mut module = match segments.peek().map(String::as_str) {
        Some("crate") => {
            segments.next();
            Vec::new()
        }
        Some("super" | "self") => here.to_vec(),
        // `use child::Name` (a path relative to this module, since 2018).
        Some(first) if modules.contains(&[here, &[first.to_string()]].concat()) => here.to_vec(),
        _ => return None,
    };
    while let Some(step) = segments.next_if(|s| s == "super" || s == "self") {
        if step == "super" {
            module.pop();
        }
    }
    let mut rest: Vec<String> = segments.collect();
    while !rest.is_empty() && modules.contains(&[&module[..], &rest[..1]].concat()) {
        module.push(rest.remove(0));
    }
    Some((module, rest))
}

/// The import loops between the modules of `files` (path, code): each as
/// `crate: a -> b -> a`. A module naming its own descendants (a parent
/// re-exporting its children) is not a loop; a name re-exported by a module
/// counts as the module that defines it.
fn import_loops(files: &[(String, String)]) -> Vec<String> {
    type Module = (String, Vec<String>);
    type Named = (Vec<String>, Vec<String>);
    let parsed: Vec<(Module, Named)> =
        files.iter().filter_map(|(path, code)| Some((module_of(path)?, crate_paths(code)))).collect();
    let mut modules: BTreeMap<String, BTreeSet<Vec<String>>> = BTreeMap::new();
    for ((krate, module), _) in &parsed {
        modules.entry(krate.clone()).or_default().insert(module.clone());
    }
    let mut exported: BTreeMap<(String, Vec<String>, String), Vec<String>> = BTreeMap::new();
    for ((krate, module), (_, exports)) in &parsed {
        for path in exports {
            if let Some((target, rest)) = resolve(&modules[krate], module, path)
                && let (Some(name), false) = (rest.last(), target == *module)
            {
                exported.insert((krate.clone(), module.clone(), name.clone()), target);
            }
        }
    }
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for ((krate, module), (named, _)) in &parsed {
        for path in named {
            let Some((mut target, rest)) = resolve(&modules[krate], module, path) else { continue };
            for _ in 0..4 {
                match rest.first().and_then(|n| exported.get(&(krate.clone(), target.clone(), n.clone()))) {
                    Some(defined) => target = defined.clone(),
                    None => break,
                }
            }
            if !target.starts_with(module) {
                edges.entry((krate.clone(), module.clone())).or_default().insert((krate.clone(), target));
            }
        }
    }
    let name = |m: &Module| if m.1.is_empty() { "lib".to_string() } else { m.1.join("::") };
    let mut loops = BTreeSet::new();
    for (from, targets) in &edges {
        for to in targets {
            // The shortest way back from `to` to `from`, if any.
            let mut came: BTreeMap<&Module, &Module> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([to]);
            while let Some(at) = queue.pop_front() {
                if at == from {
                    let mut cycle = vec![from];
                    let mut step = from;
                    while step != to {
                        step = came[step];
                        cycle.push(step);
                    }
                    cycle.reverse();
                    let at_least = cycle.iter().min().and_then(|m| cycle.iter().position(|c| c == m));
                    cycle.rotate_left(at_least.unwrap_or(0));
                    let names: Vec<String> = cycle.iter().map(|m| name(m)).collect();
                    loops.insert(format!("{}: {} -> {}", from.0, names.join(" -> "), names[0]));
                    break;
                }
                for next in edges.get(at).into_iter().flatten() {
                    if next != to && !came.contains_key(next) {
                        came.insert(next, at);
                        queue.push_back(next);
                    }
                }
            }
        }
    }
    loops.into_iter().collect()
}

#[test]
fn no_import_loop_between_files() {
    let files: Vec<(String, String)> = product_files()
        .into_iter()
        .chain(source_files(&["crates/testkit/"]))
        .map(|path| {
            let code = code_of(&path);
            (path, code)
        })
        .collect();
    let loops = import_loops(&files);
    assert!(
        loops.is_empty(),
        "import loops between files: move the name both need where both can import it\n{}",
        loops.join("\n")
    );
}

/// The detector itself: siblings naming each other loop, through a
/// re-export too; a parent re-exporting its children does not.
#[test]
fn the_loop_guard_sees_loops_and_only_loops() {
    let file = |path: &str, code: &str| (format!("x/src/{path}"), code.to_string());
    let siblings = [
        file("lib.rs", "mod a;\nmod b;\n"),
        file("a.rs", "use crate::b::B;\n"),
        file("b.rs", "fn f() { super::a::g() }\n"),
    ];
    assert_eq!(import_loops(&siblings), ["x: a -> b -> a"]);
    let hidden = [
        file("lib.rs", "pub use a::A;\npub use b::{B, C};\n"),
        file("a.rs", "use crate::{B, other::Z};\n"),
        file("b.rs", "use crate::A;\n"),
    ];
    assert_eq!(import_loops(&hidden), ["x: a -> b -> a"]);
    let parent = [file("lib.rs", "pub use a::A;\npub struct E;\n"), file("a.rs", "use crate::E;\n")];
    assert!(import_loops(&parent).is_empty());
}
