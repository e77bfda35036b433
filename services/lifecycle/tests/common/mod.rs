//! What the lifecycle whole-loop tests share: the fake API server, a real
//! catalog following JukeBox status, lifecycle itself and the fake agent.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    future::Future,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use clap::Parser;
use k8s_openapi::api::batch::v1::Job;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use vynil_crds::JukeBox;
use vynil_proto::{
    catalog::v1::{GetCatalogRequest, catalog_client::CatalogClient},
    lifecycle::v1::{InstanceKind as ProtoKind, InstanceRef, lifecycle_client::LifecycleClient},
};
use vynil_runtime::{GrpcServer, Shutdown};
use vynil_store::KubeStore;
use vynil_testkit::{
    JukeboxBuilder,
    kube_api::{AgentJob, AgentOutcome, FakeAgent, FakeApiServer},
    upstream::UpstreamReader,
};
pub use vynil_testkit::{channel, eventually};

pub const JOBS: &str = "vynil-system";
pub const APPS: &str = "apps";

/// A gRPC server bound on a port of loopback the system chose, and its
/// address: known before anything dials it, never handed out unbound.
pub async fn bound() -> (GrpcServer, SocketAddr) {
    vynil_testkit::bound().await.unwrap()
}

/// A package revision as the scanner writes it in `status.packages`.
pub fn package(
    registry: &str,
    category: &str,
    name: &str,
    kind: &str,
    tag: &str,
    requirements: Value,
) -> Value {
    json!({
        "registry": registry, "image": format!("{category}/{name}"), "tag": tag, "digest": format!("sha256:{}", tag.replace('.', "")),
        "metadata": {"name": name, "category": category, "description": "", "type": kind, "features": []},
        "requirements": requirements,
        "options": {"replicas": {"type": "integer", "default": 1}},
    })
}

/// `apps/web` with upstream's waypoint example: 4.0.0 (min 3.0.0), 3.5.0 (min 2.0.0), 2.5.0.
pub fn web(registry: &str) -> Vec<Value> {
    vec![
        package(registry, "apps", "web", "tenant", "4.0.0", json!([{"minimum_previous_version": "3.0.0"}])),
        package(registry, "apps", "web", "tenant", "3.5.0", json!([{"minimum_previous_version": "2.0.0"}])),
        package(registry, "apps", "web", "tenant", "2.5.0", json!([])),
    ]
}

pub struct World {
    pub catalog_shutdown: Shutdown,
    /// Stops the first lifecycle replica (pod `a`) alone.
    pub lifecycle_shutdown: Shutdown,
    catalog_endpoint: String,
    catalog_addr: SocketAddr,
    pub api: FakeApiServer,
    pub client: Client,
    pub agent: FakeAgent,
    /// Upstream's reading of every instance status written.
    pub upstream: UpstreamReader,
    /// The test seeded statuses upstream refuses (an earlier release's):
    /// only the final objects must decode.
    pub seeded_refused_status: bool,
    pub lifecycle: SocketAddr,
    shutdown: Shutdown,
    services: tokio::task::JoinSet<Result<(), String>>,
    /// Holds the service token file every replica reads.
    token_dir: tempfile::TempDir,
}

/// The service token the replicas share with their (test) gateway.
pub const SERVICE_TOKEN: &str = "lifecycle-test-service-token";

/// `request` as the gateway sends it: with the service token, naming `caller`.
pub fn as_gateway<T>(request: T, caller: &str) -> tonic::Request<T> {
    vynil_testkit::as_gateway(request, SERVICE_TOKEN, caller).unwrap()
}

pub type Script = Arc<Mutex<Box<dyn Fn(&AgentJob) -> AgentOutcome + Send>>>;

impl World {
    pub async fn start(packages: Vec<Value>, extra: &[&str]) -> (Self, Script) {
        Self::start_with(packages, extra, |_| Box::pin(async {})).await
    }

    /// [`World::start`], with `seed` writing to the API server before any service starts.
    pub async fn start_with(
        packages: Vec<Value>,
        extra: &[&str],
        seed: impl FnOnce(Client) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    ) -> (Self, Script) {
        let api = api_under_deploy_rbac().await;
        seed(api.client().unwrap()).await;
        Self::start_on(api, packages, extra).await
    }

