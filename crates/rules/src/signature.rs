//! Signature policy: whether a revision carries a cosign signature by a
//! trusted key, decided from bytes alone.
//!
//! cosign's key-based signatures live beside the image, under the tag
//! `sha256-<digest>.sig`: an OCI manifest whose layers of type
//! [`SIMPLE_SIGNING_MEDIA_TYPE`] each hold a payload (the "simple signing"
//! JSON naming the signed manifest digest) and, in the layer's annotation
//! [`SIGNATURE_ANNOTATION`], the base64 signature of that payload. Reading
//! them is the registry client's job; this module decides, given the bytes
//! ([`Evidence`]) and the trusted keys ([`Keyring`]), one [`Verdict`]:
//! verified by a named key, unsigned, signed by no trusted key, a trusted
//! signature of another digest (a copied signature), or malformed.
//!
//! A signature proves the **payload**; the payload names the digest. So a
//! layer counts only when a trusted key verifies its exact payload bytes and
//! that payload's `critical.image.docker-manifest-digest` is the revision's
//! digest. A changed payload no longer verifies: it reads as signed by an
//! untrusted key, which is all a verifier can know of it.
//!
//! Crates: RustCrypto's `p256` (ECDSA P-256 with SHA-256 and DER-encoded
//! signatures: what `cosign generate-key-pair` and `cosign sign --key`
//! produce) and `ed25519-dalek` (Ed25519 over the raw payload, as cosign and
//! sigstore-rs verify it), both reading SPKI PEM public keys. Not sigstore-rs:
//! it fetches through its own OCI client on tokio, and the rules stay pure;
//! the scanner already holds the manifest and blob bytes. The payload is
//! parsed here with serde. Sigstore bundles (cosign v3's default format) are
//! judged in [`bundle`]; a revision's evidence holds both kinds, and its
//! best verdict decides.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::RulesError;

mod attestation;
pub mod bundle;
mod keyless;
mod simple;
mod tlog;
mod trusted_root;

pub use attestation::{AttestationRule, AttestationSpec};
pub use keyless::{Identity, IdentitySpec};
pub use trusted_root::{TRUSTED_ROOT_MEDIA_TYPE, TrustedRoot};

pub use simple::{
    SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE, SIMPLE_SIGNING_TYPE, SignedPayload,
    simple_signing_payload,
};

/// What a JukeBox does with a revision that is not verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VerifyMode {
    /// Never offered, installed or upgraded to.
    Enforce,
    /// Offered, marked.
    Warn,
}

#[derive(Debug, Clone)]
pub(crate) enum PublicKey {
    P256(p256::ecdsa::VerifyingKey),
    Ed25519(ed25519_dalek::VerifyingKey),
}

impl PublicKey {
    /// A DER SubjectPublicKeyInfo's key (a trusted root's, a certificate's).
    pub(crate) fn from_spki_der(der: &[u8]) -> Result<Self, String> {
        use ed25519_dalek::pkcs8::DecodePublicKey as _;
        if let Ok(key) = p256::ecdsa::VerifyingKey::from_public_key_der(der) {
            return Ok(PublicKey::P256(key));
        }
        ed25519_dalek::VerifyingKey::from_public_key_der(der)
            .map(PublicKey::Ed25519)
            .map_err(|_| "a public key of another kind than ECDSA P-256 or Ed25519".to_string())
    }

    /// Whether this key verifies `signature` over `message`; `None` when the
    /// bytes are no signature of this key's kind.
    pub(crate) fn verifies(&self, message: &[u8], signature: &[u8]) -> Option<bool> {
        match self {
            PublicKey::P256(key) => {
                use p256::ecdsa::signature::Verifier as _;
                let signature = p256::ecdsa::Signature::from_der(signature).ok()?;
                Some(key.verify(message, &signature).is_ok())
            }
            PublicKey::Ed25519(key) => {
                let signature = ed25519_dalek::Signature::from_slice(signature).ok()?;
                Some(key.verify_strict(message, &signature).is_ok())
            }
        }
    }
}

