//! A revision's cosign signature, read from its `sha256-<hex>.sig` manifest
//! and judged by the rules ([`vynil_rules::signature`]).
//!
//! What a scan pays: nothing for a revision without a `.sig` tag in the
//! listing (unsigned); for a `.sig` tag never seen, a GET of its manifest
//! and one of each payload; nothing for one whose cached evidence a trusted
//! key verifies (the signed content cannot change; a deleted signature shows
//! in the listing), a HEAD otherwise (the signature may have been replaced
//! since: another key's, a fixed one), and GETs only when it moved. Evidence is cached by the
//! signature manifest's digest, in the metadata cache (memory, or Redis
//! shared by the replicas), so a changed key set is judged again without a
//! GET.

use reqwest::{Method, StatusCode};
use sha2::{Digest as _, Sha256};
use vynil_rules::{
    ArtifactTag,
    signature::{Evidence, Keyring, SignedPayload, Verdict, verify},
    tag::ArtifactKind,
};

use crate::{
    RegistryClient, RegistryError, RepositoryRef, Result, client::check_status, decode, layout::Layout,
};

/// At most this many signature layers are read of one `.sig` manifest.
const MAX_LAYERS: usize = 32;
/// A simple-signing payload is a few hundred bytes.
const MAX_PAYLOAD_BYTES: usize = 64 * 1024;

impl RegistryClient {
    /// The verdict on the signature of `subject_digest` in `repo` under
    /// `keys`; `listed`: the repository's tag list holds its `.sig` tag.
    pub async fn signature_verdict(
        &self,
        repo: &RepositoryRef,
        subject_digest: &str,
        keys: &Keyring,
        listed: bool,
    ) -> Result<Verdict> {
        let Some(tag) = signature_tag(subject_digest).filter(|_| listed) else {
            return Ok(Verdict::Unsigned);
        };
        let reference = format!("{repo}:{tag}");
        let known = self.cache().tag_digest(&reference).await;
        let Some(known) = known else {
            // Never seen: one GET of the manifest by tag, its digest the body's.
            let Some((digest, evidence)) = self.read_evidence(repo, &tag).await? else {
                return Ok(Verdict::Unsigned);
            };
            self.cache().put_evidence(&digest, &evidence).await;
            self.cache().put_tag_digest(&reference, &digest).await;
            return Ok(verify(subject_digest, Some(&evidence), keys));
        };
        if let Some(evidence) = self.cache().evidence(&known).await {
            let verdict = verify(subject_digest, Some(&evidence), keys);
            if verdict.is_verified() {
                return Ok(verdict);
            }
        }
        let Some(digest) = self.head_digest(repo, &tag).await? else {
            return Ok(Verdict::Unsigned);
        };
        let evidence = match self.cache().evidence(&digest).await {
            Some(evidence) => evidence,
            None => match self.read_evidence(repo, &digest).await? {
                Some((_, evidence)) => {
                    self.cache().put_evidence(&digest, &evidence).await;
                    evidence
                }
                None => return Ok(Verdict::Unsigned),
            },
        };
        self.cache().put_tag_digest(&reference, &digest).await;
        Ok(verify(subject_digest, Some(&evidence), keys))
    }

    /// The `.sig` manifest `reference` (its tag, or its digest) names: its
    /// digest (the body's, checked against the one asked or served) and its
    /// signature layers with their payloads (each checked against its
    /// digest); `None` when absent.
    async fn read_evidence(
        &self,
        repo: &RepositoryRef,
        reference: &str,
    ) -> Result<Option<(String, Evidence)>> {
        let what = format!("signature manifest {repo}:{reference}");
        let Some((body, _, served)) = self.fetch_manifest(repo, reference, &what).await? else {
            return Ok(None);
        };
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
        let expected = if reference.starts_with("sha256:") { Some(reference) } else { served.as_deref() };
        if let Some(expected) = expected.filter(|d| d.starts_with("sha256:") && *d != digest) {
            return Err(RegistryError::InvalidBody {
                what,
                problem: format!("content hashes to {digest}, not {expected}: truncated or corrupt"),
            });
        }
        let layers = match decode::signature_layers(&body) {
            Ok(layers) => layers,
            Err(problem) => return Ok(Some((digest, Evidence { layers: vec![], problems: vec![problem] }))),
        };
        let mut evidence = Evidence::default();
        for layer in layers.into_iter().take(MAX_LAYERS) {
            let Some(signature) = layer.signature else {
                evidence.problems.push(format!("layer {} has no signature annotation", layer.digest));
                continue;
            };
            if !(0..=MAX_PAYLOAD_BYTES as i64).contains(&layer.size) {
                evidence
                    .problems
                    .push(format!("layer {} is {} bytes, not a payload", layer.digest, layer.size));
                continue;
            }
            match self.blob(repo, &layer.digest).await? {
                Some(payload) => evidence.layers.push(SignedPayload { payload, signature }),
                None => evidence.problems.push(format!("the payload {} is missing", layer.digest)),
            }
        }
        Ok(Some((digest, evidence)))
    }

    /// The blob `digest` of `repo` (at most [`MAX_PAYLOAD_BYTES`]), checked
    /// against its digest; `None` when absent.
    async fn blob(&self, repo: &RepositoryRef, digest: &str) -> Result<Option<Vec<u8>>> {
        let what = format!("blob {repo}@{digest}");
        let body = if let Some(layout) = Layout::of(repo, self.transport().config())? {
            let digest = digest.to_string();
            tokio::task::spawn_blocking(move || layout.manifest(&digest))
                .await
                .map_err(|e| RegistryError::Layout { what: what.clone(), problem: e.to_string() })??
        } else {
            let mut request =
                self.request("get_blob", what.clone(), repo, Method::GET, &blob_path(repo, digest));
            request.accept = &["*/*"];
            request.max_body = MAX_PAYLOAD_BYTES;
            let response = self.transport().send(&request).await?;
            if response.status == StatusCode::NOT_FOUND {
                return Ok(None);
            }
            check_status(&response, &what)?;
            Some(response.body.to_vec())
        };
        let Some(body) = body else { return Ok(None) };
        let hashed = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
        if hashed != digest {
            return Err(RegistryError::InvalidBody {
                what,
                problem: format!("content does not match its digest (got {hashed}): truncated or corrupt"),
            });
        }
        Ok(Some(body))
    }
}

/// `sha256-<hex>.sig` of `sha256:<hex>`; `None` for another digest form.
pub fn signature_tag(subject_digest: &str) -> Option<String> {
    let tag = ArtifactTag { kind: ArtifactKind::Signature, subject: subject_digest.to_string() }.name();
    ArtifactTag::parse(&tag).map(|_| tag)
}

fn blob_path(repo: &RepositoryRef, digest: &str) -> String {
    format!("/v2/{}/blobs/{digest}", repo.api_repository())
}
