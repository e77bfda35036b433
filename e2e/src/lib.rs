//! What the cross-service tests (`e2e/tests/`) and the CLI's subprocess
//! tests (`gateway/tests/`) start: the real services on the fake Kubernetes
//! API server and a real registry.
//!
//! The cluster path as the cross-service tests start it: a real registry with
//! one package, the fake API server holding JukeBox `box` that lists it, and a
//! scanner and a catalog each on its own Kubernetes store (as separate
//! deployments would), serving real gRPC until `stop`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_debug_implementations)]

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::Parser;
use kube::{Api, api::PostParams};
use vynil_crds::JukeBox;
use vynil_runtime::{GrpcServer, Shutdown};
use vynil_store::KubeStore;
use vynil_testkit::{JukeboxBuilder, PackageSpec, PackageType, RegistryServer, kube_api::FakeApiServer};
pub use vynil_testkit::{channel, eventually};

pub mod fleet;

pub struct Cluster {
    pub registry: RegistryServer,
    pub api: FakeApiServer,
    pub boxes: Api<JukeBox>,
    pub scanner_addr: SocketAddr,
    pub catalog_addr: SocketAddr,
    shutdown: Shutdown,
    services: tokio::task::JoinSet<Result<(), String>>,
}

/// A gRPC server bound on a port of loopback the system chose, and its
/// address: known before anything dials it, never handed out unbound.
pub async fn bound() -> (GrpcServer, SocketAddr) {
    vynil_testkit::bound().await.unwrap()
}

impl Cluster {
    /// `apps/web:2.1.0` in JukeBox `box`; `catalog_flags` are added to the catalog's.
    pub async fn start(catalog_flags: &[&str]) -> Self {
        let registry = RegistryServer::start().await.unwrap();
        let spec = PackageSpec::new("apps", "web", PackageType::Tenant, "2.1.0");
        registry.publisher().publish("apps/web", &spec).await.unwrap();
        let api = FakeApiServer::start().await.unwrap();
        api.create_namespaces(&["vynil-system", "apps"]).unwrap();
        let boxes: Api<JukeBox> = Api::all(api.client().unwrap());
        let images = [format!("{}/apps/web", registry.host())];
        let jukebox = JukeboxBuilder::new("box").list(images).schedule("0 0 1 1 *").json();
        let jukebox: JukeBox = serde_json::from_value(jukebox).unwrap();
        boxes.create(&PostParams::default(), &jukebox).await.unwrap();

        let ((scanner_server, scanner_addr), (catalog_server, catalog_addr)) = (bound().await, bound().await);
        let (scanner_listen, catalog_listen, host) =
            (scanner_addr.to_string(), catalog_addr.to_string(), registry.host());
        let scanner = vynil_scanner::Config::parse_from([
            "vynil-scanner",
            "--allow-unauthenticated",
            "--listen",
            &scanner_listen,
            "--insecure-registry",
            &host,
            "--poll-milliseconds",
            "50",
        ]);
        let mut catalog_args = vec!["vynil-catalog", "--listen", &catalog_listen];
        catalog_args.extend_from_slice(catalog_flags);
        let catalog = vynil_catalog::Config::parse_from(catalog_args);
        let shutdown = Shutdown::new();
        let mut services = tokio::task::JoinSet::new();
        let (store, done) = (Arc::new(KubeStore::new(api.client().unwrap())), shutdown.signaled());
        services.spawn(async move {
            vynil_scanner::run_with_store(scanner_server, scanner, store, done)
                .await
                .map_err(|e| e.to_string())
        });
        let (store, done) = (Arc::new(KubeStore::new(api.client().unwrap())), shutdown.signaled());
        services.spawn(async move {
            vynil_catalog::run_with_store(catalog_server, catalog, store, done)
                .await
                .map_err(|e| e.to_string())
        });
        Self { registry, api, boxes, scanner_addr, catalog_addr, shutdown, services }
    }

    /// Stops both services; each must end cleanly.
    pub async fn stop(mut self) {
        self.shutdown.trigger();
        while let Some(done) = self.services.join_next().await {
            done.unwrap().unwrap();
        }
    }
}