/// One trusted public key.
#[derive(Debug, Clone)]
pub struct TrustedKey {
    name: String,
    /// `sha256:<hex>` of the key's DER SubjectPublicKeyInfo.
    fingerprint: String,
    key: PublicKey,
    /// Its DER SubjectPublicKeyInfo, as a log entry records it.
    pub(crate) der: Vec<u8>,
}

impl TrustedKey {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Whether this key verifies `signature` over `payload`; `None` when the
    /// bytes are no signature of this key's kind.
    fn verifies(&self, payload: &[u8], signature: &[u8]) -> Option<bool> {
        self.key.verifies(payload, signature)
    }
}

/// What a JukeBox trusts: keys, and identities under a trusted root.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    keys: Vec<TrustedKey>,
    identities: Vec<Identity>,
    root: Option<std::sync::Arc<TrustedRoot>>,
    /// `spec.verify.requireTransparencyLog`, defaulted (see [`Keyring::trusting`]).
    require_log: bool,
    /// `spec.verify.attestations`.
    attestations: Vec<AttestationRule>,
}

impl Keyring {
    /// The keys `(name, PEM)`; each must be an ECDSA P-256 or Ed25519 public
    /// key (`-----BEGIN PUBLIC KEY-----`, as `cosign.pub`). The error names
    /// the key that is not.
    pub fn parse<'a>(keys: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self, RulesError> {
        let mut out = Vec::new();
        for (name, pem) in keys {
            let (key, der) = read_public_key(pem.trim())
                .map_err(|problem| RulesError::SigningKey { name: name.to_string(), problem })?;
            let fingerprint = format!("sha256:{}", hex::encode(Sha256::digest(&der)));
            let name = if name.trim().is_empty() { fingerprint[..19].to_string() } else { name.to_string() };
            out.push(TrustedKey { name, fingerprint, key, der });
        }
        Ok(Self { keys: out, ..Self::default() })
    }

    /// These keys, and `identities` signing keyless under `root`; a
    /// signature counts only with a verified transparency log entry when
    /// `require_log` says so, by default whenever a root is given (the log
    /// is then checkable). Identities need a root; so does requiring the log.
    pub fn trusting(
        mut self,
        identities: Vec<Identity>,
        root: Option<TrustedRoot>,
        require_log: Option<bool>,
    ) -> Result<Self, RulesError> {
        let problem = |problem: &str| RulesError::TrustedRoot { problem: problem.to_string() };
        if root.is_none() && !identities.is_empty() {
            return Err(problem("identities are verified against a trusted root, and none is given"));
        }
        if root.is_none() && require_log == Some(true) {
            return Err(problem("requireTransparencyLog needs the log's key, and no trusted root is given"));
        }
        self.require_log = require_log.unwrap_or(root.is_some());
        self.identities = identities;
        self.root = root.map(std::sync::Arc::new);
        Ok(self)
    }

    pub fn identities(&self) -> &[Identity] {
        &self.identities
    }

    /// These, and a verified revision must also carry each of `attestations`.
    pub fn requiring(mut self, attestations: Vec<AttestationRule>) -> Self {
        self.attestations = attestations;
        self
    }

    pub fn attestations(&self) -> &[AttestationRule] {
        &self.attestations
    }

    /// The predicate types of the required attestations: the bundles a
    /// reader must fetch beside signatures.
    pub fn attestation_types(&self) -> Vec<String> {
        self.attestations.iter().map(|a| a.predicate_type().to_string()).collect()
    }

    pub(crate) fn root(&self) -> Option<&TrustedRoot> {
        self.root.as_deref()
    }

    /// The trusted root when signatures must be proven by its log.
    pub(crate) fn log_required(&self) -> Option<&TrustedRoot> {
        self.root().filter(|_| self.require_log)
    }

    pub fn keys(&self) -> &[TrustedKey] {
        &self.keys
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.identities.is_empty()
    }

    /// The name of the trusted key that verifies `signature` over `message`;
    /// else the verdict on it: another key's (`UntrustedKey`), or no
    /// signature at all (`Malformed`).
    pub(crate) fn verifier_of(&self, message: &[u8], signature: &[u8]) -> Result<&str, Verdict> {
        self.trusted_key(message, signature).map(TrustedKey::name)
    }

    /// [`Keyring::verifier_of`], the key itself.
    pub(crate) fn trusted_key(&self, message: &[u8], signature: &[u8]) -> Result<&TrustedKey, Verdict> {
        let mut readable = false;
        for key in &self.keys {
            match key.verifies(message, signature) {
                Some(true) => return Ok(key),
                Some(false) => readable = true,
                None => {}
            }
        }
        if readable || (self.keys.is_empty() && looks_like_signature(signature)) {
            Err(Verdict::UntrustedKey)
        } else {
            Err(Verdict::Malformed {
                problem: format!("{} bytes that are no ECDSA (DER) nor Ed25519 signature", signature.len()),
            })
        }
    }

    /// What identifies this set of keys: a verdict reached with another
    /// fingerprint is decided again. Names count (a verdict names its key).
    pub fn fingerprint(&self) -> String {
        let mut entries: Vec<String> =
            self.keys.iter().map(|k| format!("{}={}", k.name, k.fingerprint)).collect();
        entries.extend(self.identities.iter().map(|i| format!("identity {}", i.describe())));
        entries.extend(self.root().map(|r| format!("root {} log {}", r.digest(), self.require_log)));
        entries.extend(self.attestations.iter().map(|a| format!("attestation {}", a.describe())));
        entries.sort();
        hex::encode(Sha256::digest(entries.join("\n").as_bytes()))
    }
}

