//! The Secrets a JukeBox may name, and where their credentials may go
//! (DESIGN principle 7; `docs/security.md` "Secrets a JukeBox may name").
//!
//! Whoever may patch a JukeBox chooses the Secret names of its spec (pull
//! secret, index source credentials, trusted keys). Those names are read with
//! the control plane's own rights, in its namespace, where the service token
//! lives too. So a name alone admits nothing: the Secret must opt in with
//! [`OPT_IN_LABEL`], which only someone allowed to label Secrets there can
//! write, and the control plane's own Secrets ([`CONTROL_PLANE`]) are refused
//! label or not. A credential then goes only to the hosts its Secret binds:
//! the `auths` keys of a `kubernetes.io/dockerconfigjson` Secret (the
//! registry client's credential store keys them by host), the [`HOSTS_KEY`]
//! of any other, compared on the parsed URL actually contacted.
//!
//! Here, beside the JukeBox's types, because the scanner and lifecycle both
//! read these Secrets and must refuse the same ones.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};

/// The label a Secret carries, with value `"true"`, before a JukeBox may name it.
pub const OPT_IN_LABEL: &str = "vynil.solidite.fr/jukebox-secret";

/// The control plane's own Secrets (`deploy/base`): never named by a JukeBox.
pub const CONTROL_PLANE: &[&str] =
    &["vynil-service-token", "vynil-gateway-tokens", "vynil-gateway-session-key", "vynil-redis"];

/// The key of a Secret that is not a `kubernetes.io/dockerconfigjson` one
/// listing the hosts (`host` or `host:port`, separated by commas, spaces or
/// new lines) its credentials may be sent to.
pub const HOSTS_KEY: &str = "hosts";

const DOCKERCONFIGJSON: &str = "kubernetes.io/dockerconfigjson";

/// A Secret a JukeBox may not use, or a host its credentials may not go to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("[E_SECRET_NOT_ALLOWED] {kind} {name}: {why}; {todo} (docs/security.md)")]
pub struct SecretRefused {
    /// `Secret`, or `ConfigMap` (a trusted root).
    pub kind: &'static str,
    pub name: String,
    pub why: String,
    pub todo: String,
}

/// A Secret a JukeBox may name: its data and where its credentials may go.
#[derive(Clone)]
pub struct NamedSecret {
    pub name: String,
    pub data: BTreeMap<String, Vec<u8>>,
    dockerconfigjson: bool,
}

impl std::fmt::Debug for NamedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NamedSecret({}, keys {:?})", self.name, self.data.keys().collect::<Vec<_>>())
    }
}

/// Admits `config_map` as one a JukeBox names (a trusted root: nothing
/// secret, but whoever writes it decides what is trusted), by the same
/// opt-in label as a Secret; its `data` and `binaryData` as one map.
pub fn admit_config_map(config_map: &ConfigMap) -> Result<NamedSecret, SecretRefused> {
    let name = config_map.metadata.name.clone().unwrap_or_default();
    let labels = config_map.metadata.labels.as_ref();
    if labels.and_then(|l| l.get(OPT_IN_LABEL)).map(String::as_str) != Some("true") {
        return Err(SecretRefused {
            kind: "ConfigMap",
            name: name.clone(),
            why: format!("it does not carry the label {OPT_IN_LABEL}=\"true\""),
            todo: format!(
                "if JukeBoxes may trust what it holds, run `kubectl label configmap {name} {OPT_IN_LABEL}=true`"
            ),
        });
    }
    let mut data: BTreeMap<String, Vec<u8>> =
        config_map.binary_data.clone().unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
    for (key, text) in config_map.data.clone().unwrap_or_default() {
        data.insert(key, text.into_bytes());
    }
    Ok(NamedSecret { name, data, dockerconfigjson: false })
}

/// Admits `secret` as one a JukeBox names, or says why not and what to do.
pub fn admit(secret: &Secret) -> Result<NamedSecret, SecretRefused> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let refused = |why: String, todo: String| SecretRefused { kind: "Secret", name: name.clone(), why, todo };
    if CONTROL_PLANE.contains(&name.as_str()) {
        return Err(refused(
            "it is one of the control plane's own Secrets, which no JukeBox may name".into(),
            "create a Secret holding only this source's credentials and name it instead".into(),
        ));
    }
    let labels = secret.metadata.labels.as_ref();
    if labels.and_then(|l| l.get(OPT_IN_LABEL)).map(String::as_str) != Some("true") {
        return Err(refused(
            format!("it does not carry the label {OPT_IN_LABEL}=\"true\""),
            format!(
                "if JukeBoxes may use its credentials, run `kubectl label secret {name} {OPT_IN_LABEL}=true`"
            ),
        ));
    }
    let mut data: BTreeMap<String, Vec<u8>> =
        secret.data.clone().unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
    for (key, text) in secret.string_data.clone().unwrap_or_default() {
        data.insert(key, text.into_bytes());
    }
    Ok(NamedSecret { name, data, dockerconfigjson: secret.type_.as_deref() == Some(DOCKERCONFIGJSON) })
}

