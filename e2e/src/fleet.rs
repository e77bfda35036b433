//! A fleet: several processes of every service, as replicas in a cluster
//! would run, each its own binary on its own loopback port, sharing one Redis
//! and the fake Kubernetes API server (`KUBECONFIG`), with a real registry
//! behind a counting front.
//!
//! What `e2e/tests/scaling.rs` starts to show that replicas cooperate, and
//! that killing, freezing or restarting one of them (or Redis) loses nothing.
//! The bench can start one too. Every replica is named (`--pod-name`,
//! `scanner-0`…): that name is in every lease it holds, so a test reads in
//! Redis or in the Lease object which process to kill.
//!
//! Each binary is found beside the test executable, and built first when it
//! is missing or older than its package's library
//! (`vynil_testkit::workspace_binary`): a fleet never runs a stale service.

use std::{path::PathBuf, time::Duration};

use kube::{Api, api::PostParams};
use vynil_crds::JukeBox;
use vynil_testkit::{
    HttpFront, JukeboxBuilder, Persistence, Readiness, RedisSentinels, RedisServer, RegistryServer,
    ServiceProcess, kube_api::FakeApiServer,
};

use crate::CONTROL_PLANE_NAMESPACE;

/// How many replicas of each service, and whether Redis persists.
#[derive(Debug, Clone)]
pub struct Shape {
    pub catalogs: usize,
    pub scanners: usize,
    pub purgers: usize,
    pub lifecycles: usize,
    /// Each gateway talks to one replica of every service: with gateways,
    /// every service needs a replica (the others may have none).
    pub gateways: usize,
    pub persistence: Persistence,
    /// Redis in Sentinel mode (a primary, two replicas, three sentinels,
    /// without persistence) instead of one server.
    pub sentinel: bool,
    /// The scan lease and the purger's execution lease (seconds).
    pub lease_seconds: u64,
    /// Lifecycle's `--requeue-seconds` and `--max-running-jobs`.
    pub requeue_seconds: u64,
    pub max_running_jobs: usize,
}

impl Default for Shape {
    /// The shape of the scaling test: 3 catalogs, 2 of every other service,
    /// Redis with its append-only file as `deploy/` runs it.
    fn default() -> Self {
        Self {
            catalogs: 3,
            scanners: 2,
            purgers: 2,
            lifecycles: 2,
            gateways: 2,
            persistence: Persistence::AppendOnly,
            sentinel: false,
            lease_seconds: 3,
            requeue_seconds: 3600,
            max_running_jobs: 4,
        }
    }
}

/// See the module documentation.
pub struct Fleet {
    pub registry: RegistryServer,
    /// In front of the registry: what every service reaches, and counts.
    pub front: HttpFront,
    pub redis: SharedRedis,
    pub api: FakeApiServer,
    pub boxes: Api<JukeBox>,
    pub catalogs: Vec<ServiceProcess>,
    pub scanners: Vec<ServiceProcess>,
    pub lifecycles: Vec<ServiceProcess>,
    pub purgers: Vec<ServiceProcess>,
    pub gateways: Vec<ServiceProcess>,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").field("dir", &self.dir.path()).finish_non_exhaustive()
    }
}

/// The Redis every replica shares.
#[derive(Debug)]
pub enum SharedRedis {
    Single(RedisServer),
    Sentinel(RedisSentinels),
}

impl SharedRedis {
    /// The single server (a test of restarts).
    pub fn single(&mut self) -> &mut RedisServer {
        match self {
            SharedRedis::Single(server) => server,
            SharedRedis::Sentinel(_) => panic!("this fleet's Redis is in Sentinel mode"),
        }
    }

    /// The Sentinel set (a test of failovers).
    pub fn sentinels(&mut self) -> &mut RedisSentinels {
        match self {
            SharedRedis::Sentinel(set) => set,
            SharedRedis::Single(_) => panic!("this fleet's Redis is a single server"),
        }
    }

    /// The URL of the primary now.
    pub async fn primary_url(&self) -> String {
        match self {
            SharedRedis::Single(server) => server.url(),
            SharedRedis::Sentinel(set) => RedisSentinels::url(set.primary().await.unwrap()),
        }
    }

    /// The flags that point a service at it.
    fn flags(&self) -> Vec<String> {
        match self {
            SharedRedis::Single(server) => vec!["--redis-url".into(), server.url()],
            SharedRedis::Sentinel(set) => set.service_args(),
        }
    }
}

