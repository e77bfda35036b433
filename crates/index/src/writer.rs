//! Writing an index so that a consumer never reads half of one (the order is
//! explained in the crate's documentation).

use object_store::{ObjectStore, ObjectStoreExt, PutPayload, path::Path};
use sha2::{Digest, Sha256};
use vynil_rules::Package;

use crate::{
    INDEX_FILE, IndexDocument, IndexEntry, IndexError, Location, Result, UnannotatedTags,
    format::{plain, render_package_file},
    reader::error,
};

/// What an export did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExportReport {
    /// Revisions the index lists.
    pub packages: usize,
    /// Files written, `index.yaml` last; empty when the index was already
    /// this one.
    pub written: Vec<String>,
    /// Files of the previous index that the new one no longer lists.
    pub removed: Vec<String>,
}

/// Writes the index of `packages` at `location` and removes what the
/// previous index listed and this one does not. `index.yaml` is read back
/// after it is written: the export is done when it reads as written.
pub async fn write_index(
    location: &Location,
    packages: &[Package],
    unannotated: &[UnannotatedTags],
) -> Result<ExportReport> {
    let (store, prefix) = location.open()?;
    let at =
        |file: &str| if prefix.as_ref().is_empty() { Path::from(file) } else { prefix.clone().join(file) };

    let mut groups: Vec<((String, String), Vec<Package>)> = Vec::new();
    for package in packages {
        let key = (package.category().to_string(), package.name().to_string());
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, group)) => group.push(package.clone()),
            None => groups.push((key, vec![package.clone()])),
        }
    }
    let mut files: Vec<(IndexEntry, Vec<u8>)> = Vec::new();
    for ((category, name), group) in &groups {
        let stem = format!("{}_{}", plain(category), plain(name));
        let body = render_package_file(group, &stem)?;
        let hash = hex::encode(Sha256::digest(&body));
        let file = format!("{stem}-{}.yaml", &hash[..12]);
        files.push((IndexEntry { category: category.clone(), name: name.clone(), file }, body));
    }
    let document = IndexDocument {
        packages: files.iter().map(|(e, _)| e.clone()).collect(),
        unannotated: unannotated.to_vec(),
    };
    let rendered = document.render()?;

    let previous = previous_index(store.as_ref(), &at(INDEX_FILE), location).await?;
    let mut report = ExportReport { packages: packages.len(), ..ExportReport::default() };
    if previous.as_ref().is_some_and(|(bytes, _)| *bytes == rendered) {
        return Ok(report);
    }
    let listed: Vec<String> = previous
        .as_ref()
        .map(|(_, d)| d.packages.iter().map(|e| e.file.clone()).collect())
        .unwrap_or_default();
    for (entry, body) in files {
        // Named by content: a file the previous index lists is this one.
        if listed.contains(&entry.file) {
            continue;
        }
        put(store.as_ref(), &at(&entry.file), body, &location.describe(&entry.file)).await?;
        report.written.push(entry.file);
    }
    let described = location.describe(INDEX_FILE);
    put(store.as_ref(), &at(INDEX_FILE), rendered.clone(), &described).await?;
    let read_back = store.get(&at(INDEX_FILE)).await.map_err(|e| error(&described, e))?;
    let read_back = read_back.bytes().await.map_err(|e| error(&described, e))?;
    if read_back.as_ref() != rendered.as_slice() {
        return Err(IndexError::Write {
            file: described,
            problem: "it reads back different from what was written (another exporter at the same place?)"
                .into(),
        });
    }
    report.written.push(INDEX_FILE.to_string());
    for stale in listed.iter().filter(|f| !document.packages.iter().any(|e| &e.file == *f)) {
        match store.delete(&at(stale)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => report.removed.push(stale.clone()),
            Err(e) => {
                tracing::warn!(file = %location.describe(stale), error = %e, "stale index file not removed")
            }
        }
    }
    Ok(report)
}

/// The index there before, if any and readable. An index that does not
/// decode is replaced, but none of its files is removed (unknown is not
/// stale); an unreachable store fails the export.
async fn previous_index(
    store: &dyn ObjectStore,
    path: &Path,
    location: &Location,
) -> Result<Option<(Vec<u8>, IndexDocument)>> {
    let described = location.describe(INDEX_FILE);
    let bytes = match store.get(path).await {
        Ok(found) => found.bytes().await.map_err(|e| error(&described, e))?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(error(&described, e)),
    };
    match IndexDocument::parse(&bytes, &described) {
        Ok(document) => Ok(Some((bytes.to_vec(), document))),
        Err(why) => {
            tracing::warn!(%why, "the previous index is replaced; none of its files is removed");
            Ok(Some((bytes.to_vec(), IndexDocument::default())))
        }
    }
}

async fn put(store: &dyn ObjectStore, path: &Path, body: Vec<u8>, described: &str) -> Result<()> {
    store.put(path, PutPayload::from(body)).await.map(|_| ()).map_err(|e| match error(described, e) {
        IndexError::Unreachable { file, problem } => IndexError::Write { file, problem },
        other => other,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use vynil_rules::{PackageContent, PackageType};

    use super::*;
    use crate::{ConditionalCache, IndexReader};

    fn package(image: &str, tag: &str, name: &str) -> Package {
        Package::new("r.example", image, tag, PackageContent::minimal("db", name, PackageType::Tenant))
    }

    #[tokio::test]
    async fn an_export_reads_back_and_a_second_one_removes_what_it_no_longer_lists() {
        let dir = tempfile::tempdir().unwrap();
        let location = Location::Directory(dir.path().join("index"));
        let first = [package("db/pg", "1.0.0", "pg"), package("db/mysql", "8.0.0", "mysql")];
        let report = write_index(&location, &first, &[]).await.unwrap();
        assert_eq!(report.written.len(), 3, "{report:?}");
        assert_eq!(report.written.last().map(String::as_str), Some(INDEX_FILE));
        let reader = IndexReader::open(location.clone(), ConditionalCache::default()).unwrap();
        let index = reader.index().await.unwrap();
        assert_eq!(index.packages.len(), 2);
        assert_eq!(reader.package_file(&index.packages[1]).await.unwrap(), vec![first[1].clone()]);

        let again = write_index(&location, &first, &[]).await.unwrap();
        assert!(again.written.is_empty() && again.removed.is_empty(), "unchanged: {again:?}");

        let second = [package("db/pg", "1.1.0", "pg")];
        let report = write_index(&location, &second, &[]).await.unwrap();
        let mut before: Vec<String> = index.packages.iter().map(|e| e.file.clone()).collect();
        before.sort();
        let mut removed = report.removed.clone();
        removed.sort();
        assert_eq!(removed, before, "both old files go, the new pg file is another");
        let names: Vec<String> = std::fs::read_dir(dir.path().join("index"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "index.yaml and one package file: {names:?}");
    }
}
