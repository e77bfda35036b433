//! Keyless signatures: a bundle whose signer is a short-lived Fulcio
//! certificate naming an OIDC identity (`cosign sign` without `--key`),
//! trusted when an identity of the policy ([`Identity`]) names that issuer
//! and subject and the operator's trusted root ([`TrustedRoot`]) vouches,
//! offline, for everything else:
//! 1. the certificate's key signed the envelope (DSSE PAE, as keyed);
//! 2. a Rekor entry of the root's log records this signature, proven by its
//!    signed entry timestamp and inclusion proof ([`super::tlog`]); the
//!    SET's integrated time is the **signing time** (an RFC 3161 timestamp
//!    alone is refused with its reason: not verified yet);
//! 3. the certificate chains, at that time, to a certificate authority of
//!    the root valid then, for code signing (`rustls-webpki`: path
//!    building, validity, basic constraints and extended key usage are a
//!    maintained crate's job, as in `sigstore` 0.15's certificate pool);
//! 4. its embedded SCT (RFC 6962 §3.2, precertificate entry) verifies with
//!    a CT log key of the root: cosign requires it by default, and no
//!    policy switch turns it off here;
//! 5. its subject alternative name and Fulcio's issuer extension
//!    (`1.3.6.1.4.1.57264.1.8`, else the older `.1.1`) match an identity.
//!
//! Certificates are parsed and re-encoded (the precertificate is the
//! certificate without its SCT list) with RustCrypto's `x509-cert`. Not
//! `sigstore` 0.15 itself: its certificate pool and SCT check are private,
//! and every feature that exposes them brings tokio and an HTTP client into
//! a crate that must stay pure.

use sha2::{Digest as _, Sha256};
use x509_cert::{
    Certificate,
    der::{Decode as _, Encode as _, asn1::OctetString},
    ext::pkix::{SubjectAltName, name::GeneralName},
};

use super::tlog::{self, Entry, Signed};
use super::trusted_root::TrustedRoot;
use super::{PublicKey, Verdict};
use crate::RulesError;

/// Fulcio's issuer extension (v2, a DER UTF8String) and its first form (raw text).
const ISSUER_V2: &str = "1.3.6.1.4.1.57264.1.8";
const ISSUER_V1: &str = "1.3.6.1.4.1.57264.1.1";
/// RFC 6962's embedded SCT list extension.
const SCT_LIST: &str = "1.3.6.1.4.1.11129.2.4.2";
/// id-kp-codeSigning (1.3.6.1.5.5.7.3.3), DER value bytes as webpki takes them.
const CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];

/// How an identity's issuer or subject (or an attestation's builder) is matched.
#[derive(Debug, Clone)]
pub(crate) enum Matcher {
    Exact(String),
    /// Anchored: the whole text must match (Go's and Flux's `MatchString`
    /// are not anchored; an unanchored pattern trusts too much).
    Pattern(regex::Regex),
}

impl Matcher {
    pub(crate) fn new(exact: Option<&str>, pattern: Option<&str>, field: &str) -> Result<Self, String> {
        match (exact.filter(|e| !e.is_empty()), pattern.filter(|p| !p.is_empty())) {
            (Some(exact), None) => Ok(Matcher::Exact(exact.to_string())),
            (None, Some(pattern)) => regex::Regex::new(&format!("^(?:{pattern})$"))
                .map(Matcher::Pattern)
                .map_err(|e| format!("{field}RegExp {pattern:?} is no regular expression: {e}")),
            (Some(_), Some(_)) => Err(format!("give {field} or {field}RegExp, not both")),
            (None, None) => Err(format!("give {field} (exact) or {field}RegExp")),
        }
    }

    pub(crate) fn matches(&self, text: &str) -> bool {
        match self {
            Matcher::Exact(exact) => exact == text,
            Matcher::Pattern(pattern) => pattern.is_match(text),
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Matcher::Exact(exact) => exact.clone(),
            Matcher::Pattern(pattern) => format!("/{}/", pattern.as_str()),
        }
    }
}

/// One trusted signer of keyless signatures: an OIDC issuer and a subject
/// (an email, a workflow's URI), as `cosign verify --certificate-identity
/// --certificate-oidc-issuer` (or their `-regexp` forms) take them.
#[derive(Debug, Clone)]
pub struct Identity {
    name: String,
    issuer: Matcher,
    subject: Matcher,
}

/// An identity as a policy writes it: each of issuer and subject exact or
/// as a regular expression (matching the whole text).
#[derive(Debug, Clone, Copy, Default)]
pub struct IdentitySpec<'a> {
    pub name: &'a str,
    pub issuer: Option<&'a str>,
    pub issuer_regexp: Option<&'a str>,
    pub subject: Option<&'a str>,
    pub subject_regexp: Option<&'a str>,
}