/// Service binary `name` (its package has the same name), never stale.
pub fn binary(name: &str) -> PathBuf {
    vynil_testkit::workspace_binary(name, name).unwrap()
}

impl Fleet {
    /// JukeBox `box` lists `<front>/<repository>` for each of `repositories`
    /// (nothing is published yet); gateways accept the tokens of `tokens_yaml`
    /// (a tokens file, `TokenBook::line` entries).
    pub async fn start(shape: &Shape, repositories: &[&str], tokens_yaml: &str) -> Self {
        let registry = RegistryServer::start().await.unwrap();
        let front = HttpFront::start(&registry.base_url()).await.unwrap();
        let redis = if shape.sentinel {
            SharedRedis::Sentinel(RedisSentinels::start(2).await.unwrap())
        } else {
            SharedRedis::Single(RedisServer::start_with(shape.persistence).await.unwrap())
        };
        let api = FakeApiServer::start().await.unwrap();
        api.create_namespaces(&["vynil-system", "apps"]).unwrap();
        let boxes: Api<JukeBox> = Api::all(api.client().unwrap());
        let images: Vec<String> = repositories.iter().map(|r| format!("{}/{r}", front.host())).collect();
        let jukebox = JukeboxBuilder::new("box").list(images).schedule("0 0 1 1 *").json();
        boxes.create(&PostParams::default(), &serde_json::from_value(jukebox).unwrap()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = api.write_kubeconfig(dir.path(), CONTROL_PLANE_NAMESPACE).unwrap();
        std::fs::write(dir.path().join("service-token"), crate::SERVICE_TOKEN).unwrap();
        std::fs::write(dir.path().join("tokens.yaml"), tokens_yaml).unwrap();
        let mut fleet = Self {
            registry,
            front,
            redis,
            api,
            boxes,
            catalogs: Vec::new(),
            scanners: Vec::new(),
            lifecycles: Vec::new(),
            purgers: Vec::new(),
            gateways: Vec::new(),
            dir,
        };
        let env = [("KUBECONFIG", kubeconfig.display().to_string())];
        let lease = shape.lease_seconds.to_string();
        let (requeue, jobs) = (shape.requeue_seconds.to_string(), shape.max_running_jobs.to_string());
        let cluster = fleet.cluster_flags();
        let start = |name: &'static str, args: Vec<String>| {
            let env = env.clone();
            async move {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
                ServiceProcess::launch(&binary(name), &args, &env, Readiness::Grpc).await.unwrap()
            }
        };
        let catalogs =
            (0..shape.catalogs).map(|i| start("vynil-catalog", with(&cluster, &format!("catalog-{i}"), &[])));
        fleet.catalogs = futures::future::join_all(catalogs).await;
        let scanners = (0..shape.scanners).map(|i| {
            let own = ["--scan-lease-seconds", &lease, "--poll-milliseconds", "100"];
            start("vynil-scanner", with(&cluster, &format!("scanner-{i}"), &own))
        });
        fleet.scanners = futures::future::join_all(scanners).await;
        let lifecycles = (0..shape.lifecycles).map(|i| {
            let catalog = fleet.catalogs[i % fleet.catalogs.len()].endpoint();
            let own = [
                "--catalog-endpoint",
                &catalog,
                "--namespace",
                CONTROL_PLANE_NAMESPACE,
                "--lease-seconds",
                &lease,
                "--requeue-seconds",
                &requeue,
                "--max-running-jobs",
                &jobs,
            ];
            start("vynil-lifecycle", with(&cluster, &format!("lifecycle-{i}"), &own))
        });
        fleet.lifecycles = futures::future::join_all(lifecycles).await;
        let purgers = (0..shape.purgers).map(|i| {
            let lifecycle = fleet.lifecycles[i % fleet.lifecycles.len()].endpoint();
            let own = [
                "--lifecycle-endpoint",
                &lifecycle,
                "--execution-lease-seconds",
                &lease,
                "--registry-timeout-seconds",
                "1",
            ];
            start("vynil-purger", with(&cluster, &format!("purger-{i}"), &own))
        });
        fleet.purgers = futures::future::join_all(purgers).await;
        let tokens = fleet.dir.path().join("tokens.yaml").display().to_string();
        let service_token = fleet.dir.path().join("service-token").display().to_string();
        let gateways = (0..shape.gateways).map(|i| {
            let pick = |replicas: &[ServiceProcess]| replicas[i % replicas.len()].endpoint();
            let args = vec![
                "--catalog-endpoint".to_string(),
                pick(&fleet.catalogs),
                "--scanner-endpoint".into(),
                pick(&fleet.scanners),
                "--purger-endpoint".into(),
                pick(&fleet.purgers),
                "--lifecycle-endpoint".into(),
                pick(&fleet.lifecycles),
                "--tokens-file".into(),
                tokens.clone(),
                "--service-token-file".into(),
                service_token.clone(),
            ];
            async move {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let ready = Readiness::Http("/healthz".into());
                ServiceProcess::launch(&binary("vynil-gateway"), &args, &[], ready).await.unwrap()
            }
        });
        fleet.gateways = futures::future::join_all(gateways).await;
        fleet
    }

