//! cosign's legacy signatures ("simple signing"): the `sha256-<hex>.sig`
//! manifest's layers, each a JSON payload naming the signed manifest digest
//! with the base64 signature of its exact bytes in the layer annotation
//! [`SIGNATURE_ANNOTATION`] (sigstore/cosign `specs/SIGNATURE_SPEC.md`).

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::{Keyring, Verdict};

/// Media type of a cosign signature layer.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// Annotation of a signature layer holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// `critical.type` of a container image signature payload.
pub const SIMPLE_SIGNING_TYPE: &str = "cosign container image signature";

/// One signature layer of a `.sig` manifest: its payload bytes and the
/// signature annotation as written (base64).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedPayload {
    #[serde(with = "base64_bytes")]
    pub payload: Vec<u8>,
    pub signature: String,
}

#[derive(Deserialize)]
struct SimpleSigning {
    critical: Critical,
}

#[derive(Deserialize)]
struct Critical {
    identity: Identity,
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct Identity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

#[derive(Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

pub(super) fn verify_layer(subject_digest: &str, layer: &SignedPayload, keys: &Keyring) -> Verdict {
    let signature = match base64::engine::general_purpose::STANDARD.decode(layer.signature.trim()) {
        Ok(bytes) if !bytes.is_empty() => bytes,
        _ => return Verdict::Malformed { problem: "the signature annotation is not base64".into() },
    };
    match keys.verifier_of(&layer.payload, &signature) {
        // cosign's legacy layers carry their Rekor proof in an annotation
        // not read here: under a required log they are not proven.
        Ok(_) if keys.log_required().is_some() => Verdict::Malformed {
            problem: "a legacy (.sig) signature, whose transparency log entry is not verified; the JukeBox \
                      requires one (spec.verify.requireTransparencyLog): sign with cosign v3 (a bundle), or \
                      set requireTransparencyLog: false"
                .into(),
        },
        Ok(key) => signed_by(key, subject_digest, &layer.payload),
        Err(verdict) => verdict,
    }
}

/// A payload `key` verified: what it names.
fn signed_by(key: &str, subject_digest: &str, payload: &[u8]) -> Verdict {
    let parsed: SimpleSigning = match serde_json::from_slice(payload) {
        Ok(parsed) => parsed,
        Err(e) => {
            return Verdict::Malformed {
                problem: format!("the signed payload is not cosign simple signing: {e}"),
            };
        }
    };
    if parsed.critical.kind != SIMPLE_SIGNING_TYPE {
        return Verdict::Malformed {
            problem: format!(
                "the signed payload's type is {:?}, not {SIMPLE_SIGNING_TYPE:?}",
                parsed.critical.kind
            ),
        };
    }
    let signed = parsed.critical.image.docker_manifest_digest;
    if signed != subject_digest {
        return Verdict::DigestMismatch { signed };
    }
    Verdict::Verified { key: key.to_string(), reference: parsed.critical.identity.docker_reference }
}

/// The simple-signing payload cosign writes for `digest` pushed as
/// `reference` (`registry/repository`), byte for byte: what a signer signs.
pub fn simple_signing_payload(reference: &str, digest: &str) -> Vec<u8> {
    let value = serde_json::json!({
        "critical": {
            "identity": {"docker-reference": reference},
            "image": {"docker-manifest-digest": digest},
            "type": SIMPLE_SIGNING_TYPE,
        },
        "optional": null,
    });
    // serde_json's maps are ordered by key: the same bytes as cosign's.
    serde_json::to_vec(&value).unwrap_or_default()
}

mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}
