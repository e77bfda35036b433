//! The fake API server's Job runner (the Job controller and kubelet in
//! process): one test per rule of `kube_api::kubelet`, each against what the
//! Job controller and kubelet document (Job status conditions and reasons,
//! the termination message and its 4096-byte bound, `backoffLimit`,
//! `activeDeadlineSeconds`, the in-cluster files and variables).

use std::{path::Path, time::Duration};

use k8s_openapi::api::{
    batch::v1::Job,
    core::v1::{ConfigMap, Pod, Secret},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::{Value, json};
use vynil_testkit::kube_api::{FakeApiOptions, FakeApiServer, JobRunner, RunnerOptions};

mod common;
use common::TestResult;

const NS: &str = "jobs";

async fn cluster(
    rbac: bool,
) -> Result<(FakeApiServer, Client, JobRunner), Box<dyn std::error::Error + Send + Sync>> {
    let api = FakeApiServer::start_with(FakeApiOptions { rbac, ..Default::default() }).await?;
    api.create_namespaces(&[NS])?;
    let runner = JobRunner::start(&api, NS, RunnerOptions::new().image("shell:1", Path::new("/bin/sh")))?;
    let client = api.client()?;
    Ok((api, client, runner))
}

fn shell_job(name: &str, script: &str, spec: Value, container: Value) -> Result<Job, serde_json::Error> {
    let mut main = json!({"name": "main", "image": "shell:1", "args": ["-c", script]});
    if let (Some(main), Some(extra)) = (main.as_object_mut(), container.as_object()) {
        main.extend(extra.clone());
    }
    let mut job_spec = json!({"template": {"spec": {"restartPolicy": "Never", "containers": [main]}}});
    if let (Some(template), Some(extra)) =
        (job_spec["template"]["spec"].as_object_mut(), spec.get("pod").and_then(Value::as_object))
    {
        template.extend(extra.clone());
    }
    if let (Some(job), Some(extra)) = (job_spec.as_object_mut(), spec.get("job").and_then(Value::as_object)) {
        job.extend(extra.clone());
    }
    serde_json::from_value(
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": job_spec}),
    )
}

/// Waits for the Job's `Complete` or `Failed` condition; returns it.
async fn finished(jobs: &Api<Job>, name: &str) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
    for _ in 0..3000 {
        let job = serde_json::to_value(jobs.get(name).await?)?;
        let conditions = job["status"]["conditions"].as_array().cloned().unwrap_or_default();
        if let Some(done) = conditions
            .into_iter()
            .find(|c| (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True")
        {
            return Ok(json!({"job": job, "condition": done}));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(format!("Job {name} never finished").into())
}

async fn pods_of(client: &Client, job: &str) -> Result<Vec<Value>, Box<dyn std::error::Error + Send + Sync>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let list =
        pods.list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}"))).await?;
    Ok(list.items.into_iter().map(|p| serde_json::to_value(p).unwrap_or_default()).collect())
}

#[tokio::test]
async fn a_container_sees_its_env_mounts_and_service_account_at_their_real_paths() -> TestResult {
    let (api, client, _runner) = cluster(false).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"}, "stringData": {"password": "s3cret"}});
    secrets.create(&PostParams::default(), &serde_json::from_value(secret)?).await?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"mode": "fast"}});
    maps.create(&PostParams::default(), &serde_json::from_value(map)?).await?;
    // Everything the container saw, as its termination message.
    let script = "set -e; d=/var/run/secrets/kubernetes.io/serviceaccount; \
        printf '%s|%s|%s|%s|%s|%s|%s|%s' \"$PASSWORD\" \"$MY_POD\" \"$HOSTNAME\" \"$MY_NS\" \"$(cat /etc/app/mode)\" \
        \"$(cat $d/namespace)\" \"$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT\" \"$(head -1 $d/ca.crt)\" > /dev/termination-log; \
        touch /scratch/written";
    let job = shell_job(
        "sees",
        script,
        json!({"pod": {"volumes": [{"name": "cfg", "configMap": {"name": "settings"}}, {"name": "scratch", "emptyDir": {}}]}}),
        json!({
            "env": [
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                {"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            ],
            "volumeMounts": [{"name": "cfg", "mountPath": "/etc/app"}, {"name": "scratch", "mountPath": "/scratch"}],
        }),
    )?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    jobs.create(&PostParams::default(), &job).await?;
    let done = finished(&jobs, "sees").await?;
    assert_eq!(done["condition"]["type"], "Complete", "{done}");
    assert_eq!(done["job"]["status"]["succeeded"], 1);
    let pods = pods_of(&client, "sees").await?;
    assert_eq!(pods.len(), 1);
    let pod = &pods[0];
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
    assert!(pod_name.starts_with("sees-"), "{pod_name}");
    assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "Job");
    assert_eq!(pod["status"]["phase"], "Succeeded");
    let terminated = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["exitCode"], 0);
    assert_eq!(terminated["reason"], "Completed");
    let seen: Vec<&str> = terminated["message"].as_str().unwrap_or_default().split('|').collect();
    let https = api.https_addr().to_string();
    let expected =
        ["s3cret", pod_name, pod_name, NS, "fast", NS, https.as_str(), "-----BEGIN CERTIFICATE-----"];
    assert_eq!(seen, expected);
    // Nothing of it was written on the host.
    assert!(!Path::new("/scratch").exists() && !Path::new("/etc/app").exists());
    Ok(())
}

