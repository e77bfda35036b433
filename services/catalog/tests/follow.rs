//! The catalog follows JukeBox status through a real Redis: as the scanner
//! writes it (through the same local store), on every replica, without
//! writing identical content, and answers with the rules crate.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use common::{eventually, set_calls, tags};
use std::{sync::Arc, time::Duration};

use tonic::Request;
use vynil_catalog::{Catalog, CatalogService, Change};
use vynil_crds::JukeBoxStatus;
use vynil_proto::catalog::v1::{
    PackageType as ProtoType, ResolveInstallRequest, catalog_server::Catalog as _,
    resolve_install_response::Outcome,
};
use vynil_rules::{Package, PackageContent, PackageType, Requirement};
use vynil_store::{JukeboxStore, LocalStore};
use vynil_testkit::{JukeboxBuilder, RedisServer};

fn package(tag: &str, kind: PackageType, min: Option<&str>) -> Package {
    let mut content = PackageContent::minimal("think", "ollama", kind);
    if let Some(min) = min {
        content = content.requiring(Requirement::MinimumPreviousVersion(min.into()));
    }
    Package::new("registry.example", "think/ollama", tag, content)
}

fn status(packages: Vec<Package>) -> JukeBoxStatus {
    JukeBoxStatus { packages, ..Default::default() }
}

struct World {
    redis: RedisServer,
    dir: tempfile::TempDir,
    writer: LocalStore,
}

async fn world(names: &[&str]) -> World {
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    for name in names {
        JukeboxBuilder::new(name).write_to(dir.path()).unwrap();
    }
    let writer =
        LocalStore::with_redis(dir.path().to_path_buf(), &vynil_store::RedisTarget::url(redis.url()))
            .await
            .unwrap();
    World { redis, dir, writer }
}

async fn replica(world: &World) -> Arc<Catalog> {
    let store = Arc::new(
        LocalStore::with_redis(
            world.dir.path().to_path_buf(),
            &vynil_store::RedisTarget::url(world.redis.url()),
        )
        .await
        .unwrap(),
    );
    let catalog = Arc::new(
        Catalog::new(
            store,
            Some(&vynil_store::RedisTarget::url(world.redis.url())),
            semver::Version::new(0, 8, 0),
        )
        .await
        .unwrap(),
    );
    catalog.resync().await.unwrap();
    tokio::spawn(catalog.clone().follow(Duration::from_secs(3600)));
    catalog
}

/// What the scanner does: a compare-and-set status write.
async fn write(world: &World, name: &str, packages: Vec<Package>) {
    let version = world.writer.get(name).await.unwrap().unwrap().status_version;
    world.writer.write_status(name, &version, &status(packages)).await.unwrap();
}

#[tokio::test]
async fn a_status_change_updates_its_entry_on_every_replica_and_only_that_entry() {
    let world = world(&["a", "b"]).await;
    let replicas = [replica(&world).await, replica(&world).await, replica(&world).await];
    write(&world, "b", vec![package("1.0.0", PackageType::Tenant, None)]).await;
    for catalog in &replicas {
        eventually(catalog, "b", &["1.0.0"]).await;
    }
    let b_hash = replicas[0].entry("b").unwrap().unwrap().hash.clone();
    let mut changes = replicas[0].subscribe();

    write(&world, "a", vec![package("0.1.10", PackageType::Service, None)]).await;
    for catalog in &replicas {
        eventually(catalog, "a", &["0.1.10"]).await;
        assert_eq!(catalog.entry("b").unwrap().unwrap().hash, b_hash, "b untouched");
    }
    let change = changes.recv().await.unwrap();
    assert_eq!(change.jukebox, "a");
    assert!(changes.try_recv().is_err(), "no change announced for b");
}

