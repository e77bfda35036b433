//! An HTTP server of an index directory, as a web server or an object store's
//! website would serve one: `GET` with a strong `ETag` and `If-None-Match`
//! (`304`), `PUT` and `DELETE` (an export destination), every request behind
//! a Bearer token, and every request recorded so a test can count them.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use sha2::{Digest, Sha256};

use crate::{Result, TestkitError};

/// One request the server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexRequest {
    pub method: String,
    /// The file, relative to the served directory.
    pub file: String,
    pub status: u16,
    /// It carried `If-None-Match`.
    pub conditional: bool,
}

#[derive(Debug)]
struct Shared {
    root: PathBuf,
    token: String,
    requests: Mutex<Vec<IndexRequest>>,
}

/// The server; stops when dropped.
#[derive(Debug)]
pub struct IndexServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl IndexServer {
    /// Serves `root` (created if absent) to callers presenting `Bearer <token>`.
    pub async fn start(root: &Path, token: &str) -> Result<Self> {
        std::fs::create_dir_all(root)
            .map_err(|source| TestkitError::Io { doing: format!("creating {}", root.display()), source })?;
        let shared = Arc::new(Shared {
            root: root.to_path_buf(),
            token: token.to_string(),
            requests: Mutex::new(Vec::new()),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let io = |source| TestkitError::Io { doing: "binding a loopback port".into(), source };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(io)?;
        let addr = listener.local_addr().map_err(io)?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, shared, task })
    }

    /// The URL of the served directory's root.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<IndexRequest> {
        self.shared.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    pub fn clear_requests(&self) {
        if let Ok(mut requests) = self.shared.requests.lock() {
            requests.clear();
        }
    }
}

impl Drop for IndexServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn etag(bytes: &[u8]) -> String {
    format!("\"{}\"", &hex::encode(Sha256::digest(bytes))[..32])
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let file = uri.path().trim_start_matches('/').to_string();
    let conditional = headers.contains_key(header::IF_NONE_MATCH);
    let response = answer(&shared, &method, &file, &headers, body);
    if let Ok(mut requests) = shared.requests.lock() {
        requests.push(IndexRequest {
            method: method.to_string(),
            file,
            status: response.status().as_u16(),
            conditional,
        });
    }
    response
}

fn answer(shared: &Shared, method: &Method, file: &str, headers: &HeaderMap, body: Bytes) -> Response {
    let expected = format!("Bearer {}", shared.token);
    if headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) != Some(expected.as_str()) {
        return (StatusCode::UNAUTHORIZED, "a Bearer token is required").into_response();
    }
    if file.is_empty() || file.split('/').any(|part| part == ".." || part.is_empty()) {
        return StatusCode::BAD_REQUEST.into_response();
    }
    let path = shared.root.join(file);
    match *method {
        Method::GET | Method::HEAD => match std::fs::read(&path) {
            Ok(bytes) => {
                let tag = etag(&bytes);
                if headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) == Some(tag.as_str()) {
                    return (StatusCode::NOT_MODIFIED, [(header::ETAG, tag)]).into_response();
                }
                let body = if *method == Method::HEAD { Vec::new() } else { bytes.clone() };
                (
                    StatusCode::OK,
                    [(header::ETAG, tag), (header::CONTENT_LENGTH, bytes.len().to_string())],
                    body,
                )
                    .into_response()
            }
            Err(_) => StatusCode::NOT_FOUND.into_response(),
        },
        Method::PUT => {
            if let Some(parent) = path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            // Written aside then renamed, as a server that never serves half a file.
            let staging = path.with_extension("partial");
            match std::fs::write(&staging, &body).and_then(|_| std::fs::rename(&staging, &path)) {
                Ok(()) => StatusCode::CREATED.into_response(),
                Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
            }
        }
        Method::DELETE => match std::fs::remove_file(&path) {
            Ok(()) => StatusCode::NO_CONTENT.into_response(),
            Err(_) => StatusCode::NOT_FOUND.into_response(),
        },
        _ => StatusCode::METHOD_NOT_ALLOWED.into_response(),
    }
}
