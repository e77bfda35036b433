//! Lifecycle's view of the catalog: `ResolveInstall` and `ResolveCleanup`
//! (the rules crate's one selection, never a second copy here) and the tags
//! of a package for `initFrom.version`. An unreachable catalog is an error to retry, never
//! "package missing".

use tonic::transport::Endpoint;
use vynil_proto::catalog::v1::{
    self as pb, GetCatalogRequest, GetCatalogResponse, RecordedCheck as ProtoCheck,
    RecordedRevision as ProtoRecorded, ResolveCleanupRequest, ResolveInstallRequest,
    catalog_client::CatalogClient, resolve_cleanup_response::Decision, resolve_install_response::Outcome,
};
use vynil_proto::convert::{package_from_proto, proto_type, signature_from_proto, verify_mode_from_proto};
use vynil_rules::{Tag, selection::RecordedCheck};
use vynil_runtime::{TracedChannel, traced};

use crate::{
    LifecycleError,
    install_plan::{HeldBack, Resolution, RunningRecalled},
    instance::Instance,
};

#[derive(Debug, Clone)]
pub struct Catalog {
    client: CatalogClient<TracedChannel>,
    /// For `WatchCatalog`: no request timeout (the stream lasts).
    watcher: CatalogClient<TracedChannel>,
}