#[tokio::test]
async fn an_identical_status_writes_nothing_to_redis() {
    let world = world(&["a"]).await;
    let catalog = replica(&world).await;
    write(&world, "a", vec![package("1.0.0", PackageType::Tenant, None)]).await;
    eventually(&catalog, "a", &["1.0.0"]).await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let before = set_calls(&world.redis).await;
    write(&world, "a", vec![package("1.0.0", PackageType::Tenant, None)]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        set_calls(&world.redis).await - before,
        1,
        "only the status write itself; the catalog wrote nothing"
    );

    let before = set_calls(&world.redis).await;
    write(&world, "a", vec![package("2.0.0", PackageType::Tenant, None)]).await;
    eventually(&catalog, "a", &["2.0.0"]).await;
    assert_eq!(set_calls(&world.redis).await - before, 3, "status, entry and hash");
}

#[tokio::test]
async fn a_deleted_jukebox_loses_its_entry() {
    let world = world(&["a"]).await;
    let catalog = replica(&world).await;
    write(&world, "a", vec![package("1.0.0", PackageType::Tenant, None)]).await;
    eventually(&catalog, "a", &["1.0.0"]).await;
    let mut changes = catalog.subscribe();
    std::fs::remove_file(world.dir.path().join("a.yaml")).unwrap();
    catalog.resync().await.unwrap();
    assert!(catalog.entry("a").unwrap().is_none());
    assert_eq!(changes.recv().await.unwrap(), Change { jukebox: "a".into(), hash: None });
}

#[tokio::test]
async fn resolve_install_answers_per_instance_type_and_says_what_is_missing() {
    let world = world(&["box"]).await;
    let catalog = replica(&world).await;
    let service = CatalogService::new(catalog.clone(), vynil_runtime::Shutdown::new());
    let resolve = |kind: ProtoType| ResolveInstallRequest {
        jukebox: "box".into(),
        category: "think".into(),
        name: "ollama".into(),
        r#type: kind as i32,
        installed_tag: String::new(),
        ..Default::default()
    };
    // The #12 catalog: the type-aware view kept the tenant revision.
    write(
        &world,
        "box",
        vec![
            package("0.1.10", PackageType::Service, None),
            package("0.1.8", PackageType::Tenant, Some("0.1.0")),
        ],
    )
    .await;
    eventually(&catalog, "box", &["0.1.10", "0.1.8"]).await;
    let tag = |outcome: Option<Outcome>| match outcome {
        Some(Outcome::Package(p)) => p.tag,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        tag(service
            .resolve_install(Request::new(resolve(ProtoType::Tenant)))
            .await
            .unwrap()
            .into_inner()
            .outcome),
        "0.1.8"
    );
    assert_eq!(
        tag(service
            .resolve_install(Request::new(resolve(ProtoType::Service)))
            .await
            .unwrap()
            .into_inner()
            .outcome),
        "0.1.10"
    );

    write(&world, "box", vec![package("0.1.10", PackageType::Service, None)]).await;
    eventually(&catalog, "box", &["0.1.10"]).await;
    let outcome =
        service.resolve_install(Request::new(resolve(ProtoType::Tenant))).await.unwrap().into_inner().outcome;
    let Some(Outcome::NoMatch(no_match)) = outcome else { panic!("{outcome:?}") };
    assert_eq!(no_match.excluded_by, "type");
    assert_eq!(no_match.reason, "no tenant revision of think/ollama (only service: 0.1.10)");
}

