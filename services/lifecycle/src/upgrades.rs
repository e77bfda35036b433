//! What lifecycle records of an instance: where it stands (the revision
//! credited as installed, the Job started: `crate::instance::Ledger`), the
//! revisions quarantined for it and the state of each rollback (the rules
//! are `vynil_rules::upgrade`), and operators' approvals of upgrades, each
//! bound to the fingerprint of exactly what was approved.
//!
//! The record is a ConfigMap of the control plane's namespace
//! ([`crate::records`]) keyed by the instance's UID, never the instance
//! itself: a tenant who may edit its instance and status must not be able to
//! clear a quarantine or approve a rollback. A record that cannot be read
//! is an error to retry, never "nothing quarantined" (unknown is not
//! absent): an upgrade into a quarantined revision must not follow from it.

use std::collections::BTreeMap;

use kube::Client;
use vynil_crds::{AgentTarget, InstalledPackage};
use vynil_rules::upgrade::{Quarantined, Rollback};

use crate::{
    LifecycleError,
    instance::{Instance, InstanceKind, Ledger},
    records::{Record, Records},
};

/// The label every upgrade record carries.
pub const LABEL: &str = "vynil.solidite.fr/upgrade-record";

/// The key of the ledger's adoption, which every record this release writes holds.
const ADOPTED: &str = "adopted";

/// The ConfigMap of the instance `uid`'s upgrade record.
pub fn name_of(uid: &str) -> String {
    format!("vynil-upgrade-{uid}")
}

/// The instance a record is of: its kind, namespace and name.
pub fn instance_of(map: &k8s_openapi::api::core::v1::ConfigMap) -> Option<(InstanceKind, String, String)> {
    let reference = map.data.as_ref()?.get("instance")?;
    let mut parts = reference.splitn(3, '/');
    let kind = parts.next()?;
    let kind = InstanceKind::ALL.into_iter().find(|k| k.to_string() == kind)?;
    Some((kind, parts.next()?.to_string(), parts.next()?.to_string()))
}

/// An operator's approval of one upgrade of one instance: it holds only
/// for the fingerprint approved (the revision, options, controller values
/// and recommendations), so any change after it lapses.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    pub fingerprint: String,
    pub from: String,
    pub to: String,
    pub by: String,
    /// RFC 3339.
    pub at: String,
}

/// The revision lifecycle last credited as installed and when: what the
/// later waves of a rollout read (the whole revision is in [`Ledger`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Installed {
    pub tag: String,
    /// RFC 3339.
    pub at: String,
}

/// The phase conditions of the instance as lifecycle saw them when it
/// created the first Job of the upgrade `fingerprint`: what the failed runs
/// of that upgrade wrote is told from them
/// (`vynil_rules::upgrade::phases_written`), never from the agent's clock.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PhasesBefore {
    pub fingerprint: String,
    pub seen: Vec<vynil_rules::upgrade::SeenPhase>,
}

/// An instance's upgrade record, as read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UpgradeRecord {
    /// Where the instance stands: what the planner reads as installed and started.
    pub ledger: Ledger,
    pub quarantined: Vec<Quarantined>,
    pub approvals: Vec<Approval>,
    pub installed: Option<Installed>,
    pub phases_before: Option<PhasesBefore>,
    read: Option<Record>,
}

impl UpgradeRecord {
    pub fn new(quarantined: Vec<Quarantined>) -> Self {
        Self { quarantined, ..Self::default() }
    }

    /// With `ledger` as the instance's ledger.
    pub fn with_ledger(self, ledger: Ledger) -> Self {
        Self { ledger, ..self }
    }

    /// With `approvals` recorded too.
    pub fn approving(self, approvals: Vec<Approval>) -> Self {
        Self { approvals, ..self }
    }

    /// With `before` recorded too.
    pub fn seeing(self, before: PhasesBefore) -> Self {
        Self { phases_before: Some(before), ..self }
    }

    /// Whether the record holds the instance's ledger: written by this
    /// release, which always writes its `adopted` key (a record a previous
    /// release wrote, or rewrote during a rolling update, holds none; an
    /// instance without one is adopted once, `crate::ledger`).
    pub fn holds_ledger(&self) -> bool {
        self.read.as_ref().is_some_and(|read| read.data.contains_key(ADOPTED))
    }

