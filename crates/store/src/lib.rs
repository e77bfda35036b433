//! The services' shared state, in one crate: where JukeBoxes live (in a
//! cluster or not), the caches, and the leases — so the scanner (which
//! writes JukeBox status), the purger (which purges their repositories) and
//! the catalog (which follows their status) agree.
//!
//! - [`JukeboxStore`] and the local [`LocalStore`]: specs from a directory of
//!   JukeBox YAML files, status with compare-and-set in memory or Redis,
//!   change notifications (Redis pub/sub across processes).
//! - [`KubeStore`]: JukeBoxes from the Kubernetes API, status through the
//!   `status` subresource with `resourceVersion` preconditions, changes from a
//!   watcher.
//! - [`package_cache`]: the catalog's package cache, one trait with a Redis and an
//!   in-memory implementation.
//! - [`metadata_cache`]: manifest metadata by digest in Redis, shared by
//!   scanner replicas (the registry client's `MetadataCache`).
//! - [`lease`]: fenced leases (one worker per JukeBox or repository across
//!   replicas), shared by the scanner and the purger.
//! - [`primary`]: the Redis primary, one URL or named by Sentinel, followed
//!   across failovers, with the replication wait fenced writes need.
//! - [`pubsub`]: following a Redis channel across outages (and failovers).
//! - [`epoch`]: which life of the shared state an id was made in, so a record
//!   lost with a Redis restarted without persistence is reported lost.
//! - [`StoreConfig`] and [`open`]: the flags, and the store they ask for, so
//!   every service opens it alike.
//! - [`source_of`]: the repositories a JukeBox's source names, `source.script`
//!   included (`vynil_script`'s sealed engine).

mod config;
pub mod epoch;
mod jukeboxes;
mod kube;
pub mod lease;
pub mod metadata_cache;
pub mod package_cache;
pub mod primary;
pub mod pubsub;
pub mod takeover;

pub use config::{DEFAULT_VYNIL_VERSION, StoreConfig};
pub use jukeboxes::{
    CHANGES_CHANNEL, JukeboxEvent, JukeboxRecord, JukeboxStore, LocalStore, RPC_CREDENTIALS_LABEL,
    ScannerStore, SecretData, SkippedSource, StatusVersion, StoreChange,
};
pub use kube::KubeStore;
pub use primary::{RedisConnection, RedisTarget};
use vynil_crds::{JukeBoxSource, JukeBoxSpec};
use vynil_registry::sources::Source;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Config(String),
    #[error("store unavailable: {0}; retry when it is back")]
    Unavailable(String),
    #[error("the status of {0} changed concurrently; re-read and merge again")]
    Conflict(String),
    /// A record the shared state lost (see [`epoch`]).
    #[error("{0}")]
    Lost(String),
    /// A Secret a JukeBox may not name (`vynil_crds::secrets`).
    #[error("{0}")]
    SecretRefused(#[from] vynil_crds::secrets::SecretRefused),
}

impl vynil_failure::Classify for StoreError {
    fn failure(&self) -> vynil_failure::Failure {
        use vynil_failure::Failure;
        match self {
            StoreError::Config(_) | StoreError::SecretRefused(_) => Failure::Refused,
            StoreError::Unavailable(_) => Failure::Transient,
            StoreError::Conflict(_) => Failure::Concurrent,
            StoreError::Lost(_) => Failure::Lost,
        }
    }
}

/// Where JukeBoxes come from.
#[derive(Debug, Clone)]
pub enum StoreSettings {
    /// The Kubernetes API (kubeconfig or in-cluster); requests carry
    /// `user_agent`, so the API server's audit log names the service.
    Kubernetes { user_agent: String, pod_name: Option<String> },
    /// YAML files in a directory; status in Redis when a URL is given, else in memory.
    Local { directory: std::path::PathBuf, redis: Option<RedisTarget> },
}