#[tokio::test]
async fn when_redis_goes_away_reads_go_on_from_the_snapshot_and_the_entry_is_repaired_after() {
    let mut world = world(&["a"]).await;
    let catalog = replica(&world).await;
    write(&world, "a", vec![package("1.0.0", PackageType::Tenant, None)]).await;
    eventually(&catalog, "a", &["1.0.0"]).await;

    world.redis.kill();
    assert!(catalog.ingest("a").await.is_err(), "the store is unreachable");
    assert!(catalog.is_degraded());
    assert_eq!(tags(&catalog, "a"), ["1.0.0"], "reads go on from the last snapshot");

    // Redis comes back empty (no persistence); the scanner writes the status again.
    world.redis.restart().await.unwrap();
    for _ in 0..100 {
        if world.writer.get("a").await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    write(&world, "a", vec![package("2.0.0", PackageType::Tenant, None)]).await;
    eventually(&catalog, "a", &["2.0.0"]).await;
    for _ in 0..100 {
        if !catalog.is_degraded() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!catalog.is_degraded(), "healthy again once Redis answers");
    let mut connection =
        redis::Client::open(world.redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let stored: Option<String> =
        redis::cmd("GET").arg("vynil:v1:catalog:entry:a").query_async(&mut connection).await.unwrap();
    assert!(stored.unwrap().contains("2.0.0"), "the shared entry was repaired");
}

#[tokio::test]
async fn resolve_cleanup_carries_the_recorded_check_and_the_children_over_the_wire() {
    use vynil_proto::catalog::v1::{
        RecordedCheck, RecordedRevision, ResolveCleanupRequest, resolve_cleanup_response::Decision,
    };
    let world = world(&["box"]).await;
    let catalog = replica(&world).await;
    let service = CatalogService::new(catalog.clone(), vynil_runtime::Shutdown::new());
    // After the type change: no tenant revision is left in the catalog.
    write(&world, "box", vec![package("0.1.10", PackageType::Service, None)]).await;
    eventually(&catalog, "box", &["0.1.10"]).await;
    let request = |check: RecordedCheck, children: u32| ResolveCleanupRequest {
        jukebox: "box".into(),
        category: "think".into(),
        name: "ollama".into(),
        r#type: ProtoType::Tenant as i32,
        installed_tag: "0.1.8".into(),
        recorded: Some(RecordedRevision {
            registry: "registry.example".into(),
            image: "think/ollama".into(),
            tag: "0.1.8".into(),
            digest: "sha256:aa".into(),
            r#type: ProtoType::Tenant as i32,
        }),
        recorded_check: check as i32,
        recorded_check_problem: "registry.example: connection refused".into(),
        children,
        delete_without_package_allowed: false,
        ..ResolveCleanupRequest::default()
    };
    let decide = |check, children| {
        let service = service.clone();
        async move { service.resolve_cleanup(Request::new(request(check, children))).await }
    };

    let used = decide(RecordedCheck::Resolves, 3).await.unwrap().into_inner().decision;
    assert!(matches!(&used, Some(Decision::UsePackage(p)) if p.tag == "0.1.8"), "{used:?}");

    // Unreachable is not gone: retry, never [E_PACKAGE_GONE].
    let unknown = decide(RecordedCheck::Unknown, 3).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::Unavailable, "{unknown:?}");
    assert!(unknown.message().contains("connection refused"), "{unknown:?}");

    let gone = decide(RecordedCheck::Gone, 3).await.unwrap().into_inner().decision;
    let Some(Decision::Gone(gone)) = gone else { panic!("{gone:?}") };
    assert_eq!(gone.code, "E_PACKAGE_GONE");

    let nothing = decide(RecordedCheck::Gone, 0).await.unwrap().into_inner().decision;
    assert!(matches!(nothing, Some(Decision::NothingToDelete(_))), "{nothing:?}");

    let missing = decide(RecordedCheck::Unspecified, 3).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::InvalidArgument, "{missing:?}");
}

#[tokio::test]
async fn get_catalog_answers_the_scanned_channel_with_digests_and_refuses_a_view_it_cannot_derive() {
    use vynil_proto::catalog::v1::{Channel as ProtoChannel, GetCatalogRequest};
    let world = world(&[]).await;
    JukeboxBuilder::new("edge").maturity("alpha").write_to(world.dir.path()).unwrap();
    let catalog = replica(&world).await;
    let service = CatalogService::new(catalog.clone(), vynil_runtime::Shutdown::new());
    // The alpha view of 2.0.0-alpha.1(min 1.0.0), 1.5.0(min 1.0.0), 1.0.0: the
    // stable release 1.5.0 is no alpha waypoint, yet it heads the stable view.
    write(
        &world,
        "edge",
        vec![
            package("2.0.0-alpha.1", PackageType::Tenant, Some("1.0.0")).with_digest("sha256:a2"),
            package("1.0.0", PackageType::Tenant, None).with_digest("sha256:a1"),
        ],
    )
    .await;
    eventually(&catalog, "edge", &["2.0.0-alpha.1", "1.0.0"]).await;
    let ask = |channel: ProtoChannel| {
        let service = service.clone();
        let request =
            GetCatalogRequest { jukebox: "edge".into(), channel: channel as i32, ..Default::default() };
        async move { service.get_catalog(Request::new(request)).await }
    };
    for channel in [ProtoChannel::Unspecified, ProtoChannel::Alpha] {
        let answer = ask(channel).await.unwrap().into_inner();
        let shown: Vec<(String, String)> = answer.packages.into_iter().map(|p| (p.tag, p.digest)).collect();
        assert_eq!(
            shown,
            [("2.0.0-alpha.1".into(), "sha256:a2".into()), ("1.0.0".into(), "sha256:a1".into())],
            "{channel:?}"
        );
    }
    let refused = ask(ProtoChannel::Stable).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("alpha") && refused.message().contains("stable"), "{refused:?}");
}