    /// Whether a record exists at all: lifecycle (of some release) met the instance.
    pub fn exists(&self) -> bool {
        self.read.is_some()
    }

    /// The approval of exactly `fingerprint`, if any.
    pub fn approval_of(&self, fingerprint: &str) -> Option<&Approval> {
        self.approvals.iter().find(|a| a.fingerprint == fingerprint)
    }

    /// The tags selection must not offer the instance.
    pub fn quarantined_tags(&self) -> Vec<String> {
        vynil_rules::upgrade::quarantined_tags(&self.quarantined)
    }

    /// The phases seen before the upgrade `fingerprint` began, if recorded.
    pub fn phases_before(&self, fingerprint: &str) -> Option<&[vynil_rules::upgrade::SeenPhase]> {
        self.phases_before.as_ref().filter(|p| p.fingerprint == fingerprint).map(|p| p.seen.as_slice())
    }

    /// The quarantine of the revision the instance's failed Job tried, while
    /// that failure is still the instance's state (its target).
    pub fn of_failed_target(&self, instance: &Instance) -> Option<&Quarantined> {
        let target = instance.status.target.as_ref().filter(|t| t.failures > 0)?;
        self.quarantined.iter().find(|q| q.tag == target.revision.tag && q.rollback != Rollback::Off)
    }

    /// The revision a rollback installs, when one may run now.
    pub fn rolling_back_to(&self, instance: &Instance) -> Option<&str> {
        self.of_failed_target(instance).filter(|q| q.rollback.may_run()).map(|q| q.from.as_str())
    }
}

/// The label of the record of when lifecycle took the cluster over.
pub const TAKEOVER_LABEL: &str = "vynil.solidite.fr/takeover";
/// Its ConfigMap.
pub const TAKEOVER: &str = "vynil-takeover";

/// Where upgrade records live: the control plane's namespace.
#[derive(Clone, Debug)]
pub struct Upgrades {
    records: Records,
    takeover: Records,
    /// When lifecycle first ran here, read (or written) once per process.
    taken_over_at: std::sync::Arc<tokio::sync::OnceCell<jiff::Timestamp>>,
}

impl Upgrades {
    pub fn new(client: &Client, namespace: &str) -> Self {
        Self {
            records: Records::new(client, namespace, LABEL, "the upgrade record"),
            takeover: Records::new(client, namespace, TAKEOVER_LABEL, "the takeover time"),
            taken_over_at: Default::default(),
        }
    }

    /// When lifecycle first ran in this cluster (the takeover): recorded by
    /// the first replica to ask, never changed after. No instance created
    /// later can have been installed by upstream's operator.
    pub async fn taken_over_at(&self) -> Result<jiff::Timestamp, LifecycleError> {
        let read = || async {
            let Some(record) = self.takeover.read(TAKEOVER).await? else { return Ok(None) };
            let at = record.data.get("at").and_then(|at| at.parse::<jiff::Timestamp>().ok());
            at.map(Some).ok_or_else(|| {
                LifecycleError::Invalid(format!(
                    "ConfigMap {TAKEOVER} (namespace {}) has no RFC 3339 `at`: write when lifecycle took over (or the creation time of the oldest instance)",
                    self.takeover.namespace()
                ))
            })
        };
        let at = self
            .taken_over_at
            .get_or_try_init(|| async {
                if let Some(at) = read().await? {
                    return Ok(at);
                }
                let now = jiff::Timestamp::now();
                let data = BTreeMap::from([("at".to_string(), vynil_crds::condition::rfc3339_seconds(now))]);
                match self.takeover.write(TAKEOVER, data, None).await {
                    Ok(()) => read()
                        .await?
                        .ok_or_else(|| LifecycleError::NotDone(format!("{TAKEOVER} cannot be read back"))),
                    // Another replica recorded it first: its time holds.
                    Err(error) => read().await?.ok_or(error),
                }
            })
            .await?;
        Ok(*at)
    }