impl Identity {
    pub fn parse(spec: IdentitySpec<'_>) -> Result<Self, RulesError> {
        let error = |problem: String| RulesError::Identity { name: spec.name.to_string(), problem };
        let issuer = Matcher::new(spec.issuer, spec.issuer_regexp, "issuer").map_err(error)?;
        let subject = Matcher::new(spec.subject, spec.subject_regexp, "subject").map_err(error)?;
        let name = match spec.name.trim() {
            "" => subject.describe(),
            name => name.to_string(),
        };
        Ok(Self { name, issuer, subject })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// What it trusts, for fingerprints and messages.
    pub fn describe(&self) -> String {
        format!("{}: {} from {}", self.name, self.subject.describe(), self.issuer.describe())
    }
}

/// A keyless envelope's signer, entries and signature, as the bundle gave them.
pub(crate) struct Keyless<'a> {
    pub(crate) certificate: &'a [u8],
    pub(crate) entries: &'a [Entry],
    /// The DSSE PAE of the payload, and the payload.
    pub(crate) signed: &'a [u8],
    pub(crate) payload: &'a [u8],
    pub(crate) signatures: &'a [Vec<u8>],
}

/// The name of the identity that signed, once every check holds; else the
/// verdict: another identity or authority (`UntrustedKey`), or a proof that
/// fails (`Malformed`, saying which).
pub(crate) fn signer<'k>(
    bundle: &Keyless<'_>,
    identities: &'k [Identity],
    root: &TrustedRoot,
) -> Result<&'k str, Verdict> {
    let malformed = |problem: String| Verdict::Malformed { problem };
    let cert = Certificate::from_der(bundle.certificate)
        .map_err(|e| malformed(format!("the bundle's certificate is no X.509 certificate: {e}")))?;
    let spki = cert.tbs_certificate.subject_public_key_info.to_der().map_err(|e| malformed(e.to_string()))?;
    let key = PublicKey::from_spki_der(&spki).map_err(|e| malformed(format!("the certificate holds {e}")))?;
    let signature = bundle
        .signatures
        .iter()
        .find(|s| key.verifies(bundle.signed, s) == Some(true))
        .ok_or(Verdict::UntrustedKey)?;
    let signed = Signed { payload: bundle.payload, signature, signer: bundle.certificate };
    let logged = tlog::logged(bundle.entries, root, &signed)
        .map_err(|e| malformed(format!("keyless, and not proven by the transparency log: {e}")))?;
    let Some(time) = logged.time else {
        return Err(malformed(
            "keyless, and no signed entry timestamp gives its signing time (RFC 3161 timestamps are not verified yet)"
                .into(),
        ));
    };
    let issuer = chained_issuer(bundle.certificate, &cert, root, time).ok_or(Verdict::UntrustedKey)?;
    verify_sct(&cert, &issuer, root).map_err(|e| malformed(format!("its certificate's SCT {e}")))?;
    let (oidc_issuer, subject) = identity_of(&cert).map_err(malformed)?;
    identities
        .iter()
        .find(|i| i.issuer.matches(&oidc_issuer) && i.subject.matches(&subject))
        .map(|i| i.name.as_str())
        .ok_or(Verdict::UntrustedKey)
}

/// The certificate that issued `cert`, when `cert` chains at `time` to an
/// authority of `root` valid then.
fn chained_issuer(der: &[u8], cert: &Certificate, root: &TrustedRoot, time: i64) -> Option<Certificate> {
    use rustls_pki_types::{CertificateDer, UnixTime};
    let leaf = CertificateDer::from(der);
    let leaf = webpki::EndEntityCert::try_from(&leaf).ok()?;
    let at = UnixTime::since_unix_epoch(std::time::Duration::from_secs(u64::try_from(time).ok()?));
    for authority in root.authorities.iter().filter(|a| a.valid.contains(time)) {
        let (anchor, intermediates) = authority.chain.split_last()?;
        let anchor = CertificateDer::from(anchor.as_slice());
        let Ok(anchor) = webpki::anchor_from_trusted_cert(&anchor) else { continue };
        let intermediates: Vec<CertificateDer> =
            intermediates.iter().map(|c| CertificateDer::from(c.as_slice())).collect();
        let usage = webpki::KeyUsage::required(CODE_SIGNING);
        let algorithms = webpki::ALL_VERIFICATION_ALGS;
        if leaf.verify_for_usage(algorithms, &[anchor], &intermediates, at, usage, None, None).is_ok() {
            return authority
                .chain
                .iter()
                .filter_map(|c| Certificate::from_der(c).ok())
                .find(|c| c.tbs_certificate.subject == cert.tbs_certificate.issuer);
        }
    }
    None
}