/// Every service of a cluster install, each on its own Kubernetes client
/// against the fake API server, with a real registry and the fake agent:
/// scanner, catalog, lifecycle (Jobs in `vynil-system`) and purger (asking
/// that lifecycle what instances use).
pub struct Stack {
    pub registry: RegistryServer,
    pub api: FakeApiServer,
    pub client: kube::Client,
    pub boxes: Api<JukeBox>,
    pub scanner: SocketAddr,
    pub catalog: SocketAddr,
    pub lifecycle: SocketAddr,
    pub purger: SocketAddr,
    /// The service token file purger and lifecycle read (what a gateway presents).
    pub token: tempfile::NamedTempFile,
    /// The one place the scanner may export indexes to (`--export-destination`).
    pub exports: tempfile::TempDir,
    shutdown: Shutdown,
    services: tokio::task::JoinSet<Result<(), String>>,
}

/// The service token of a [`Stack`].
pub const SERVICE_TOKEN: &str = "stack-service-token";

/// `request` as a gateway sends it: with the service token, naming `caller`.
pub fn as_gateway<T>(request: T, caller: &str) -> tonic::Request<T> {
    vynil_testkit::as_gateway(request, SERVICE_TOKEN, caller).unwrap()
}

impl Stack {
    /// JukeBox `box` lists `<registry>/<repository>`; nothing is published yet.
    pub async fn start(repository: &str) -> Self {
        let registry = RegistryServer::start().await.unwrap();
        let host = registry.host();
        let api = api_under_deploy_rbac().await;
        let client = api.client().unwrap();
        let boxes: Api<JukeBox> = Api::all(client.clone());
        let jukebox =
            JukeboxBuilder::new("box").list([format!("{host}/{repository}")]).schedule("0 0 1 1 *").json();
        boxes.create(&PostParams::default(), &serde_json::from_value(jukebox).unwrap()).await.unwrap();
        let ((scanner_server, scanner), (catalog_server, catalog)) = (bound().await, bound().await);
        let ((lifecycle_server, lifecycle), (purger_server, purger)) = (bound().await, bound().await);
        let token = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(token.path(), SERVICE_TOKEN).unwrap();
        let token_file = token.path().display().to_string();
        let exports = tempfile::tempdir().unwrap();
        let shutdown = Shutdown::new();
        let mut services = tokio::task::JoinSet::new();
        // Each service with its own user agent (as `vynil_kube::client`
        // gives it) and the control plane's namespace, so the request log
        // tells who asked what (e2e/tests/deploy.rs checks it against RBAC).
        let store = |service: &str| Arc::new(KubeStore::new(service_client(&api, service)));
        let config = vynil_scanner::Config::parse_from([
            "vynil-scanner",
            "--listen",
            &scanner.to_string(),
            "--insecure-registry",
            &host,
            "--poll-milliseconds",
            "50",
            "--service-token-file",
            &token_file,
            "--export-destination",
            &exports.path().display().to_string(),
        ]);
        let (s, done) = (store("vynil-scanner"), shutdown.signaled());
        services.spawn(async move {
            vynil_scanner::run_with_store(scanner_server, config, s, done).await.map_err(|e| e.to_string())
        });
        let config = vynil_catalog::Config::parse_from(["vynil-catalog", "--listen", &catalog.to_string()]);
        let (s, done) = (store("vynil-catalog"), shutdown.signaled());
        services.spawn(async move {
            vynil_catalog::run_with_store(catalog_server, config, s, done).await.map_err(|e| e.to_string())
        });
        let config = vynil_lifecycle::Config::parse_from([
            "vynil-lifecycle",
            "--listen",
            &lifecycle.to_string(),
            "--kubernetes",
            "--catalog-endpoint",
            &format!("http://{catalog}"),
            "--scanner-endpoint",
            &format!("http://{scanner}"),
            "--namespace",
            "vynil-system",
            "--insecure-registry",
            &host,
            // Only catalog changes and Job changes can explain a prompt reconcile.
            "--requeue-seconds",
            "3600",
            // A failed agent Job is final at once (no minute-long backoffs in a test).
            "--max-install-attempts",
            "1",
            "--service-token-file",
            &token_file,
        ]);
        let (c, done) = (service_client(&api, "vynil-lifecycle"), shutdown.signaled());
        services.spawn(async move {
            vynil_lifecycle::run_with_client(lifecycle_server, config, c, done)
                .await
                .map_err(|e| e.to_string())
        });
        let config = vynil_purger::Config::parse_from([
            "vynil-purger",
            "--listen",
            &purger.to_string(),
            "--insecure-registry",
            &host,
            "--lifecycle-endpoint",
            &format!("http://{lifecycle}"),
            "--service-token-file",
            &token_file,
        ]);
        let (s, done) = (store("vynil-purger"), shutdown.signaled());
        services.spawn(async move {
            vynil_purger::run_with_store(purger_server, config, s, done).await.map_err(|e| e.to_string())
        });
        Self {
            registry,
            api,
            client,
            boxes,
            scanner,
            catalog,
            lifecycle,
            purger,
            token,
            exports,
            shutdown,
            services,
        }
    }