impl NamedSecret {
    /// The hosts this Secret's credentials may go to: the `auths` keys of a
    /// `kubernetes.io/dockerconfigjson` Secret, else its [`HOSTS_KEY`].
    pub fn hosts(&self) -> Result<BoundHosts, SecretRefused> {
        let refused = |why: String, todo: &str| SecretRefused {
            kind: "Secret",
            name: self.name.clone(),
            why,
            todo: todo.into(),
        };
        let written: Vec<String> = if self.dockerconfigjson {
            #[derive(serde::Deserialize)]
            struct Config {
                #[serde(default)]
                auths: BTreeMap<String, serde_json::Value>,
            }
            let document = self.data.get(".dockerconfigjson").map(Vec::as_slice).unwrap_or_default();
            let config: Config = serde_json::from_slice(document).map_err(|_| {
                refused(
                    "its .dockerconfigjson is not a JSON document".into(),
                    "write it with `kubectl create secret docker-registry`",
                )
            })?;
            config.auths.into_keys().collect()
        } else {
            let text = self.data.get(HOSTS_KEY).ok_or_else(|| {
                refused(
                    format!("it has no {HOSTS_KEY:?} key binding its credentials to hosts"),
                    "add the key `hosts` listing the hosts (host or host:port) its credentials are for",
                )
            })?;
            String::from_utf8_lossy(text)
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|h| !h.is_empty())
                .map(str::to_string)
                .collect()
        };
        let mut hosts = Vec::new();
        for entry in written {
            hosts.push(BoundHost::parse(&entry).ok_or_else(|| {
                refused(
                    format!("{entry:?} is not a host or host:port"),
                    "write each host bare (`index.example.com`, `index.example.com:8443`)",
                )
            })?);
        }
        Ok(BoundHosts { secret: self.name.clone(), hosts })
    }
}

/// A host (and port, if one is written) credentials may be sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BoundHost {
    host: url::Host,
    port: Option<u16>,
}

impl BoundHost {
    /// `host`, `host:port`, or a registry key as docker writes them
    /// (`https://index.docker.io/v1/`): only its host and port count.
    fn parse(entry: &str) -> Option<Self> {
        let entry = entry.trim();
        let bare = entry.split_once("://").map_or(entry, |(_, rest)| rest);
        let authority = bare.split('/').next().unwrap_or_default();
        if authority.is_empty() || authority.contains(['@', '?', '#', '\\']) {
            return None;
        }
        let url = url::Url::parse(&format!("https://{authority}/")).ok()?;
        Some(BoundHost { host: canonical(url.host()?), port: url.port() })
    }
}

/// A host as compared: the URL parser's (lower case, IDNA, IPv4 in dotted
/// form), without a trailing dot.
fn canonical(host: url::Host<&str>) -> url::Host {
    match host {
        url::Host::Domain(d) => url::Host::Domain(d.trim_end_matches('.').to_string()),
        url::Host::Ipv4(ip) => url::Host::Ipv4(ip),
        url::Host::Ipv6(ip) => url::Host::Ipv6(ip),
    }
}

/// The hosts a Secret binds its credentials to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundHosts {
    secret: String,
    hosts: Vec<BoundHost>,
}

impl BoundHosts {
    /// Whether a request to `url` may carry the credentials: its parsed
    /// host is one bound, on the port bound (the scheme's default when none
    /// is written). A URL with user information never may.
    pub fn allows(&self, url: &url::Url) -> bool {
        let Some(host) = url.host().map(canonical) else { return false };
        if !url.username().is_empty() || url.password().is_some() {
            return false;
        }
        let port = url.port_or_known_default();
        self.hosts.iter().any(|bound| bound.host == host && (bound.port.or(default_port(url)) == port))
    }

    /// [`Self::allows`], or the refusal naming the host.
    pub fn require(&self, url: &url::Url) -> Result<(), SecretRefused> {
        if self.allows(url) {
            return Ok(());
        }
        let contacted = match (url.host_str(), url.port_or_known_default()) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            (Some(host), None) => host.to_string(),
            (None, _) => url.as_str().to_string(),
        };
        Err(SecretRefused {
            kind: "Secret",
            name: self.secret.clone(),
            why: format!("its credentials are not bound to {contacted}"),
            todo: format!("add {contacted} to the Secret's {HOSTS_KEY:?} key if they are meant for it"),
        })
    }
}

