//! Scans of index sources (`http`, `s3`): read `index.yaml` and the package
//! files the scan's scope selects, each conditionally, and let the rules
//! crate compute this JukeBox's view of each repository
//! (`vynil_rules::index`); a file that cannot be read or decoded is an
//! error naming it, and its package keeps what the catalog had.

use vynil_crds::{JukeBoxSource, JukeBoxSpec};
use vynil_index::{IndexReader, Location};
use vynil_rules::{
    ScanScope, Viewer,
    index::{IndexFile, index_outcomes},
};
use vynil_store::{JukeboxRecord, ScannerStore};

use crate::engine::{EngineSettings, Progress, ScanOutput};

/// Where an index source's JukeBox reads, and the Secret holding its
/// credentials; `None` for the other sources.
pub fn location_of(spec: &JukeBoxSpec) -> Option<(Location, Option<String>)> {
    match &spec.source {
        Some(JukeBoxSource::Http(http)) => {
            Some((Location::Http { url: http.url.clone(), authorization: None }, http.secret.clone()))
        }
        Some(JukeBoxSource::S3(s3)) => Some((
            Location::S3 {
                bucket: s3.bucket.clone(),
                region: s3.region.clone(),
                prefix: s3.prefix.clone(),
                endpoint: s3.endpoint.clone(),
                credentials: None,
            },
            s3.secret.clone(),
        )),
        _ => None,
    }
}

/// Scans what `scope` selects of the index `reader` reads.
pub async fn scan(
    reader: &IndexReader,
    settings: &EngineSettings,
    record: &JukeboxRecord,
    scope: &ScanScope,
    on_progress: &(dyn Fn(&Progress) + Send + Sync),
) -> ScanOutput {
    // A registry push names an OCI repository, which an index does not list.
    if matches!(scope, ScanScope::Repository(_)) {
        return ScanOutput::NothingToScan;
    }
    let document = match reader.index().await {
        Ok(document) => document,
        Err(why) => return ScanOutput::SourceFailed(format!("cannot read the index: {why}")),
    };
    let filter = scope.filter();
    let selected: Vec<_> =
        document.packages.iter().filter(|e| filter.is_none_or(|f| f.names(&e.category, &e.name))).collect();
    if selected.len() > settings.max_repositories {
        return ScanOutput::SourceFailed(format!(
            "the index lists {} packages, over the cap of {}: nothing scanned, the catalog is kept \
             (raise --max-repositories-per-jukebox)",
            selected.len(),
            settings.max_repositories
        ));
    }
    let mut progress = Progress { repositories_total: selected.len() as u32, ..Progress::default() };
    on_progress(&progress);
    let mut files = Vec::with_capacity(selected.len());
    for entry in selected {
        let file = match reader.package_file(entry).await {
            Ok(packages) => {
                progress.tags_seen += packages.len() as u64;
                IndexFile::Read(packages)
            }
            Err(why) => {
                progress.errors.push((reader.location().describe(&entry.file), why.to_string()));
                IndexFile::Failed
            }
        };
        progress.repositories_done += 1;
        on_progress(&progress);
        files.push(((entry.category.clone(), entry.name.clone()), file));
    }
    let unannotated: Vec<_> = document
        .unannotated
        .iter()
        .map(|u| ((u.registry.clone(), u.image.clone()), u.tags.clone()))
        .collect();
    let viewer = Viewer { channel: record.spec.channel(), framework: settings.framework.clone() };
    let known = record.status.as_ref().map(|s| s.packages.as_slice()).unwrap_or_default();
    let outcomes = index_outcomes(known, filter, &files, &unannotated, &viewer);
    ScanOutput::Scanned { outcomes, errors: progress.errors }
}

/// `location` with the credentials of Secret `secret` when the source names
/// one (read afresh at each scan, as pull secrets): a Secret the JukeBox may
/// name, bound to the host the location reaches (`vynil_crds::secrets`), or
/// the source is refused and nothing is asked of it.
pub async fn credentialed(
    store: &dyn ScannerStore,
    location: Location,
    secret: Option<&str>,
) -> Result<Location, ScanOutput> {
    let Some(secret) = secret.filter(|s| !s.is_empty()) else { return Ok(location) };
    let failed = |why: String| ScanOutput::SourceFailed(why);
    let named = store.secret(secret).await.map_err(|e| ScanOutput::unreadable(e, None, ""))?;
    if let Some(url) = location.contacted().map_err(|e| failed(e.to_string()))? {
        let bound = named.hosts().and_then(|hosts| hosts.require(&url));
        bound.map_err(|refused| ScanOutput::SourceRefused(refused.to_string()))?;
    }
    location.with_secret(secret, &named.data).map_err(|e| failed(e.to_string()))
}
