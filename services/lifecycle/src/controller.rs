//! The instance controllers, wiring only: one kube-runtime `Controller` per
//! kind, in the style of kube-rs controller-rs — `finalizer()` as the only
//! top-level action, an instrumented reconcile, `error_policy` counting
//! failures.
//!
//! A reconcile reads ([`crate::observe`]: catalog answer, cluster facts, the
//! agent Job, the recorded status), asks the pure planners ([`crate::install_plan`],
//! [`crate::uninstall_plan`]) what to do, and has [`crate::executor`] perform the
//! steps, each read back. Agent Jobs live in the control plane's namespace
//! without owner references; each controller follows them with `watches`
//! and a label mapper (`vynil.solidite.fr/type`, `namespace`, `instance`).
//! Only the leader (`crate::leader`) reconciles, and every write is preceded
//! by a leadership check.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::{batch::v1::Job, core::v1::ConfigMap};
use kube::{
    Api, Client, ResourceExt,
    api::DynamicObject,
    runtime::{
        Controller,
        controller::Action,
        finalizer::{Error as FinalizerError, Event, finalizer},
        reflector::ObjectRef,
        watcher,
    },
};
use vynil_crds::labels;

use crate::{
    LifecycleError,
    context::Context,
    executor::execute,
    install_plan::{self, Outcome},
    instance::{Instance, InstanceKind},
    job,
    leader::Standing,
    ledger::{self, Meeting},
    metrics::InstanceFailure,
    observe::{job_slot, observe, observe_cleanup},
    uninstall_plan::{self},
    upgrades,
};

/// The controller of `kind`, not started: its store feeds [`Stores`].
pub fn controller(
    client: &Client,
    namespace: &str,
    kind: InstanceKind,
    queue: Arc<crate::slots::JobQueue>,
    waves: crate::fleet::UnderWaves,
    concurrency: u16,
) -> Controller<DynamicObject> {
    let resource = kind.api_resource();
    let instances: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    let selector =
        format!("{}={},{}={}", labels::COMPONENT, labels::AGENT, labels::TYPE, kind.package_type().as_str());
    let records: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let of_records = resource.clone();
    let controller = Controller::new_with(instances.clone(), watcher::Config::default(), resource.clone())
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency.max(1)));
    let behind = crate::fleet::Behind::new(resource.clone(), waves);
    controller
        // An instance that moved wakes those of its package on another
        // revision: a later wave waits for it (`crate::fleet`).
        .watches_with(
            instances,
            resource.clone(),
            watcher::Config::default(),
            move |object: DynamicObject| behind.woken_by(&object),
        )
        .watches(jobs, watcher::Config::default().labels(&selector), move |job: Job| {
            // A finished Job frees a slot: the first instance waiting for one goes.
            queue.seen(&job);
            let (_, namespace, instance) = job::job_instance(&job)?;
            Some(ObjectRef::new_with(instance, resource.clone()).within(namespace))
        })
        // An operator's decision (a rollback approved, a quarantine cleared) acts at once.
        .watches(
            records,
            watcher::Config::default().labels(&format!("{}=true", upgrades::LABEL)),
            move |map: ConfigMap| {
                let (of_kind, namespace, name) = upgrades::instance_of(&map)?;
                (of_kind == kind).then(|| ObjectRef::new_with(&name, of_records.clone()).within(&namespace))
            },
        )
}

/// Runs `controller` for `kind` until `shutdown`.
pub async fn run(
    controller: Controller<DynamicObject>,
    kind: InstanceKind,
    context: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    controller
        .graceful_shutdown_on(shutdown)
        .run(
            move |object, context| reconcile(kind, object, context),
            move |object, error, context| error_policy(kind, &object, error, &context),
            context,
        )
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile ended with an error");
            }
        })
        .await;
}

