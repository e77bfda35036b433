//! Which tags of one repository a purge keeps, each with every reason, and
//! which it deletes (upstream #12 A; `docs/purger.md`).
//!
//! The contract is "delete the complement of what any consumer could be
//! shown": keep the union of the type-aware views for every channel and every
//! framework breakpoint (the configured version and each distinct
//! `vynil_version` requirement value of the repository), the newest revision of
//! each type, every revision an instance installed, is installing or pins, the
//! configured pins, the artifacts of every kept digest, and every tag sharing a
//! kept digest (deletion is by digest). When in doubt, keep: a tag that is
//! neither a version with Vynil metadata nor a recognised artifact is
//! "unmanaged" and never deleted. A version whose metadata could not be read
//! makes the plan fail rather than guess.

mod fingerprint;
mod model;
mod plan;
mod staleness;

pub use fingerprint::*;
pub use model::*;
pub use plan::*;
pub use staleness::*;
