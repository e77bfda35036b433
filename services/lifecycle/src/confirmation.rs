//! An admin's confirmation of a delete without package hooks, kept where
//! tenants cannot write it.
//!
//! The escape hatch (the reaper deleting an instance's recorded children
//! when its package is gone) runs as the cluster-admin agent account, and
//! an instance's annotations and status are writable by whoever may patch
//! the instance — a tenant with a wide Role. So neither is the gate: the
//! annotation `vynil.solidite.fr/delete-without-package: "true"` only says
//! someone asked; what allows it is a confirmation that
//! `AllowDeleteWithoutPackage` (service token, admin through the gateway)
//! records in a ConfigMap of the control plane's namespace, where tenants
//! have no rights, keyed by the instance's UID and holding the children
//! fingerprint the admin saw, the confirmed list itself, who and when.
//!
//! A confirmation holds only for the same instance object (UID) whose
//! recorded children still have the confirmed fingerprint: a status changed
//! after confirmation voids it, and the reaper deletes exactly the confirmed
//! list, never what status says later.

use std::collections::BTreeMap;

use kube::Client;
use serde_json::Value;

use crate::{LifecycleError, children, records::Records};

/// The label every confirmation ConfigMap carries.
pub const LABEL: &str = "vynil.solidite.fr/delete-without-package-confirmation";

/// One admin's confirmation, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmation {
    /// The instance object's UID.
    pub uid: String,
    /// `kind/namespace/name`, for whoever reads the ConfigMap.
    pub instance: String,
    /// The children fingerprint (`children::preview`) the admin confirmed.
    pub fingerprint: String,
    /// The recorded children as confirmed (the status' phase lists and `crds`).
    pub children: Value,
    pub confirmed_by: String,
    pub confirmed_at: String,
    pub reason: String,
}

/// The ConfigMap naming the confirmation of the instance `uid`.
pub fn name_of(uid: &str) -> String {
    format!("vynil-delete-confirmed-{uid}")
}

/// The recorded children of `status` (its phase lists and `crds`), as a
/// confirmation keeps them.
pub fn children_of(status: &Value) -> Value {
    let mut children = serde_json::Map::new();
    for key in children::PHASES.iter().chain(&["crds"]) {
        if let Some(value) = status.get(*key).filter(|v| !v.is_null()) {
            children.insert((*key).to_string(), value.clone());
        }
    }
    Value::Object(children)
}

impl Confirmation {
    /// Whether it still holds for the instance `uid` whose status is
    /// `status` (namespace `namespace`); else why not.
    pub fn voided(&self, uid: &str, status: &Value, namespace: &str) -> Option<String> {
        if self.uid != uid {
            return Some(format!("it was given for another object (UID {})", self.uid));
        }
        let (_, _, now) = children::preview(status, namespace);
        (now != self.fingerprint).then(|| {
            format!(
                "the recorded children changed after {} confirmed them (fingerprint {} then, {now} now)",
                self.confirmed_by, self.fingerprint
            )
        })
    }

    fn to_data(&self) -> BTreeMap<String, String> {
        let data = [
            ("uid", self.uid.clone()),
            ("instance", self.instance.clone()),
            ("fingerprint", self.fingerprint.clone()),
            ("children", self.children.to_string()),
            ("confirmed-by", self.confirmed_by.clone()),
            ("confirmed-at", self.confirmed_at.clone()),
            ("reason", self.reason.clone()),
        ];
        data.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    fn from_data(data: &BTreeMap<String, String>) -> Result<Self, String> {
        let field = |key: &str| data.get(key).cloned().ok_or_else(|| format!("it has no {key:?}"));
        let children = serde_json::from_str(&field("children")?).map_err(|e| format!("children: {e}"))?;
        Ok(Self {
            uid: field("uid")?,
            instance: field("instance")?,
            fingerprint: field("fingerprint")?,
            children,
            confirmed_by: field("confirmed-by")?,
            confirmed_at: field("confirmed-at")?,
            reason: data.get("reason").cloned().unwrap_or_default(),
        })
    }
}

/// Where confirmations live: the control plane's namespace.
#[derive(Clone, Debug)]
pub struct Confirmations {
    records: Records,
}

impl Confirmations {
    pub fn new(client: &Client, namespace: &str) -> Self {
        Self { records: Records::new(client, namespace, LABEL, "the confirmation") }
    }

    pub fn namespace(&self) -> &str {
        self.records.namespace()
    }

    /// Records `confirmation` (replacing an earlier one for the same
    /// instance) and reads it back.
    pub async fn record(&self, confirmation: &Confirmation) -> Result<(), LifecycleError> {
        let name = name_of(&confirmation.uid);
        let existing = self.records.read(&name).await?;
        self.records.write(&name, confirmation.to_data(), existing.as_ref()).await
    }

    /// The confirmation recorded for the instance `uid`, if any. One that
    /// cannot be decoded is none (it confirms nothing), said in the log.
    pub async fn read(&self, uid: &str) -> Result<Option<Confirmation>, LifecycleError> {
        let name = name_of(uid);
        let Some(record) = self.records.read(&name).await? else {
            return Ok(None);
        };
        match Confirmation::from_data(&record.data) {
            Ok(confirmation) => Ok(Some(confirmation)),
            Err(problem) => {
                tracing::warn!(confirmation = %name, %problem, "a confirmation that does not decode confirms nothing");
                Ok(None)
            }
        }
    }

    /// Removes the confirmation of `uid` once its instance is gone.
    pub async fn forget(&self, uid: &str) -> Result<(), LifecycleError> {
        self.records.forget(&name_of(uid)).await
    }
}
