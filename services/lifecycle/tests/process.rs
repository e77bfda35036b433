//! The `vynil-lifecycle` binary as a real process: health, reflection, SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use vynil_proto::lifecycle::v1::{ListInstancesRequest, lifecycle_client::LifecycleClient};
use vynil_testkit::ServiceProcess;

const SERVICE: &str = "vynil.lifecycle.v1.Lifecycle";

#[tokio::test]
async fn the_binary_serves_health_and_reflection_then_exits_cleanly_on_sigterm() {
    let service = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-lifecycle")), &[]).await.unwrap();
    service.check_serves_then_stops(SERVICE).await.unwrap();
}

#[tokio::test]
async fn without_a_cluster_every_rpc_says_how_to_enable_it() {
    let service = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-lifecycle")), &[]).await.unwrap();
    let mut client = LifecycleClient::new(service.channel().await.unwrap());
    let status = client.list_instances(ListInstancesRequest::default()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("--kubernetes"), "{status:?}");
}

#[tokio::test]
async fn metrics_are_served_with_upstreams_reconcile_names_and_rpcs_are_counted() {
    let service = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-lifecycle")), &[]).await.unwrap();
    let mut client = LifecycleClient::new(service.channel().await.unwrap());
    client.list_instances(ListInstancesRequest::default()).await.unwrap_err();
    let text = reqwest::get(format!("{}/metrics", service.endpoint())).await.unwrap().text().await.unwrap();
    for kind in ["tenant", "service", "system"] {
        assert!(text.contains(&format!("{kind}_instance_reconcile_runs_total")), "{text}");
        assert!(text.contains(&format!("# TYPE {kind}_instance_reconcile_duration histogram")), "{text}");
    }
    assert!(
        text.lines().any(|l| l.starts_with("grpc_server_handled_total{")
            && l.contains("grpc_service=\"vynil.lifecycle.v1.Lifecycle\"")
            && l.contains("grpc_method=\"ListInstances\"")
            && l.contains("grpc_code=\"FailedPrecondition\"")
            && l.ends_with(" 1")),
        "{text}"
    );
}
