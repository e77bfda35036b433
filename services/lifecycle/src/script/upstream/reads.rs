//! Upstream's Kubernetes reads (`core/src/k8s.rs`) through lifecycle's own client, bounded; where no client is given, each says why it cannot answer.

use super::*;

fn list_value<T: serde::Serialize + Clone>(list: &kube::api::ObjectList<T>) -> Res<Dynamic> {
    json_of(&serde_json::to_value(list).map_err(|e| e.to_string())?)
}

/// The cluster-scoped kinds a package script may read: those upstream's
/// helpers read (sebt3/vynil `agent/scripts/lib/build_context.rhai`:
/// CustomResourceDefinition, Node, StorageClass; `service/context_service.rhai`:
/// Namespace; `core/src/jukebox.rs`: JukeBox) and the classes a package
/// chooses among (IngressClass, PriorityClass).
pub const CLUSTER_KINDS: &[&str] = &[
    "CustomResourceDefinition",
    "Node",
    "StorageClass",
    "Namespace",
    "JukeBox",
    "IngressClass",
    "PriorityClass",
];

/// Objects one list page asks for; a list is read page by page.
const PAGE: u32 = 100;
/// Bytes one list may return, over all its pages.
pub const LIST_BYTES: usize = 4 * 1024 * 1024;

fn denied<T>(kind: &str, namespace: &str, why: &str) -> Res<T> {
    error(format!("[E_SCRIPT_READ_DENIED] {kind} in {namespace}: {why}"))
}

impl Session {
    /// Whether a script may read `kind` (cluster-scoped or not) in
    /// `namespace` (`None`: every namespace): docs/lifecycle.md "What
    /// package scripts may read".
    pub(super) fn may_read(&self, kind: &str, cluster: bool, namespace: Option<&str>) -> Res<()> {
        match (cluster, namespace) {
            (true, _) if CLUSTER_KINDS.contains(&kind) => Ok(()),
            (true, _) => denied(
                kind,
                "the cluster",
                "a package script reads no cluster-scoped kind but those upstream's helpers read (docs/lifecycle.md)",
            ),
            (false, None) => denied(
                kind,
                "every namespace",
                "a package script lists in its instance's namespaces only: name one",
            ),
            (false, Some(ns)) if self.reads.namespaces.contains(ns) => Ok(()),
            (false, Some(ns)) => denied(
                kind,
                ns,
                "neither the instance's namespace, nor its tenant's, nor that of a service or package it requires or recommends",
            ),
        }
    }

    /// A whole list, page by page (each page one read), refused past [`LIST_BYTES`].
    fn paged<T, F>(
        &self,
        what: &str,
        params: &ListParams,
        page: impl Fn(ListParams) -> F,
    ) -> Res<kube::api::ObjectList<T>>
    where
        T: Clone + serde::Serialize,
        F: std::future::Future<Output = Result<kube::api::ObjectList<T>, kube::Error>>,
    {
        let mut params = params.clone().limit(PAGE);
        let mut list = self.call(what, page(params.clone()))?;
        let mut bytes = serde_json::to_vec(&list.items).map(|b| b.len()).unwrap_or(usize::MAX);
        while let Some(token) = list.metadata.continue_.clone().filter(|t| !t.is_empty()) {
            if bytes > LIST_BYTES {
                break;
            }
            params = params.continue_token(&token);
            let next = self.call(what, page(params.clone()))?;
            bytes =
                bytes.saturating_add(serde_json::to_vec(&next.items).map(|b| b.len()).unwrap_or(usize::MAX));
            list.items.extend(next.items);
            list.metadata = next.metadata;
        }
        if bytes > LIST_BYTES {
            return error(format!(
                "[E_SCRIPT_READ_DENIED] {what}: the list is over {LIST_BYTES} bytes; list with a label selector"
            ));
        }
        Ok(list)
    }
}

/// Where no client is given: each read helper says why it cannot answer.
pub(super) fn register_no_reads(engine: &mut Engine) {
    fn unavailable(name: &str) -> Res<Dynamic> {
        error(format!(
            "{name}: Kubernetes reads are not available here (a delete Job's values computed without the install's record)"
        ))
    }
    type S = ImmutableString;
    engine
        .register_fn("k8s_resource", |_: S| unavailable("k8s_resource"))
        .register_fn("k8s_resource", |_: S, _: S| unavailable("k8s_resource"))
        .register_fn("k8s_resource", |_: S, _: S, _: S| unavailable("k8s_resource"))
        .register_fn("get_deployment", |_: S, _: S| unavailable("get_deployment"))
        .register_fn("get_statefulset", |_: S, _: S| unavailable("get_statefulset"))
        .register_fn("get_deamonset", |_: S, _: S| unavailable("get_deamonset"))
        .register_fn("get_job", |_: S, _: S| unavailable("get_job"))
        .register_fn("get_jukebox", |_: S| unavailable("get_jukebox"))
        .register_fn("list_jukebox", || unavailable("list_jukebox"))
        .register_fn("update_k8s_crd_cache", || unavailable("update_k8s_crd_cache"));
}

/// Upstream's Kubernetes reads (`core/src/k8s.rs`), through lifecycle's client.
pub(super) fn register_reads(engine: &mut Engine, reads: &Reads) {
    let session =
        Arc::new(Session { reads: reads.clone(), used: AtomicUsize::new(0), discovery: Mutex::new(None) });
    register_generic(engine, &session);
    register_named(engine, session);
}

