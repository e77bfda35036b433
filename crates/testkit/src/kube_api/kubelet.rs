//! The Job controller and the kubelet, in process: a Job whose images the
//! test maps to local executables gets its Pods, each container run as a
//! local process in a mount namespace of its own ([`super::sandbox`]), and
//! its status written from their exit codes, as a cluster would.
//!
//! Per Job (watched in one namespace, [`JobRunner::start`]):
//! - a Pod `<job>-<5 letters>`, owned by the Job (so garbage collection
//!   takes it along), with the template's labels and annotations plus the
//!   `controller-uid`/`job-name` labels the Job controller adds;
//! - its volumes as files under a per-pod directory: `emptyDir`, `configMap`
//!   and `secret` (their keys as files; `optional` honoured; a missing
//!   Secret or ConfigMap keeps the pod `Pending`, as the kubelet does, until
//!   it appears or the Job's deadline passes), and the projected
//!   ServiceAccount token (`token`, `ca.crt`, `namespace`) unless
//!   `automountServiceAccountToken: false`; each bound at its `mountPath`
//!   (`subPath` and `readOnly` honoured), the termination log at
//!   `terminationMessagePath` (`/dev/termination-log`);
//! - the environment: `value`, `valueFrom` (`secretKeyRef`,
//!   `configMapKeyRef`, `fieldRef` of `metadata.name`, `metadata.namespace`,
//!   `metadata.uid`, `spec.serviceAccountName`, `spec.nodeName`,
//!   `status.podIP`), and the in-cluster variables
//!   (`KUBERNETES_SERVICE_HOST`/`PORT` naming the fake's HTTPS endpoint),
//!   `HOSTNAME` the pod's name; nothing of the test process' environment;
//! - init containers one after another, then the containers together; the
//!   image's entrypoint is the mapped executable, given the container's
//!   `args` (a `command` is refused: the pod fails `RunContainerError`);
//! - status: the pod's phase and each container's `terminated` state
//!   (exit code, `Completed`/`Error`, the termination message read from the
//!   file, cut at 4096 bytes as the kubelet does, or with
//!   `FallbackToLogsOnError` the last 80 lines of a failed container's output
//!   up to 2048 bytes); the Job's `active`, `failed`, `succeeded`,
//!   `startTime`, `completionTime` and conditions (`SuccessCriteriaMet` +
//!   `Complete`; `FailureTarget` + `Failed` with `BackoffLimitExceeded` once
//!   more than `backoffLimit` pods failed, or `DeadlineExceeded` when
//!   `activeDeadlineSeconds` passed, the running process killed);
//! - a Job deleted while it runs has its processes killed.
//!
//! A Job with an image the test did not map stays as it is (no Pod), as on
//! a cluster where that image cannot be pulled. Differences, on purpose:
//! a failed pod is replaced after [`RunnerOptions::pod_backoff`] (the Job
//! controller waits 10 s, doubling), `runAsUser` is ignored, there is no
//! image filesystem (the host's is seen) and no network namespace.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::{
    batch::v1::Job,
    core::v1::{ConfigMap, Container, Pod, PodSpec, Secret},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::{Value, json};

use super::{
    FakeApiServer,
    sandbox::{SandboxMount, SandboxSpec},
};
use crate::{Result, TestkitError, io};

/// Extra environment a mapped image's containers get from the test (the
/// fake agent's scenario), asked once per Job.
pub type JobEnv = Arc<dyn Fn(&Job) -> Vec<(String, String)> + Send + Sync>;

/// What an image runs.
#[derive(Clone)]
pub struct Program {
    pub executable: PathBuf,
    pub env: Option<JobEnv>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program").field("executable", &self.executable).finish_non_exhaustive()
    }
}

/// How the runner runs.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// Image → executable standing for its entrypoint.
    pub images: BTreeMap<String, Program>,
    /// How long after a failed pod its replacement starts.
    pub pod_backoff: Duration,
}

impl RunnerOptions {
    pub fn new() -> Self {
        Self { images: BTreeMap::new(), pod_backoff: Duration::from_millis(100) }
    }

    /// Maps `image` to `executable`.
    pub fn image(mut self, image: &str, executable: &Path) -> Self {
        self.images.insert(image.to_string(), Program { executable: executable.to_path_buf(), env: None });
        self
    }

