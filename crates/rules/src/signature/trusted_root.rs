//! Sigstore's trusted root: the trust material keyless bundles are verified
//! against, offline, as the operator gave it.
//!
//! The format is sigstore/protobuf-specs `TrustedRoot`'s JSON
//! (`trusted_root.json`, media type
//! `application/vnd.dev.sigstore.trustedroot+json;version=0.1`), what
//! `cosign trusted-root create` writes and what Sigstore's TUF repository
//! publishes for the public-good instance. Read with serde here rather than
//! with `sigstore` 0.15's `SigstoreTrustRoot`: that type lives behind its
//! `sigstore-trust-root` feature, which brings tokio, reqwest and TUF into
//! a crate that must stay pure (`tests/purity.rs`). Four lists matter:
//! `certificateAuthorities` (Fulcio: a chain, leaf-most first, and when it
//! was valid), `ctlogs` (certificate transparency logs whose SCTs Fulcio
//! embeds), `tlogs` (Rekor: whose entries prove when a signature was made)
//! and `timestampAuthorities` (RFC 3161; listed, not used yet:
//! `docs/scanner.md`). A log's key is named by its `logId.keyId`, the
//! SHA-256 of its DER public key, as SCTs and Rekor entries name it.

use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use super::PublicKey;
use crate::RulesError;

/// The one media type of the trusted root's format.
pub const TRUSTED_ROOT_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.trustedroot+json;version=0.1";

/// When a key or an authority may be trusted, in Unix seconds (inclusive).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Window {
    start: Option<i64>,
    end: Option<i64>,
}

impl Window {
    pub(crate) fn contains(&self, at: i64) -> bool {
        self.start.is_none_or(|s| s <= at) && self.end.is_none_or(|e| at <= e)
    }
}

/// A transparency log's key (Rekor's, or a CT log's).
#[derive(Debug, Clone)]
pub(crate) struct LogKey {
    /// SHA-256 of the DER public key: how entries and SCTs name it.
    pub(crate) id: Vec<u8>,
    pub(crate) key: PublicKey,
    pub(crate) valid: Window,
}

/// A certificate authority: its chain (DER, leaf-most first, root last).
#[derive(Debug, Clone)]
pub(crate) struct Authority {
    pub(crate) chain: Vec<Vec<u8>>,
    pub(crate) valid: Window,
}

