//! The example package set (`vynil_testkit::examples`), written as OCI image
//! layouts or published to a real local registry.
//!
//! ```text
//! vynil-examples layout <dir>   rewrite <dir> (examples/layout) with the set
//! vynil-examples registry       start Debian's docker-registry on a free port, publish
//!                               the set, print a JukeBox for it, serve until Ctrl-C
//! ```

use std::path::PathBuf;

use vynil_testkit::{EXAMPLE_REPOSITORIES, LayoutWriter, RegistryServer, publish_examples, write_examples};

const USAGE: &str = "usage: vynil-examples layout <dir> | vynil-examples registry";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["layout", dir] => {
            let dir = PathBuf::from(dir);
            if dir.exists() {
                std::fs::remove_dir_all(&dir)?;
            }
            write_examples(&LayoutWriter::new(&dir))?;
            println!("wrote the example packages as OCI image layouts under {}", dir.display());
            Ok(())
        }
        ["registry"] => {
            let registry = RegistryServer::start().await?;
            publish_examples(&registry.publisher()).await?;
            let list: Vec<String> =
                EXAMPLE_REPOSITORIES.iter().map(|r| format!("      - {}/{r}", registry.host())).collect();
            println!(
                "a registry with the example packages is serving at {}\n\
                 a JukeBox for it (local mode: add --insecure-registry {}):\n\n\
                 apiVersion: vynil.solidite.fr/v1\nkind: JukeBox\nmetadata:\n  name: dev-registry\nspec:\n  source:\n    list:\n{}\n\n\
                 Ctrl-C stops it.",
                registry.base_url(),
                registry.host(),
                list.join("\n")
            );
            tokio::signal::ctrl_c().await?;
            Ok(())
        }
        _ => anyhow::bail!("{USAGE}"),
    }
}
