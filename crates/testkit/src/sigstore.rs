//! A Sigstore instance of the tests' own, offline: a Fulcio-like
//! certificate authority, a CT log and a Rekor log, each a P-256 key, and
//! the `trusted_root.json` that names them. It makes what `cosign sign` v3
//! publishes: keyless bundles (a short-lived certificate for an OIDC
//! identity, its SCT embedded, a Rekor `dsse` entry with its SET, inclusion
//! proof and checkpoint) and keyed bundles with a log entry.
//!
//! The formats are the specifications' (RFC 5280 certificates built with
//! `x509-cert`; RFC 6962 §3.2 SCTs over the precertificate; Rekor's `dsse`
//! 0.0.1 body; RFC 9162 tree hashes; C2SP signed-note checkpoints); the
//! rules' own tests verify a bundle cosign made with the public-good root,
//! so that this kit is not the only proof.

use std::{str::FromStr as _, time::Duration};

use anyhow::Result;
use base64::Engine as _;
use p256::ecdsa::{Signature, SigningKey, signature::Signer as _};
use p256::pkcs8::EncodePublicKey as _;
use sha2::{Digest as _, Sha256};
use vynil_rules::signature::bundle::{BUNDLE_MEDIA_TYPES, IN_TOTO_PAYLOAD_TYPE, pae};
use x509_cert::{
    Certificate, TbsCertificate,
    certificate::Version,
    der::{
        Decode as _, Encode as _,
        asn1::{BitString, Ia5String, OctetString, UtcTime, Utf8StringRef},
        oid::ObjectIdentifier,
    },
    ext::{
        Extension,
        pkix::{BasicConstraints, ExtendedKeyUsage, KeyUsage, KeyUsages, SubjectAltName, name::GeneralName},
    },
    name::Name,
    serial_number::SerialNumber,
    spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned},
    time::{Time, Validity},
};

use crate::signing::Signer;

const ECDSA_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.2");
const CODE_SIGNING: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.3");
const FULCIO_ISSUER_V2: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.8");
const SCT_LIST: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.11129.2.4.2");

/// The test Sigstore: its keys derive from a label.
#[derive(Debug)]
pub struct Sigstore {
    ca: Signer,
    ct: Signer,
    rekor: Signer,
    ca_certificate: Vec<u8>,
    /// Where the trusted root says its services are (never asked).
    base_url: String,
}

fn b64(bytes: impl AsRef<[u8]>) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn spki(key: &SigningKey) -> Result<Vec<u8>> {
    Ok(key.verifying_key().to_public_key_der()?.as_bytes().to_vec())
}

fn now() -> Result<u64> {
    Ok(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs())
}

fn time(unix: u64) -> Result<Time> {
    Ok(Time::UtcTime(UtcTime::from_unix_duration(Duration::from_secs(unix))?))
}

fn extension(id: ObjectIdentifier, critical: bool, value: Vec<u8>) -> Result<Extension> {
    Ok(Extension { extn_id: id, critical, extn_value: OctetString::new(value)? })
}

/// `tbs` signed by `key`, as a DER certificate.
fn signed(tbs: TbsCertificate, key: &SigningKey) -> Result<Vec<u8>> {
    let signature: Signature = key.sign(&tbs.to_der()?);
    let certificate = Certificate {
        tbs_certificate: tbs,
        signature_algorithm: AlgorithmIdentifierOwned { oid: ECDSA_SHA256, parameters: None },
        signature: BitString::from_bytes(signature.to_der().as_bytes())?,
    };
    Ok(certificate.to_der()?)
}

impl Sigstore {
    /// Its services named at `base_url` in the trusted root (a test may
    /// point it at a listener that counts connections: there must be none).
    pub fn new(label: &str, base_url: &str) -> Result<Self> {
        let ca = Signer::from_label(&format!("{label} ca"));
        let name = Name::from_str(&format!("CN={label} fulcio,O=vynil tests"))?;
        let at = now()?;
        let tbs = TbsCertificate {
            version: Version::V3,
            serial_number: SerialNumber::new(&[1])?,
            signature: AlgorithmIdentifierOwned { oid: ECDSA_SHA256, parameters: None },
            issuer: name.clone(),
            validity: Validity { not_before: time(at - 86_400)?, not_after: time(at + 10 * 86_400)? },
            subject: name,
            subject_public_key_info: SubjectPublicKeyInfoOwned::from_der(&spki(ca.key())?)?,
            issuer_unique_id: None,
            subject_unique_id: None,
            extensions: Some(vec![
                extension(
                    ObjectIdentifier::new_unwrap("2.5.29.19"),
                    true,
                    BasicConstraints { ca: true, path_len_constraint: None }.to_der()?,
                )?,
                extension(
                    ObjectIdentifier::new_unwrap("2.5.29.15"),
                    true,
                    KeyUsage(KeyUsages::KeyCertSign | KeyUsages::CRLSign).to_der()?,
                )?,
            ]),
        };
        let ca_certificate = signed(tbs, ca.key())?;
        Ok(Self {
            ca_certificate,
            ca,
            ct: Signer::from_label(&format!("{label} ct")),
            rekor: Signer::from_label(&format!("{label} rekor")),
            base_url: base_url.trim_end_matches('/').to_string(),
        })
    }