    /// The record of the instance `uid` (empty when none).
    pub async fn read(&self, uid: &str) -> Result<UpgradeRecord, LifecycleError> {
        let name = name_of(uid);
        match self.records.read(&name).await? {
            Some(read) => self.decode(&name, read),
            None => Ok(UpgradeRecord::default()),
        }
    }

    /// Every instance's record, by the instance's UID.
    pub async fn all(&self) -> Result<std::collections::HashMap<String, UpgradeRecord>, LifecycleError> {
        let mut records = std::collections::HashMap::new();
        for (name, read) in self.records.all().await? {
            let Some(uid) = read.data.get("uid").cloned() else { continue };
            records.insert(uid, self.decode(&name, read)?);
        }
        Ok(records)
    }

    fn decode(&self, name: &str, read: Record) -> Result<UpgradeRecord, LifecycleError> {
        fn field<T: serde::de::DeserializeOwned>(
            read: &Record,
            key: &str,
            name: &str,
            namespace: &str,
        ) -> Result<Vec<T>, LifecycleError> {
            let Some(text) = read.data.get(key) else { return Ok(Vec::new()) };
            serde_json::from_str(text).map_err(|e| {
                LifecycleError::Invalid(format!(
                    "the upgrade record {name} (namespace {namespace}) does not decode: {e}; fix its `{key}` or delete the ConfigMap to forget every quarantine and approval of the instance"
                ))
            })
        }
        let namespace = self.records.namespace();
        let quarantined = field(&read, "quarantine", name, namespace)?;
        let approvals = field(&read, "approvals", name, namespace)?;
        let installed = field(&read, "installed", name, namespace)?.into_iter().next();
        let phases_before = field(&read, "phasesBefore", name, namespace)?.into_iter().next();
        let ledger = Ledger {
            package: field(&read, "package", name, namespace)?.into_iter().next(),
            target: field(&read, "target", name, namespace)?.into_iter().next(),
            adopted: field(&read, ADOPTED, name, namespace)?.into_iter().next(),
            repositories: field(&read, "repositories", name, namespace)?,
        };
        Ok(UpgradeRecord { ledger, quarantined, approvals, installed, phases_before, read: Some(read) })
    }

    /// Writes `record` as the record of the instance `uid` (`instance` names
    /// it for a reader), over the version it was read at (created when it
    /// was read absent). A record is kept while its instance exists, empty
    /// or not: it says lifecycle has met the instance.
    async fn write(
        &self,
        (uid, instance): (&str, &str),
        record: &UpgradeRecord,
    ) -> Result<(), LifecycleError> {
        let name = name_of(uid);
        let encode = |value: serde_json::Result<String>| {
            value.map_err(|e| LifecycleError::Invalid(format!("encoding the upgrade record {name}: {e}")))
        };
        let ledger = &record.ledger;
        let data = BTreeMap::from([
            ("uid".to_string(), uid.to_string()),
            ("instance".to_string(), instance.to_string()),
            ("quarantine".to_string(), encode(serde_json::to_string(&record.quarantined))?),
            ("approvals".to_string(), encode(serde_json::to_string(&record.approvals))?),
            ("installed".to_string(), encode(listed(&record.installed))?),
            ("phasesBefore".to_string(), encode(listed(&record.phases_before))?),
            ("package".to_string(), encode(listed(&ledger.package))?),
            ("target".to_string(), encode(listed(&ledger.target))?),
            (ADOPTED.to_string(), encode(listed(&ledger.adopted))?),
            ("repositories".to_string(), encode(serde_json::to_string(&ledger.repositories))?),
        ]);
        self.records.write(&name, data, record.read.as_ref()).await
    }

    /// Records `approval` (an earlier one of the same fingerprint replaced;
    /// those of other fingerprints lapsed and are dropped).
    pub async fn approve(
        &self,
        uid: &str,
        instance: &str,
        approval: &Approval,
    ) -> Result<(), LifecycleError> {
        self.amend(uid, instance, |record| {
            record.approvals = vec![approval.clone()];
            true
        })
        .await
    }

