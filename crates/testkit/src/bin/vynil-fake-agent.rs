//! `vynil-fake-agent <type> <action>`: upstream's agent as the test kit's
//! Job runner runs it in an agent Job's pod (see
//! `vynil_testkit::kube_api::agent_main`).

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(vynil_testkit::kube_api::agent_main(&args).await);
}
