//! An agent whose Jobs complete at once, for measures at fleet scale (the
//! bench's P7, thousands of installs): no pod and no process per Job. For
//! each agent Job of its namespace it does in-process what
//! `vynil-fake-agent` does when its script says "succeed" (reads the
//! instance through upstream's types, writes the status upstream's agent
//! writes), then marks the Job `Complete` as the Job controller does. A Job
//! whose instance upstream's types cannot decode is marked `Failed`. Its
//! requests present the admin client's user agent, not a controller's.

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

use super::{
    FakeApiServer,
    agent::{AgentJob, strict_read, write_instance_status},
    kubelet::{completed, finished, now},
};
use crate::Result;

/// See the module documentation.
#[derive(Debug)]
pub struct InstantAgent {
    task: tokio::task::JoinHandle<()>,
    completed: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
}

impl Drop for InstantAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl InstantAgent {
    /// Completes the agent Jobs of `namespace` as they are created.
    pub fn start(api: &FakeApiServer, namespace: &str) -> Result<Self> {
        let client = api.client()?;
        let (completed, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
        let counts = (completed.clone(), failed.clone());
        let task = tokio::spawn(async move {
            let mut seen = HashSet::new();
            let mut running = tokio::task::JoinSet::new();
            let mut stream =
                watcher(jobs, watcher::Config::default()).default_backoff().applied_objects().boxed();
            while let Some(event) = stream.next().await {
                let Ok(job) = event else { continue };
                let Some(uid) = job.metadata.uid.clone() else { continue };
                if finished(&job) || job.metadata.deletion_timestamp.is_some() || !seen.insert(uid) {
                    continue;
                }
                let Some(agent_job) = AgentJob::read(&job).filter(|j| j.upstream_agent) else { continue };
                let (client, counts) = (client.clone(), counts.clone());
                running.spawn(async move {
                    let done = complete(&client, &agent_job).await;
                    let counter = if done { &counts.0 } else { &counts.1 };
                    counter.fetch_add(1, Ordering::SeqCst);
                });
                while running.try_join_next().is_some() {}
            }
        });
        Ok(Self { task, completed, failed })
    }

    /// Jobs marked `Complete` so far.
    pub fn completed(&self) -> usize {
        self.completed.load(Ordering::SeqCst)
    }

    /// Jobs marked `Failed` so far (an instance upstream cannot decode, or a
    /// write the server refused).
    pub fn failed(&self) -> usize {
        self.failed.load(Ordering::SeqCst)
    }
}

/// One Job done: `true` when it completed.
async fn complete(client: &Client, job: &AgentJob) -> bool {
    let at = now();
    let written = match strict_read(client, job).await {
        Ok(()) => write_instance_status(client, job, &[], &at).await.map_err(|e| e.to_string()),
        Err(stderr) => Err(stderr),
    };
    let status = match &written {
        Ok(()) => completed(&at),
        Err(message) => json!({"active": 0, "failed": 1, "conditions": [{"type": "Failed", "status": "True",
            "reason": "BackoffLimitExceeded", "message": message, "lastProbeTime": at, "lastTransitionTime": at}]}),
    };
    let jobs: Api<Job> = Api::namespaced(client.clone(), &job.job_namespace);
    let patched = jobs
        .patch_status(&job.job_name, &PatchParams::default(), &Patch::Merge(json!({"status": status})))
        .await;
    written.is_ok() && patched.is_ok()
}