/// The OIDC issuer and the subject a Fulcio certificate names.
fn identity_of(cert: &Certificate) -> Result<(String, String), String> {
    let extensions = cert.tbs_certificate.extensions.as_deref().unwrap_or_default();
    let find = |oid: &str| extensions.iter().find(|e| e.extn_id.to_string() == oid);
    let issuer = match (find(ISSUER_V2), find(ISSUER_V1)) {
        (Some(v2), _) => x509_cert::der::asn1::Utf8StringRef::from_der(v2.extn_value.as_bytes())
            .map(|s| s.as_str().to_string())
            .map_err(|e| format!("its certificate's issuer extension: {e}"))?,
        (None, Some(v1)) => String::from_utf8_lossy(v1.extn_value.as_bytes()).into_owned(),
        (None, None) => {
            return Err("its certificate names no OIDC issuer (no Fulcio issuer extension)".into());
        }
    };
    let names = find("2.5.29.17")
        .and_then(|e| SubjectAltName::from_der(e.extn_value.as_bytes()).ok())
        .map(|san| san.0)
        .unwrap_or_default();
    let subject = names
        .iter()
        .find_map(|name| match name {
            GeneralName::Rfc822Name(email) => Some(email.to_string()),
            GeneralName::UniformResourceIdentifier(uri) => Some(uri.to_string()),
            GeneralName::OtherName(other) => other
                .value
                .decode_as::<x509_cert::der::asn1::Utf8StringRef>()
                .ok()
                .map(|s| s.as_str().to_string()),
            _ => None,
        })
        .ok_or("its certificate names no subject (no email, URI or username alternative name)")?;
    Ok((issuer, subject))
}

/// RFC 6962 §3.2: one embedded SCT, of a CT log of `root`, signs this
/// certificate's precertificate entry (its TBS without the SCT list, and
/// the hash of its issuer's key).
fn verify_sct(cert: &Certificate, issuer: &Certificate, root: &TrustedRoot) -> Result<(), String> {
    let tbs = &cert.tbs_certificate;
    let extensions = tbs.extensions.as_deref().unwrap_or_default();
    let list = extensions.iter().find(|e| e.extn_id.to_string() == SCT_LIST).ok_or("is missing")?;
    let list = OctetString::from_der(list.extn_value.as_bytes()).map_err(|e| format!("list: {e}"))?;
    let mut precert = tbs.clone();
    precert.extensions =
        Some(extensions.iter().filter(|e| e.extn_id.to_string() != SCT_LIST).cloned().collect());
    let precert = precert.to_der().map_err(|e| e.to_string())?;
    let issuer_key = issuer.tbs_certificate.subject_public_key_info.to_der().map_err(|e| e.to_string())?;
    let issuer_key_hash = Sha256::digest(&issuer_key);
    let mut problem = "names no CT log of the trusted root".to_string();
    for sct in scts(list.as_bytes()).ok_or("list is not a TLS list of SCTs")? {
        let Some(log) = root.ctlog(sct.log_id) else { continue };
        if !i64::try_from(sct.timestamp / 1000).is_ok_and(|at| log.valid.contains(at)) {
            problem = "is from a CT log key not valid at its time".into();
            continue;
        }
        let mut signed = vec![0u8, 0u8];
        signed.extend_from_slice(&sct.timestamp.to_be_bytes());
        signed.extend_from_slice(&[0, 1]);
        signed.extend_from_slice(&issuer_key_hash);
        let length = u32::try_from(precert.len()).map_err(|e| e.to_string())?.to_be_bytes();
        signed.extend_from_slice(&length[1..]);
        signed.extend_from_slice(&precert);
        signed.extend_from_slice(
            &u16::try_from(sct.extensions.len()).map_err(|e| e.to_string())?.to_be_bytes(),
        );
        signed.extend_from_slice(sct.extensions);
        if log.key.verifies(&signed, sct.signature) == Some(true) {
            return Ok(());
        }
        problem = "does not verify with its CT log's key".into();
    }
    Err(problem)
}

struct Sct<'a> {
    log_id: &'a [u8],
    timestamp: u64,
    extensions: &'a [u8],
    signature: &'a [u8],
}

