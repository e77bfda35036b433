//! The purger against a real registry and a real Redis, through its real gRPC
//! API (the binary as a process), asking the real lifecycle (its binary on
//! the fake API server) what runs, and the test kit's front counting and
//! failing requests. A lifecycle that cannot answer is a closed port.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::{collections::BTreeSet, path::Path, sync::Arc, time::Duration};

use axum::http::Method;
use tonic::{Request, Status};
use vynil_crds::ServiceInstance;
use vynil_proto::{
    lifecycle::v1::{ListInstalledRevisionsRequest, lifecycle_client::LifecycleClient},
    purger::v1::{
        DeletionState, ExecuteRequest, GetReportRequest, PlanRequest, PurgePlan, PurgeReport, ReportState,
        Repository, execute_progress::Event, plan_request::Target, purger_client::PurgerClient,
    },
};
use vynil_testkit::{
    ArtifactKind, Fault, FaultAction, HttpFront, PackageSpec, PackageType, RedisServer, RegistryServer,
    ServiceProcess, SignatureLayer, Signer, kube_api::FakeApiServer,
};

const REPO: &str = "think/ollama";

/// The upstream #12 history with channels, waypoints, signatures, an alias of
/// a kept digest, `latest` on its own digest and a version without annotations.
async fn publish_history(registry: &RegistryServer) {
    let p = registry.publisher();
    let spec = |kind, tag: &str| PackageSpec::new("think", "ollama", kind, tag);
    use PackageType::{Service, Tenant};
    let d015 = p.publish(REPO, &spec(Tenant, "0.1.5")).await.unwrap();
    let d018 = p.publish(REPO, &spec(Tenant, "0.1.8").min("0.1.0")).await.unwrap();
    p.publish(REPO, &spec(Service, "0.1.9").min("0.1.8")).await.unwrap();
    let d0110 = p.publish(REPO, &spec(Service, "0.1.10")).await.unwrap();
    p.publish(REPO, &spec(Service, "0.2.0-beta.1").min("0.1.8")).await.unwrap();
    p.publish(REPO, &spec(Service, "0.2.0-beta.2").min("0.1.8")).await.unwrap();
    p.publish(REPO, &spec(Service, "0.3.0-alpha.1").min("0.1.8")).await.unwrap();
    p.publish_plain(REPO, "0.1.7").await.unwrap();
    p.publish_plain(REPO, "latest").await.unwrap();
    p.alias(REPO, "0.1.10", "stable").await.unwrap();
    // Real cosign signatures, by the key `signer()` (#50: a purge keeps them with their revision).
    let reference = format!("{}/{REPO}", registry.host());
    for digest in [&d015, &d018, &d0110] {
        p.sign(REPO, digest, &[SignatureLayer::by(&signer(), &reference, digest)]).await.unwrap();
    }
}

fn signer() -> Signer {
    Signer::from_label("release")
}

/// The verdict on `digest`'s signature in the registry, under `signer()`'s key.
async fn verdict(registry: &RegistryServer, digest: &str) -> vynil_rules::signature::Verdict {
    use vynil_registry::{
        CredentialStore, InMemoryMetadataCache, RegistryClient, RepositoryRef, TransportConfig,
    };
    let client = RegistryClient::new(
        TransportConfig { insecure_registries: vec![registry.host()], ..TransportConfig::default() },
        CredentialStore::default(),
        Arc::new(InMemoryMetadataCache::default()),
    )
    .unwrap();
    let keys = vynil_rules::signature::Keyring::parse([("release", signer().public_pem().as_str())]).unwrap();
    let repo = RepositoryRef::new(&registry.host(), REPO).unwrap();
    let listed: std::collections::HashSet<String> = tags(registry).await.into_iter().collect();
    client.signature_verdict(&repo, digest, &keys, Some(&listed)).await.unwrap()
}

fn sig_of(registry: &RegistryServer, tag_digest: &str) -> String {
    let _ = registry;
    ArtifactKind::Signature.tag_for(tag_digest)
}