fn read_public_key(pem: &str) -> Result<(PublicKey, Vec<u8>), String> {
    use ed25519_dalek::pkcs8::{DecodePublicKey as _, EncodePublicKey as _};
    if let Ok(key) = p256::ecdsa::VerifyingKey::from_public_key_pem(pem) {
        let der = p256::PublicKey::from(&key).to_public_key_der().map_err(|e| e.to_string())?;
        return Ok((PublicKey::P256(key), der.as_bytes().to_vec()));
    }
    match ed25519_dalek::VerifyingKey::from_public_key_pem(pem) {
        Ok(key) => {
            let der = key.to_public_key_der().map_err(|e| e.to_string())?;
            Ok((PublicKey::Ed25519(key), der.as_bytes().to_vec()))
        }
        Err(e) => Err(format!(
            "not a PEM public key of ECDSA P-256 or Ed25519 ({e}); give the content of a cosign.pub \
             (-----BEGIN PUBLIC KEY-----)"
        )),
    }
}

/// What a revision's signature manifest holds, as read: the signature
/// layers of a `.sig` manifest, the Sigstore bundles (their JSON bytes) a
/// referrers index lists, and what could not be read of it (a layer without
/// a signature).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    pub layers: Vec<SignedPayload>,
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "base64_list")]
    pub bundles: Vec<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// The attestation predicate types it was read for (their bundles are
    /// in `bundles`): evidence read for fewer than a policy requires is read again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub predicates: Vec<String>,
}

impl Evidence {
    /// Whether it was read for every predicate type in `wanted`.
    pub fn covers(&self, wanted: &[String]) -> bool {
        wanted.iter().all(|w| self.predicates.contains(w))
    }
}

/// The decision on one revision's signatures.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "camelCase")]
pub enum Verdict {
    /// A trusted key signed a payload naming this digest; `reference` is the
    /// payload's `critical.identity.docker-reference`.
    Verified { key: String, reference: String },
    /// No signature (no `.sig` tag, or no signature layer in it).
    Unsigned,
    /// Signatures that no trusted key verifies (another key, or a payload
    /// changed after signing).
    UntrustedKey,
    /// A trusted key's signature of another digest (a signature copied from
    /// another revision).
    DigestMismatch { signed: String },
    /// A trusted key signed this digest for another repository than the one
    /// it was found in, and the JukeBox requires the signed reference
    /// (`spec.verify.requireReference`, [`Verdict::bound_to`]): `reference`
    /// is the payload's `docker-reference`.
    ReferenceMismatch { reference: String },
    /// Not a readable cosign signature.
    Malformed { problem: String },
    /// Verified, but without an attestation the JukeBox requires
    /// (`spec.verify.attestations`): `predicate_type` what it asks (and of
    /// which builder), `problem` why none holds.
    Unattested { predicate_type: String, problem: String },
}