    /// Publishes `tag` of `category/name` as `package_type` in `<category>/<name>`.
    pub async fn publish(&self, category: &str, name: &str, package_type: PackageType, tag: &str) -> String {
        let spec = PackageSpec::new(category, name, package_type, tag);
        self.registry.publisher().publish(&format!("{category}/{name}"), &spec).await.unwrap()
    }

    /// A forced full scan, waited for until the catalog shows `tags` (newest first).
    pub async fn scan_until(&self, tags: &[&str]) {
        let annotate =
            serde_json::json!({"metadata": {"annotations": {"vynil.solidite.fr/force-scan": "true"}}});
        let params = kube::api::PatchParams::default();
        self.boxes.patch("box", &params, &kube::api::Patch::Merge(&annotate)).await.unwrap();
        let mut catalog =
            vynil_proto::catalog::v1::catalog_client::CatalogClient::new(channel(self.catalog).await);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let request =
                vynil_proto::catalog::v1::GetCatalogRequest { jukebox: "box".into(), ..Default::default() };
            if let Ok(answer) = catalog.get_catalog(request).await {
                let seen: Vec<String> = answer.into_inner().packages.into_iter().map(|p| p.tag).collect();
                if seen == tags {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "the catalog never showed {tags:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// TenantInstances of namespace `apps`.
    pub fn tenant_instances(&self) -> Api<kube::api::DynamicObject> {
        tenant_instances(&self.client)
    }

    pub async fn stop(mut self) {
        self.shutdown.trigger();
        while let Some(done) = self.services.join_next().await {
            done.unwrap().unwrap();
        }
    }
}

/// TenantInstances of namespace `apps`, through `client`.
pub fn tenant_instances(client: &kube::Client) -> Api<kube::api::DynamicObject> {
    let resource = kube::api::ApiResource {
        group: "vynil.solidite.fr".into(),
        version: "v1".into(),
        api_version: "vynil.solidite.fr/v1".into(),
        kind: "TenantInstance".into(),
        plural: "tenantinstances".into(),
    };
    Api::namespaced_with(client.clone(), "apps", &resource)
}

/// The Namespace the control plane runs in (its Jobs, Lease, pull secrets).
pub const CONTROL_PLANE_NAMESPACE: &str = "vynil-system";

/// A fake API server enforcing RBAC, with the ServiceAccounts, Roles and
/// bindings of `deploy/base/rbac.yaml` loaded (in the control plane's
/// namespace, as kustomize puts them): a call a service makes without a
/// grant fails where it is made, on whatever code path makes it.
pub async fn api_under_deploy_rbac() -> FakeApiServer {
    FakeApiServer::start_under_deploy_rbac(&["apps"]).await.unwrap()
}

/// A client of `service`, as its Deployment runs it: its ServiceAccount's
/// token, its user agent, the control plane's namespace.
pub fn service_client(api: &FakeApiServer, service: &str) -> kube::Client {
    let agent = format!("{service}/{}", env!("CARGO_PKG_VERSION"));
    api.service_client(CONTROL_PLANE_NAMESPACE, service, &agent).unwrap()
}