async fn tags(registry: &RegistryServer) -> BTreeSet<String> {
    let body: serde_json::Value = reqwest::get(format!("{}/v2/{REPO}/tags/list", registry.base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["tags"]
        .as_array()
        .map(|a| a.iter().map(|t| t.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

async fn digest_of(registry: &RegistryServer, tag: &str) -> Option<String> {
    let response = reqwest::Client::new()
        .head(format!("{}/v2/{REPO}/manifests/{tag}", registry.base_url()))
        .header("Accept", "application/vnd.oci.image.manifest.v1+json")
        .send()
        .await
        .unwrap();
    (response.status() == 200)
        .then(|| response.headers()["docker-content-digest"].to_str().unwrap().to_string())
}

/// The real lifecycle: its binary, on the fake API server, where a test
/// records which instances run what (`status.package`, as lifecycle writes
/// it once an install succeeded). It installs nothing here: its catalog is
/// a closed port and it requeues once a day.
struct RealLifecycle {
    api: FakeApiServer,
    process: ServiceProcess,
    _dir: tempfile::TempDir,
}

impl RealLifecycle {
    async fn start() -> Self {
        Self::on(FakeApiServer::start().await.unwrap()).await
    }

    async fn on(api: FakeApiServer) -> Self {
        api.create_namespaces(&["vynil-system", "ai"]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = api.write_kubeconfig(dir.path(), "vynil-system").unwrap().display().to_string();
        std::fs::write(dir.path().join("service-token"), SERVICE_TOKEN).unwrap();
        let token = dir.path().join("service-token").display().to_string();
        let closed = format!("http://127.0.0.1:{}", closed_port());
        let binary = vynil_testkit::workspace_binary("vynil-lifecycle", "vynil-lifecycle").unwrap();
        let args = ["--kubernetes", "--namespace", "vynil-system", "--service-token-file", &token];
        let args = [&args[..], &["--catalog-endpoint", &closed, "--requeue-seconds", "86400"]].concat();
        let process = ServiceProcess::start_with_env(&binary, &args, &[("KUBECONFIG", kubeconfig.as_str())])
            .await
            .unwrap();
        Self { api, process, _dir: dir }
    }

    fn endpoint(&self) -> String {
        self.process.endpoint()
    }

    /// Service instance `ai/<name>` recorded as running `<registry>/<REPO>:<tag>`.
    async fn runs(&self, name: &str, registry: &str, tag: &str) {
        let instances: kube::Api<ServiceInstance> = kube::Api::namespaced(self.api.client().unwrap(), "ai");
        let instance = serde_json::json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "ServiceInstance",
            "metadata": {"name": name, "namespace": "ai"},
            "spec": {"jukebox": "box", "category": "think", "package": "ollama"}});
        instances.create(&Default::default(), &serde_json::from_value(instance).unwrap()).await.unwrap();
        let status = serde_json::json!({"status": {"tag": tag, "package":
            {"registry": registry, "image": REPO, "tag": tag, "type": "service"}}});
        instances.patch_status(name, &Default::default(), &kube::api::Patch::Merge(&status)).await.unwrap();
        // Answered once lifecycle's own view of the cluster has it.
        let client = LifecycleClient::new(self.process.channel().await.unwrap());
        vynil_testkit::eventually(&format!("lifecycle to see ai/{name}"), || {
            let mut client = client.clone();
            let mut request = Request::new(ListInstalledRevisionsRequest::default());
            vynil_runtime::ServiceCredentials::new(Some(SERVICE_TOKEN))
                .unwrap()
                .apply(&mut request, "purger");
            async move {
                let answer = client.list_installed_revisions(request).await.ok()?.into_inner();
                answer.revisions.iter().any(|r| r.tag == tag).then_some(())
            }
        })
        .await;
    }
}

/// A loopback port nothing listens on (bound, then closed: a connection is refused).
fn closed_port() -> u16 {
    vynil_testkit::free_port().unwrap()
}

struct Setup {
    registry: RegistryServer,
    front: HttpFront,
    redis: RedisServer,
    /// The service token file the purgers read (the gateway's token).
    token: tempfile::NamedTempFile,
    /// JukeBox `box`, whose source lists the repository: the purger plans
    /// only repositories a JukeBox names.
    jukeboxes: tempfile::TempDir,
}

const SERVICE_TOKEN: &str = "purger-test-service-token";

async fn setup() -> Setup {
    let registry = RegistryServer::start().await.unwrap();
    publish_history(&registry).await;
    let front = HttpFront::start(&registry.base_url()).await.unwrap();
    let redis = RedisServer::start().await.unwrap();
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), SERVICE_TOKEN).unwrap();
    let jukeboxes = tempfile::tempdir().unwrap();
    let jukebox =
        vynil_testkit::JukeboxBuilder::new("box").list(vec![format!("{}/{REPO}", front.host())]).json();
    std::fs::write(jukeboxes.path().join("box.yaml"), jukebox.to_string()).unwrap();
    Setup { registry, front, redis, token, jukeboxes }
}

async fn purger(setup: &Setup, lifecycle: &str, extra: &[&str]) -> ServiceProcess {
    let (redis, front) = (setup.redis.url(), setup.front.host());
    let token = setup.token.path().display().to_string();
    let jukeboxes = setup.jukeboxes.path().display().to_string();
    let mut args = vec!["--redis-url", &redis, "--insecure-registry", &front, "--service-token-file", &token];
    if !extra.contains(&"--jukebox-dir") {
        args.extend(["--jukebox-dir", &jukeboxes]);
    }
    if !extra.contains(&"--vynil-version") {
        args.extend(["--vynil-version", "0.8.0"]);
    }
    args.extend([
        "--lifecycle-endpoint",
        lifecycle,
        "--execution-lease-seconds",
        "3",
        "--registry-timeout-seconds",
        "1",
    ]);
    args.extend(extra);
    ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-purger")), &args).await.unwrap()
}

async fn make_plan(client: &mut PurgerClient<tonic::transport::Channel>, host: &str) -> PurgePlan {
    let target = Target::Repository(Repository { registry: host.into(), repository: REPO.into() });
    client.plan(as_gateway(PlanRequest { target: Some(target) })).await.unwrap().into_inner()
}

/// `request` as the gateway sends it: with the service token, naming alice.
fn as_gateway<T>(request: T) -> Request<T> {
    vynil_testkit::as_gateway(request, SERVICE_TOKEN, "alice@example").unwrap()
}

fn execute_request(plan: &PurgePlan) -> Request<ExecuteRequest> {
    let mut request = Request::new(ExecuteRequest {
        plan_id: plan.plan_id.clone(),
        confirm: plan.target.clone(),
        fingerprint: plan.fingerprint.clone(),
        acknowledge_usage_unknown: false,
    });
    vynil_runtime::ServiceCredentials::new(Some(SERVICE_TOKEN)).unwrap().apply(&mut request, "alice@example");
    request
}

async fn execute(
    client: &mut PurgerClient<tonic::transport::Channel>,
    request: Request<ExecuteRequest>,
) -> Result<PurgeReport, Status> {
    let mut stream = client.execute(request).await?.into_inner();
    while let Some(progress) = stream.message().await? {
        if let Some(Event::Report(report)) = progress.event {
            return Ok(report);
        }
    }
    panic!("the execution stream ended without a report");
}

fn entry<'a>(plan: &'a PurgePlan, tag: &str) -> &'a vynil_proto::purger::v1::PlanEntry {
    plan.entries.iter().find(|e| e.tag == tag).unwrap_or_else(|| panic!("no entry {tag}"))
}

