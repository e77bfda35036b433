//! Kubernetes users, in a cluster (`--kubernetes-auth`): a bearer token the
//! tokens file does not know is reviewed by the API server (TokenReview),
//! and each call is authorised by a SubjectAccessReview for what the route
//! does, so cluster RBAC decides. The verbs, per route:
//!
//! | route | verb | resource |
//! |---|---|---|
//! | catalogs, scans, plans and reports (reads) | `get` (`list` without a JukeBox name) | `jukeboxes.vynil.solidite.fr` |
//! | start a scan | `patch` (what the force-scan annotation needs) | that JukeBox |
//! | make a purge plan | `list` | `jukeboxes.vynil.solidite.fr` |
//! | execute a purge | `purge` (a dedicated verb) | `jukeboxes.vynil.solidite.fr` |
//! | allow a delete without package | `delete-without-package` (a dedicated verb) | `jukeboxes.vynil.solidite.fr` |
//! | list instances | `list` | `tenantinstances`, `serviceinstances`, `systeminstances` (the kind asked, in the namespace asked) |
//! | explain an instance | `get` | that instance |
//! | whoami, version | any authenticated user | |
//!
//! A dedicated verb is granted with an RBAC rule like
//! `{apiGroups: [vynil.solidite.fr], resources: [jukeboxes], verbs: [purge]}`.
//! Token reviews are cached for a minute (by the token's hash), so a
//! browser's calls do not each cost an API request: users and refused
//! tokens apart, so a flood of made-up tokens (each refused, each cached
//! in a bounded list whose oldest goes first) never takes the place of a
//! real user's review. A review that is not cached is also counted against
//! the address it comes from (`--kubernetes-reviews-per-minute`; the TCP
//! peer, or with `--trust-forwarded-for` the address the proxy in front
//! appended to `X-Forwarded-For`): beyond it the caller is answered 429
//! `RATE_LIMITED` with `Retry-After` and the API server is not asked, so one
//! client cannot make the gateway flood the API server, and callers whose
//! reviews are cached (every signed-in user) never feel it. An API server
//! that cannot be asked answers 503: unknown is not "denied".

use std::{
    collections::{HashMap, VecDeque},
    net::IpAddr,
    num::NonZeroU32,
    sync::Mutex,
    time::{Duration, Instant},
};

use governor::{DefaultKeyedRateLimiter, Quota, clock::Clock as _};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::api::{Api, PostParams};

use crate::error::ApiError;

pub const GROUP: &str = "vynil.solidite.fr";
/// Users remembered at most (expired ones make room).
const CACHE_MAX: usize = 4096;
/// Refused tokens remembered at most (the oldest goes first).
const REFUSED_MAX: usize = 4096;
/// Source addresses whose review budget is tracked before idle ones are dropped.
const ADDRESSES_MAX: usize = 4096;

/// Who TokenReview says a token is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeUser {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
}

/// Token reviews by the token's hash: users, and tokens the API server
/// did not authenticate, each with when.
struct Reviewed {
    /// How long an answer holds: a session's user is reviewed again after it.
    cache_for: Duration,
    users: HashMap<[u8; 32], (Instant, KubeUser)>,
    refused: HashMap<[u8; 32], Instant>,
    refused_order: VecDeque<[u8; 32]>,
}

impl Reviewed {
    fn new(cache_for: Duration) -> Self {
        Self { cache_for, users: HashMap::new(), refused: HashMap::new(), refused_order: VecDeque::new() }
    }

    /// The cached answer for `key`: `Some(None)` for a refused token.
    fn get(&self, key: &[u8; 32]) -> Option<Option<KubeUser>> {
        if let Some((at, user)) = self.users.get(key)
            && at.elapsed() < self.cache_for
        {
            return Some(Some(user.clone()));
        }
        self.refused.get(key).filter(|at| at.elapsed() < self.cache_for).map(|_| None)
    }

