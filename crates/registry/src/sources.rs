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
            Source::Harbor { registry, project } => registry == &repository.registry && under(project),
            Source::Gitlab { registry, project, .. } => registry == &repository.registry && under(project),
            Source::Layout { path } => {
                repository.registry == format!("{}{path}", crate::layout::LAYOUT_SCHEME)
            }
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
        let base = self.transport().base_url(registry);
        let authorization = match self.transport().credentials(registry).basic_header() {
            Some(basic) => Some(basic),
            None => self.harbor_anonymous_token(registry, project, &base).await,
        };
        let mut repositories = Vec::new();
        let mut page = 1;
        loop {
            let what = format!("Harbor repositories of {registry}/{project} (page {page})");
            let url = format!(
                "{base}/api/v2.0/projects/{project}/repositories?page={page}&page_size={HARBOR_PAGE}&sort=name"
            );
            let response = self.api_get(registry, what.clone(), url, authorization.clone()).await?;
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
    async fn harbor_anonymous_token(&self, registry: &str, project: &str, base: &str) -> Option<String> {
        #[derive(Deserialize)]
        struct Token {
            token: String,
        }
        let url = format!("{base}/service/token?service=harbor-registry&scope=repository:{project}/*:pull");
        let response =
            self.api_get(registry, format!("Harbor anonymous token of {registry}"), url, None).await.ok()?;
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
        let api_host =
            base.split("://").nth(1).unwrap_or_default().split('/').next().unwrap_or_default().to_string();
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
        let mut search_url = url::Url::parse(&format!("{base}/api/v4/projects")).map_err(|_| {
            RegistryError::InvalidReference { reference: url.to_string(), problem: "not a URL".into() }
        })?;
        search_url.query_pairs_mut().append_pair("search", search);
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
            let url = format!(
                "{base}/api/v4/projects/{id}/registry/repositories?per_page={GITLAB_PAGE}&page={page}"
            );
            let response = self.api_get(&api_host, what.clone(), url, authorization.clone()).await?;
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

    /// A REST API base URL; plain http only for hosts declared insecure.
    fn api_base(&self, url: &str) -> Result<String> {
        let trimmed = url.trim_end_matches('/');
        let parsed = url::Url::parse(trimmed).map_err(|_| RegistryError::InvalidReference {
            reference: url.to_string(),
            problem: "not a URL".into(),
        })?;
        let host = match parsed.port() {
            Some(port) => format!("{}:{port}", parsed.host_str().unwrap_or_default()),
            None => parsed.host_str().unwrap_or_default().to_string(),
        };
        match parsed.scheme() {
            "https" => Ok(trimmed.to_string()),
            "http" if self.transport().base_url(&host).starts_with("http://") => Ok(trimmed.to_string()),
            "http" => Err(RegistryError::InsecureRefused { registry: host }),
            _ => Err(RegistryError::InvalidReference {
                reference: url.to_string(),
                problem: "only http(s) URLs are supported".into(),
            }),
        }
    }
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
