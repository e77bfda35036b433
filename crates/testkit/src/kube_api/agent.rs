//! The fake agent: upstream's agent, played by an executable
//! (`vynil-fake-agent`) that the Job runner ([`super::JobRunner`]) runs as
//! the agent image's entrypoint, in the Job's pod: with the Job's env, args,
//! mounted files and ServiceAccount, so our Job spec itself is under test.
//!
//! It reads its instance **as upstream's agent does**: in-cluster (the
//! mounted token and CA, `KUBERNETES_SERVICE_HOST`), named by the `NAMESPACE`
//! and `INSTANCE` env, decoded through upstream's own types
//! ([`crate::upstream`]), so a status upstream cannot decode fails the
//! container with upstream's exit code for that action (install 1, delete 3,
//! `agent/src/tenant/mod.rs`) and the decode error on its stderr. Then it
//! does what the test's script decided for the Job (asked once per Job by
//! [`FakeAgent`], handed to the process in `VYNIL_FAKE_AGENT_OUTCOME`):
//! writes the instance status upstream's agent writes (`tag`, `digest`,
//! `Ready`/`Installed` conditions and children lists; on delete, the
//! children lists emptied) and exits 0, or writes its termination message
//! and exits 1, or hangs. The Job's status follows from the exit code, as
//! the Job controller writes it (`backoffLimit` pods, then `Failed`).
//!
//! The unpack init container (`package unpack`) succeeds at once, unless the
//! test asked the agent to pull ([`FakeAgent::pull_from_registries`]): then
//! it asks the registry for `GET /v2/<IMAGE>/manifests/<TAG>` verbatim, as
//! upstream's does (`common/src/ocihandler.rs` `pull_image` in 0.7.7: a
//! reference `with_tag(REGISTRY, IMAGE, TAG)`, so a `TAG` of `sha256:<hex>`
//! asks by digest), over the scheme the test gave, with the user agent
//! [`UNPACK_USER_AGENT`], and fails as a pull would unless answered 200.
//! Catalogs naming a registry that does not exist (`registry.example`) keep
//! the default. Reaper
//! Jobs (this project's `vynil-lifecycle reap`) run the real lifecycle
//! binary under the same runner.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::batch::v1::Job;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams},
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use vynil_crds::labels;

use super::{FakeApiServer, JobRunner, RunnerOptions};
use crate::{Result, TestkitError};

/// Upstream's agent image, as lifecycle names it by default (a lifecycle
/// test keeps the two equal).
pub const UPSTREAM_AGENT_IMAGE: &str = "docker.io/sebt3/vynil-agent:0.7.7";
/// This project's reaper image, as lifecycle names it by default.
pub const REAPER_IMAGE: &str =
    concat!("ghcr.io/vynil-control-plane/vynil-lifecycle:", env!("CARGO_PKG_VERSION"));
/// The env carrying the script's decision to the fake agent's process.
const OUTCOME_ENV: &str = "VYNIL_FAKE_AGENT_OUTCOME";
/// The env telling the unpack to pull, and over which scheme.
const PULL_ENV: &str = "VYNIL_FAKE_AGENT_PULL";
/// The env setting the agent's clock off the machine's, in seconds (a pod
/// on a node whose clock drifts).
const CLOCK_ENV: &str = "VYNIL_FAKE_AGENT_CLOCK_OFFSET";
/// The user agent of the fake unpack's requests, as a registry logs it.
pub const UNPACK_USER_AGENT: &str = "vynil-fake-agent/unpack";

/// An agent Job as the fake agent reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentJob {
    pub job_namespace: String,
    pub job_name: String,
    /// `install` or `delete`.
    pub action: String,
    /// `tenant`, `service` or `system`.
    pub package_type: String,
    pub instance_namespace: String,
    pub instance_name: String,
    /// The `TAG` and `OPTIONS_HASH` env of the main container.
    pub tag: Option<String>,
    pub options_hash: Option<String>,
    /// The main container runs upstream's agent contract (`args: [<type>, <action>]`);
    /// false for our reaper.
    pub upstream_agent: bool,
}

