//! cosign signatures for test fixtures, in cosign's own format: an ECDSA
//! P-256 key (what `cosign generate-key-pair` makes), the simple-signing
//! payload (`vynil_rules::signature::simple_signing_payload`, byte for byte
//! cosign's), its SHA-256 ECDSA signature DER-encoded and base64'd in the
//! layer annotation `dev.cosignproject.cosign/signature`, pushed as the
//! `sha256-<hex>.sig` manifest ([`crate::Publisher::sign`]). The rules' tests
//! check that a signature made by cosign itself verifies the same way.

use base64::Engine as _;
use p256::ecdsa::{SigningKey, signature::Signer as _};
use sha2::{Digest as _, Sha256};
use vynil_rules::signature::simple_signing_payload;

/// A test key pair, derived from a label (the same label, the same key).
#[derive(Clone)]
pub struct Signer {
    key: SigningKey,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer")
    }
}

impl Signer {
    pub fn from_label(label: &str) -> Self {
        let mut seed: [u8; 32] = Sha256::digest(label.as_bytes()).into();
        loop {
            if let Ok(key) = SigningKey::from_slice(&seed) {
                return Self { key };
            }
            seed = Sha256::digest(seed).into();
        }
    }

    pub(crate) fn key(&self) -> &SigningKey {
        &self.key
    }

    /// The public key as a `cosign.pub` holds it.
    pub fn public_pem(&self) -> String {
        use p256::pkcs8::EncodePublicKey as _;
        self.key.verifying_key().to_public_key_pem(Default::default()).unwrap_or_default()
    }

    /// The base64 DER signature of `payload`, as cosign writes it.
    pub fn sign(&self, payload: &[u8]) -> String {
        let signature: p256::ecdsa::Signature = self.key.sign(payload);
        base64::engine::general_purpose::STANDARD.encode(signature.to_der())
    }
}

/// One layer of a `.sig` manifest: a payload and the signature annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureLayer {
    pub payload: Vec<u8>,
    pub signature: String,
}

impl SignatureLayer {
    /// `signer`'s signature of `digest` pushed as `reference` (`registry/repository`).
    pub fn by(signer: &Signer, reference: &str, digest: &str) -> Self {
        let payload = simple_signing_payload(reference, digest);
        Self { signature: signer.sign(&payload), payload }
    }
}

/// An in-toto Statement about the manifest `digest` (`sha256:<hex>`), as
/// cosign v3 writes it: `predicate_type` cosign's image signature
/// (`vynil_rules::signature::bundle::SIGN_PREDICATE_TYPE`) or an
/// attestation's, the subject without a name (cosign v3 leaves it out).
pub fn statement(digest: &str, predicate_type: &str, predicate: serde_json::Value) -> Vec<u8> {
    let hex = digest.trim_start_matches("sha256:");
    let value = serde_json::json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"digest": {"sha256": hex}}],
        "predicateType": predicate_type,
        "predicate": predicate,
    });
    serde_json::to_vec(&value).unwrap_or_default()
}

impl Signer {
    /// A Sigstore bundle v0.3 of `statement` signed with this key, as
    /// `cosign sign --key` v3 writes it: a DSSE envelope whose signature is
    /// over the envelope's PAE (`vynil_rules::signature::bundle::pae`), the
    /// public key's hint as verification material, no log entry.
    pub fn bundle(&self, statement: &[u8]) -> Vec<u8> {
        use vynil_rules::signature::bundle::{BUNDLE_MEDIA_TYPES, IN_TOTO_PAYLOAD_TYPE, pae};
        let b64 = base64::engine::general_purpose::STANDARD;
        let hint = b64.encode(Sha256::digest(self.public_pem().as_bytes()));
        let value = serde_json::json!({
            "mediaType": BUNDLE_MEDIA_TYPES[0],
            "verificationMaterial": {"publicKey": {"hint": hint}, "tlogEntries": []},
            "dsseEnvelope": {
                "payload": b64.encode(statement),
                "payloadType": IN_TOTO_PAYLOAD_TYPE,
                "signatures": [{"sig": self.sign(&pae(IN_TOTO_PAYLOAD_TYPE, statement)), "keyid": ""}],
            },
        });
        serde_json::to_vec(&value).unwrap_or_default()
    }
}
