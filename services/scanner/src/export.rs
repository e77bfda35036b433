//! Export: scan a JukeBox's OCI source and write an index that serves every
//! consumer (`vynil_rules::index::exported`: every revision any maturity or
//! framework version could be shown), so clusters read one index instead of
//! the registries. Run by the `ExportIndex` RPC or `vynil-scanner export`
//! (from CI, say). A repository that cannot be read fails the export before
//! anything is written: an index missing it would remove its package from
//! every consumer.

use std::path::PathBuf;

use futures::{StreamExt, TryStreamExt};
use vynil_index::{ExportReport, Location, UnannotatedTags, write_index};
use vynil_registry::{
    CredentialStore, InMemoryMetadataCache, RegistryClient, RepositoryRef, TransportConfig,
};
use vynil_rules::index::exported;

use crate::{ScannerError, engine::EngineSettings};

/// Manifest reads in flight within one repository.
const READ_CONCURRENCY: usize = 8;

/// What an export read and wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub repositories: usize,
    pub report: ExportReport,
}

/// Where the `ExportIndex` RPC may write (`--export-destination`): the
/// caller names the destination and a Secret, so without this list any
/// caller holding the service token could have the scanner send credentials
/// to a host of its choice, or write files anywhere the scanner can.
#[derive(Debug, Clone, Default)]
pub struct Destinations {
    allowed: Vec<String>,
}

impl Destinations {
    pub fn new(allowed: &[String]) -> Self {
        let allowed = allowed.iter().map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect();
        Self { allowed }
    }

    /// Accepts `destination` when it is a listed one, or lies below one:
    /// both compared as parsed and normalised ([`place`]), so
    /// `https://charts.example/vynil` admits `https://charts.example/vynil/prod`
    /// but neither `https://charts.example/vynil-evil`, nor
    /// `https://charts.example.evil`, nor an encoded `..`, nor an S3
    /// destination on another `endpoint` or `region`.
    pub fn check(&self, destination: &str) -> Result<(), ScannerError> {
        let wanted = place(destination).map_err(|why| {
            ScannerError::Config(format!(
                "export destination {destination:?} {why}: name the destination itself"
            ))
        })?;
        let below = |allowed: &String| {
            place(allowed).is_ok_and(|allowed| {
                allowed.origin == wanted.origin && wanted.segments.starts_with(&allowed.segments)
            })
        };
        if self.allowed.iter().any(below) {
            return Ok(());
        }
        let listed = if self.allowed.is_empty() {
            "none is listed".to_string()
        } else {
            format!("listed: {}", self.allowed.join(", "))
        };
        Err(ScannerError::Config(format!(
            "export destination {destination:?} is not allowed ({listed}): start the scanner with --export-destination <destination or prefix> (VYNIL_EXPORT_DESTINATIONS)"
        )))
    }
}

/// A destination as the allow-list compares it: where it is (a directory
/// tree, an HTTP origin, an S3 bucket with its region and endpoint) and
/// the segments of its path, as the writer will use them.
#[derive(Debug, PartialEq, Eq)]
struct Place {
    origin: String,
    segments: Vec<String>,
}

/// `destination` parsed and normalised, or why it is refused: a backslash,
/// an encoded dot, a `..` segment, user information, a query an HTTP
/// destination does not take, a fragment.
fn place(destination: &str) -> Result<Place, String> {
    if destination.contains('\\') {
        return Err("has a backslash".into());
    }
    if destination.to_ascii_lowercase().contains("%2e") {
        return Err("has an encoded dot".into());
    }
    if destination.split(['/', '?', '&', '=']).any(|segment| segment == "..") {
        return Err("has a `..` segment".into());
    }
    let words = |path: &str| -> Vec<String> {
        path.split('/').filter(|s| !s.is_empty() && *s != ".").map(str::to_string).collect()
    };
    match Location::parse(destination).map_err(|e| e.to_string())? {
        Location::Directory(path) => {
            let origin = if path.is_absolute() { "directory:/" } else { "directory:" };
            Ok(Place { origin: origin.into(), segments: words(&path.to_string_lossy()) })
        }
        Location::Http { url, .. } => {
            let url = url::Url::parse(&url).map_err(|e| e.to_string())?;
            if !url.username().is_empty() || url.password().is_some() {
                return Err("holds user information".into());
            }
            if url.query().is_some() || url.fragment().is_some() {
                return Err("holds a query or a fragment".into());
            }
            let host = url.host_str().unwrap_or_default().trim_end_matches('.');
            let port = url.port_or_known_default().unwrap_or_default();
            Ok(Place { origin: format!("{}://{host}:{port}", url.scheme()), segments: words(url.path()) })
        }
        Location::S3 { bucket, region, prefix, endpoint, .. } => {
            let endpoint = match endpoint {
                Some(endpoint) => {
                    url::Url::parse(&endpoint).map_err(|e| e.to_string())?.origin().ascii_serialization()
                }
                None => String::new(),
            };
            let origin = format!("s3://{bucket}?region={region}&endpoint={endpoint}");
            Ok(Place { origin, segments: words(prefix.as_deref().unwrap_or_default()) })
        }
    }
}

