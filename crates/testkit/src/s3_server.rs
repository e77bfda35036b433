//! An S3-compatible server in process (`s3s` over a directory, `s3s-fs`)
//! that checks AWS Signature V4 against one access key: a wrong secret is
//! refused as real S3 refuses it (`SignatureDoesNotMatch`). Path-style
//! requests only (`<endpoint>/<bucket>/<key>`).

use std::{net::SocketAddr, path::Path};

use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto::Builder,
};
use s3s::{auth::SimpleAuth, service::S3ServiceBuilder};

use crate::{Result, TestkitError};

/// The server; stops when dropped.
#[derive(Debug)]
pub struct S3Server {
    addr: SocketAddr,
    access_key: String,
    secret_key: String,
    task: tokio::task::JoinHandle<()>,
}

impl S3Server {
    /// Serves `root` (each directory below it a bucket; `buckets` are
    /// created) to requests signed with `access_key`/`secret_key`.
    pub async fn start(root: &Path, buckets: &[&str], access_key: &str, secret_key: &str) -> Result<Self> {
        for bucket in buckets {
            std::fs::create_dir_all(root.join(bucket))
                .map_err(|source| TestkitError::Io { doing: format!("creating bucket {bucket}"), source })?;
        }
        let fs = s3s_fs::FileSystem::new(root)
            .map_err(|e| TestkitError::Fixture(format!("s3s-fs cannot serve {}: {e:?}", root.display())))?;
        let mut builder = S3ServiceBuilder::new(fs);
        builder.set_auth(SimpleAuth::from_single(access_key, secret_key));
        let service = builder.build();
        let io = |source| TestkitError::Io { doing: "binding a loopback port".into(), source };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(io)?;
        let addr = listener.local_addr().map_err(io)?;
        let task = tokio::spawn(async move {
            let server = Builder::new(TokioExecutor::new());
            while let Ok((socket, _)) = listener.accept().await {
                let connection = server.serve_connection(TokioIo::new(socket), service.clone()).into_owned();
                tokio::spawn(async move {
                    let _ = connection.await;
                });
            }
        });
        Ok(Self { addr, access_key: access_key.to_string(), secret_key: secret_key.to_string(), task })
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    pub fn secret_key(&self) -> &str {
        &self.secret_key
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}
