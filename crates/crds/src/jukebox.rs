//! `JukeBox` (cluster-scoped, short name `box`): where packages come from, and
//! in its status, what the scanner found (`docs/upstream-vynil.md` §1.1).

// `printcolumn(...)` repeats `type_ = "string"` by design; clippy reads it as a duplicate.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use vynil_rules::{Channel, Package};

use crate::condition::Condition;

/// Where the JukeBox lists its repositories. Exactly one key on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JukeBoxSource {
    /// OCI image references `registry/path/repo` without tag.
    List(Vec<String>),
    Harbor(HarborSource),
    Gitlab(GitlabSource),
    /// Rhai source returning a list of `registry/repo` strings.
    Script(String),
    Http(HttpSource),
    S3(S3Source),
    /// Ours: the repositories of an OCI image layout directory
    /// (`index.json` + `blobs/`), for air-gapped mirrors and local mode.
    Layout(LayoutSource),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LayoutSource {
    /// The layout directory, as the services see it: each directory below it
    /// with an `index.json` is a repository (its path), and so is each `R`
    /// of a root `index.json` entry named `R:<tag>`.
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HarborSource {
    /// Host of the Harbor registry (its API is at `https://<registry>`).
    pub registry: String,
    pub project: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GitlabSource {
    /// REST API base URL.
    pub url: String,
    /// OCI registry host.
    pub registry: String,
    /// `group/project` path.
    pub project: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HttpSource {
    /// Base URL holding `index.yaml`.
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct S3Source {
    pub bucket: String,
    pub region: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// `spec.maturity`; absent means stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Maturity {
    Stable,
    Beta,
    Alpha,
}

impl From<Maturity> for Channel {
    fn from(maturity: Maturity) -> Self {
        match maturity {
            Maturity::Stable => Channel::Stable,
            Maturity::Beta => Channel::Beta,
            Maturity::Alpha => Channel::Alpha,
        }
    }
}

/// `JukeBox` spec: field names are snake_case, as upstream's.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "vynil.solidite.fr",
    version = "v1",
    kind = "JukeBox",
    plural = "jukeboxes",
    shortname = "box",
    status = "JukeBoxStatus",
    doc = "A source of Vynil packages, scanned on a schedule",
    printcolumn(name = "schedule", type_ = "string", json_path = ".spec.schedule"),
    printcolumn(
        name = "last_updated",
        type_ = "string",
        format = "date-time",
        json_path = ".status.conditions[?(@.type == 'Ready')].lastTransitionTime"
    ),
    printcolumn(
        name = "message",
        type_ = "string",
        json_path = ".status.conditions[?(@.type == 'Updated')].message"
    )
)]
pub struct JukeBoxSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<JukeBoxSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maturity: Option<Maturity>,
    /// A `kubernetes.io/dockerconfigjson` Secret in the control plane's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<String>,
    /// Cron expression of the scans.
    pub schedule: String,
    /// Ours: when upgrades of its instances may start (an instance's own replaces it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<crate::UpgradePolicy>,
    /// Ours: revisions recalled for its instances (set with `vynilctl jukebox recall`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recalls: Vec<crate::RecalledRevision>,
    /// Ours: the signature policy of its revisions (`docs/scanner.md`, "Signatures").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifyPolicy>,
}

/// Ours: which signatures make a revision trusted, and what becomes of one
/// that is not (`vynil_rules::signature`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct VerifyPolicy {
    /// `enforce`: an unverified revision is never offered or installed;
    /// `warn`: offered, marked.
    pub mode: VerifyMode,
    /// Trusted public keys, inline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<TrustedKey>,
    /// A Secret in the control plane's namespace whose every data item is a
    /// trusted public key (PEM), named by its item's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys_secret: Option<String>,
    /// A signature counts only when its payload's `docker-reference` names
    /// the repository the revision was found in (simple signing binds a
    /// digest; the reference says where it was meant to be published).
    #[serde(rename = "requireReference", default, skip_serializing_if = "std::ops::Not::not")]
    pub require_reference: bool,
    /// Keyless signers (`cosign sign` without a key): an OIDC issuer and a
    /// subject, verified offline against `trustedRoot`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identities: Vec<TrustedIdentity>,
    /// Sigstore's `trusted_root.json` (Fulcio, CT and Rekor keys), in an
    /// opted-in ConfigMap or Secret of the control plane's namespace.
    #[serde(rename = "trustedRoot", default, skip_serializing_if = "Option::is_none")]
    pub trusted_root: Option<TrustedRootSource>,
    /// Whether a signature counts only with a transparency log entry
    /// verified with the trusted root's log key; default: true when
    /// `trustedRoot` is given, false otherwise.
    #[serde(rename = "requireTransparencyLog", default, skip_serializing_if = "Option::is_none")]
    pub require_transparency_log: Option<bool>,
    /// Attestations a verified revision must also carry, signed by a
    /// trusted key or identity (e.g. SLSA provenance of a given builder).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attestations: Vec<RequiredAttestation>,
}

