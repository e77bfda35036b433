//! Which repositories a JukeBox source names (`docs/upstream-vynil.md` §3.2): a `list`, every
//! repository of a Harbor project (REST API v2.0, paginated by
//! `x-total-count`), or of a GitLab project (REST v4, paginated by
//! `X-Total-Pages`, Bearer from the pull secret's password), or of an OCI
//! image layout directory (ours: `crate::layout`).

use reqwest::Method;
use serde::Deserialize;

use crate::{
    Credentials, RegistryClient, RegistryError, RepositoryRef, Result,
    transport::{Request, Response},
};

const HARBOR_PAGE: usize = 10;
const GITLAB_PAGE: usize = 20;
const MAX_PAGES: usize = 10_000;
const MAX_API_BYTES: usize = 8 * 1024 * 1024;

/// A JukeBox source that lists OCI repositories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    List(Vec<String>),
    Harbor {
        registry: String,
        project: String,
    },
    Gitlab {
        url: String,
        registry: String,
        project: String,
    },
    /// Every repository of an OCI image layout directory (`crate::layout`).
    Layout {
        path: String,
    },
}

impl Source {
    /// Whether `repository` is one this source can name: in its list, under
    /// its Harbor or GitLab project, in its layout. What a push event for a
    /// repository decides (which JukeBoxes scan it); read without a request.
    pub fn contains(&self, repository: &RepositoryRef) -> bool {
        let under = |project: &str| {
            let project = project.trim_matches('/');
            repository.repository == project || repository.repository.starts_with(&format!("{project}/"))
        };
        match self {
            // Under any of its names (the rules' repository identity).
            Source::List(images) => images.iter().any(|image| {
                RepositoryRef::parse(image).is_ok_and(|listed| {
                    vynil_rules::repository::same(
                        (&listed.registry, &listed.repository),
                        (&repository.registry, &repository.repository),
                    )
                })
            }),
            Source::Harbor { registry, project } | Source::Gitlab { registry, project, .. } => {
                vynil_rules::repository::host(registry) == vynil_rules::repository::host(&repository.registry)
                    && under(project)
            }
            Source::Layout { path } => {
                repository.registry == format!("{}{path}", crate::layout::LAYOUT_SCHEME)
            }
        }
    }
}

impl Source {
    /// `repository` as this source writes it (its list entry, its Harbor or
    /// GitLab registry's spelling), when the source names it under any of
    /// its names: what a purge plans and keys usage on, whatever alias the
    /// caller wrote (#66 item 3).
    pub fn entry_for(&self, repository: &RepositoryRef) -> Option<RepositoryRef> {
        if !self.contains(repository) {
            return None;
        }
        match self {
            Source::List(images) => {
                images.iter().filter_map(|i| RepositoryRef::parse(i).ok()).find(|listed| {
                    vynil_rules::repository::same(
                        (&listed.registry, &listed.repository),
                        (&repository.registry, &repository.repository),
                    )
                })
            }
            Source::Harbor { registry, .. } | Source::Gitlab { registry, .. } => {
                RepositoryRef::new(registry, &repository.repository).ok()
            }
            Source::Layout { .. } => Some(repository.clone()),
        }
    }
}

impl RegistryClient {
    /// The repositories `source` names, in the order the source gives them.
    pub async fn enumerate(&self, source: &Source) -> Result<Vec<RepositoryRef>> {
        match source {
            Source::List(images) => images.iter().map(|i| RepositoryRef::parse(i)).collect(),
            Source::Harbor { registry, project } => self.harbor(registry, project).await,
            Source::Gitlab { url, registry, project } => self.gitlab(url, registry, project).await,
            Source::Layout { path } => {
                let root = std::path::PathBuf::from(path);
                let names =
                    tokio::task::spawn_blocking(move || crate::layout::repositories(&root)).await.map_err(
                        |e| RegistryError::Layout { what: path.clone(), problem: e.to_string() },
                    )??;
                let registry = format!("{}{path}", crate::layout::LAYOUT_SCHEME);
                names.iter().map(|name| RepositoryRef::new(&registry, name)).collect()
            }
        }
    }