    /// Maps `image` to `executable`, its containers given `env(job)` too.
    pub fn image_with_env(mut self, image: &str, executable: &Path, env: JobEnv) -> Self {
        self.images
            .insert(image.to_string(), Program { executable: executable.to_path_buf(), env: Some(env) });
        self
    }
}

impl Default for RunnerOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// One container run, as the runner saw it.
#[derive(Debug, Clone)]
pub struct ContainerRun {
    pub job: Arc<Job>,
    pub pod: String,
    /// Which pod of the Job (0 for the first).
    pub attempt: usize,
    pub container: String,
    pub init: bool,
    pub image: String,
    pub args: Vec<String>,
    /// `None` while it runs.
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The termination message the pod status shows.
    pub message: String,
    pub started: Instant,
}

type Runs = Arc<Mutex<Vec<ContainerRun>>>;
/// ServiceAccount (namespace, name) → its token, from the server.
type TokenIssuer = Box<dyn Fn(&str, &str) -> String + Send + Sync>;

/// See the module documentation.
#[derive(Debug)]
pub struct JobRunner {
    runs: Runs,
    task: tokio::task::JoinHandle<()>,
    _dir: Arc<tempfile::TempDir>,
}

impl Drop for JobRunner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a pod needs from the server and the runner.
struct Node {
    client: Client,
    https: std::net::SocketAddr,
    ca_pem: String,
    /// ServiceAccount → token, from the server.
    tokens: TokenIssuer,
    sandbox: PathBuf,
    dir: Arc<tempfile::TempDir>,
    options: RunnerOptions,
    runs: Runs,
}

fn fixture(doing: &str) -> impl FnOnce(kube::Error) -> TestkitError + '_ {
    move |e| TestkitError::Fixture(format!("Job runner, {doing}: {e}"))
}