    /// Its `trusted_root.json`.
    pub fn trusted_root(&self) -> Result<Vec<u8>> {
        let log = |key: &Signer, path: &str| -> Result<serde_json::Value> {
            let der = spki(key.key())?;
            Ok(serde_json::json!({
                "baseUrl": format!("{}/{path}", self.base_url),
                "hashAlgorithm": "SHA2_256",
                "publicKey": {
                    "rawBytes": b64(&der),
                    "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                    "validFor": {"start": "2020-01-01T00:00:00Z"},
                },
                "logId": {"keyId": b64(Sha256::digest(&der))},
            }))
        };
        Ok(serde_json::to_vec(&serde_json::json!({
            "mediaType": vynil_rules::signature::TRUSTED_ROOT_MEDIA_TYPE,
            "tlogs": [log(&self.rekor, "rekor")?],
            "certificateAuthorities": [{
                "subject": {"organization": "vynil tests", "commonName": "fulcio"},
                "uri": format!("{}/fulcio", self.base_url),
                "certChain": {"certificates": [{"rawBytes": b64(&self.ca_certificate)}]},
                "validFor": {"start": "2020-01-01T00:00:00Z"},
            }],
            "ctlogs": [log(&self.ct, "ct")?],
        }))?)
    }

    /// A Fulcio-like certificate of `subject` (an email, or a URI) signed in
    /// at `issuer`, for `key`, valid ten minutes, its SCT embedded.
    fn certificate(&self, issuer: &str, subject: &str, key: &SigningKey) -> Result<Vec<u8>> {
        let at = now()?;
        let alternative = if subject.contains("://") {
            GeneralName::UniformResourceIdentifier(Ia5String::new(subject)?)
        } else {
            GeneralName::Rfc822Name(Ia5String::new(subject)?)
        };
        let ca = Certificate::from_der(&self.ca_certificate)?;
        let mut tbs = TbsCertificate {
            version: Version::V3,
            serial_number: SerialNumber::new(&Sha256::digest(spki(key)?)[..16])?,
            signature: AlgorithmIdentifierOwned { oid: ECDSA_SHA256, parameters: None },
            issuer: ca.tbs_certificate.subject.clone(),
            validity: Validity { not_before: time(at - 60)?, not_after: time(at + 600)? },
            subject: Name::default(),
            subject_public_key_info: SubjectPublicKeyInfoOwned::from_der(&spki(key)?)?,
            issuer_unique_id: None,
            subject_unique_id: None,
            extensions: Some(vec![
                extension(
                    ObjectIdentifier::new_unwrap("2.5.29.15"),
                    true,
                    KeyUsage(KeyUsages::DigitalSignature.into()).to_der()?,
                )?,
                extension(
                    ObjectIdentifier::new_unwrap("2.5.29.37"),
                    false,
                    ExtendedKeyUsage(vec![CODE_SIGNING]).to_der()?,
                )?,
                extension(
                    ObjectIdentifier::new_unwrap("2.5.29.17"),
                    true,
                    SubjectAltName(vec![alternative]).to_der()?,
                )?,
                extension(FULCIO_ISSUER_V2, false, Utf8StringRef::new(issuer)?.to_der()?)?,
            ]),
        };
        let sct = self.sct(&tbs.to_der()?, at * 1000)?;
        if let Some(extensions) = tbs.extensions.as_mut() {
            extensions.push(extension(SCT_LIST, false, OctetString::new(sct)?.to_der()?)?);
        }
        signed(tbs, self.ca.key())
    }

    /// A TLS `SignedCertificateTimestampList` of one SCT of the CT log over
    /// `precertificate` (RFC 6962 §3.2, `precert_entry`).
    fn sct(&self, precertificate: &[u8], timestamp_ms: u64) -> Result<Vec<u8>> {
        let issuer_key_hash = Sha256::digest(spki(self.ca.key())?);
        let mut signed = vec![0u8, 0u8];
        signed.extend_from_slice(&timestamp_ms.to_be_bytes());
        signed.extend_from_slice(&[0, 1]);
        signed.extend_from_slice(&issuer_key_hash);
        signed.extend_from_slice(&u32::try_from(precertificate.len())?.to_be_bytes()[1..]);
        signed.extend_from_slice(precertificate);
        signed.extend_from_slice(&[0, 0]);
        let signature: Signature = self.ct.key().sign(&signed);
        let signature = signature.to_der();
        let mut sct = vec![0u8];
        sct.extend_from_slice(&Sha256::digest(spki(self.ct.key())?));
        sct.extend_from_slice(&timestamp_ms.to_be_bytes());
        sct.extend_from_slice(&[0, 0, 4, 3]);
        sct.extend_from_slice(&u16::try_from(signature.as_bytes().len())?.to_be_bytes());
        sct.extend_from_slice(signature.as_bytes());
        let mut list = u16::try_from(sct.len() + 2)?.to_be_bytes().to_vec();
        list.extend_from_slice(&u16::try_from(sct.len())?.to_be_bytes());
        list.extend_from_slice(&sct);
        Ok(list)
    }

