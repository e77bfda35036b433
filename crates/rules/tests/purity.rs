//! The rules crate stays pure: no runtime, network or cluster crate may enter
//! its normal dependency tree, or the rules would start doing I/O somewhere.

use std::process::Command;

const FORBIDDEN: &[&str] = &["tokio", "tonic", "kube", "redis", "reqwest", "hyper", "oci-client", "futures"];

#[test]
fn the_normal_dependency_tree_holds_no_io_crate() {
    let output = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--edges",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
            "--package",
            "vynil-rules",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo tree: {e}"));
    assert!(output.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&output.stderr));
    let tree = String::from_utf8_lossy(&output.stdout);
    let crates: Vec<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert!(crates.contains(&"semver"), "unexpected tree output: {tree}");
    for forbidden in FORBIDDEN {
        assert!(!crates.contains(forbidden), "{forbidden} entered the rules crate's dependencies:\n{tree}");
    }
}