impl StoreSettings {
    /// From the shared flags `--kubernetes`, `--jukebox-dir`, the Redis ones
    /// and `--pod-name`, for the service `user_agent` (`vynil-scanner/0.1.0`).
    pub fn from_flags(
        kubernetes: bool,
        directory: &std::path::Path,
        redis: Option<RedisTarget>,
        user_agent: &str,
        pod_name: Option<&str>,
    ) -> Self {
        if kubernetes {
            Self::Kubernetes { user_agent: user_agent.to_string(), pod_name: pod_name.map(str::to_string) }
        } else {
            Self::Local { directory: directory.to_path_buf(), redis }
        }
    }
}

/// Opens the store `settings` name.
pub async fn open(settings: &StoreSettings) -> Result<std::sync::Arc<dyn ScannerStore>, StoreError> {
    Ok(match settings {
        StoreSettings::Kubernetes { user_agent, pod_name } => {
            let client = vynil_kube::client(user_agent).await?;
            let service = user_agent.split('/').next().unwrap_or("vynil");
            std::sync::Arc::new(KubeStore::reporting_as(client, service, pod_name.clone()))
        }
        StoreSettings::Local { directory, redis: Some(target) } => {
            std::sync::Arc::new(LocalStore::with_redis(directory.clone(), target).await?)
        }
        StoreSettings::Local { directory, redis: None } => {
            std::sync::Arc::new(LocalStore::in_memory(directory.clone()))
        }
    })
}

/// A failed call to the API server: retried (it may be back, or granted,
/// later), with what an operator must fix when the server refused the
/// service itself.
pub(crate) fn kube_error(doing: &str, e: ::kube::Error) -> StoreError {
    let fix = match &e {
        ::kube::Error::Api(status) if status.code == 403 => {
            "; this service's ServiceAccount lacks the grant: see its Role in deploy/base/rbac.yaml"
        }
        ::kube::Error::Api(status) if status.code == 401 => {
            "; the API server refused this service's credentials"
        }
        _ => "",
    };
    StoreError::Unavailable(format!("Kubernetes API, {doing}: {e}{fix}"))
}

impl From<vynil_kube::ClientError> for StoreError {
    fn from(e: vynil_kube::ClientError) -> Self {
        match e {
            vynil_kube::ClientError::Connect(_) => StoreError::Unavailable(e.to_string()),
            vynil_kube::ClientError::UserAgent { .. } => StoreError::Config(e.to_string()),
        }
    }
}

/// The one mapping of a Redis error: the store is unavailable (retry), never
/// "absent". Services convert it into their own errors with `?`.
pub fn redis_error(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(format!("Redis: {e}"))
}

/// What a JukeBox's source names, for the registry client to enumerate (a
/// `source.script` runs within `scripts`).
pub fn source_of(spec: &JukeBoxSpec, scripts: vynil_script::ScriptLimits) -> Result<Source, String> {
    match &spec.source {
        Some(JukeBoxSource::List(images)) => Ok(Source::List(images.clone())),
        Some(JukeBoxSource::Harbor(h)) => {
            Ok(Source::Harbor { registry: h.registry.clone(), project: h.project.clone() })
        }
        Some(JukeBoxSource::Gitlab(g)) => Ok(Source::Gitlab {
            url: g.url.clone(),
            registry: g.registry.clone(),
            project: g.project.clone(),
        }),
        Some(JukeBoxSource::Script(source)) => scripts.repositories(source).map(Source::List),
        Some(JukeBoxSource::Layout(layout)) => Ok(Source::Layout { path: layout.path.clone() }),
        Some(JukeBoxSource::Http(_)) | Some(JukeBoxSource::S3(_)) => {
            Err("an http or s3 source is an index of packages, not a list of repositories".into())
        }
        None => Err("the JukeBox has no source".into()),
    }
}

#[cfg(test)]
mod failure_tests {
    use vynil_failure::{Classify, Failure};

    use super::StoreError;

    #[test]
    fn a_lost_compare_and_set_is_concurrent_an_outage_transient() {
        assert_eq!(StoreError::Conflict("box".into()).failure(), Failure::Concurrent);
        assert_eq!(StoreError::Unavailable("redis".into()).failure(), Failure::Transient);
        assert_eq!(StoreError::Lost("scan 7".into()).failure(), Failure::Lost);
    }
}
