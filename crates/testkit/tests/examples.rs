//! `examples/layout` is what `vynil-examples layout` writes from the example
//! set: regenerating it changes no byte (or this fails, naming the command).

#![allow(clippy::unwrap_used)]

use std::{collections::BTreeMap, path::Path};

fn files(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut found = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(root).unwrap().to_string_lossy().to_string();
                found.insert(relative, std::fs::read(&path).unwrap());
            }
        }
    }
    found
}

#[test]
fn the_committed_example_layout_is_the_example_sets_output() {
    let dir = tempfile::tempdir().unwrap();
    vynil_testkit::write_examples(&vynil_testkit::LayoutWriter::new(dir.path())).unwrap();
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/layout");
    let (committed, generated) = (files(&committed), files(dir.path()));
    let differing: Vec<&String> = committed
        .keys()
        .chain(generated.keys())
        .filter(|name| committed.get(*name) != generated.get(*name))
        .collect();
    assert!(
        differing.is_empty(),
        "examples/layout differs from the example set ({differing:?}): run `cargo run -p vynil-testkit --bin vynil-examples -- layout examples/layout` and commit it"
    );
}
