//! Sigstore bundles: what `cosign sign` writes by default since cosign v3.0.0
//! (`--new-bundle-format`, on by default), decided from the bundle's bytes.
//!
//! A bundle (`application/vnd.dev.sigstore.bundle.v0.3+json`, the JSON of
//! sigstore/protobuf-specs `Bundle`) holds a DSSE envelope over an in-toto
//! Statement. cosign's image signature is the Statement whose
//! `predicateType` is [`SIGN_PREDICATE_TYPE`] and whose `subject` names the
//! image manifest's digest (`name` optional: cosign v3 leaves it out;
//! sigstore/cosign `specs/BUNDLE_SPEC.md`). A bundle with another predicate
//! type is an attestation, never a signature of the image.
//!
//! What is checked here, for a bundle whose verification material is a
//! public key (`cosign sign --key`): the envelope's payload type is in-toto,
//! a trusted key verifies a signature over the DSSE pre-authentication
//! encoding (PAE, secure-systems-lab/dsse `protocol.md`) of that exact
//! payload — never over the payload alone — and only then the Statement is
//! read: its `_type`, its predicate type, a subject whose `sha256` is the
//! revision's digest. Written here (about 30 lines, specified byte for byte)
//! because `sigstore` 0.15 refuses keyed bundles (`bundle/verify/models.rs`)
//! and brings its own OCI and TUF stacks; the rules stay pure.
//!
//! Not yet checked: the Rekor entry a keyed bundle carries (a JukeBox has
//! no log key to check it with until trusted roots are read), and keyless
//! bundles (a Fulcio certificate): those are judged "signed by an untrusted
//! key" until identities are read, which is what a verifier without the
//! trust material can say of them.

use base64::Engine as _;
use serde::Deserialize;

use super::keyless::{self, Keyless};
use super::tlog::{self, Entry, Signed};
use super::trusted_root::RawBytes;
use super::{Keyring, Verdict};

/// The bundle media types cosign and sigstore clients write (v0.3 is
/// cosign v3's; the older two are still read by cosign).
pub const BUNDLE_MEDIA_TYPES: [&str; 3] = [
    "application/vnd.dev.sigstore.bundle.v0.3+json",
    "application/vnd.dev.sigstore.bundle+json;version=0.2",
    "application/vnd.dev.sigstore.bundle+json;version=0.1",
];
/// The predicate type of cosign's image signature Statement.
pub const SIGN_PREDICATE_TYPE: &str = "https://sigstore.dev/cosign/sign/v1";
/// The annotation cosign writes on a bundle's manifest (and on its entry in
/// a referrers index) naming the Statement's predicate type.
pub const PREDICATE_TYPE_ANNOTATION: &str = "dev.sigstore.bundle.predicateType";
/// DSSE's payload type of an in-toto Statement.
pub const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The Statement `_type`s in-toto defines (v1, and v0.1 still read by cosign).
pub(crate) const STATEMENT_TYPES: [&str; 2] =
    ["https://in-toto.io/Statement/v1", "https://in-toto.io/Statement/v0.1"];

