//! The object store of the fake API server, with the semantics our
//! controllers depend on: a cluster-wide `resourceVersion` bumped on every
//! write (and not on a write that changes nothing), `409 Conflict` on a stale
//! precondition, `metadata.generation` bumped when anything but metadata and
//! status changes, the `status` subresource, merge and JSON patches,
//! finalizers with `deletionTimestamp`, owner-reference cascades, and an event
//! history that watches resume from (or get `410 Gone` when it was compacted).
//!
//! Everything here is synchronous: the server holds one lock per request, so
//! every write and its watch event are one atomic step.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
};

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::resources::{ResourceDef, Resources};
use super::selectors::{FieldSelector, LabelSelector};

/// Where an object lives: `namespace` is empty for cluster-scoped objects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub group: String,
    pub plural: String,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug)]
pub struct StoredEvent {
    pub rv: u64,
    pub kind: EventType,
    pub key: Key,
    pub object: Value,
}

/// A failure the server answers as a Kubernetes `Status` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into() }
    }
    pub fn not_found(res: &ResourceDef, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{} \"{name}\" not found", res.qualified()))
    }
    pub fn conflict(res: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                res.qualified()
            ),
        )
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    /// The `Status` object of this failure.
    pub fn to_status(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }
}

/// The patch types of `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/json-patch+json` (RFC 6902, `test` included).
    Json,
    /// `application/strategic-merge-patch+json`: treated as a merge patch (lists
    /// are replaced, not merged by key).
    Strategic,
    /// `application/apply-patch+yaml`: an approximation of server-side apply,
    /// merged like a merge patch (no field ownership), creating when absent.
    Apply,
}

impl PatchKind {
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        let essence = content_type.split(';').next().unwrap_or("").trim();
        match essence {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/json-patch+json" => Some(Self::Json),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// `propagationPolicy` of a delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Foreground,
    Orphan,
}

/// The objects, the resource table and the event history.
#[derive(Debug)]
pub struct Store {
    pub resources: Resources,
    objects: BTreeMap<Key, Value>,
    rv: u64,
    history: VecDeque<Arc<StoredEvent>>,
    history_limit: usize,
    compacted_at: u64,
    events: broadcast::Sender<Arc<StoredEvent>>,
}

fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn uid() -> String {
    let hex: String = (0..32).map(|_| fastrand::alphanumeric().to_ascii_lowercase()).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

fn meta(object: &Value) -> Option<&Map<String, Value>> {
    object.get("metadata").and_then(Value::as_object)
}

fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    meta(object).and_then(|m| m.get(field)).and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn meta_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = json!({});
    }
    // Just ensured to be an object.
    match object.get_mut("metadata").and_then(Value::as_object_mut) {
        Some(m) => m,
        None => unreachable!("metadata was just set to an object"),
    }
}

fn has_finalizers(object: &Value) -> bool {
    meta(object).and_then(|m| m.get("finalizers")).and_then(Value::as_array).is_some_and(|f| !f.is_empty())
}

/// The object without metadata and status: what `generation` counts changes of.
fn desired_state(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(map) = copy.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
    }
    copy
}