/// Fails, naming the cause, where the kernel refuses the mount namespace the
/// pods need.
fn check_namespaces() -> Result<()> {
    let output = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "true"])
        .output()
        .map_err(|e| {
            TestkitError::Fixture(format!(
                "the Job runner needs `unshare` (Debian package util-linux: apt-get install util-linux): {e}"
            ))
        })?;
    if !output.status.success() {
        return Err(TestkitError::Fixture(format!(
            "the Job runner runs each container in a mount namespace of its own, and this machine refuses \
             `unshare --user --map-root-user --mount` ({}): run the tests as root, or allow unprivileged user \
             namespaces (sysctl kernel.unprivileged_userns_clone=1)",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

impl JobRunner {
    /// Runs the Jobs of `namespace` whose images `options` maps.
    pub fn start(api: &FakeApiServer, namespace: &str, options: RunnerOptions) -> Result<Self> {
        check_namespaces()?;
        let sandbox = crate::workspace_binary("vynil-testkit", "vynil-pod")?;
        let dir = Arc::new(tempfile::tempdir().map_err(io("creating the Job runner's directory"))?);
        let runs: Runs = Arc::default();
        let node = Arc::new(Node {
            client: api.client()?,
            https: api.https_addr(),
            ca_pem: api.ca_pem().to_string(),
            tokens: Box::new(api.token_issuer()),
            sandbox,
            dir: dir.clone(),
            options,
            runs: runs.clone(),
        });
        let jobs: Api<Job> = Api::namespaced(node.client.clone(), namespace);
        let task = tokio::spawn(async move {
            let mut running: HashMap<String, tokio::task::AbortHandle> = HashMap::new();
            let mut tasks = tokio::task::JoinSet::new();
            let mut stream = watcher(jobs, watcher::Config::default()).default_backoff().boxed();
            while let Some(event) = stream.next().await {
                let Ok(event) = event else { continue };
                let (applied, deleted) = match event {
                    watcher::Event::Apply(job) | watcher::Event::InitApply(job) => (Some(job), None),
                    watcher::Event::Delete(job) => (None, Some(job)),
                    _ => (None, None),
                };
                if let Some(handle) =
                    deleted.and_then(|j| j.metadata.uid).and_then(|uid| running.remove(&uid))
                {
                    handle.abort();
                }
                if let Some(job) = applied {
                    let Some(uid) = job.metadata.uid.clone() else { continue };
                    if running.contains_key(&uid)
                        || finished(&job)
                        || job.metadata.deletion_timestamp.is_some()
                    {
                        continue;
                    }
                    let node = node.clone();
                    running.insert(uid, tasks.spawn(async move { run_job(node, Arc::new(job)).await }));
                }
                while tasks.try_join_next().is_some() {}
            }
        });
        Ok(Self { runs, task, _dir: dir })
    }

    /// Every container run so far (running ones with no exit code).
    pub fn runs(&self) -> Vec<ContainerRun> {
        self.runs.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

pub(super) fn finished(job: &Job) -> bool {
    job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter().any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
    })
}

pub(super) fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The status the Job controller writes on a Job whose pod succeeded at `at`.
pub(super) fn completed(at: &str) -> Value {
    let conditions = [
        ("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods"),
        ("Complete", "CompletionsReached", "Reached expected number of succeeded pods"),
    ];
    let conditions: Vec<Value> = conditions
        .iter()
        .map(|(t, r, m)| {
            json!({"type": t, "status": "True", "reason": r, "message": m, "lastProbeTime": at,
                "lastTransitionTime": at})
        })
        .collect();
    json!({"active": 0, "succeeded": 1, "ready": 0, "completionTime": at, "conditions": conditions})
}

enum PodEnd {
    Succeeded,
    Failed,
    DeadlineExceeded,
}

async fn patch_job(node: &Node, job: &Job, status: Value) {
    let jobs: Api<Job> =
        Api::namespaced(node.client.clone(), job.metadata.namespace.as_deref().unwrap_or_default());
    let name = job.metadata.name.as_deref().unwrap_or_default();
    if let Err(error) =
        jobs.patch_status(name, &PatchParams::default(), &Patch::Merge(json!({"status": status}))).await
    {
        tracing::warn!(%error, job = name, "Job runner: cannot write the Job status");
    }
}

async fn run_job(node: Arc<Node>, job: Arc<Job>) {
    let Some(spec) = job.spec.as_ref() else { return };
    let Some(pod_spec) = spec.template.spec.as_ref() else { return };
    let images = pod_spec.init_containers.iter().flatten().chain(&pod_spec.containers);
    if !images.clone().all(|c| c.image.as_ref().is_some_and(|i| node.options.images.contains_key(i))) {
        // An image nobody can pull: the Job stays as it is.
        return;
    }
    let started = Instant::now();
    let deadline = spec.active_deadline_seconds.map(|s| started + Duration::from_secs(s.max(0) as u64));
    let backoff_limit = spec.backoff_limit.unwrap_or(6).max(0) as usize;
    let start_time = now();
    // The test's extra env of the images this Job runs, asked once per Job.
    let used: std::collections::BTreeSet<&str> = images.filter_map(|c| c.image.as_deref()).collect();
    let mut env: Vec<(String, String)> = Vec::new();
    for image in used {
        if let Some(extra) = node.options.images.get(image).and_then(|p| p.env.as_ref()) {
            env.extend(extra(&job));
        }
    }
    let mut failed = 0;
    for attempt in 0.. {
        patch_job(&node, &job, json!({"startTime": start_time, "active": 1})).await;
        let end = run_pod(&node, &job, pod_spec, attempt, deadline, &env).await;
        let at = now();
        match end {
            PodEnd::Succeeded => {
                patch_job(&node, &job, completed(&at)).await;
                return;
            }
            PodEnd::Failed => {
                failed += 1;
                if failed > backoff_limit {
                    fail_job(
                        &node,
                        &job,
                        failed,
                        "BackoffLimitExceeded",
                        "Job has reached the specified backoff limit",
                    )
                    .await;
                    return;
                }
                patch_job(&node, &job, json!({"active": 0, "failed": failed, "ready": 0})).await;
                tokio::time::sleep(node.options.pod_backoff).await;
            }
            PodEnd::DeadlineExceeded => {
                fail_job(
                    &node,
                    &job,
                    failed + 1,
                    "DeadlineExceeded",
                    "Job was active longer than specified deadline",
                )
                .await;
                return;
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            fail_job(
                &node,
                &job,
                failed,
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
            )
            .await;
            return;
        }
    }
}

async fn fail_job(node: &Node, job: &Job, failed: usize, reason: &str, message: &str) {
    let at = now();
    let conditions: Vec<Value> = ["FailureTarget", "Failed"]
        .iter()
        .map(|t| json!({"type": t, "status": "True", "reason": reason, "message": message, "lastProbeTime": at, "lastTransitionTime": at}))
        .collect();
    patch_job(node, job, json!({"active": 0, "failed": failed, "ready": 0, "conditions": conditions})).await;
}

fn pod_name(job: &str) -> String {
    const LETTERS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let suffix: String = (0..5).map(|_| LETTERS[fastrand::usize(..LETTERS.len())] as char).collect();
    format!("{job}-{suffix}")
}

/// A pod of `job`: creates it, runs its containers, writes its status.
async fn run_pod(
    node: &Node,
    job: &Arc<Job>,
    pod_spec: &PodSpec,
    attempt: usize,
    deadline: Option<Instant>,
    extra_env: &[(String, String)],
) -> PodEnd {
    let namespace = job.metadata.namespace.clone().unwrap_or_default();
    let job_name = job.metadata.name.clone().unwrap_or_default();
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let name = pod_name(&job_name);
    let template = &job.spec.as_ref().map(|s| s.template.clone()).unwrap_or_default();
    let mut labels = template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    for (key, value) in [
        ("batch.kubernetes.io/controller-uid", &uid),
        ("controller-uid", &uid),
        ("batch.kubernetes.io/job-name", &job_name),
        ("job-name", &job_name),
    ] {
        labels.insert(key.into(), value.clone());
    }
    let mut spec = serde_json::to_value(pod_spec).unwrap_or_default();
    spec["nodeName"] = json!("fake-node");
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
            "annotations": template.metadata.as_ref().and_then(|m| m.annotations.clone()),
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": uid,
                "controller": true, "blockOwnerDeletion": true}]},
        "spec": spec});
    let pods: Api<Pod> = Api::namespaced(node.client.clone(), &namespace);
    let created = match serde_json::from_value::<Pod>(pod) {
        Ok(pod) => pods.create(&PostParams::default(), &pod).await.map_err(fixture("creating the pod")),
        Err(e) => Err(TestkitError::Fixture(e.to_string())),
    };
    let pod = match created {
        Ok(pod) => pod,
        Err(error) => {
            tracing::warn!(%error, "Job runner: no pod");
            return PodEnd::Failed;
        }
    };
    let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
    let write_status = |status: Value| {
        let pods = pods.clone();
        let name = name.clone();
        async move {
            if let Err(error) = pods
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({"status": status})))
                .await
            {
                tracing::warn!(%error, pod = name, "Job runner: cannot write the pod status");
            }
        }
    };
    write_status(
        json!({"phase": "Pending", "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "startTime": now()}),
    )
    .await;

    let dir = node.dir.path().join(&name);
    let volumes = loop {
        match prepare_volumes(node, &namespace, pod_spec, &dir).await {
            Ok(volumes) => break volumes,
            // A missing Secret or ConfigMap: the kubelet waits for it.
            Err(error) => {
                tracing::debug!(%error, pod = name, "Job runner: volumes not ready");
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    write_status(json!({"phase": "Failed", "reason": "DeadlineExceeded"})).await;
                    return PodEnd::DeadlineExceeded;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let context = PodContext {
        namespace: namespace.clone(),
        name: name.clone(),
        uid: pod_uid,
        service_account: pod_spec.service_account_name.clone().unwrap_or_else(|| "default".into()),
        spec: pod_spec,
        volumes,
        dir,
        extra_env,
        job: job.clone(),
        attempt,
        deadline,
    };

    let mut init_statuses = Vec::new();
    for container in pod_spec.init_containers.iter().flatten() {
        let result = run_container(node, &context, container, true).await;
        init_statuses.push(result.status(container));
        write_status(json!({"initContainerStatuses": init_statuses})).await;
        match result.end {
            ContainerEnd::Exited(0) => {}
            ContainerEnd::Exited(_) => {
                write_status(json!({"phase": "Failed"})).await;
                return PodEnd::Failed;
            }
            ContainerEnd::Deadline => {
                write_status(json!({"phase": "Failed", "reason": "DeadlineExceeded"})).await;
                return PodEnd::DeadlineExceeded;
            }
        }
    }
    write_status(json!({"phase": "Running"})).await;
    let results = futures::future::join_all(
        pod_spec.containers.iter().map(|c| run_container(node, &context, c, false)),
    )
    .await;
    let statuses: Vec<Value> = results.iter().zip(&pod_spec.containers).map(|(r, c)| r.status(c)).collect();
    if results.iter().any(|r| matches!(r.end, ContainerEnd::Deadline)) {
        write_status(json!({"phase": "Failed", "reason": "DeadlineExceeded", "containerStatuses": statuses}))
            .await;
        return PodEnd::DeadlineExceeded;
    }
    let succeeded = results.iter().all(|r| matches!(r.end, ContainerEnd::Exited(0)));
    let phase = if succeeded { "Succeeded" } else { "Failed" };
    write_status(json!({"phase": phase, "containerStatuses": statuses})).await;
    if succeeded { PodEnd::Succeeded } else { PodEnd::Failed }
}

struct PodContext<'a> {
    namespace: String,
    name: String,
    uid: String,
    service_account: String,
    spec: &'a PodSpec,
    /// Volume name → host directory.
    volumes: HashMap<String, PathBuf>,
    dir: PathBuf,
    extra_env: &'a [(String, String)],
    job: Arc<Job>,
    attempt: usize,
    deadline: Option<Instant>,
}

fn write_files(dir: &Path, files: impl IntoIterator<Item = (String, Vec<u8>)>) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io("creating a volume"))?;
    for (key, bytes) in files {
        std::fs::write(dir.join(key), bytes).map_err(io("writing a volume's file"))?;
    }
    Ok(())
}

async fn secret_files(node: &Node, namespace: &str, name: &str) -> Result<Option<Vec<(String, Vec<u8>)>>> {
    let secrets: Api<Secret> = Api::namespaced(node.client.clone(), namespace);
    let secret = secrets.get_opt(name).await.map_err(fixture("reading a Secret"))?;
    Ok(secret.map(|s| s.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect()))
}

async fn config_map_files(
    node: &Node,
    namespace: &str,
    name: &str,
) -> Result<Option<Vec<(String, Vec<u8>)>>> {
    let maps: Api<ConfigMap> = Api::namespaced(node.client.clone(), namespace);
    let map = maps.get_opt(name).await.map_err(fixture("reading a ConfigMap"))?;
    Ok(map.map(|m| {
        let text = m.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_bytes()));
        text.chain(m.binary_data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0))).collect()
    }))
}