    /// [`World::start`] on an API server the test has already filled.
    pub async fn start_on(api: FakeApiServer, packages: Vec<Value>, extra: &[&str]) -> (Self, Script) {
        Self::start_on_with(api, packages, extra, &[]).await
    }

    /// [`World::start`], the catalog given `catalog_extra` flags too (`--redis-url`).
    pub async fn start_with_catalog(
        packages: Vec<Value>,
        extra: &[&str],
        catalog_extra: &[&str],
    ) -> (Self, Script) {
        Self::start_on_with(api_under_deploy_rbac().await, packages, extra, catalog_extra).await
    }

    async fn start_on_with(
        api: FakeApiServer,
        packages: Vec<Value>,
        extra: &[&str],
        catalog_extra: &[&str],
    ) -> (Self, Script) {
        let client = api.client().unwrap();
        let boxes: Api<JukeBox> = Api::all(client.clone());
        // Its source lists the repositories of its packages, as a scan of it would have found them.
        let mut repositories: Vec<String> = packages
            .iter()
            .filter_map(|p| Some(format!("{}/{}", p["registry"].as_str()?, p["image"].as_str()?)))
            .collect();
        repositories.sort();
        repositories.dedup();
        if repositories.is_empty() {
            repositories.push("registry.example/apps/web".into());
        }
        let jukebox = JukeboxBuilder::new("box").list(repositories).json();
        boxes.create(&PostParams::default(), &serde_json::from_value(jukebox).unwrap()).await.unwrap();
        let status = json!({"status": {"packages": packages, "conditions": [
            {"type": "Updated", "status": "True", "message": "Updated succesfully", "generation": 1}]}});
        boxes.patch_status("box", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();

        let ((catalog_server, catalog_addr), (lifecycle_server, lifecycle)) = (bound().await, bound().await);
        let shutdown = Shutdown::new();
        let mut services = tokio::task::JoinSet::new();
        let listen = catalog_addr.to_string();
        let args = [&["vynil-catalog", "--listen", listen.as_str()][..], catalog_extra].concat();
        let catalog = vynil_catalog::Config::parse_from(args);
        // The catalog can be stopped alone (an outage during a delete).
        let catalog_shutdown = shutdown.child();
        let (store, done) = (Arc::new(KubeStore::new(catalog_client(&api))), catalog_shutdown.signaled());
        services.spawn(async move {
            vynil_catalog::run_with_store(catalog_server, catalog, store, done)
                .await
                .map_err(|e| e.to_string())
        });
        let catalog_endpoint = format!("http://{catalog_addr}");
        let lifecycle_shutdown = shutdown.child();
        let token_dir = tempfile::tempdir().unwrap();
        std::fs::write(token_dir.path().join("token"), SERVICE_TOKEN).unwrap();
        let token = token_dir.path().join("token");
        let task = spawn_replica(
            &api,
            &catalog_endpoint,
            "a",
            lifecycle_server,
            extra,
            &token,
            lifecycle_shutdown.clone(),
        );
        services.spawn(task);
        let script: Script = Arc::new(Mutex::new(Box::new(|_: &AgentJob| AgentOutcome::succeed())));
        let shared = script.clone();
        // Agent Jobs run the fake agent in their pods, reaper Jobs the real
        // lifecycle binary, as the agent image lifecycle is told to use.
        let image = extra
            .iter()
            .position(|a| *a == "--agent-image")
            .and_then(|i| extra.get(i + 1))
            .copied()
            .unwrap_or(vynil_testkit::kube_api::UPSTREAM_AGENT_IMAGE);
        let agent =
            FakeAgent::start_with_image(&api, JOBS, image, move |job| (shared.lock().unwrap())(job)).unwrap();
        let upstream = UpstreamReader::start(client.clone());
        (
            World {
                catalog_shutdown,
                lifecycle_shutdown,
                catalog_endpoint,
                catalog_addr,
                api,
                client,
                agent,
                upstream,
                seeded_refused_status: false,
                lifecycle,
                shutdown,
                services,
                token_dir,
            },
            script,
        )
    }

    /// Stops the catalog and starts a new one on the same address, once
    /// the stopped one has let it go.
    pub async fn restart_catalog(&mut self) {
        self.catalog_shutdown.trigger();
        let deadline = Instant::now() + Duration::from_secs(30);
        let server = loop {
            match GrpcServer::bind(self.catalog_addr).await {
                Ok(server) => break server,
                Err(error) => {
                    assert!(Instant::now() < deadline, "{} never freed: {error}", self.catalog_addr)
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        self.catalog_shutdown = self.shutdown.child();
        let catalog =
            vynil_catalog::Config::parse_from(["vynil-catalog", "--listen", &self.catalog_addr.to_string()]);
        let (store, done) =
            (Arc::new(KubeStore::new(catalog_client(&self.api))), self.catalog_shutdown.signaled());
        self.services.spawn(async move {
            vynil_catalog::run_with_store(server, catalog, store, done).await.map_err(|e| e.to_string())
        });
        eventually("the restarted catalog to serve box", || async { self.catalog_box().await.ok() }).await;
    }

    /// What the catalog answers for JukeBox `box` now: its tags, or the
    /// gRPC code it (or its absence) gives.
    pub async fn catalog_box(&self) -> Result<Vec<String>, tonic::Code> {
        let endpoint =
            tonic::transport::Channel::from_shared(format!("http://{}", self.catalog_addr)).unwrap();
        let Ok(channel) = endpoint.connect().await else { return Err(tonic::Code::Unavailable) };
        let request = GetCatalogRequest { jukebox: "box".into(), ..Default::default() };
        let answer = CatalogClient::new(channel).get_catalog(request).await.map_err(|s| s.code())?;
        Ok(answer.into_inner().packages.into_iter().map(|p| p.tag).collect())
    }

    /// Replaces JukeBox `box`'s packages, as a scan would.
    pub async fn publish(&self, packages: Vec<Value>) {
        let boxes: Api<JukeBox> = Api::all(self.client.clone());
        let status = json!({"status": {"packages": packages}});
        boxes.patch_status("box", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    }

    /// Starts another lifecycle replica, pod `pod`, stopped with the world
    /// or with the returned signal.
    pub async fn start_replica(&mut self, pod: &str, extra: &[&str]) -> (SocketAddr, Shutdown) {
        let ((server, addr), stop) = (bound().await, self.shutdown.child());
        let token = self.token_dir.path().join("token");
        let task = spawn_replica(&self.api, &self.catalog_endpoint, pod, server, extra, &token, stop.clone());
        self.services.spawn(task);
        (addr, stop)
    }

    pub fn instances(&self, kind: &str) -> Api<DynamicObject> {
        self.instances_in(kind, APPS)
    }

    pub fn instances_in(&self, kind: &str, namespace: &str) -> Api<DynamicObject> {
        let resource = ApiResource {
            group: "vynil.solidite.fr".into(),
            version: "v1".into(),
            api_version: "vynil.solidite.fr/v1".into(),
            kind: kind.into(),
            plural: format!("{}s", kind.to_lowercase()),
        };
        Api::namespaced_with(self.client.clone(), namespace, &resource)
    }

    pub async fn create(&self, kind: &str, name: &str, spec: Value, annotations: Value) {
        let object = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": kind,
            "metadata": {"name": name, "namespace": APPS, "annotations": annotations}, "spec": spec});
        self.instances(kind)
            .create(&PostParams::default(), &serde_json::from_value(object).unwrap())
            .await
            .unwrap();
    }

    pub async fn get(&self, kind: &str, name: &str) -> Value {
        serde_json::to_value(self.instances(kind).get(name).await.unwrap()).unwrap()
    }

    pub async fn patch(&self, kind: &str, name: &str, patch: Value) {
        self.instances(kind).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    }

    pub async fn patch_status(&self, kind: &str, name: &str, status: Value) {
        let patch = json!({"status": status});
        self.instances(kind)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    pub fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), JOBS)
    }

    pub fn tags_run(&self, instance: &str) -> Vec<String> {
        self.agent
            .runs()
            .into_iter()
            .filter(|r| r.job.instance_name == instance)
            .map(|r| r.job.tag.unwrap_or_default())
            .collect()
    }

    pub async fn grpc(&self) -> LifecycleClient<tonic::transport::Channel> {
        grpc_at(self.lifecycle).await
    }

    /// Stops every service, then checks what upstream reads of what was
    /// written: every instance status version decoded with upstream's types
    /// (the final ones only when the test seeded refused ones).
    /// The API server stays, with what the test left in it, for the caller
    /// that reads on (the rollback of `tests/switch.rs`).
    pub async fn stop(mut self) -> FakeApiServer {
        let now: Vec<Value> = ["TenantInstance", "ServiceInstance", "SystemInstance"]
            .into_iter()
            .flat_map(|kind| self.api.objects("vynil.solidite.fr", &format!("{}s", kind.to_lowercase())))
            .collect();
        for object in &now {
            vynil_testkit::upstream::decode_instance_status(object)
                .unwrap_or_else(|e| panic!("upstream cannot read what is left: {e}"));
        }
        let refused = self.upstream.refused();
        assert!(
            self.seeded_refused_status || refused.is_empty(),
            "upstream's types refused statuses written during the test: {refused:#?}"
        );
        self.shutdown.trigger();
        while let Some(done) = self.services.join_next().await {
            done.unwrap().unwrap();
        }
        self.api
    }
}

/// A client of the lifecycle replica at `addr`, once it answers.
pub async fn grpc_at(addr: SocketAddr) -> LifecycleClient<tonic::transport::Channel> {
    LifecycleClient::new(channel(addr).await)
}

pub fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == kind)
}

