//! Every committed fuzz input, replayed as an ordinary test: the corpus each
//! fuzzer grew (`fuzz/corpus/<target>/`) and every input that once broke a
//! property (`fuzz/regressions/<target>/`, kept after its fix). A target
//! without a corpus fails: a fuzzer that was never run proves nothing.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn inputs(folder: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
    files.sort();
    files
}

fn replay(name: &str, body: fn(&[u8]), folder: &str) -> usize {
    let files = inputs(&fuzz_dir().join(folder).join(name));
    for file in &files {
        let data = std::fs::read(file).unwrap();
        let outcome = std::panic::catch_unwind(|| body(&data));
        assert!(
            outcome.is_ok(),
            "{} broke a property of target {name} (replay: cargo fuzz run {name} {})",
            file.display(),
            file.display()
        );
    }
    files.len()
}

#[test]
fn every_target_replays_its_corpus_and_regressions() {
    let mut counts = Vec::new();
    for (name, body) in vynil_fuzzing::TARGETS {
        let corpus = replay(name, *body, "corpus");
        let regressions = replay(name, *body, "regressions");
        assert!(
            corpus > 0,
            "no corpus for fuzz target {name}: run scripts/fuzz.sh {name} and commit fuzz/corpus/{name}"
        );
        counts.push(format!("{name}: {corpus} inputs, {regressions} regressions"));
    }
    println!("{}", counts.join("\n"));
}