/// One required attestation: its predicate type, and for SLSA provenance
/// the builder (`runDetails.builder.id`, or v0.2's `builder.id`), exact or
/// a regular expression matching the whole id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequiredAttestation {
    /// E.g. `https://slsa.dev/provenance/v1`.
    pub predicate_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builder_id: Option<String>,
    #[serde(rename = "builderIdRegExp", default, skip_serializing_if = "Option::is_none")]
    pub builder_id_regexp: Option<String>,
}

/// One keyless signer: each of issuer and subject exact, or a regular
/// expression that must match the whole text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrustedIdentity {
    /// What verdicts call it ("verified by <name>"); default: its subject.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The OIDC issuer, e.g. `https://token.actions.githubusercontent.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    #[serde(rename = "issuerRegExp", default, skip_serializing_if = "Option::is_none")]
    pub issuer_regexp: Option<String>,
    /// The certificate's subject: an email, or a workflow's URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(rename = "subjectRegExp", default, skip_serializing_if = "Option::is_none")]
    pub subject_regexp: Option<String>,
}

/// Where the trusted root is: an item of a ConfigMap or a Secret of the
/// control plane's namespace carrying the JukeBox opt-in label (a trusted
/// root holds no secret, but who may write it decides what is trusted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TrustedRootSource {
    #[serde(rename = "configMap", default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Its item; default `trusted_root.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// The object a trusted root is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrustedRootObject<'a> {
    ConfigMap(&'a str),
    Secret(&'a str),
}

impl std::fmt::Display for TrustedRootObject<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrustedRootObject::ConfigMap(name) => write!(f, "ConfigMap {name}"),
            TrustedRootObject::Secret(name) => write!(f, "Secret {name}"),
        }
    }
}

impl TrustedRootSource {
    pub fn item(&self) -> &str {
        self.key.as_deref().filter(|k| !k.is_empty()).unwrap_or("trusted_root.json")
    }

    /// Where to read it: exactly one of `configMap` and `secret`.
    pub fn object(&self) -> Result<TrustedRootObject<'_>, vynil_rules::RulesError> {
        fn given(name: &Option<String>) -> Option<&str> {
            name.as_deref().filter(|n| !n.is_empty())
        }
        match (given(&self.config_map), given(&self.secret)) {
            (Some(name), None) => Ok(TrustedRootObject::ConfigMap(name)),
            (None, Some(name)) => Ok(TrustedRootObject::Secret(name)),
            _ => Err(vynil_rules::RulesError::TrustedRoot {
                problem: "spec.verify.trustedRoot names one configMap or one secret".into(),
            }),
        }
    }
}

impl VerifyPolicy {
    pub fn mode(&self) -> vynil_rules::signature::VerifyMode {
        self.mode.rules()
    }

