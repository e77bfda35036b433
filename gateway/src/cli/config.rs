//! Where the CLI finds the gateway and its token: flags, then `VYNIL_URL` /
//! `VYNIL_TOKEN`, then the current (or named) context of the config file
//! (`$XDG_CONFIG_HOME/vynil/vynilctl.yaml`, `~/.config/vynil/vynilctl.yaml`),
//! which `vynilctl login` writes with mode 0600.

use std::{collections::BTreeMap, path::PathBuf};

use serde::{Deserialize, Serialize};

use super::client::{CliError, CliResult, Exit};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConfigFile {
    #[serde(default)]
    pub current: Option<String>,
    #[serde(default)]
    pub contexts: BTreeMap<String, Context>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Context {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// The config file's path: `explicit`, else the user's config directory.
pub fn path(explicit: Option<&PathBuf>) -> Option<PathBuf> {
    if let Some(path) = explicit {
        return Some(path.clone());
    }
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("XDG_CONFIG_HOME")
        .or_else(|| var("HOME").map(|h| h.join(".config")))
        .map(|d| d.join("vynil/vynilctl.yaml"))
}

pub fn load(path: Option<&PathBuf>) -> CliResult<ConfigFile> {
    let Some(path) = path else { return Ok(ConfigFile::default()) };
    match std::fs::read_to_string(path) {
        Ok(text) => serde_yaml_ng::from_str(&text).map_err(|e| {
            CliError::new(
                Exit::Usage,
                format!("{}: not a vynilctl config ({e}); fix or remove it", path.display()),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ConfigFile::default()),
        Err(e) => Err(CliError::new(Exit::Failed, format!("cannot read {}: {e}", path.display()))),
    }
}

/// Writes the file readable by its owner only, atomically.
pub fn save(path: &std::path::Path, config: &ConfigFile) -> CliResult<()> {
    let text = serde_yaml_ng::to_string(config).map_err(|e| CliError::new(Exit::Failed, e.to_string()))?;
    vynil_runtime::files::write_private(path, text.as_bytes())
        .map_err(|e| CliError::new(Exit::Failed, format!("cannot write {}: {e}", path.display())))
}
