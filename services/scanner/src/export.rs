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

    /// Accepts `destination` when it is a listed one, or lies below one at a
    /// `/` (so `https://charts.example/vynil` admits
    /// `https://charts.example/vynil/prod` but neither
    /// `https://charts.example/vynil-evil` nor `https://charts.example.evil`),
    /// and has no `..` segment.
    pub fn check(&self, destination: &str) -> Result<(), ScannerError> {
        if destination.split(['/', '?']).any(|segment| segment == "..") {
            return Err(ScannerError::Config(format!(
                "export destination {destination:?} has a `..` segment: name the destination itself"
            )));
        }
        let below = |allowed: &String| {
            destination == allowed
                || destination
                    .strip_prefix(allowed.as_str())
                    .is_some_and(|rest| allowed.ends_with('/') || rest.starts_with('/'))
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
}
