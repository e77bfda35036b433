//! The fake agent: what upstream's agent container would do to the cluster
//! once its Job runs, without running anything. It watches agent Jobs (by
//! their labels, as the lifecycle controller follows them), reads its
//! instance **as upstream's agent does**: named by the `NAMESPACE` and
//! `INSTANCE` env of the Job, decoded through upstream's own types
//! ([`crate::upstream`]), so a status upstream cannot decode fails the Job
//! with upstream's exit code for that action (install 1, delete 3,
//! `agent/src/tenant/mod.rs`) and the decode error on its "stderr"
//! ([`AgentRun::stderr`]), as a pod whose container terminated with that code.
//! Then it asks the test's script what happens, writes the Job's terminal
//! status and, on success, the instance status upstream's agent writes
//! (`tag`, `digest`, `Ready`/`Installed` conditions and children lists; on
//! delete, the children lists emptied). Writes go through the real API, so
//! watchers see them.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::{Value, json};
use vynil_crds::labels;

use crate::{Result, TestkitError};

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
#[derive(Debug, Clone, PartialEq)]
pub enum AgentOutcome {
    /// The Job completes; `children` are `(status list, [Children])` pairs,
    /// e.g. `("vitals", [{"kind": "Deployment", "name": "app"}])`.
    Succeed { children: Vec<(String, Vec<Value>)> },
    /// The Job fails with this condition reason and message; the instance is untouched.
    Fail { reason: String, message: String },
    /// The Job stays running (a slow or dead agent).
    Hang,
}

impl AgentOutcome {
    pub fn succeed() -> Self {
        Self::Succeed { children: Vec::new() }
    }
    pub fn fail(reason: &str, message: &str) -> Self {
        Self::Fail { reason: reason.into(), message: message.into() }
    }
}

/// One Job the agent acted on.
#[derive(Debug, Clone)]
pub struct AgentRun {
    pub job: AgentJob,
    pub outcome: AgentOutcome,
    /// When the Job's terminal status was written (read back).
    pub finished_at: Option<Instant>,
    /// Why a write failed, if one did.
    pub error: Option<String>,
    /// The exit code of the agent container when it failed before the script
    /// was asked (upstream's agent could not decode its instance).
    pub exit_code: Option<i32>,
    /// What upstream's agent would print on stderr then.
    pub stderr: Option<String>,
}

/// How long after the Job appears the agent's container reads its instance.
const POD_START: Duration = Duration::from_millis(200);

type Script = dyn Fn(&AgentJob) -> AgentOutcome + Send + Sync;

/// See the module documentation.
#[derive(Debug)]
pub struct FakeAgent {
    runs: Arc<Mutex<Vec<AgentRun>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
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

fn is_finished(job: &Job) -> bool {
    job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter().any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
    })
}