/// What the script decides for one Job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AgentOutcome {
    /// The container exits 0 after writing the instance status; `children`
    /// are `(status list, [Children])` pairs, e.g.
    /// `("vitals", [{"kind": "Deployment", "name": "app"}])`.
    Succeed { children: Vec<(String, Vec<Value>)> },
    /// The container writes `message` as its termination message and exits
    /// 1, the instance untouched; each pod of the Job does the same, so the
    /// Job fails `BackoffLimitExceeded` once its `backoffLimit` is spent.
    Fail { message: String },
    /// As upstream's agent failing mid-install: each of `applied` (a phase
    /// condition type, e.g. `VitalApplied`) is written `True` with the
    /// message upstream's agent writes for it, then `Installed=False
    /// <message>`, and the container fails as [`AgentOutcome::Fail`].
    FailAfterApplying { applied: Vec<String>, message: String },
    /// The container runs until its Job is deleted (a slow or dead agent).
    Hang,
}

impl AgentOutcome {
    pub fn succeed() -> Self {
        Self::Succeed { children: Vec::new() }
    }
    pub fn fail(message: &str) -> Self {
        Self::Fail { message: message.into() }
    }
}

/// One Job the agent ran for: its first pod's agent container.
#[derive(Debug, Clone)]
pub struct AgentRun {
    pub job: AgentJob,
    pub outcome: AgentOutcome,
    /// The container's exit code; `None` while it runs.
    pub exit_code: Option<i32>,
    /// What the container printed on stderr.
    pub stderr: String,
}

type Script = dyn Fn(&AgentJob) -> AgentOutcome + Send + Sync;

/// See the module documentation.
#[derive(Debug)]
pub struct FakeAgent {
    runner: JobRunner,
    agent_image: String,
    /// The script's decision per Job uid.
    outcomes: Arc<Mutex<HashMap<String, AgentOutcome>>>,
    /// The scheme the unpack pulls over, once asked to pull.
    pull: Arc<Mutex<Option<String>>>,
    /// How far the agent's clock is off, in seconds.
    clock_offset: Arc<Mutex<i64>>,
}

fn label<'a>(job: &'a Job, keys: &[&str]) -> Option<&'a str> {
    let labels = job.metadata.labels.as_ref()?;
    keys.iter().find_map(|k| labels.get(*k)).map(String::as_str)
}

fn main_container(job: &Job) -> Option<&k8s_openapi::api::core::v1::Container> {
    job.spec.as_ref()?.template.spec.as_ref()?.containers.first()
}

fn env(job: &Job, name: &str) -> Option<String> {
    main_container(job)?.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.clone())
}

impl AgentJob {
    pub(super) fn read(job: &Job) -> Option<Self> {
        let args = main_container(job).and_then(|c| c.args.clone()).unwrap_or_default();
        let upstream_agent = args.len() == 2 && ["tenant", "service", "system"].contains(&args[0].as_str());
        // Upstream's agent names its instance by env; our reaper by its args.
        let arg = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
        let (instance_namespace, instance_name) = if upstream_agent {
            (env(job, "NAMESPACE")?, env(job, "INSTANCE")?)
        } else {
            (arg("--namespace")?, arg("--name")?)
        };
        Some(Self {
            job_namespace: job.metadata.namespace.clone()?,
            job_name: job.metadata.name.clone()?,
            action: label(job, &[labels::ACTION, "action"])?.to_string(),
            package_type: label(job, &[labels::TYPE, "type"])?.to_string(),
            instance_namespace,
            instance_name,
            tag: env(job, "TAG"),
            options_hash: env(job, "OPTIONS_HASH"),
            upstream_agent,
        })
    }

    /// Upstream's agent's exit code when `action` fails (`agent/src/tenant/mod.rs`).
    pub fn upstream_exit_code(&self) -> i32 {
        if self.action == "delete" { 3 } else { 1 }
    }

    fn instance_resource(&self) -> ApiResource {
        let kind = match self.package_type.as_str() {
            "tenant" => "TenantInstance",
            "service" => "ServiceInstance",
            _ => "SystemInstance",
        };
        ApiResource {
            group: "vynil.solidite.fr".into(),
            version: "v1".into(),
            api_version: "vynil.solidite.fr/v1".into(),
            kind: kind.into(),
            plural: format!("{}s", kind.to_lowercase()),
        }
    }
}

impl FakeAgent {
    /// Runs the agent Jobs of `namespace` (upstream's agent image,
    /// [`UPSTREAM_AGENT_IMAGE`]) with the fake agent, and reaper Jobs
    /// ([`REAPER_IMAGE`]) with the real lifecycle binary.
    pub fn start(
        api: &FakeApiServer,
        namespace: &str,
        script: impl Fn(&AgentJob) -> AgentOutcome + Send + Sync + 'static,
    ) -> Result<Self> {
        Self::start_with_image(api, namespace, UPSTREAM_AGENT_IMAGE, script)
    }