    /// The flags every stateful replica shares: the cluster through the
    /// kubeconfig, the shared Redis, the registry front over plain http, the
    /// service token.
    fn cluster_flags(&self) -> Vec<String> {
        let token = self.dir.path().join("service-token").display().to_string();
        let mut flags: Vec<String> =
            ["--kubernetes", "--insecure-registry", &self.front.host(), "--service-token-file", &token]
                .iter()
                .map(|s| s.to_string())
                .collect();
        flags.extend(self.redis.flags());
        flags
    }

    /// The base URL of gateway `index`.
    pub fn gateway(&self, index: usize) -> String {
        self.gateways[index].endpoint()
    }

    /// Publishes `tag` of `apps/<name>` as a tenant package in `apps/<name>`.
    pub async fn publish(&self, name: &str, tag: &str) -> String {
        let spec = vynil_testkit::PackageSpec::new("apps", name, vynil_testkit::PackageType::Tenant, tag);
        self.registry.publisher().publish(&format!("apps/{name}"), &spec).await.unwrap()
    }

    /// The replica (by pod name) holding the scan lease of JukeBox `box`, if any.
    pub async fn scan_lease_holder(&self) -> Option<String> {
        let client = redis::Client::open(self.redis.primary_url().await).ok()?;
        let mut connection = client.get_multiplexed_async_connection().await.ok()?;
        let token: Option<String> =
            redis::cmd("GET").arg("vynil:v1:scanner:lease:box").query_async(&mut connection).await.ok()?;
        Some(token?.rsplit_once(':')?.0.to_string())
    }

    /// How long the scan lease of JukeBox `box` has left (Redis's PTTL), if held.
    pub async fn scan_lease_remaining(&self) -> Option<Duration> {
        let client = redis::Client::open(self.redis.primary_url().await).ok()?;
        let mut connection = client.get_multiplexed_async_connection().await.ok()?;
        let left: i64 =
            redis::cmd("PTTL").arg("vynil:v1:scanner:lease:box").query_async(&mut connection).await.ok()?;
        u64::try_from(left).ok().map(Duration::from_millis)
    }

    /// The replica (by pod name) holding the lifecycle's leader Lease, if any.
    pub fn lifecycle_leader(&self) -> Option<String> {
        let lease = self.api.object(
            "coordination.k8s.io",
            "leases",
            Some(CONTROL_PLANE_NAMESPACE),
            "vynil-lifecycle",
        )?;
        lease["spec"]["holderIdentity"].as_str().map(str::to_string)
    }

    /// The replica of `replicas` whose pod name is `pod` (`scanner-1` → index 1).
    pub fn index_of(pod: &str) -> usize {
        pod.rsplit_once('-')
            .and_then(|(_, i)| i.parse().ok())
            .unwrap_or_else(|| panic!("not a pod name: {pod}"))
    }

    /// How long a lease taken now surely expired, with a poll to notice it.
    pub fn lease_expiry(shape: &Shape) -> Duration {
        Duration::from_secs(shape.lease_seconds) + Duration::from_millis(500)
    }
}

/// `shared` flags, then `--pod-name pod`, then `own`.
fn with(shared: &[String], pod: &str, own: &[&str]) -> Vec<String> {
    let mut args = shared.to_vec();
    args.extend(["--pod-name".to_string(), pod.to_string()]);
    args.extend(own.iter().map(|s| s.to_string()));
    args
}
