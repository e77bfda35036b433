//! Attestation policies (`spec.verify.attestations`): a predicate type a
//! verified revision must also carry, in a bundle signed as a signature
//! must be (a trusted key, or an identity under the trusted root, the log
//! when required), about this digest, and optionally with a condition on the
//! predicate: for SLSA provenance, the builder's id (`runDetails.builder.id`
//! in v1, `builder.id` in v0.2), as `cosign verify-attestation --type
//! slsaprovenance1` with a policy on it would check. A revision that lacks
//! one is [`Verdict::Unattested`], refused under `enforce` exactly as an
//! unsigned one, the verdict naming the missing predicate.

use super::bundle::{STATEMENT_TYPES, signed_statement};
use super::keyless::Matcher;
use super::{Evidence, Keyring, Verdict};
use crate::RulesError;

/// One required attestation.
#[derive(Debug, Clone)]
pub struct AttestationRule {
    predicate_type: String,
    builder: Option<Matcher>,
}

/// An attestation rule as a policy writes it.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttestationSpec<'a> {
    pub predicate_type: &'a str,
    pub builder_id: Option<&'a str>,
    pub builder_id_regexp: Option<&'a str>,
}

impl AttestationRule {
    pub fn parse(spec: AttestationSpec<'_>) -> Result<Self, RulesError> {
        let error =
            |problem: String| RulesError::Attestation { predicate_type: spec.predicate_type.into(), problem };
        if spec.predicate_type.trim().is_empty() {
            return Err(error("give its predicateType (e.g. https://slsa.dev/provenance/v1)".into()));
        }
        let builder = match (spec.builder_id, spec.builder_id_regexp) {
            (None, None) => None,
            (exact, pattern) => Some(Matcher::new(exact, pattern, "builderId").map_err(error)?),
        };
        Ok(Self { predicate_type: spec.predicate_type.trim().to_string(), builder })
    }

    pub fn predicate_type(&self) -> &str {
        &self.predicate_type
    }

    /// What it asks, for fingerprints and messages.
    pub fn describe(&self) -> String {
        match &self.builder {
            Some(builder) => format!("{} built by {}", self.predicate_type, builder.describe()),
            None => self.predicate_type.clone(),
        }
    }

    /// Whether the Statement `payload` satisfies it for `subject_digest`:
    /// `None` when it is not even of this predicate type, else `Ok` or why not.
    fn satisfied_by(&self, subject_digest: &str, payload: &[u8]) -> Option<Result<(), String>> {
        let statement: serde_json::Value = serde_json::from_slice(payload).ok()?;
        let text = |pointer: &str| statement.pointer(pointer).and_then(|v| v.as_str());
        if text("/predicateType") != Some(self.predicate_type.as_str()) {
            return None;
        }
        if !text("/_type").is_some_and(|t| STATEMENT_TYPES.contains(&t)) {
            return Some(Err("it is no in-toto Statement".into()));
        }
        let (algorithm, hex) = subject_digest.split_once(':').unwrap_or(("", subject_digest));
        let subjects = statement.get("subject").and_then(|s| s.as_array()).cloned().unwrap_or_default();
        if !subjects
            .iter()
            .any(|s| s.pointer(&format!("/digest/{algorithm}")).and_then(|d| d.as_str()) == Some(hex))
        {
            return Some(Err("it is about another digest".into()));
        }
        let Some(builder) = &self.builder else { return Some(Ok(())) };
        let id = text("/predicate/runDetails/builder/id").or_else(|| text("/predicate/builder/id"));
        Some(match id {
            Some(id) if builder.matches(id) => Ok(()),
            Some(id) => Err(format!("its builder is {id}, not {}", builder.describe())),
            None => Err("it names no builder".into()),
        })
    }
}

/// Under `keys`' attestation rules, what a verified revision lacks: the
/// verdict for the first rule no bundle of `evidence` satisfies.
pub(crate) fn unattested(subject_digest: &str, evidence: &Evidence, keys: &Keyring) -> Option<Verdict> {
    for rule in keys.attestations() {
        let mut problem = "none is attached".to_string();
        let mut satisfied = false;
        for bundle in &evidence.bundles {
            let Ok((signer, payload)) = signed_statement(bundle, keys) else {
                if bundle_of(bundle, rule) {
                    problem = "one is attached, signed by no trusted key or identity".into();
                }
                continue;
            };
            match rule.satisfied_by(subject_digest, &payload) {
                Some(Ok(())) => satisfied = true,
                Some(Err(why)) => problem = format!("the one {signer} signed does not hold: {why}"),
                None => {}
            }
        }
        if !satisfied {
            return Some(Verdict::Unattested { predicate_type: rule.describe(), problem });
        }
    }
    None
}