    /// [`FakeAgent::start`] for lifecycle's `--agent-image agent_image`.
    pub fn start_with_image(
        api: &FakeApiServer,
        namespace: &str,
        agent_image: &str,
        script: impl Fn(&AgentJob) -> AgentOutcome + Send + Sync + 'static,
    ) -> Result<Self> {
        let script: Arc<Script> = Arc::new(script);
        let outcomes: Arc<Mutex<HashMap<String, AgentOutcome>>> = Arc::default();
        let decided = outcomes.clone();
        let pull: Arc<Mutex<Option<String>>> = Arc::default();
        let pulling = pull.clone();
        let clock_offset: Arc<Mutex<i64>> = Arc::default();
        let offset = clock_offset.clone();
        let env: super::JobEnv = Arc::new(move |job: &Job| {
            let Some(agent_job) = AgentJob::read(job).filter(|j| j.upstream_agent) else { return Vec::new() };
            let outcome = script(&agent_job);
            let uid = job.metadata.uid.clone().unwrap_or_default();
            let text = serde_json::to_string(&outcome).unwrap_or_default();
            if let Ok(mut outcomes) = decided.lock() {
                outcomes.insert(uid, outcome);
            }
            let mut env = vec![(OUTCOME_ENV.to_string(), text)];
            if let Some(scheme) = pulling.lock().ok().and_then(|p| p.clone()) {
                env.push((PULL_ENV.to_string(), scheme));
            }
            if let Some(seconds) = offset.lock().ok().map(|o| *o).filter(|o| *o != 0) {
                env.push((CLOCK_ENV.to_string(), seconds.to_string()));
            }
            env
        });
        let agent = crate::workspace_binary("vynil-testkit", "vynil-fake-agent")?;
        let reaper = crate::workspace_binary("vynil-lifecycle", "vynil-lifecycle")?;
        let options =
            RunnerOptions::new().image_with_env(agent_image, &agent, env).image(REAPER_IMAGE, &reaper);
        let runner = JobRunner::start(api, namespace, options)?;
        Ok(Self { runner, agent_image: agent_image.to_string(), outcomes, pull, clock_offset })
    }

    /// From now on, the agent's clock is `seconds` off the machine's (behind
    /// when negative): the times it writes in conditions.
    pub fn skew_clock(&self, seconds: i64) {
        if let Ok(mut offset) = self.clock_offset.lock() {
            *offset = seconds;
        }
    }

    /// From now on, each Job's unpack pulls its `REGISTRY/IMAGE:TAG` over
    /// `scheme` (`http` for the test kit's registry), as upstream's does.
    pub fn pull_from_registries(&self, scheme: &str) {
        if let Ok(mut pull) = self.pull.lock() {
            *pull = Some(scheme.to_string());
        }
    }

    /// The runner, for what it ran besides the agent (the reaper).
    pub fn runner(&self) -> &JobRunner {
        &self.runner
    }

    /// Every agent Job run so far: its first pod's agent container.
    pub fn runs(&self) -> Vec<AgentRun> {
        let outcomes = self.outcomes.lock().map(|o| o.clone()).unwrap_or_default();
        self.runner
            .runs()
            .into_iter()
            .filter(|run| run.attempt == 0 && !run.init && run.image == self.agent_image)
            .filter_map(|run| {
                let job = AgentJob::read(&run.job).filter(|j| j.upstream_agent)?;
                let outcome = outcomes.get(run.job.metadata.uid.as_deref().unwrap_or_default())?.clone();
                Some(AgentRun { job, outcome, exit_code: run.exit_code, stderr: run.stderr })
            })
            .collect()
    }