/// Each volume of the pod as a host directory; `Err` while a Secret or
/// ConfigMap it needs is missing.
async fn prepare_volumes(
    node: &Node,
    namespace: &str,
    spec: &PodSpec,
    dir: &Path,
) -> Result<HashMap<String, PathBuf>> {
    let mut volumes = HashMap::new();
    for volume in spec.volumes.iter().flatten() {
        let at = dir.join("volumes").join(&volume.name);
        if let Some(secret) = &volume.secret {
            let name = secret.secret_name.clone().unwrap_or_default();
            match secret_files(node, namespace, &name).await? {
                Some(files) => write_files(&at, files)?,
                None if secret.optional == Some(true) => write_files(&at, [])?,
                None => return Err(TestkitError::Fixture(format!("Secret {namespace}/{name} not found"))),
            }
        } else if let Some(map) = &volume.config_map {
            let name = map.name.clone();
            match config_map_files(node, namespace, &name).await? {
                Some(files) => write_files(&at, files)?,
                None if map.optional == Some(true) => write_files(&at, [])?,
                None => return Err(TestkitError::Fixture(format!("ConfigMap {namespace}/{name} not found"))),
            }
        } else {
            // emptyDir, and whatever else: an empty directory.
            write_files(&at, [])?;
        }
        volumes.insert(volume.name.clone(), at);
    }
    if spec.automount_service_account_token != Some(false) {
        let account = spec.service_account_name.clone().unwrap_or_else(|| "default".into());
        let token = (node.tokens)(namespace, &account);
        let files = [
            ("token".to_string(), token.into_bytes()),
            ("ca.crt".to_string(), node.ca_pem.clone().into_bytes()),
            ("namespace".to_string(), namespace.as_bytes().to_vec()),
        ];
        write_files(&dir.join("serviceaccount"), files)?;
    }
    Ok(volumes)
}