/// Whether `media_type` (an artifact type or a layer's media type) is a
/// Sigstore bundle's.
pub fn is_bundle_media_type(media_type: &str) -> bool {
    BUNDLE_MEDIA_TYPES.contains(&media_type)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Bundle {
    media_type: String,
    #[serde(default)]
    verification_material: Material,
    dsse_envelope: Option<Envelope>,
    message_signature: Option<serde_json::Value>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Material {
    certificate: Option<RawBytes>,
    x509_certificate_chain: Option<Chain>,
    #[serde(default)]
    tlog_entries: Vec<Entry>,
}

#[derive(Deserialize)]
struct Chain {
    #[serde(default)]
    certificates: Vec<RawBytes>,
}

impl Material {
    /// The signer's certificate (base64 DER), when keyless.
    fn certificate(&self) -> Option<&str> {
        let chain = self.x509_certificate_chain.as_ref().and_then(|c| c.certificates.first());
        self.certificate.as_ref().or(chain).map(|c| c.raw_bytes.as_str())
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    payload: String,
    payload_type: String,
    signatures: Vec<EnvelopeSignature>,
}

#[derive(Deserialize)]
struct EnvelopeSignature {
    sig: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Statement {
    #[serde(rename = "_type")]
    kind: String,
    subject: Vec<Subject>,
    predicate_type: String,
}

#[derive(Deserialize)]
struct Subject {
    #[serde(default)]
    name: String,
    #[serde(default)]
    digest: std::collections::BTreeMap<String, String>,
}

/// DSSE's pre-authentication encoding of `payload` typed `payload_type`:
/// `"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`, lengths in ASCII
/// decimal (secure-systems-lab/dsse `protocol.md`). What a DSSE signature signs.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), payload.len()).into_bytes();
    out.extend_from_slice(payload);
    out
}

/// The verdict on the revision at `subject_digest` given one bundle's bytes.
/// An attestation (another predicate type) is no signature: `Unsigned`.
pub fn verify_bundle(subject_digest: &str, bundle: &[u8], keys: &Keyring) -> Verdict {
    match signed_statement(bundle, keys) {
        Ok((signer, payload)) => statement_verdict(subject_digest, &payload, signer),
        Err(verdict) => verdict,
    }
}

/// Who signed a bundle (a trusted key's or identity's name) and the
/// payload it signed, once its signature verifies as the policy asks (a
/// trusted key, or an identity under the trusted root; the log when
/// required); else the verdict on it. The payload is not read yet.
pub(crate) fn signed_statement<'k>(bundle: &[u8], keys: &'k Keyring) -> Result<(&'k str, Vec<u8>), Verdict> {
    let malformed = |problem: String| Verdict::Malformed { problem };
    let bundle: Bundle =
        serde_json::from_slice(bundle).map_err(|e| malformed(format!("not a Sigstore bundle: {e}")))?;
    if !is_bundle_media_type(&bundle.media_type) {
        return Err(malformed(format!(
            "the bundle's media type {:?} is none of Sigstore's",
            bundle.media_type
        )));
    }
    let Some(envelope) = bundle.dsse_envelope else {
        return Err(match bundle.message_signature {
            Some(_) => malformed("a message signature bundle signs a blob, not an image's Statement".into()),
            None => malformed("the bundle holds no DSSE envelope".into()),
        });
    };
    if envelope.payload_type != IN_TOTO_PAYLOAD_TYPE {
        return Err(malformed(format!(
            "the envelope's payload type is {:?}, not {IN_TOTO_PAYLOAD_TYPE:?}",
            envelope.payload_type
        )));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let payload = b64
        .decode(envelope.payload.trim())
        .map_err(|_| malformed("the envelope's payload is not base64".into()))?;
    let material = &bundle.verification_material;
    let signed = pae(&envelope.payload_type, &payload);
    let signatures: Vec<Vec<u8>> = envelope
        .signatures
        .iter()
        .filter_map(|s| b64.decode(s.sig.trim()).ok())
        .filter(|s| !s.is_empty())
        .collect();
    if signatures.is_empty() {
        return Err(malformed("the envelope holds no base64 signature".into()));
    }
    if let Some(certificate) = material.certificate() {
        let certificate = b64
            .decode(certificate.trim())
            .map_err(|_| malformed("the bundle's certificate is not base64".into()))?;
        // Keyless: trusted through an identity, under a trusted root.
        let Some(root) = keys.root() else { return Err(Verdict::UntrustedKey) };
        let bundle = Keyless {
            certificate: &certificate,
            entries: &material.tlog_entries,
            signed: &signed,
            payload: &payload,
            signatures: &signatures,
        };
        let identity = keyless::signer(&bundle, keys.identities(), root)?;
        return Ok((identity, payload));
    }
    let mut best: Option<Verdict> = None;
    for signature in &signatures {
        let verdict = match keys.trusted_key(&signed, signature) {
            Ok(key) => match keys.log_required() {
                None => return Ok((key.name(), payload)),
                Some(root) => {
                    let logged = Signed { payload: &payload, signature, signer: &key.der };
                    match tlog::logged(&material.tlog_entries, root, &logged) {
                        Ok(_) => return Ok((key.name(), payload)),
                        Err(problem) => malformed(format!(
                            "signed by {}, and not proven by the transparency log the JukeBox requires: {problem}",
                            key.name()
                        )),
                    }
                }
            },
            Err(verdict) => verdict,
        };
        best = Some(match best {
            Some(best) => best.better(verdict),
            None => verdict,
        });
    }
    Err(best.unwrap_or(Verdict::Malformed { problem: "the envelope holds no signature".into() }))
}

/// A Statement `key` verified: what it says of `subject_digest`.
fn statement_verdict(subject_digest: &str, payload: &[u8], key: &str) -> Verdict {
    let statement: Statement = match serde_json::from_slice(payload) {
        Ok(statement) => statement,
        Err(e) => {
            return Verdict::Malformed {
                problem: format!("the signed payload is no in-toto Statement: {e}"),
            };
        }
    };
    if !STATEMENT_TYPES.contains(&statement.kind.as_str()) {
        return Verdict::Malformed { problem: format!("the Statement's _type is {:?}", statement.kind) };
    }
    if statement.predicate_type != SIGN_PREDICATE_TYPE {
        // An attestation: signed, but not a signature of the image.
        return Verdict::Unsigned;
    }
    let (algorithm, hex) = subject_digest.split_once(':').unwrap_or(("", subject_digest));
    let signed = statement.subject.iter().find(|s| s.digest.get(algorithm).is_some_and(|d| d == hex));
    match signed {
        Some(subject) => Verdict::Verified { key: key.to_string(), reference: subject.name.clone() },
        None => Verdict::DigestMismatch {
            signed: statement
                .subject
                .iter()
                .find_map(|s| s.digest.iter().next().map(|(a, d)| format!("{a}:{d}")))
                .unwrap_or_else(|| "no digest".into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::{ecdsa::signature::Signer as _, pkcs8::EncodePublicKey as _};

    const DIGEST: &str = "sha256:f3cfc9d0dbf931d3db4685ec659b7ac68e2a578219da4aae65427886e649b06b";

    fn key(seed: u8) -> p256::ecdsa::SigningKey {
        p256::ecdsa::SigningKey::from_slice(&[seed; 32]).unwrap()
    }

    fn keyring(seed: u8) -> Keyring {
        let pem = key(seed).verifying_key().to_public_key_pem(Default::default()).unwrap();
        Keyring::parse([("release", pem.as_str())]).unwrap()
    }

    fn statement(predicate_type: &str, digest_hex: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"digest": {"sha256": digest_hex}}],
            "predicateType": predicate_type,
            "predicate": {},
        }))
        .unwrap()
    }

    /// A bundle as `cosign sign --key` v3 writes it: `signed` is what the
    /// key signs (the PAE of `payload`, unless a test says otherwise).
    fn bundle(seed: u8, payload: &[u8], signed: &[u8]) -> Vec<u8> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let signature: p256::ecdsa::Signature = key(seed).sign(signed);
        serde_json::to_vec(&serde_json::json!({
            "mediaType": BUNDLE_MEDIA_TYPES[0],
            "verificationMaterial": {"publicKey": {"hint": "aGludA=="}, "tlogEntries": []},
            "dsseEnvelope": {
                "payload": b64.encode(payload),
                "payloadType": IN_TOTO_PAYLOAD_TYPE,
                "signatures": [{"sig": b64.encode(signature.to_der()), "keyid": ""}],
            },
        }))
        .unwrap()
    }

    fn signed_bundle(seed: u8, payload: &[u8]) -> Vec<u8> {
        bundle(seed, payload, &pae(IN_TOTO_PAYLOAD_TYPE, payload))
    }

    fn hex_of(digest: &str) -> &str {
        digest.trim_start_matches("sha256:")
    }

    /// The example of secure-systems-lab/dsse `protocol.md` ("Signature
    /// definition"): PAE("http://example.com/HelloWorld", "hello world").
    #[test]
    fn the_pae_is_the_dsse_specs_own_example() {
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
    }

    /// A DSSE envelope a Sigstore client made: sigstore-rs'
    /// `tests/data/dsse/dsse.sigstore.json` (added in sigstore/sigstore-rs
    /// 2bf3b8e, "add more test cases"), its payload (an SLSA provenance
    /// Statement) and signature as published, and the public key of its
    /// leaf certificate (`openssl x509 -pubkey` of the first certificate of
    /// its chain). The signature verifies over our PAE of the payload, and
    /// over nothing else.
    #[test]
    fn a_dsse_signature_a_sigstore_client_made_verifies_over_our_pae() {
        const LEAF_KEY: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEeUE6Ox/414K0dBx3c3W+tQ7NTSlI
VV24YSbBl6VyuIV/i15KClSjUo2qQuKSU4EzmHf2+EMj/YHYHeBADkDxjw==
-----END PUBLIC KEY-----";
        const SIG: &str = "MEUCIFc/ByLhCkR2YtAMbmJp202ZmZ4XVGXFKi7r+q7lsNDPAiEA/JwX2PilCLvkqE9NJMFKNn2C2j8cH/zyFhQ65wri2HY=";
        let b64 = base64::engine::general_purpose::STANDARD;
        let payload = b64.decode(include_str!("testdata/sigstore-rs-dsse.payload.b64").trim()).unwrap();
        let sig = b64.decode(SIG).unwrap();
        let keys = Keyring::parse([("leaf", LEAF_KEY)]).unwrap();
        assert_eq!(keys.verifier_of(&pae(IN_TOTO_PAYLOAD_TYPE, &payload), &sig), Ok("leaf"));
        assert_eq!(keys.verifier_of(&payload, &sig), Err(Verdict::UntrustedKey), "DSSE signs the PAE");
        assert_eq!(
            keys.verifier_of(&pae("application/json", &payload), &sig),
            Err(Verdict::UntrustedKey),
            "the payload type is signed"
        );
    }

    #[test]
    fn a_keyed_bundle_verifies_with_its_key_and_no_other() {
        let bundle = signed_bundle(1, &statement(SIGN_PREDICATE_TYPE, hex_of(DIGEST)));
        assert_eq!(
            verify_bundle(DIGEST, &bundle, &keyring(1)),
            Verdict::Verified { key: "release".into(), reference: String::new() }
        );
        assert_eq!(verify_bundle(DIGEST, &bundle, &keyring(2)), Verdict::UntrustedKey);
    }

    #[test]
    fn a_bundle_counts_only_for_the_digest_its_statement_names() {
        let other = "0".repeat(64);
        let bundle = signed_bundle(1, &statement(SIGN_PREDICATE_TYPE, &other));
        assert_eq!(
            verify_bundle(DIGEST, &bundle, &keyring(1)),
            Verdict::DigestMismatch { signed: format!("sha256:{other}") }
        );
    }

    #[test]
    fn a_changed_payload_or_a_signature_over_the_bare_payload_does_not_verify() {
        let payload = statement(SIGN_PREDICATE_TYPE, hex_of(DIGEST));
        // Signed as is, not through the PAE: DSSE signs the encoding.
        assert_eq!(verify_bundle(DIGEST, &bundle(1, &payload, &payload), &keyring(1)), Verdict::UntrustedKey);
        // The payload changed after signing (another subject swapped in).
        let mut tampered: serde_json::Value = serde_json::from_slice(&signed_bundle(1, &payload)).unwrap();
        let swapped = statement(SIGN_PREDICATE_TYPE, &"1".repeat(64));
        tampered["dsseEnvelope"]["payload"] =
            base64::engine::general_purpose::STANDARD.encode(swapped).into();
        let tampered = serde_json::to_vec(&tampered).unwrap();
        assert_eq!(verify_bundle(DIGEST, &tampered, &keyring(1)), Verdict::UntrustedKey);
    }

    #[test]
    fn an_attestation_is_no_signature_of_the_image() {
        let provenance = signed_bundle(1, &statement("https://slsa.dev/provenance/v1", hex_of(DIGEST)));
        assert_eq!(verify_bundle(DIGEST, &provenance, &keyring(1)), Verdict::Unsigned);
    }

    #[test]
    fn what_is_no_keyed_image_bundle_is_told() {
        let keyless: serde_json::Value = serde_json::json!({
            "mediaType": BUNDLE_MEDIA_TYPES[0],
            "verificationMaterial": {"certificate": {"rawBytes": "MII="}},
            "dsseEnvelope": {"payload": "e30=", "payloadType": IN_TOTO_PAYLOAD_TYPE, "signatures": [{"sig": "MEUC"}]},
        });
        let keyless = serde_json::to_vec(&keyless).unwrap();
        // Keyless, and this JukeBox trusts keys only (no trusted root).
        assert_eq!(verify_bundle(DIGEST, &keyless, &keyring(1)), Verdict::UntrustedKey);
        let blob = br#"{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","messageSignature":{}}"#;
        let Verdict::Malformed { problem } = verify_bundle(DIGEST, blob, &keyring(1)) else { panic!() };
        assert!(problem.contains("blob"), "{problem}");
        let Verdict::Malformed { problem } = verify_bundle(DIGEST, b"{}", &keyring(1)) else { panic!() };
        assert!(problem.contains("not a Sigstore bundle"), "{problem}");
        let mut other_type: serde_json::Value =
            serde_json::from_slice(&signed_bundle(1, &statement(SIGN_PREDICATE_TYPE, hex_of(DIGEST))))
                .unwrap();
        other_type["dsseEnvelope"]["payloadType"] = "text/plain".into();
        let other_type = serde_json::to_vec(&other_type).unwrap();
        assert!(matches!(verify_bundle(DIGEST, &other_type, &keyring(1)), Verdict::Malformed { .. }));
    }

    #[test]
    fn a_revision_with_a_bundle_and_a_legacy_signature_takes_the_best_verdict() {
        let evidence = super::super::Evidence {
            bundles: vec![
                signed_bundle(2, &statement(SIGN_PREDICATE_TYPE, hex_of(DIGEST))),
                signed_bundle(1, &statement(SIGN_PREDICATE_TYPE, hex_of(DIGEST))),
            ],
            ..Default::default()
        };
        assert!(super::super::verify(DIGEST, Some(&evidence), &keyring(1)).is_verified());
        let text = serde_json::to_string(&evidence).unwrap();
        assert_eq!(serde_json::from_str::<super::super::Evidence>(&text).unwrap(), evidence, "cached as is");
    }
}
