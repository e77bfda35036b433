//! The `vynil-purger` binary as a real process: health, reflection, SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use vynil_proto::purger::v1::{
    GetPlanRequest, PlanRequest, plan_request::Target, purger_client::PurgerClient,
};
use vynil_testkit::ServiceProcess;

const SERVICE: &str = "vynil.purger.v1.Purger";

#[tokio::test]
async fn the_binary_serves_health_and_reflection_then_exits_cleanly_on_sigterm() {
    let service = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-purger")), &[]).await.unwrap();
    service.check_serves_then_stops(SERVICE).await.unwrap();
}

#[tokio::test]
async fn an_unauthenticated_caller_cannot_make_a_purge_plan() {
    // A plan reads the registry and the cluster and is stored for Execute:
    // only the gateway's service token may ask for one.
    let service = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-purger")), &[]).await.unwrap();
    let mut client = PurgerClient::new(service.channel().await.unwrap());
    let status = client.plan(PlanRequest { target: Some(Target::Jukebox("box".into())) }).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("purge Plan") && status.message().contains("gateway"), "{status:?}");
}

#[tokio::test]
async fn with_embedded_defaults_it_answers_without_redis_or_lifecycle() {
    // On loopback, as in local mode, where whoever reaches the port is the user.
    let local = ["--allow-unauthenticated"];
    let service = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_vynil-purger")), &local).await.unwrap();
    let mut client = PurgerClient::new(service.channel().await.unwrap());
    let status = client.get_plan(GetPlanRequest { plan_id: "nope".into() }).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    let status = client.plan(PlanRequest { target: Some(Target::Jukebox("box".into())) }).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("cannot read the JukeBox directory"), "{status:?}");
}