/// Upstream's `K8sGeneric` (`k8s_resource(…)`) and its reads.
fn register_generic(engine: &mut Engine, session: &Arc<Session>) {
    let s = session.clone();
    engine.register_type_with_name::<Resource>("K8sGeneric");
    engine.register_fn("k8s_resource", move |kind: ImmutableString| s.resource(None, &kind, None));
    let s = session.clone();
    engine.register_fn("k8s_resource", move |kind: ImmutableString, ns: ImmutableString| {
        s.resource(None, &kind, Some(&ns))
    });
    let s = session.clone();
    engine.register_fn(
        "k8s_resource",
        move |api_version: ImmutableString, kind: ImmutableString, ns: ImmutableString| {
            s.resource(Some(&api_version), &kind, Some(&ns))
        },
    );
    let s = session.clone();
    engine.register_fn("update_k8s_crd_cache", move || s.discovery(true).map(drop));
    engine
        .register_fn("exist", |r: &mut Resource| r.api.is_some())
        .register_get("scope", |r: &mut Resource| {
            if r.scope == Scope::Cluster { "cluster".to_string() } else { "namespace".to_string() }
        })
        .register_get("kind", |r: &mut Resource| r.kind.clone());
    let s = session.clone();
    engine.register_fn("get", move |r: &mut Resource, name: ImmutableString| -> Res<Dynamic> {
        let object = s.call("get", r.api("get")?.get(&name))?;
        json_of(&object_value(&object))
    });
    let s = session.clone();
    engine.register_fn("get_meta", move |r: &mut Resource, name: ImmutableString| -> Res<Dynamic> {
        let meta = s.call("get_meta", r.api("get_meta")?.get_metadata(&name))?;
        json_of(&serde_json::to_value(&meta).map_err(|e| e.to_string())?)
    });
    let s = session.clone();
    engine.register_fn("get_obj", move |r: &mut Resource, name: ImmutableString| -> Res<Dynamic> {
        let meta = s.call("get_obj", r.api("get_obj")?.get_metadata(&name))?;
        json_of(&serde_json::json!({"kind": r.kind, "metadata": meta.metadata}))
    });
    let s = session.clone();
    engine.register_fn("list", move |r: &mut Resource| -> Res<Dynamic> {
        let api = r.api("list")?;
        list_value(&s.paged("list", &ListParams::default(), |p| async move { api.list(&p).await })?)
    });
    let s = session.clone();
    engine.register_fn("list", move |r: &mut Resource, labels: ImmutableString| -> Res<Dynamic> {
        let api = r.api("list")?;
        let params = ListParams::default().labels(&labels);
        list_value(&s.paged("list", &params, |p| async move { api.list(&p).await })?)
    });
    let s = session.clone();
    engine.register_fn("list_meta", move |r: &mut Resource| -> Res<Dynamic> {
        let api = r.api("list_meta")?;
        list_value(
            &s.paged("list_meta", &ListParams::default(), |p| async move { api.list_metadata(&p).await })?,
        )
    });
}

/// Upstream's reads of one named object: workloads (`k8sworkload.rs`) and
/// JukeBoxes (`jukebox.rs`).
fn register_named(engine: &mut Engine, session: Arc<Session>) {
    // k8sworkload.rs: the object, read by namespace and name.
    let workloads: [(&str, ApiResource); 4] = [
        ("get_deployment", ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&())),
        ("get_statefulset", ApiResource::erase::<k8s_openapi::api::apps::v1::StatefulSet>(&())),
        ("get_deamonset", ApiResource::erase::<k8s_openapi::api::apps::v1::DaemonSet>(&())),
        ("get_job", ApiResource::erase::<k8s_openapi::api::batch::v1::Job>(&())),
    ];
    for (name, resource) in workloads {
        let s = session.clone();
        engine.register_fn(name, move |ns: ImmutableString, wanted: ImmutableString| -> Res<Dynamic> {
            s.may_read(&resource.kind, false, Some(&ns))?;
            let api: Api<DynamicObject> = Api::namespaced_with(s.reads.client.clone(), &ns, &resource);
            json_of(&object_value(&s.call(name, api.get(&wanted))?))
        });
    }
    // jukebox.rs
    let jukebox = ApiResource {
        group: "vynil.solidite.fr".into(),
        version: "v1".into(),
        api_version: "vynil.solidite.fr/v1".into(),
        kind: "JukeBox".into(),
        plural: "jukeboxes".into(),
    };
    let (s, resource) = (session.clone(), jukebox.clone());
    engine.register_fn("get_jukebox", move |wanted: ImmutableString| -> Res<Dynamic> {
        let api: Api<DynamicObject> = Api::all_with(s.reads.client.clone(), &resource);
        json_of(&object_value(&s.call("get_jukebox", api.get(&wanted))?))
    });
    let s = session;
    engine.register_fn("list_jukebox", move || -> Res<Array> {
        let api: Api<DynamicObject> = Api::all_with(s.reads.client.clone(), &jukebox);
        let list = s.paged("list_jukebox", &ListParams::default(), |p| {
            let api = api.clone();
            async move { api.list(&p).await }
        })?;
        list.items.iter().map(|o| json_of(&object_value(o))).collect()
    });
}
