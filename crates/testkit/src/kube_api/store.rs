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

use super::admission::{self, FieldError, Structural};
use super::resources::{ResourceDef, Resources};
use super::selectors::{FieldSelector, LabelSelector};

mod garbage;

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
    /// The object before a `MODIFIED` change: a watch with a selector sends
    /// `ADDED` when the object starts to match, `DELETED` when it stops.
    pub previous: Option<Value>,
    /// When it was written (a watch delivers it `watch_lag` after).
    pub at: std::time::Instant,
}

/// A failure the server answers as a Kubernetes `Status` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `details` of the `Status` (name, group, kind, causes), when the server gives them.
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into(), details: None }
    }
    /// `422 Invalid` naming every failing field, as the API server words it:
    /// `Job.batch "x" is invalid: [a: …, b: …]`, each in `details.causes`.
    pub fn invalid_object(res: &ResourceDef, name: &str, errors: &[FieldError]) -> Self {
        let group_kind =
            if res.group.is_empty() { res.kind.clone() } else { format!("{}.{}", res.kind, res.group) };
        let listed: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let joined = match listed.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let mut error = Self::new(422, "Invalid", format!("{group_kind} \"{name}\" is invalid: {joined}"));
        error.details = Some(json!({
            "name": name, "group": res.group, "kind": res.kind,
            "causes": errors.iter().map(FieldError::cause).collect::<Vec<_>>(),
        }));
        error
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
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
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
    /// The installed CRDs' structural schemas, by `(group, plural)`.
    schemas: BTreeMap<(String, String), Structural>,
    rv: u64,
    history: VecDeque<Arc<StoredEvent>>,
    history_limit: usize,
    compacted_at: u64,
    events: broadcast::Sender<Arc<StoredEvent>>,
    /// The garbage collector's owner graph and the objects it must look at
    /// again (`garbage`).
    graph: garbage::Graph,
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

/// `metadata.finalizers`, and a namespace's `spec.finalizers` (`kubernetes`,
/// removed by the namespace controller once the namespace is empty).
fn has_finalizers(object: &Value) -> bool {
    let listed = |v: Option<&Value>| v.and_then(Value::as_array).is_some_and(|f| !f.is_empty());
    listed(meta(object).and_then(|m| m.get("finalizers")))
        || (object["kind"] == "Namespace" && listed(object.pointer("/spec/finalizers")))
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
            schemas: BTreeMap::new(),
            rv: 1000,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted_at: 1000,
            events,
            graph: garbage::Graph::default(),
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
        self.emit_change(kind, key, object, None, rv);
    }

    fn emit_change(&mut self, kind: EventType, key: Key, object: Value, previous: Option<Value>, rv: u64) {
        self.graph.track(kind, &key, &object, previous.as_ref());
        let event = Arc::new(StoredEvent { rv, kind, key, object, previous, at: std::time::Instant::now() });
        self.history.push_back(event.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_at = old.rv;
            }
        }
        // No receiver is not an error: nobody watches.
        let _ = self.events.send(event);
    }

    /// The stored objects of `group`/`plural` (in `namespace` when given):
    /// a range of the map, ordered by group, plural, namespace and name, not
    /// a scan of every object (each request of a fleet reads some).
    fn range_of<'a>(
        &'a self,
        group: &'a str,
        plural: &'a str,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a Key, &'a Value)> + 'a {
        let from = Key {
            group: group.into(),
            plural: plural.into(),
            namespace: namespace.unwrap_or_default().into(),
            name: String::new(),
        };
        self.objects.range(from..).take_while(move |(k, _)| {
            k.group == group && k.plural == plural && namespace.is_none_or(|ns| k.namespace == ns)
        })
    }

    /// How many stored objects of `group`/`plural` `matches` accepts.
    pub fn count_of(&self, group: &str, plural: &str, matches: impl Fn(&Value) -> bool) -> usize {
        self.range_of(group, plural, None).filter(|(_, o)| matches(o)).count()
    }

    /// Every stored object of `group`/`plural` (RBAC reads its roles so).
    pub fn objects_of(&self, group: &str, plural: &str) -> Vec<Value> {
        self.range_of(group, plural, None).map(|(_, o)| o.clone()).collect()
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
        self.range_of(&res.group, &res.plural, namespace)
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
            (None, Some(prefix)) => admission::generated_name(prefix),
            (None, None) => {
                return Err(ApiError::invalid(
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
        };
        let namespace = if res.namespaced {
            let in_body = meta_str(&body, "namespace");
            let ns = namespace.or(in_body).ok_or_else(|| ApiError::bad_request("a namespace is required"))?;
            if in_body.is_some_and(|b| b != ns) {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            self.accepts_content_in(ns)?;
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
        m.insert("generation".into(), json!(1));
        m.remove("deletionTimestamp");
        m.remove("resourceVersion");
        self.admit(res, &name, &mut body, None)?;
        let rv = self.next_rv();
        meta_mut(&mut body).insert("resourceVersion".into(), json!(rv.to_string()));
        self.objects.insert(key.clone(), body.clone());
        self.on_stored(res, &body);
        self.emit(EventType::Added, key, body.clone(), rv);
        Ok(body)
    }

    /// A create that skips the CRD's schema (see
    /// [`crate::kube_api::FakeApiServer::create_under_an_older_schema`]).
    pub fn create_unchecked_by_schema(
        &mut self,
        res: &ResourceDef,
        namespace: Option<&str>,
        body: Value,
    ) -> Result<Value, ApiError> {
        let key = (res.group.clone(), res.plural.clone());
        let schema = self.schemas.remove(&key);
        let created = self.create(res, namespace, body);
        if let Some(schema) = schema {
            self.schemas.insert(key, schema);
        }
        created
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
        match meta_str(&body, "resourceVersion") {
            Some(rv) if Some(rv) != meta_str(&old, "resourceVersion") => {
                return Err(ApiError::conflict(res, name));
            }
            // A custom resource's strategy allows no unconditional update.
            None if self.is_custom(res) => {
                return Err(ApiError::invalid_object(
                    res,
                    name,
                    &[FieldError::invalid("metadata.resourceVersion", 0, "must be specified for an update")],
                ));
            }
            _ => {}
        }
        let new = Self::shape_write(res, &old, body, status_only);
        self.commit(res, namespace, name, &old, new)
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
        Ok((self.commit(res, namespace, name, &old, new)?, false))
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
    ) -> Result<Value, ApiError> {
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
        self.admit(res, name, &mut new, Some(old))?;
        if without_rv(&new) == without_rv(old) {
            return Ok(old.clone());
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
            return Ok(new);
        }
        self.objects.insert(key.clone(), new.clone());
        self.on_stored(res, &new);
        self.emit_change(EventType::Modified, key, new.clone(), Some(old.clone()), rv);
        Ok(new)
    }

    /// Admission (see `admission`) and etcd's size limit.
    fn admit(
        &self,
        res: &ResourceDef,
        name: &str,
        object: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        admission::admit(res, &self.schemas, object, old)
            .map_err(|errors| ApiError::invalid_object(res, name, &errors))?;
        if object.to_string().len() > admission::MAX_OBJECT_BYTES {
            return Err(ApiError::new(500, "InternalError", "etcdserver: request is too large"));
        }
        Ok(())
    }

    /// A create in a namespace needs the namespace, and one that is not
    /// being terminated (the `NamespaceLifecycle` admission plugin).
    fn accepts_content_in(&self, namespace: &str) -> Result<(), ApiError> {
        let key = Key {
            group: String::new(),
            plural: "namespaces".into(),
            namespace: String::new(),
            name: namespace.into(),
        };
        let Some(ns) = self.objects.get(&key) else {
            let mut error = ApiError::new(404, "NotFound", format!("namespaces \"{namespace}\" not found"));
            error.details = Some(json!({"name": namespace, "kind": "namespaces"}));
            return Err(error);
        };
        if meta_str(ns, "deletionTimestamp").is_some() {
            return Err(ApiError::new(
                403,
                "Forbidden",
                format!(
                    "unable to create new content in namespace {namespace} because it is being terminated"
                ),
            ));
        }
        Ok(())
    }

    /// Whether a CustomResourceDefinition serves this resource.
    fn is_custom(&self, res: &ResourceDef) -> bool {
        self.objects
            .keys()
            .any(|k| k.group == "apiextensions.k8s.io" && k.name == format!("{}.{}", res.plural, res.group))
    }

    /// `DELETE`: marks an object that has finalizers (or gets one from its
    /// propagation policy: `foregroundDeletion`, `orphan`; a namespace its
    /// `kubernetes` finalizer), removes one that has none. Dependents and a
    /// namespace's content go later, in [`Store::collect_garbage`].
    pub fn delete(
        &mut self,
        res: &ResourceDef,
        namespace: Option<&str>,
        name: &str,
        propagation: Propagation,
    ) -> Result<Value, ApiError> {
        let old = self.get(res, namespace, name)?;
        if meta_str(&old, "deletionTimestamp").is_some() {
            return Ok(old);
        }
        let is_namespace = res.group.is_empty() && res.plural == "namespaces";
        let policy_finalizer = match propagation {
            Propagation::Foreground => Some("foregroundDeletion"),
            Propagation::Orphan => Some("orphan"),
            Propagation::Background => None,
        };
        if has_finalizers(&old) || policy_finalizer.is_some() || is_namespace {
            let mut marked = old.clone();
            if let Some(finalizer) = policy_finalizer {
                let finalizers = meta_mut(&mut marked).entry("finalizers").or_insert_with(|| json!([]));
                if let Some(list) = finalizers.as_array_mut()
                    && !list.iter().any(|f| f == finalizer)
                {
                    list.push(json!(finalizer));
                }
            }
            if is_namespace {
                marked["status"]["phase"] = json!("Terminating");
            }
            let m = meta_mut(&mut marked);
            m.insert("deletionTimestamp".into(), json!(now()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            let generation = m.get("generation").and_then(Value::as_i64).unwrap_or(0);
            m.insert("generation".into(), json!(generation + 1));
            let rv = self.next_rv();
            meta_mut(&mut marked).insert("resourceVersion".into(), json!(rv.to_string()));
            let key = Self::key(res, namespace, name);
            self.objects.insert(key.clone(), marked.clone());
            self.emit_change(EventType::Modified, key, marked.clone(), Some(old), rv);
            return Ok(marked);
        }
        let key = Self::key(res, namespace, name);
        self.objects.remove(&key);
        let rv = self.next_rv();
        let mut gone = old;
        meta_mut(&mut gone).insert("resourceVersion".into(), json!(rv.to_string()));
        self.emit(EventType::Deleted, key, gone.clone(), rv);
        self.after_removal(res, &gone);
        Ok(gone)
    }

    /// Side effects of storing an object: a CRD serves its resource.
    fn on_stored(&mut self, res: &ResourceDef, object: &Value) {
        if res.plural == "customresourcedefinitions"
            && let Some(def) = ResourceDef::from_crd(object)
        {
            // Admission compiled it already: a schema that fails here is none.
            match Structural::from_crd(object) {
                Ok(Some(schema)) => self.schemas.insert((def.group.clone(), def.plural.clone()), schema),
                _ => self.schemas.remove(&(def.group.clone(), def.plural.clone())),
            };
            self.resources.register(def);
        }
    }

    /// Side effects of removing an object: a CRD takes its resource and its
    /// objects along. (Dependents and namespace content are the garbage
    /// collector's, later.)
    fn after_removal(&mut self, res: &ResourceDef, object: &Value) {
        if res.plural == "customresourcedefinitions"
            && let Some(def) = ResourceDef::from_crd(object)
        {
            let doomed: Vec<Key> = self
                .objects
                .keys()
                .filter(|k| k.group == def.group && k.plural == def.plural)
                .cloned()
                .collect();
            self.resources.unregister(&def.group, &def.plural);
            self.schemas.remove(&(def.group.clone(), def.plural.clone()));
            // Their resource is gone: remove them directly, finalizers or not.
            for key in doomed {
                if let Some(o) = self.objects.remove(&key) {
                    let rv = self.next_rv();
                    self.emit(EventType::Deleted, key, o, rv);
                }
            }
        }
    }
}
