//! The files of an index, as upstream's `file-scan` writes them, plus one
//! key of ours that upstream's reader ignores (`unannotated`).

use serde::{Deserialize, Serialize};
use vynil_rules::Package;

use crate::{IndexError, Result};

/// The name of the index file under the location's prefix.
pub const INDEX_FILE: &str = "index.yaml";

/// `index.yaml`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct IndexDocument {
    pub packages: Vec<IndexEntry>,
    /// Ours: per repository, the version tags without Vynil annotations a
    /// consumer's descent must know of (`vynil_rules::index::Exported`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unannotated: Vec<UnannotatedTags>,
}

/// One package of the index and the file holding its revisions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    pub category: String,
    pub name: String,
    pub file: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnannotatedTags {
    pub registry: String,
    pub image: String,
    pub tags: Vec<String>,
}

impl IndexDocument {
    /// Decodes `index.yaml` (`file` names it in errors). Every entry's file
    /// must be a plain name under the index (no `/`, no leading `.`).
    pub fn parse(bytes: &[u8], file: &str) -> Result<Self> {
        let malformed = |problem: String| IndexError::Malformed { file: file.to_string(), problem };
        let document: IndexDocument =
            serde_yaml_ng::from_slice(bytes).map_err(|e| malformed(e.to_string()))?;
        for entry in &document.packages {
            if entry.category.is_empty() || entry.name.is_empty() {
                return Err(malformed(format!("entry {:?} has an empty category or name", entry.file)));
            }
            if !is_plain_name(&entry.file) {
                return Err(malformed(format!(
                    "entry {}/{} names file {:?}, which is not a plain file name beside index.yaml",
                    entry.category, entry.name, entry.file
                )));
            }
        }
        Ok(document)
    }

    pub fn render(&self) -> Result<Vec<u8>> {
        serde_yaml_ng::to_string(self)
            .map(String::into_bytes)
            .map_err(|e| IndexError::Write { file: INDEX_FILE.into(), problem: e.to_string() })
    }
}

/// Decodes a package file: a YAML list of `status.packages[]` records. Each
/// must be of the entry's package (`category`/`name`), so a file cannot
/// overwrite another package's entries.
pub fn parse_package_file(bytes: &[u8], entry: &IndexEntry) -> Result<Vec<Package>> {
    let malformed = |problem: String| IndexError::Malformed { file: entry.file.clone(), problem };
    // Through a JSON value, as the JukeBox files: upstream's records use
    // plain maps where serde_yaml would want enum tags.
    let value: serde_json::Value = serde_yaml_ng::from_slice(bytes).map_err(|e| malformed(e.to_string()))?;
    let packages: Vec<Package> = serde_json::from_value(value).map_err(|e| malformed(e.to_string()))?;
    if let Some(other) = packages.iter().find(|p| p.category() != entry.category || p.name() != entry.name) {
        return Err(malformed(format!(
            "it lists {}/{} ({}:{}), but the index lists it for {}/{}",
            other.category(),
            other.name(),
            other.image,
            other.tag,
            entry.category,
            entry.name
        )));
    }
    Ok(packages)
}

pub fn render_package_file(packages: &[Package], file: &str) -> Result<Vec<u8>> {
    let value = serde_json::to_value(packages)
        .map_err(|e| IndexError::Write { file: file.to_string(), problem: e.to_string() })?;
    serde_yaml_ng::to_string(&value)
        .map(String::into_bytes)
        .map_err(|e| IndexError::Write { file: file.to_string(), problem: e.to_string() })
}

fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// A file name part made of what [`is_plain_name`] accepts.
pub fn plain(part: &str) -> String {
    part.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '-') { c } else { '-' }).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn upstreams_index_reads_and_a_file_outside_the_index_is_refused() {
        let document = IndexDocument::parse(
            b"packages:\n  - {category: db, name: pg, file: db_pg.yaml}\n",
            "index.yaml",
        )
        .unwrap();
        assert_eq!(document.packages[0].file, "db_pg.yaml");
        for file in ["../secrets.yaml", "sub/db_pg.yaml", ".hidden.yaml", ""] {
            let text = format!("packages:\n  - {{category: db, name: pg, file: {file:?}}}\n");
            let error = IndexDocument::parse(text.as_bytes(), "index.yaml").unwrap_err();
            assert!(matches!(error, IndexError::Malformed { .. }), "{file}: {error}");
        }
        let error = IndexDocument::parse(b"packages: [", "https://h/index.yaml").unwrap_err();
        assert!(error.to_string().starts_with("https://h/index.yaml is malformed"), "{error}");
    }

    #[test]
    fn a_package_file_of_another_package_is_refused() {
        let entry = IndexEntry { category: "db".into(), name: "pg".into(), file: "db_pg.yaml".into() };
        let text = "- registry: r\n  image: web/app\n  tag: 1.0.0\n  metadata: {name: app, category: web, description: '', type: tenant, features: []}\n  requirements: []\n";
        let error = parse_package_file(text.as_bytes(), &entry).unwrap_err();
        assert!(error.to_string().contains("web/app"), "{error}");
    }
}