impl Verdict {
    pub fn is_verified(&self) -> bool {
        matches!(self, Verdict::Verified { .. })
    }

    /// "verified by release-2026", "signed by an untrusted key", ….
    pub fn describe(&self) -> String {
        match self {
            Verdict::Verified { key, .. } => format!("verified by {key}"),
            Verdict::Unsigned => "unsigned".into(),
            Verdict::UntrustedKey => "signed by an untrusted key".into(),
            Verdict::DigestMismatch { signed } => format!("its signature is of another digest ({signed})"),
            Verdict::ReferenceMismatch { reference } => {
                format!(
                    "signed for {reference}, not for this repository (the JukeBox requires the signed reference)"
                )
            }
            Verdict::Malformed { problem } => format!("malformed signature: {problem}"),
            Verdict::Unattested { predicate_type, problem } => {
                format!("no verified attestation of {predicate_type} ({problem}), which the JukeBox requires")
            }
        }
    }

    /// Under `spec.verify.requireReference`: a verified signature counts only
    /// when its payload's `docker-reference` names `repository`
    /// (`registry/path`, where the revision was found; its tag or digest
    /// dropped, Docker Hub's host spellings taken as one). Simple signing
    /// binds a digest, and the reference is the only part of the payload
    /// that says where it was meant to be published.
    pub fn bound_to(self, repository: &str) -> Verdict {
        match self {
            Verdict::Verified { reference, .. } if repository_of(&reference) != repository_of(repository) => {
                Verdict::ReferenceMismatch { reference }
            }
            other => other,
        }
    }

    /// Whether `mode` lets a revision with this verdict be installed.
    pub fn allows(&self, mode: Option<VerifyMode>) -> bool {
        mode != Some(VerifyMode::Enforce) || self.is_verified()
    }

    /// Of two verdicts on one revision (several signatures), the one that
    /// decides: the better ranked, `self` on a tie.
    pub fn better(self, other: Verdict) -> Verdict {
        if other.rank() > self.rank() { other } else { self }
    }

    /// Preference when a revision has several signatures: the best one decides.
    fn rank(&self) -> u8 {
        match self {
            Verdict::Verified { .. } => 7,
            Verdict::Unattested { .. } => 6,
            Verdict::ReferenceMismatch { .. } => 5,
            Verdict::DigestMismatch { .. } => 4,
            Verdict::UntrustedKey => 3,
            Verdict::Malformed { .. } => 2,
            Verdict::Unsigned => 1,
        }
    }
}

/// The repository a Docker reference names: without its tag or digest,
/// Docker Hub's hosts as `docker.io`, its official images under `library/`.
fn repository_of(reference: &str) -> String {
    let name = reference.split('@').next().unwrap_or(reference);
    let name = match name.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => name,
        _ => name,
    };
    let (host, path) = name.split_once('/').unwrap_or(("docker.io", name));
    match host {
        "docker.io" | "index.docker.io" | "registry-1.docker.io" if !path.contains('/') => {
            format!("docker.io/library/{path}")
        }
        "docker.io" | "index.docker.io" | "registry-1.docker.io" => format!("docker.io/{path}"),
        host => format!("{host}/{path}"),
    }
}

/// The verdict on the revision at `subject_digest`, whose signature
/// manifests held `evidence` (`None`: it has none): the best of its bundles'
/// and its `.sig` layers' verdicts.
pub fn verify(subject_digest: &str, evidence: Option<&Evidence>, keys: &Keyring) -> Verdict {
    let Some(evidence) = evidence else { return Verdict::Unsigned };
    let verdict = signed(subject_digest, evidence, keys);
    match verdict.is_verified() {
        true => attestation::unattested(subject_digest, evidence, keys).unwrap_or(verdict),
        false => verdict,
    }
}