enum ContainerEnd {
    Exited(i32),
    Deadline,
}

struct ContainerResult {
    end: ContainerEnd,
    message: String,
    started_at: String,
    finished_at: String,
}

impl ContainerResult {
    fn status(&self, container: &Container) -> Value {
        let code = match self.end {
            ContainerEnd::Exited(code) => code,
            ContainerEnd::Deadline => 137,
        };
        let reason = match self.end {
            ContainerEnd::Exited(0) => "Completed",
            ContainerEnd::Exited(_) => "Error",
            ContainerEnd::Deadline => "DeadlineExceeded",
        };
        let mut terminated = json!({"exitCode": code, "reason": reason, "startedAt": self.started_at, "finishedAt": self.finished_at});
        if !self.message.is_empty() {
            terminated["message"] = json!(self.message);
        }
        json!({"name": container.name, "image": container.image, "imageID": "", "ready": false,
            "restartCount": 0, "started": false, "state": {"terminated": terminated}})
    }
}

/// The kubelet's bound on a termination message.
const MESSAGE_MAX: usize = 4096;
/// `FallbackToLogsOnError`: the last 80 lines, at most 2048 bytes.
const LOG_LINES: usize = 80;
const LOG_MAX: usize = 2048;

fn cut(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(LOG_LINES)..].join("\n");
    let mut start = tail.len().saturating_sub(LOG_MAX);
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    tail[start..].to_string()
}

