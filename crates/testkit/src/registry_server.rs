//! A real CNCF distribution 2.8 registry (Debian's `docker-registry`) per test.
//!
//! Delete is enabled, storage is a temp dir, and the blob-descriptor cache is
//! off so that a delete is seen at once by the next read, as tests expect.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use crate::{
    Publisher, Result, TestkitError, io,
    process::{Supervised, find_binary, free_port},
};

/// How to start a registry.
#[derive(Debug, Default, Clone)]
pub struct RegistryOptions {
    /// Require HTTP basic auth with this user and password (htpasswd, bcrypt).
    pub basic_auth: Option<(String, String)>,
    /// Send push and delete notifications (distribution's
    /// `notifications.endpoints`) to this URL, with this `Authorization`.
    pub notify: Option<(String, String)>,
    /// Log every request ([`RegistryServer::requests`]).
    pub access_log: bool,
}

/// One request the registry served, from its access log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedRequest {
    pub method: String,
    pub path: String,
    pub status: u16,
    pub user_agent: String,
}

/// A running registry, killed on drop.
#[derive(Debug)]
pub struct RegistryServer {
    process: Supervised,
    port: u16,
    basic_auth: Option<(String, String)>,
    dir: tempfile::TempDir,
}

impl RegistryServer {
    /// An anonymous registry with empty storage.
    pub async fn start() -> Result<Self> {
        Self::start_with(RegistryOptions::default()).await
    }

    pub async fn start_with(options: RegistryOptions) -> Result<Self> {
        let dir = tempfile::tempdir().map_err(io("creating a registry directory"))?;
        std::fs::create_dir_all(dir.path().join("data")).map_err(io("creating registry storage"))?;
        Self::start_in(dir, options).await
    }

    /// Starts on storage already present under `dir/data`.
    pub(crate) async fn start_in(dir: tempfile::TempDir, options: RegistryOptions) -> Result<Self> {
        let binary = find_binary("docker-registry", "apt-get install -y docker-registry")?;
        if let Some((user, password)) = &options.basic_auth {
            let hash = bcrypt::hash(password, 4)?;
            std::fs::write(dir.path().join("htpasswd"), format!("{user}:{hash}\n"))
                .map_err(io("writing htpasswd"))?;
        }
        let mut last_error = None;
        for _ in 0..3 {
            let port = free_port()?;
            let config = dir.path().join("config.yml");
            std::fs::write(&config, config_yaml(dir.path(), port, &options))
                .map_err(io("writing the registry config"))?;
            let mut command = Command::new(&binary);
            command.arg("serve").arg(&config);
            let mut process = Supervised::spawn(
                format!("docker-registry :{port}"),
                command,
                &dir.path().join("registry.log"),
            )?;
            let url = format!("http://127.0.0.1:{port}/v2/");
            let client = reqwest::Client::new();
            let ready = || {
                let request = client.get(&url).timeout(Duration::from_secs(1)).send();
                async move {
                    // 200 when anonymous, 401 when auth is on: both mean "serving".
                    matches!(request.await, Ok(r) if r.status().as_u16() == 200 || r.status().as_u16() == 401)
                }
            };
            match process.wait_ready(Duration::from_secs(15), ready).await {
                Ok(()) => {
                    return Ok(Self { process, port, basic_auth: options.basic_auth, dir });
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| TestkitError::Fixture("registry did not start".into())))
    }

    /// `127.0.0.1:<port>`: the registry part of an image reference.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:<port>`
    pub fn base_url(&self) -> String {
        format!("http://{}", self.host())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn basic_auth(&self) -> Option<(&str, &str)> {
        self.basic_auth.as_ref().map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// The storage root (`<dir>/data`), e.g. to snapshot it as a fixture.
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A publisher that pushes to this registry with its credentials.
    pub fn publisher(&self) -> Publisher {
        Publisher::new(self.host(), self.basic_auth.clone())
    }

    /// Every request served so far, in order, when started with
    /// `access_log` (distribution's combined log format: `… "GET /v2/… HTTP/1.1"
    /// 200 … "<referer>" "<user agent>"`).
    pub fn requests(&self) -> Vec<LoggedRequest> {
        let log = std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default();
        log.lines().filter_map(logged_request).collect()
    }

    /// Stops the registry now (SIGKILL); its storage stays until drop.
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

/// A combined-log-format line: `… "METHOD PATH PROTO" STATUS SIZE "REFERER" "UA"`.
fn logged_request(line: &str) -> Option<LoggedRequest> {
    let quoted: Vec<&str> = line.split('"').collect();
    // [prefix, request, " status size ", referer, " ", user agent, rest]
    let mut request = quoted.get(1)?.split(' ');
    let (method, path) = (request.next()?.to_string(), request.next()?.to_string());
    if !path.starts_with('/') {
        return None;
    }
    let status = quoted.get(2)?.split_whitespace().next()?.parse().ok()?;
    let user_agent = quoted.get(5)?.to_string();
    Some(LoggedRequest { method, path, status, user_agent })
}

fn config_yaml(dir: &Path, port: u16, options: &RegistryOptions) -> String {
    let root = dir.join("data");
    let mut yaml = format!(
        "version: 0.1\n\
         log:\n  level: warn\n  accesslog:\n    disabled: {no_access_log}\n\
         storage:\n  filesystem:\n    rootdirectory: {root}\n  delete:\n    enabled: true\n\
         http:\n  addr: 127.0.0.1:{port}\n  secret: vynil-testkit\n",
        root = root.display(),
        no_access_log = !options.access_log,
    );
    if let Some((url, authorization)) = &options.notify {
        // Sent as fast as the registry can: each event at once, retried
        // every 100 ms while the endpoint refuses.
        yaml.push_str(&format!(
            "notifications:\n  endpoints:\n    - name: vynil\n      url: {url}\n      \
             headers:\n        Authorization: [{authorization:?}]\n      timeout: 2s\n      \
             threshold: 1\n      backoff: 100ms\n"
        ));
    }
    if options.basic_auth.is_some() {
        yaml.push_str(&format!(
            "auth:\n  htpasswd:\n    realm: vynil-testkit\n    path: {}\n",
            dir.join("htpasswd").display()
        ));
    }
    yaml
}