fn default_port(url: &url::Url) -> Option<u16> {
    match url.scheme() {
        "https" => Some(443),
        "http" => Some(80),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn secret(name: &str, labelled: bool, type_: Option<&str>, data: &[(&str, &str)]) -> Secret {
        let mut secret = Secret::default();
        secret.metadata.name = Some(name.into());
        if labelled {
            secret.metadata.labels = Some([(OPT_IN_LABEL.to_string(), "true".to_string())].into());
        }
        secret.type_ = type_.map(str::to_string);
        secret.string_data = Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        secret
    }

    #[test]
    fn the_control_plane_s_secrets_are_refused_even_labelled_and_others_need_the_label() {
        for name in CONTROL_PLANE {
            let refused = admit(&secret(name, true, None, &[("token", "x")])).unwrap_err().to_string();
            assert!(refused.starts_with(&format!("[E_SECRET_NOT_ALLOWED] Secret {name}: ")), "{refused}");
            assert!(refused.contains("control plane's own"), "{refused}");
        }
        let unlabelled = admit(&secret("index-auth", false, None, &[])).unwrap_err().to_string();
        assert!(unlabelled.contains(&format!("kubectl label secret index-auth {OPT_IN_LABEL}=true")));
        assert!(unlabelled.ends_with("(docs/security.md)"), "{unlabelled}");
        let admitted = admit(&secret("index-auth", true, None, &[("token", "t")])).unwrap();
        assert_eq!(admitted.data.get("token").map(Vec::as_slice), Some(&b"t"[..]));
    }

    #[test]
    fn a_config_map_a_jukebox_names_needs_the_label_too() {
        let mut config_map = ConfigMap::default();
        config_map.metadata.name = Some("sigstore".into());
        config_map.data = Some([("trusted_root.json".to_string(), "{}".to_string())].into());
        let refused = admit_config_map(&config_map).unwrap_err().to_string();
        assert!(refused.starts_with("[E_SECRET_NOT_ALLOWED] ConfigMap sigstore: "), "{refused}");
        assert!(
            refused.contains(&format!("kubectl label configmap sigstore {OPT_IN_LABEL}=true")),
            "{refused}"
        );
        config_map.metadata.labels = Some([(OPT_IN_LABEL.to_string(), "true".to_string())].into());
        let admitted = admit_config_map(&config_map).unwrap();
        assert_eq!(admitted.data.get("trusted_root.json").map(Vec::as_slice), Some(&b"{}"[..]));
    }

    #[test]
    fn credentials_go_only_to_the_hosts_the_secret_binds_compared_as_parsed() {
        let named =
            admit(&secret("s", true, None, &[("hosts", "Index.Example.com, 10.0.0.1:8443\nidx.corp.")]))
                .unwrap();
        let hosts = named.hosts().unwrap();
        let allowed = |u: &str| hosts.allows(&url::Url::parse(u).unwrap());
        assert!(allowed("https://index.example.com/charts"));
        assert!(allowed("http://INDEX.example.com./x"), "case and a trailing dot fold");
        assert!(allowed("https://idx.corp/x"));
        assert!(allowed("https://167772161:8443/"), "an IPv4 integer is the address it spells");
        assert!(!allowed("https://index.example.com:8443/"), "another port than the default");
        assert!(!allowed("https://10.0.0.1/"), "the bound port only");
        assert!(!allowed("https://evil.example/?index.example.com"));
        assert!(!allowed("https://index.example.com.evil.example/"));
        assert!(!allowed("https://index.example.com@evil.example/"));
        assert!(!allowed("https://u:p@index.example.com/"), "user information never");
        let refused = hosts.require(&url::Url::parse("https://evil%2Eexample/").unwrap()).unwrap_err();
        assert!(refused.to_string().contains("not bound to evil.example:443"), "{refused}");
    }

    #[test]
    fn a_secret_without_hosts_binds_nothing_and_a_dockerconfig_binds_its_auths() {
        let bare = admit(&secret("s", true, None, &[("token", "t")])).unwrap();
        assert!(bare.hosts().unwrap_err().to_string().contains("no \"hosts\" key"));
        let docker = admit(&secret(
            "pull",
            true,
            Some(DOCKERCONFIGJSON),
            &[(".dockerconfigjson", r#"{"auths":{"https://index.docker.io/v1/":{},"reg.corp:5000":{}}}"#)],
        ))
        .unwrap();
        let hosts = docker.hosts().unwrap();
        assert!(hosts.allows(&url::Url::parse("https://index.docker.io/v2/").unwrap()));
        assert!(hosts.allows(&url::Url::parse("http://reg.corp:5000/v2/").unwrap()));
        assert!(!hosts.allows(&url::Url::parse("https://reg.corp/v2/").unwrap()));
        let bad = admit(&secret("s", true, None, &[("hosts", "a.example/path?x b@c")])).unwrap();
        assert!(bad.hosts().is_err(), "a host written with a query or user information is refused");
    }
}
