//! The fuzz targets' bodies, one module each: a decoder fed bytes, or a
//! structure-aware input built from them with `arbitrary` (annotations that
//! are nearly valid JSON documents, repositories whose tags share digests,
//! instance objects that nearly match their CRD), and the properties the
//! decoder must keep on any input — round trips, what an error names, what a
//! plan may never do — besides never panicking.
//!
//! Two runners call [`TARGETS`]: cargo-fuzz (`fuzz/`, coverage-guided, its
//! own workspace so the main build does not build libFuzzer; its entry
//! points are still compiled and run here by `tests/entry_points.rs`, see
//! `build.rs`) and the replay
//! test (`tests/corpus.rs`), which runs every committed input of
//! `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/` as an ordinary
//! test. A broken property panics: that is how both runners see it, so
//! `clippy::panic` is allowed here and nowhere on product paths.

#![allow(clippy::panic)]

pub mod annotations;
pub mod gateway;
pub mod input;
pub mod names;
pub mod objects;
pub mod registry;
pub mod retention;

/// A target: its name (the cargo-fuzz target and the corpus folder) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target.
pub const TARGETS: &[Target] = &[
    ("annotations", annotations::run),
    ("names", names::run),
    ("retention", retention::run),
    ("registry", registry::run),
    ("objects", objects::run),
    ("gateway", gateway::run),
];
