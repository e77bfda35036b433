//! Lifecycle's own records, kept where tenants cannot write: ConfigMaps of
//! the control plane's namespace, one per instance UID and purpose.
//!
//! An instance's annotations and status are writable by whoever may patch
//! the instance (a tenant with a wide Role), so what an operator decided —
//! a delete without package hooks ([`crate::confirmation`]), a quarantine
//! or a rollback ([`crate::upgrades`]) — is never read from there. Each
//! write is read back before it counts ("accepted is not done"), and a
//! concurrent writer makes it fail (the resourceVersion of the replace)
//! rather than be lost.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};

use crate::LifecycleError;

/// The ConfigMaps of one purpose (`label`), in the control plane's namespace.
#[derive(Clone)]
pub struct Records {
    api: Api<ConfigMap>,
    namespace: String,
    /// The label every record of this purpose carries (value `"true"`).
    label: &'static str,
    /// What a record is, in errors ("a confirmation").
    noun: &'static str,
}

impl std::fmt::Debug for Records {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records").field("namespace", &self.namespace).field("label", &self.label).finish()
    }
}

impl Records {
    pub fn new(client: &Client, namespace: &str, label: &'static str, noun: &'static str) -> Self {
        Self {
            api: Api::namespaced(client.clone(), namespace),
            namespace: namespace.to_string(),
            label,
            noun,
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The data of the record `name`, with its resourceVersion (`None`: none).
    pub async fn read(&self, name: &str) -> Result<Option<Record>, LifecycleError> {
        let found = self
            .api
            .get_opt(name)
            .await
            .map_err(LifecycleError::kube(format!("reading {} {name}", self.noun)))?;
        Ok(found.map(|map| Record {
            data: map.data.unwrap_or_default(),
            resource_version: map.metadata.resource_version,
        }))
    }

    /// Writes `data` as the record `name`: created when `over` is `None`,
    /// else replacing exactly the version `over` was read at (a concurrent
    /// write fails this one). Read back before it counts.
    pub async fn write(
        &self,
        name: &str,
        data: BTreeMap<String, String>,
        over: Option<&Record>,
    ) -> Result<(), LifecycleError> {
        let noun = self.noun;
        let map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                resource_version: over.and_then(|r| r.resource_version.clone()),
                labels: Some(
                    [
                        (self.label.to_string(), "true".to_string()),
                        ("app.kubernetes.io/managed-by".to_string(), "vynil-lifecycle".to_string()),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            data: Some(data.clone()),
            ..ConfigMap::default()
        };
        match over {
            Some(_) => self
                .api
                .replace(name, &PostParams::default(), &map)
                .await
                .map_err(LifecycleError::kube(format!("replacing {noun} {name}")))?,
            None => self.api.create(&PostParams::default(), &map).await.map_err(|e| match e {
                // Created by another writer since it was read absent: read it again.
                kube::Error::Api(status) if status.code == 409 => LifecycleError::Conflict(format!(
                    "Kubernetes API, recording {noun} {name}: created meanwhile ({})",
                    status.message
                )),
                e => LifecycleError::kube(format!("recording {noun} {name}"))(e),
            })?,
        };
        match self.read(name).await? {
            Some(read) if read.data == data => Ok(()),
            _ => Err(LifecycleError::NotDone(format!("{noun} {name} cannot be read back"))),
        }
    }

    /// Every record of this purpose, by name.
    pub async fn all(&self) -> Result<BTreeMap<String, Record>, LifecycleError> {
        let params = kube::api::ListParams::default().labels(&format!("{}=true", self.label));
        let list =
            self.api.list(&params).await.map_err(LifecycleError::kube(format!("listing {}s", self.noun)))?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|map| {
                let name = map.metadata.name?;
                Some((
                    name,
                    Record {
                        data: map.data.unwrap_or_default(),
                        resource_version: map.metadata.resource_version,
                    },
                ))
            })
            .collect())
    }

    /// Removes the record `name` (gone already is done).
    pub async fn forget(&self, name: &str) -> Result<(), LifecycleError> {
        match self.api.delete(name, &Default::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(LifecycleError::kube(format!("removing {} {name}", self.noun))(e)),
        }
    }
}

/// A record as read: its data and the version it was read at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    pub data: BTreeMap<String, String>,
    resource_version: Option<String>,
}
