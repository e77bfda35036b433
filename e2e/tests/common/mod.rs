//! The shared harness lives in the `vynil-e2e` library (also used by the CLI's tests).

#![allow(unused_imports)]

pub use vynil_e2e::*;
