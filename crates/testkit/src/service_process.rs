//! Runs a service binary as a real process and talks to it over gRPC.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use nix::sys::signal::Signal;
pub use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::{Result, TestkitError, io, process::Supervised};

/// A service process listening on a loopback port, killed on drop. It can be
/// killed (`SIGKILL`), frozen and thawed, and started again on the same port
/// with the same arguments, as a restarted pod would be.
#[derive(Debug)]
pub struct ServiceProcess {
    process: Supervised,
    launch: Launch,
    port: u16,
    /// How many times it was started (each start has its own log).
    starts: usize,
    dir: tempfile::TempDir,
}

/// How a [`ServiceProcess`] is started, kept to start it again.
#[derive(Debug, Clone)]
struct Launch {
    binary: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    ready: Readiness,
}

/// When a started process counts as up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Its gRPC health check says SERVING.
    Grpc,
    /// `GET <path>` over HTTP answers a success (a gateway's `/healthz`).
    Http(String),
}

impl ServiceProcess {
    /// Starts `binary --listen 127.0.0.1:<free port> <args>` and waits until its
    /// gRPC health check says SERVING.
    pub async fn start(binary: &Path, args: &[&str]) -> Result<Self> {
        Self::start_with_env(binary, args, &[]).await
    }

    /// [`ServiceProcess::start`] with extra environment variables (`KUBECONFIG`…).
    pub async fn start_with_env(binary: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        Self::launch(binary, args, env, Readiness::Grpc).await
    }

