//! Runs a service binary as a real process and talks to it over gRPC.

use std::{path::Path, process::Command, time::Duration};

use nix::{sys::signal::Signal, unistd::Pid};
pub use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::{Result, TestkitError, io, process::Supervised};

/// A service process listening on a loopback port, killed on drop.
#[derive(Debug)]
pub struct ServiceProcess {
    process: Supervised,
    port: u16,
    _dir: tempfile::TempDir,
}

impl ServiceProcess {
    /// Starts `binary --listen 127.0.0.1:<free port> <args>` and waits until its
    /// gRPC health check says SERVING.
    pub async fn start(binary: &Path, args: &[&str]) -> Result<Self> {
        Self::start_with_env(binary, args, &[]).await
    }

    /// [`ServiceProcess::start`] with extra environment variables (`KUBECONFIG`…).
    pub async fn start_with_env(binary: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        let dir = tempfile::tempdir().map_err(io("creating a service directory"))?;
        let port = crate::free_port()?;
        let mut command = Command::new(binary);
        command.arg("--listen").arg(format!("127.0.0.1:{port}")).args(args).envs(env.iter().copied());
        let name = binary.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut process =
            Supervised::spawn(format!("{name} :{port}"), command, &dir.path().join("service.log"))?;
        let endpoint = format!("http://127.0.0.1:{port}");
        process
            .wait_ready(Duration::from_secs(20), || {
                let endpoint = endpoint.clone();
                async move { matches!(health(&endpoint, "").await, Ok(ServingStatus::Serving)) }
            })
            .await?;
        Ok(Self { process, port, _dir: dir })
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

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
    pub async fn check_serves_then_stops(self, service: &str) -> Result<()> {
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
        let status = self.terminate(Duration::from_secs(10)).await?;
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
        let pid = i32::try_from(self.process.pid())
            .map_err(|_| TestkitError::Fixture("pid out of range".into()))?;
        nix::sys::signal::kill(Pid::from_raw(pid), signal)?;
        Ok(())
    }

    /// Sends SIGTERM and waits for the exit status.
    pub async fn terminate(mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let pid = i32::try_from(self.process.pid())
            .map_err(|_| TestkitError::Fixture("pid out of range".into()))?;
        nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGTERM)?;
        self.process.wait_exit(timeout).await
    }
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