impl AgentJob {
    fn read(job: &Job) -> Option<Self> {
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
    /// Watches agent Jobs (`app.kubernetes.io/component=agent`) in `namespace`.
    pub fn start(
        client: Client,
        namespace: &str,
        script: impl Fn(&AgentJob) -> AgentOutcome + Send + Sync + 'static,
    ) -> Self {
        let runs: Arc<Mutex<Vec<AgentRun>>> = Arc::default();
        let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
        let script: Arc<Script> = Arc::new(script);
        let recorded = runs.clone();
        let task = tokio::spawn(async move {
            let config =
                watcher::Config::default().labels(&format!("{}={}", labels::COMPONENT, labels::AGENT));
            let mut seen: HashSet<String> = HashSet::new();
            // One task per Job, as each runs in its own pod; dropped (and
            // aborted) with the agent.
            let mut pods = tokio::task::JoinSet::new();
            let mut stream = watcher(jobs.clone(), config).default_backoff().applied_objects().boxed();
            while let Some(event) = stream.next().await {
                let Ok(job) = event else { continue };
                let uid = job.metadata.uid.clone().unwrap_or_default();
                if is_finished(&job) || !seen.insert(uid) {
                    continue;
                }
                let Some(agent_job) = AgentJob::read(&job) else { continue };
                let (client, jobs, script, recorded) =
                    (client.clone(), jobs.clone(), script.clone(), recorded.clone());
                pods.spawn(async move {
                    let run = run_pod(&client, &jobs, agent_job, script.as_ref()).await;
                    if let Ok(mut runs) = recorded.lock() {
                        runs.push(run);
                    }
                });
                while pods.try_join_next().is_some() {}
            }
        });
        Self { runs, task }
    }

    /// Every Job acted on so far.
    pub fn runs(&self) -> Vec<AgentRun> {
        self.runs.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Waits until at least `count` Jobs were acted on.
    pub async fn wait_for_runs(&self, count: usize, timeout: Duration) -> Result<Vec<AgentRun>> {
        let deadline = Instant::now() + timeout;
        loop {
            let runs = self.runs();
            if runs.len() >= count {
                return Ok(runs);
            }
            if Instant::now() > deadline {
                return Err(TestkitError::Fixture(format!(
                    "the fake agent acted on {} Jobs within {timeout:?}, expected {count}",
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

/// Writes the outcome; returns when the Job's terminal status was written.
async fn act(
    client: &Client,
    jobs: &Api<Job>,
    job: &AgentJob,
    outcome: &AgentOutcome,
) -> Result<Option<Instant>> {
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let status = match outcome {
        AgentOutcome::Hang => return Ok(None),
        AgentOutcome::Succeed { children } => {
            write_instance_status(client, job, children, &now).await?;
            json!({"status": {
                "startTime": now, "completionTime": now, "succeeded": 1, "active": 0,
                "conditions": [
                    {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                    {"type": "Complete", "status": "True", "lastTransitionTime": now},
                ],
            }})
        }
        AgentOutcome::Fail { reason, message } => json!({"status": {
            "startTime": now, "failed": 1, "active": 0,
            "conditions": [
                {"type": "FailureTarget", "status": "True", "reason": reason, "message": message, "lastTransitionTime": now},
                {"type": "Failed", "status": "True", "reason": reason, "message": message, "lastTransitionTime": now},
            ],
        }}),
    };
    jobs.patch_status(&job.job_name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(kube_error("writing the Job status"))?;
    Ok(Some(Instant::now()))
}

/// What the Job's pod does: waits for its start, reads its instance as
/// upstream's agent does, then acts as the script says (or fails as upstream's
/// agent would).
async fn run_pod(client: &Client, jobs: &Api<Job>, agent_job: AgentJob, script: &Script) -> AgentRun {
    // A pod is scheduled and its unpack step runs before the agent reads its
    // instance: whatever the creator writes right after the Job is there by
    // then, as on a cluster.
    tokio::time::sleep(POD_START).await;
    let refused = if agent_job.upstream_agent { strict_read(client, &agent_job).await.err() } else { None };
    let (outcome, exit_code, stderr) = match refused {
        Some(stderr) => {
            let code = agent_job.upstream_exit_code();
            let message = format!("container {} exited {code}", agent_job.action);
            (AgentOutcome::fail("BackoffLimitExceeded", &message), Some(code), Some(stderr))
        }
        None => (script(&agent_job), None, None),
    };
    // The pod's container terminates before the Job controller marks the Job.
    let result = match exit_code {
        Some(code) => terminated_pod(client, &agent_job, code).await,
        None => Ok(None),
    };
    let result = match result {
        Ok(_) => act(client, jobs, &agent_job, &outcome).await,
        Err(e) => Err(e),
    };
    AgentRun {
        job: agent_job,
        outcome,
        finished_at: result.as_ref().ok().copied().flatten(),
        error: result.err().map(|e| e.to_string()),
        exit_code,
        stderr,
    }
}

/// Upstream's agent's first read: `<Kind>::get(NAMESPACE, INSTANCE)`, decoded
/// with upstream's types. `Err` is what it prints before exiting.
async fn strict_read(client: &Client, job: &AgentJob) -> std::result::Result<(), String> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &job.instance_namespace, &job.instance_resource());
    let object = api.get(&job.instance_name).await.map_err(|e| format!("Error: kube error: {e}"))?;
    let value = serde_json::to_value(&object).map_err(|e| e.to_string())?;
    crate::upstream::decode_instance(&value).map_err(|e| format!("Error: Error deserializing response: {e}"))
}

/// The Job's pod, its agent container terminated with `code` (what the
/// kubelet shows of a container that exited; upstream's agent writes no
/// termination message).
async fn terminated_pod(client: &Client, job: &AgentJob, code: i32) -> Result<Option<Instant>> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &job.job_namespace);
    let name = format!("{}-{}", job.job_name, fastrand::u32(..) % 100_000);
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"job-name": job.job_name, "batch.kubernetes.io/job-name": job.job_name}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": job.action, "image": "agent"}]}});
    let pod = serde_json::from_value(pod).map_err(|e| TestkitError::Fixture(e.to_string()))?;
    pods.create(&Default::default(), &pod).await.map_err(kube_error("creating the agent pod"))?;
    let status = json!({"status": {"phase": "Failed", "containerStatuses": [{"name": job.action, "image": "agent",
        "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": code, "reason": "Error"}}}]}});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(kube_error("writing the agent pod status"))?;
    Ok(None)
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

async fn write_instance_status(
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