/// Exports the index of every repository `source` names to `destination`.
pub async fn export(
    client: &RegistryClient,
    settings: &EngineSettings,
    source: &vynil_registry::sources::Source,
    destination: &Location,
) -> Result<Exported, ScannerError> {
    let repositories = client.enumerate(source).await?;
    if repositories.len() > settings.max_repositories {
        return Err(ScannerError::Config(format!(
            "the source names {} repositories, over the cap of {}: nothing exported (narrow the source, or raise \
             --max-repositories-per-jukebox)",
            repositories.len(),
            settings.max_repositories
        )));
    }
    let count = repositories.len();
    let read: Vec<(RepositoryRef, vynil_rules::index::Exported)> = futures::stream::iter(repositories)
        .map(|repo| async move {
            // The listing itself stops at the cap: nothing unbounded is held.
            let tags = client.snapshot(&repo, READ_CONCURRENCY, settings.max_tags_per_repository).await?;
            let repository = (repo.registry.clone(), repo.repository.clone());
            let found = exported(&repository, &tags)
                .map_err(|e| ScannerError::Config(format!("{repo}: {e}; nothing exported")))?;
            Ok::<_, ScannerError>((repo, found))
        })
        .buffered(settings.repository_concurrency.max(1))
        .try_collect()
        .await?;
    let mut packages = Vec::new();
    let mut unannotated = Vec::new();
    for (repo, found) in read {
        packages.extend(found.packages);
        if !found.unannotated.is_empty() {
            unannotated.push(UnannotatedTags {
                registry: repo.registry,
                image: repo.repository,
                tags: found.unannotated,
            });
        }
    }
    let report = write_index(destination, &packages, &unannotated).await?;
    Ok(Exported { repositories: count, report })
}

/// `vynil-scanner export`: writes the index of a JukeBox file's source.
#[derive(Debug, Clone, clap::Args)]
pub struct ExportArgs {
    /// A JukeBox manifest whose source (`list`, `harbor`, `gitlab`, `script`
    /// or `layout`) is exported; its maturity does not matter.
    #[arg(long, env = "VYNIL_EXPORT_JUKEBOX_FILE")]
    pub jukebox_file: PathBuf,
    /// `s3://<bucket>[/<prefix>][?region=…&endpoint=…]` (credentials from the
    /// AWS environment), `http(s)://…` (PUT and DELETE), or a directory.
    #[arg(long, env = "VYNIL_EXPORT_TO")]
    pub to: String,
    /// Bearer token for an HTTP destination.
    #[arg(long, env = "VYNIL_EXPORT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Basic credentials for an HTTP destination (with `--password`).
    #[arg(long, env = "VYNIL_EXPORT_USERNAME", requires = "password")]
    pub username: Option<String>,
    #[arg(long, env = "VYNIL_EXPORT_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// Registry credentials (a `~/.docker/config.json`).
    #[arg(long, env = "VYNIL_DOCKERCONFIG")]
    pub dockerconfig: Option<PathBuf>,
    /// Registries reached over plain HTTP.
    #[arg(long = "insecure-registry", env = "VYNIL_INSECURE_REGISTRIES", value_delimiter = ',')]
    pub insecure_registries: Vec<String>,
    #[command(flatten)]
    pub limits: crate::ScanLimits,
}

