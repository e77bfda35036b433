//! The CLI's HTTP client: the gateway's public API only, errors as the
//! gateway gave them (code, message, request id) with an exit code each.

use serde::{Serialize, de::DeserializeOwned};

use crate::error::ErrorBody;

/// The documented exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    /// The operation failed (a failed scan, a failed deletion, a server error, not found).
    Failed = 1,
    /// The command line or the input is wrong (also a 400 from the gateway).
    Usage = 2,
    /// Refused or blocked: 401, 403, 409, a missing confirmation, a blocked instance.
    Refused = 3,
    /// The gateway or a service behind it cannot be reached (or answers 503).
    Unreachable = 4,
}

/// A failure, printed on stderr, with its exit code.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    pub message: String,
}

impl CliError {
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self { exit, message: message.into() }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

pub type CliResult<T> = Result<T, CliError>;

fn exit_of(status: u16) -> Exit {
    match status {
        400 | 422 => Exit::Usage,
        401 | 403 | 409 => Exit::Refused,
        502..=504 => Exit::Unreachable,
        _ => Exit::Failed,
    }
}

/// The gateway at `url`, with `token`.
#[derive(Debug, Clone)]
pub struct Client {
    url: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Client {
    pub fn new(url: &str, token: Option<String>) -> CliResult<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            .build()
            .map_err(|e| CliError::new(Exit::Failed, format!("cannot set up HTTP: {e}")))?;
        Ok(Self { url: url.trim_end_matches('/').to_string(), token, http })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.url));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> CliResult<reqwest::Response> {
        let response = request.send().await.map_err(|e| {
            CliError::new(Exit::Unreachable, format!("cannot reach the gateway at {}: {e}", self.url))
        })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        let message = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => format!("{} ({status}): {} [request {}]", body.code, body.message, body.request_id),
            Err(_) => {
                format!("the gateway answered {status}: {}", text.chars().take(300).collect::<String>())
            }
        };
        Err(CliError::new(exit_of(status), message))
    }

    async fn json<T: DeserializeOwned>(&self, response: reqwest::Response) -> CliResult<T> {
        let text = response.text().await.map_err(|e| CliError::new(Exit::Unreachable, e.to_string()))?;
        serde_json::from_str(&text)
            .map_err(|e| CliError::new(Exit::Failed, format!("unexpected answer from the gateway: {e}")))
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> CliResult<T> {
        let response = self.send(self.request(reqwest::Method::GET, path)).await?;
        self.json(response).await
    }

    /// Every page of the list at `path` (which has a query string), in one
    /// answer: the gateway's pages followed by their tokens, so no list is
    /// cut at a page, whatever `--max-page-size` the gateway has.
    pub async fn get_all<T: Paged>(&self, path: &str) -> CliResult<T> {
        let mut all: T = self.get(path).await?;
        let mut asked = std::collections::HashSet::new();
        while let Some(token) = all.take_next_page_token() {
            // Pages that do not advance would be followed forever.
            if !asked.insert(token.clone()) {
                return Err(CliError::new(
                    Exit::Failed,
                    format!("{path}: the gateway gave page token {token:?} twice; its pages do not advance"),
                ));
            }
            let next: T = self.get(&format!("{path}&page_token={token}")).await?;
            all.absorb(next);
        }
        Ok(all)
    }

    pub async fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> CliResult<T> {
        let response = self.send(self.request(reqwest::Method::POST, path).json(body)).await?;
        self.json(response).await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> CliResult<T> {
        let response = self.send(self.request(reqwest::Method::DELETE, path)).await?;
        self.json(response).await
    }

    /// Server-sent events of `request`, each `(event, data)` handed to
    /// `each` as it arrives, until the stream ends.
    pub async fn events(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
        mut each: impl FnMut(&str, &str),
    ) -> CliResult<()> {
        let mut request = self.request(method, path).header("accept", "text/event-stream");
        if let Some(body) = body {
            request = request.json(body);
        }
        let mut response = self.send(request).await?;
        let mut pending = String::new();
        loop {
            let chunk = response
                .chunk()
                .await
                .map_err(|e| CliError::new(Exit::Unreachable, format!("the event stream broke: {e}")))?;
            let Some(chunk) = chunk else { break };
            pending.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = pending.find("\n\n") {
                let block: String = pending.drain(..end + 2).collect();
                let field = |name: &str| {
                    block.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim_start().to_string()))
                };
                if let (Some(event), Some(data)) = (field("event:"), field("data:")) {
                    each(&event, &data);
                }
            }
        }
        Ok(())
    }
}

/// A list answer that comes in pages.
pub trait Paged: DeserializeOwned {
    /// The next page's token, taken out (the whole list has none).
    fn take_next_page_token(&mut self) -> Option<String>;
    /// Appends the items of the next page, and takes its token.
    fn absorb(&mut self, next: Self);
}

/// `Paged` for a list type whose pages hold `items` and `next_page_token`,
/// and any other list fields named after it (gathered from every page too).
macro_rules! paged {
    ($list:ty $(, $also:ident)*) => {
        impl Paged for $list {
            fn take_next_page_token(&mut self) -> Option<String> {
                self.next_page_token.take()
            }
            fn absorb(&mut self, next: Self) {
                self.items.extend(next.items);
                $(self.$also.extend(next.$also);)*
                self.next_page_token = next.next_page_token;
            }
        }
    };
}

paged!(crate::api::catalog::JukeboxList, skipped);
paged!(crate::api::catalog::CatalogPage);
paged!(crate::api::instances::InstanceList);
