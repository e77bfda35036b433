//! The fake API server's HTTPS endpoint, beside its plain HTTP one.
//!
//! Why: a program run in a pod finds its API server as on a real node, from
//! `KUBERNETES_SERVICE_HOST`/`PORT` and the mounted
//! `/var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt}`, and kube
//! clients' in-cluster configuration (kube-rs, client-go) speaks HTTPS only,
//! verifying the server against that CA. So the fake generates a cluster CA
//! of its own at start (`rcgen`) and a serving certificate signed by it for
//! `127.0.0.1`, `localhost` and `kubernetes.default.svc`, and serves the
//! same router over TLS (`tokio-rustls` + hyper, HTTP/1.1).

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::{Result, TestkitError};

/// The cluster CA and the API server's serving configuration.
pub(super) struct ClusterTls {
    /// The CA certificate, PEM: a pod's `ca.crt`.
    pub(super) ca_pem: String,
    pub(super) acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTls").finish_non_exhaustive()
    }
}

fn tls_error(doing: &'static str) -> impl FnOnce(String) -> TestkitError {
    move |e| TestkitError::Fixture(format!("fake API server TLS, {doing}: {e}"))
}

impl ClusterTls {
    pub(super) fn generate() -> Result<Self> {
        let mut ca =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| tls_error("CA")(e.to_string()))?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "kubernetes");
        ca.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_key = KeyPair::generate().map_err(|e| tls_error("CA key")(e.to_string()))?;
        let ca = CertifiedIssuer::self_signed(ca, ca_key)
            .map_err(|e| tls_error("CA certificate")(e.to_string()))?;

        let names =
            vec!["localhost".to_string(), "kubernetes.default.svc".to_string(), "kubernetes".to_string()];
        let mut serving = CertificateParams::new(names).map_err(|e| tls_error("serving")(e.to_string()))?;
        serving.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        serving.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        let key = KeyPair::generate().map_err(|e| tls_error("serving key")(e.to_string()))?;
        let cert =
            serving.signed_by(&key, &ca).map_err(|e| tls_error("serving certificate")(e.to_string()))?;

        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("protocol versions")(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone(), ca.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .map_err(|e| tls_error("server configuration")(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self { ca_pem: ca.pem(), acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)) })
    }
}

/// Serves `app` over TLS on `listener` until the task is dropped.
pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    app: axum::Router,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((tcp, _)) = listener.accept().await else { continue };
        let _ = tcp.set_nodelay(true);
        let (acceptor, app) = (acceptor.clone(), app.clone());
        connections.spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else { return };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            if let Err(error) =
                builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(tls), service).await
            {
                tracing::debug!(%error, "fake API server: a TLS connection ended");
            }
        });
        while connections.try_join_next().is_some() {}
    }
}