/// A trusted root, read.
#[derive(Debug, Clone)]
pub struct TrustedRoot {
    pub(crate) tlogs: Vec<LogKey>,
    pub(crate) ctlogs: Vec<LogKey>,
    pub(crate) authorities: Vec<Authority>,
    /// `sha256:<hex>` of the bytes it was read from.
    digest: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RootFile {
    media_type: String,
    #[serde(default)]
    tlogs: Vec<LogFile>,
    #[serde(default)]
    certificate_authorities: Vec<AuthorityFile>,
    #[serde(default)]
    ctlogs: Vec<LogFile>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogFile {
    #[serde(default)]
    base_url: String,
    public_key: KeyFile,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyFile {
    raw_bytes: String,
    valid_for: Option<WindowFile>,
}

#[derive(Deserialize)]
struct WindowFile {
    start: Option<String>,
    end: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuthorityFile {
    #[serde(default)]
    uri: String,
    cert_chain: ChainFile,
    valid_for: Option<WindowFile>,
}

#[derive(Deserialize)]
struct ChainFile {
    certificates: Vec<RawBytes>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawBytes {
    pub(crate) raw_bytes: String,
}

impl TrustedRoot {
    /// Reads `trusted_root.json`'s bytes. The error names the entry that is
    /// not usable (a key of a kind we do not verify, a date, base64).
    pub fn parse(bytes: &[u8]) -> Result<Self, RulesError> {
        let problem = |problem: String| RulesError::TrustedRoot { problem };
        let file: RootFile =
            serde_json::from_slice(bytes).map_err(|e| problem(format!("not a trusted root's JSON: {e}")))?;
        if file.media_type != TRUSTED_ROOT_MEDIA_TYPE {
            return Err(problem(format!("its media type is {:?}", file.media_type)));
        }
        let tlogs = logs(&file.tlogs, "tlogs").map_err(problem)?;
        let ctlogs = logs(&file.ctlogs, "ctlogs").map_err(problem)?;
        let mut authorities = Vec::new();
        for (n, ca) in file.certificate_authorities.iter().enumerate() {
            let what = format!("certificateAuthorities[{n}] ({})", ca.uri);
            let chain = ca
                .cert_chain
                .certificates
                .iter()
                .map(|c| decode(&c.raw_bytes).map_err(|e| problem(format!("{what}: {e}"))))
                .collect::<Result<Vec<_>, _>>()?;
            if chain.is_empty() {
                return Err(problem(format!("{what} has no certificate")));
            }
            let valid = window(ca.valid_for.as_ref()).map_err(|e| problem(format!("{what}: {e}")))?;
            authorities.push(Authority { chain, valid });
        }
        if authorities.is_empty() || tlogs.is_empty() || ctlogs.is_empty() {
            return Err(problem(
                "it needs at least one certificate authority, one transparency log (tlogs) and one CT log \
                 (ctlogs) to verify a keyless signature"
                    .into(),
            ));
        }
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(bytes)));
        Ok(Self { tlogs, ctlogs, authorities, digest })
    }

    /// What identifies it: a verdict reached under another root is decided again.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    pub(crate) fn tlog(&self, id: &[u8]) -> Option<&LogKey> {
        self.tlogs.iter().find(|l| l.id == id)
    }

    pub(crate) fn ctlog(&self, id: &[u8]) -> Option<&LogKey> {
        self.ctlogs.iter().find(|l| l.id == id)
    }
}

fn logs(files: &[LogFile], list: &str) -> Result<Vec<LogKey>, String> {
    let mut out = Vec::new();
    for (n, log) in files.iter().enumerate() {
        let what = format!("{list}[{n}] ({})", log.base_url);
        let der = decode(&log.public_key.raw_bytes).map_err(|e| format!("{what}: {e}"))?;
        let key = PublicKey::from_spki_der(&der).map_err(|e| format!("{what}: {e}"))?;
        let valid = window(log.public_key.valid_for.as_ref()).map_err(|e| format!("{what}: {e}"))?;
        out.push(LogKey { id: Sha256::digest(&der).to_vec(), key, valid });
    }
    Ok(out)
}

fn window(file: Option<&WindowFile>) -> Result<Window, String> {
    let Some(file) = file else { return Ok(Window::default()) };
    let at = |text: &Option<String>| -> Result<Option<i64>, String> {
        text.as_deref()
            .map(|t| {
                t.parse::<jiff::Timestamp>()
                    .map(|t| t.as_second())
                    .map_err(|e| format!("validFor {t:?} is no RFC 3339 time: {e}"))
            })
            .transpose()
    };
    Ok(Window { start: at(&file.start)?, end: at(&file.end)? })
}

pub(crate) fn decode(text: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD.decode(text.trim()).map_err(|e| format!("not base64: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUBLIC_GOOD: &[u8] = include_bytes!("testdata/sigstore-rs-public-good.trusted_root.json");

    #[test]
    fn the_public_good_root_is_read_with_its_logs_and_authorities() {
        let root = TrustedRoot::parse(PUBLIC_GOOD).unwrap();
        // Rekor's key, as its entries name it (`logId.keyId` in the file).
        let rekor = decode("wNI9atQGlz+VWfO6LRygH4QUfY/8W4RFwiT5i5WRgB0=").unwrap();
        assert!(root.tlog(&rekor).is_some());
        assert_eq!(root.ctlogs.len(), 2);
        let first = &root.authorities[0];
        // "validFor": {"start": "2021-03-07T03:20:29.000Z", "end": "2022-12-31T23:59:59.999Z"}
        assert!(first.valid.contains(1_615_087_229) && !first.valid.contains(1_615_087_228));
        assert!(first.valid.contains(1_672_531_199) && !first.valid.contains(1_672_531_200));
    }

    #[test]
    fn what_is_no_usable_root_is_told() {
        let mut file: serde_json::Value = serde_json::from_slice(PUBLIC_GOOD).unwrap();
        file["tlogs"][0]["publicKey"]["rawBytes"] = "AAAA".into();
        let Err(RulesError::TrustedRoot { problem }) =
            TrustedRoot::parse(&serde_json::to_vec(&file).unwrap())
        else {
            panic!("a key that is no key was taken")
        };
        assert!(problem.contains("tlogs[0] (https://rekor.sigstore.dev)"), "{problem}");
        file["tlogs"] = serde_json::json!([]);
        assert!(TrustedRoot::parse(&serde_json::to_vec(&file).unwrap()).is_err());
        assert!(TrustedRoot::parse(b"{\"mediaType\":\"application/json\"}").is_err());
    }
}