/// Whether an unverified bundle says (unsigned, as its envelope's payload
/// reads) it is of `rule`'s predicate type: only to tell why it is refused.
fn bundle_of(bundle: &[u8], rule: &AttestationRule) -> bool {
    use base64::Engine as _;
    let value: Option<serde_json::Value> = serde_json::from_slice(bundle).ok();
    let payload = value
        .as_ref()
        .and_then(|b| b.pointer("/dsseEnvelope/payload"))
        .and_then(|p| p.as_str())
        .and_then(|p| base64::engine::general_purpose::STANDARD.decode(p).ok())
        .and_then(|p| serde_json::from_slice::<serde_json::Value>(&p).ok());
    payload.and_then(|p| p.get("predicateType").and_then(|t| t.as_str()).map(|t| t == rule.predicate_type))
        == Some(true)
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use p256::{ecdsa::signature::Signer as _, pkcs8::EncodePublicKey as _};

    use super::super::{bundle::BUNDLE_MEDIA_TYPES, bundle::IN_TOTO_PAYLOAD_TYPE, bundle::pae, verify};
    use super::*;

    const DIGEST: &str = "sha256:f3cfc9d0dbf931d3db4685ec659b7ac68e2a578219da4aae65427886e649b06b";
    const SLSA: &str = "https://slsa.dev/provenance/v1";
    const SIGN: &str = "https://sigstore.dev/cosign/sign/v1";
    const ACTIONS: &str = "https://github.com/actions/runner/github-hosted";

    fn key(seed: u8) -> p256::ecdsa::SigningKey {
        p256::ecdsa::SigningKey::from_slice(&[seed; 32]).unwrap()
    }

    fn bundle(seed: u8, predicate_type: &str, predicate: serde_json::Value) -> Vec<u8> {
        let statement = serde_json::to_vec(&serde_json::json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"digest": {"sha256": DIGEST.trim_start_matches("sha256:")}}],
            "predicateType": predicate_type,
            "predicate": predicate,
        }))
        .unwrap();
        let b64 = base64::engine::general_purpose::STANDARD;
        let signature: p256::ecdsa::Signature = key(seed).sign(&pae(IN_TOTO_PAYLOAD_TYPE, &statement));
        serde_json::to_vec(&serde_json::json!({
            "mediaType": BUNDLE_MEDIA_TYPES[0],
            "verificationMaterial": {"publicKey": {"hint": ""}},
            "dsseEnvelope": {
                "payload": b64.encode(&statement),
                "payloadType": IN_TOTO_PAYLOAD_TYPE,
                "signatures": [{"sig": b64.encode(signature.to_der())}],
            },
        }))
        .unwrap()
    }

    fn provenance(seed: u8, builder: &str) -> Vec<u8> {
        bundle(seed, SLSA, serde_json::json!({"runDetails": {"builder": {"id": builder}}}))
    }

    fn requiring(builder: Option<&str>) -> Keyring {
        let pem = key(1).verifying_key().to_public_key_pem(Default::default()).unwrap();
        let rule = AttestationRule::parse(AttestationSpec {
            predicate_type: SLSA,
            builder_id: builder,
            ..Default::default()
        });
        Keyring::parse([("release", pem.as_str())]).unwrap().requiring(vec![rule.unwrap()])
    }

    fn evidence(bundles: Vec<Vec<u8>>) -> Evidence {
        Evidence { bundles, ..Default::default() }
    }

    #[test]
    fn a_signed_revision_needs_each_required_attestation_by_a_trusted_signer() {
        let signature = bundle(1, SIGN, serde_json::json!({}));
        let keys = requiring(Some(ACTIONS));
        let verified = Verdict::Verified { key: "release".into(), reference: String::new() };
        assert_eq!(
            verify(DIGEST, Some(&evidence(vec![signature.clone(), provenance(1, ACTIONS)])), &keys),
            verified
        );
        let cases = [
            ("none", vec![signature.clone()], "none is attached"),
            (
                "another builder",
                vec![signature.clone(), provenance(1, "https://evil.example/builder")],
                "its builder is",
            ),
            ("another signer", vec![signature.clone(), provenance(2, ACTIONS)], "signed by no trusted"),
        ];
        for (case, bundles, why) in cases {
            let verdict = verify(DIGEST, Some(&evidence(bundles)), &keys);
            let Verdict::Unattested { predicate_type, problem } = &verdict else {
                panic!("{case}: {verdict:?}")
            };
            assert!(predicate_type.starts_with(SLSA) && problem.contains(why), "{case}: {verdict:?}");
            assert!(
                !verdict.allows(Some(super::super::VerifyMode::Enforce)),
                "{case}: refused under enforce"
            );
        }
        // No builder asked: any provenance the trusted key signed holds.
        let any = verify(
            DIGEST,
            Some(&evidence(vec![signature, provenance(1, "https://b.example")])),
            &requiring(None),
        );
        assert!(any.is_verified(), "{any:?}");
    }

    #[test]
    fn an_attestation_alone_is_not_a_signature_and_v0_2_names_its_builder_elsewhere() {
        let keys = requiring(Some(ACTIONS));
        assert_eq!(verify(DIGEST, Some(&evidence(vec![provenance(1, ACTIONS)])), &keys), Verdict::Unsigned);
        let v02 = bundle(1, SLSA, serde_json::json!({"builder": {"id": ACTIONS}}));
        let signed = evidence(vec![bundle(1, SIGN, serde_json::json!({})), v02]);
        assert!(verify(DIGEST, Some(&signed), &keys).is_verified());
        assert!(
            AttestationRule::parse(AttestationSpec::default()).is_err(),
            "a rule names its predicate type"
        );
    }
}
