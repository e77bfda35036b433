//! Operators' recalls of a JukeBox's revisions (`spec.recalls`,
//! `docs/lifecycle.md` "Recalled revisions"). The scanner is the service
//! that writes JukeBoxes, so it records them: each change is written with
//! the version it was computed from (a concurrent change is read again,
//! never overwritten) and is done once read back. They live in the JukeBox,
//! never only in Redis: losing Redis cannot make a recalled revision
//! installable again, and an admin may write them with kubectl or GitOps.

use vynil_crds::RecalledRevision;

use crate::{ScannerError, worker::Scanner};

/// Tries before a JukeBox that keeps changing is reported as a conflict.
const TRIES: usize = 5;

/// What an operator does to a JukeBox's recalls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecallChange {
    /// Recall a tag (replacing its recall when it has one).
    Recall(RecalledRevision),
    /// Lift the recall of a tag.
    Lift(String),
}

impl RecallChange {
    /// The recalls after this change, or why it cannot be made.
    fn apply(
        &self,
        jukebox: &str,
        mut recalls: Vec<RecalledRevision>,
    ) -> Result<Vec<RecalledRevision>, ScannerError> {
        match self {
            RecallChange::Recall(recall) => {
                if recall.tag.trim().is_empty() || recall.reason.trim().is_empty() {
                    return Err(ScannerError::Config(
                        "a recall names the tag and why (the reason is shown with the revision): nothing was changed"
                            .into(),
                    ));
                }
                recalls.retain(|r| r.tag != recall.tag);
                recalls.push(recall.clone());
            }
            RecallChange::Lift(tag) => {
                if !recalls.iter().any(|r| r.tag == *tag) {
                    let recalled: Vec<&str> = recalls.iter().map(|r| r.tag.as_str()).collect();
                    return Err(ScannerError::NotFound(format!(
                        "JukeBox {jukebox} has no recall of {tag:?} (recalled: {}): nothing was changed",
                        if recalled.is_empty() { "none".into() } else { recalled.join(", ") }
                    )));
                }
                recalls.retain(|r| r.tag != *tag);
            }
        }
        Ok(recalls)
    }
}

impl Scanner {
    /// Makes `change` to JukeBox `jukebox`'s recalls; answers them as read back.
    /// Makes `change`, asked by `actor`, read back, and says so in the audit
    /// trail: an Event on the JukeBox and a `vynil::audit` log line.
    pub async fn change_recalls(
        &self,
        jukebox: &str,
        change: &RecallChange,
        actor: &str,
    ) -> Result<Vec<RecalledRevision>, ScannerError> {
        for _ in 0..TRIES {
            let record = self.store.get(jukebox).await?.ok_or_else(|| {
                ScannerError::NotFound(format!("no JukeBox {jukebox:?}: nothing was changed"))
            })?;
            let wanted = change.apply(jukebox, record.spec.recalls.clone())?;
            if wanted == record.spec.recalls {
                return Ok(wanted);
            }
            if !self.store.set_recalls(jukebox, &record.status_version, &wanted).await? {
                continue;
            }
            let read = self.store.get(jukebox).await?.map(|r| r.spec.recalls);
            return match read {
                Some(read) if read == wanted => {
                    self.audit(jukebox, change, actor).await;
                    Ok(read)
                }
                _ => Err(ScannerError::Store(format!(
                    "the recalls of JukeBox {jukebox} did not read back as written; read them again before retrying"
                ))),
            };
        }
        Err(ScannerError::Conflict(format!("JukeBox {jukebox}")))
    }

    async fn audit(&self, jukebox: &str, change: &RecallChange, actor: &str) {
        let (reason, warning, note) = match change {
            RecallChange::Recall(recall) => {
                let moving = if recall.move_away { ", moving its instances away" } else { "" };
                let note = format!("{actor} recalled {}{moving}: {}", recall.tag, recall.reason);
                ("RevisionRecalled", true, note)
            }
            RecallChange::Lift(tag) => ("RecallLifted", false, format!("{actor} lifted the recall of {tag}")),
        };
        tracing::info!(target: "vynil::audit", reason, actor, kind = "JukeBox", name = %jukebox, %note, "recalls changed");
        let event = vynil_store::JukeboxEvent { warning, reason, action: "Recall", note };
        self.store.record_event(jukebox, &event).await;
    }
}
