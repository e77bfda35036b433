//! A bundle's transparency log entries (Rekor), verified offline with the
//! log keys of the operator's trusted root: the entry is this signature's,
//! the log promised to include it (signed entry timestamp), and it is
//! included (inclusion proof up to a signed checkpoint).
//!
//! Written here, from the specifications, because `sigstore` 0.15 leaves
//! the inclusion proof and the SET unverified (`bundle/verify/verifier.rs`,
//! sigstore/sigstore-rs#285):
//! - the **entry's body** (`canonicalizedBody`, Rekor's `dsse` 0.0.1 or
//!   `intoto` 0.0.2 kind, as `cosign sign` v3 and v2 log a DSSE envelope)
//!   must name the envelope's payload hash, its signature and its signer
//!   (certificate or key): an entry of another signature proves nothing;
//! - the **signed entry timestamp** is the log's signature over the RFC 8785
//!   canonical JSON of `{body, integratedTime, logID, logIndex}` (Rekor's
//!   `pkg/api/entries.go`, cosign `pkg/cosign/tlog.go` `VerifySET`); only a
//!   verified one makes `integratedTime` the signing time;
//! - the **inclusion proof** is RFC 9162's (§2.1.3.2, leaf hash
//!   `SHA-256(0x00 ‖ body)`), ending at the root hash its **checkpoint**
//!   (a signed note: C2SP `signed-note` and `tlog-checkpoint`) carries,
//!   signed by the log's key, for the proof's tree size.
//!
//! An entry that carries a proof or a SET that does not verify is refused,
//! never skipped for the other.

use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use super::trusted_root::{LogKey, TrustedRoot, decode};

/// One `verificationMaterial.tlogEntries[]` of a bundle.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Entry {
    #[serde(deserialize_with = "int64")]
    log_index: i64,
    log_id: LogId,
    #[serde(deserialize_with = "int64")]
    integrated_time: i64,
    inclusion_promise: Option<Promise>,
    inclusion_proof: Option<Proof>,
    canonicalized_body: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogId {
    key_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Promise {
    signed_entry_timestamp: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Proof {
    #[serde(deserialize_with = "int64")]
    log_index: i64,
    root_hash: String,
    #[serde(deserialize_with = "int64")]
    tree_size: i64,
    #[serde(default)]
    hashes: Vec<String>,
    checkpoint: Option<Checkpoint>,
}

#[derive(Debug, Deserialize)]
struct Checkpoint {
    envelope: String,
}

/// protobuf's JSON writes int64 as a string; both are read.
fn int64<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int {
        Text(String),
        Number(i64),
    }
    match Int::deserialize(deserializer)? {
        Int::Number(n) => Ok(n),
        Int::Text(t) => t.parse().map_err(serde::de::Error::custom),
    }
}

/// What an entry must be the log's record of: a DSSE envelope's payload,
/// one of its signatures, and who signed (DER: a certificate, or a public
/// key's SubjectPublicKeyInfo).
pub(crate) struct Signed<'a> {
    pub(crate) payload: &'a [u8],
    pub(crate) signature: &'a [u8],
    pub(crate) signer: &'a [u8],
}

/// An entry verified: when the log says the signature was made, if a
/// verified SET vouches for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Logged {
    pub(crate) time: Option<i64>,
}

/// The first of `entries` that verifies for `signed` under `root`'s logs,
/// else why none does.
pub(crate) fn logged(entries: &[Entry], root: &TrustedRoot, signed: &Signed) -> Result<Logged, String> {
    let mut problem = "no transparency log entry".to_string();
    for entry in entries {
        match verify_entry(entry, root, signed) {
            Ok(logged) => return Ok(logged),
            Err(why) => problem = why,
        }
    }
    Err(problem)
}