    /// Records `entry` (replacing an earlier quarantine of the same tag).
    pub async fn quarantine(
        &self,
        uid: &str,
        instance: &str,
        entry: &Quarantined,
    ) -> Result<(), LifecycleError> {
        self.amend(uid, instance, |record| {
            record.quarantined.retain(|q| q.tag != entry.tag);
            record.quarantined.push(entry.clone());
            true
        })
        .await
    }

    /// Applies `change` to the quarantine of `tag` (the only one awaiting an
    /// operator when `tag` is empty) and writes the record; `None` from
    /// `change` removes the entry. Answers the entry as it was.
    pub async fn change(
        &self,
        uid: &str,
        instance: &str,
        tag: &str,
        change: impl Fn(&Quarantined) -> Result<Option<Quarantined>, LifecycleError>,
    ) -> Result<Quarantined, LifecycleError> {
        retrying(|| async {
            let mut record = self.read(uid).await?;
            let found = pick(&record.quarantined, tag, instance)?.clone();
            let replacement = change(&found)?;
            record.quarantined = record
                .quarantined
                .iter()
                .filter_map(|q| if q.tag == found.tag { replacement.clone() } else { Some(q.clone()) })
                .collect();
            self.write((uid, instance), &record).await?;
            Ok(found)
        })
        .await
    }

    /// Records `target`, the agent Job lifecycle started (or its failures since).
    pub async fn started(
        &self,
        uid: &str,
        instance: &str,
        target: &AgentTarget,
    ) -> Result<(), LifecycleError> {
        self.amend(uid, instance, |record| set(&mut record.ledger.target, target)).await
    }

    /// Forgets the target started (an operator cleared its failures).
    pub async fn drop_target(&self, uid: &str, instance: &str) -> Result<(), LifecycleError> {
        self.amend(uid, instance, |record| record.ledger.target.take().is_some()).await
    }

    /// Records `package` as the revision lifecycle credited as installed:
    /// no Job in flight any more; the later waves read when.
    pub async fn credited(
        &self,
        uid: &str,
        instance: &str,
        package: &InstalledPackage,
    ) -> Result<(), LifecycleError> {
        self.amend(uid, instance, |record| {
            let installed = package.installed_at.clone().map(|at| Installed { tag: package.tag.clone(), at });
            let repository = vynil_rules::repository::entry(&package.registry, &package.image);
            let new_repository = !record.ledger.repositories.contains(&repository);
            if new_repository {
                record.ledger.repositories.push(repository);
            }
            let changed = new_repository
                | record.ledger.target.take().is_some()
                | set(&mut record.ledger.package, package);
            let moved = record.installed != installed;
            record.installed = installed;
            changed | moved
        })
        .await
    }

    /// Records `digest` as the digest of the credited revision `tag`, which
    /// was recorded without one (adopted from upstream): resolved once, so
    /// every later Job of it pulls the same bytes.
    pub async fn pinned(
        &self,
        uid: &str,
        instance: &str,
        tag: &str,
        digest: &str,
    ) -> Result<(), LifecycleError> {
        self.amend(uid, instance, |record| match record.ledger.package.as_mut() {
            Some(package) if package.tag == tag && package.digest.is_none() => {
                package.digest = Some(digest.to_string());
                true
            }
            _ => false,
        })
        .await
    }

    /// Records `ledger`, what lifecycle met of an instance whose record
    /// holds none (the rest of a previous release's record is kept; a
    /// concurrent write fails this one, to be read again).
    pub async fn meet(&self, uid: &str, instance: &str, ledger: Ledger) -> Result<(), LifecycleError> {
        self.amend(uid, instance, |record| {
            record.ledger = ledger.clone();
            true
        })
        .await
    }

    /// Records `before`, the phases seen as the first Job of an upgrade is
    /// created (replacing those of an earlier upgrade).
    pub async fn phases_before(
        &self,
        uid: &str,
        instance: &str,
        before: &PhasesBefore,
    ) -> Result<(), LifecycleError> {
        self.amend(uid, instance, |record| set(&mut record.phases_before, before)).await
    }

