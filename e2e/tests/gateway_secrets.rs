//! Secrets never reach the logs: local mode (every service and the gateway
//! in this process) scans a private registry through the gateway with its
//! generated admin token, a browser session is opened and used, and every
//! log line at TRACE level, of every crate, is searched for the tokens, the
//! registry password and the session cookie, as written and base64-encoded.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    io::Write,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use base64::Engine;
use serde_json::{Value, json};
use vynil_testkit::{JukeboxBuilder, PackageSpec, PackageType, RegistryOptions, RegistryServer};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

// One thread: every task of every service logs through this test's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn tokens_registry_credentials_and_sessions_never_appear_in_logs_even_at_trace_level() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let (user, password) = ("robot", "pull-only-Secret-42");
    let registry = RegistryServer::start_with(RegistryOptions {
        basic_auth: Some((user.into(), password.into())),
        ..Default::default()
    })
    .await
    .unwrap();
    registry
        .publisher()
        .publish("db/pg", &PackageSpec::new("db", "pg", PackageType::System, "1.0.0"))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let boxes = dir.path().join("jukeboxes");
    std::fs::create_dir_all(&boxes).unwrap();
    JukeboxBuilder::new("box")
        .list([format!("{}/db/pg", registry.host())])
        .schedule("0 0 1 1 *")
        .write_to(&boxes)
        .unwrap();
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let dockerconfig = dir.path().join("dockerconfig.json");
    std::fs::write(&dockerconfig, json!({"auths": {registry.host(): {"auth": basic}}}).to_string()).unwrap();

    let mut args = vec!["vynil".to_string()];
    for flag in
        ["--catalog-listen", "--scanner-listen", "--purger-listen", "--lifecycle-listen", "--gateway-listen"]
    {
        args.extend([flag.to_string(), "127.0.0.1:0".to_string()]);
    }
    let path = |p: &std::path::Path| p.display().to_string();
    args.extend([
        "--jukebox-dir".into(),
        path(&boxes),
        "--state-dir".into(),
        path(&dir.path().join("state")),
    ]);
    args.extend([
        "--insecure-registry".into(),
        registry.host(),
        "--dockerconfig".into(),
        path(&dockerconfig),
    ]);
    let config = <vynil_local::Config as clap::Parser>::parse_from(args);
    let stop = vynil_runtime::Shutdown::new();
    let bound = vynil_local::bind(config).await.unwrap();
    let gateway = bound.addresses().gateway;
    let local = tokio::spawn(bound.run(stop.signaled()));

    let base = format!("http://{gateway}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while http.get(format!("{base}/healthz")).send().await.is_err() {
        assert!(Instant::now() < deadline, "the gateway never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let admin = std::fs::read_to_string(dir.path().join("state/admin-token")).unwrap().trim().to_string();
    let service = std::fs::read_to_string(dir.path().join("state/service-token")).unwrap().trim().to_string();

    // A scan of the private registry through the gateway, followed to its end.
    let started: Value = http
        .post(format!("{base}/api/v1/jukeboxes/box/scans"))
        .bearer_auth(&admin)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let scan_id = started["scan_id"].as_str().unwrap();
    let events = http
        .get(format!("{base}/api/v1/scans/{scan_id}/events"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(events.contains("\"state\":\"succeeded\""), "{events}");
    let catalog: Value = http
        .get(format!("{base}/api/v1/jukeboxes/box/catalog"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(catalog["items"][0]["tag"], "1.0.0", "the private registry was read: {catalog}");
    // A wrong token and a browser session, used for a state change.
    let wrong =
        http.get(format!("{base}/api/v1/whoami")).bearer_auth(format!("{admin}x")).send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let login =
        http.post(format!("{base}/api/v1/session")).json(&json!({"token": admin})).send().await.unwrap();
    let cookie = login.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    let session: Value = login.json().await.unwrap();
    let csrf = session["csrf_token"].as_str().unwrap().to_string();
    let scanned = http
        .post(format!("{base}/api/v1/jukeboxes/box/scans"))
        .header("cookie", &cookie)
        .header("x-csrf-token", &csrf)
        .json(&json!({"filter": "db"}))
        .send()
        .await
        .unwrap();
    assert_eq!(scanned.status(), 202);

    stop.trigger();
    local.await.unwrap().unwrap();
    drop(_guard);
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).to_string();
    assert!(text.contains("TRACE") && text.contains("answered"), "logs were captured at trace level");
    let cookie_value = cookie.trim_start_matches("vynil_session=").to_string();
    let b64 = |s: &str| {
        [
            base64::engine::general_purpose::STANDARD.encode(s),
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s),
        ]
    };
    let mut secrets: Vec<(String, String)> = vec![
        ("the admin token".into(), admin.clone()),
        ("the service token".into(), service.clone()),
        ("the registry password".into(), password.into()),
        ("the registry basic credentials".into(), basic.clone()),
        ("the session cookie".into(), cookie_value),
        ("the CSRF token".into(), csrf),
    ];
    for (what, value) in [("the admin token", &admin), ("the service token", &service)] {
        for encoded in b64(value) {
            secrets.push((format!("{what}, base64"), encoded));
        }
    }
    for encoded in b64(&format!("{user}:{password}")).into_iter().skip(1) {
        secrets.push(("the registry credentials, url-safe base64".into(), encoded));
    }
    for (what, secret) in secrets {
        if let Some(at) = text.find(&secret) {
            let line = text[..at].rsplit('\n').next().unwrap_or_default();
            panic!("{what} appears in the logs: …{line}");
        }
    }
}