    /// Waits until at least `count` Jobs were run.
    pub async fn wait_for_runs(&self, count: usize, timeout: Duration) -> Result<Vec<AgentRun>> {
        let deadline = Instant::now() + timeout;
        loop {
            let runs = self.runs();
            if runs.len() >= count {
                return Ok(runs);
            }
            if Instant::now() > deadline {
                return Err(TestkitError::Fixture(format!(
                    "the fake agent ran {} Jobs within {timeout:?}, expected {count}",
                    runs.len()
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn kube_error(doing: &str) -> impl FnOnce(kube::Error) -> TestkitError + '_ {
    move |e| TestkitError::Fixture(format!("fake agent, {doing}: {e}"))
}

/// What `vynil-fake-agent` does in its container; returns its exit code.
pub async fn agent_main(args: &[String]) -> i32 {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (package_type, action) = match args.as_slice() {
        ["package", "unpack"] => return unpack().await,
        [package_type, action @ ("install" | "delete")] => (package_type.to_string(), action.to_string()),
        other => {
            eprintln!("vynil-fake-agent: unknown arguments {other:?} (expected <type> install|delete)");
            return 2;
        }
    };
    let env = |name: &str| std::env::var(name).ok();
    let (Some(instance_namespace), Some(instance_name)) = (env("NAMESPACE"), env("INSTANCE")) else {
        eprintln!("Error: NAMESPACE and INSTANCE must be set");
        return 1;
    };
    let job = AgentJob {
        job_namespace: env("VYNIL_NAMESPACE").unwrap_or_default(),
        job_name: env("POD_NAME").unwrap_or_default(),
        action,
        package_type,
        instance_namespace,
        instance_name,
        tag: env("TAG"),
        options_hash: env("OPTIONS_HASH"),
        upstream_agent: true,
    };
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    // In-cluster, as upstream's agent: the mounted token and CA.
    let client = match kube::Config::incluster()
        .map_err(|e| e.to_string())
        .and_then(|c| Client::try_from(c).map_err(|e| e.to_string()))
    {
        Ok(client) => client,
        Err(e) => {
            eprintln!("Error: in-cluster configuration: {e}");
            return job.upstream_exit_code();
        }
    };
    if let Err(stderr) = strict_read(&client, &job).await {
        eprintln!("{stderr}");
        return job.upstream_exit_code();
    }
    let outcome = env(OUTCOME_ENV)
        .and_then(|text| serde_json::from_str::<AgentOutcome>(&text).ok())
        .unwrap_or_else(AgentOutcome::succeed);
    match outcome {
        AgentOutcome::Succeed { children } => {
            let now = agent_now();
            match write_instance_status(&client, &job, &children, &now).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("Error: {e}");
                    1
                }
            }
        }
        AgentOutcome::Fail { message } => fail(&message),
        AgentOutcome::FailAfterApplying { applied, message } => {
            let now = agent_now();
            if let Err(e) = write_applied_then_failed(&client, &job, &applied, &message, &now).await {
                eprintln!("Error: {e}");
            }
            fail(&message)
        }
        AgentOutcome::Hang => {
            std::future::pending::<()>().await;
            0
        }
    }
}

/// The agent's time, as upstream's agent writes it in a condition: to the
/// nanosecond, on its pod's clock (off the machine's by [`CLOCK_ENV`]).
fn agent_now() -> String {
    let offset = std::env::var(CLOCK_ENV).ok().and_then(|o| o.parse::<i64>().ok()).unwrap_or(0);
    let now = jiff::Timestamp::now();
    now.checked_add(jiff::SignedDuration::from_secs(offset)).unwrap_or(now).to_string()
}

/// The unpack init container (see the module documentation).
async fn unpack() -> i32 {
    let env = |name: &str| std::env::var(name).unwrap_or_default();
    let Ok(scheme) = std::env::var(PULL_ENV) else {
        // Not asked to pull: the package is "there".
        return 0;
    };
    let (registry, image, tag) = (env("REGISTRY"), env("IMAGE"), env("TAG"));
    let url = format!("{scheme}://{registry}/v2/{image}/manifests/{tag}");
    let accept = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.index.v1+json";
    let client = reqwest::Client::builder().user_agent(UNPACK_USER_AGENT).build();
    let answer = match client {
        Ok(client) => client.get(&url).header("Accept", accept).send().await,
        Err(e) => return fail(&format!("pulling {registry}/{image}:{tag}: {e}")),
    };
    match answer {
        Ok(answer) if answer.status().is_success() => {
            let digest = answer.headers().get("Docker-Content-Digest").and_then(|d| d.to_str().ok());
            println!("unpacked {registry}/{image}:{tag} ({})", digest.unwrap_or("no digest header"));
            0
        }
        Ok(answer) => fail(&format!("pulling {registry}/{image}:{tag}: {}", answer.status())),
        Err(e) => fail(&format!("pulling {registry}/{image}:{tag}: {e}")),
    }
}

/// Writes `message` as the termination message, says it on stderr: exit 1.
fn fail(message: &str) -> i32 {
    if let Err(e) = std::fs::write("/dev/termination-log", message) {
        eprintln!("cannot write the termination message: {e}");
    }
    eprintln!("Error: {message}");
    1
}

/// The message upstream's agent writes on a phase condition it applied
/// (`common/src/instance_macros.rs`, `*_ok`, sebt3/vynil 72bc059).
fn applied_message(phase: &str) -> &'static str {
    match phase {
        "BeforeApplied" => "befores templates applied succesfully",
        "VitalApplied" => "vitals templates applied succesfully",
        "ScalableApplied" => "Scalables templates applied succesfully",
        "OtherApplied" => "Templates applied succesfully",
        "CrdApplied" => "CRD(s) applied succesfully",
        "TofuInstalled" => "Tofu layer applied succesfully",
        _ => "Custom rhai script succeed",
    }
}

/// Upstream's agent applying `applied`, then failing: each phase's
/// condition, then `Installed=False` (`set_status_*_failed`).
async fn write_applied_then_failed(
    client: &Client,
    job: &AgentJob,
    applied: &[String],
    message: &str,
    now: &str,
) -> Result<()> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &job.instance_namespace, &job.instance_resource());
    let instance = api.get(&job.instance_name).await.map_err(kube_error("reading the instance"))?;
    let generation = instance.metadata.generation.unwrap_or(1);
    let current = instance.data.get("status").cloned().unwrap_or(Value::Null);
    let mut updates: Vec<(&str, &str, &str)> =
        applied.iter().map(|phase| (phase.as_str(), "True", applied_message(phase))).collect();
    updates.push(("Installed", "False", message));
    let conditions = upsert_conditions(&current["conditions"], &updates, generation, now);
    let patch = json!({"status": {"conditions": conditions}});
    api.patch_status(&job.instance_name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(kube_error("writing the instance status"))?;
    Ok(())
}

/// Upstream's agent's first read: `<Kind>::get(NAMESPACE, INSTANCE)`, decoded
/// with upstream's types. `Err` is what it prints before exiting.
pub(super) async fn strict_read(client: &Client, job: &AgentJob) -> std::result::Result<(), String> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &job.instance_namespace, &job.instance_resource());
    let object = api.get(&job.instance_name).await.map_err(|e| format!("Error: kube error: {e}"))?;
    let value = serde_json::to_value(&object).map_err(|e| e.to_string())?;
    crate::upstream::decode_instance(&value).map_err(|e| format!("Error: Error deserializing response: {e}"))
}