    fn put(&mut self, key: [u8; 32], user: Option<KubeUser>) {
        match user {
            Some(user) => {
                if self.users.len() >= CACHE_MAX {
                    let cache_for = self.cache_for;
                    self.users.retain(|_, (at, _)| at.elapsed() < cache_for);
                }
                if self.users.len() < CACHE_MAX {
                    self.users.insert(key, (Instant::now(), user));
                }
            }
            None => {
                if self.refused.insert(key, Instant::now()).is_none() {
                    self.refused_order.push_back(key);
                }
                while self.refused_order.len() > REFUSED_MAX {
                    if let Some(old) = self.refused_order.pop_front() {
                        self.refused.remove(&old);
                    }
                }
            }
        }
    }
}

/// Who pays for a review the cache does not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payer {
    /// A bearer token as sent: the address it came from (perhaps a guess).
    Address(Option<IpAddr>),
    /// The token a session cookie this gateway signed holds, reviewed again
    /// as its review expires: no guess, so no address's budget (many users
    /// behind one proxy share an address).
    Session,
}

/// How long an access review's answer is reused for the same user and
/// check: a page's burst of calls costs the API server one review.
const ACCESS_CACHE: Duration = Duration::from_secs(5);
/// Access answers kept at most; past it they are all forgotten.
const ACCESS_MAX: usize = 10_000;

/// An access review's answer (`Err` holds the reason refused) and when.
type Answered = (Instant, Result<(), String>);

pub struct KubeAuth {
    client: kube::Client,
    reviewed: Mutex<Reviewed>,
    /// Access answers per (user, check), for [`ACCESS_CACHE`].
    answered: Mutex<HashMap<(String, String), Answered>>,
    /// Reviews not answered from the cache, per source address.
    budget: DefaultKeyedRateLimiter<Option<IpAddr>>,
    per_minute: NonZeroU32,
}

impl std::fmt::Debug for KubeAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeAuth").finish_non_exhaustive()
    }
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    ApiError::unavailable("the Kubernetes API (token and access reviews)", e)
}

impl KubeAuth {
    /// Reviews through `client`, each answer held `cache_for`; a source
    /// address may cause `per_minute` reviews the cache does not answer.
    pub fn new(client: kube::Client, cache_for: Duration, per_minute: u32) -> Self {
        let per_minute = NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN);
        Self {
            client,
            reviewed: Mutex::new(Reviewed::new(cache_for)),
            answered: Mutex::default(),
            budget: DefaultKeyedRateLimiter::keyed(Quota::per_minute(per_minute)),
            per_minute,
        }
    }

    /// The user of `token`, `None` when the API server does not authenticate
    /// it; a review not cached is counted against `payer`'s budget.
    pub async fn review_token(&self, token: &str, payer: Payer) -> Result<Option<KubeUser>, ApiError> {
        let key = super::token_hash(token);
        if let Some(cached) = self.reviewed.lock().ok().and_then(|cache| cache.get(&key)) {
            return Ok(cached);
        }
        if let Payer::Address(from) = payer {
            self.spend(from)?;
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_string(), ..Default::default() },
            ..Default::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(unavailable)?;
        let status = answer.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => Some(KubeUser {
                username: user.username.unwrap_or_default(),
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
            }),
            _ => None,
        };
        if let Ok(mut cache) = self.reviewed.lock() {
            cache.put(key, user.clone());
        }
        Ok(user)
    }

    /// One review from `from`, or 429 once its budget is spent.
    fn spend(&self, from: Option<IpAddr>) -> Result<(), ApiError> {
        if self.budget.len() > ADDRESSES_MAX {
            self.budget.retain_recent();
        }
        // An IPv6 host holds a whole /64: one budget for it, not one per address.
        let from = from.map(crate::connections::peer_key);
        self.budget.check_key(&from).map_err(|not_until| {
            let wait = not_until.wait_time_from(self.budget.clock().now());
            let from = from.map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
            ApiError::rate_limited(
                format!(
                    "{from} asked for more than {} token reviews a minute \
                     (--kubernetes-reviews-per-minute): use a token this gateway knows, or retry later",
                    self.per_minute
                ),
                wait,
            )
        })
    }

    /// Whether `user` may do `check`; `Err(403)` naming it when not. The
    /// answer is reused for [`ACCESS_CACHE`].
    pub async fn authorize(&self, user: &KubeUser, check: &Check) -> Result<(), ApiError> {
        let key = (format!("{}\0{}\0{}", user.username, user.uid, user.groups.join(",")), check.to_string());
        let cached = self.answered.lock().ok().and_then(|answered| {
            answered.get(&key).filter(|(at, _)| at.elapsed() < ACCESS_CACHE).map(|(_, answer)| answer.clone())
        });
        let answer = match cached {
            Some(answer) => answer,
            None => {
                let answer = self.review_access(user, check).await?;
                if let Ok(mut answered) = self.answered.lock() {
                    if answered.len() >= ACCESS_MAX {
                        answered.clear();
                    }
                    answered.insert(key, (Instant::now(), answer.clone()));
                }
                answer
            }
        };
        answer.map_err(|reason| ApiError::forbidden(format!("{} may not {check} ({reason})", user.username)))
    }

    /// A SubjectAccessReview of `check` for `user`: `Err(reason)` when refused.
    async fn review_access(&self, user: &KubeUser, check: &Check) -> Result<Result<(), String>, ApiError> {
        let attributes = ResourceAttributes {
            verb: Some(check.verb.to_string()),
            group: Some(GROUP.into()),
            resource: Some(check.resource.to_string()),
            namespace: check.namespace.clone(),
            name: check.name.clone(),
            ..Default::default()
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(user.groups.clone()),
                resource_attributes: Some(attributes),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(unavailable)?;
        let status = answer.status.unwrap_or_default();
        if status.allowed {
            return Ok(Ok(()));
        }
        Ok(Err(status.reason.filter(|r| !r.is_empty()).unwrap_or_else(|| "no RBAC rule allows it".into())))
    }
}

