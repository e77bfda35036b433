//! One mapping of failures to gRPC status codes, used by every service (as
//! linkerd's policy controller maps its domain errors in one place). Each
//! error type says what kind of failure it is, next to itself
//! (`vynil_failure::Classify`: the registry, index, store and rules errors in
//! their own crates); this module alone decides the code, so the same failure
//! answers the same code whichever service meets it:
//!
//! | failure | code |
//! |---|---|
//! | transient | `UNAVAILABLE` |
//! | bad input | `INVALID_ARGUMENT` |
//! | missing | `NOT_FOUND` |
//! | refused | `FAILED_PRECONDITION` |
//! | concurrent change | `ABORTED` |
//! | lost | `DATA_LOSS` |
//! | unauthenticated | `UNAUTHENTICATED` |
//! | internal | `INTERNAL` |

use tonic::{Code, Status};
pub use vynil_failure::{Classify, Failure};

/// The gRPC code of a kind of failure.
pub fn code(failure: Failure) -> Code {
    match failure {
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

/// Every classified error becomes a gRPC status the same way.
pub trait ToStatus {
    /// The gRPC status of this error: its kind's code, its own message.
    fn to_status(&self) -> Status;
}

impl<E: Classify + ?Sized> ToStatus for E {
    fn to_status(&self) -> Status {
        Status::new(code(self.failure()), self.to_string())
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

    /// An error of another crate, classified there, answers its kind's code
    /// with its own message.
    struct Outage;

    impl std::fmt::Display for Outage {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("redis at r:6379 is down")
        }
    }

    impl Classify for Outage {
        fn failure(&self) -> Failure {
            Failure::Transient
        }
    }

    #[test]
    fn each_kind_has_its_code_and_the_message_is_the_errors_own() {
        let status = Outage.to_status();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), "redis at r:6379 is down");
        assert_eq!(code(Failure::BadInput), Code::InvalidArgument);
        assert_eq!(code(Failure::Missing), Code::NotFound);
        assert_eq!(code(Failure::Refused), Code::FailedPrecondition);
        assert_eq!(code(Failure::Concurrent), Code::Aborted);
        assert_eq!(code(Failure::Lost), Code::DataLoss);
        assert_eq!(code(Failure::Unauthenticated), Code::Unauthenticated);
        assert_eq!(code(Failure::Internal), Code::Internal);
    }
}