/// Upserts conditions by type, as upstream's agent does.
fn upsert_conditions(current: &Value, updates: &[(&str, &str, &str)], generation: i64, now: &str) -> Value {
    let mut list: Vec<Value> = current.as_array().cloned().unwrap_or_default();
    for (kind, status, message) in updates {
        list.retain(|c| c["type"].as_str() != Some(kind));
        list.push(json!({"type": kind, "status": status, "message": message, "generation": generation,
            "lastTransitionTime": now}));
    }
    Value::Array(list)
}

pub(super) async fn write_instance_status(
    client: &Client,
    job: &AgentJob,
    children: &[(String, Vec<Value>)],
    now: &str,
) -> Result<()> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &job.instance_namespace, &job.instance_resource());
    let instance = api.get(&job.instance_name).await.map_err(kube_error("reading the instance"))?;
    let generation = instance.metadata.generation.unwrap_or(1);
    let current = instance.data.get("status").cloned().unwrap_or(Value::Null);
    let mut status = json!({});
    if job.action == "delete" {
        let lists = ["befores", "vitals", "scalables", "others", "posts", "systems", "crds", "services"];
        for list in lists {
            if current.get(list).is_some() {
                status[list] = json!([]);
            }
        }
        status["tfstate"] = Value::Null;
        status["rhaistate"] = Value::Null;
        let updates =
            [("Installed", "False", "Deleted succesfully"), ("Ready", "False", "Deleted succesfully")];
        status["conditions"] = upsert_conditions(&current["conditions"], &updates, generation, now);
    } else {
        status["tag"] = json!(job.tag);
        status["digest"] = json!(job.options_hash);
        for (list, items) in children {
            status[list.as_str()] = json!(items);
        }
        let updates = [
            ("AgentStarted", "True", "Agent started"),
            ("Installed", "True", "Installed succesfully"),
            ("Ready", "True", "Installed succesfully"),
        ];
        status["conditions"] = upsert_conditions(&current["conditions"], &updates, generation, now);
    }
    api.patch_status(&job.instance_name, &PatchParams::default(), &Patch::Merge(json!({"status": status})))
        .await
        .map_err(kube_error("writing the instance status"))?;
    Ok(())
}