impl Catalog {
    /// A lazily connected client of the catalog at `endpoint`.
    pub fn connect(endpoint: &str) -> Result<Self, LifecycleError> {
        let channel = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| LifecycleError::Config(format!("--catalog-endpoint {endpoint:?}: {e}")))?
            .connect_timeout(std::time::Duration::from_secs(5));
        let watcher = CatalogClient::new(traced(channel.connect_lazy()));
        let channel = channel.timeout(std::time::Duration::from_secs(30)).connect_lazy();
        Ok(Self { client: CatalogClient::new(traced(channel)), watcher })
    }

    /// A `WatchCatalog` subscription to every JukeBox.
    pub async fn watch(&self) -> Result<tonic::Streaming<pb::CatalogChange>, LifecycleError> {
        let request = pb::WatchCatalogRequest::default();
        Ok(self.watcher.clone().watch_catalog(request).await.map_err(unavailable)?.into_inner())
    }

    /// The revision `instance` installs now, per the catalog, never one of
    /// `quarantined`; `hold_at`: exactly that tag (a rollback's).
    pub async fn resolve(
        &self,
        instance: &Instance,
        quarantined: &[String],
        hold_at: Option<&str>,
    ) -> Result<Answer, LifecycleError> {
        let request = ResolveInstallRequest {
            jukebox: instance.jukebox.clone(),
            category: instance.category.clone(),
            name: instance.package.clone(),
            r#type: proto_type(instance.kind.package_type()),
            installed_tag: hold_at.or(instance.installed_tag()).unwrap_or_default().to_string(),
            hold_upgrades: instance.hold_upgrades || hold_at.is_some(),
            quarantined_tags: quarantined.to_vec(),
            minimum_age: instance
                .upgrade_policy
                .as_ref()
                .and_then(|p| p.minimum_age.clone())
                .unwrap_or_default(),
        };
        let response = self.client.clone().resolve_install(request).await.map_err(unavailable)?.into_inner();
        let pull_secret = Some(response.pull_secret).filter(|s| !s.is_empty());
        let policy = response.upgrade_policy.map(policy_from_proto);
        let held_back = HeldBack {
            newer: response.withheld.into_iter().map(|w| w.description).collect(),
            recalls: response.recalled.into_iter().map(|w| (w.tag, w.description)).collect(),
            recalled: response.running_recalled.map(|recall| RunningRecalled {
                description: recall.description,
                move_away: recall.move_away,
                to: Some(response.move_away_to).filter(|t| !t.is_empty()),
            }),
            verify: verify_mode_from_proto(response.verify_mode),
        };
        let resolution = match response.outcome {
            Some(Outcome::Package(package)) => {
                let package = package_from_proto(&package).map_err(unavailable)?;
                Resolution::Package { package: Box::new(package), pull_secret }
            }
            Some(Outcome::NoMatch(no_match)) if no_match.excluded_by == "jukebox" => {
                Resolution::JukeboxMissing
            }
            Some(Outcome::NoMatch(no_match)) => {
                Resolution::NoMatch { excluded_by: no_match.excluded_by, reason: no_match.reason }
            }
            None => {
                return Err(LifecycleError::Unavailable(
                    "the catalog answered ResolveInstall with no outcome".into(),
                ));
            }
        };
        Ok(Answer { resolution, jukebox_policy: policy, held_back })
    }

    async fn revisions(&self, instance: &Instance, typed: bool) -> Result<Vec<pb::Package>, LifecycleError> {
        Ok(self.listing(instance, typed).await?.packages)
    }

    /// The catalog's answer for the instance's package (`typed`: of its
    /// type only); empty when the JukeBox is not in the catalog.
    async fn listing(&self, instance: &Instance, typed: bool) -> Result<GetCatalogResponse, LifecycleError> {
        let request = GetCatalogRequest {
            jukebox: instance.jukebox.clone(),
            category: instance.category.clone(),
            name: instance.package.clone(),
            r#type: if typed { proto_type(instance.kind.package_type()) } else { 0 },
            ..GetCatalogRequest::default()
        };
        match self.client.clone().get_catalog(request).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(GetCatalogResponse::default()),
            Err(status) => Err(unavailable(status)),
        }
    }

    /// The repositories where the catalog lists the instance's package (any
    /// type), and the JukeBox's pull secret: the only registry a recorded
    /// revision may be checked at, with the only credentials it may use.
    pub async fn own_repositories(
        &self,
        instance: &Instance,
    ) -> Result<(Vec<(String, String)>, Option<String>), LifecycleError> {
        let listing = self.listing(instance, false).await?;
        let mut repositories: Vec<(String, String)> =
            listing.packages.into_iter().map(|p| (p.registry, p.image)).collect();
        repositories.sort();
        repositories.dedup();
        Ok((repositories, Some(listing.pull_secret).filter(|s| !s.is_empty())))
    }

    /// The newest revision of the instance's package and type in the catalog.
    pub async fn latest_tag(&self, instance: &Instance) -> Result<Option<String>, LifecycleError> {
        let revisions = self.revisions(instance, true).await?;
        Ok(revisions.into_iter().filter_map(|p| Tag::parse(&p.tag)).max().map(|t| t.to_string()))
    }

    /// Where the instance's package lives (any type: a revision installed
    /// before a type change is in the same repository).
    pub async fn repository_of(
        &self,
        instance: &Instance,
    ) -> Result<Option<(String, String)>, LifecycleError> {
        let revisions = self.revisions(instance, false).await?;
        Ok(revisions.into_iter().next().map(|p| (p.registry, p.image)))
    }
}

/// The catalog's `ResolveInstall` answer.
#[derive(Debug, Default)]
pub struct Answer {
    pub resolution: Resolution,
    pub jukebox_policy: Option<vynil_crds::UpgradePolicy>,
    pub held_back: HeldBack,
}

/// A JukeBox's upgrade policy as the catalog answered it.
fn policy_from_proto(policy: pb::UpgradePolicy) -> vynil_crds::UpgradePolicy {
    vynil_crds::UpgradePolicy {
        windows: policy
            .windows
            .into_iter()
            .map(|w| vynil_crds::MaintenanceWindow {
                schedule: w.schedule,
                zone: w.zone,
                duration: w.duration,
            })
            .collect(),
        freezes: policy
            .freezes
            .into_iter()
            .map(|f| vynil_crds::UpgradeFreeze { from: f.from, until: f.until, reason: f.reason })
            .collect(),
        approval: policy.manual_approval.then_some(vynil_crds::ApprovalMode::Manual),
        minimum_age: Some(policy.minimum_age).filter(|a| !a.is_empty()),
        waves: policy
            .waves
            .into_iter()
            .map(|w| vynil_crds::UpgradeWave {
                name: w.name,
                selector: w.selector.into_iter().collect(),
                soak: w.soak,
                namespaces: w.namespaces.into_iter().collect(),
                patience: Some(w.patience).filter(|p| !p.is_empty()),
            })
            .collect(),
    }
}