    async fn api_get(
        &self,
        registry: &str,
        what: String,
        url: String,
        authorization: Option<String>,
    ) -> Result<Response> {
        let request = Request {
            kind: "api",
            what: what.clone(),
            registry: registry.to_string(),
            method: Method::GET,
            url,
            accept: &["application/json"],
            token_scope: None,
            authorization,
            max_body: MAX_API_BYTES,
            max_attempts: None,
        };
        let response = self.transport().send(&request).await?;
        if response.status.is_success() {
            return Ok(response);
        }
        let status = response.status.as_u16();
        let (code, message) = response.error_code();
        Err(match status {
            401 | 403 => RegistryError::Unauthorized {
                registry: registry.to_string(),
                what,
                status,
                detail: String::new(),
            },
            404 => RegistryError::NotFound { what, code: "404".into() },
            _ => RegistryError::Registry { what, status, code, message },
        })
    }

    async fn harbor(&self, registry: &str, project: &str) -> Result<Vec<RepositoryRef>> {
        #[derive(Deserialize)]
        struct Repository {
            name: String,
        }
        let base = self.api_base(&self.transport().base_url(registry))?;
        if authority(&base).map(|h| vynil_rules::repository::host(&h))
            != Some(vynil_rules::repository::host(registry))
        {
            return Err(RegistryError::InvalidReference {
                reference: registry.to_string(),
                problem: "a Harbor registry is a host or host:port".into(),
            });
        }
        let authorization = match self.transport().credentials(registry).basic_header() {
            Some(basic) => Some(basic),
            None => self.harbor_anonymous_token(registry, project, &base).await,
        };
        let mut repositories = Vec::new();
        let mut page = 1;
        loop {
            let what = format!("Harbor repositories of {registry}/{project} (page {page})");
            let (number, size) = (page.to_string(), HARBOR_PAGE.to_string());
            let segments = ["api", "v2.0", "projects", project, "repositories"];
            let query = [("page", number.as_str()), ("page_size", &size), ("sort", "name")];
            let url = endpoint(&base, &segments, &query);
            let response =
                self.api_get(registry, what.clone(), url.to_string(), authorization.clone()).await?;
            let items: Vec<Repository> = json(&response, &what)?;
            let total =
                response.header("x-total-count").and_then(|t| t.trim().parse::<usize>().ok()).unwrap_or(0);
            let received = items.len();
            for item in items {
                repositories.push(RepositoryRef::new(registry, &item.name)?);
            }
            let pages = total.div_ceil(HARBOR_PAGE);
            if page >= pages || received == 0 || page >= MAX_PAGES {
                break;
            }
            page += 1;
        }
        Ok(repositories)
    }

    /// Harbor gives anonymous pull tokens for public projects; without one the
    /// API is called without credentials.
    async fn harbor_anonymous_token(&self, registry: &str, project: &str, base: &url::Url) -> Option<String> {
        #[derive(Deserialize)]
        struct Token {
            token: String,
        }
        let scope = format!("repository:{project}/*:pull");
        let url = endpoint(base, &["service", "token"], &[("service", "harbor-registry"), ("scope", &scope)]);
        let what = format!("Harbor anonymous token of {registry}");
        let response = self.api_get(registry, what, url.to_string(), None).await.ok()?;
        let token: Token = serde_json::from_slice(&response.body).ok()?;
        Some(format!("Bearer {}", token.token))
    }

