//! A gateway in process in front of a `vynil_e2e::Stack`, with one token per
//! role: what the gateway's own tests (CLI, web page) and the cross-service
//! API test (`e2e/tests/gateway_api.rs`, which includes this file) start.

#![allow(dead_code, clippy::unwrap_used)]

use vynil_e2e::Stack;
use vynil_gateway::auth::{Role, TokenBook};

/// The token of `role` (its principal is `<role>-user`).
pub fn token(role: Role) -> String {
    format!("token-of-the-{}", role.as_str())
}

pub struct TestGateway {
    pub url: String,
    pub stop: vynil_runtime::Shutdown,
    _dir: tempfile::TempDir,
}

impl TestGateway {
    /// Serves until `stop` is triggered.
    pub async fn start(stack: &Stack) -> Self {
        Self::start_with(stack, &[]).await
    }

    /// [`TestGateway::start`] with more flags.
    pub async fn start_with(stack: &Stack, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let lines: Vec<String> = Role::ALL
            .iter()
            .map(|r| TokenBook::line(&format!("{}-user", r.as_str()), *r, &token(*r)))
            .collect();
        std::fs::write(dir.path().join("tokens.yaml"), format!("tokens:\n{}\n", lines.join("\n"))).unwrap();
        let endpoint = |addr: std::net::SocketAddr| format!("http://{addr}");
        let config = <vynil_gateway::Config as clap::Parser>::parse_from(
            [
                "vynil-gateway".to_string(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--tokens-file".into(),
                dir.path().join("tokens.yaml").display().to_string(),
                "--service-token-file".into(),
                stack.token.path().display().to_string(),
                "--catalog-endpoint".into(),
                endpoint(stack.catalog),
                "--scanner-endpoint".into(),
                endpoint(stack.scanner),
                "--purger-endpoint".into(),
                endpoint(stack.purger),
                "--lifecycle-endpoint".into(),
                endpoint(stack.lifecycle),
            ]
            .into_iter()
            .chain(extra.iter().map(|flag| flag.to_string())),
        );
        let gateway = vynil_gateway::Gateway::bind(&config).await.unwrap();
        let url = format!("http://{}", gateway.local_addr().unwrap());
        let stop = vynil_runtime::Shutdown::new();
        tokio::spawn(gateway.serve(stop.signaled()));
        Self { url, stop, _dir: dir }
    }
}