#[tokio::test]
async fn a_failing_pod_is_replaced_until_the_backoff_limit_then_the_job_fails() -> TestResult {
    let (_api, client, runner) = cluster(false).await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let job = shell_job(
        "fails",
        "echo broken > /dev/termination-log; exit 3",
        json!({"job": {"backoffLimit": 2}}),
        json!({}),
    )?;
    jobs.create(&PostParams::default(), &job).await?;
    let done = finished(&jobs, "fails").await?;
    assert_eq!(done["condition"]["type"], "Failed");
    assert_eq!(done["condition"]["reason"], "BackoffLimitExceeded");
    assert_eq!(done["condition"]["message"], "Job has reached the specified backoff limit");
    assert_eq!(done["job"]["status"]["failed"], 3, "backoffLimit 2: three pods");
    let conditions = done["job"]["status"]["conditions"].as_array().cloned().unwrap_or_default();
    assert!(conditions.iter().any(|c| c["type"] == "FailureTarget"), "{conditions:?}");
    let pods = pods_of(&client, "fails").await?;
    assert_eq!(pods.len(), 3);
    for pod in &pods {
        let terminated = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
        assert_eq!(
            (terminated["exitCode"].as_i64(), terminated["reason"].as_str()),
            (Some(3), Some("Error"))
        );
        assert_eq!(terminated["message"], "broken\n");
    }
    assert_eq!(runner.runs().iter().filter(|r| r.exit_code == Some(3)).count(), 3);
    Ok(())
}

#[tokio::test]
async fn a_termination_message_is_cut_at_4096_bytes_and_logs_stand_in_when_asked() -> TestResult {
    let (_api, client, _runner) = cluster(false).await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let long = shell_job(
        "long",
        "head -c 5000 /dev/zero | tr '\\0' x > /dev/termination-log",
        json!({}),
        json!({}),
    )?;
    jobs.create(&PostParams::default(), &long).await?;
    let logs = shell_job(
        "logs",
        "echo first; echo last words >&2; exit 1",
        json!({"job": {"backoffLimit": 0}}),
        json!({"terminationMessagePolicy": "FallbackToLogsOnError"}),
    )?;
    jobs.create(&PostParams::default(), &logs).await?;
    finished(&jobs, "long").await?;
    let pod = &pods_of(&client, "long").await?[0];
    let message =
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"].as_str().unwrap_or_default();
    assert_eq!(message.len(), 4096);
    finished(&jobs, "logs").await?;
    let pod = &pods_of(&client, "logs").await?[0];
    let message =
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("first") && message.contains("last words"), "{message}");
    Ok(())
}