    async fn gitlab(&self, url: &str, registry: &str, project: &str) -> Result<Vec<RepositoryRef>> {
        #[derive(Deserialize)]
        struct Project {
            id: u64,
            path_with_namespace: String,
        }
        #[derive(Deserialize)]
        struct Repository {
            location: String,
        }
        let base = self.api_base(url)?;
        let api_host = authority(&base).unwrap_or_default();
        let token = match self.transport().credentials(registry) {
            Credentials::Basic { password, .. } => password,
            Credentials::Anonymous => {
                return Err(RegistryError::Unauthorized {
                    registry: registry.to_string(),
                    what: format!("GitLab project {project}"),
                    status: 401,
                    detail: ": a GitLab source needs a pull secret (its password is the API token)".into(),
                });
            }
        };
        // Upstream requires the pull secret and uses its password as a
        // Bearer token; sent to the API only on the registry's site.
        if !crate::auth::may_receive_credentials(
            registry,
            &api_host,
            &self.transport().config().credential_hosts,
        ) {
            return Err(RegistryError::Unauthorized {
                registry: registry.to_string(),
                what: format!("GitLab project {project}"),
                status: 401,
                detail: format!(
                    ": the GitLab API {api_host} is not on {registry}'s site, so its credentials are not sent there (allow it with --credential-host {registry}={api_host})"
                ),
            });
        }
        let authorization = Some(format!("Bearer {token}"));
        let search = project.rsplit('/').next().unwrap_or(project);
        let what = format!("GitLab project {project}");
        let search_url = endpoint(&base, &["api", "v4", "projects"], &[("search", search)]);
        let response =
            self.api_get(&api_host, what.clone(), search_url.to_string(), authorization.clone()).await?;
        let projects: Vec<Project> = json(&response, &what)?;
        let id = projects.into_iter().find(|p| p.path_with_namespace == project).map(|p| p.id).ok_or_else(
            || RegistryError::NotFound {
                what: format!("GitLab project {project} (searched {search:?})"),
                code: "PROJECT_UNKNOWN".into(),
            },
        )?;
        let mut repositories = Vec::new();
        let mut page = 1;
        loop {
            let what = format!("GitLab registry repositories of {project} (page {page})");
            let (id, per_page, number) = (id.to_string(), GITLAB_PAGE.to_string(), page.to_string());
            let segments = ["api", "v4", "projects", &id, "registry", "repositories"];
            let url = endpoint(&base, &segments, &[("per_page", &per_page), ("page", &number)]);
            let response =
                self.api_get(&api_host, what.clone(), url.to_string(), authorization.clone()).await?;
            let items: Vec<Repository> = json(&response, &what)?;
            let pages =
                response.header("x-total-pages").and_then(|t| t.trim().parse::<usize>().ok()).unwrap_or(1);
            let received = items.len();
            for item in items {
                repositories.push(RepositoryRef::parse(&item.location)?);
            }
            if page >= pages || received == 0 || page >= MAX_PAGES {
                break;
            }
            page += 1;
        }
        Ok(repositories)
    }

    /// A REST API base URL, parsed once: every request is built from it and
    /// the credential check reads its host and port ([`authority`]), never
    /// the written text. Refused: user information, a query, a fragment, a
    /// backslash (a URL written to read as one host and reach another);
    /// plain http only for hosts declared insecure.
    fn api_base(&self, url: &str) -> Result<url::Url> {
        let parsed = parse_api_base(url)?;
        let host = authority(&parsed).unwrap_or_default();
        match parsed.scheme() {
            "https" => Ok(parsed),
            "http" if self.transport().base_url(&host).starts_with("http://") => Ok(parsed),
            "http" => Err(RegistryError::InsecureRefused { registry: host }),
            _ => Err(RegistryError::InvalidReference {
                reference: url.to_string(),
                problem: "only http(s) URLs are supported".into(),
            }),
        }
    }
}

/// [`RegistryClient::api_base`]'s parse: no user information, query,
/// fragment or backslash, a host.
fn parse_api_base(url: &str) -> Result<url::Url> {
    let invalid = |problem: &str| RegistryError::InvalidReference {
        reference: url.to_string(),
        problem: problem.to_string(),
    };
    let parsed = url::Url::parse(url.trim_end_matches('/')).map_err(|_| invalid("not a URL"))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(invalid(
            "an API base URL holds no user information: credentials come from the pull secret",
        ));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() || url.contains('\\') {
        return Err(invalid("an API base URL holds no query, fragment or backslash"));
    }
    authority(&parsed).ok_or_else(|| invalid("names no host"))?;
    Ok(parsed)
}