#[tracing::instrument(skip_all, fields(kind = %kind, namespace = object.namespace().unwrap_or_default(), name = object.name_any()))]
async fn reconcile(
    kind: InstanceKind,
    object: Arc<DynamicObject>,
    context: Arc<Context>,
) -> Result<Action, LifecycleError> {
    if context.leader.standing() == Standing::Following {
        // Another replica reconciles; this one is brought back when elected.
        return Ok(Action::await_change());
    }
    // The leader whose renewal is late comes back (no new term will).
    context.ensure_leader()?;
    let metrics = context.metrics.of(kind);
    metrics.runs.inc();
    let started = std::time::Instant::now();
    let namespace = object.namespace().unwrap_or_default();
    let reference = ObjectRef::new_with(&object.name_any(), kind.api_resource()).within(&namespace);
    let api = context.instances(kind, &namespace);
    let result = finalizer(&api, kind.finalizer(), object, |event| async {
        match event {
            Event::Apply(object) => apply(kind, &object, &context).await,
            Event::Cleanup(object) => cleanup(kind, &object, &context).await,
        }
    })
    .await
    .map_err(|e| match e {
        FinalizerError::ApplyFailed(e) | FinalizerError::CleanupFailed(e) => e,
        other => LifecycleError::Unavailable(format!("Kubernetes API, managing the finalizer: {other}")),
    });
    metrics.observe(started.elapsed().as_secs_f64());
    if !matches!(result, Err(LifecycleError::Queued(_))) {
        // Not waiting for a slot (any more, when Ok): no wake is spent on it,
        // and a slot it was offered and did not take goes to the next.
        context.job_queue.reconciled(kind, reference, result.is_ok());
    }
    result
}

fn error_policy(
    kind: InstanceKind,
    object: &DynamicObject,
    error: &LifecycleError,
    context: &Context,
) -> Action {
    let spec = |key: &str| {
        object.data.pointer(&format!("/spec/{key}")).and_then(|v| v.as_str()).unwrap_or_default().to_string()
    };
    let failure = InstanceFailure {
        name: object.name_any(),
        namespace: object.namespace().unwrap_or_default(),
        jukebox: spec("jukebox"),
        category: spec("category"),
        package: spec("package"),
        error: error.label(),
    };
    if let LifecycleError::Queued(_) = error {
        let instance = ObjectRef::new_with(&failure.name, kind.api_resource()).within(&failure.namespace);
        context.job_queue.wait(kind, instance);
        // Woken when a slot frees, or by the line's own safety net (`slots`).
        tracing::debug!(%error, "not a failure; waits for a slot");
        return Action::await_change();
    }
    if let LifecycleError::Pending { .. } = error {
        tracing::debug!(%error, "not a failure; coming back");
        return Action::requeue(error.retry_after());
    }
    context.metrics.of(kind).failures.get_or_create(&failure).inc();
    let instance = format!("{kind}/{}/{}", failure.namespace, failure.name);
    if let LifecycleError::Conflict(_) = error {
        // Optimistic concurrency at work (counted, labelled `conflict`), not
        // an outage for the operator to read about.
        tracing::debug!(%error, %instance, "changed since it was read; reconciling again");
    } else {
        tracing::warn!(%error, %instance, "reconcile failed");
    }
    Action::requeue(error.retry_after())
}

async fn decode(
    kind: InstanceKind,
    object: &DynamicObject,
    context: &Context,
) -> Result<Instance, LifecycleError> {
    match Instance::decode(kind, object) {
        Ok(instance) => Ok(instance),
        Err(error) => {
            context.publish(object, kind, true, "InvalidObject", error.to_string()).await;
            Err(LifecycleError::Decode(error))
        }
    }
}

async fn apply(
    kind: InstanceKind,
    object: &DynamicObject,
    context: &Context,
) -> Result<Action, LifecycleError> {
    let instance = decode(kind, object, context).await?;
    let (instance, record) = ledger::read(instance, context, Meeting::Record).await?;
    let slot = job_slot(&instance, context).await?;
    let observed = observe(&instance, record, &slot, context).await?;
    let plan = install_plan::plan(&instance, &observed);
    tracing::debug!(outcome = ?plan.outcome, steps = plan.steps.len(), "planned");
    let executed = execute(&instance, object, &slot.name, plan.steps, context).await;
    if let (Err(LifecycleError::Queued(_)), Outcome::Installing { to, .. }) = (&executed, &plan.outcome) {
        // The Job waits for a slot: say so rather than "installing".
        context.remember(&instance, Outcome::Queued { to: to.clone() });
    }
    executed?;
    context.remember(&instance, plan.outcome);
    // The planner's idle interval is upstream's; the configured one wins.
    let requeue = if plan.requeue == install_plan::REQUEUE { context.requeue } else { plan.requeue };
    Ok(Action::requeue(requeue))
}