/// The v1 SCTs of a TLS-encoded `SignedCertificateTimestampList` (RFC 6962 §3.3).
fn scts(bytes: &[u8]) -> Option<Vec<Sct<'_>>> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, tail) = bytes.split_at_checked(n)?;
        *bytes = tail;
        Some(head)
    }
    fn u16_of(bytes: &mut &[u8]) -> Option<usize> {
        take(bytes, 2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    let mut rest = bytes;
    let length = u16_of(&mut rest)?;
    let mut list = take(&mut rest, length)?;
    let mut out = Vec::new();
    while !list.is_empty() {
        let length = u16_of(&mut list)?;
        let mut sct = take(&mut list, length)?;
        let version = take(&mut sct, 1)?[0];
        let log_id = take(&mut sct, 32)?;
        let timestamp = u64::from_be_bytes(take(&mut sct, 8)?.try_into().ok()?);
        let length = u16_of(&mut sct)?;
        let extensions = take(&mut sct, length)?;
        let _algorithms = take(&mut sct, 2)?;
        let length = u16_of(&mut sct)?;
        let signature = take(&mut sct, length)?;
        if version == 0 {
            out.push(Sct { log_id, timestamp, extensions, signature });
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::{Keyring, TrustedRoot, bundle::verify_bundle};
    use super::*;
    use base64::Engine as _;

    /// sigstore/sigstore-rs at 038e36a: `trust_root/prod/trusted_root.json`
    /// (the public-good instance's) and `tests/data/bundle_v03.json` (added
    /// in dedbebd: a cosign v3 keyless bundle of
    /// kubewarden-controller v1.34.0's image, signed in GitHub Actions, with
    /// a Rekor `dsse` entry, its inclusion proof, checkpoint and SET).
    const PUBLIC_GOOD: &[u8] = include_bytes!("testdata/sigstore-rs-public-good.trusted_root.json");
    const COSIGN_V3: &[u8] = include_bytes!("testdata/sigstore-rs-bundle_v03.json");
    /// The Statement's subject of that bundle.
    const SIGNED: &str = "sha256:c811d58de79c92f03214e63aa339484e488d694ae8a6283b5f3f17a9faf50172";
    /// sigstore/sigstore-rs 2bf3b8e `tests/data/dsse/dsse.sigstore.json`: a
    /// v0.1 bundle (certificate chain, Rekor `intoto` entry with a SET and no
    /// inclusion proof) of an SLSA provenance, signed by brian@dehamer.com
    /// through GitHub's OAuth in 2022.
    const DSSE_V01: &[u8] = include_bytes!("testdata/sigstore-rs-dsse.sigstore.json");
    const ACTIONS: &str = "https://token.actions.githubusercontent.com";

    fn identity(name: &str, issuer: &str, subject_regexp: &str) -> Identity {
        Identity::parse(IdentitySpec {
            name,
            issuer: Some(issuer),
            subject_regexp: Some(subject_regexp),
            ..Default::default()
        })
        .unwrap()
    }

    fn keyring(identities: Vec<Identity>) -> Keyring {
        Keyring::default().trusting(identities, Some(TrustedRoot::parse(PUBLIC_GOOD).unwrap()), None).unwrap()
    }

    fn kubewarden() -> Keyring {
        keyring(vec![identity("kubewarden", ACTIONS, "https://github.com/kubewarden/.*")])
    }

    fn edited(bundle: &[u8], edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
        let mut value: serde_json::Value = serde_json::from_slice(bundle).unwrap();
        edit(&mut value);
        serde_json::to_vec(&value).unwrap()
    }

    #[test]
    fn a_bundle_cosign_v3_made_verifies_offline_with_the_public_good_root() {
        assert_eq!(
            verify_bundle(SIGNED, COSIGN_V3, &kubewarden()),
            Verdict::Verified { key: "kubewarden".into(), reference: String::new() }
        );
        let other = format!("sha256:{}", "0".repeat(64));
        assert!(matches!(verify_bundle(&other, COSIGN_V3, &kubewarden()), Verdict::DigestMismatch { .. }));
    }

    #[test]
    fn a_changed_payload_is_signed_by_nobody_trusted() {
        let bundle = edited(COSIGN_V3, |b| {
            let b64 = base64::engine::general_purpose::STANDARD;
            let mut statement: serde_json::Value =
                serde_json::from_slice(&b64.decode(b["dsseEnvelope"]["payload"].as_str().unwrap()).unwrap())
                    .unwrap();
            statement["subject"][0]["digest"]["sha256"] = "1".repeat(64).into();
            b["dsseEnvelope"]["payload"] = b64.encode(serde_json::to_vec(&statement).unwrap()).into();
        });
        let other = format!("sha256:{}", "1".repeat(64));
        assert_eq!(verify_bundle(&other, &bundle, &kubewarden()), Verdict::UntrustedKey);
    }

    #[test]
    fn another_identity_or_no_trusted_root_does_not_verify_it() {
        let elsewhere = keyring(vec![identity("elsewhere", ACTIONS, "https://github.com/sigstore/.*")]);
        assert_eq!(verify_bundle(SIGNED, COSIGN_V3, &elsewhere), Verdict::UntrustedKey);
        let other_issuer =
            keyring(vec![identity("gitlab", "https://gitlab.com", "https://github.com/kubewarden/.*")]);
        assert_eq!(verify_bundle(SIGNED, COSIGN_V3, &other_issuer), Verdict::UntrustedKey);
        // Anchored: a pattern matching part of the subject trusts nothing.
        let partial = keyring(vec![identity("partial", ACTIONS, "kubewarden")]);
        assert_eq!(verify_bundle(SIGNED, COSIGN_V3, &partial), Verdict::UntrustedKey);
        assert_eq!(verify_bundle(SIGNED, COSIGN_V3, &Keyring::default()), Verdict::UntrustedKey);
    }

    #[test]
    fn every_proof_of_the_log_is_checked() {
        type Edit = fn(&mut serde_json::Value);
        let cases: [(&str, Edit); 5] = [
            ("a moved integrated time (SET)", |b| {
                b["verificationMaterial"]["tlogEntries"][0]["integratedTime"] = "1775719410".into()
            }),
            ("another root hash", |b| {
                b["verificationMaterial"]["tlogEntries"][0]["inclusionProof"]["rootHash"] =
                    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=".into()
            }),
            ("an unsigned checkpoint", |b| {
                let checkpoint =
                    &mut b["verificationMaterial"]["tlogEntries"][0]["inclusionProof"]["checkpoint"];
                let note = checkpoint["envelope"].as_str().unwrap().replace("1139201557", "1139201558");
                checkpoint["envelope"] = note.into();
            }),
            ("no entry", |b| b["verificationMaterial"]["tlogEntries"] = serde_json::json!([])),
            ("a SET-less entry, its time unproven", |b| {
                b["verificationMaterial"]["tlogEntries"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("inclusionPromise");
            }),
        ];
        for (case, edit) in cases {
            let verdict = verify_bundle(SIGNED, &edited(COSIGN_V3, edit), &kubewarden());
            assert!(matches!(verdict, Verdict::Malformed { .. }), "{case}: {verdict:?}");
        }
    }

    #[test]
    fn an_entry_of_another_signature_proves_nothing() {
        // The v3 bundle's envelope, carrying the 2022 bundle's (valid) entry.
        let foreign: serde_json::Value = serde_json::from_slice(DSSE_V01).unwrap();
        let bundle = edited(COSIGN_V3, |b| {
            b["verificationMaterial"]["tlogEntries"] = foreign["verificationMaterial"]["tlogEntries"].clone()
        });
        let verdict = verify_bundle(SIGNED, &bundle, &kubewarden());
        let Verdict::Malformed { problem } = verdict else { panic!("{verdict:?}") };
        assert!(problem.contains("another payload"), "{problem}");
    }

    #[test]
    fn a_v0_1_bundle_with_a_chain_and_a_set_names_its_signer() {
        // An SLSA provenance is no image signature (Unsigned) once its
        // signer is trusted; another signer stays untrusted.
        let brian = keyring(vec![
            Identity::parse(IdentitySpec {
                name: "brian",
                issuer: Some("https://github.com/login/oauth"),
                subject: Some("brian@dehamer.com"),
                ..Default::default()
            })
            .unwrap(),
        ]);
        let any = format!("sha256:{}", "0".repeat(64));
        assert_eq!(verify_bundle(&any, DSSE_V01, &brian), Verdict::Unsigned);
        assert_eq!(verify_bundle(&any, DSSE_V01, &kubewarden()), Verdict::UntrustedKey);
    }

    #[test]
    fn identities_are_refused_when_they_cannot_match() {
        let spec = |issuer: Option<&'static str>, regexp: Option<&'static str>| IdentitySpec {
            name: "x",
            issuer,
            issuer_regexp: regexp,
            subject: Some("a@b"),
            ..Default::default()
        };
        assert!(Identity::parse(spec(None, None)).is_err());
        assert!(Identity::parse(spec(Some("i"), Some("i"))).is_err());
        assert!(Identity::parse(spec(None, Some("("))).is_err());
        assert!(
            Keyring::default()
                .trusting(vec![Identity::parse(spec(Some("i"), None)).unwrap()], None, None)
                .is_err()
        );
    }
}
