//! Files only their owner may read (tokens, the CLI's contexts), written so
//! that a reader never sees half of one: a new file created with mode 0600,
//! synced, then renamed over the old one.

use std::{io::Write, os::unix::fs::OpenOptionsExt, path::Path};

/// Writes `content` to `path` with mode 0600, atomically (parent directories created).
pub fn write_private(path: &Path, content: &[u8]) -> Result<(), std::io::Error> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let temporary = path.with_extension("tmp");
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&temporary)?;
    file.write_all(content)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_private_file_is_its_owners_only_and_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deep/token");
        super::write_private(&path, b"one").unwrap();
        super::write_private(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