#[tokio::test]
async fn a_multi_type_history_is_purged_to_exactly_what_consumers_can_be_shown() {
    let setup = setup().await;
    let lifecycle = RealLifecycle::start().await;
    let service = purger(&setup, &lifecycle.endpoint(), &[]).await;
    let mut client = PurgerClient::new(service.channel().await.unwrap());
    let before_views = views(&setup.registry).await;

    let plan = make_plan(&mut client, &setup.front.host()).await;
    assert!(!plan.usage_unknown);
    let d015 = digest_of(&setup.registry, "0.1.5").await.unwrap();
    let d018 = digest_of(&setup.registry, "0.1.8").await.unwrap();
    let d0110 = digest_of(&setup.registry, "0.1.10").await.unwrap();
    let deleted: BTreeSet<String> = plan.entries.iter().filter(|e| !e.keep).map(|e| e.tag.clone()).collect();
    let expected_deleted: BTreeSet<String> =
        ["0.2.0-beta.1", "0.1.9", "0.1.5", &sig_of(&setup.registry, &d015)]
            .iter()
            .map(|s| s.to_string())
            .collect();
    assert_eq!(deleted, expected_deleted);
    assert_eq!(plan.delete_count, 4);
    assert_eq!(plan.keep_count, 9);
    assert_eq!(
        entry(&plan, "0.1.10").reasons,
        [
            "head of stable",
            "waypoint reachable from any version (beta)",
            "waypoint reachable from any version (alpha)"
        ]
    );
    assert_eq!(entry(&plan, "0.2.0-beta.2").reasons, ["head of beta"]);
    assert_eq!(entry(&plan, "0.3.0-alpha.1").reasons, ["head of alpha", "last service revision"]);
    assert!(entry(&plan, "0.1.8").reasons.contains(&"last tenant revision".to_string()));
    assert_eq!(entry(&plan, "stable").reasons, ["alias of 0.1.10 (same digest)"]);
    assert_eq!(entry(&plan, "latest").reasons, ["unmanaged"]);
    assert_eq!(entry(&plan, "0.1.7").reasons, ["unmanaged"]);
    assert_eq!(entry(&plan, &sig_of(&setup.registry, &d0110)).reasons, ["signature of 0.1.10"]);
    assert_eq!(entry(&plan, "0.1.5").reasons, ["superseded"]);

    // Straight to the purger without the gateway's service token: refused,
    // whoever the request claims to be; with a wrong token too.
    let mut anonymous = execute_request(&plan);
    anonymous.metadata_mut().remove("authorization");
    let refused = execute(&mut client, anonymous).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let mut forged = execute_request(&plan);
    forged.metadata_mut().insert("authorization", "Bearer guessed".parse().unwrap());
    assert_eq!(execute(&mut client, forged).await.unwrap_err().code(), tonic::Code::Unauthenticated);
    assert_eq!(tags(&setup.registry).await.len(), 13, "nothing was deleted");

    let report = execute(&mut client, execute_request(&plan)).await.unwrap();
    assert_eq!(report.executed_by, "alice@example");
    assert_eq!(report.fingerprint, plan.fingerprint);
    assert_eq!(report.outcomes.len(), 4, "one DELETE per digest");
    assert!(report.outcomes.iter().all(|o| o.state == DeletionState::Deleted as i32), "{report:?}");

    let kept: BTreeSet<String> = plan.entries.iter().filter(|e| e.keep).map(|e| e.tag.clone()).collect();
    assert_eq!(tags(&setup.registry).await, kept, "the registry holds exactly the kept set");
    for digest in [&d018, &d0110] {
        assert!(
            verdict(&setup.registry, digest).await.is_verified(),
            "a kept revision's signature was removed or broken"
        );
    }
    assert_eq!(views(&setup.registry).await, before_views, "the scanner's view is unchanged");
    let stored =
        client.get_report(GetReportRequest { plan_id: plan.plan_id.clone() }).await.unwrap().into_inner();
    assert_eq!(stored, report);
}

/// What every channel is shown, computed by the rules from the registry.
async fn views(registry: &RegistryServer) -> Vec<Vec<String>> {
    use vynil_registry::{
        CredentialStore, InMemoryMetadataCache, ManifestMetadata, RegistryClient, RepositoryRef,
        TransportConfig,
    };
    let client = RegistryClient::new(
        TransportConfig { insecure_registries: vec![registry.host()], ..TransportConfig::default() },
        CredentialStore::default(),
        Arc::new(InMemoryMetadataCache::default()),
    )
    .unwrap();
    let repo = RepositoryRef::new(&registry.host(), REPO).unwrap();
    let tags = client.list_tags(&repo).await.unwrap();
    let mut contents = std::collections::HashMap::new();
    for tag in &tags {
        if let Some(meta) = client.tag_metadata(&repo, tag).await.unwrap()
            && let ManifestMetadata::Vynil(content) = meta.metadata
        {
            contents.insert(tag.clone(), *content);
        }
    }
    vynil_rules::Channel::ALL
        .iter()
        .map(|channel| {
            let viewer = vynil_rules::Viewer { channel: *channel, framework: semver::Version::new(0, 8, 0) };
            vynil_rules::compute_view(tags.iter().map(String::as_str), &viewer, true, |t| {
                contents.get(t.as_str())
            })
            .tags()
            .into_iter()
            .map(String::from)
            .collect()
        })
        .collect()
}

