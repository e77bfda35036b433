//! `vynilctl`: see `vynil_gateway::cli`.

#[tokio::main]
async fn main() {
    let code = vynil_gateway::cli::main().await;
    std::process::exit(code);
}