async fn resolve_env(
    node: &Node,
    context: &PodContext<'_>,
    container: &Container,
) -> std::result::Result<Vec<(String, String)>, String> {
    let mut env = vec![
        ("PATH".to_string(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()),
        ("HOSTNAME".to_string(), context.name.clone()),
        ("HOME".to_string(), "/root".to_string()),
        ("KUBERNETES_SERVICE_HOST".to_string(), node.https.ip().to_string()),
        ("KUBERNETES_SERVICE_PORT".to_string(), node.https.port().to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".to_string(), node.https.port().to_string()),
        ("KUBERNETES_PORT".to_string(), format!("tcp://{}", node.https)),
    ];
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(value), _) => value.clone(),
            (None, Some(from)) => {
                if let Some(field) = &from.field_ref {
                    match field.field_path.as_str() {
                        "metadata.name" => context.name.clone(),
                        "metadata.namespace" => context.namespace.clone(),
                        "metadata.uid" => context.uid.clone(),
                        "spec.serviceAccountName" => context.service_account.clone(),
                        "spec.nodeName" => "fake-node".into(),
                        "status.podIP" | "status.hostIP" => "127.0.0.1".into(),
                        other => return Err(format!("fieldRef {other} is not served by the fake kubelet")),
                    }
                } else if let Some(key) = &from.secret_key_ref {
                    let files =
                        secret_files(node, &context.namespace, &key.name).await.map_err(|e| e.to_string())?;
                    match files.and_then(|f| f.into_iter().find(|(k, _)| *k == key.key)) {
                        Some((_, bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
                        None if key.optional == Some(true) => continue,
                        None => return Err(format!("secret \"{}\" key \"{}\" not found", key.name, key.key)),
                    }
                } else if let Some(key) = &from.config_map_key_ref {
                    let files = config_map_files(node, &context.namespace, &key.name)
                        .await
                        .map_err(|e| e.to_string())?;
                    match files.and_then(|f| f.into_iter().find(|(k, _)| *k == key.key)) {
                        Some((_, bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
                        None if key.optional == Some(true) => continue,
                        None => {
                            return Err(format!("configmap \"{}\" key \"{}\" not found", key.name, key.key));
                        }
                    }
                } else {
                    return Err(format!("env {}: a valueFrom the fake kubelet does not serve", var.name));
                }
            }
            (None, None) => String::new(),
        };
        env.retain(|(k, _)| *k != var.name);
        env.push((var.name.clone(), value));
    }
    env.extend(context.extra_env.iter().cloned());
    Ok(env)
}

fn mounts(
    context: &PodContext<'_>,
    container: &Container,
    log: &Path,
) -> std::result::Result<Vec<SandboxMount>, String> {
    let mut mounts = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let mut source = context
            .volumes
            .get(&mount.name)
            .cloned()
            .ok_or_else(|| format!("volumeMount {}: no such volume", mount.name))?;
        if let Some(sub) = mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
            source = source.join(sub);
        }
        mounts.push(SandboxMount {
            target: mount.mount_path.clone().into(),
            source,
            read_only: mount.read_only == Some(true),
        });
    }
    if context.spec.automount_service_account_token != Some(false) {
        mounts.push(SandboxMount {
            target: "/var/run/secrets/kubernetes.io/serviceaccount".into(),
            source: context.dir.join("serviceaccount"),
            read_only: true,
        });
    }
    let path = container.termination_message_path.clone().unwrap_or_else(|| "/dev/termination-log".into());
    mounts.push(SandboxMount { target: path.into(), source: log.to_path_buf(), read_only: false });
    Ok(mounts)
}

async fn run_container(
    node: &Node,
    context: &PodContext<'_>,
    container: &Container,
    init: bool,
) -> ContainerResult {
    let started_at = now();
    let refused = |message: String| ContainerResult {
        end: ContainerEnd::Exited(128),
        message: cut(&message, MESSAGE_MAX),
        started_at: started_at.clone(),
        finished_at: now(),
    };
    let image = container.image.clone().unwrap_or_default();
    let Some(program) = node.options.images.get(&image) else {
        return refused(format!("image {image} is not mapped"));
    };
    if container.command.as_ref().is_some_and(|c| !c.is_empty()) {
        return refused(
            "RunContainerError: the fake kubelet runs an image's entrypoint; `command` is not served".into(),
        );
    }
    let cdir = context.dir.join("containers").join(&container.name);
    if let Err(e) = std::fs::create_dir_all(&cdir) {
        return refused(e.to_string());
    }
    let log = cdir.join("termination-log");
    let root = cdir.join("root");
    let prepared = std::fs::write(&log, b"").and_then(|()| std::fs::create_dir_all(&root));
    if let Err(e) = prepared {
        return refused(e.to_string());
    }
    let env = match resolve_env(node, context, container).await {
        Ok(env) => env,
        Err(message) => return refused(format!("CreateContainerConfigError: {message}")),
    };
    let mounts = match mounts(context, container, &log) {
        Ok(mounts) => mounts,
        Err(message) => return refused(message),
    };
    let args = container.args.clone().unwrap_or_default();
    let spec = SandboxSpec {
        root,
        mounts,
        program: program.executable.clone(),
        args: args.clone(),
        working_dir: container.working_dir.clone(),
    };
    let spec_path = cdir.join("sandbox.json");
    if let Err(e) = std::fs::write(&spec_path, serde_json::to_vec(&spec).unwrap_or_default()) {
        return refused(e.to_string());
    }
    let index = {
        let mut runs = node.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.push(ContainerRun {
            job: context.job.clone(),
            pod: context.name.clone(),
            attempt: context.attempt,
            container: container.name.clone(),
            init,
            image: image.clone(),
            args,
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            message: String::new(),
            started: Instant::now(),
        });
        runs.len() - 1
    };
    let child = tokio::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "--propagation", "private"])
        .arg(&node.sandbox)
        .arg(&spec_path)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let child = match child {
        Ok(child) => child,
        Err(e) => return refused(format!("starting unshare: {e}")),
    };
    let waited = match context.deadline {
        Some(deadline) => tokio::time::timeout_at(deadline.into(), child.wait_with_output()).await.ok(),
        None => Some(child.wait_with_output().await),
    };
    let (end, stdout, stderr) = match waited {
        None => (ContainerEnd::Deadline, String::new(), String::new()),
        Some(Ok(output)) => (
            ContainerEnd::Exited(output.status.code().unwrap_or(137)),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ),
        Some(Err(e)) => (ContainerEnd::Exited(128), String::new(), e.to_string()),
    };
    let mut message = cut(&std::fs::read_to_string(&log).unwrap_or_default(), MESSAGE_MAX);
    let fallback = container.termination_message_policy.as_deref() == Some("FallbackToLogsOnError");
    if message.is_empty() && fallback && !matches!(end, ContainerEnd::Exited(0)) {
        message = tail(&format!("{stdout}{stderr}"));
    }
    if let Ok(mut runs) = node.runs.lock()
        && let Some(run) = runs.get_mut(index)
    {
        run.exit_code = Some(match end {
            ContainerEnd::Exited(code) => code,
            ContainerEnd::Deadline => 137,
        });
        run.stdout = stdout;
        run.stderr = stderr;
        run.message = message.clone();
    }
    ContainerResult { end, message, started_at, finished_at: now() }
}
