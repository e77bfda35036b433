//! The offered helpers, registered on the sealed engine: pure helpers, upstream's Semver, instance accessors, the tenant of the instance being reconciled, and the three kinds' watch caches.

use super::{
    reads::{register_no_reads, register_reads},
    *,
};

/// Registers the offered helpers on `engine`.
pub fn register(engine: &mut Engine, given: &Given) {
    register_pure(engine);
    let version = given.vynil_version.clone();
    engine.register_fn("vynil_version", move || version.clone());

    register_semver(engine);
    register_instance(engine);
    register_tenant(engine, given);
    match &given.reads {
        Some(reads) => register_reads(engine, reads),
        None => register_no_reads(engine),
    }
    register_kind(engine, given, "tenant", |c| &c.tenants);
    register_kind(engine, given, "service", |c| &c.services);
    register_kind(engine, given, "system", |c| &c.systems);
    let cluster = given.cluster.clone();
    engine.register_fn("list_services_names", move || -> Res<Array> {
        let Some(cluster) = &cluster else {
            return error("list_services_names: the cluster's instances are not known here");
        };
        let mut keys: Vec<String> = cluster.services.iter().flat_map(|o| published(&o.data)).collect();
        keys.sort();
        Ok(keys.into_iter().map(Dynamic::from).collect())
    });
}

/// Upstream's pure helpers: encodings, hashes, paths, logs, `assert`.
fn register_pure(engine: &mut Engine) {
    engine
        .register_fn("base64_encode", |s: ImmutableString| STANDARD.encode(s.as_str()))
        .register_fn("base64_decode", |s: ImmutableString| -> Res<String> {
            let bytes = STANDARD.decode(s.as_str()).map_err(|e| format!("base64_decode: {e}"))?;
            String::from_utf8(bytes).map_err(|e| format!("base64_decode: not UTF-8 text: {e}").into())
        })
        .register_fn("basename", |s: ImmutableString| {
            Path::new(s.as_str()).file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string()
        })
        .register_fn("dirname", |s: ImmutableString| {
            Path::new(s.as_str()).parent().and_then(|n| n.to_str()).unwrap_or_default().to_string()
        })
        .register_fn("json_encode", |v: Dynamic| -> Res<String> {
            serde_json::to_string(&v).map_err(|e| format!("json_encode: {e}").into())
        })
        .register_fn("json_encode_escape", |v: Dynamic| -> Res<String> {
            let text = serde_json::to_string(&v).map_err(|e| format!("json_encode_escape: {e}"))?;
            Ok(format!("{text:?}"))
        })
        .register_fn("json_decode", |s: ImmutableString| -> Res<Dynamic> {
            serde_json::from_str(s.as_str()).map_err(|e| format!("json_decode: {e}").into())
        })
        .register_fn("yaml_decode", |s: ImmutableString| -> Res<Dynamic> {
            let value: Value =
                serde_yaml_ng::from_str(s.as_str()).map_err(|e| format!("yaml_decode: {e}"))?;
            json_of(&value)
        })
        .register_fn("yaml_encode", |v: Dynamic| -> Res<String> {
            serde_yaml_ng::to_string(&v).map_err(|e| format!("yaml_encode: {e}").into())
        })
        .register_fn("yaml_encode_ordered", |v: Dynamic| -> Res<String> {
            serde_yaml_ng::to_string(&v).map_err(|e| format!("yaml_encode_ordered: {e}").into())
        })
        .register_fn("sha256", |s: ImmutableString| hex::encode(sha2::Sha256::digest(s.as_bytes())))
        .register_fn("crc32_hash", |s: ImmutableString| i64::from(crc32fast::hash(s.as_bytes())))
        .register_fn("url_encode", |s: ImmutableString| {
            url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()
        })
        .register_fn("to_decimal", |s: ImmutableString| {
            i64::from_str_radix(s.as_str(), 8).unwrap_or_else(|_| {
                tracing::warn!("to_decimal received a non-valid parameter: {s:?}");
                0
            })
        })
        .register_fn("log_debug", |s: ImmutableString| tracing::debug!("{s}"))
        .register_fn("log_info", |s: ImmutableString| tracing::info!("{s}"))
        .register_fn("log_warn", |s: ImmutableString| tracing::warn!("{s}"))
        .register_fn("log_error", |s: ImmutableString| tracing::error!("{s}"))
        .register_fn("assert", |holds: bool, message: Dynamic| -> Res<()> {
            if holds {
                Ok(())
            } else {
                Err(EvalAltResult::ErrorRuntime(message, rhai::Position::NONE).into())
            }
        });
}

