//! One mapping of failures to gRPC status codes, used by every service (as
//! linkerd's policy controller maps its domain errors in one place). Each
//! error type says what kind of failure it is ([`Classify`]); this module
//! alone decides the code, and the shared errors (registry, store, rules) are
//! classified here once, so the same failure answers the same code whichever
//! service meets it:
//!
//! | failure | code | what the caller does |
//! |---|---|---|
//! | transient (outage, timeout, rate limit, 5xx) | `UNAVAILABLE` | retry later |
//! | bad input | `INVALID_ARGUMENT` | fix the request |
//! | missing | `NOT_FOUND` | name something that exists |
//! | refused (a precondition or a setting) | `FAILED_PRECONDITION` | fix the state the message names |
//! | concurrent change (compare-and-set lost, busy) | `ABORTED` | re-read and retry |
//! | lost (the state keeping it restarted without it) | `DATA_LOSS` | make it again |
//! | unauthenticated caller of a privileged call | `UNAUTHENTICATED` | go through the gateway |
//! | a bug or a serving failure | `INTERNAL` | report it |

use tonic::{Code, Status};
use vynil_registry::RegistryError;
use vynil_rules::RulesError;
use vynil_store::StoreError;

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

impl Failure {
    pub fn code(self) -> Code {
        match self {
            Failure::Transient => Code::Unavailable,
            Failure::BadInput => Code::InvalidArgument,
            Failure::Missing => Code::NotFound,
            Failure::Refused => Code::FailedPrecondition,
            Failure::Concurrent => Code::Aborted,
            Failure::Lost => Code::DataLoss,
            Failure::Unauthenticated => Code::Unauthenticated,
            Failure::Internal => Code::Internal,
        }
    }
}

/// An error that knows what kind of failure it is.
pub trait Classify: std::fmt::Display {
    fn failure(&self) -> Failure;

    /// The gRPC status of this error: its kind's code, its own message.
    fn to_status(&self) -> Status {
        Status::new(self.failure().code(), self.to_string())
    }
}

impl Classify for RegistryError {
    fn failure(&self) -> Failure {
        match self {
            RegistryError::NotFound { .. } => Failure::Missing,
            RegistryError::InvalidReference { .. } => Failure::BadInput,
            // The registry's own test: outages, timeouts, 429s and 5xx.
            e if e.is_transient() => Failure::Transient,
            // Credentials, a refusal, a body that is not what was asked.
            _ => Failure::Refused,
        }
    }
}

impl Classify for vynil_index::IndexError {
    fn failure(&self) -> Failure {
        use vynil_index::IndexError;
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

impl Classify for StoreError {
    fn failure(&self) -> Failure {
        match self {
            StoreError::Config(_) => Failure::Refused,
            StoreError::Unavailable(_) => Failure::Transient,
            StoreError::Conflict(_) => Failure::Concurrent,
            StoreError::Lost(_) => Failure::Lost,
        }
    }
}

impl Classify for RulesError {
    fn failure(&self) -> Failure {
        match self {
            RulesError::ScanFilter { .. }
            | RulesError::Pattern { .. }
            | RulesError::ChannelNotScanned { .. } => Failure::BadInput,
            // A package's published annotations, or metadata the registry did not give.
            RulesError::Annotation { .. } => Failure::Refused,
            RulesError::UnreadableMetadata(_) => Failure::Transient,
        }
    }
}

impl Classify for crate::RuntimeError {
    fn failure(&self) -> Failure {
        Failure::Internal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_errors_have_one_code_each() {
        let timeout = RegistryError::Timeout { what: "tags of r/x".into(), seconds: 30, attempts: 4 };
        assert_eq!(timeout.to_status().code(), Code::Unavailable);
        let server = RegistryError::Registry {
            what: "w".into(),
            status: 503,
            code: String::new(),
            message: String::new(),
        };
        assert_eq!(server.to_status().code(), Code::Unavailable, "a 5xx is transient");
        let denied = RegistryError::Registry {
            what: "w".into(),
            status: 405,
            code: String::new(),
            message: String::new(),
        };
        assert_eq!(denied.to_status().code(), Code::FailedPrecondition);
        let missing = RegistryError::NotFound { what: "w".into(), code: "404".into() };
        assert_eq!(missing.to_status().code(), Code::NotFound);
        assert_eq!(StoreError::Conflict("box".into()).to_status().code(), Code::Aborted);
        assert_eq!(StoreError::Unavailable("redis".into()).to_status().code(), Code::Unavailable);
        let filter = RulesError::ScanFilter { filter: "a/b/c".into(), problem: "has 3 segments".into() };
        let status = filter.to_status();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("a/b/c"), "the message is the error's own");
    }
}