/// What the catalog decided for a deletion.
#[derive(Debug, Clone, PartialEq)]
pub enum Cleanup {
    /// Run the delete hooks of this revision (only its location when it is
    /// the recorded one, the whole package when it comes from the catalog).
    UsePackage {
        package: Box<pb::Package>,
        pull_secret: Option<String>,
        /// Under a signature policy, the revision is not verified: why, in words.
        unverified: Option<String>,
    },
    Gone {
        code: String,
        message: String,
    },
    WithoutPackage {
        warning: String,
    },
    NothingToDelete,
}

impl Catalog {
    /// `ResolveCleanup` for `instance`, with the recorded revision's check
    /// (`None` when nothing is recorded) and whether an admin's confirmed
    /// delete without package holds. An outage is an error to retry.
    pub async fn resolve_cleanup(
        &self,
        instance: &Instance,
        check: Option<RecordedCheck>,
        has_children: bool,
        confirmed: bool,
    ) -> Result<Cleanup, LifecycleError> {
        let checked = check.is_some();
        let recorded = instance.status.package.as_ref().map(|p| ProtoRecorded {
            registry: p.registry.clone(),
            image: p.image.clone(),
            tag: p.tag.clone(),
            digest: p.digest.clone().unwrap_or_default(),
            r#type: vynil_rules::PackageType::ALL
                .into_iter()
                .find(|t| t.as_str() == p.package_type)
                .map_or(0, proto_type),
        });
        let (recorded_check, recorded_check_problem) = match check {
            None => (ProtoCheck::Unspecified, String::new()),
            Some(RecordedCheck::Resolves) => (ProtoCheck::Resolves, String::new()),
            Some(RecordedCheck::Gone) => (ProtoCheck::Gone, String::new()),
            Some(RecordedCheck::Unknown(why)) => (ProtoCheck::Unknown, why),
        };
        let request = ResolveCleanupRequest {
            jukebox: instance.jukebox.clone(),
            category: instance.category.clone(),
            name: instance.package.clone(),
            r#type: proto_type(instance.kind.package_type()),
            installed_tag: instance.status.tag.clone().unwrap_or_default(),
            recorded: recorded.filter(|_| checked),
            delete_without_package_allowed: confirmed,
            recorded_check: recorded_check as i32,
            recorded_check_problem,
            children: u32::from(has_children),
            listed_before: instance.listed_before.clone(),
        };
        let response = self.client.clone().resolve_cleanup(request).await.map_err(unavailable)?.into_inner();
        let pull_secret = Some(response.pull_secret).filter(|s| !s.is_empty());
        let policy = verify_mode_from_proto(response.verify_mode);
        Ok(match response.decision {
            Some(Decision::UsePackage(package)) => {
                let verdict = package.signature.as_ref().and_then(signature_from_proto);
                let unverified = policy.and_then(|_| match verdict {
                    Some(verdict) if verdict.is_verified() => None,
                    Some(verdict) => Some(verdict.describe()),
                    None => Some("its signature was not checked (the catalog does not list it)".to_string()),
                });
                Cleanup::UsePackage { package: Box::new(package), pull_secret, unverified }
            }
            Some(Decision::Gone(gone)) => Cleanup::Gone { code: gone.code, message: gone.message },
            Some(Decision::DeleteWithoutPackage(d)) => Cleanup::WithoutPackage { warning: d.warning },
            Some(Decision::NothingToDelete(_)) => Cleanup::NothingToDelete,
            None => {
                return Err(LifecycleError::Unavailable(
                    "the catalog answered ResolveCleanup with no decision".into(),
                ));
            }
        })
    }
}

fn unavailable(status: tonic::Status) -> LifecycleError {
    LifecycleError::Unavailable(format!("catalog: {:?}: {}", status.code(), status.message()))
}