    /// Rekor's `dsse` entry of `payload` signed with `signature` by
    /// `verifier` (a PEM certificate or public key), with its SET, and an
    /// inclusion proof in a tree of two leaves up to a signed checkpoint.
    fn entry(
        &self,
        payload: &[u8],
        envelope: &serde_json::Value,
        signature: &str,
        verifier: &str,
    ) -> Result<serde_json::Value> {
        let body = serde_json::to_vec(&serde_json::json!({
            "apiVersion": "0.0.1",
            "kind": "dsse",
            "spec": {
                "envelopeHash": {"algorithm": "sha256", "value": hex::encode(Sha256::digest(serde_json::to_vec(envelope)?))},
                "payloadHash": {"algorithm": "sha256", "value": hex::encode(Sha256::digest(payload))},
                "signatures": [{"signature": signature, "verifier": b64(verifier)}],
            },
        }))?;
        let log_id = Sha256::digest(spki(self.rekor.key())?);
        let (index, integrated) = (1u64, now()?);
        let canonical = serde_json::to_vec(&serde_json::json!({
            "body": b64(&body),
            "integratedTime": integrated,
            "logID": hex::encode(log_id),
            "logIndex": index,
        }))?;
        let set: Signature = self.rekor.key().sign(&canonical);
        let sibling: [u8; 32] =
            Sha256::new().chain_update([0u8]).chain_update(b"another entry").finalize().into();
        let leaf: [u8; 32] = Sha256::new().chain_update([0u8]).chain_update(&body).finalize().into();
        let root: [u8; 32] =
            Sha256::new().chain_update([1u8]).chain_update(sibling).chain_update(leaf).finalize().into();
        let note = format!("vynil-tests-rekor - 1\n2\n{}\n", b64(root));
        let note_signature: Signature = self.rekor.key().sign(note.as_bytes());
        let mut signed = log_id[..4].to_vec();
        signed.extend_from_slice(note_signature.to_der().as_bytes());
        let checkpoint = format!("{note}\n\u{2014} vynil-tests-rekor {}\n", b64(signed));
        Ok(serde_json::json!({
            "logIndex": index.to_string(),
            "logId": {"keyId": b64(log_id)},
            "kindVersion": {"kind": "dsse", "version": "0.0.1"},
            "integratedTime": integrated.to_string(),
            "inclusionPromise": {"signedEntryTimestamp": b64(set.to_der().as_bytes())},
            "inclusionProof": {
                "logIndex": index.to_string(),
                "rootHash": b64(root),
                "treeSize": "2",
                "hashes": [b64(sibling)],
                "checkpoint": {"envelope": checkpoint},
            },
            "canonicalizedBody": b64(&body),
        }))
    }

    /// A bundle v0.3 of `statement`, as `cosign sign` v3 writes it when
    /// `issuer`'s `subject` signs in (keyless): a fresh key, its
    /// certificate, the DSSE envelope, the log entry.
    pub fn keyless_bundle(&self, issuer: &str, subject: &str, statement: &[u8]) -> Result<Vec<u8>> {
        let key =
            Signer::from_label(&format!("{issuer} {subject} {}", hex::encode(Sha256::digest(statement))));
        let certificate = self.certificate(issuer, subject, key.key())?;
        let pem = x509_cert::der::pem::encode_string("CERTIFICATE", Default::default(), &certificate)
            .map_err(|e| anyhow::anyhow!("PEM of the certificate: {e}"))?;
        self.bundle(
            statement,
            &key,
            serde_json::json!({"certificate": {"rawBytes": b64(&certificate)}}),
            &pem,
        )
    }

    /// A bundle v0.3 of `statement` signed with `signer`'s key, as `cosign
    /// sign --key` v3 writes it: with its log entry (cosign's default).
    pub fn keyed_bundle(&self, signer: &Signer, statement: &[u8]) -> Result<Vec<u8>> {
        let hint = b64(Sha256::digest(signer.public_pem().as_bytes()));
        self.bundle(statement, signer, serde_json::json!({"publicKey": {"hint": hint}}), &signer.public_pem())
    }

    fn bundle(
        &self,
        statement: &[u8],
        key: &Signer,
        mut material: serde_json::Value,
        verifier: &str,
    ) -> Result<Vec<u8>> {
        let signature = key.sign(&pae(IN_TOTO_PAYLOAD_TYPE, statement));
        let envelope = serde_json::json!({
            "payload": b64(statement),
            "payloadType": IN_TOTO_PAYLOAD_TYPE,
            "signatures": [{"sig": signature, "keyid": ""}],
        });
        material["tlogEntries"] =
            serde_json::json!([self.entry(statement, &envelope, &signature, verifier)?]);
        Ok(serde_json::to_vec(&serde_json::json!({
            "mediaType": BUNDLE_MEDIA_TYPES[0],
            "verificationMaterial": material,
            "dsseEnvelope": envelope,
        }))?)
    }
}