    /// What it trusts: the inline keys, each data item of the keys' Secret
    /// (`secret`, read by the caller), named by its key, and its identities
    /// under the trusted root's object (`root`, read by the caller).
    pub fn keyring(
        &self,
        secret: Option<&std::collections::BTreeMap<String, Vec<u8>>>,
        root: Option<&std::collections::BTreeMap<String, Vec<u8>>>,
    ) -> Result<vynil_rules::signature::Keyring, vynil_rules::RulesError> {
        use vynil_rules::signature::{AttestationRule, AttestationSpec, Identity, IdentitySpec, TrustedRoot};
        let keys = self.keys(secret)?;
        let root = match (&self.trusted_root, root) {
            (Some(source), Some(data)) => {
                let object = source.object()?;
                let bytes = data.get(source.item()).ok_or_else(|| vynil_rules::RulesError::TrustedRoot {
                    problem: format!("{object} has no item {:?}", source.item()),
                })?;
                Some(TrustedRoot::parse(bytes)?)
            }
            _ => None,
        };
        let identities = self
            .identities
            .iter()
            .map(|i| {
                Identity::parse(IdentitySpec {
                    name: &i.name,
                    issuer: i.issuer.as_deref(),
                    issuer_regexp: i.issuer_regexp.as_deref(),
                    subject: i.subject.as_deref(),
                    subject_regexp: i.subject_regexp.as_deref(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let attestations = self
            .attestations
            .iter()
            .map(|a| {
                AttestationRule::parse(AttestationSpec {
                    predicate_type: &a.predicate_type,
                    builder_id: a.builder_id.as_deref(),
                    builder_id_regexp: a.builder_id_regexp.as_deref(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(keys.trusting(identities, root, self.require_transparency_log)?.requiring(attestations))
    }

    fn keys(
        &self,
        secret: Option<&std::collections::BTreeMap<String, Vec<u8>>>,
    ) -> Result<vynil_rules::signature::Keyring, vynil_rules::RulesError> {
        let mut pems: Vec<(String, String)> =
            self.keys.iter().map(|k| (k.name.clone(), k.public_key.clone())).collect();
        pems.extend(
            secret
                .into_iter()
                .flatten()
                .map(|(name, bytes)| (name.clone(), String::from_utf8_lossy(bytes).into_owned())),
        );
        vynil_rules::signature::Keyring::parse(pems.iter().map(|(n, p)| (n.as_str(), p.as_str())))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum VerifyMode {
    Enforce,
    Warn,
}

impl VerifyMode {
    /// The same, as the rules name it.
    pub fn rules(self) -> vynil_rules::signature::VerifyMode {
        match self {
            VerifyMode::Enforce => vynil_rules::signature::VerifyMode::Enforce,
            VerifyMode::Warn => vynil_rules::signature::VerifyMode::Warn,
        }
    }
}

/// One trusted public key: ECDSA P-256 (cosign's default) or Ed25519, PEM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TrustedKey {
    /// What verdicts call it ("verified by <name>").
    #[serde(default)]
    pub name: String,
    /// `-----BEGIN PUBLIC KEY-----…` (a `cosign.pub`).
    pub public_key: String,
}

impl JukeBoxSpec {
    pub fn channel(&self) -> Channel {
        self.maturity.map(Channel::from).unwrap_or_default()
    }

    /// The signature policy's mode, when it has one.
    pub fn verify_mode(&self) -> Option<vynil_rules::signature::VerifyMode> {
        self.verify.as_ref().map(VerifyPolicy::mode)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum JukeBoxConditionType {
    Ready,
    Updated,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct JukeBoxStatus {
    #[serde(default)]
    pub conditions: Vec<Condition<JukeBoxConditionType>>,
    #[serde(default)]
    #[schemars(schema_with = "crate::schema::packages")]
    pub packages: Vec<Package>,
    /// W3C traceparent of the scan that last changed this status, when spans
    /// are exported: the catalog links its own span to it. Not content: a
    /// scan that changes nothing leaves it as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl JukeBoxStatus {
    /// The same conditions and packages (what a status says, whoever wrote it).
    pub fn same_content(&self, other: &JukeBoxStatus) -> bool {
        self.conditions == other.conditions && self.packages == other.packages
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn policy(trusted_root: serde_json::Value) -> VerifyPolicy {
        serde_json::from_value(serde_json::json!({"mode": "enforce", "trustedRoot": trusted_root})).unwrap()
    }

    #[test]
    fn a_trusted_root_names_one_object_and_its_item_must_be_there() {
        let both = policy(serde_json::json!({"configMap": "a", "secret": "b"}));
        let object = both.trusted_root.as_ref().unwrap().object();
        assert!(matches!(object, Err(vynil_rules::RulesError::TrustedRoot { .. })), "{object:?}");
        let secret = policy(serde_json::json!({"secret": "sigstore"}));
        let data = std::collections::BTreeMap::from([("other.json".to_string(), b"{}".to_vec())]);
        let error = secret.keyring(None, Some(&data)).unwrap_err().to_string();
        assert!(error.contains("Secret sigstore has no item \"trusted_root.json\""), "{error}");
    }
}