#[tokio::test]
async fn get_catalog_gives_each_revision_its_roles_and_the_upgrade_path_goes_through_the_waypoints() {
    use vynil_proto::catalog::v1::{GetCatalogRequest, GetUpgradePathRequest, RoleKind};
    let world = world(&["main"]).await;
    let catalog = replica(&world).await;
    let service = CatalogService::new(catalog.clone(), vynil_runtime::Shutdown::new());
    // upstream #12's story with a waypoint: the tenant line 0.1.8 → 0.1.9
    // (min 0.1.8), then the republication as service 0.1.10 (min 0.1.9).
    write(
        &world,
        "main",
        vec![
            package("0.1.10", PackageType::Service, Some("0.1.9")),
            package("0.1.9", PackageType::Tenant, Some("0.1.0")),
            package("0.1.8", PackageType::Tenant, None),
        ],
    )
    .await;
    eventually(&catalog, "main", &["0.1.10", "0.1.9", "0.1.8"]).await;
    // Filtered to tenant revisions: the roles are still those of the whole repository.
    let request =
        GetCatalogRequest { jukebox: "main".into(), r#type: ProtoType::Tenant as i32, ..Default::default() };
    let answer = service.get_catalog(Request::new(request)).await.unwrap().into_inner();
    let roles: Vec<(String, Vec<String>)> = answer
        .packages
        .iter()
        .map(|p| (p.tag.clone(), p.roles.iter().map(|r| r.description.clone()).collect()))
        .collect();
    assert_eq!(
        roles,
        [
            (
                "0.1.9".to_string(),
                vec!["waypoint (min 0.1.0)".to_string(), "newest tenant revision".to_string()]
            ),
            ("0.1.8".to_string(), vec!["waypoint (no minimum)".to_string()]),
        ]
    );
    let waypoint = &answer.packages[0].roles[0];
    assert_eq!((waypoint.kind, waypoint.minimum.as_str()), (RoleKind::Waypoint as i32, "0.1.0"));

    let path = |from: &str, kind: ProtoType| {
        let request = GetUpgradePathRequest {
            jukebox: "main".into(),
            category: "think".into(),
            name: "ollama".into(),
            r#type: kind as i32,
            from_tag: from.into(),
        };
        let service = service.clone();
        async move { service.get_upgrade_path(Request::new(request)).await.unwrap().into_inner() }
    };
    let tenant = path("0.1.8", ProtoType::Tenant).await;
    let steps: Vec<&str> = tenant.steps.iter().map(|p| p.tag.as_str()).collect();
    assert_eq!((steps, tenant.to_tag.as_str()), (vec!["0.1.9"], "0.1.9"));
    assert!(tenant.blocked.is_none());
    // A service instance from before the waypoint: blocked by the minimum, in words.
    let blocked = path("0.1.0", ProtoType::Service).await;
    assert!(blocked.steps.is_empty());
    let blocked = blocked.blocked.unwrap();
    assert_eq!(blocked.excluded_by, "minimum version");
    assert!(blocked.reason.contains("0.1.10 needs ≥ 0.1.9"), "{}", blocked.reason);
}

#[tokio::test]
async fn get_catalog_answers_not_modified_while_the_callers_hash_is_the_content() {
    use vynil_proto::catalog::v1::GetCatalogRequest;
    let world = world(&["main"]).await;
    let catalog = replica(&world).await;
    let service = CatalogService::new(catalog.clone(), vynil_runtime::Shutdown::new());
    write(&world, "main", vec![package("1.0.0", PackageType::Tenant, None)]).await;
    eventually(&catalog, "main", &["1.0.0"]).await;
    let ask = |held: &str| {
        let (service, held) = (service.clone(), held.to_string());
        let request = GetCatalogRequest { jukebox: "main".into(), if_none_match: held, ..Default::default() };
        async move { service.get_catalog(Request::new(request)).await.unwrap().into_inner() }
    };
    let full = ask("").await;
    assert!(!full.not_modified && full.packages.len() == 1, "{full:?}");
    let same = ask(&full.content_hash).await;
    assert!(same.not_modified && same.packages.is_empty(), "{same:?}");
    assert_eq!(same.content_hash, full.content_hash);
    assert!(!ask("sha256:something-else").await.not_modified, "another hash gets the packages");

    write(
        &world,
        "main",
        vec![package("1.1.0", PackageType::Tenant, None), package("1.0.0", PackageType::Tenant, None)],
    )
    .await;
    eventually(&catalog, "main", &["1.1.0", "1.0.0"]).await;
    let changed = ask(&full.content_hash).await;
    assert!(!changed.not_modified, "the content moved: {changed:?}");
    assert_ne!(changed.content_hash, full.content_hash);
    assert_eq!(changed.packages.len(), 2);
}

/// The list RPCs answer page by page: a page size of 1 walks every JukeBox
/// and every package once, in order, each token the next page's; a token
/// the service never gave is refused; size 0 answers all at once.
#[tokio::test]
async fn list_jukeboxes_and_get_catalog_answer_page_by_page() {
    use vynil_proto::catalog::v1::{GetCatalogRequest, ListJukeboxesRequest};
    let world = world(&["alpha", "beta", "gamma"]).await;
    let catalog = replica(&world).await;
    let service = CatalogService::new(catalog.clone(), vynil_runtime::Shutdown::new());
    let tags = ["3.0.0", "2.0.0", "1.0.0"];
    write(&world, "beta", tags.iter().map(|t| package(t, PackageType::Tenant, None)).collect()).await;
    for name in ["alpha", "gamma"] {
        write(&world, name, vec![package("1.0.0", PackageType::Tenant, None)]).await;
    }
    for (name, shown) in [("alpha", &["1.0.0"][..]), ("beta", &tags[..]), ("gamma", &["1.0.0"][..])] {
        eventually(&catalog, name, shown).await;
    }

    let (mut names, mut token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let request = ListJukeboxesRequest { page_size: 1, page_token: token.clone() };
        let answer = service.list_jukeboxes(Request::new(request)).await.unwrap().into_inner();
        assert!(answer.jukeboxes.len() <= 1);
        names.extend(answer.jukeboxes.into_iter().map(|j| j.name));
        pages += 1;
        if answer.next_page_token.is_empty() {
            break;
        }
        token = answer.next_page_token;
    }
    let all =
        service.list_jukeboxes(Request::new(ListJukeboxesRequest::default())).await.unwrap().into_inner();
    let every: Vec<String> = all.jukeboxes.into_iter().map(|j| j.name).collect();
    assert_eq!((names.clone(), pages), (every, 3), "three pages of one, in the list's order");
    assert_eq!(names, ["alpha", "beta", "gamma"]);

    let (mut shown, mut token) = (Vec::new(), String::new());
    loop {
        let request = GetCatalogRequest {
            jukebox: "beta".into(),
            page_size: 1,
            page_token: token,
            ..Default::default()
        };
        let answer = service.get_catalog(Request::new(request)).await.unwrap().into_inner();
        shown.extend(answer.packages.into_iter().map(|p| p.tag));
        if answer.next_page_token.is_empty() {
            break;
        }
        token = answer.next_page_token;
    }
    assert_eq!(shown, tags);
    let forged = ListJukeboxesRequest { page_size: 1, page_token: "b2Zmc2V0OjE".into() };
    let refused = service.list_jukeboxes(Request::new(forged)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
}