/// One access a route needs, as a SubjectAccessReview asks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub verb: &'static str,
    pub resource: &'static str,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}.{GROUP}", self.verb, self.resource)?;
        if let Some(name) = &self.name {
            write!(f, " {name}")?;
        }
        if let Some(namespace) = &self.namespace {
            write!(f, " in namespace {namespace}")?;
        }
        Ok(())
    }
}

/// What a route asks of Kubernetes RBAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeRule {
    /// Any authenticated user.
    Authenticated,
    /// `verb` on `jukeboxes`, on the JukeBox the path names when it names one.
    Jukeboxes(&'static str),
    /// `verb` on the instance kinds the query asks (all three without `kind`).
    Instances(&'static str),
    /// `verb` on the instance the path names.
    Instance(&'static str),
}

fn instance_resource(kind: &str) -> Option<&'static str> {
    match kind {
        "tenant" => Some("tenantinstances"),
        "service" => Some("serviceinstances"),
        "system" => Some("systeminstances"),
        _ => None,
    }
}

impl KubeRule {
    /// The checks for a request with these path parameters and query.
    pub fn checks(self, path: &HashMap<String, String>, query: &HashMap<String, String>) -> Vec<Check> {
        let param = |name: &str| path.get(name).cloned();
        match self {
            KubeRule::Authenticated => Vec::new(),
            KubeRule::Jukeboxes(verb) => {
                let name = param("jukebox");
                let verb = if verb == "get" && name.is_none() { "list" } else { verb };
                vec![Check { verb, resource: "jukeboxes", namespace: None, name }]
            }
            KubeRule::Instances(verb) => {
                let namespace = query.get("namespace").cloned().filter(|n| !n.is_empty());
                let kinds: Vec<&'static str> = match query.get("kind").map(String::as_str) {
                    Some(kind) => instance_resource(kind).into_iter().collect(),
                    None => vec!["tenantinstances", "serviceinstances", "systeminstances"],
                };
                kinds
                    .into_iter()
                    .map(|resource| Check { verb, resource, namespace: namespace.clone(), name: None })
                    .collect()
            }
            KubeRule::Instance(verb) => match param("kind").as_deref().and_then(instance_resource) {
                Some(resource) => {
                    vec![Check { verb, resource, namespace: param("namespace"), name: param("name") }]
                }
                // A bad kind is the handler's 400; nothing to ask RBAC.
                None => Vec::new(),
            },
        }
    }
}