/// The best verdict of `evidence`'s signatures.
fn signed(subject_digest: &str, evidence: &Evidence, keys: &Keyring) -> Verdict {
    let mut best = match evidence.problems.first() {
        Some(problem) => Verdict::Malformed { problem: problem.clone() },
        None => Verdict::Unsigned,
    };
    let bundles = evidence.bundles.iter().map(|b| bundle::verify_bundle(subject_digest, b, keys));
    let layers = evidence.layers.iter().map(|l| simple::verify_layer(subject_digest, l, keys));
    for verdict in bundles.chain(layers) {
        if verdict.is_verified() {
            return verdict;
        }
        best = best.better(verdict);
    }
    best
}

/// Without keys to try, whether the bytes have a signature's shape.
fn looks_like_signature(bytes: &[u8]) -> bool {
    p256::ecdsa::Signature::from_der(bytes).is_ok() || bytes.len() == ed25519_dalek::SIGNATURE_LENGTH
}

mod base64_list {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer, ser::SerializeSeq as _};

    pub fn serialize<S: Serializer>(items: &[Vec<u8>], serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(items.len()))?;
        for item in items {
            seq.serialize_element(&base64::engine::general_purpose::STANDARD.encode(item))?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Vec<u8>>, D::Error> {
        let texts = Vec::<String>::deserialize(deserializer)?;
        texts
            .iter()
            .map(|t| base64::engine::general_purpose::STANDARD.decode(t).map_err(serde::de::Error::custom))
            .collect()
    }
}

/// The other version tags of `of`'s repository that name its digest, when
/// that digest is verified (#65 item 8): simple signing binds a digest,
/// never a tag, so a pusher who re-tags an old signed revision as a new
/// version makes the fleet "upgrade" to old content that still verifies.
/// Not refused (a re-publication under a second tag is legitimate): shown
/// on the catalog and in `Explain`, so that an operator can tell. In
/// listing order; empty for an unverified revision or one without a digest.
pub fn same_verified_digest<'a>(packages: &'a [crate::Package], of: &crate::Package) -> Vec<&'a str> {
    let Some(digest) = of.digest.as_deref().filter(|d| !d.is_empty()) else { return Vec::new() };
    if !of.signature.as_ref().is_some_and(Verdict::is_verified) {
        return Vec::new();
    }
    let mut tags: Vec<&str> = packages
        .iter()
        .filter(|p| p.registry == of.registry && p.image == of.image && p.tag != of.tag)
        .filter(|p| p.digest.as_deref() == Some(digest))
        .map(|p| p.tag.as_str())
        .collect();
    tags.dedup();
    tags
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sigstore-rs' own test vector: a signature `cosign sign --key` made of
    /// busybox (sigstore/sigstore-rs, `src/cosign/signature_layers.rs`,
    /// `build_correct_signature_layer_without_bundle`; the same vector is in
    /// `verification_constraint/public_key_verifier.rs`' tests). Its payload
    /// is `serde_json::to_vec` of the JSON written there.
    const COSIGN_PUBLIC_KEY: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAENptdY/l3nB0yqkXLBWkZWQwo6+cu
OSWS1X9vPavpiQOoTTGC0xX57OojUadxF1cdQmrsiReWg2Wn4FneJfa8xw==
-----END PUBLIC KEY-----";
    const COSIGN_SIGNATURE: &str =
        "MEUCIQD6q/COgzOyW0YH1Dk+CCYSt4uAhm3FDHUwvPI55zwnlwIgE0ZK58ZOWpZw8YVmBapJhBqCfdPekIknimuO0xH8Jh8=";
    const COSIGN_DIGEST: &str = "sha256:f3cfc9d0dbf931d3db4685ec659b7ac68e2a578219da4aae65427886e649b06b";
    const COSIGN_REFERENCE: &str = "registry-testing.svc.lan/busybox";
    /// The other key of the same tests ("is_signed_by_key_fails_when_signature_is_not_valid").
    const OTHER_PUBLIC_KEY: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAETJP9cqpUQsn2ggmJniWGjHdlsHzD