#[tokio::test]
async fn an_installed_revision_is_kept_and_unknown_usage_needs_an_acknowledgement() {
    let setup = setup().await;
    let lifecycle = RealLifecycle::start().await;
    lifecycle.runs("llm", &setup.front.host(), "0.1.9").await;
    let service = purger(&setup, &lifecycle.endpoint(), &[]).await;
    let mut client = PurgerClient::new(service.channel().await.unwrap());
    let plan = make_plan(&mut client, &setup.front.host()).await;
    assert!(entry(&plan, "0.1.9").keep, "the rules alone would delete it");
    assert_eq!(entry(&plan, "0.1.9").reasons, ["installed by service ai/llm"]);

    // Lifecycle unreachable: usage unknown, and Execute needs the acknowledgement.
    let closed = format!("http://127.0.0.1:{}", closed_port());
    let blind = purger(&setup, &closed, &[]).await;
    let mut client = PurgerClient::new(blind.channel().await.unwrap());
    let plan = make_plan(&mut client, &setup.front.host()).await;
    assert!(plan.usage_unknown);
    let before = tags(&setup.registry).await;
    let status = execute(&mut client, execute_request(&plan)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("acknowledge_usage_unknown"), "{status:?}");
    assert_eq!(tags(&setup.registry).await, before, "nothing deleted");
}

/// Attack (security review item 4): a repository written another way than
/// the one its instances were installed under (here the host in capitals,
/// as `DOCKER.IO` or `index.docker.io/library/…` are for Docker Hub) is the
/// same repository, so its plan keeps what is installed and its exclusion
/// holds; the registry client reaches the same repository either way.
#[tokio::test]
async fn a_plan_under_an_alias_keeps_what_is_installed() {
    let setup = setup().await;
    let port = setup.front.host().rsplit_once(':').unwrap().1.to_string();
    let (written, alias) = (format!("localhost:{port}"), format!("LOCALHOST:{port}"));
    let lifecycle = RealLifecycle::start().await;
    lifecycle.runs("llm", &written, "0.1.9").await;
    let dir = tempfile::tempdir().unwrap();
    let retention = dir.path().join("retention.yaml");
    std::fs::write(&retention, "excluded_repositories: []\n").unwrap();
    let retention_flag = retention.to_str().unwrap().to_string();
    // The JukeBox names it under the written name: planned under the alias, it is still named.
    let jukebox = vynil_testkit::JukeboxBuilder::new("box").list(vec![format!("{written}/{REPO}")]).json();
    std::fs::create_dir(dir.path().join("jukeboxes")).unwrap();
    std::fs::write(dir.path().join("jukeboxes/box.yaml"), jukebox.to_string()).unwrap();
    let jukeboxes = dir.path().join("jukeboxes").to_str().unwrap().to_string();
    let flags =
        ["--insecure-registry", &written, "--retention-config", &retention_flag, "--jukebox-dir", &jukeboxes];
    let service = purger(&setup, &lifecycle.endpoint(), &flags).await;
    let mut client = PurgerClient::new(service.channel().await.unwrap());
    // Issue #66 item 3: a trailing dot and the default port are aliases too,
    // and every plan is of the JukeBox's own entry, whatever the caller wrote.
    for other in [format!("localhost.:{port}"), format!("LocalHost.:{port}")] {
        let plan = make_plan(&mut client, &other).await;
        assert_eq!(plan.target, format!("{written}/{REPO}"), "planned as the JukeBox writes it");
        assert!(entry(&plan, "0.1.9").keep, "installed under {written}, planned under {other}: {plan:?}");
    }
    let plan = make_plan(&mut client, &alias).await;
    assert_eq!(plan.target, format!("{written}/{REPO}"));
    assert!(entry(&plan, "0.1.9").keep, "installed under {written}, planned under {alias}: {plan:?}");
    assert_eq!(entry(&plan, "0.1.9").reasons, ["installed by service ai/llm"]);

    // Excluded under one name, refused under the other (plan and execute).
    std::fs::write(&retention, format!("excluded_repositories: ['{written}/{REPO}']\n")).unwrap();
    let target = Target::Repository(Repository { registry: alias.clone(), repository: REPO.into() });
    let status = client.plan(as_gateway(PlanRequest { target: Some(target) })).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("excluded"), "{status:?}");
    let before = tags(&setup.registry).await;
    let status = execute(&mut client, execute_request(&plan)).await.unwrap_err();
    assert!(status.message().contains("excluded"), "{status:?}");
    assert_eq!(tags(&setup.registry).await, before, "nothing deleted");
}

/// Security review item 8: executing a completed plan again (anyone with the
/// role may) does not rewrite who executed it; the later execution is
/// recorded beside the first.
#[tokio::test]
async fn a_plan_executed_again_keeps_who_executed_it_first() {
    let setup = setup().await;
    let lifecycle = RealLifecycle::start().await;
    let service = purger(&setup, &lifecycle.endpoint(), &[]).await;
    let mut client = PurgerClient::new(service.channel().await.unwrap());
    let plan = make_plan(&mut client, &setup.front.host()).await;
    let first = execute(&mut client, execute_request(&plan)).await.unwrap();
    assert_eq!(first.executed_by, "alice@example");
    assert!(first.later_executions.is_empty(), "{first:?}");

    let mut again = execute_request(&plan);
    vynil_runtime::ServiceCredentials::new(Some(SERVICE_TOKEN)).unwrap().apply(&mut again, "mallory@example");
    let second = execute(&mut client, again).await.unwrap();
    assert_eq!(
        (second.executed_by.as_str(), second.started_at.as_str()),
        ("alice@example", first.started_at.as_str())
    );
    let later: Vec<&str> = second.later_executions.iter().map(|a| a.by.as_str()).collect();
    assert_eq!(later, ["mallory@example"]);
    let stored =
        client.get_report(GetReportRequest { plan_id: plan.plan_id.clone() }).await.unwrap().into_inner();
    assert_eq!(stored, second);
}

