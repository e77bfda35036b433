//! The fake agent: what upstream's agent container would do to the cluster
//! once its Job runs, without running anything. It watches agent Jobs (by
//! their labels, as the lifecycle controller follows them), asks the test's
//! script what happens, then writes the Job's terminal status and, on
//! success, the instance status upstream's agent writes (`tag`, `digest`,
//! `Ready`/`Installed` conditions and children lists; on delete, the children
//! lists emptied). Writes go through the real API, so watchers see them.

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
}

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

fn env(job: &Job, name: &str) -> Option<String> {
    let containers = &job.spec.as_ref()?.template.spec.as_ref()?.containers;
    containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

fn is_finished(job: &Job) -> bool {
    job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter().any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
    })
}

impl AgentJob {
    fn read(job: &Job) -> Option<Self> {
        Some(Self {
            job_namespace: job.metadata.namespace.clone()?,
            job_name: job.metadata.name.clone()?,
            action: label(job, &[labels::ACTION, "action"])?.to_string(),
            package_type: label(job, &[labels::TYPE, "type"])?.to_string(),
            instance_namespace: label(job, &[labels::NAMESPACE])?.to_string(),
            instance_name: label(job, &[labels::INSTANCE])?.to_string(),
            tag: env(job, "TAG"),
            options_hash: env(job, "OPTIONS_HASH"),
        })
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
            let mut stream = watcher(jobs.clone(), config).default_backoff().applied_objects().boxed();
            while let Some(event) = stream.next().await {
                let Ok(job) = event else { continue };
                let uid = job.metadata.uid.clone().unwrap_or_default();
                if is_finished(&job) || !seen.insert(uid) {
                    continue;
                }
                let Some(agent_job) = AgentJob::read(&job) else { continue };
                let outcome = script(&agent_job);
                let result = act(&client, &jobs, &agent_job, &outcome).await;
                let run = AgentRun {
                    job: agent_job,
                    outcome,
                    finished_at: result.as_ref().ok().copied().flatten(),
                    error: result.err().map(|e| e.to_string()),
                };
                if let Ok(mut runs) = recorded.lock() {
                    runs.push(run);
                }
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
