//! JukeBoxes as the services see them outside a cluster, in one place so the
//! scanner (which writes their status), the purger (which purges their
//! repositories) and the catalog (which follows their status) agree.
//!
//! - [`JukeboxStore`] and the local [`LocalStore`]: specs from a directory of
//!   JukeBox YAML files, status with compare-and-set in memory or Redis,
//!   change notifications (Redis pub/sub across processes).
//! - [`source_of`]: the repositories a JukeBox's source names, `source.script`
//!   included (a bounded Rhai engine).

mod jukeboxes;
mod script;

pub use jukeboxes::{CHANGES_CHANNEL, JukeboxRecord, JukeboxStore, LocalStore};
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
}

pub(crate) fn redis_error(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(format!("Redis: {e}"))
}

/// What a JukeBox's source names, for the registry client to enumerate.
pub fn source_of(spec: &JukeBoxSpec) -> Result<Source, String> {
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
        Some(JukeBoxSource::Script(source)) => script::repositories(source).map(Source::List),
        Some(JukeBoxSource::Http(_)) | Some(JukeBoxSource::S3(_)) => {
            Err("http and s3 index sources are not supported yet".into())
        }
        None => Err("the JukeBox has no source".into()),
    }
}