/// The purger reads, and an admin may delete in, only repositories the
/// control plane was given: a repository no JukeBox's source names (on a
/// registry it knows, or on any host a caller makes up) is refused as not
/// found before any registry is asked.
#[tokio::test]
async fn a_repository_no_jukebox_names_is_refused_before_any_registry_is_read() {
    let setup = setup().await;
    let lifecycle = RealLifecycle::start().await;
    let service = purger(&setup, &lifecycle.endpoint(), &[]).await;
    let mut client = PurgerClient::new(service.channel().await.unwrap());
    for (registry, repository) in [(setup.front.host(), "other/app"), ("0".to_string(), "0")] {
        let target =
            Target::Repository(Repository { registry: registry.clone(), repository: repository.into() });
        let status = client.plan(as_gateway(PlanRequest { target: Some(target) })).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound, "{registry}: {status:?}");
        assert!(status.message().contains("in no JukeBox's source"), "{status:?}");
    }
    assert!(setup.front.seen().is_empty(), "a registry was read: {:?}", setup.front.seen());
    // The repository its JukeBox names is planned.
    let plan = make_plan(&mut client, &setup.front.host()).await;
    assert!(!plan.entries.is_empty());
}

/// Security review item 8: a repository of more tags than the cap is
/// refused while it is being listed, before any manifest is read, so a
/// plan never holds an unbounded list.
#[tokio::test]
async fn a_repository_over_the_tag_cap_is_refused_before_it_is_read() {
    let setup = setup().await;
    let lifecycle = RealLifecycle::start().await;
    let service = purger(&setup, &lifecycle.endpoint(), &["--max-tags-per-repository", "5"]).await;
    let mut client = PurgerClient::new(service.channel().await.unwrap());
    let target = Target::Repository(Repository { registry: setup.front.host(), repository: REPO.into() });
    let status = client.plan(as_gateway(PlanRequest { target: Some(target) })).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("--max-tags-per-repository"), "{status:?}");
    assert_eq!(setup.front.count(&Method::GET, "/manifests/"), 0, "no manifest read");
    assert_eq!(setup.front.count(&Method::HEAD, "/manifests/"), 0, "no manifest read");
}

