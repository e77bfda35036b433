//! The web page in a real browser: headless Chromium (Debian's `chromium`)
//! driven by `playwright-core` (`gateway/tests/web/e2e.mjs`) against a
//! gateway in front of the real services, fake Kubernetes API and a real
//! registry. Screenshots of each view go to the folder printed; the script
//! asserts each view's visible text. Missing parts fail with the command
//! that installs them, never a skip.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{path::Path, process::Command, time::Duration};

use kube::api::PostParams;
use serde_json::json;
use vynil_e2e::{Stack, eventually};
use vynil_gateway::auth::Role;

mod common;

use common::{TestGateway, token};
use vynil_testkit::{
    PackageType, SignatureLayer, Signer,
    kube_api::{AgentOutcome, FakeAgent},
};

const CHROMIUM: &str = "/usr/bin/chromium";

fn requirements(web: &Path) {
    assert!(
        Path::new(CHROMIUM).is_file(),
        "{CHROMIUM} is missing: apt-get install -y chromium (scripts/test.sh does)"
    );
    let node = Command::new("node").arg("--version").output();
    assert!(node.is_ok_and(|o| o.status.success()), "node is missing: apt-get install -y nodejs npm");
    assert!(
        web.join("node_modules/playwright-core").is_dir(),
        "playwright-core is missing: npm ci --prefix gateway/tests/web (scripts/test.sh does)"
    );
}

#[tokio::test]
async fn the_web_page_in_chromium_logs_in_scans_shows_the_type_change_purges_explains_and_hides_what_a_viewer_may_not_do()
 {
    let web = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/web");
    requirements(&web);
    let stack = Stack::start("think/ollama").await;
    // 0.1.11, published once the page has purged, fails having applied a phase.
    let _agent = FakeAgent::start(&stack.api, "vynil-system", |job| match job.tag.as_deref() {
        Some("0.1.11") if job.instance_name == "ollama" => AgentOutcome::FailAfterApplying {
            applied: vec!["VitalApplied".into()],
            message: "the 0.1.11 migration failed".into(),
        },
        _ => AgentOutcome::succeed(),
    })
    .unwrap();
    for (tag, kind) in
        [("0.1.8", PackageType::Tenant), ("0.1.9", PackageType::Tenant), ("0.1.10", PackageType::Service)]
    {
        let digest = stack.publish("think", "ollama", kind, tag).await;
        if tag == "0.1.9" {
            // Signed by the key the JukeBox trusts (#50): a badge says so on the catalog page.
            let reference = format!("{}/think/ollama", stack.registry.host());
            let layer = SignatureLayer::by(&Signer::from_label("release"), &reference, &digest);
            stack.registry.publisher().sign("think/ollama", &digest, &[layer]).await.unwrap();
        }
    }
    let policy = json!({"spec": {"verify": {"mode": "warn", "keys": [
        {"name": "release", "public_key": Signer::from_label("release").public_pem()}]}}});
    stack.boxes.patch("box", &Default::default(), &kube::api::Patch::Merge(&policy)).await.unwrap();
    stack.scan_until(&["0.1.10", "0.1.9"]).await;
    let instance = |name: &str, package: &str| {
        json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
            "metadata": {"name": name, "namespace": "apps"},
            "spec": {"jukebox": "box", "category": "think", "package": package}})
    };
    let instances = stack.tenant_instances();
    for (name, package) in
        [("ollama", "ollama"), ("broken", "nothere"), ("gated", "ollama"), ("frozen", "ollama")]
    {
        let mut object = instance(name, package);
        if name == "gated" {
            // Its upgrades wait for an operator's approval (the page's last part).
            object["metadata"]["annotations"] = json!({"vynil.solidite.fr/upgrade-approval": "manual"});
        }
        if name == "frozen" {
            // Its own policy freezes its upgrades: it waits, saying why and until when.
            object["spec"]["upgradePolicy"] = json!({"freezes": [
                {"from": "2020-01-01T00:00:00Z", "until": "2099-01-01T00:00:00Z", "reason": "audit season"}]});
        }
        instances.create(&PostParams::default(), &serde_json::from_value(object).unwrap()).await.unwrap();
    }
    eventually("ollama installed", || async {
        let object = instances.get("ollama").await.unwrap();
        (object.data["status"]["package"]["tag"] == "0.1.9").then_some(())
    })
    .await;

    // One item a page: the page follows the API's page tokens.
    let gateway = TestGateway::start_with(&stack, &["--max-page-size", "1"]).await;
    let (base, stop) = (gateway.url.clone(), gateway.stop.clone());

    let screenshots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-screenshots");
    println!("screenshots of each view: {}", screenshots.display());
    // node and the Chromium it starts, in a process group of their own: a
    // run past its time is killed whole, never left behind.
    let mut node = tokio::process::Command::new("node");
    node.arg(web.join("e2e.mjs"))
        .current_dir(&web)
        .env("BASE_URL", &base)
        .env("ADMIN_TOKEN", token(Role::Admin))
        .env("VIEWER_TOKEN", token(Role::Viewer))
        .env("SCREENSHOTS", &screenshots)
        .env("CHROMIUM", CHROMIUM)
        .process_group(0)
        .kill_on_drop(true)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let run = node.spawn().unwrap();
    // Once the page's purge deleted 0.1.8: 0.1.11, whose upgrade fails (the page's last part).
    let tags_url = format!("{}/v2/think/ollama/tags/list", stack.registry.base_url());
    let publish = async {
        eventually("the page's purge done", || async {
            let listed: serde_json::Value = reqwest::get(&tags_url).await.ok()?.json().await.ok()?;
            (!listed["tags"].as_array()?.iter().any(|t| t == "0.1.8")).then_some(())
        })
        .await;
        stack.publish("think", "ollama", PackageType::Tenant, "0.1.11").await;
        stack.scan_until(&["0.1.11", "0.1.10"]).await;
    };
    let group = nix::unistd::Pid::from_raw(run.id().unwrap() as i32);
    let within: u64 = std::env::var("WEB_TEST_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(180);
    let browser = async { tokio::join!(run.wait_with_output(), publish).0 };
    let output = match tokio::time::timeout(Duration::from_secs(within), browser).await {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            panic!("the browser run took over {within} s (WEB_TEST_SECONDS): node and Chromium were killed");
        }
    };
    let printed =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    println!("{printed}");
    assert!(output.status.success() && printed.contains("web e2e: ok"), "{printed}");
    let views =
        ["1-jukeboxes", "2-catalog", "3-purge-plan", "4-purge-report", "5-instances", "6-viewer-plan"];
    for view in views.into_iter().chain(["7-quarantine", "8-approval", "9-recall"]) {
        let shot = screenshots.join(format!("{view}.png"));
        assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 1000), "{} missing", shot.display());
    }
    // The registry holds what the report says.
    let listed: serde_json::Value =
        reqwest::get(format!("{}/v2/think/ollama/tags/list", stack.registry.base_url()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let mut tags: Vec<&str> =
        listed["tags"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    tags.sort();
    // The kept 0.1.9 keeps its signature.
    let signature = tags.iter().find(|t| t.ends_with(".sig")).copied().unwrap_or("no signature left");
    assert_eq!(
        tags,
        ["0.1.10", "0.1.11", "0.1.9", signature],
        "0.1.8 deleted through the page, the installed 0.1.9 kept"
    );
    stop.trigger();
    stack.stop().await;
}