fn verify_entry(entry: &Entry, root: &TrustedRoot, signed: &Signed) -> Result<Logged, String> {
    let id = decode(&entry.log_id.key_id)?;
    let log = root.tlog(&id).ok_or_else(|| {
        format!("its log entry is from a log the trusted root does not list ({})", hex::encode(&id))
    })?;
    let body = decode(&entry.canonicalized_body).map_err(|e| format!("the log entry's body is {e}"))?;
    records(&body, signed)?;
    let promised = match &entry.inclusion_promise {
        Some(promise) => {
            verify_set(entry, &promise.signed_entry_timestamp, log)?;
            true
        }
        None => false,
    };
    if let Some(proof) = &entry.inclusion_proof {
        verify_inclusion(&body, proof, log)?;
    } else if !promised {
        return Err("its log entry carries neither an inclusion proof nor a signed entry timestamp".into());
    }
    if promised && !log.valid.contains(entry.integrated_time) {
        return Err("the log's key was not valid at the entry's integrated time".into());
    }
    Ok(Logged { time: promised.then_some(entry.integrated_time) })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Body {
    kind: String,
    api_version: String,
    spec: serde_json::Value,
}

/// What a log entry's body records of a DSSE envelope.
struct Recorded {
    payload_hash: String,
    /// Each signature with its signer's PEM.
    signatures: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Whether the entry's body records `signed` (the payload's hash, the
/// signature, the signer).
fn records(body: &[u8], signed: &Signed) -> Result<(), String> {
    let body: Body = serde_json::from_slice(body).map_err(|e| format!("the log entry's body: {e}"))?;
    let recorded = recorded(&body)?;
    if recorded.payload_hash != hex::encode(Sha256::digest(signed.payload)) {
        return Err("its log entry records another payload".into());
    }
    let found = recorded.signatures.iter().any(|(signature, pem)| {
        signature == signed.signature && pem_der(pem).is_some_and(|der| der == signed.signer)
    });
    if !found {
        return Err("its log entry records another signature or signer".into());
    }
    Ok(())
}

/// A body as Rekor's `dsse` 0.0.1 and `intoto` 0.0.2 kinds write it.
fn recorded(body: &Body) -> Result<Recorded, String> {
    let text =
        |v: &serde_json::Value, p: &str| v.pointer(p).and_then(|v| v.as_str()).unwrap_or("").to_string();
    let list = |p: &str| body.spec.pointer(p).and_then(|s| s.as_array()).cloned().unwrap_or_default();
    let b64 = base64::engine::general_purpose::STANDARD;
    match (body.kind.as_str(), body.api_version.as_str()) {
        ("dsse", "0.0.1") => Ok(Recorded {
            payload_hash: text(&body.spec, "/payloadHash/value"),
            signatures: list("/signatures")
                .iter()
                .filter_map(|s| {
                    Some((b64.decode(text(s, "/signature")).ok()?, b64.decode(text(s, "/verifier")).ok()?))
                })
                .collect(),
        }),
        // Rekor's intoto kind stores each signature base64 twice.
        ("intoto", "0.0.2") => Ok(Recorded {
            payload_hash: text(&body.spec, "/content/payloadHash/value"),
            signatures: list("/content/envelope/signatures")
                .iter()
                .filter_map(|s| {
                    let signature = b64.decode(b64.decode(text(s, "/sig")).ok()?).ok()?;
                    Some((signature, b64.decode(text(s, "/publicKey")).ok()?))
                })
                .collect(),
        }),
        (kind, version) => {
            Err(format!("its log entry is of kind {kind} {version}, not the record of a DSSE envelope"))
        }
    }
}

/// The DER inside one PEM block (a certificate, a public key).
pub(crate) fn pem_der(pem: &[u8]) -> Option<Vec<u8>> {
    x509_cert::der::pem::decode_vec(pem).ok().map(|(_, der)| der)
}

fn verify_set(entry: &Entry, set: &str, log: &LogKey) -> Result<(), String> {
    // RFC 8785 canonical JSON: keys sorted, no spaces; the values here are
    // integers and base64 or hex text, which serde_json writes canonically.
    let canonical = serde_json::to_vec(&serde_json::json!({
        "body": entry.canonicalized_body,
        "integratedTime": entry.integrated_time,
        "logID": hex::encode(decode(&entry.log_id.key_id)?),
        "logIndex": entry.log_index,
    }))
    .map_err(|e| e.to_string())?;
    let signature = decode(set).map_err(|e| format!("the signed entry timestamp is {e}"))?;
    match log.key.verifies(&canonical, &signature) {
        Some(true) => Ok(()),
        _ => Err("the log's signed entry timestamp does not verify with its key".into()),
    }
}

fn verify_inclusion(body: &[u8], proof: &Proof, log: &LogKey) -> Result<(), String> {
    let bad = |what: &str| format!("the log entry's inclusion proof {what}");
    let hashes = proof
        .hashes
        .iter()
        .map(|h| decode(h).ok().and_then(|h| <[u8; 32]>::try_from(h).ok()))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("holds a hash that is not 32 bytes of base64"))?;
    let (index, size) = (u64::try_from(proof.log_index), u64::try_from(proof.tree_size));
    let (Ok(index), Ok(size)) = (index, size) else { return Err(bad("has a negative index or size")) };
    let leaf: [u8; 32] = Sha256::new().chain_update([0u8]).chain_update(body).finalize().into();
    let root = root_from_inclusion_proof(index, size, leaf, &hashes)
        .ok_or_else(|| bad("does not fit its tree size"))?;
    if decode(&proof.root_hash).ok().as_deref() != Some(&root[..]) {
        return Err(bad("does not lead to its root hash"));
    }
    let Some(checkpoint) = &proof.checkpoint else { return Err(bad("has no checkpoint")) };
    let (size_signed, root_signed) = checkpoint_of(&checkpoint.envelope, log).map_err(|e| bad(&e))?;
    if size_signed != size || root_signed != root {
        return Err(bad("is for another tree than its checkpoint's"));
    }
    Ok(())
}

/// RFC 9162 §2.1.3.2: the root hash that `proof` gives for the leaf hash
/// `leaf` at `index` in a tree of `size` leaves; `None` when it cannot.
pub(crate) fn root_from_inclusion_proof(
    index: u64,
    size: u64,
    leaf: [u8; 32],
    proof: &[[u8; 32]],
) -> Option<[u8; 32]> {
    if index >= size {
        return None;
    }
    let node = |left: &[u8], right: &[u8]| -> [u8; 32] {
        Sha256::new().chain_update([1u8]).chain_update(left).chain_update(right).finalize().into()
    };
    let (mut f, mut s, mut r) = (index, size - 1, leaf);
    for p in proof {
        if s == 0 {
            return None;
        }
        if f & 1 == 1 || f == s {
            r = node(p, &r);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            r = node(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    (s == 0).then_some(r)
}

/// A checkpoint's tree size and root hash, once a signature line of the
/// log's key (its key hint: the first 4 bytes of the key id) verifies over
/// the note's text.
fn checkpoint_of(note: &str, log: &LogKey) -> Result<(u64, [u8; 32]), String> {
    let (text, signatures) = note.split_once("\n\n").ok_or("is no signed note (no blank line)")?;
    let text = format!("{text}\n");
    let signed = signatures.lines().filter_map(|line| line.strip_prefix("\u{2014} ")).any(|line| {
        let Some((_, b64)) = line.rsplit_once(' ') else { return false };
        let Ok(bytes) = decode(b64) else { return false };
        bytes.len() > 4
            && bytes[..4] == log.id[..4]
            && log.key.verifies(text.as_bytes(), &bytes[4..]) == Some(true)
    });
    if !signed {
        return Err("has a checkpoint the log's key did not sign".into());
    }
    let mut lines = text.lines().skip(1);
    let size =
        lines.next().and_then(|l| l.parse::<u64>().ok()).ok_or("has a checkpoint without a tree size")?;
    let root = lines
        .next()
        .and_then(|l| decode(l).ok())
        .and_then(|r| <[u8; 32]>::try_from(r).ok())
        .ok_or("has a checkpoint without a root hash")?;
    Ok((size, root))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(n: u8) -> [u8; 32] {
        Sha256::new().chain_update([0u8]).chain_update([n]).finalize().into()
    }

    fn node(l: [u8; 32], r: [u8; 32]) -> [u8; 32] {
        Sha256::new().chain_update([1u8]).chain_update(l).chain_update(r).finalize().into()
    }

    /// RFC 9162 §2.1.1's tree of 7 leaves (its figure of d0..d6): the
    /// audit path of d3 is [c, g, l]... written from the figure, not from
    /// our function.
    #[test]
    fn an_inclusion_proof_leads_to_the_root_of_rfc_9162s_tree() {
        let d: Vec<[u8; 32]> = (0..7).map(leaf).collect();
        let (g, h, i) = (node(d[0], d[1]), node(d[2], d[3]), node(d[4], d[5]));
        let (k, l) = (node(g, h), node(i, d[6]));
        let root = node(k, l);
        assert_eq!(root_from_inclusion_proof(3, 7, d[3], &[d[2], g, l]), Some(root));
        assert_eq!(root_from_inclusion_proof(6, 7, d[6], &[i, k]), Some(root));
        assert_eq!(root_from_inclusion_proof(4, 7, d[4], &[d[5], d[6], k]), Some(root));
        assert_ne!(root_from_inclusion_proof(3, 7, d[4], &[d[2], g, l]), Some(root), "another leaf");
        assert_eq!(root_from_inclusion_proof(3, 7, d[3], &[d[2], g]), None, "a proof cut short");
        assert_eq!(root_from_inclusion_proof(7, 7, d[3], &[d[2], g, l]), None, "an index out of the tree");
    }
}
