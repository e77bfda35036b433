//! Makes cargo-fuzz's entry points (`fuzz/fuzz_targets/*.rs`) compilable
//! in this workspace: each file, without its `#![no_main]`, becomes a
//! module of `$OUT_DIR/entry_points.rs`, and `ENTRY_POINTS` lists them. The
//! test `tests/entry_points.rs` includes it with a stand-in for
//! libfuzzer-sys' `fuzz_target!`, so an entry point that no longer compiles
//! against this crate fails the workspace's build, not only `cargo fuzz`
//! (whose crate, `fuzz/`, is its own workspace the main build never sees).

use std::{fmt::Write as _, path::Path};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = std::env::var("CARGO_MANIFEST_DIR")?;
    let dir = Path::new(&manifest).join("../fuzz/fuzz_targets");
    println!("cargo::rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = std::fs::read_dir(&dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    let mut out = String::new();
    let mut names = Vec::new();
    for file in &files {
        println!("cargo::rerun-if-changed={}", file.display());
        let name =
            file.file_stem().and_then(|s| s.to_str()).ok_or("a fuzz target's file name is not UTF-8")?;
        let text = std::fs::read_to_string(file)?.replace("#![no_main]", "");
        writeln!(
            out,
            "pub mod {name} {{\n    #[allow(unused_imports)]\n    use super::libfuzzer_sys;\n{text}\n}}"
        )?;
        names.push(name.to_string());
    }
    writeln!(out, "pub const ENTRY_POINTS: &[vynil_fuzzing::Target] = &[")?;
    for name in &names {
        writeln!(out, "    ({name:?}, {name}::entry),")?;
    }
    writeln!(out, "];")?;
    std::fs::write(Path::new(&std::env::var("OUT_DIR")?).join("entry_points.rs"), out)?;
    Ok(())
}