/// Deletion (`crate::uninstall_plan` decides): released, or `Pending` until the
/// delete Job, the reaper or a republished package lets it end.
async fn cleanup(
    kind: InstanceKind,
    object: &DynamicObject,
    context: &Context,
) -> Result<Action, LifecycleError> {
    let instance = match decode(kind, object, context).await {
        Ok(instance) => instance,
        // An object that does not decode but records nothing to undo can still go.
        Err(error) if !records_anything(object) => {
            let note = format!("released without cleanup: it records nothing to undo ({error})");
            context.publish(object, kind, true, "InvalidObjectReleased", note).await;
            return Ok(Action::await_change());
        }
        Err(error) => return Err(error),
    };
    let (instance, _) = ledger::read(instance, context, Meeting::Record).await?;
    let slot = job_slot(&instance, context).await?;
    let observed = observe_cleanup(&instance, &slot, context).await?;
    let plan = uninstall_plan::cleanup(&instance, &observed);
    tracing::debug!(outcome = ?plan.outcome, steps = plan.steps.len(), "cleanup planned");
    execute(&instance, object, &slot.name, plan.steps, context).await?;
    let outcome = plan.outcome.clone();
    context.remember(&instance, plan.outcome);
    match outcome {
        Outcome::Released => {
            // The instance is gone: so are its records (they serve no other UID).
            if let Some(uid) = instance.uid.as_deref() {
                if let Err(error) = context.confirmations.forget(uid).await {
                    tracing::warn!(%error, "a confirmation outlives its instance (it confirms nothing for another UID)");
                }
                if let Err(error) = context.upgrades.forget(uid).await {
                    tracing::warn!(%error, "an upgrade record outlives its instance (it serves no other UID)");
                }
            }
            Ok(Action::await_change())
        }
        other => Err(LifecycleError::Pending { why: format!("{other:?}"), retry_after: plan.requeue }),
    }
}

/// Whether the raw status records children or a state (read without decoding).
fn records_anything(object: &DynamicObject) -> bool {
    let status = object.data.get("status").cloned().unwrap_or(serde_json::Value::Null);
    let (children, crds) = crate::children::recorded_children(&status);
    let state = ["tfstate", "rhaistate"].iter().any(|k| status.get(k).is_some_and(|v| !v.is_null()));
    !children.is_empty() || !crds.is_empty() || state
}

