//! Embeds `examples/layout` (the example packages as OCI image layouts) in
//! the `vynil` binary, so local mode's default shows a real catalog on any
//! machine, without network and without the repository at hand.

use std::{fmt::Write, path::Path};

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        if path.is_dir() {
            walk(root, &path, out)?;
        } else if let Ok(relative) = path.strip_prefix(root) {
            out.push((relative.to_string_lossy().replace('\\', "/"), path.display().to_string()));
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = std::env::var("CARGO_MANIFEST_DIR")?;
    let root = Path::new(&manifest).join("../examples/layout");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    walk(&root, &root, &mut files)?;
    let mut code = String::from(
        "/// `examples/layout`, file by file.\npub const EXAMPLE_LAYOUT: &[(&str, &[u8])] = &[\n",
    );
    for (relative, absolute) in files {
        writeln!(code, "    ({relative:?}, include_bytes!({absolute:?})),")?;
    }
    code.push_str("];\n");
    std::fs::write(Path::new(&std::env::var("OUT_DIR")?).join("example_layout.rs"), code)?;
    Ok(())
}
