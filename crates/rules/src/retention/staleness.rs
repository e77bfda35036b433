//! What changed in a repository since its plan was made: a plan executed
//! against another repository than the one it read is refused as stale.

use std::collections::HashMap;

use super::*;

/// A tag as a stored plan recorded it.
#[derive(Debug, Clone, Copy)]
pub struct PlannedTag<'a> {
    pub tag: &'a str,
    pub digest: &'a str,
    pub keep: bool,
}

/// A deletion as a stored plan recorded it.
#[derive(Debug, Clone, Copy)]
pub struct PlannedDeletion<'a> {
    pub digest: &'a str,
    pub tags: &'a [String],
}

/// What changed in repository `name` since its plan was made, from a fresh
/// read of its tags and of usage: a tag re-pointed, a kept tag gone, a tag
/// pushed, a revision to delete now used. A tag the plan deletes may be gone
/// (deleted by an earlier run of the same plan). Empty: the plan still holds
/// as far as the repository and usage go (its retention inputs are compared
/// by [`RetentionConfig::fingerprint`]).
pub fn changes_since_planning(
    name: &str,
    planned: &[PlannedTag<'_>],
    deletions: &[PlannedDeletion<'_>],
    fresh: &[RepositoryTag],
    usage: &Usage,
) -> Vec<String> {
    let now: HashMap<&str, &str> = fresh.iter().map(|t| (t.name.as_str(), t.digest.as_str())).collect();
    let mut changes = Vec::new();
    for entry in planned {
        match now.get(entry.tag) {
            Some(digest) if *digest != entry.digest => {
                changes.push(format!("{} now points to {digest} (planned {})", entry.tag, entry.digest))
            }
            None if entry.keep => changes.push(format!("{name}: kept tag {} disappeared", entry.tag)),
            _ => {}
        }
    }
    for tag in fresh {
        if !planned.iter().any(|p| p.tag == tag.name) {
            changes.push(format!("{name}: {} was pushed since planning", tag.name));
        }
    }
    if let Usage::Known(used) = usage {
        for deletion in deletions {
            for revision in used.iter().filter(|r| r.uses(deletion.digest, deletion.tags)) {
                changes.push(format!("{} is now used by {}", revision.tag, revision.instance));
            }
        }
    }
    changes
}
