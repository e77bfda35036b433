//! Upstream's Kubernetes reads (`core/src/k8s.rs`) through lifecycle's own client, bounded; where no client is given, each says why it cannot answer.

use super::*;

fn list_value<T: serde::Serialize + Clone>(list: &kube::api::ObjectList<T>) -> Res<Dynamic> {
    json_of(&serde_json::to_value(list).map_err(|e| e.to_string())?)
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
        list_value(&s.call("list", r.api("list")?.list(&ListParams::default()))?)
    });
    let s = session.clone();
    engine.register_fn("list", move |r: &mut Resource, labels: ImmutableString| -> Res<Dynamic> {
        list_value(&s.call("list", r.api("list")?.list(&ListParams::default().labels(&labels)))?)
    });
    let s = session.clone();
    engine.register_fn("list_meta", move |r: &mut Resource| -> Res<Dynamic> {
        list_value(&s.call("list_meta", r.api("list_meta")?.list_metadata(&ListParams::default()))?)
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
        let list = s.call("list_jukebox", api.list(&ListParams::default()))?;
        list.items.iter().map(|o| json_of(&object_value(o))).collect()
    });
}
