//! `vynilctl` as a user runs it: the built binary, as a subprocess, against
//! a gateway in front of the real services (fake Kubernetes API, real
//! registry), checking what it prints, what it leaves in the registry, and
//! each documented exit code.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output, Stdio};

use kube::api::PostParams;
use serde_json::json;
use vynil_e2e::{Stack, eventually};
use vynil_gateway::{
    api::{catalog::CatalogPage, purge::Plan, purge::Report},
    auth::Role,
};
use vynil_testkit::{
    PackageType,
    kube_api::{AgentOutcome, FakeAgent},
};

mod common;

use common::{TestGateway, token};

/// Runs `vynilctl args…` with `env`, stdin closed (no terminal).
async fn vynilctl(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vynilctl"));
    command
        .args(args)
        .stdin(Stdio::null())
        .env_remove("VYNIL_URL")
        .env_remove("VYNIL_TOKEN")
        .env("NO_COLOR", "1");
    for (name, value) in env {
        command.env(name, value);
    }
    tokio::task::spawn_blocking(move || command.output().unwrap()).await.unwrap()
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

#[tokio::test]
async fn a_session_of_vynilctl_scans_purges_explains_and_exits_with_the_documented_codes() {
    let stack = Stack::start("think/ollama").await;
    // 0.1.11 fails having applied a phase (an upgrade an operator must decide on).
    let agent = FakeAgent::start(&stack.api, "vynil-system", |job| match job.tag.as_deref() {
        Some("0.1.11") if job.instance_name == "app" => AgentOutcome::FailAfterApplying {
            applied: vec!["VitalApplied".into()],
            message: "the 0.1.11 migration failed".into(),
        },
        _ => AgentOutcome::succeed(),
    })
    .unwrap();
    for (tag, kind) in
        [("0.1.8", PackageType::Tenant), ("0.1.9", PackageType::Tenant), ("0.1.10", PackageType::Service)]
    {
        stack.publish("think", "ollama", kind, tag).await;
    }
    // One item a page: every list must be followed to its end.
    let gw = TestGateway::start_with(&stack, &["--max-page-size", "1"]).await;
    let admin = token(Role::Admin);
    let env = [("VYNIL_URL", gw.url.as_str()), ("VYNIL_TOKEN", admin.as_str())];

    // A scan followed to its end: without a terminal, the summary alone.
    let scanned = vynilctl(&["scan", "box", "--wait"], &env).await;
    assert_eq!(code(&scanned), 0, "{}", text(&scanned));
    let summary = String::from_utf8_lossy(&scanned.stdout).to_string();
    assert!(summary.contains("succeeded") && summary.contains("1/1 repositories"), "{summary}");
    // One repository of the JukeBox's source, as a registry push would scan it.
    let repository = format!("{}/think/ollama", stack.registry.host());
    let scanned = vynilctl(&["scan", "box", "--repository", &repository, "--wait"], &env).await;
    assert_eq!(code(&scanned), 0, "{}", text(&scanned));
    let summary = String::from_utf8_lossy(&scanned.stdout).to_string();
    assert!(summary.contains(&format!("({repository}): succeeded, 1/1 repositories")), "{summary}");
    let bad = vynilctl(&["scan", "box", "--repository", "no-slash"], &env).await;
    assert_eq!(code(&bad), 2, "{}", text(&bad));

    // The catalog: as a table grouped per package, and as JSON parsed back into the API type.
    let page = eventually("the catalog", || async {
        let shown = vynilctl(&["catalog", "show", "box", "-o", "json"], &env).await;
        let page: CatalogPage = serde_json::from_slice(&shown.stdout).ok()?;
        (page.items.len() == 2).then_some(page)
    })
    .await;
    assert_eq!(page.items[1].roles[0].description, "newest tenant revision");
    let table = vynilctl(&["catalog", "show", "box"], &env).await;
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(
        table.contains("think/ollama") && table.contains("0.1.9") && table.contains("service"),
        "{table}"
    );

    // A purge: the plan with reasons and totals, a refusal without confirmation, then the execution.
    let planned = vynilctl(&["purge", "plan", "jukebox/box"], &env).await;
    let shown = String::from_utf8_lossy(&planned.stdout).to_string();
    assert!(shown.contains("superseded") && shown.contains("1 to delete"), "{shown}");
    let plan: Plan =
        serde_json::from_slice(&vynilctl(&["purge", "plan", "jukebox/box", "-o", "json"], &env).await.stdout)
            .unwrap();
    let deleted: Vec<&str> = plan.entries.iter().filter(|e| !e.keep).map(|e| e.tag.as_str()).collect();
    assert_eq!(deleted, ["0.1.8"]);
    let unconfirmed = vynilctl(&["purge", "execute", &plan.plan_id], &env).await;
    assert_eq!(code(&unconfirmed), 3, "no terminal to ask on: {}", text(&unconfirmed));
    let executed = vynilctl(&["purge", "execute", &plan.plan_id, "--confirm", &plan.target], &env).await;
    assert_eq!(code(&executed), 0, "{}", text(&executed));
    let printed = String::from_utf8_lossy(&executed.stdout).to_string();
    assert!(printed.contains("executed by admin-user") && printed.contains("1 deleted"), "{printed}");
    let listed =
        reqwest::get(format!("{}/v2/think/ollama/tags/list", stack.registry.base_url())).await.unwrap();
    let listed: serde_json::Value = listed.json().await.unwrap();
    let listed: Vec<&str> = listed["tags"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert!(!listed.contains(&"0.1.8") && listed.contains(&"0.1.9"), "{listed:?}");
    let report = vynilctl(&["purge", "report", &plan.plan_id, "-o", "yaml"], &env).await;
    let report: Report = serde_yaml_ng::from_slice(&report.stdout).unwrap();
    assert_eq!(report.executed_by, "admin-user");

    // An index export, where the scanner may write: refused for an operator, written for an admin.
    let destination = stack.exports.path().join("box");
    let to = destination.display().to_string();
    let export = ["index", "export", "box", "--to", to.as_str(), "--confirm", "box"];
    let operator = token(Role::Operator);
    let as_operator = [("VYNIL_URL", gw.url.as_str()), ("VYNIL_TOKEN", operator.as_str())];
    let refused = vynilctl(&export, &as_operator).await;
    assert_eq!(code(&refused), 3, "{}", text(&refused));
    assert!(text(&refused).contains("admin"), "{}", text(&refused));
    assert!(!destination.join("index.yaml").exists(), "nothing written for the operator");
    let unconfirmed = vynilctl(&["index", "export", "box", "--to", to.as_str()], &env).await;
    assert_eq!(code(&unconfirmed), 3, "no terminal to ask on: {}", text(&unconfirmed));
    let exported = vynilctl(&export, &env).await;
    assert_eq!(code(&exported), 0, "{}", text(&exported));
    assert!(String::from_utf8_lossy(&exported.stdout).contains("exported to"), "{}", text(&exported));
    let index = std::fs::read_to_string(destination.join("index.yaml")).unwrap();
    assert!(index.contains("ollama"), "{index}");

    // A blocked instance is explained, with exit code 3.
    let broken = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "broken", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "think", "package": "nothere"}});
    stack
        .tenant_instances()
        .create(&PostParams::default(), &serde_json::from_value(broken).unwrap())
        .await
        .unwrap();
    let explained = eventually("the instance blocked", || async {
        let out = vynilctl(&["instance", "explain", "tenant/apps/broken"], &env).await;
        (code(&out) == 3).then_some(out)
    })
    .await;
    assert!(text(&explained).contains("blocked by"), "{}", text(&explained));
    let listed = vynilctl(&["instance", "list", "--namespace", "apps"], &env).await;
    assert!(String::from_utf8_lossy(&listed.stdout).contains("tenant/apps/broken"), "{}", text(&listed));

    // A failed upgrade held for an operator: explained, rolled back, its quarantine cleared.
    let app = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "app", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "think", "package": "ollama"}});
    stack
        .tenant_instances()
        .create(&PostParams::default(), &serde_json::from_value(app).unwrap())
        .await
        .unwrap();
    let runs_of = |tag: &str| agent.runs().iter().filter(|r| r.job.tag.as_deref() == Some(tag)).count();
    eventually("0.1.9 installed", || async { (runs_of("0.1.9") == 1).then_some(()) }).await;
    stack.publish("think", "ollama", PackageType::Tenant, "0.1.11").await;
    assert_eq!(code(&vynilctl(&["scan", "box", "--wait"], &env).await), 0);
    let held = eventually("the failed upgrade held", || async {
        let out = vynilctl(&["instance", "explain", "tenant/apps/app"], &env).await;
        // The plan says E_UPGRADE_FAILED as soon as the Job has failed; the hold is what an operator
        // acts on, and it exists once the quarantine is recorded.
        (text(&out).contains("E_UPGRADE_FAILED") && text(&out).contains("awaiting an operator"))
            .then_some(out)
    })
    .await;
    assert_eq!(code(&held), 3, "{}", text(&held));
    assert!(
        text(&held).contains("quarantined 0.1.11 (from 0.1.9")
            && text(&held).contains("awaiting an operator"),
        "{}",
        text(&held)
    );
    let rolled =
        vynilctl(&["instance", "rollback", "tenant/apps/app", "--reason", "migration bug"], &as_operator)
            .await;
    assert_eq!(code(&rolled), 0, "{}", text(&rolled));
    assert!(text(&rolled).contains("rolling back from 0.1.11 to 0.1.9"), "{}", text(&rolled));
    eventually("rolled back", || async { (runs_of("0.1.9") == 2).then_some(()) }).await;
    let again = vynilctl(&["instance", "rollback", "tenant/apps/app"], &as_operator).await;
    assert_eq!(code(&again), 3, "nothing awaits an operator any more: {}", text(&again));
    let cleared =
        vynilctl(&["instance", "clear-quarantine", "tenant/apps/app", "--tag", "0.1.11"], &as_operator).await;
    assert_eq!(code(&cleared), 0, "{}", text(&cleared));
    assert!(text(&cleared).contains("0.1.11 is no longer quarantined"), "{}", text(&cleared));

    // An instance whose upgrades an operator approves: the step shown, then approved.
    let gated = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "gated", "namespace": "apps",
            "annotations": {"vynil.solidite.fr/upgrade-approval": "manual"}},
        "spec": {"jukebox": "box", "category": "think", "package": "ollama"}});
    stack
        .tenant_instances()
        .create(&PostParams::default(), &serde_json::from_value(gated).unwrap())
        .await
        .unwrap();
    let gated_runs = |tag: &str| {
        agent
            .runs()
            .iter()
            .filter(|r| r.job.instance_name == "gated" && r.job.tag.as_deref() == Some(tag))
            .count()
    };
    eventually("gated installed 0.1.11 (a first install needs no approval)", || async {
        (gated_runs("0.1.11") == 1).then_some(())
    })
    .await;
    // An instance whose own policy freezes its upgrades: listed as waiting, with why and until when.
    let frozen = json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "frozen", "namespace": "apps"},
        "spec": {"jukebox": "box", "category": "think", "package": "ollama", "upgradePolicy": {"freezes": [
            {"from": "2020-01-01T00:00:00Z", "until": "2099-01-01T00:00:00Z", "reason": "audit season"}]}}});
    stack
        .tenant_instances()
        .create(&PostParams::default(), &serde_json::from_value(frozen).unwrap())
        .await
        .unwrap();
    eventually("frozen installed 0.1.11", || async {
        let runs = agent.runs();
        runs.iter()
            .any(|r| r.job.instance_name == "frozen" && r.job.tag.as_deref() == Some("0.1.11"))
            .then_some(())
    })
    .await;
    stack.publish("think", "ollama", PackageType::Tenant, "0.1.12").await;
    assert_eq!(code(&vynilctl(&["scan", "box", "--wait"], &env).await), 0);
    let pending = eventually("the upgrade pending approval", || async {
        let listed = vynilctl(&["instance", "list", "--namespace", "apps"], &env).await;
        text(&listed).contains("pending_approval").then_some(listed)
    })
    .await;
    let waiting = eventually("the frozen upgrade waiting", || async {
        let listed = vynilctl(&["instance", "list", "--namespace", "apps"], &env).await;
        text(&listed).contains("waiting").then_some(listed)
    })
    .await;
    assert!(
        text(&waiting).contains("0.1.11 → 0.1.12")
            && text(&waiting).contains("frozen until 2099-01-01")
            && text(&waiting).contains("audit season"),
        "{}",
        text(&waiting)
    );
    assert!(text(&pending).contains("0.1.11 → 0.1.12"), "{}", text(&pending));
    assert_eq!(gated_runs("0.1.12"), 0, "nothing runs before the approval");
    let approved =
        vynilctl(&["instance", "approve", "tenant/apps/gated", "--reason", "reviewed"], &as_operator).await;
    assert_eq!(code(&approved), 0, "{}", text(&approved));
    assert!(
        text(&approved).contains("approved the upgrade 0.1.11 → 0.1.12 (fingerprint"),
        "{}",
        text(&approved)
    );
    eventually("0.1.12 installed once approved", || async { (gated_runs("0.1.12") == 1).then_some(()) })
        .await;
    let stale =
        vynilctl(&["instance", "approve", "tenant/apps/gated", "--fingerprint", "0123abcd"], &as_operator)
            .await;
    assert_eq!(code(&stale), 3, "nothing awaits approval any more: {}", text(&stale));

    // A recall: refused for a viewer; for an operator, shown in the catalog and in the explanation.
    let viewer = token(Role::Viewer);
    let as_viewer = [("VYNIL_URL", gw.url.as_str()), ("VYNIL_TOKEN", viewer.as_str())];
    let recall = ["jukebox", "recall", "box", "0.1.12", "--reason", "leaks memory"];
    assert_eq!(code(&vynilctl(&recall, &as_viewer).await), 3, "a viewer may not recall");
    // #65 item 7, the attack: an operator's recall that moves instances away
    // (to an older revision, across a freeze) is an admin's act.
    let moving = ["jukebox", "recall", "box", "0.1.12", "--reason", "leaks memory", "--move-away"];
    let refused = vynilctl(&moving, &as_operator).await;
    assert_eq!(code(&refused), 3, "an operator may not move instances away: {}", text(&refused));
    assert!(text(&refused).contains("admin"), "{}", text(&refused));
    let recalled = vynilctl(&recall, &as_operator).await;
    assert_eq!(code(&recalled), 0, "{}", text(&recalled));
    assert!(text(&recalled).contains("0.1.12 is recalled for JukeBox box"), "{}", text(&recalled));
    assert!(text(&recalled).contains("operator-user"), "who recalled it: {}", text(&recalled));
    // #65 item 12: each recall change is in the audit trail, an Event on the JukeBox naming who.
    let audited = |reason: &'static str| {
        let api = &stack.api;
        async move {
            let events = api.objects("events.k8s.io", "events");
            events.into_iter().find(|e| e["reason"] == reason && e["regarding"]["name"] == "box")
        }
    };
    let trail = eventually("the RevisionRecalled Event", || audited("RevisionRecalled")).await;
    assert!(
        trail["note"].as_str().is_some_and(|n| n.contains("operator-user") && n.contains("0.1.12")),
        "{trail}"
    );
    let shown = eventually("the recall in the catalog", || async {
        let table = vynilctl(&["catalog", "show", "box"], &env).await;
        text(&table).contains("recalled: leaks memory").then_some(table)
    })
    .await;
    let json = vynilctl(&["catalog", "show", "box", "-o", "json"], &env).await;
    let page: CatalogPage = serde_json::from_slice(&json.stdout).unwrap();
    assert!(page.items.iter().all(|p| p.first_seen.is_some()), "{}", text(&shown));
    let running = eventually("gated running a recalled revision", || async {
        let out = vynilctl(&["instance", "explain", "tenant/apps/gated"], &env).await;
        text(&out).contains("running a recalled revision: 0.1.12 is recalled: leaks memory").then_some(out)
    })
    .await;
    assert_eq!(code(&running), 0, "kept, not blocked: {}", text(&running));
    let path =
        vynilctl(&["catalog", "path", "box", "think/ollama", "--type", "tenant", "--from", "0.1.11"], &env)
            .await;
    // 0.1.11 has left the catalog's view and 0.1.12 is recalled: no step.
    assert_eq!(code(&path), 3, "{}", text(&path));
    assert!(text(&path).contains("0.1.12 is recalled: leaks memory (withheld)"), "{}", text(&path));
    let lifted = vynilctl(&["jukebox", "lift-recall", "box", "0.1.12"], &as_operator).await;
    assert_eq!(code(&lifted), 0, "{}", text(&lifted));
    assert!(text(&lifted).contains("0.1.12 is no longer recalled"), "{}", text(&lifted));
    let trail = eventually("the RecallLifted Event", || audited("RecallLifted")).await;
    assert!(trail["note"].as_str().is_some_and(|n| n.contains("operator-user")), "{trail}");
    let again = vynilctl(&["jukebox", "lift-recall", "box", "0.1.12"], &as_operator).await;
    assert_eq!(code(&again), 1, "not recalled any more: {}", text(&again));

    // Every documented exit code.
    assert_eq!(code(&vynilctl(&["scan"], &env).await), 2, "usage: a missing argument");
    assert_eq!(code(&vynilctl(&["jukebox", "list"], &[]).await), 2, "usage: no gateway");
    let bad = vynilctl(&["scan", "box", "a/b/c"], &env).await;
    assert_eq!(code(&bad), 2, "bad input: {}", text(&bad));
    assert!(text(&bad).contains("BAD_REQUEST") && text(&bad).contains("request "), "{}", text(&bad));
    let wrong = [("VYNIL_URL", gw.url.as_str()), ("VYNIL_TOKEN", "wrong")];
    assert_eq!(code(&vynilctl(&["jukebox", "list"], &wrong).await), 3, "refused: unknown token");
    assert_eq!(code(&vynilctl(&["purge", "report", "no-such-plan"], &env).await), 1, "failed: not found");
    let closed = format!("http://127.0.0.1:{}", vynil_testkit::free_port().unwrap());
    let nowhere = [("VYNIL_URL", closed.as_str()), ("VYNIL_TOKEN", admin.as_str())];
    assert_eq!(code(&vynilctl(&["jukebox", "list"], &nowhere).await), 4, "unreachable");

    // Login stores a context (0600) that later commands use without flags.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("vynilctl.yaml");
    let config_arg = config.display().to_string();
    let mut login = Command::new(env!("CARGO_BIN_EXE_vynilctl"));
    login
        .args(["login", "--url", &gw.url, "--config", &config_arg])
        .env_remove("VYNIL_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = login.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), format!("{admin}\n").as_bytes()).unwrap();
    let logged = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    assert_eq!(code(&logged), 0, "{}", text(&logged));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&config).unwrap().permissions().mode() & 0o777, 0o600);
    let listed = vynilctl(&["--config", &config_arg, "jukebox", "list"], &[]).await;
    assert_eq!(code(&listed), 0, "{}", text(&listed));
    assert!(String::from_utf8_lossy(&listed.stdout).contains("box"));
    let version = vynilctl(&["--config", &config_arg, "version", "-o", "json"], &[]).await;
    let version: serde_json::Value = serde_json::from_slice(&version.stdout).unwrap();
    assert_eq!(version["server"]["api"], "v1", "{version}");
    let completion = vynilctl(&["completion", "bash"], &[]).await;
    assert!(code(&completion) == 0 && String::from_utf8_lossy(&completion.stdout).contains("vynilctl"));

    gw.stop.trigger();
    stack.stop().await;
}