JsB89BPhZYch0U0hKANx5TY+ncrm0s8bfJxxHoenAEFhwhuXeb4PqIrtoQ==
-----END PUBLIC KEY-----";

    fn cosign_evidence() -> Evidence {
        Evidence {
            layers: vec![SignedPayload {
                payload: simple_signing_payload(COSIGN_REFERENCE, COSIGN_DIGEST),
                signature: COSIGN_SIGNATURE.into(),
            }],
            ..Evidence::default()
        }
    }

    #[test]
    fn a_signature_made_by_cosign_verifies_with_its_key_and_no_other() {
        let trusted = Keyring::parse([("cosign", COSIGN_PUBLIC_KEY)]).unwrap();
        assert_eq!(
            verify(COSIGN_DIGEST, Some(&cosign_evidence()), &trusted),
            Verdict::Verified { key: "cosign".into(), reference: COSIGN_REFERENCE.into() }
        );
        let other = Keyring::parse([("other", OTHER_PUBLIC_KEY)]).unwrap();
        assert_eq!(verify(COSIGN_DIGEST, Some(&cosign_evidence()), &other), Verdict::UntrustedKey);
        let both = Keyring::parse([("other", OTHER_PUBLIC_KEY), ("cosign", COSIGN_PUBLIC_KEY)]).unwrap();
        assert!(verify(COSIGN_DIGEST, Some(&cosign_evidence()), &both).is_verified());
    }

    #[test]
    fn a_trusted_signature_counts_only_for_the_digest_its_payload_names() {
        let trusted = Keyring::parse([("cosign", COSIGN_PUBLIC_KEY)]).unwrap();
        let elsewhere = format!("sha256:{}", "0".repeat(64));
        assert_eq!(
            verify(&elsewhere, Some(&cosign_evidence()), &trusted),
            Verdict::DigestMismatch { signed: COSIGN_DIGEST.into() }
        );
    }

    #[test]
    fn a_changed_payload_or_a_truncated_signature_is_refused() {
        let trusted = Keyring::parse([("cosign", COSIGN_PUBLIC_KEY)]).unwrap();
        let mut tampered = cosign_evidence();
        tampered.layers[0].payload = simple_signing_payload("registry-testing.svc.lan/other", COSIGN_DIGEST);
        assert_eq!(verify(COSIGN_DIGEST, Some(&tampered), &trusted), Verdict::UntrustedKey);
        let mut truncated = cosign_evidence();
        truncated.layers[0].signature = COSIGN_SIGNATURE[..40].into();
        assert!(
            matches!(verify(COSIGN_DIGEST, Some(&truncated), &trusted), Verdict::Malformed { .. }),
            "a truncated signature is no signature"
        );
        assert_eq!(verify(COSIGN_DIGEST, None, &trusted), Verdict::Unsigned);
        assert_eq!(verify(COSIGN_DIGEST, Some(&Evidence::default()), &trusted), Verdict::Unsigned);
    }

    #[test]
    fn a_key_that_is_not_a_public_key_is_named() {
        let error =
            Keyring::parse([("release", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----")])
                .unwrap_err()
                .to_string();
        assert!(error.contains("\"release\"") && error.contains("cosign.pub"), "{error}");
    }

    #[test]
    fn an_ed25519_key_verifies_the_raw_payload() {
        use ed25519_dalek::{Signer as _, pkcs8::EncodePublicKey as _};
        let signing = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]);
        let pem = signing.verifying_key().to_public_key_pem(Default::default()).unwrap();
        let payload = simple_signing_payload("r/x", COSIGN_DIGEST);
        use base64::Engine as _;
        let signature = base64::engine::general_purpose::STANDARD.encode(signing.sign(&payload).to_bytes());
        let evidence = Evidence { layers: vec![SignedPayload { payload, signature }], ..Evidence::default() };
        let keys = Keyring::parse([("ed", pem.as_str())]).unwrap();
        assert_eq!(
            verify(COSIGN_DIGEST, Some(&evidence), &keys),
            Verdict::Verified { key: "ed".into(), reference: "r/x".into() }
        );
    }

    #[test]
    fn the_fingerprint_changes_with_the_keys() {
        let one = Keyring::parse([("cosign", COSIGN_PUBLIC_KEY)]).unwrap();
        let two = Keyring::parse([("cosign", COSIGN_PUBLIC_KEY), ("other", OTHER_PUBLIC_KEY)]).unwrap();
        let swapped = Keyring::parse([("other", OTHER_PUBLIC_KEY), ("cosign", COSIGN_PUBLIC_KEY)]).unwrap();
        assert_ne!(one.fingerprint(), two.fingerprint());
        assert_eq!(two.fingerprint(), swapped.fingerprint(), "order does not matter");
    }

    #[test]
    fn evidence_round_trips_through_json() {
        let evidence = cosign_evidence();
        let text = serde_json::to_string(&evidence).unwrap();
        assert_eq!(serde_json::from_str::<Evidence>(&text).unwrap(), evidence);
    }

    /// `spec.verify.requireReference`: sigstore-rs' vector, signed for
    /// `registry-testing.svc.lan/busybox`, counts only there (its tag or
    /// digest aside); Docker Hub's spellings of one repository are one.
    #[test]
    fn a_required_reference_binds_a_verified_signature_to_its_repository() {
        let keys = Keyring::parse([("cosign", COSIGN_PUBLIC_KEY)]).unwrap();
        let verdict = verify(COSIGN_DIGEST, Some(&cosign_evidence()), &keys);
        assert!(verdict.is_verified(), "{verdict:?}");
        for found_in in [
            COSIGN_REFERENCE,
            "registry-testing.svc.lan/busybox:1.36",
            "registry-testing.svc.lan/busybox@sha256:00",
        ] {
            assert!(verdict.clone().bound_to(found_in).is_verified(), "{found_in}");
        }
        for elsewhere in
            ["registry-testing.svc.lan/other", "evil.example/busybox", "registry-testing.svc.lan/busybox/x"]
        {
            assert_eq!(
                verdict.clone().bound_to(elsewhere),
                Verdict::ReferenceMismatch { reference: COSIGN_REFERENCE.into() },
                "{elsewhere}"
            );
        }
        let hub = Verdict::Verified { key: "k".into(), reference: "index.docker.io/library/busybox".into() };
        assert!(hub.clone().bound_to("docker.io/busybox").is_verified());
        assert!(!hub.bound_to("docker.io/someone/busybox").is_verified());
        // Only a verified signature is bound: any other verdict stays what it is.
        assert_eq!(Verdict::UntrustedKey.bound_to("evil.example/x"), Verdict::UntrustedKey);
    }

    #[test]
    fn item_8_a_verified_digest_under_two_version_tags_is_told_and_an_unverified_one_is_not() {
        let content = crate::PackageContent::minimal("apps", "web", crate::PackageType::Tenant);
        let at = |tag: &str, digest: &str, verified: bool| {
            let mut p =
                crate::Package::new("r.example", "apps/web", tag, content.clone()).with_digest(digest);
            p.signature = Some(if verified {
                Verdict::Verified { key: "release".into(), reference: "r.example/apps/web".into() }
            } else {
                Verdict::Unsigned
            });
            p
        };
        // The attack: 0.1.0 (known bugs, signed) pushed again as 0.9.0.
        let packages = [
            at("0.9.0", "sha256:old", true),
            at("0.2.0", "sha256:new", true),
            at("0.1.0", "sha256:old", true),
        ];
        assert_eq!(same_verified_digest(&packages, &packages[0]), ["0.1.0"]);
        assert_eq!(same_verified_digest(&packages, &packages[2]), ["0.9.0"]);
        assert!(same_verified_digest(&packages, &packages[1]).is_empty());
        let mut elsewhere = at("0.1.0", "sha256:old", true);
        elsewhere.image = "apps/other".into();
        assert!(
            same_verified_digest(&[packages[0].clone(), elsewhere], &packages[0]).is_empty(),
            "one repository"
        );
        let unsigned = [at("0.9.0", "sha256:old", false), at("0.1.0", "sha256:old", false)];
        assert!(same_verified_digest(&unsigned, &unsigned[0]).is_empty(), "only a verified digest is told");
    }
}
