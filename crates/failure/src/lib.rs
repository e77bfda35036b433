//! What kind of failure an error is, with no dependency at all: the rules,
//! the registry client, the index and the store each say what their errors
//! are next to the errors themselves ([`Classify`]), and the runtime alone
//! turns a kind into a gRPC code (`vynil_runtime::ToStatus`), so the same
//! failure answers the same code whichever service meets it.
//!
//! | kind | what the caller does |
//! |---|---|
//! | [`Failure::Transient`] (outage, timeout, rate limit, 5xx) | retry later |
//! | [`Failure::BadInput`] | fix the request |
//! | [`Failure::Missing`] | name something that exists |
//! | [`Failure::Refused`] (a precondition or a setting) | fix the state the message names |
//! | [`Failure::Concurrent`] (compare-and-set lost, busy) | re-read and retry |
//! | [`Failure::Lost`] (the state keeping it restarted without it) | make it again |
//! | [`Failure::Unauthenticated`] (a privileged call from an unknown caller) | go through the gateway |
//! | [`Failure::Internal`] (a bug or a serving failure) | report it |

/// What kind of failure an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Transient,
    BadInput,
    Missing,
    Refused,
    Concurrent,
    /// A record the shared state lost (`vynil_store::epoch`).
    Lost,
    /// The caller is not who it must be to do this.
    Unauthenticated,
    Internal,
}

/// An error that knows what kind of failure it is.
pub trait Classify: std::fmt::Display {
    fn failure(&self) -> Failure;
}
