//! Conditions as upstream writes them, and the helpers every writer shares.
//!
//! Upstream's loop guard is kept: a condition identical in type, generation,
//! status and message is never rewritten, so a status write cannot trigger a
//! reconcile that writes the same status again. A changed condition moves to
//! the end of the list, since the `stage` printer column shows the last one.
//! New error codes go in square brackets at the start of the message, in
//! upstream's own style (`[E_INIT_VERSION_NOT_FOUND] …`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `status` of a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
}

impl ConditionStatus {
    /// As Kubernetes writes it: `True`, `False`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(ok: bool) -> Self {
        if ok { ConditionStatus::True } else { ConditionStatus::False }
    }
}

/// One condition; `T` is the kind's enum of condition types.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition<T> {
    /// RFC 3339, seconds precision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    pub message: String,
    #[serde(rename = "type")]
    pub condition_type: T,
    pub status: ConditionStatus,
    /// The object's `metadata.generation` the condition was computed for.
    pub generation: i64,
}

impl<T: PartialEq + Clone> Condition<T> {
    pub fn new(
        condition_type: T,
        status: impl Into<ConditionStatus>,
        message: impl Into<String>,
        generation: i64,
        now: jiff::Timestamp,
    ) -> Self {
        Self {
            last_transition_time: Some(rfc3339_seconds(now)),
            message: message.into(),
            condition_type,
            status: status.into(),
            generation,
        }
    }

    /// Same type, generation, status and message (the time is ignored).
    pub fn same_as(&self, other: &Self) -> bool {
        self.condition_type == other.condition_type
            && self.generation == other.generation
            && self.status == other.status
            && self.message == other.message
    }

    /// The error code at the start of the message, e.g. `E_PACKAGE_GONE`.
    pub fn code(&self) -> Option<&str> {
        message_code(&self.message)
    }
}

/// Sets `condition`, replacing one of the same type. Returns `false`, leaving
/// the list untouched, when an identical condition is already there. As
/// Kubernetes conventions say, `lastTransitionTime` moves only when `status`
/// does: a new message or generation under the same status keeps the time of
/// the last transition.
pub fn set_condition<T: PartialEq + Clone>(
    conditions: &mut Vec<Condition<T>>,
    mut condition: Condition<T>,
) -> bool {
    if let Some(existing) = conditions.iter().find(|c| c.condition_type == condition.condition_type) {
        if existing.same_as(&condition) {
            return false;
        }
        if existing.status == condition.status {
            condition.last_transition_time = existing.last_transition_time.clone();
        }
    }
    conditions.retain(|c| c.condition_type != condition.condition_type);
    conditions.push(condition);
    true
}

/// `"[CODE] text"`.
pub fn coded_message(code: &str, text: &str) -> String {
    format!("[{code}] {text}")
}

/// The `CODE` of a message starting with `[CODE]`.
pub fn message_code(message: &str) -> Option<&str> {
    let rest = message.strip_prefix('[')?;
    let (code, _) = rest.split_once(']')?;
    let valid =
        !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    valid.then_some(code)
}

/// `2026-11-29T23:08:55Z`, as Kubernetes writes times.
pub fn rfc3339_seconds(time: jiff::Timestamp) -> String {
    jiff::Timestamp::from_second(time.as_second()).map(|t| t.to_string()).unwrap_or_else(|_| time.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JukeBoxConditionType;

    fn at(second: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(second).unwrap()
    }

    #[test]
    fn an_identical_condition_is_not_rewritten() {
        let mut list = vec![Condition::new(JukeBoxConditionType::Ready, true, "ok", 1, at(0))];
        assert!(!set_condition(
            &mut list,
            Condition::new(JukeBoxConditionType::Ready, true, "ok", 1, at(60))
        ));
        assert_eq!(list[0].last_transition_time.as_deref(), Some("1970-01-01T00:00:00Z"));
    }

    #[test]
    fn a_changed_condition_replaces_its_type_and_moves_last() {
        let mut list = vec![
            Condition::new(JukeBoxConditionType::Ready, true, "ok", 1, at(0)),
            Condition::new(JukeBoxConditionType::Updated, true, "ok", 1, at(0)),
        ];
        assert!(set_condition(
            &mut list,
            Condition::new(JukeBoxConditionType::Ready, false, "down", 2, at(5))
        ));
        let types: Vec<_> = list.iter().map(|c| c.condition_type).collect();
        assert_eq!(types, [JukeBoxConditionType::Updated, JukeBoxConditionType::Ready]);
        assert_eq!(list[1].status, ConditionStatus::False);
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_does() {
        let mut list = vec![Condition::new(JukeBoxConditionType::Ready, true, "ok", 1, at(0))];
        assert!(set_condition(
            &mut list,
            Condition::new(JukeBoxConditionType::Ready, true, "fine", 2, at(60))
        ));
        assert_eq!((list[0].message.as_str(), list[0].generation), ("fine", 2));
        assert_eq!(list[0].last_transition_time.as_deref(), Some("1970-01-01T00:00:00Z"));
        assert!(set_condition(
            &mut list,
            Condition::new(JukeBoxConditionType::Ready, false, "down", 2, at(90))
        ));
        assert_eq!(list[0].last_transition_time.as_deref(), Some("1970-01-01T00:01:30Z"));
    }

    #[test]
    fn error_codes_lead_the_message_in_brackets() {
        let message = coded_message("E_PACKAGE_GONE", "no tenant revision");
        assert_eq!(message, "[E_PACKAGE_GONE] no tenant revision");
        assert_eq!(message_code(&message), Some("E_PACKAGE_GONE"));
        assert_eq!(
            message_code("[E_INIT_VERSION_NOT_FOUND] Version 1 introuvable"),
            Some("E_INIT_VERSION_NOT_FOUND")
        );
        assert_eq!(message_code("Package a/b is missing"), None);
        assert_eq!(message_code("[not a code] x"), None);
    }
}