/// Single reconciles against kube's `tower-test` mock, as named scenarios
/// (kube-rs controller-rs style): each scenario answers exactly the API calls
/// the reconcile must make, in order, and fails on any other.
#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::catalog_client::Catalog;
    use crate::context::Settings;
    use crate::facts::Stores;
    use crate::job::AgentSettings;
    use crate::leader::{Leader, Standing};
    use crate::metrics::LifecycleMetrics;
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::Value;
    use serde_json::json;
    use vynil_registry::CredentialStore;
    use vynil_registry::RegistryClient;
    use vynil_script::ScriptLimits;

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    fn context() -> (Arc<Context>, Handle) {
        context_of(Leader::fixed(Standing::Leading))
    }

    fn context_of(leader: Leader) -> (Arc<Context>, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "vynil-system");
        let store = |k: InstanceKind| {
            kube::runtime::reflector::store::Writer::<DynamicObject>::new(k.api_resource()).as_reader()
        };
        let stores = Stores {
            tenant: store(InstanceKind::Tenant),
            service: store(InstanceKind::Service),
            system: store(InstanceKind::System),
            jukeboxes: kube::runtime::reflector::store::Writer::default().as_reader(),
            namespaces: kube::runtime::reflector::store::Writer::default().as_reader(),
        };
        let (metrics, _) = LifecycleMetrics::register();
        let registry = RegistryClient::new(
            vynil_registry::TransportConfig::default(),
            CredentialStore::default(),
            Arc::new(vynil_registry::InMemoryMetadataCache::default()),
        )
        .unwrap();
        let settings = Settings {
            namespace: "vynil-system".into(),
            // Nothing listens here: a scenario that reached the catalog would fail.
            catalog: Catalog::connect("http://127.0.0.1:1").unwrap(),
            scanner: None,
            registry,
            agent: AgentSettings::default(),
            framework: semver::Version::new(0, 7, 7),
            scripts: ScriptLimits::default(),
            max_attempts: 3,
            rollback: true,
            reruns: install_plan::Reruns::default(),
            reporter: kube::runtime::events::Reporter {
                controller: "vynil-lifecycle".into(),
                instance: None,
            },
            leader,
            requeue: install_plan::REQUEUE,
            job_queue: Arc::new(crate::slots::JobQueue::new(4).0),
            under_waves: Default::default(),
        };
        (Arc::new(Context::new(client, stores, metrics, settings)), handle)
    }

    fn object(spec: Value, annotations: Value, finalized: bool) -> Arc<DynamicObject> {
        let finalizers = if finalized { json!([vynil_crds::finalizers::TENANT]) } else { json!([]) };
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
                "metadata": {"name": "web", "namespace": "apps", "uid": "u1", "resourceVersion": "1",
                    "generation": 1, "annotations": annotations, "finalizers": finalizers},
                "spec": spec,
            }))
            .unwrap(),
        )
    }

    fn respond(status: u16, body: Value) -> Response<Body> {
        Response::builder().status(status).body(Body::from(serde_json::to_vec(&body).unwrap())).unwrap()
    }

    /// Answers the next request, checking its method and path.
    async fn expect(handle: &mut Handle, method: &str, path: &str, status: u16, body: Value) {
        let (request, send) = handle.next_request().await.expect("a request");
        assert_eq!(request.method().as_str(), method, "{}", request.uri());
        assert!(request.uri().path().starts_with(path), "expected {method} {path}, got {}", request.uri());
        send.send_response(respond(status, body));
    }

    fn not_found() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"})
    }

    async fn scenario(
        object: Arc<DynamicObject>,
        script: impl FnOnce(Handle) -> tokio::task::JoinHandle<Handle>,
    ) -> Result<Action, LifecycleError> {
        let (context, handle) = context();
        let server = script(handle);
        let result =
            tokio::time::timeout(Duration::from_secs(10), reconcile(InstanceKind::Tenant, object, context))
                .await
                .expect("the reconcile finished");
        // The script answered exactly its requests: one more would have left
        // the reconcile waiting, and the timeout above fails the scenario.
        server.await.unwrap();
        result
    }

    fn spec() -> Value {
        json!({"jukebox": "box", "category": "apps", "package": "web"})
    }

    #[tokio::test]
    async fn a_new_instance_gets_the_finalizer_first_and_nothing_else() {
        let result = scenario(object(spec(), json!({}), false), |mut handle| {
            tokio::spawn(async move {
                let (request, send) = handle.next_request().await.unwrap();
                assert_eq!(request.method(), http::Method::PATCH);
                assert!(
                    request.uri().path().ends_with("/namespaces/apps/tenantinstances/web"),
                    "{}",
                    request.uri()
                );
                let mut body = (*object(spec(), json!({}), true)).clone();
                body.metadata.resource_version = Some("2".into());
                send.send_response(respond(200, serde_json::to_value(body).unwrap()));
                handle
            })
        })
        .await;
        assert_eq!(result.unwrap(), Action::await_change());
    }

    #[tokio::test]
    async fn a_suspended_instance_reads_its_ledger_and_job_and_asks_the_catalog_nothing() {
        let suspended = object(spec(), json!({"vynil.solidite.fr/suspend": "true"}), true);
        let result = scenario(suspended, |mut handle| {
            tokio::spawn(async move {
                // Its ledger (none: no creation time, so nothing to adopt).
                expect(
                    &mut handle,
                    "GET",
                    "/api/v1/namespaces/vynil-system/configmaps/vynil-upgrade-u1",
                    404,
                    not_found(),
                )
                .await;
                expect(
                    &mut handle,
                    "GET",
                    "/apis/batch/v1/namespaces/vynil-system/jobs/tenant--apps--web",
                    404,
                    not_found(),
                )
                .await;
                handle
            })
        })
        .await;
        assert_eq!(result.unwrap(), Action::requeue(install_plan::REQUEUE));
    }

    #[tokio::test]
    async fn an_object_that_does_not_decode_publishes_an_event_and_fails_without_panicking() {
        let garbage = object(json!({"jukebox": 42, "category": ["x"]}), json!({}), true);
        let result = scenario(garbage, |mut handle| {
            tokio::spawn(async move {
                let (request, send) = handle.next_request().await.unwrap();
                assert_eq!(request.method(), http::Method::POST);
                assert!(request.uri().path().contains("/events"), "{}", request.uri());
                let body = request.into_body().collect_bytes().await.unwrap();
                let event: Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(event["reason"], "InvalidObject", "{event}");
                send.send_response(respond(201, event));
                handle
            })
        })
        .await;
        assert!(matches!(result, Err(LifecycleError::Decode(_))), "{result:?}");
    }

    /// The API server's answer to a write that named a stale
    /// `resourceVersion` (`OptimisticLockErrorMsg`,
    /// k8s.io/apiserver/pkg/registry/generic/registry/store.go).
    fn stale_write() -> kube::Error {
        let message = "Operation cannot be fulfilled on tenantinstances.vynil.solidite.fr \"web\": the object \
                       has been modified; please apply your changes to the latest version and try again";
        kube::Error::Api(kube::core::Status::failure(message, "Conflict").with_code(409).boxed())
    }

    #[tokio::test]
    async fn a_conflicting_write_is_read_again_within_a_second_and_an_outage_later() {
        use vynil_runtime::Classify;
        let (context, _handle) = context();
        let instance = object(spec(), json!({}), true);
        let timeout =
            kube::core::Status::failure("etcdserver: request timed out", "InternalError").with_code(500);
        let cases = [
            (stale_write(), "conflict", vynil_runtime::Failure::Concurrent, Duration::from_secs(1)),
            (
                kube::Error::Api(timeout.boxed()),
                "unavailable",
                vynil_runtime::Failure::Transient,
                Duration::from_secs(30),
            ),
        ];
        for (answer, label, failure, retry) in cases {
            let error = LifecycleError::kube("writing the conditions")(answer);
            assert_eq!((error.label().as_str(), error.failure()), (label, failure), "{error:?}");
            let action = error_policy(InstanceKind::Tenant, &instance, &error, &context);
            assert_eq!(action, Action::requeue(retry), "{error:?}");
        }
        // "already exists" is a 409 too, and not a stale read.
        let exists =
            kube::core::Status::failure("jobs.batch \"x\" already exists", "AlreadyExists").with_code(409);
        let exists = LifecycleError::kube("creating the Job")(kube::Error::Api(exists.boxed()));
        assert!(matches!(exists, LifecycleError::Unavailable(_)), "{exists:?}");
    }

    #[tokio::test]
    async fn a_leader_whose_renewal_is_late_comes_back_and_a_follower_waits_to_be_elected() {
        let retry = Duration::from_millis(700);
        for (standing, expected) in [(Standing::Renewing { retry }, Some(retry)), (Standing::Following, None)]
        {
            let (context, mut handle) = context_of(Leader::fixed(standing));
            let object = object(spec(), json!({}), true);
            // An API call would wait for an answer the mock never sends.
            let reconciled = reconcile(InstanceKind::Tenant, object, context);
            let result = tokio::time::timeout(Duration::from_secs(5), reconciled).await.expect("no API call");
            match (result, expected) {
                // Not a failure, and no wake lost: the reconcile is retried.
                (Err(LifecycleError::Pending { retry_after, .. }), Some(retry)) => {
                    assert_eq!(retry_after, retry)
                }
                (Ok(action), None) => assert_eq!(action, Action::await_change()),
                (other, _) => panic!("{standing:?}: {other:?}"),
            }
            // The client went with the context: a request it made would still be queued.
            let asked = tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await;
            assert!(!matches!(asked, Ok(Some(_))), "{standing:?}: no API call without the right to write");
        }
    }
}
