//! The embedded default: when the JukeBox directory does not exist, local
//! mode writes the example packages (`examples/layout`, embedded at build
//! time) and a JukeBox `examples` reading them into the state directory, so
//! the first command shows a real catalog on any machine, offline. The copy
//! is rewritten at each start: purging it is an experiment, not a loss.

use std::path::{Path, PathBuf};

use crate::LocalError;

include!(concat!(env!("OUT_DIR"), "/example_layout.rs"));

/// The JukeBox directory of the embedded example, written under `state`.
pub fn write(state: &Path) -> Result<PathBuf, LocalError> {
    let root = state.join("example");
    let error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LocalError::State { path, source }
    };
    let layout = root.join("layout");
    if layout.exists() {
        std::fs::remove_dir_all(&layout).map_err(error(&layout))?;
    }
    for (relative, bytes) in EXAMPLE_LAYOUT {
        let path = layout.join(relative);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(error(dir))?;
        }
        std::fs::write(&path, bytes).map_err(error(&path))?;
    }
    let jukeboxes = root.join("jukeboxes");
    std::fs::create_dir_all(&jukeboxes).map_err(error(&jukeboxes))?;
    let absolute = std::path::absolute(&layout).map_err(error(&layout))?;
    let jukebox = format!(
        "# The embedded example: packages in an OCI image layout (local mode writes it).\n\
         apiVersion: vynil.solidite.fr/v1\nkind: JukeBox\nmetadata:\n  name: examples\nspec:\n  source:\n    layout:\n      path: {:?}\n  maturity: stable\n  schedule: \"0 3 * * *\"\n",
        absolute.display().to_string()
    );
    let file = jukeboxes.join("examples.yaml");
    std::fs::write(&file, jukebox).map_err(error(&file))?;
    Ok(jukeboxes)
}
