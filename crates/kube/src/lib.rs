//! The Kubernetes client of a service (or the gateway) presenting itself as
//! its user agent: the kubeconfig, or the pod's ServiceAccount in a cluster.
//! Its connect and write timeouts are [`WRITE_WINDOW`]: a write reaches the
//! API server within them after the check that allowed it, which is what
//! bounds the window the store's fenced leases leave (`vynil_store::lease`).

use std::time::Duration;

use vynil_failure::{Classify, Failure};

/// Connect and write timeouts of the client: a status write is sent within
/// twice this after the scanner checked its lease.
pub const WRITE_WINDOW: Duration = Duration::from_secs(10);

/// Why no client could be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("Kubernetes API, connecting (kubeconfig or in-cluster): {0}")]
    Connect(kube::Error),
    #[error("user agent {agent:?} is not a valid header value: {problem}")]
    UserAgent { agent: String, problem: String },
}

impl Classify for ClientError {
    fn failure(&self) -> Failure {
        match self {
            // No kubeconfig yet, an API server not up yet: retried.
            ClientError::Connect(_) => Failure::Transient,
            ClientError::UserAgent { .. } => Failure::Refused,
        }
    }
}

/// The client of a service presenting itself as `user_agent`.
pub async fn client(user_agent: &str) -> Result<kube::Client, ClientError> {
    // Bad input is said before anything is tried.
    let agent = http::HeaderValue::from_str(user_agent)
        .map_err(|e| ClientError::UserAgent { agent: user_agent.to_string(), problem: e.to_string() })?;
    let mut config =
        kube::Config::infer().await.map_err(|e| ClientError::Connect(kube::Error::InferConfig(e)))?;
    config.headers.push((http::header::USER_AGENT, agent));
    config.connect_timeout = Some(WRITE_WINDOW);
    config.write_timeout = Some(WRITE_WINDOW);
    kube::Client::try_from(config).map_err(ClientError::Connect)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_bad_user_agent_is_refused_before_any_connection() {
        let error = client("vynil-scanner\npod/x").await.err();
        assert!(matches!(error, Some(ClientError::UserAgent { .. })), "{error:?}");
        assert_eq!(error.map(|e| e.failure()), Some(Failure::Refused));
    }
}