/// Upstream's `Semver` type and its operators.
fn register_semver(engine: &mut Engine) {
    engine
        .register_type_with_name::<Semver>("Semver")
        .register_fn("semver_from", |s: ImmutableString| Semver::parse(s.as_str()))
        .register_fn("inc_major", Semver::inc_major)
        .register_fn("inc_minor", Semver::inc_minor)
        .register_fn("inc_patch", Semver::inc_patch)
        .register_fn("inc_beta", |v: &mut Semver| v.inc_pre("beta"))
        .register_fn("inc_alpha", |v: &mut Semver| v.inc_pre("alpha"))
        .register_fn("to_string", |v: &mut Semver| v.text())
        .register_fn("==", |a: Semver, b: Semver| a == b)
        .register_fn("!=", |a: Semver, b: Semver| a != b)
        .register_fn("<", |a: Semver, b: Semver| a < b)
        .register_fn(">", |a: Semver, b: Semver| a > b)
        .register_fn("<=", |a: Semver, b: Semver| a <= b)
        .register_fn(">=", |a: Semver, b: Semver| a >= b);
}

/// Accessors of `instance`, the object as a map.
fn register_instance(engine: &mut Engine) {
    engine
        .register_fn("options_digest", |instance: Map| -> Res<String> {
            let value: Value = rhai::serde::from_dynamic(&Dynamic::from_map(instance))?;
            let options = value.pointer("/spec/options").and_then(Value::as_object);
            Ok(vynil_rules::install::options_hash(options))
        })
        .register_fn("get_tfstate", |instance: Map| status_state(&instance, "tfstate"))
        .register_fn("get_rhaistate", |instance: Map| status_state(&instance, "rhaistate"))
        .register_fn("get_services", |instance: Map| -> Res<String> {
            let value: Value = rhai::serde::from_dynamic(&Dynamic::from_map(instance))?;
            let mut keys = published(&value);
            keys.sort();
            Ok(keys.join(","))
        });
}

/// The tenant of the instance being reconciled (only that one is known).
fn register_tenant(engine: &mut Engine, given: &Given) {
    let cluster = given.cluster.clone();
    let tenant = move |instance: &Map, helper: &str| -> Res<Arc<Cluster>> {
        let Some(cluster) = cluster.clone() else {
            return error(format!(
                "{helper}: the tenant is not known when a delete Job's values are computed without the install's record"
            ));
        };
        let namespace = instance_str(instance, "metadata", "namespace").unwrap_or_default();
        if namespace != cluster.namespace {
            return error(format!(
                "{helper}: only the tenant of the instance being reconciled is known (namespace {:?}, not {namespace:?})",
                cluster.namespace
            ));
        }
        Ok(cluster)
    };
    let t = tenant.clone();
    engine.register_fn("get_tenant_name", move |instance: Map| -> Res<String> {
        Ok(t(&instance, "get_tenant_name")?.tenant_name.clone())
    });
    let t = tenant.clone();
    engine.register_fn("get_tenant_namespaces", move |instance: Map| -> Res<Array> {
        Ok(t(&instance, "get_tenant_namespaces")?
            .tenant_namespaces
            .iter()
            .map(|n| Dynamic::from(n.clone()))
            .collect())
    });
    let t = tenant;
    engine.register_fn("get_tenant_services_names", move |instance: Map| -> Res<Array> {
        let cluster = t(&instance, "get_tenant_services_names")?;
        let mut keys: Vec<String> = cluster
            .tenants
            .iter()
            .filter(|o| o.namespace().is_some_and(|ns| cluster.tenant_namespaces.contains(&ns)))
            .flat_map(|o| published(&o.data))
            .collect();
        keys.sort();
        Ok(keys.into_iter().map(Dynamic::from).collect())
    });
}

/// `get_<kind>_instance(namespace, name)` and `list_<kind>_instance(namespace)`
/// over lifecycle's watch cache of that kind.
fn register_kind(
    engine: &mut Engine,
    given: &Given,
    kind: &'static str,
    of: fn(&Cluster) -> &Vec<Arc<DynamicObject>>,
) {
    let cluster = given.cluster.clone();
    let get = format!("get_{kind}_instance");
    let name = get.clone();
    engine.register_fn(&get, move |namespace: ImmutableString, wanted: ImmutableString| -> Res<Dynamic> {
        let Some(cluster) = &cluster else {
            return error(format!("{name}: the cluster's instances are not known here"));
        };
        let object = of(cluster)
            .iter()
            .find(|o| o.namespace().as_deref() == Some(namespace.as_str()) && o.name_any() == wanted.as_str())
            .ok_or_else(|| format!("{name}: no {kind} instance {namespace}/{wanted}"))?;
        json_of(&object_value(object))
    });
    let cluster = given.cluster.clone();
    let list = format!("list_{kind}_instance");
    let name = list.clone();
    engine.register_fn(&list, move |namespace: ImmutableString| -> Res<Array> {
        let Some(cluster) = &cluster else {
            return error(format!("{name}: the cluster's instances are not known here"));
        };
        let mut objects: Vec<&Arc<DynamicObject>> =
            of(cluster).iter().filter(|o| o.namespace().as_deref() == Some(namespace.as_str())).collect();
        objects.sort_by_key(|o| o.name_any());
        objects.into_iter().map(|o| json_of(&object_value(o))).collect()
    });
}
