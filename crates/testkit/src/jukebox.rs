//! JukeBoxes as tests write them: one builder for a JukeBox file (local mode's
//! `--jukebox-dir`) and the same object for the fake API server, instead of
//! YAML strings spelt out by hand in every test.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::{Result, io};

/// A JukeBox `name`, without a source unless given a `list` or a `script`
/// (a JukeBox the catalog follows but nobody scans), with an hourly
/// schedule unless told otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct JukeboxBuilder {
    name: String,
    source: Value,
    schedule: String,
    maturity: Option<String>,
    pull_secret: Option<String>,
    verify: Option<Value>,
}

impl JukeboxBuilder {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            source: Value::Null,
            schedule: "0 * * * *".into(),
            maturity: None,
            pull_secret: None,
            verify: None,
        }
    }

    /// A `list` source of `registry/repository` images.
    pub fn list<S: AsRef<str>>(mut self, images: impl IntoIterator<Item = S>) -> Self {
        let images: Vec<String> = images.into_iter().map(|i| i.as_ref().to_string()).collect();
        self.source = json!({ "list": images });
        self
    }

    /// A `script` source (Rhai returning the image list).
    pub fn script(mut self, script: &str) -> Self {
        self.source = json!({ "script": script });
        self
    }

    pub fn schedule(mut self, schedule: &str) -> Self {
        self.schedule = schedule.to_string();
        self
    }

    pub fn maturity(mut self, maturity: &str) -> Self {
        self.maturity = Some(maturity.to_string());
        self
    }

    pub fn pull_secret(mut self, secret: &str) -> Self {
        self.pull_secret = Some(secret.to_string());
        self
    }

    /// A signature policy: `mode` (`enforce`, `warn`) and the trusted keys
    /// `(name, PEM)`.
    pub fn verify(mut self, mode: &str, keys: &[(&str, &str)]) -> Self {
        let keys: Vec<Value> =
            keys.iter().map(|(name, pem)| json!({"name": name, "public_key": pem})).collect();
        self.verify = Some(json!({"mode": mode, "keys": keys}));
        self
    }

    /// Its signature policy requires the signed reference (`spec.verify.requireReference`).
    pub fn require_reference(mut self) -> Self {
        if let Some(verify) = self.verify.as_mut() {
            verify["requireReference"] = json!(true);
        }
        self
    }

    /// Its signature policy trusts the keyless signer `subject` of `issuer`
    /// (exact), called `name`.
    pub fn identity(mut self, name: &str, issuer: &str, subject: &str) -> Self {
        if let Some(verify) = self.verify.as_mut() {
            let identities = verify["identities"].as_array().cloned().unwrap_or_default();
            let identity = json!({"name": name, "issuer": issuer, "subject": subject});
            verify["identities"] = json!(identities.into_iter().chain([identity]).collect::<Vec<_>>());
        }
        self
    }

    /// Its signature policy requires an attestation of `predicate_type`,
    /// of the builder `builder_id` when given.
    pub fn attestation(mut self, predicate_type: &str, builder_id: Option<&str>) -> Self {
        if let Some(verify) = self.verify.as_mut() {
            let mut rule = json!({"predicateType": predicate_type});
            if let Some(builder) = builder_id {
                rule["builderId"] = json!(builder);
            }
            let rules = verify["attestations"].as_array().cloned().unwrap_or_default();
            verify["attestations"] = json!(rules.into_iter().chain([rule]).collect::<Vec<_>>());
        }
        self
    }

    /// Its signature policy reads Sigstore's trusted root from the
    /// `holder` `name` (item `trusted_root.json`),
    /// and requires the transparency log when `require_log` says so
    /// (`None`: the default).
    pub fn trusted_root(mut self, holder: Holder, name: &str, require_log: Option<bool>) -> Self {
        if let Some(verify) = self.verify.as_mut() {
            verify["trustedRoot"] = json!({holder.field(): name});
            if let Some(require) = require_log {
                verify["requireTransparencyLog"] = json!(require);
            }
        }
        self
    }

    /// The object, as the API server and `serde_json` take it.
    pub fn json(&self) -> Value {
        let mut spec = json!({"schedule": self.schedule});
        if !self.source.is_null() {
            spec["source"] = self.source.clone();
        }
        if let Some(maturity) = &self.maturity {
            spec["maturity"] = json!(maturity);
        }
        if let Some(secret) = &self.pull_secret {
            spec["pull_secret"] = json!(secret);
        }
        if let Some(verify) = &self.verify {
            spec["verify"] = verify.clone();
        }
        json!({"apiVersion": "vynil.solidite.fr/v1", "kind": "JukeBox", "metadata": {"name": self.name}, "spec": spec})
    }

    /// The file text (JSON is YAML).
    pub fn yaml(&self) -> String {
        self.json().to_string()
    }

    /// Writes `<dir>/<name>.yaml`; returns its path.
    pub fn write_to(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join(format!("{}.yaml", self.name));
        std::fs::write(&path, self.yaml()).map_err(io("writing a JukeBox file"))?;
        Ok(path)
    }
}

/// The kind of object holding what a JukeBox's policy names beside its
/// spec (a trusted root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    Secret,
    ConfigMap,
}

impl Holder {
    /// Its `kind`.
    pub fn kind(self) -> &'static str {
        match self {
            Holder::Secret => "Secret",
            Holder::ConfigMap => "ConfigMap",
        }
    }

    /// The field of `spec.verify.trustedRoot` naming one.
    fn field(self) -> &'static str {
        match self {
            Holder::Secret => "secret",
            Holder::ConfigMap => "configMap",
        }
    }
}

/// A Secret (`items` base64'd under `data`) or a ConfigMap (`items` as
/// text) a JukeBox may name (the opt-in label), in local mode's JukeBox
/// directory.
pub fn write_opted_in(dir: &Path, holder: Holder, name: &str, items: &[(&str, &[u8])]) -> Result<PathBuf> {
    use base64::Engine as _;
    let data: serde_json::Map<String, Value> = items
        .iter()
        .map(|(key, bytes)| {
            let value = match holder {
                Holder::Secret => base64::engine::general_purpose::STANDARD.encode(bytes),
                Holder::ConfigMap => String::from_utf8_lossy(bytes).into_owned(),
            };
            (key.to_string(), json!(value))
        })
        .collect();
    let secret = json!({
        "apiVersion": "v1",
        "kind": holder.kind(),
        "metadata": {"name": name, "labels": {vynil_crds::secrets::OPT_IN_LABEL: "true"}},
        "data": data,
    });
    let path = dir.join(format!("{name}.yaml"));
    // JSON is YAML: the directory's reader takes it.
    let text = serde_json::to_string_pretty(&secret)
        .map_err(std::io::Error::other)
        .map_err(io("a Secret's text"))?;
    std::fs::write(&path, text).map_err(io("writing a Secret file"))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jukebox_carries_what_was_asked_and_nothing_else() {
        let jukebox = JukeboxBuilder::new("box").list(["r/a", "r/b"]).maturity("beta").json();
        assert_eq!(jukebox["metadata"]["name"], "box");
        assert_eq!(jukebox["spec"]["source"]["list"], json!(["r/a", "r/b"]));
        assert_eq!(jukebox["spec"]["maturity"], "beta");
        assert_eq!(jukebox["spec"]["schedule"], "0 * * * *");
        assert!(jukebox["spec"].get("pull_secret").is_none());
        assert!(JukeboxBuilder::new("x").json()["spec"].get("source").is_none());
    }
}