    /// Reads the record of `uid`, applies `change` to it, and writes it
    /// back unless `change` says nothing changed.
    async fn amend(
        &self,
        uid: &str,
        instance: &str,
        change: impl Fn(&mut UpgradeRecord) -> bool,
    ) -> Result<(), LifecycleError> {
        retrying(|| async {
            let mut record = self.read(uid).await?;
            if !change(&mut record) {
                return Ok(());
            }
            self.write((uid, instance), &record).await
        })
        .await
    }

    /// Removes the record of `uid` once its instance is gone.
    pub async fn forget(&self, uid: &str) -> Result<(), LifecycleError> {
        self.records.forget(&name_of(uid)).await
    }
}

/// Runs `attempt`, a read-modify-write of one record, again while a
/// concurrent write makes it conflict (a few times): the reconciler and an
/// operator's request write the same record, and neither loses the other's.
async fn retrying<T, F, Fut>(attempt: F) -> Result<T, LifecycleError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, LifecycleError>>,
{
    let mut tries = 1;
    loop {
        match attempt().await {
            Err(LifecycleError::Conflict(_)) if tries < CONFLICT_TRIES => tries += 1,
            done => return done,
        }
    }
}

/// How many times a read-modify-write of a record is tried.
const CONFLICT_TRIES: u32 = 5;

/// An optional value as the list of zero or one the record keeps.
fn listed<T: serde::Serialize>(value: &Option<T>) -> serde_json::Result<String> {
    serde_json::to_string(&value.iter().collect::<Vec<_>>())
}

/// Puts `value` in `slot`; whether that changed it.
fn set<T: Clone + PartialEq>(slot: &mut Option<T>, value: &T) -> bool {
    let changed = slot.as_ref() != Some(value);
    *slot = Some(value.clone());
    changed
}

/// The quarantine of `tag`, or the one awaiting an operator when `tag` is empty.
fn pick<'q>(
    quarantined: &'q [Quarantined],
    tag: &str,
    instance: &str,
) -> Result<&'q Quarantined, LifecycleError> {
    let listed = || {
        let tags: Vec<&str> = quarantined.iter().map(|q| q.tag.as_str()).collect();
        if tags.is_empty() { "none".to_string() } else { tags.join(", ") }
    };
    if tag.is_empty() {
        let mut awaiting =
            quarantined.iter().filter(|q| matches!(q.rollback, Rollback::AwaitingOperator { .. }));
        return match (awaiting.next(), awaiting.next()) {
            (Some(one), None) => Ok(one),
            (None, _) => Err(LifecycleError::Refused(format!(
                "{instance} has no failed upgrade awaiting an operator (quarantined: {})",
                listed()
            ))),
            (Some(_), Some(_)) => Err(LifecycleError::Invalid(format!(
                "{instance} has several quarantined revisions ({}): name the tag",
                listed()
            ))),
        };
    }
    quarantined.iter().find(|q| q.tag == tag).ok_or_else(|| {
        LifecycleError::NotFound(format!("{instance} has no quarantine of {tag} (quarantined: {})", listed()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A read-modify-write that a concurrent writer made conflict is read
    /// and tried again (a few times), any other failure is answered at once.
    #[tokio::test]
    async fn a_conflicting_write_of_a_record_is_read_and_tried_again() {
        let conflict = || LifecycleError::Conflict("the object has been modified".into());
        let tries = AtomicU32::new(0);
        let answer = retrying(|| async {
            let n = tries.fetch_add(1, Ordering::SeqCst) + 1;
            if n < 3 { Err(conflict()) } else { Ok(n) }
        })
        .await;
        assert!(matches!(answer, Ok(3)), "{answer:?}");
        tries.store(0, Ordering::SeqCst);
        let answer = retrying(|| async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(conflict())
        })
        .await;
        assert!(matches!(answer, Err(LifecycleError::Conflict(_))), "{answer:?}");
        assert_eq!(tries.load(Ordering::SeqCst), CONFLICT_TRIES);
        tries.store(0, Ordering::SeqCst);
        let answer = retrying(|| async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(LifecycleError::Unavailable("etcd".into()))
        })
        .await;
        assert!(matches!(answer, Err(LifecycleError::Unavailable(_))), "{answer:?}");
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }
}
