//! `vynil-lifecycle takeover`: what upstream's operator ran, recorded once
//! for this control plane (`docs/migration.md`).
//!
//! Upstream runs the agent at its own package's version (`AGENT_IMAGE` in the
//! env of its `vynil-controller` Deployment) and scans for that framework
//! version; our defaults are this release's. Taking over with our defaults
//! would silently run another agent and offer other revisions. So the
//! migration step reads that Deployment once and writes `AGENT_IMAGE` and the
//! framework version (`VYNIL_VERSION`, the agent image's tag) into the
//! ConfigMap `vynil-config`, which every Deployment of `deploy/` loads as
//! environment (scanner, catalog and lifecycle then agree). An explicit flag
//! wins. A value already recorded is never derived again, so deleting
//! upstream's Deployment later changes nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube::{Api, Client, api::PostParams};

use crate::LifecycleError;

/// The ConfigMap every Deployment of `deploy/` loads as environment.
pub const CONFIG_MAP: &str = "vynil-config";
/// Upstream's operator Deployment (`box/vynil/systems/controller.yaml.hbs`).
pub const UPSTREAM_CONTROLLER: &str = "vynil-controller";

/// Flags of `vynil-lifecycle takeover`.
#[derive(Debug, Clone, clap::Args)]
pub struct TakeoverArgs {
    /// The control plane's namespace (upstream's and ours).
    #[arg(long, env = "VYNIL_NAMESPACE", default_value = "vynil-system")]
    pub namespace: String,
    /// Record this agent image instead of the one upstream's operator ran.
    #[arg(long = "agent-image")]
    pub agent_image: Option<String>,
    /// Record this framework version instead of the agent image's tag.
    #[arg(long = "vynil-version")]
    pub vynil_version: Option<semver::Version>,
}

/// What the step found and recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Already in the ConfigMap: kept as it is.
    Kept(BTreeMap<String, String>),
    /// Written now, from upstream's Deployment or the flags.
    Written { values: BTreeMap<String, String>, source: String },
    /// No upstream operator and no flag: our defaults apply, nothing written.
    Nothing,
}

impl std::fmt::Display for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |values: &BTreeMap<String, String>| {
            values.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
        };
        match self {
            Recorded::Kept(values) => {
                write!(f, "already recorded in ConfigMap {CONFIG_MAP}, kept: {}", list(values))
            }
            Recorded::Written { values, source } => {
                write!(f, "recorded in ConfigMap {CONFIG_MAP} from {source}: {}", list(values))
            }
            Recorded::Nothing => write!(
                f,
                "no Deployment {UPSTREAM_CONTROLLER} with AGENT_IMAGE and no flag: nothing recorded, this release's defaults apply"
            ),
        }
    }
}

/// The framework version an agent image runs: its tag, as SemVer (`v` allowed).
pub fn version_of(image: &str) -> Option<semver::Version> {
    let (_, tag) = image.rsplit_once(':').filter(|(_, tag)| !tag.contains('/'))?;
    semver::Version::parse(tag.strip_prefix('v').unwrap_or(tag)).ok()
}

fn agent_image_of(deployment: &Deployment) -> Option<String> {
    let spec = deployment.spec.template.spec.as_ref()?;
    spec.containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == "AGENT_IMAGE")?
        .value
        .clone()
}

/// Records, once, the agent image and framework version (see the module doc).
pub async fn record(client: &Client, args: &TakeoverArgs) -> Result<Recorded, LifecycleError> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
    let existing =
        maps.get_opt(CONFIG_MAP).await.map_err(LifecycleError::kube("reading the ConfigMap vynil-config"))?;
    let recorded = existing.as_ref().and_then(|m| m.data.clone()).unwrap_or_default();
    if recorded.contains_key("AGENT_IMAGE") {
        return Ok(Recorded::Kept(recorded));
    }
    let (image, source) = match &args.agent_image {
        Some(image) => (Some(image.clone()), "--agent-image".to_string()),
        None => {
            let deployments: Api<Deployment> = Api::namespaced(client.clone(), &args.namespace);
            let upstream = deployments
                .get_opt(UPSTREAM_CONTROLLER)
                .await
                .map_err(LifecycleError::kube("reading upstream's Deployment"))?;
            let source = format!("Deployment {}/{UPSTREAM_CONTROLLER}", args.namespace);
            (upstream.as_ref().and_then(agent_image_of), source)
        }
    };
    let Some(image) = image else {
        return Ok(Recorded::Nothing);
    };
    let version = args.vynil_version.clone().or_else(|| version_of(&image)).ok_or_else(|| {
        LifecycleError::Invalid(format!(
            "the agent image {image} has no SemVer tag to take the framework version from: pass --vynil-version"
        ))
    })?;
    let mut values = recorded;
    values.insert("AGENT_IMAGE".into(), image);
    values.insert("VYNIL_VERSION".into(), version.to_string());
    let mut map = existing.unwrap_or_default();
    map.metadata.name = Some(CONFIG_MAP.into());
    map.metadata.namespace = Some(args.namespace.clone());
    map.data = Some(values.clone());
    if map.metadata.resource_version.is_some() {
        maps.replace(CONFIG_MAP, &PostParams::default(), &map)
            .await
            .map_err(LifecycleError::kube("writing vynil-config"))?;
    } else {
        match maps.create(&PostParams::default(), &map).await {
            Ok(_) => {}
            // Another replica's step recorded it first: theirs is kept.
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let theirs =
                    maps.get(CONFIG_MAP).await.map_err(LifecycleError::kube("reading vynil-config"))?;
                return Ok(Recorded::Kept(theirs.data.unwrap_or_default()));
            }
            Err(e) => return Err(LifecycleError::kube("creating vynil-config")(e)),
        }
    }
    let read = maps.get(CONFIG_MAP).await.map_err(LifecycleError::kube("reading vynil-config back"))?;
    if read.data.as_ref() != Some(&values) {
        return Err(LifecycleError::NotDone(format!(
            "the ConfigMap {CONFIG_MAP} does not hold what was written"
        )));
    }
    Ok(Recorded::Written { values, source })
}

/// The `takeover` subcommand: record, log and print what was recorded.
pub async fn main(args: TakeoverArgs) -> Result<(), LifecycleError> {
    let client = vynil_kube::client(vynil_runtime::user_agent!())
        .await
        .map_err(|e| LifecycleError::Unavailable(e.to_string()))?;
    let recorded = record(&client, &args).await?;
    tracing::info!(%recorded, "takeover");
    println!("{recorded}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_framework_version_is_the_agent_images_tag() {
        let v = |s: &str| version_of(s).map(|v| v.to_string());
        assert_eq!(v("docker.io/sebt3/vynil-agent:0.7.8-alpha.4").as_deref(), Some("0.7.8-alpha.4"));
        assert_eq!(v("registry:5000/vynil-agent:v0.7.7").as_deref(), Some("0.7.7"));
        assert_eq!(v("registry:5000/vynil-agent"), None, "a port is not a tag");
        assert_eq!(v("sebt3/vynil-agent:latest"), None);
    }
}