fn without_rv(object: &Value) -> Value {
    let mut copy = object.clone();
    meta_mut(&mut copy).remove("resourceVersion");
    copy
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// RFC 6902 as the API server applies it: a `test` for `null` passes on a
/// missing path (kube's finalizer helper relies on it), and the patch is
/// all-or-nothing.
fn apply_json_patch(doc: &mut Value, ops: &json_patch::Patch) -> Result<(), ApiError> {
    let mut patched = doc.clone();
    for op in ops.iter() {
        if let json_patch::PatchOperation::Test(test) = op
            && test.value.is_null()
            && patched.pointer(test.path.as_str()).is_none()
        {
            continue;
        }
        json_patch::patch(&mut patched, std::slice::from_ref(op))
            .map_err(|e| ApiError::invalid(format!("the JSON patch could not be applied: {e}")))?;
    }
    *doc = patched;
    Ok(())
}

impl Store {
    pub fn new(resources: Resources, history_limit: usize) -> Self {
        let (events, _) = broadcast::channel(16_384);
        Self {
            resources,
            objects: BTreeMap::new(),
            rv: 1000,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted_at: 1000,
            events,
        }
    }

    pub fn current_rv(&self) -> u64 {
        self.rv
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<StoredEvent>> {
        self.events.subscribe()
    }

    /// Forgets the event history: a watch from any earlier version gets `410 Gone`.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted_at = self.rv;
    }

    /// The events after `rv`, or `410 Gone` when some were compacted away.
    pub fn events_since(&self, rv: u64) -> Result<Vec<Arc<StoredEvent>>, ApiError> {
        if rv < self.compacted_at {
            return Err(ApiError::gone(format!(
                "too old resource version: {rv} ({})",
                self.compacted_at + 1
            )));
        }
        Ok(self.history.iter().filter(|e| e.rv > rv).cloned().collect())
    }

    fn key(res: &ResourceDef, namespace: Option<&str>, name: &str) -> Key {
        Key {
            group: res.group.clone(),
            plural: res.plural.clone(),
            namespace: if res.namespaced { namespace.unwrap_or_default().to_string() } else { String::new() },
            name: name.to_string(),
        }
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn emit(&mut self, kind: EventType, key: Key, object: Value, rv: u64) {
        let event = Arc::new(StoredEvent { rv, kind, key, object });
        self.history.push_back(event.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_at = old.rv;
            }
        }
        // No receiver is not an error: nobody watches.
        let _ = self.events.send(event);
    }

    pub fn get(&self, res: &ResourceDef, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&Self::key(res, namespace, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))
    }

    /// Objects of `res` (in `namespace`, or everywhere) matching both selectors.
    pub fn list(
        &self,
        res: &ResourceDef,
        namespace: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(k, _)| k.group == res.group && k.plural == res.plural)
            .filter(|(k, _)| namespace.is_none_or(|ns| k.namespace == ns))
            .filter(|(_, o)| labels.matches(o) && fields.matches(o))
            .map(|(_, o)| o.clone())
            .collect()
    }

    pub fn create(
        &mut self,
        res: &ResourceDef,
        namespace: Option<&str>,
        mut body: Value,
    ) -> Result<Value, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request("the request body must be a JSON object"));
        }
        let name = match (meta_str(&body, "name"), meta_str(&body, "generateName")) {
            (Some(name), _) => name.to_string(),
            (None, Some(prefix)) => {
                let suffix: String = (0..5).map(|_| fastrand::lowercase()).collect();
                format!("{prefix}{suffix}")
            }
            (None, None) => {
                return Err(ApiError::invalid(
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
        };
        if !valid_name(&name) {
            return Err(ApiError::invalid(format!(
                "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case \
                 alphanumeric characters, '-' or '.'"
            )));
        }
        let namespace = if res.namespaced {
            let in_body = meta_str(&body, "namespace");
            let ns = namespace.or(in_body).ok_or_else(|| ApiError::bad_request("a namespace is required"))?;
            if in_body.is_some_and(|b| b != ns) {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            Some(ns.to_string())
        } else {
            None
        };
        let key = Self::key(res, namespace.as_deref(), &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", res.qualified()),
            ));
        }
        let rv = self.next_rv();
        body["apiVersion"] = json!(res.api_version());
        body["kind"] = json!(res.kind);
        if res.status_subresource
            && let Some(map) = body.as_object_mut()
        {
            map.remove("status");
        }
        let m = meta_mut(&mut body);
        m.insert("name".into(), json!(name));
        if let Some(ns) = namespace {
            m.insert("namespace".into(), json!(ns));
        } else {
            m.remove("namespace");
        }
        m.insert("uid".into(), json!(uid()));
        m.insert("creationTimestamp".into(), json!(now()));
        m.insert("resourceVersion".into(), json!(rv.to_string()));
        m.insert("generation".into(), json!(1));
        m.remove("deletionTimestamp");
        self.objects.insert(key.clone(), body.clone());
        self.on_stored(res, &body);
        self.emit(EventType::Added, key, body.clone(), rv);
        Ok(body)
    }

    /// `PUT`, on the object or on its `status` subresource.
    pub fn replace(
        &mut self,
        res: &ResourceDef,
        namespace: Option<&str>,
        name: &str,
        body: Value,
        status_only: bool,
    ) -> Result<Value, ApiError> {
        let old = self.get(res, namespace, name)?;
        if meta_str(&body, "name").is_some_and(|n| n != name) {
            return Err(ApiError::bad_request("the name of the object does not match the name on the URL"));
        }
        if meta_str(&body, "resourceVersion").is_some_and(|rv| Some(rv) != meta_str(&old, "resourceVersion"))
        {
            return Err(ApiError::conflict(res, name));
        }
        let new = Self::shape_write(res, &old, body, status_only);
        Ok(self.commit(res, namespace, name, &old, new))
    }

    /// `PATCH`; the second value is `true` when an apply patch created the object.
    pub fn patch(
        &mut self,
        res: &ResourceDef,
        namespace: Option<&str>,
        name: &str,
        kind: PatchKind,
        patch: &Value,
        status_only: bool,
    ) -> Result<(Value, bool), ApiError> {
        let old = match self.get(res, namespace, name) {
            Ok(old) => old,
            Err(e) if e.code == 404 && kind == PatchKind::Apply && !status_only => {
                let mut body = patch.clone();
                meta_mut(&mut body).insert("name".into(), json!(name));
                return Ok((self.create(res, namespace, body)?, true));
            }
            Err(e) => return Err(e),
        };
        let mut doc = old.clone();
        match kind {
            PatchKind::Merge | PatchKind::Strategic | PatchKind::Apply => json_patch::merge(&mut doc, patch),
            PatchKind::Json => {
                let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                    .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
                apply_json_patch(&mut doc, &ops)?;
            }
        }
        // A patch that carries a resourceVersion is a precondition on it.
        if meta_str(&doc, "resourceVersion") != meta_str(&old, "resourceVersion") {
            return Err(ApiError::conflict(res, name));
        }
        let new = Self::shape_write(res, &old, doc, status_only);
        Ok((self.commit(res, namespace, name, &old, new), false))
    }

    /// What a write keeps of the request: on `status`, only the status; on the
    /// object of a kind with a status subresource, everything but the status.
    fn shape_write(res: &ResourceDef, old: &Value, mut body: Value, status_only: bool) -> Value {
        if status_only {
            let mut new = old.clone();
            match body.get("status") {
                Some(status) => new["status"] = status.clone(),
                None => {
                    if let Some(map) = new.as_object_mut() {
                        map.remove("status");
                    }
                }
            }
            return new;
        }
        if res.status_subresource
            && let Some(map) = body.as_object_mut()
        {
            match old.get("status") {
                Some(status) => {
                    map.insert("status".into(), status.clone());
                }
                None => {
                    map.remove("status");
                }
            }
        }
        body
    }

    /// Stores `new` over `old`: server-owned fields kept, no-op writes dropped,
    /// generation and resourceVersion bumped, and the object removed when it is
    /// being deleted and its last finalizer is gone.
    fn commit(
        &mut self,
        res: &ResourceDef,
        namespace: Option<&str>,
        name: &str,
        old: &Value,
        mut new: Value,
    ) -> Value {
        new["apiVersion"] = json!(res.api_version());
        new["kind"] = json!(res.kind);
        let old_meta = meta(old).cloned().unwrap_or_default();
        let m = meta_mut(&mut new);
        for field in ["name", "namespace", "uid", "creationTimestamp", "generation", "deletionTimestamp"] {
            match old_meta.get(field) {
                Some(v) => m.insert(field.into(), v.clone()),
                None => m.remove(field),
            };
        }
        m.insert("resourceVersion".into(), old_meta.get("resourceVersion").cloned().unwrap_or(Value::Null));
        if without_rv(&new) == without_rv(old) {
            return old.clone();
        }
        if desired_state(&new) != desired_state(old) {
            let generation = old_meta.get("generation").and_then(Value::as_i64).unwrap_or(0);
            meta_mut(&mut new).insert("generation".into(), json!(generation + 1));
        }
        let rv = self.next_rv();
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv.to_string()));
        let key = Self::key(res, namespace, name);
        if meta_str(&new, "deletionTimestamp").is_some() && !has_finalizers(&new) {
            self.objects.remove(&key);
            self.emit(EventType::Deleted, key, new.clone(), rv);
            self.after_removal(res, &new);
            return new;
        }
        self.objects.insert(key.clone(), new.clone());
        self.on_stored(res, &new);
        self.emit(EventType::Modified, key, new.clone(), rv);
        new
    }

    /// `DELETE`: marks an object that has finalizers, removes one that has none.
    pub fn delete(
        &mut self,
        res: &ResourceDef,
        namespace: Option<&str>,
        name: &str,
        propagation: Propagation,
    ) -> Result<Value, ApiError> {
        let old = self.get(res, namespace, name)?;
        if has_finalizers(&old) {
            if meta_str(&old, "deletionTimestamp").is_some() {
                return Ok(old);
            }
            let mut marked = old.clone();
            let m = meta_mut(&mut marked);
            m.insert("deletionTimestamp".into(), json!(now()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            let generation = m.get("generation").and_then(Value::as_i64).unwrap_or(0);
            m.insert("generation".into(), json!(generation + 1));
            let rv = self.next_rv();
            meta_mut(&mut marked).insert("resourceVersion".into(), json!(rv.to_string()));
            let key = Self::key(res, namespace, name);
            self.objects.insert(key.clone(), marked.clone());
            self.emit(EventType::Modified, key, marked.clone(), rv);
            return Ok(marked);
        }
        let key = Self::key(res, namespace, name);
        self.objects.remove(&key);
        let rv = self.next_rv();
        let mut gone = old;
        meta_mut(&mut gone).insert("resourceVersion".into(), json!(rv.to_string()));
        self.emit(EventType::Deleted, key, gone.clone(), rv);
        if propagation != Propagation::Orphan {
            self.after_removal(res, &gone);
        }
        Ok(gone)
    }

    /// Side effects of storing an object: a CRD serves its resource.
    fn on_stored(&mut self, res: &ResourceDef, object: &Value) {
        if res.plural == "customresourcedefinitions"
            && let Some(def) = ResourceDef::from_crd(object)
        {
            self.resources.register(def);
        }
    }

    /// Side effects of removing an object: dependents (owner references) are
    /// collected, a namespace takes its objects along, a CRD its resource.
    fn after_removal(&mut self, res: &ResourceDef, object: &Value) {
        let mut doomed: Vec<Key> = Vec::new();
        if let Some(uid) = meta_str(object, "uid") {
            doomed.extend(
                self.objects
                    .iter()
                    .filter(|(_, o)| {
                        meta(o)
                            .and_then(|m| m.get("ownerReferences"))
                            .and_then(Value::as_array)
                            .is_some_and(|refs| refs.iter().any(|r| r["uid"].as_str() == Some(uid)))
                    })
                    .map(|(k, _)| k.clone()),
            );
        }
        let name = meta_str(object, "name").unwrap_or_default().to_string();
        if res.group.is_empty() && res.plural == "namespaces" {
            doomed.extend(self.objects.keys().filter(|k| k.namespace == name).cloned());
        }
        if res.plural == "customresourcedefinitions"
            && let Some(def) = ResourceDef::from_crd(object)
        {
            doomed.extend(
                self.objects.keys().filter(|k| k.group == def.group && k.plural == def.plural).cloned(),
            );
            self.resources.unregister(&def.group, &def.plural);
            // Their resource is gone: remove them directly, finalizers or not.
            for key in doomed.iter().filter(|k| k.group == def.group && k.plural == def.plural) {
                if let Some(o) = self.objects.remove(key) {
                    let rv = self.next_rv();
                    self.emit(EventType::Deleted, key.clone(), o, rv);
                }
            }
        }
        for key in doomed {
            let Some(def) = self.resources.find_by_plural(&key.group, &key.plural).cloned() else { continue };
            let ns = (!key.namespace.is_empty()).then_some(key.namespace.as_str());
            // Already gone (two paths to the same dependent) is fine.
            let _ = self.delete(&def, ns, &key.name, Propagation::Background);
        }
    }
}
