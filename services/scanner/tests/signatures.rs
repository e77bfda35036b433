//! Signature policy against a real registry (behind the counting front) and
//! a real Redis: each kind of signature gets its verdict, `enforce` keeps
//! every unverified revision out of the view, a rescan reads nothing again,
//! and keys rotate without re-reading a manifest.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use axum::http::Method;
use clap::Parser;
use vynil_rules::signature::bundle::SIGN_PREDICATE_TYPE;
use vynil_rules::{
    InstallQuery, Package, PackageType as RulesType, Viewer,
    catalog::{CatalogRole, roles_under},
    select_install,
    signature::{Verdict, VerifyMode},
    upgrade::withheld::{Holds, withheld},
};
use vynil_scanner::{Config, RecordState, Scanner};
use vynil_testkit::{
    Fault, FaultAction, Holder, HttpFront, JukeboxBuilder, PackageSpec, PackageType, RedisServer,
    RegistryServer, SignatureLayer, Signer, Sigstore, statement, write_opted_in,
};

const REPOSITORY: &str = "sec/app";

struct Harness {
    registry: RegistryServer,
    front: HttpFront,
    _redis: RedisServer,
    dir: tempfile::TempDir,
    scanner: Arc<Scanner>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Harness {
    async fn start(registry: RegistryServer) -> Self {
        let front = HttpFront::start(&registry.base_url()).await.unwrap();
        let redis = RedisServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let config = Config::parse_from([
            "vynil-scanner",
            "--jukebox-dir",
            dir.path().to_str().unwrap(),
            "--redis-url",
            &redis.url(),
            "--insecure-registry",
            &front.host(),
            "--vynil-version",
            "0.8.0",
            "--poll-milliseconds",
            "50",
        ]);
        let scanner = vynil_scanner::build(&config).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(scanner.clone().work(async move {
            let _ = stopped.await;
        }));
        Self { registry, front, _redis: redis, dir, scanner, _stop: stop }
    }

    /// The JukeBox's file, with this signature policy.
    fn write_jukebox(&self, mode: &str, keys: &[(&str, &Signer)]) {
        self.write_jukebox_with(mode, keys, false)
    }

    /// The JukeBox's file, with this signature policy (`reference`: it
    /// requires the signed reference).
    fn write_jukebox_with(&self, mode: &str, keys: &[(&str, &Signer)], reference: bool) {
        let pems: Vec<(&str, String)> = keys.iter().map(|(n, s)| (*n, s.public_pem())).collect();
        let pems: Vec<(&str, &str)> = pems.iter().map(|(n, p)| (*n, p.as_str())).collect();
        let builder = JukeboxBuilder::new("box")
            .list([format!("{}/{REPOSITORY}", self.front.host())])
            .verify(mode, &pems);
        let builder = if reference { builder.require_reference() } else { builder };
        builder.write_to(self.dir.path()).unwrap();
    }

    async fn scan(&self) {
        let record = self.scan_record().await;
        assert_eq!(record.state, RecordState::Succeeded, "{record:?}");
    }

    /// A full scan, to its end.
    async fn scan_record(&self) -> vynil_scanner::ScanRecord {
        let (id, _) = self.scanner.request("box", vynil_rules::ScanScope::Full).await.unwrap();
        for _ in 0..2400 {
            let record = self.scanner.queue.record(&id).await.unwrap().unwrap();
            if record.is_final() {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("scan {id} did not finish");
    }

    async fn packages(&self) -> Vec<Package> {
        self.scanner.store.get("box").await.unwrap().unwrap().status.unwrap().packages
    }

    async fn verdicts(&self) -> BTreeMap<String, Verdict> {
        self.packages().await.into_iter().map(|p| (p.tag.clone(), p.signature.unwrap())).collect()
    }

    /// GETs of manifests and blobs since the last reset.
    fn gets(&self) -> usize {
        self.front.count(&Method::GET, "/manifests/") + self.front.count(&Method::GET, "/blobs/")
    }
}

/// A registry with six revisions 0.1.0 to 0.6.0, each a waypoint (each
/// needs the one before, so every one is in the view), and their digests.
async fn six_waypoints() -> (RegistryServer, BTreeMap<&'static str, String>) {
    let registry = RegistryServer::start().await.unwrap();
    let p = registry.publisher();
    let tags = ["0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0"];
    let mut digests = BTreeMap::new();
    for (i, tag) in tags.iter().enumerate() {
        let mut spec = PackageSpec::new("sec", "app", PackageType::Tenant, tag);
        if i > 0 {
            spec = spec.min(tags[i - 1]);
        }
        digests.insert(*tag, p.publish(REPOSITORY, &spec).await.unwrap());
    }
    (registry, digests)
}

/// Six waypoints: signed by the trusted key, by another key, unsigned, a
/// trusted signature copied from 0.1.0, a trusted signature whose payload
/// was changed afterwards, a trusted signature cut short.
async fn six_revisions(trusted: &Signer, other: &Signer) -> (RegistryServer, BTreeMap<&'static str, String>) {
    let (registry, digests) = six_waypoints().await;
    let p = registry.publisher();
    let reference = format!("{}/{REPOSITORY}", registry.host());
    let sign = |signer: &Signer, digest: &str| SignatureLayer::by(signer, &reference, digest);
    p.sign(REPOSITORY, &digests["0.1.0"], &[sign(trusted, &digests["0.1.0"])]).await.unwrap();
    p.sign(REPOSITORY, &digests["0.2.0"], &[sign(other, &digests["0.2.0"])]).await.unwrap();
    p.sign(REPOSITORY, &digests["0.4.0"], &[sign(trusted, &digests["0.1.0"])]).await.unwrap();
    let mut tampered = sign(trusted, &digests["0.5.0"]);
    tampered.payload = vynil_rules::signature::simple_signing_payload("evil.example/app", &digests["0.5.0"]);
    p.sign(REPOSITORY, &digests["0.5.0"], &[tampered]).await.unwrap();
    let mut truncated = sign(trusted, &digests["0.6.0"]);
    truncated.signature.truncate(24);
    p.sign(REPOSITORY, &digests["0.6.0"], &[truncated]).await.unwrap();
    (registry, digests)
}

fn verified(key: &str, registry: &RegistryServer) -> Verdict {
    Verdict::Verified { key: key.into(), reference: format!("{}/{REPOSITORY}", registry.host()) }
}

/// What the catalog offers of `packages` under `mode`: selection with the
/// JukeBox's holds (as the catalog service computes them).
fn offered(packages: &[Package], mode: VerifyMode) -> Result<String, String> {
    let framework = semver::Version::new(0, 8, 0);
    let held = withheld(packages, Holds { verify: Some(mode), ..Holds::default() }, jiff::Timestamp::now());
    let query = InstallQuery {
        withheld: &held,
        ..InstallQuery::of("box", "sec", "app", RulesType::Tenant, &framework)
    };
    select_install(packages, &query).map(|p| p.tag.clone()).map_err(|e| e.reason)
}

#[tokio::test]
async fn each_signature_gets_its_verdict_and_enforce_offers_only_the_verified_revision() {
    let (trusted, other) = (Signer::from_label("release"), Signer::from_label("someone else"));
    let (registry, digests) = six_revisions(&trusted, &other).await;
    let h = Harness::start(registry).await;

    h.write_jukebox("enforce", &[("release", &trusted)]);
    h.scan().await;
    let expected = BTreeMap::from([
        ("0.1.0".to_string(), verified("release", &h.registry)),
        ("0.2.0".into(), Verdict::UntrustedKey),
        ("0.3.0".into(), Verdict::Unsigned),
        ("0.4.0".into(), Verdict::DigestMismatch { signed: digests["0.1.0"].clone() }),
        ("0.5.0".into(), Verdict::UntrustedKey),
    ]);
    let verdicts = h.verdicts().await;
    assert!(matches!(verdicts.get("0.6.0"), Some(Verdict::Malformed { .. })), "{verdicts:?}");
    assert_eq!(verdicts.into_iter().filter(|(t, _)| t != "0.6.0").collect::<BTreeMap<_, _>>(), expected);
    let packages = h.packages().await;
    assert_eq!(offered(&packages, VerifyMode::Enforce), Ok("0.1.0".into()), "only the verified revision");
    let viewer = Viewer { channel: Default::default(), framework: semver::Version::new(0, 8, 0) };
    let roles = roles_under(&packages, &viewer, Some(VerifyMode::Enforce));
    let head = packages.iter().zip(&roles).find(|(_, r)| r.contains(&CatalogRole::Head)).unwrap().0;
    assert_eq!(head.tag, "0.1.0", "the head is the newest verified revision");

    h.write_jukebox("warn", &[("release", &trusted)]);
    h.scan().await;
    let packages = h.packages().await;
    assert_eq!(packages.len(), 6, "warn: every revision is in the view");
    assert_eq!(offered(&packages, VerifyMode::Warn), Ok("0.6.0".into()), "warn offers the newest");
    let roles = roles_under(&packages, &viewer, Some(VerifyMode::Warn));
    let marked =
        roles.iter().filter(|r| r.iter().any(|r| matches!(r, CatalogRole::Unverified { .. }))).count();
    assert_eq!(marked, 5, "every revision but 0.1.0 is marked");
}

#[tokio::test]
async fn a_rescan_reads_nothing_again_and_keys_rotate_without_reading_a_manifest() {
    let (trusted, second) = (Signer::from_label("release"), Signer::from_label("release 2027"));
    let (registry, digests) = six_revisions(&trusted, &second).await;
    let h = Harness::start(registry).await;
    h.write_jukebox("enforce", &[("release", &trusted)]);
    h.scan().await;
    let before = h.verdicts().await;

    h.front.reset_counts();
    h.scan().await;
    assert_eq!(h.gets(), 0, "an unchanged signed registry: no GET");
    assert_eq!(h.verdicts().await, before, "verdicts unchanged");

    // The revision 0.2.0 was signed by the second key: trusting it verifies
    // it from the evidence already read.
    h.write_jukebox("enforce", &[("release", &trusted), ("release-2027", &second)]);
    h.front.reset_counts();
    h.scan().await;
    assert_eq!(h.gets(), 0, "a new key reads no manifest again");
    let verdicts = h.verdicts().await;
    assert_eq!(verdicts["0.2.0"], verified("release-2027", &h.registry));
    assert_eq!(offered(&h.packages().await, VerifyMode::Enforce), Ok("0.2.0".into()));

    // The first key removed: what it alone signed is no longer verified.
    h.write_jukebox("enforce", &[("release-2027", &second)]);
    h.scan().await;
    let verdicts = h.verdicts().await;
    assert_eq!(verdicts["0.2.0"], verified("release-2027", &h.registry));
    assert_eq!(verdicts["0.1.0"], Verdict::UntrustedKey, "{verdicts:?}");

    // A signature deleted in the registry: the revision is unsigned at the next scan.
    let sig = vynil_registry::signature_tag(&digests["0.2.0"]).unwrap();
    let url = format!("{}/v2/{REPOSITORY}/manifests/", h.registry.base_url());
    let http = reqwest::Client::new();
    let head = http
        .head(format!("{url}{sig}"))
        .header("accept", "application/vnd.oci.image.manifest.v1+json")
        .send()
        .await
        .unwrap();
    let sig_digest = head.headers()["docker-content-digest"].to_str().unwrap().to_string();
    let deleted = http.delete(format!("{url}{sig_digest}")).send().await.unwrap();
    assert!(deleted.status().is_success(), "{deleted:?}");
    h.scan().await;
    assert_eq!(h.verdicts().await["0.2.0"], Verdict::Unsigned);
}

/// #65 item 8, the attack: the release key signed a revision for another
/// repository (its payload's `docker-reference`), and a pusher copies
/// revision and signature here as 0.2.0. Simple signing binds the digest
/// only, so the signature verifies; with `requireReference` the JukeBox
/// counts it only for the repository it names, and 0.2.0 is not offered.
#[tokio::test]
async fn a_signature_made_for_another_repository_counts_only_without_require_reference() {
    let trusted = Signer::from_label("release");
    let h = Harness::start(RegistryServer::start().await.unwrap()).await;
    let p = h.registry.publisher();
    // Where the scanner finds it (through the counting front).
    let here = format!("{}/{REPOSITORY}", h.front.host());
    let first =
        p.publish(REPOSITORY, &PackageSpec::new("sec", "app", PackageType::Tenant, "0.1.0")).await.unwrap();
    let spec = PackageSpec::new("sec", "app", PackageType::Tenant, "0.2.0").min("0.1.0");
    let copied = p.publish(REPOSITORY, &spec).await.unwrap();
    p.sign(REPOSITORY, &first, &[SignatureLayer::by(&trusted, &here, &first)]).await.unwrap();
    let elsewhere = "other.example/team/app";
    p.sign(REPOSITORY, &copied, &[SignatureLayer::by(&trusted, elsewhere, &copied)]).await.unwrap();

    h.write_jukebox("enforce", &[("release", &trusted)]);
    h.scan().await;
    let signed_elsewhere = Verdict::Verified { key: "release".into(), reference: elsewhere.into() };
    assert_eq!(
        h.verdicts().await.get("0.2.0"),
        Some(&signed_elsewhere),
        "simple signing binds the digest only"
    );
    assert_eq!(offered(&h.packages().await, VerifyMode::Enforce), Ok("0.2.0".into()));

    h.write_jukebox_with("enforce", &[("release", &trusted)], true);
    h.scan().await;
    let verdicts = h.verdicts().await;
    assert_eq!(verdicts.get("0.2.0"), Some(&Verdict::ReferenceMismatch { reference: elsewhere.into() }));
    let signed_here = Verdict::Verified { key: "release".into(), reference: here.clone() };
    assert_eq!(verdicts.get("0.1.0"), Some(&signed_here), "{verdicts:?}");
    assert_eq!(
        offered(&h.packages().await, VerifyMode::Enforce),
        Ok("0.1.0".into()),
        "the copy is not offered"
    );
}

/// Six waypoints signed as cosign v3 and v2 write signatures: a legacy `.sig` by the trusted key, a keyed bundle by it, a
/// trusted bundle whose Statement names 0.1.0 (attached to 0.3.0), a
/// trusted bundle whose DSSE payload was changed afterwards, an SLSA
/// provenance attestation alone (no signature), a bundle by another key.
/// Bundles are published as cosign v3 does on a registry without the
/// referrers API: artifact manifests listed by the tag schema's index.
async fn bundle_revisions(
    trusted: &Signer,
    other: &Signer,
) -> (RegistryServer, BTreeMap<&'static str, String>) {
    let (registry, digests) = six_waypoints().await;
    let p = registry.publisher();
    let reference = format!("{}/{REPOSITORY}", registry.host());
    let signature = |digest: &str| statement(digest, SIGN_PREDICATE_TYPE, serde_json::json!({}));
    let attach = |subject: &str, bundle: Vec<u8>, predicate: &'static str| {
        let (p, subject) = (p.clone(), subject.to_string());
        async move { p.attach_bundle(REPOSITORY, &subject, &bundle, predicate).await.unwrap() }
    };
    p.sign(REPOSITORY, &digests["0.1.0"], &[SignatureLayer::by(trusted, &reference, &digests["0.1.0"])])
        .await
        .unwrap();
    attach(&digests["0.2.0"], trusted.bundle(&signature(&digests["0.2.0"])), SIGN_PREDICATE_TYPE).await;
    attach(&digests["0.3.0"], trusted.bundle(&signature(&digests["0.1.0"])), SIGN_PREDICATE_TYPE).await;
    let mut tampered: serde_json::Value =
        serde_json::from_slice(&trusted.bundle(&signature(&digests["0.4.0"]))).unwrap();
    let swapped = signature(&digests["0.4.0"]).into_iter().chain(*b" ").collect::<Vec<u8>>();
    tampered["dsseEnvelope"]["payload"] =
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, swapped).into();
    attach(&digests["0.4.0"], serde_json::to_vec(&tampered).unwrap(), SIGN_PREDICATE_TYPE).await;
    let slsa = "https://slsa.dev/provenance/v1";
    let provenance = statement(&digests["0.5.0"], slsa, serde_json::json!({"runDetails": {}}));
    attach(&digests["0.5.0"], trusted.bundle(&provenance), slsa).await;
    attach(&digests["0.6.0"], other.bundle(&signature(&digests["0.6.0"])), SIGN_PREDICATE_TYPE).await;
    (registry, digests)
}

/// GETs of the referrers API and of manifests and blobs naming `digest`.
fn reads_of(front: &HttpFront, digest: &str) -> usize {
    let hex = digest.trim_start_matches("sha256:");
    front.seen().iter().filter(|s| s.method == Method::GET && s.path.contains(hex)).count()
}

/// #67 items 1 and 2, on distribution 2.8 (no referrers API: the tag
/// schema), then through a front serving the referrers API from the same
/// content: each signature gets its verdict, `enforce` offers the newest
/// verified revision, and an unchanged rescan reads nothing of a verified one.
#[tokio::test]
async fn bundles_get_their_verdicts_by_the_tag_schema_and_by_the_referrers_api() {
    let (trusted, other) = (Signer::from_label("release"), Signer::from_label("someone else"));
    let (registry, digests) = bundle_revisions(&trusted, &other).await;
    let expected = BTreeMap::from([
        ("0.1.0".to_string(), verified("release", &registry)),
        ("0.2.0".into(), Verdict::Verified { key: "release".into(), reference: String::new() }),
        ("0.3.0".into(), Verdict::DigestMismatch { signed: digests["0.1.0"].clone() }),
        ("0.4.0".into(), Verdict::UntrustedKey),
        ("0.5.0".into(), Verdict::Unsigned),
        ("0.6.0".into(), Verdict::UntrustedKey),
    ]);
    let h = Harness::start(registry).await;
    h.write_jukebox("warn", &[("release", &trusted)]);
    h.scan().await;
    assert_eq!(h.verdicts().await, expected, "by the tag schema");
    assert_eq!(offered(&h.packages().await, VerifyMode::Enforce), Ok("0.2.0".into()));
    let tag_schema = digests["0.2.0"].replacen(':', "-", 1);
    assert!(h.front.count(&Method::GET, &format!("/manifests/{tag_schema}")) >= 1, "the index was read");

    h.front.reset_counts();
    h.scan().await;
    for tag in ["0.1.0", "0.2.0"] {
        assert_eq!(reads_of(&h.front, &digests[tag]), 0, "{tag}: verified, nothing read again");
    }
    assert_eq!(h.gets(), 0, "an unchanged registry: no GET of a manifest or a blob");
    assert_eq!(h.front.count(&Method::GET, "/referrers/"), 0, "the 404 is remembered");

    // The same content behind a registry offering the referrers API.
    let h = Harness::start(h.registry).await;
    h.front.serve_referrers();
    h.write_jukebox("warn", &[("release", &trusted)]);
    h.scan().await;
    assert_eq!(h.verdicts().await, expected, "by the referrers API");
    assert!(h.front.count(&Method::GET, "/referrers/") >= 6, "asked for each revision");
    assert_eq!(h.front.count(&Method::GET, &format!("/manifests/{tag_schema}")), 0, "no tag schema read");
    h.front.reset_counts();
    h.scan().await;
    for tag in ["0.1.0", "0.2.0"] {
        assert_eq!(reads_of(&h.front, &digests[tag]), 0, "{tag}: verified, nothing read again");
    }
}

/// #67 item 5: a signature payload that answered 404 once is a scan error,
/// not a malformed signature remembered for as long as its evidence is
/// cached: the revision is verified at the next scan after the fault heals.
#[tokio::test]
async fn a_payload_blob_missing_once_is_read_again_at_the_next_scan() {
    let trusted = Signer::from_label("release");
    let h = Harness::start(RegistryServer::start().await.unwrap()).await;
    let p = h.registry.publisher();
    let digest =
        p.publish(REPOSITORY, &PackageSpec::new("sec", "app", PackageType::Tenant, "0.1.0")).await.unwrap();
    let layer = SignatureLayer::by(&trusted, &format!("{}/{REPOSITORY}", h.registry.host()), &digest);
    let payload = vynil_testkit::sha256_digest(&layer.payload);
    p.sign(REPOSITORY, &digest, &[layer]).await.unwrap();
    h.write_jukebox("enforce", &[("release", &trusted)]);

    h.front.inject(Fault::new(Some(Method::GET), &format!("/blobs/{payload}"), 1, FaultAction::Status(404)));
    let record = h.scan_record().await;
    assert_ne!(record.state, RecordState::Succeeded, "a missing payload fails the read: {record:?}");
    assert!(format!("{:?}", record.errors).contains("BLOB_UNKNOWN"), "{record:?}");

    h.scan().await;
    assert_eq!(h.verdicts().await.get("0.1.0"), Some(&verified("release", &h.registry)));
}

const CI_ISSUER: &str = "https://token.actions.example";
const CI: &str = "https://git.example/sec/app/.github/workflows/release.yml@refs/tags/v1";

/// Six waypoints signed as cosign v3 and v2 write them under a test
/// Sigstore: a legacy `.sig` by the trusted key, a keyed bundle with its
/// Rekor entry, a keyed bundle without one, a keyless bundle by the trusted
/// CI identity, a keyless bundle by someone else, a keyless bundle by the
/// CI whose Statement names 0.5.0.
async fn keyless_revisions(
    sigstore: &Sigstore,
    trusted: &Signer,
) -> (RegistryServer, BTreeMap<&'static str, String>) {
    let (registry, digests) = six_waypoints().await;
    let p = registry.publisher();
    let reference = format!("{}/{REPOSITORY}", registry.host());
    let signature = |digest: &str| statement(digest, SIGN_PREDICATE_TYPE, serde_json::json!({}));
    p.sign(REPOSITORY, &digests["0.1.0"], &[SignatureLayer::by(trusted, &reference, &digests["0.1.0"])])
        .await
        .unwrap();
    let bundles = [
        ("0.2.0", sigstore.keyed_bundle(trusted, &signature(&digests["0.2.0"])).unwrap()),
        ("0.3.0", trusted.bundle(&signature(&digests["0.3.0"]))),
        ("0.4.0", sigstore.keyless_bundle(CI_ISSUER, CI, &signature(&digests["0.4.0"])).unwrap()),
        (
            "0.5.0",
            sigstore.keyless_bundle(CI_ISSUER, "mallory@example.com", &signature(&digests["0.5.0"])).unwrap(),
        ),
        ("0.6.0", sigstore.keyless_bundle(CI_ISSUER, CI, &signature(&digests["0.5.0"])).unwrap()),
    ];
    for (tag, bundle) in bundles {
        p.attach_bundle(REPOSITORY, &digests[tag], &bundle, SIGN_PREDICATE_TYPE).await.unwrap();
    }
    (registry, digests)
}

/// #67 items 2, 3 and 8 on distribution 2.8 (the tag schema): keyless
/// bundles verified offline against the trusted root a test Sigstore
/// wrote, the transparency log required by default once a root is given,
/// an identity removed re-verified without reading a manifest, and no
/// connection but the registry's (the root names a listener that counts).
#[tokio::test]
async fn keyless_signatures_are_verified_offline_against_the_trusted_root() {
    let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    elsewhere.set_nonblocking(true).unwrap();
    let sigstore = Sigstore::new("vynil", &format!("http://{}", elsewhere.local_addr().unwrap())).unwrap();
    let trusted = Signer::from_label("release");
    let (registry, digests) = keyless_revisions(&sigstore, &trusted).await;
    let h = Harness::start(registry).await;
    let root = sigstore.trusted_root().unwrap();
    let name = |holder: Holder| format!("sigstore-{}", holder.kind());
    for holder in [Holder::Secret, Holder::ConfigMap] {
        write_opted_in(h.dir.path(), holder, &name(holder), &[("trusted_root.json", &root)]).unwrap();
    }
    // The root from an opted-in ConfigMap first, then from a Secret.
    let mut at = Holder::ConfigMap;
    let policy = |at: Holder, identity: bool, require_log: Option<bool>| {
        let pem = trusted.public_pem();
        let builder = JukeboxBuilder::new("box")
            .list([format!("{}/{REPOSITORY}", h.front.host())])
            .verify("warn", &[("release", pem.as_str())]);
        let builder = if identity { builder.identity("ci", CI_ISSUER, CI) } else { builder };
        builder.trusted_root(at, &name(at), require_log).write_to(h.dir.path()).unwrap();
    };
    let key = |reference: String| Verdict::Verified { key: "release".into(), reference };
    let mut expected = BTreeMap::from([
        ("0.1.0".to_string(), key(format!("{}/{REPOSITORY}", h.registry.host()))),
        ("0.2.0".into(), key(String::new())),
        ("0.3.0".into(), key(String::new())),
        ("0.4.0".into(), Verdict::Verified { key: "ci".into(), reference: String::new() }),
        ("0.5.0".into(), Verdict::UntrustedKey),
        ("0.6.0".into(), Verdict::DigestMismatch { signed: digests["0.5.0"].clone() }),
    ]);
    policy(at, true, Some(false));
    h.scan().await;
    assert_eq!(h.verdicts().await, expected, "the log not required");
    assert_eq!(offered(&h.packages().await, VerifyMode::Enforce), Ok("0.4.0".into()));

    // By default a trusted root requires the log: the legacy signature and
    // the keyed bundle without an entry no longer count. Decided again from
    // the cached evidence: no manifest or blob is read.
    h.front.reset_counts();
    at = Holder::Secret;
    policy(at, true, None);
    h.scan().await;
    let verdicts = h.verdicts().await;
    for tag in ["0.1.0", "0.3.0"] {
        let Verdict::Malformed { problem } = &verdicts[tag] else { panic!("{tag}: {verdicts:?}") };
        assert!(
            problem.contains("requireTransparencyLog") || problem.contains("transparency log"),
            "{problem}"
        );
        expected.insert(tag.to_string(), verdicts[tag].clone());
    }
    assert_eq!(verdicts, expected, "the log required");
    assert_eq!(h.gets(), 0, "a policy change reads nothing again");

    // The identity removed: what it signed is no longer trusted.
    policy(at, false, None);
    h.scan().await;
    expected.insert("0.4.0".into(), Verdict::UntrustedKey);
    expected.insert("0.6.0".into(), Verdict::UntrustedKey);
    assert_eq!(h.verdicts().await, expected, "the CI identity removed");
    assert_eq!(offered(&h.packages().await, VerifyMode::Enforce), Ok("0.2.0".into()));
    assert_eq!(h.gets(), 0, "nothing read again");
    assert!(
        matches!(elsewhere.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a scan asked Fulcio, the CT log or Rekor"
    );
}

/// #67 item 4 on distribution 2.8: every revision signed; 0.1.0 to 0.3.0
/// with an SLSA provenance of the required builder, 0.4.0 of another
/// builder, 0.5.0 none, 0.6.0 one of the right builder signed by another
/// key. Required from the second scan on: the provenance is read then (the
/// cached evidence was read without it), `enforce` offers 0.3.0, and a
/// rescan reads nothing again.
#[tokio::test]
async fn a_required_provenance_is_read_beside_the_signature_and_its_builder_checked() {
    const SLSA: &str = "https://slsa.dev/provenance/v1";
    const BUILDER: &str = "https://github.com/actions/runner/github-hosted";
    let (trusted, other) = (Signer::from_label("release"), Signer::from_label("someone else"));
    let (registry, digests) = six_waypoints().await;
    let p = registry.publisher();
    let provenance = |digest: &str, builder: &str| {
        statement(digest, SLSA, serde_json::json!({"runDetails": {"builder": {"id": builder}}}))
    };
    for (tag, digest) in &digests {
        let signature = statement(digest, SIGN_PREDICATE_TYPE, serde_json::json!({}));
        p.attach_bundle(REPOSITORY, digest, &trusted.bundle(&signature), SIGN_PREDICATE_TYPE).await.unwrap();
        let attestation = match *tag {
            "0.4.0" => Some(trusted.bundle(&provenance(digest, "https://evil.example/builder"))),
            "0.5.0" => None,
            "0.6.0" => Some(other.bundle(&provenance(digest, BUILDER))),
            _ => Some(trusted.bundle(&provenance(digest, BUILDER))),
        };
        if let Some(attestation) = attestation {
            p.attach_bundle(REPOSITORY, digest, &attestation, SLSA).await.unwrap();
        }
    }
    let h = Harness::start(registry).await;
    let policy = |required: bool| {
        let pem = trusted.public_pem();
        let builder = JukeboxBuilder::new("box")
            .list([format!("{}/{REPOSITORY}", h.front.host())])
            .verify("enforce", &[("release", pem.as_str())]);
        let builder = if required { builder.attestation(SLSA, Some(BUILDER)) } else { builder };
        builder.write_to(h.dir.path()).unwrap();
    };
    policy(false);
    h.scan().await;
    assert!(h.verdicts().await.values().all(Verdict::is_verified), "signed, nothing more asked");

    policy(true);
    h.scan().await;
    let verdicts = h.verdicts().await;
    for tag in ["0.1.0", "0.2.0", "0.3.0"] {
        assert!(verdicts[tag].is_verified(), "{tag}: {verdicts:?}");
    }
    for (tag, why) in
        [("0.4.0", "its builder is"), ("0.5.0", "none is attached"), ("0.6.0", "no trusted key")]
    {
        let Verdict::Unattested { predicate_type, problem } = &verdicts[tag] else {
            panic!("{tag}: {verdicts:?}")
        };
        assert!(predicate_type.contains(SLSA) && problem.contains(why), "{tag}: {verdicts:?}");
    }
    assert_eq!(offered(&h.packages().await, VerifyMode::Enforce), Ok("0.3.0".into()));

    h.front.reset_counts();
    h.scan().await;
    assert_eq!(h.verdicts().await, verdicts);
    assert_eq!(h.gets(), 0, "read for the required predicate once: nothing read again");
}