#[tokio::test]
async fn a_wrong_confirm_a_wrong_fingerprint_or_a_tag_pushed_since_planning_deletes_nothing() {
    let setup = setup().await;
    let lifecycle = RealLifecycle::start().await;
    let service = purger(&setup, &lifecycle.endpoint(), &[]).await;
    let mut client = PurgerClient::new(service.channel().await.unwrap());
    let plan = make_plan(&mut client, &setup.front.host()).await;
    let before = tags(&setup.registry).await;

    let mut wrong_target = execute_request(&plan);
    wrong_target.get_mut().confirm = format!("{}/other", setup.front.host());
    let status = execute(&mut client, wrong_target).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(status.message().contains("confirm must name the target"), "{status:?}");

    let mut wrong_fingerprint = execute_request(&plan);
    wrong_fingerprint.get_mut().fingerprint = "sha256:0000".into();
    let status = execute(&mut client, wrong_fingerprint).await.unwrap_err();
    assert!(status.message().contains("fingerprint does not match"), "{status:?}");
    assert_eq!(tags(&setup.registry).await, before);

    setup
        .registry
        .publisher()
        .publish(REPO, &PackageSpec::new("think", "ollama", PackageType::Service, "0.4.0"))
        .await
        .unwrap();
    let before = tags(&setup.registry).await;
    let status = execute(&mut client, execute_request(&plan)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(status.message().contains("0.4.0 was pushed since planning"), "{status:?}");
    assert_eq!(tags(&setup.registry).await, before, "nothing deleted");
    assert_eq!(setup.front.count(&Method::DELETE, "/manifests/"), 0);
}

#[tokio::test]
async fn failed_deletes_are_reported_with_their_status_nothing_reported_deleted_remains_and_all_converge() {
    for (action, status, code) in [
        (FaultAction::Status(500), 500, "INJECTED"),
        (FaultAction::TooManyRequests { retry_after_secs: 0 }, 429, "TOOMANYREQUESTS"),
    ] {
        let setup = setup().await;
        let lifecycle = RealLifecycle::start().await;
        let service = purger(&setup, &lifecycle.endpoint(), &[]).await;
        let mut client = PurgerClient::new(service.channel().await.unwrap());
        let plan = make_plan(&mut client, &setup.front.host()).await;
        let d015 = digest_of(&setup.registry, "0.1.5").await.unwrap();
        setup.front.inject(Fault::new(Some(Method::DELETE), &d015, usize::MAX, action));

        let report = execute(&mut client, execute_request(&plan)).await.unwrap();
        let failed: Vec<_> =
            report.outcomes.iter().filter(|o| o.state == DeletionState::Failed as i32).collect();
        assert_eq!(failed.len(), 1, "{status}: {report:?}");
        assert_eq!(failed[0].digest, d015);
        assert_eq!(failed[0].http_status, status);
        assert_eq!(failed[0].error_code, code, "{status}: {report:?}");
        for outcome in report.outcomes.iter().filter(|o| o.state == DeletionState::Deleted as i32) {
            assert_eq!(
                digest_of(&setup.registry, &outcome.digest).await,
                None,
                "{} reported deleted but present",
                outcome.digest
            );
        }
        assert!(
            digest_of(&setup.registry, "0.1.5").await.is_some(),
            "{status}: the failed one is still there"
        );

        // The registry recovers: a new plan deletes what the first could not.
        setup.front.clear_faults();
        let plan = make_plan(&mut client, &setup.front.host()).await;
        let report = execute(&mut client, execute_request(&plan)).await.unwrap();
        assert!(
            report.outcomes.iter().all(|o| o.state == DeletionState::Deleted as i32),
            "{status}: {report:?}"
        );
        assert_eq!(digest_of(&setup.registry, "0.1.5").await, None, "{status}: converged");
    }
}

#[tokio::test]
async fn a_purger_killed_mid_execution_converges_when_run_again_without_deleting_twice() {
    let setup = setup().await;
    let lifecycle = RealLifecycle::start().await;
    let first = purger(&setup, &lifecycle.endpoint(), &["--delete-concurrency", "1"]).await;
    let mut client = PurgerClient::new(first.channel().await.unwrap());
    let plan = make_plan(&mut client, &setup.front.host()).await;
    // Each DELETE is applied at once but answered late: a kill leaves the
    // purger without the outcome of what the registry already did.
    setup.front.inject(Fault::new(
        Some(Method::DELETE),
        "/manifests/",
        usize::MAX,
        FaultAction::DelayAnswer(Duration::from_millis(700)),
    ));
    let mut stream = client.execute(execute_request(&plan)).await.unwrap().into_inner();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.message()).await;
    for _ in 0..200 {
        if setup.front.count(&Method::DELETE, "/manifests/") >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(first); // SIGKILL
    setup.front.clear_faults();

    let second = purger(&setup, &lifecycle.endpoint(), &[]).await;
    let mut client = PurgerClient::new(second.channel().await.unwrap());
    // Any replica tells what the interrupted run did, once its lease is gone.
    let interrupted = loop {
        let request = GetReportRequest { plan_id: plan.plan_id.clone() };
        let report = client.get_report(request).await.unwrap().into_inner();
        if report.state != ReportState::Running as i32 {
            break report;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(interrupted.state, ReportState::Interrupted as i32, "{interrupted:?}");
    assert!(interrupted.note.contains("Execute plan"), "{interrupted:?}");
    assert!(!interrupted.outcomes.is_empty(), "the first verified deletion is in it: {interrupted:?}");
    assert!(interrupted.outcomes.iter().all(|o| o.state == DeletionState::Deleted as i32), "{interrupted:?}");

    let report = loop {
        match execute(&mut client, execute_request(&plan)).await {
            Ok(report) => break report,
            // The dead purger's lease expires within 2 s.
            Err(status) if status.code() == tonic::Code::Aborted => {
                tokio::time::sleep(Duration::from_millis(300)).await
            }
            Err(status) => panic!("{status:?}"),
        }
    };
    assert_eq!(report.outcomes.len(), 4, "the report is complete: {report:?}");
    assert_eq!(report.state, ReportState::Completed as i32);
    // What the first run deleted is its deletion, with its time, not "already gone".
    assert!(report.outcomes.iter().all(|o| o.state == DeletionState::Deleted as i32), "{report:?}");
    let earlier: Vec<_> = report.outcomes.iter().filter(|o| o.note.contains("earlier run")).collect();
    assert!(earlier.len() >= 2, "the verified one and the one answered too late: {report:?}");
    for first in &earlier {
        let at = interrupted.outcomes.iter().find(|o| o.digest == first.digest).map(|o| o.at.clone());
        assert!(at.is_none() || at.as_deref() == Some(first.at.as_str()), "its time is kept: {report:?}");
    }
    for outcome in &report.outcomes {
        assert_eq!(
            setup.front.count(&Method::DELETE, &outcome.digest),
            1,
            "DELETE of {} sent other than once",
            outcome.digest
        );
    }
    let kept: BTreeSet<String> = plan.entries.iter().filter(|e| e.keep).map(|e| e.tag.clone()).collect();
    assert_eq!(tags(&setup.registry).await, kept);
}

/// A JukeBox listing the history repository and a small second one.
async fn jukebox_world(setup: &Setup) -> tempfile::TempDir {
    let p = setup.registry.publisher();
    for tag in ["1.0.0", "2.0.0", "3.0.0"] {
        p.publish("apps/x", &PackageSpec::new("apps", "x", PackageType::Tenant, tag)).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let host = setup.front.host();
    let images = [format!("{host}/{REPO}"), format!("{host}/apps/x")];
    vynil_testkit::JukeboxBuilder::new("box").list(images).write_to(dir.path()).unwrap();
    dir
}

async fn tags_of(registry: &RegistryServer, repository: &str) -> BTreeSet<String> {
    let url = format!("{}/v2/{repository}/tags/list", registry.base_url());
    let body: serde_json::Value = reqwest::get(url).await.unwrap().json().await.unwrap();
    body["tags"]
        .as_array()
        .map(|a| a.iter().map(|t| t.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_jukebox_is_planned_and_purged_across_its_repositories_under_one_confirmation() {
    let setup = setup().await;
    let dir = jukebox_world(&setup).await;
    let lifecycle = RealLifecycle::start().await;
    let service =
        purger(&setup, &lifecycle.endpoint(), &["--jukebox-dir", dir.path().to_str().unwrap()]).await;
    let mut client = PurgerClient::new(service.channel().await.unwrap());
    let plan = client
        .plan(as_gateway(PlanRequest { target: Some(Target::Jukebox("box".into())) }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plan.target, "jukebox/box");
    assert_eq!(plan.delete_count, 6, "4 in the history, 2 superseded in apps/x");
    assert!(plan.entries.iter().any(|e| e.repository == "apps/x" && e.tag == "3.0.0" && e.keep));

    let mut wrong = execute_request(&plan);
    wrong.get_mut().confirm = format!("{}/{REPO}", setup.front.host());
    assert_eq!(execute(&mut client, wrong).await.unwrap_err().code(), tonic::Code::FailedPrecondition);

    let report = execute(&mut client, execute_request(&plan)).await.unwrap();
    assert_eq!(report.outcomes.len(), 6);
    assert!(report.outcomes.iter().all(|o| o.state == DeletionState::Deleted as i32), "{report:?}");
    assert!(report.outcomes.iter().any(|o| o.repository == "apps/x"));
    assert_eq!(tags_of(&setup.registry, "apps/x").await, BTreeSet::from(["3.0.0".to_string()]));
}

/// A purger with a schedule, and the lifecycle it asks (kept while it runs).
async fn scheduled(
    setup: &Setup,
    dir: &tempfile::TempDir,
    max_deletions: usize,
) -> (ServiceProcess, RealLifecycle) {
    let retention = dir.path().join("retention.yaml");
    std::fs::write(
        &retention,
        format!(
            "schedules:\n  - jukebox: box\n    cron: '* * * * * *'\n    max_deletions: {max_deletions}\n"
        ),
    )
    .unwrap();
    let lifecycle = RealLifecycle::start().await;
    let (jukeboxes, retention) =
        (dir.path().to_str().unwrap().to_string(), retention.to_str().unwrap().to_string());
    let flags = ["--jukebox-dir", &jukeboxes, "--retention-config", &retention];
    (purger(setup, &lifecycle.endpoint(), &flags).await, lifecycle)
}

#[tokio::test]
async fn a_scheduled_purge_within_its_limits_runs_by_itself() {
    let setup = setup().await;
    let dir = jukebox_world(&setup).await;
    let _service = scheduled(&setup, &dir, 10).await;
    for _ in 0..200 {
        if tags_of(&setup.registry, "apps/x").await.len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(tags_of(&setup.registry, "apps/x").await, BTreeSet::from(["3.0.0".to_string()]));
    assert!(!tags(&setup.registry).await.contains("0.1.5"), "the history was purged too");
}

#[tokio::test]
async fn a_scheduled_purge_over_its_limits_is_left_for_a_human() {
    let setup = setup().await;
    let dir = jukebox_world(&setup).await;
    let before = (tags(&setup.registry).await, tags_of(&setup.registry, "apps/x").await);
    let _service = scheduled(&setup, &dir, 1).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(setup.front.count(&Method::GET, "/tags/list") >= 2, "the schedule did plan");
    assert_eq!(setup.front.count(&Method::DELETE, "/manifests/"), 0);
    assert_eq!((tags(&setup.registry).await, tags_of(&setup.registry, "apps/x").await), before);
}

#[tokio::test]
async fn a_purger_frozen_past_its_lease_deletes_and_journals_nothing_after_it_thaws() {
    let setup = setup().await;
    let lifecycle = RealLifecycle::start().await;
    let frozen = purger(&setup, &lifecycle.endpoint(), &["--delete-concurrency", "1"]).await;
    let mut client = PurgerClient::new(frozen.channel().await.unwrap());
    let plan = make_plan(&mut client, &setup.front.host()).await;
    let deletions = plan.entries.iter().filter(|e| !e.keep).count();
    assert!(deletions >= 3, "{plan:?}");
    // The first DELETE is applied at once and answered late, so the frozen
    // purger still has work when it thaws.
    setup.front.inject(Fault::new(
        Some(Method::DELETE),
        "/manifests/",
        1,
        FaultAction::DelayAnswer(Duration::from_millis(800)),
    ));
    let mut stream = client.execute(execute_request(&plan)).await.unwrap().into_inner();
    for _ in 0..400 {
        if setup.front.count(&Method::DELETE, "/manifests/") >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    frozen.pause().unwrap();

    let other = purger(&setup, &lifecycle.endpoint(), &[]).await;
    let mut other_client = PurgerClient::new(other.channel().await.unwrap());
    let report = loop {
        match execute(&mut other_client, execute_request(&plan)).await {
            Ok(report) => break report,
            // The frozen purger's lease expires within 3 s.
            Err(status) if status.code() == tonic::Code::Aborted => {
                tokio::time::sleep(Duration::from_millis(300)).await
            }
            Err(status) => panic!("{status:?}"),
        }
    };
    assert!(report.outcomes.iter().all(|o| o.state != DeletionState::Failed as i32), "{report:?}");
    let sent_before_thaw = setup.front.count(&Method::DELETE, "/manifests/");

    frozen.resume().unwrap();
    // The thawed purger's execution ends, refused: its lease is gone.
    let ended = loop {
        match stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => break None,
            Err(status) => break Some(status),
        }
    };
    let ended = ended.expect("the thawed execution ends with an error, not a report");
    assert_eq!(ended.code(), tonic::Code::Aborted, "{ended:?}");
    assert!(ended.message().contains("lease"), "{ended:?}");
    assert_eq!(
        setup.front.count(&Method::DELETE, "/manifests/"),
        sent_before_thaw,
        "no DELETE after thawing"
    );
    let final_report = other_client
        .get_report(GetReportRequest { plan_id: plan.plan_id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(final_report.state, ReportState::Completed as i32);
    assert_eq!(final_report.outcomes, report.outcomes, "the thawed purger overwrote no report");
    let kept: BTreeSet<String> = plan.entries.iter().filter(|e| e.keep).map(|e| e.tag.clone()).collect();
    assert_eq!(tags(&setup.registry).await, kept);
}

#[tokio::test]
async fn a_plan_made_under_other_pins_or_another_framework_version_is_refused_as_stale() {
    let setup = setup().await;
    let lifecycle = RealLifecycle::start().await;
    let dir = tempfile::tempdir().unwrap();
    let retention = dir.path().join("retention.yaml");
    std::fs::write(&retention, "pinned: []\n").unwrap();
    let retention_flag = retention.to_str().unwrap().to_string();
    let service = purger(&setup, &lifecycle.endpoint(), &["--retention-config", &retention_flag]).await;
    let mut client = PurgerClient::new(service.channel().await.unwrap());
    let plan = make_plan(&mut client, &setup.front.host()).await;
    let before = tags(&setup.registry).await;

    // A pin added since planning would keep a tag the plan deletes.
    std::fs::write(&retention, "pinned: ['0.1.7']\n").unwrap();
    let status = execute(&mut client, execute_request(&plan)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("retention inputs changed"), "{status:?}");
    std::fs::write(&retention, "pinned: []\n").unwrap();

    // A replica running another framework version would plan otherwise.
    let other = purger(
        &setup,
        &lifecycle.endpoint(),
        &["--retention-config", &retention_flag, "--vynil-version", "0.9.0"],
    )
    .await;
    let mut other_client = PurgerClient::new(other.channel().await.unwrap());
    let status = execute(&mut other_client, execute_request(&plan)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("retention inputs changed"), "{status:?}");
    assert_eq!(tags(&setup.registry).await, before, "nothing deleted");
    assert_eq!(setup.front.count(&Method::DELETE, "/manifests/"), 0);

    // Under the inputs it was made with, the same plan executes.
    let report = execute(&mut client, execute_request(&plan)).await.unwrap();
    assert!(report.outcomes.iter().all(|o| o.state == DeletionState::Deleted as i32), "{report:?}");
}

#[tokio::test]
async fn in_a_cluster_each_execution_is_also_an_event_on_its_jukebox() {
    use kube::{Api, api::PostParams};
    let setup = setup().await;
    let lifecycle = RealLifecycle::start().await;
    // The purger under its deployed grants, on its ServiceAccount's token.
    let api = vynil_testkit::kube_api::FakeApiServer::start_under_deploy_rbac(&["apps"]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token = api.service_account_token("vynil-system", "vynil-purger");
    let kubeconfig = api.write_kubeconfig_as(dir.path(), "vynil-system", &token).unwrap();
    let jukebox = vynil_testkit::JukeboxBuilder::new("box")
        .list([format!("{}/{REPO}", setup.front.host())])
        .schedule("0 0 1 1 *")
        .json();
    let jukebox: vynil_crds::JukeBox = serde_json::from_value(jukebox).unwrap();
    Api::<vynil_crds::JukeBox>::all(api.client().unwrap())
        .create(&PostParams::default(), &jukebox)
        .await
        .unwrap();
    let (redis, front) = (setup.redis.url(), setup.front.host());
    let token = setup.token.path().display().to_string();
    let args = [
        "--kubernetes",
        "--service-token-file",
        &token,
        "--redis-url",
        &redis,
        "--insecure-registry",
        &front,
        "--lifecycle-endpoint",
        &lifecycle.endpoint(),
    ];
    let service = ServiceProcess::start_with_env(
        Path::new(env!("CARGO_BIN_EXE_vynil-purger")),
        &args,
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    )
    .await
    .unwrap();
    let mut client = PurgerClient::new(service.channel().await.unwrap());
    let plan = client
        .plan(as_gateway(PlanRequest { target: Some(Target::Jukebox("box".into())) }))
        .await
        .unwrap()
        .into_inner();
    let report = execute(&mut client, execute_request(&plan)).await.unwrap();
    let deleted = report.outcomes.iter().filter(|o| o.state == DeletionState::Deleted as i32).count();
    assert!(deleted > 0, "{report:?}");
    let events = api.objects("events.k8s.io", "events");
    let purge: Vec<_> = events.iter().filter(|e| e["reason"] == "PurgeExecuted").collect();
    assert_eq!(purge.len(), 1, "{events:?}");
    let note = purge[0]["note"].as_str().unwrap();
    assert!(note.contains("alice@example") && note.contains(&format!("{deleted} deleted")), "{note}");
    assert_eq!(purge[0]["regarding"]["name"], "box");
    assert_eq!(purge[0]["reportingController"], "vynil-purger");
}

#[tokio::test]
async fn a_plan_over_the_size_limit_is_refused_and_names_the_flag() {
    let setup = setup().await;
    let lifecycle = RealLifecycle::start().await;
    // The history holds 13 tags (see the first test): one fewer is refused.
    let service = purger(&setup, &lifecycle.endpoint(), &["--max-plan-tags", "12"]).await;
    let mut client = PurgerClient::new(service.channel().await.unwrap());
    let target = Target::Repository(Repository { registry: setup.front.host(), repository: REPO.into() });
    let refused = client.plan(as_gateway(PlanRequest { target: Some(target.clone()) })).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("13 tags") && refused.message().contains("--max-plan-tags 12"),
        "{}",
        refused.message()
    );
    let service = purger(&setup, &lifecycle.endpoint(), &["--max-plan-tags", "13"]).await;
    let mut client = PurgerClient::new(service.channel().await.unwrap());
    let plan = client.plan(as_gateway(PlanRequest { target: Some(target) })).await.unwrap().into_inner();
    assert_eq!(plan.entries.len(), 13, "at the limit: planned");
}