    /// [`ServiceProcess::start_with_env`], up once `ready` says so.
    pub async fn launch(
        binary: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        ready: Readiness,
    ) -> Result<Self> {
        let launch = Launch {
            binary: binary.to_path_buf(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ready,
        };
        Self::launch_on_ports(launch, crate::free_port).await
    }

    /// Starts `launch` on the ports `ports` hands out, trying the next one
    /// when the process could not listen on its port: a port free when
    /// [`crate::free_port`] probed it can be taken before the service binds
    /// it (by a parallel test), and that race is not the service's failure.
    /// Any other early exit fails at once.
    async fn launch_on_ports(launch: Launch, mut ports: impl FnMut() -> Result<u16>) -> Result<Self> {
        const ATTEMPTS: usize = 3;
        let dir = tempfile::tempdir().map_err(io("creating a service directory"))?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = ports()?;
            match spawn(&launch, port, &dir.path().join(format!("service-port-{port}.log"))).await {
                Ok(process) => return Ok(Self { process, launch, port, starts: 1, dir }),
                Err(TestkitError::ExitedEarly { log, .. }) if attempt < ATTEMPTS && lost_port(&log, port) => {
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// [`ServiceProcess::start`] on `port` first (then on free ports), for a
    /// test of the lost-port retry.
    pub async fn start_trying_port_first(binary: &Path, args: &[&str], port: u16) -> Result<Self> {
        let launch = Launch {
            binary: binary.to_path_buf(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: Vec::new(),
            ready: Readiness::Grpc,
        };
        let mut first = Some(port);
        Self::launch_on_ports(launch, move || first.take().map_or_else(crate::free_port, Ok)).await
    }

    /// Kills the process now (`SIGKILL`, as `kill -9` or an OOM kill would):
    /// it releases nothing, its leases expire on their own.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts the process again, on the same port with the same arguments
    /// (killing it first if it still runs), and waits until it is up.
    pub async fn restart(&mut self) -> Result<()> {
        self.process.kill();
        self.starts += 1;
        let log = self.dir.path().join(format!("service-{}.log", self.starts));
        self.process = spawn(&self.launch, self.port, &log).await?;
        Ok(())
    }

    /// [`ServiceProcess::restart`] with `flag`'s value set to `value` (added
    /// when it was not given): the same service, configured otherwise.
    pub async fn restart_with(&mut self, flag: &str, value: &str) -> Result<()> {
        let args = &mut self.launch.args;
        match args.iter().position(|a| a == flag) {
            Some(at) if at + 1 < args.len() => args[at + 1] = value.to_string(),
            _ => args.extend([flag.to_string(), value.to_string()]),
        }
        self.restart().await
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The output of the running process (of its latest start).
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// The health status of `service` ("" for the whole server).
    pub async fn health(&self, service: &str) -> Result<ServingStatus> {
        health(&self.endpoint(), service).await
    }

    /// The services listed by gRPC server reflection, sorted.
    pub async fn reflected_services(&self) -> Result<Vec<String>> {
        use tonic_reflection::pb::v1::{
            ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let mut client = ServerReflectionClient::new(self.channel().await?);
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut stream = client
            .server_reflection_info(futures::stream::iter([request]))
            .await
            .map_err(|e| TestkitError::Grpc(e.to_string()))?
            .into_inner();
        let mut names = Vec::new();
        while let Some(response) = stream.message().await.map_err(|e| TestkitError::Grpc(e.to_string()))? {
            if let Some(MessageResponse::ListServicesResponse(list)) = response.message_response {
                names.extend(list.service.into_iter().map(|s| s.name));
            }
        }
        names.sort();
        Ok(names)
    }

    /// A gRPC channel to the service.
    pub async fn channel(&self) -> Result<tonic::transport::Channel> {
        channel(&self.endpoint()).await
    }

    /// The contract of every service binary: the whole server and `service`
    /// report SERVING, reflection lists `service` and health, and SIGTERM
    /// ends the process with status 0 within 10 s.
    pub async fn check_serves_then_stops(mut self, service: &str) -> Result<()> {
        let fail =
            |what: String| Err(TestkitError::Fixture(format!("{service}: {what}\nlog:\n{}", self.log())));
        for name in ["", service] {
            let status = self.health(name).await?;
            if status != ServingStatus::Serving {
                return fail(format!("health of {name:?} is {status:?}, not SERVING"));
            }
        }
        let reflected = self.reflected_services().await?;
        for name in [service, "grpc.health.v1.Health"] {
            if !reflected.iter().any(|s| s == name) {
                return fail(format!("reflection does not list {name}: {reflected:?}"));
            }
        }
        let status = self.terminate(Duration::from_secs(60)).await?;
        if !status.success() {
            return Err(TestkitError::Fixture(format!("{service}: exit status {status} after SIGTERM")));
        }
        Ok(())
    }

    /// The process id (to read its memory in `/proc`, say).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Freezes the process (SIGSTOP), as a long pause or a partition would:
    /// it answers nothing and renews nothing until [`ServiceProcess::resume`].
    pub fn pause(&self) -> Result<()> {
        self.signal(Signal::SIGSTOP)
    }

    /// Thaws a paused process (SIGCONT): it goes on from where it stood.
    pub fn resume(&self) -> Result<()> {
        self.signal(Signal::SIGCONT)
    }

    fn signal(&self, signal: Signal) -> Result<()> {
        self.process.signal(signal)
    }

    /// Sends SIGTERM and waits for the exit status.
    pub async fn terminate(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        self.process.signal(Signal::SIGTERM)?;
        self.process.wait_exit(timeout).await
    }
}

/// Whether a service's `log` says it could not listen on `port` (our
/// services' `cannot listen on <addr>` error) because it was taken.
fn lost_port(log: &str, port: u16) -> bool {
    log.contains(&format!("cannot listen on 127.0.0.1:{port}")) && log.contains("in use")
}

/// Starts `launch` on `port`, logging to `log`, and waits until it is up.
async fn spawn(launch: &Launch, port: u16, log: &Path) -> Result<Supervised> {
    let mut command = Command::new(&launch.binary);
    command
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .args(&launch.args)
        .envs(launch.env.iter().cloned());
    let name = launch.binary.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut process = Supervised::spawn(format!("{name} :{port}"), command, log)?;
    let endpoint = format!("http://127.0.0.1:{port}");
    let ready = launch.ready.clone();
    let http = reqwest::Client::new();
    process
        .wait_ready(Duration::from_secs(20), || {
            let (endpoint, ready, http) = (endpoint.clone(), ready.clone(), http.clone());
            async move {
                match ready {
                    Readiness::Grpc => matches!(health(&endpoint, "").await, Ok(ServingStatus::Serving)),
                    Readiness::Http(path) => http
                        .get(format!("{endpoint}{path}"))
                        .send()
                        .await
                        .is_ok_and(|answer| answer.status().is_success()),
                }
            }
        })
        .await?;
    Ok(process)
}

async fn channel(endpoint: &str) -> Result<tonic::transport::Channel> {
    tonic::transport::Channel::from_shared(endpoint.to_string())
        .map_err(|e| TestkitError::Grpc(e.to_string()))?
        .connect()
        .await
        .map_err(|e| TestkitError::Grpc(e.to_string()))
}

async fn health(endpoint: &str, service: &str) -> Result<ServingStatus> {
    let mut client = HealthClient::new(channel(endpoint).await?);
    let response = client
        .check(HealthCheckRequest { service: service.to_string() })
        .await
        .map_err(|e| TestkitError::Grpc(e.to_string()))?;
    Ok(response.into_inner().status())
}