/// The `kind=False` condition whose message starts with an `[E_…]` code.
pub fn coded_condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    condition(object, kind)
        .filter(|c| c["status"] == "False" && c["message"].as_str().is_some_and(|m| m.starts_with("[E_")))
}

pub fn web_spec() -> Value {
    json!({"jukebox": "box", "category": "apps", "package": "web"})
}

pub fn tenant(namespace: &str, name: &str) -> InstanceRef {
    InstanceRef { kind: ProtoKind::Tenant as i32, namespace: namespace.into(), name: name.into() }
}

/// A kube client presenting itself as lifecycle replica `pod`, as the binary does.
/// A fake API server enforcing `deploy/base/rbac.yaml` (in the control
/// plane's namespace, as kustomize puts it), with the namespaces of a
/// world: lifecycle and catalog call it under their own accounts, so a call
/// their Roles do not grant fails where it is made.
pub async fn api_under_deploy_rbac() -> FakeApiServer {
    FakeApiServer::start_under_deploy_rbac(&[JOBS, "apps"]).await.unwrap()
}

/// A client as the lifecycle's Deployment has it: its ServiceAccount's
/// token, a user agent naming the pod.
pub fn replica_client(api: &FakeApiServer, pod: &str) -> Client {
    api.service_client(JOBS, "vynil-lifecycle", &format!("vynil-lifecycle/test pod/{pod}")).unwrap()
}

/// A client as the catalog's Deployment has it (its ServiceAccount's token).
fn catalog_client(api: &FakeApiServer) -> Client {
    api.service_client(JOBS, "vynil-catalog", "vynil-catalog/test").unwrap()
}

fn spawn_replica(
    api: &FakeApiServer,
    catalog: &str,
    pod: &str,
    server: GrpcServer,
    extra: &[&str],
    token: &std::path::Path,
    stop: Shutdown,
) -> impl Future<Output = Result<(), String>> + Send + 'static {
    let listen = server.local_addr().unwrap().to_string();
    let token = token.display().to_string();
    let mut args = vec![
        "vynil-lifecycle",
        "--listen",
        &listen,
        "--kubernetes",
        "--catalog-endpoint",
        catalog,
        "--namespace",
        JOBS,
        "--pod-name",
        pod,
        "--service-token-file",
        &token,
    ];
    args.extend_from_slice(extra);
    let config = vynil_lifecycle::Config::parse_from(args);
    let client = replica_client(api, pod);
    async move {
        vynil_lifecycle::run_with_client(server, config, client, stop.signaled())
            .await
            .map_err(|e| e.to_string())
    }
}
