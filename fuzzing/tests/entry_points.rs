//! cargo-fuzz's entry points compiled and run by the workspace's tests: a
//! target that no longer builds, or that `fuzz/Cargo.toml` does not
//! declare, or that calls another target's body, fails here (see
//! `build.rs`).

#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::Path;

/// libfuzzer-sys' `fuzz_target!`, as far as our entry points use it: the
/// body becomes `entry`, fed raw bytes or (for a typed input) what
/// `arbitrary` builds from them, as libFuzzer would.
mod libfuzzer_sys {
    macro_rules! fuzz_target {
        (|$data:ident: &[u8]| $body:expr) => {
            pub fn entry($data: &[u8]) {
                $body
            }
        };
        (|$data:ident: $input:ty| $body:expr) => {
            pub fn entry(bytes: &[u8]) {
                if let Ok($data) =
                    <$input as arbitrary::Arbitrary>::arbitrary(&mut arbitrary::Unstructured::new(bytes))
                {
                    $body
                }
            }
        };
    }
    pub(crate) use fuzz_target;
}

include!(concat!(env!("OUT_DIR"), "/entry_points.rs"));

fn fuzz_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

#[test]
fn every_target_has_a_cargo_fuzz_entry_point_that_builds_and_runs_its_body() {
    let entries: Vec<&str> = ENTRY_POINTS.iter().map(|(name, _)| *name).collect();
    let mut targets: Vec<&str> = vynil_fuzzing::TARGETS.iter().map(|(name, _)| *name).collect();
    targets.sort();
    assert_eq!(entries, targets, "fuzz/fuzz_targets/ holds one entry point per target");
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    for (name, entry) in ENTRY_POINTS {
        assert!(
            manifest.contains(&format!("name = \"{name}\"\npath = \"fuzz_targets/{name}.rs\"")),
            "fuzz/Cargo.toml declares no [[bin]] {name} at fuzz_targets/{name}.rs"
        );
        let text =
            std::fs::read_to_string(fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"))).unwrap();
        assert!(
            text.contains(&format!("vynil_fuzzing::{name}::run(")),
            "fuzz_targets/{name}.rs does not call its own target's body"
        );
        // The entry point runs as its body does on the target's first inputs.
        let mut corpus: Vec<_> = std::fs::read_dir(fuzz_dir().join("corpus").join(name))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        corpus.sort();
        for file in corpus.iter().take(16) {
            entry(&std::fs::read(file).unwrap());
        }
    }
}