/// #50 as an operator reads it: `vynilctl catalog show` has a signature
/// column, and the API answers each revision's verdict; under `warn` every
/// revision is offered, the unverified ones marked.
#[tokio::test]
async fn the_catalog_shows_each_revisions_signature_verdict() {
    use vynil_gateway::api::catalog::SignatureVerdict;
    use vynil_testkit::{SignatureLayer, Signer};
    let stack = Stack::start("sec/app").await;
    let release = Signer::from_label("release");
    let signed = stack.publish("sec", "app", PackageType::Tenant, "0.1.0").await;
    let reference = format!("{}/sec/app", stack.registry.host());
    let layer = SignatureLayer::by(&release, &reference, &signed);
    stack.registry.publisher().sign("sec/app", &signed, &[layer]).await.unwrap();
    let unsigned = PackageType::Tenant;
    let spec = vynil_testkit::PackageSpec::new("sec", "app", unsigned, "0.2.0").min("0.1.0");
    stack.registry.publisher().publish("sec/app", &spec).await.unwrap();
    let policy = json!({"spec": {"verify": {"mode": "warn", "keys": [
        {"name": "release", "public_key": release.public_pem()}]}}});
    stack.boxes.patch("box", &Default::default(), &kube::api::Patch::Merge(&policy)).await.unwrap();
    stack.scan_until(&["0.2.0", "0.1.0"]).await;
    let gw = TestGateway::start(&stack).await;
    let admin = token(Role::Admin);
    let env = [("VYNIL_URL", gw.url.as_str()), ("VYNIL_TOKEN", admin.as_str())];

    let page = eventually("the verdicts in the catalog", || async {
        let shown = vynilctl(&["catalog", "show", "box", "-o", "json"], &env).await;
        let page: CatalogPage = serde_json::from_slice(&shown.stdout).ok()?;
        page.items.iter().all(|p| p.signature.is_some()).then_some(page)
    })
    .await;
    let verdict =
        |tag: &str| page.items.iter().find(|p| p.tag == tag).and_then(|p| p.signature.clone()).unwrap();
    assert_eq!(verdict("0.1.0").verdict, SignatureVerdict::Verified);
    assert_eq!(verdict("0.1.0").key.as_deref(), Some("release"));
    assert_eq!(verdict("0.2.0").verdict, SignatureVerdict::Unsigned);
    let marked = page.items.iter().find(|p| p.tag == "0.2.0").unwrap();
    assert!(
        marked.roles.iter().any(|r| r.description == "unverified: unsigned" && !r.enforced),
        "{marked:?}"
    );
    let table = text(&vynilctl(&["catalog", "show", "box"], &env).await);
    assert!(table.contains("SIGNATURE") && table.contains("verified by release"), "{table}");
    assert!(table.contains("unsigned"), "{table}");
}
