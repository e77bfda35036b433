//! Writes the CRDs to `deploy/crds/vynil.yaml` (or prints them with `-`).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let yaml = vynil_crds::crds_yaml()?;
    match std::env::args().nth(1).as_deref() {
        Some("-") => print!("{yaml}"),
        other => {
            let path = other.map(PathBuf::from).unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds/vynil.yaml")
            });
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, yaml)?;
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}
