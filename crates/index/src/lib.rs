//! Pre-computed catalogs: an `index.yaml` listing package files, each a YAML
//! list of `status.packages[]` records (`docs/upstream-vynil.md` §3.8), read
//! from an HTTP server, an S3 bucket or a directory, and written by the
//! exporter.
//!
//! Why an index: one scan off-cluster (in CI, say) serves every cluster, so
//! registries are read once instead of once per cluster and schedule. What an
//! index holds and what a consumer sees of it are the rules crate's
//! (`vynil_rules::index`); this crate only moves bytes, in three ways that
//! share one interface (`object_store`: S3 signing, the ambient AWS
//! credential chain, conditional GETs and atomic local writes are its, not
//! hand-written):
//!
//! - **Reading is conditional** ([`IndexReader`]): each file's `ETag` is kept
//!   with its bytes, so an unchanged index costs one `304` per file.
//! - **Writing commits at one point** ([`write_index`]): package files are
//!   named by their content (`<category>_<name>-<hash>.yaml`), written first,
//!   and the new `index.yaml` replaces the old one last; only then are the
//!   files the previous index listed and the new one does not removed. A
//!   consumer reads either the old index and its files or the new one and
//!   its files, never half of each; one that read the old index just before
//!   its files went gets "not found", keeps what it knew and reads again.
//!   Upstream rewrote files in place and never removed stale ones.
//! - **Unknown is not absent**: an unreachable store or a malformed file is an
//!   error naming the file; the consumer keeps what that file's package had.

mod format;
mod location;
mod reader;
mod writer;

pub use format::{INDEX_FILE, IndexDocument, IndexEntry, UnannotatedTags};
pub use location::{Authorization, Location, S3Credentials};
pub use reader::{ConditionalCache, ConditionalStore, IndexReader};
pub use writer::{ExportReport, write_index};

/// Largest index or package file read (a limit: a runaway exporter or a
/// wrong URL must not fill the scanner's memory).
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// What went wrong with an index, naming the file and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("index location {location:?} is invalid: {problem}")]
    InvalidLocation { location: String, problem: String },
    #[error("index secret {secret:?} {problem}")]
    Secret { secret: String, problem: String },
    #[error(
        "{file} is malformed: {problem}; fix it where the index is produced (what its entries gave is kept)"
    )]
    Malformed { file: String, problem: String },
    #[error(
        "{file} does not exist (an index being replaced, or a wrong URL, bucket or prefix); retried at the next scan"
    )]
    Missing { file: String },
    #[error("{file} is {size} bytes, over the limit of {limit}: not read")]
    TooLarge { file: String, size: u64, limit: u64 },
    #[error("{file} was refused ({problem}): check the credentials of the source's secret")]
    Unauthorized { file: String, problem: String },
    #[error("cannot reach {file}: {problem}; retried at the next scan, nothing known is dropped")]
    Unreachable { file: String, problem: String },
    #[error("cannot write {file}: {problem}")]
    Write { file: String, problem: String },
}

impl vynil_failure::Classify for IndexError {
    fn failure(&self) -> vynil_failure::Failure {
        use vynil_failure::Failure;
        match self {
            IndexError::InvalidLocation { .. } => Failure::BadInput,
            IndexError::Missing { .. } => Failure::Missing,
            IndexError::Unreachable { .. } | IndexError::Write { .. } => Failure::Transient,
            IndexError::Secret { .. }
            | IndexError::Malformed { .. }
            | IndexError::TooLarge { .. }
            | IndexError::Unauthorized { .. } => Failure::Refused,
        }
    }
}

pub type Result<T> = std::result::Result<T, IndexError>;
