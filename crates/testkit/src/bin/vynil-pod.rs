//! `vynil-pod <spec.json>`: a container of the fake API server's Job runner,
//! its mounts at their real paths in a mount namespace of its own (see
//! `vynil_testkit::kube_api::sandbox`). Run under `unshare`, never by hand.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    std::process::exit(vynil_testkit::kube_api::sandbox::main_with_args(&args));
}