/// Runs `vynil-scanner export` and prints what it did.
pub async fn run_cli(args: ExportArgs) -> Result<(), ScannerError> {
    let text = std::fs::read_to_string(&args.jukebox_file).map_err(|e| {
        ScannerError::Config(format!("cannot read the JukeBox file {}: {e}", args.jukebox_file.display()))
    })?;
    let jukebox: vynil_crds::JukeBox = serde_yaml_ng::from_str::<serde_json::Value>(&text)
        .map_err(|e| e.to_string())
        .and_then(|v| serde_json::from_value(v).map_err(|e| e.to_string()))
        .map_err(|e| {
            ScannerError::Config(format!("{} is not a JukeBox: {e}", args.jukebox_file.display()))
        })?;
    let source = vynil_store::source_of(&jukebox.spec, vynil_script::ScriptLimits::default())
        .map_err(ScannerError::Config)?;
    let mut destination = Location::parse(&args.to)?;
    let mut secret = std::collections::BTreeMap::new();
    if let Some(token) = &args.token {
        secret.insert("token".to_string(), token.clone().into_bytes());
    }
    if let (Some(username), Some(password)) = (&args.username, &args.password) {
        secret.insert("username".to_string(), username.clone().into_bytes());
        secret.insert("password".to_string(), password.clone().into_bytes());
    }
    if !secret.is_empty() {
        destination = destination.with_secret("--token/--username", &secret)?;
    }
    let transport = TransportConfig {
        insecure_registries: args.insecure_registries.clone(),
        ..TransportConfig::default()
    };
    let credentials = CredentialStore::from_file(args.dockerconfig.as_deref())?;
    let client = RegistryClient::new(
        transport,
        credentials,
        std::sync::Arc::new(InMemoryMetadataCache::with_capacity(args.limits.metadata_cache_entries)),
    )?;
    // The export covers every framework version: none is configured.
    let settings = args.limits.settings(semver::Version::new(0, 0, 0), vynil_script::ScriptLimits::default());
    let done = export(&client, &settings, &source, &destination).await?;
    println!(
        "exported {} revisions of {} repositories to {destination}: {} files written{}, {} removed",
        done.report.packages,
        done.repositories,
        done.report.written.len(),
        if done.report.written.is_empty() { " (the index was already this one)" } else { "" },
        done.report.removed.len()
    );
    Ok(())
}

#[cfg(test)]
mod destination_tests {
    use super::Destinations;

    #[test]
    fn a_destination_is_allowed_only_at_or_below_a_listed_one() {
        let allowed = Destinations::new(&["https://charts.example/vynil".into(), "/srv/index/".into()]);
        for ok in ["https://charts.example/vynil", "https://charts.example/vynil/prod", "/srv/index/team"] {
            assert!(allowed.check(ok).is_ok(), "{ok}");
        }
        for refused in [
            "https://charts.example/vynil-evil",
            "https://charts.example.evil/vynil",
            "https://charts.example/vynil/../other",
            "https://attacker.example/collect",
            "/srv/index-other",
            "/srv/index/../../etc",
        ] {
            let error = allowed.check(refused).unwrap_err().to_string();
            assert!(error.contains(refused), "{refused}: {error}");
        }
        let none = Destinations::new(&[]);
        assert!(none.check("/srv/index").unwrap_err().to_string().contains("none is listed"));
    }

    /// Issue #66 item 4: the allow-list was a string prefix checked before
    /// the URL was normalised: encoded dots walked out of the allowed path,
    /// and an S3 destination's `?endpoint=` sent the credentials elsewhere.
    #[test]
    fn a_destination_is_compared_as_parsed_and_normalised() {
        let allowed = Destinations::new(&[
            "https://charts.example/vynil/".into(),
            "s3://catalogs/team/?region=eu-west-3&endpoint=https://minio.example:9000".into(),
            "/srv/index/".into(),
        ]);
        for refused in [
            "https://charts.example/vynil/%2e%2e/escaped",
            "https://charts.example/vynil/%2E%2E/escaped",
            "https://charts.example/vynil/.%2e/escaped",
            "https://charts.example/vynil/x\\..\\..\\escaped",
            "https://charts.example/vynil/x?upload=https://evil.example",
            "https://charts.example:8443/vynil/x",
            "https://user@charts.example/vynil/x",
            "s3://catalogs/team/x?region=eu-west-3&endpoint=https://evil.example",
            "s3://catalogs/team/x?region=eu-west-3&endpoint=https://minio.example:9000&other=1",
            "s3://catalogs/team/x?region=us-east-1&endpoint=https://minio.example:9000",
            "s3://catalogs/team/x",
            "s3://catalogs/team/%2e%2e/x?region=eu-west-3&endpoint=https://minio.example:9000",
            "/srv/index/%2e%2e/escaped",
        ] {
            assert!(allowed.check(refused).is_err(), "{refused} was allowed");
        }
        for ok in [
            "https://charts.example/vynil/prod",
            "https://CHARTS.example:443/vynil/prod/",
            "s3://catalogs/team/prod?region=eu-west-3&endpoint=https://minio.example:9000",
            "s3://catalogs/team/prod?endpoint=https://minio.example:9000&region=eu-west-3",
            "/srv/index/team",
        ] {
            assert!(allowed.check(ok).is_ok(), "{ok} was refused: {:?}", allowed.check(ok));
        }
    }
}