/// The `host[:port]` a parsed URL reaches, as the credential check compares it.
pub(crate) fn authority(url: &url::Url) -> Option<String> {
    let host = url.host_str()?;
    Some(match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    })
}

/// `base` with `segments` appended to its path and `query` set: a request
/// URL that reaches exactly `base`'s host.
fn endpoint(base: &url::Url, segments: &[&str], query: &[(&str, &str)]) -> url::Url {
    let mut url = base.clone();
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty().extend(segments);
    }
    if !query.is_empty() {
        url.query_pairs_mut().extend_pairs(query);
    }
    url
}

fn json<T: serde::de::DeserializeOwned>(response: &Response, what: &str) -> Result<T> {
    serde_json::from_slice(&response.body).map_err(|e| RegistryError::InvalidBody {
        what: what.to_string(),
        problem: format!("unexpected JSON: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Issue #66 item 2: over URL spellings an attacker may write
        /// (percent-encoding, IPv4 integers, backslashes, `#`, `?`, `@`,
        /// trailing dots, IDNA), the host the credential check reads is the
        /// host every request built from the base reaches (as the HTTP
        /// client parses it again).
        #[test]
        fn the_host_checked_is_the_host_contacted(
            scheme in proptest::sample::select(vec!["http", "https"]),
            host in proptest::sample::select(vec![
                "registry.corp.example", "REGISTRY.corp.example.", "2130706433", "127.0.0.1", "0x7f.1",
                "evil%2Eexample", "bücher.example", "xn--bcher-kva.example", "[::1]", "registry.corp.example@evil.example",
            ]),
            port in proptest::option::of(1u16..),
            decoration in proptest::sample::select(vec![
                "", "/", "/gitlab", "?.registry.corp.example", "#.registry.corp.example", "\\.registry.corp.example",
                "/..%2F..%2Fevil", "/%2e%2e/x", "@registry.corp.example",
            ]),
        ) {
            let port = port.map(|p| format!(":{p}")).unwrap_or_default();
            let written = format!("{scheme}://{host}{port}{decoration}");
            if let Ok(base) = parse_api_base(&written) {
                let checked = authority(&base);
                for url in [
                    endpoint(&base, &["api", "v4", "projects"], &[("search", "x?y#z")]),
                    endpoint(&base, &["api", "v2.0", "projects", "../..", "repositories"], &[("page", "1")]),
                ] {
                    let contacted = url::Url::parse(url.as_str()).ok().and_then(|u| authority(&u));
                    proptest::prop_assert_eq!(&contacted, &checked, "{} built {}", written, url);
                }
            }
        }
    }

    fn repo(image: &str) -> RepositoryRef {
        RepositoryRef::parse(image).unwrap()
    }

    #[test]
    fn a_source_contains_its_listed_repositories_and_those_under_its_project() {
        let list = Source::List(vec!["r.example:5000/apps/web".into()]);
        assert!(list.contains(&repo("r.example:5000/apps/web")));
        assert!(!list.contains(&repo("r.example:5000/apps/webby")));
        assert!(!list.contains(&repo("other.example/apps/web")), "same path, another registry");
        let harbor = Source::Harbor { registry: "h.example".into(), project: "team".into() };
        assert!(harbor.contains(&repo("h.example/team/app")));
        assert!(!harbor.contains(&repo("h.example/teammate/app")), "a prefix is not a project");
        assert!(!harbor.contains(&repo("x.example/team/app")));
        let gitlab = Source::Gitlab {
            url: "https://g".into(),
            registry: "g.example".into(),
            project: "grp/proj".into(),
        };
        assert!(gitlab.contains(&repo("g.example/grp/proj")));
        assert!(gitlab.contains(&repo("g.example/grp/proj/image")));
        assert!(!gitlab.contains(&repo("g.example/grp/project")));
    }
}