#[tokio::test]
async fn a_job_past_its_deadline_is_killed_and_fails_deadline_exceeded() -> TestResult {
    let (_api, client, runner) = cluster(false).await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let job = shell_job("slow", "sleep 600", json!({"job": {"activeDeadlineSeconds": 1}}), json!({}))?;
    jobs.create(&PostParams::default(), &job).await?;
    let done = finished(&jobs, "slow").await?;
    assert_eq!(done["condition"]["type"], "Failed");
    assert_eq!(done["condition"]["reason"], "DeadlineExceeded");
    assert_eq!(done["condition"]["message"], "Job was active longer than specified deadline");
    let run =
        runner.runs().into_iter().find(|r| r.job.metadata.name.as_deref() == Some("slow")).ok_or("no run")?;
    assert_eq!(run.exit_code, Some(137), "killed");
    Ok(())
}

#[tokio::test]
async fn a_job_of_an_unmapped_image_gets_no_pod_and_a_deleted_job_kills_its_process() -> TestResult {
    let (_api, client, runner) = cluster(false).await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let mut unmapped = shell_job("unmapped", "exit 0", json!({}), json!({}))?;
    if let Some(c) =
        unmapped.spec.as_mut().and_then(|s| s.template.spec.as_mut()).and_then(|s| s.containers.first_mut())
    {
        c.image = Some("registry.example/nowhere:1".into());
    }
    jobs.create(&PostParams::default(), &unmapped).await?;
    // Created after it: once this one runs, the runner has seen the first.
    // The container's process writes its pid where the test reads it (the
    // host's /tmp is seen inside), then becomes `sleep`.
    let dir = tempfile::tempdir()?;
    let pid_file = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 600", pid_file.display());
    jobs.create(&PostParams::default(), &shell_job("hangs", &script, json!({}), json!({}))?).await?;
    common::eventually(|| async { pid_file.exists() }, "the hanging Job runs").await?;
    assert!(pods_of(&client, "unmapped").await?.is_empty(), "no pod for an image nobody can pull");
    let status = serde_json::to_value(jobs.get("unmapped").await?)?;
    assert!(status["status"]["conditions"].is_null() && status["status"]["active"].is_null(), "{status}");
    assert!(runner.runs().iter().all(|r| r.job.metadata.name.as_deref() != Some("unmapped")));

    let pid = std::fs::read_to_string(&pid_file)?.trim().to_string();
    let alive = |pid: &str| {
        // Gone, or a zombie waiting to be reaped, is dead.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| !stat.rsplit(')').next().unwrap_or_default().trim_start().starts_with('Z'))
            .unwrap_or(false)
    };
    assert!(alive(&pid), "the container's process runs");
    jobs.delete("hangs", &DeleteParams::background()).await?;
    common::eventually(|| async { !alive(&pid) }, "the deleted Job's process is killed").await?;
    Ok(())
}

#[tokio::test]
async fn a_container_talks_to_the_api_in_cluster_as_its_service_account_under_rbac() -> TestResult {
    let (api, client, _runner) = cluster(true).await?;
    let rbac = json!([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader", "namespace": NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "read-maps", "namespace": NS},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "reader", "namespace": NS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-maps"},
         "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": NS}]},
    ]);
    api.load_rbac(rbac.as_array().cloned().unwrap_or_default(), NS)?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let map =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hello"}, "data": {"k": "v"}});
    maps.create(&PostParams::default(), &serde_json::from_value(map)?).await?;
    // The fake agent binary is a kube client with in-cluster configuration:
    // here the same is done by kubectl-free means, a TLS request with the
    // mounted CA and token (curl verifies the server against ca.crt).
    let script = "d=/var/run/secrets/kubernetes.io/serviceaccount; base=https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/namespaces/$(cat $d/namespace)/configmaps; \
        ok=$(curl -s -o /dev/null -w '%{http_code}' --cacert $d/ca.crt -H \"Authorization: Bearer $(cat $d/token)\" $base/hello); \
        no=$(curl -s -o /dev/null -w '%{http_code}' --cacert $d/ca.crt -H \"Authorization: Bearer $(cat $d/token)\" $base); \
        printf '%s %s' $ok $no > /dev/termination-log";
    let job = shell_job("talks", script, json!({"pod": {"serviceAccountName": "reader"}}), json!({}))?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    jobs.create(&PostParams::default(), &job).await?;
    finished(&jobs, "talks").await?;
    let pod = &pods_of(&client, "talks").await?[0];
    let message = pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"].clone();
    assert_eq!(message, "200 403", "get granted, list refused, over verified TLS");
    Ok(())
}
