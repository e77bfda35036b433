//! A revision's signatures, read as cosign verifies them
//! (`pkg/cosign/verify.go`) and judged by the rules
//! ([`vynil_rules::signature`]): Sigstore bundles first — listed by the OCI
//! referrers API, else by the referrers tag schema (an image index at tag
//! `sha256-<hex>`, what cosign v3 maintains on a registry without the API,
//! distribution 2.8 among them) — then the legacy `sha256-<hex>.sig`.
//!
//! What a scan pays: nothing for a revision whose cached evidence a trusted
//! key verifies (signed content cannot change); otherwise one GET of the
//! referrers API (not asked again of a registry that answered 404 within
//! [`crate::referrers::REFERRERS_ABSENT_FOR`]) and, for each signature tag in the listing, a
//! HEAD when seen before (it may have been replaced since: another key's, a
//! fixed one), GETs only of what is new. Evidence is cached by the digest of
//! the manifest or index it was read from, in the metadata cache (memory, or
//! Redis shared by the replicas), so a changed key set is judged again
//! without a GET. A blob that cannot be read — absent, truncated, corrupt —
//! fails the read (the scan keeps what it knew and retries): it is never
//! cached as part of a verdict.

use std::collections::HashSet;

use oci_client::manifest::OCI_IMAGE_INDEX_MEDIA_TYPE;
use reqwest::{Method, StatusCode};
use sha2::{Digest as _, Sha256};
use vynil_rules::{
    ArtifactTag,
    signature::{Evidence, Keyring, SignedPayload, Verdict, verify},
    tag::{ArtifactKind, referrers_tag},
};

use crate::{
    RegistryClient, RegistryError, RepositoryRef, Result,
    client::check_status,
    decode::{self, Holds, SignatureManifest},
    layout::Layout,
};

/// At most this many signatures (layers, or referrers) are read of one manifest.
const MAX_SIGNATURES: usize = 32;
/// A simple-signing payload is a few hundred bytes; a bundle a few KiB.
const MAX_PAYLOAD_BYTES: usize = 256 * 1024;

/// Where a revision's signatures may be.
#[derive(Debug, Clone)]
enum Place {
    /// The referrers API's answer for the revision.
    Referrers,
    /// A tag: the referrers tag schema's index, or cosign's `.sig`.
    Tag(String),
}

impl Place {
    /// Its key in the metadata cache's tag digests.
    fn reference(&self, repo: &RepositoryRef, subject: &str) -> String {
        match self {
            Place::Referrers => format!("{repo}@{subject}#referrers"),
            Place::Tag(tag) => format!("{repo}:{tag}"),
        }
    }
}

impl RegistryClient {
    /// The verdict on the signatures of `subject_digest` in `repo` under
    /// `keys`; `listed`: the repository's tags (its signature tags are read
    /// only when listed), `None` when not known (every place is read).
    pub async fn signature_verdict(
        &self,
        repo: &RepositoryRef,
        subject_digest: &str,
        keys: &Keyring,
        listed: Option<&HashSet<String>>,
    ) -> Result<Verdict> {
        let is_listed = |tag: &String| listed.is_none_or(|tags| tags.contains(tag));
        let tags = [referrers_tag(subject_digest), signature_tag(subject_digest)];
        let places: Vec<Place> = std::iter::once(Place::Referrers)
            .chain(tags.into_iter().flatten().filter(is_listed).map(Place::Tag))
            .collect();
        // A verdict verified from the cache costs nothing.
        for place in &places {
            if let Some(verdict) =
                self.cached_verdict(&place.reference(repo, subject_digest), subject_digest, keys).await
                && verdict.is_verified()
            {
                return Ok(verdict);
            }
        }
        let mut best = Verdict::Unsigned;
        for place in &places {
            let verdict = match place {
                Place::Referrers => match self.referrers(repo, subject_digest).await? {
                    Some(index) => self.index_verdict(repo, subject_digest, keys, index).await?,
                    // Not offered: the tag schema stands in (listed after it).
                    None => continue,
                },
                Place::Tag(tag) => self.tagged_verdict(repo, subject_digest, keys, tag).await?,
            };
            if verdict.is_verified() {
                return Ok(verdict);
            }
            best = best.better(verdict);
        }
        Ok(best)
    }

    async fn cached_verdict(&self, reference: &str, subject: &str, keys: &Keyring) -> Option<Verdict> {
        let known = self.cache().tag_digest(reference).await?;
        let evidence = self.cached_evidence(&known, keys).await?;
        Some(verify(subject, Some(&evidence), keys))
    }

    /// The evidence cached for the manifest or index `digest`, when it was
    /// read for every attestation `keys` requires (else it is read again).
    async fn cached_evidence(&self, digest: &str, keys: &Keyring) -> Option<Evidence> {
        self.cache().evidence(digest).await.filter(|e| e.covers(&keys.attestation_types()))
    }

    /// The verdict on the referrers API's answer `index` for `subject`.
    async fn index_verdict(
        &self,
        repo: &RepositoryRef,
        subject: &str,
        keys: &Keyring,
        index: bytes::Bytes,
    ) -> Result<Verdict> {
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&index)));
        let evidence = match self.cached_evidence(&digest, keys).await {
            Some(evidence) => evidence,
            None => {
                let what = format!("referrers of {repo}@{subject}");
                let evidence = self.evidence_of(repo, &index, &what, Some(keys)).await?;
                self.cache().put_evidence(&digest, &evidence).await;
                evidence
            }
        };
        self.cache().put_tag_digest(&Place::Referrers.reference(repo, subject), &digest).await;
        Ok(verify(subject, Some(&evidence), keys))
    }

    /// The verdict on the signature manifest (or referrers index) at `tag`.
    async fn tagged_verdict(
        &self,
        repo: &RepositoryRef,
        subject: &str,
        keys: &Keyring,
        tag: &str,
    ) -> Result<Verdict> {
        let reference = Place::Tag(tag.to_string()).reference(repo, subject);
        let known = self.cache().tag_digest(&reference).await;
        let digest = match known {
            // Seen before: where it points now, by a HEAD.
            Some(_) => match self.head_digest(repo, tag).await? {
                Some(digest) => digest,
                None => return Ok(Verdict::Unsigned),
            },
            // Never seen: one GET by tag, its digest the body's.
            None => match self.read_evidence(repo, tag, keys).await? {
                Some((digest, evidence)) => {
                    self.cache().put_evidence(&digest, &evidence).await;
                    self.cache().put_tag_digest(&reference, &digest).await;
                    return Ok(verify(subject, Some(&evidence), keys));
                }
                None => return Ok(Verdict::Unsigned),
            },
        };
        let evidence = match self.cached_evidence(&digest, keys).await {
            Some(evidence) => evidence,
            None => match self.read_evidence(repo, &digest, keys).await? {
                Some((_, evidence)) => {
                    self.cache().put_evidence(&digest, &evidence).await;
                    evidence
                }
                None => return Ok(Verdict::Unsigned),
            },
        };
        self.cache().put_tag_digest(&reference, &digest).await;
        Ok(verify(subject, Some(&evidence), keys))
    }

    /// The OCI referrers API's index for `subject`; `None` when the registry
    /// does not offer it (404, remembered for [`crate::referrers::REFERRERS_ABSENT_FOR`]), or
    /// is an OCI image layout (which cosign's tag schema serves).
    pub(crate) async fn referrers(
        &self,
        repo: &RepositoryRef,
        subject: &str,
    ) -> Result<Option<bytes::Bytes>> {
        if Layout::of(repo, self.transport().config())?.is_some()
            || self.referrers_absent().known(&repo.registry)
        {
            return Ok(None);
        }
        let what = format!("referrers of {repo}@{subject}");
        let path = format!("/v2/{}/referrers/{subject}", repo.api_repository());
        let mut request = self.request("referrers", what.clone(), repo, Method::GET, &path);
        request.accept = &[OCI_IMAGE_INDEX_MEDIA_TYPE];
        let response = self.transport().send(&request).await?;
        if !offers_referrers(response.status, response.header("content-type")) {
            self.referrers_absent().remember(&repo.registry);
            return Ok(None);
        }
        check_status(&response, &what)?;
        Ok(Some(response.body))
    }

    /// The signature manifest or referrers index `reference` (its tag, or
    /// its digest) names: its digest (the body's, checked against the one
    /// asked or served) and what it holds; `None` when absent.
    async fn read_evidence(
        &self,
        repo: &RepositoryRef,
        reference: &str,
        keys: &Keyring,
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
        Ok(Some((digest, self.evidence_of(repo, &body, &what, Some(keys)).await?)))
    }

    /// What the manifest `body` holds: its signature layers' payloads and
    /// bundles, or (an index, when following one: `keys` given) those of
    /// each referrer it lists, signatures and the attestations `keys` requires.
    async fn evidence_of(
        &self,
        repo: &RepositoryRef,
        body: &[u8],
        what: &str,
        follow: Option<&Keyring>,
    ) -> Result<Evidence> {
        let wanted = follow.map(Keyring::attestation_types).unwrap_or_default();
        let mut evidence = Evidence { predicates: wanted.clone(), ..Evidence::default() };
        let layers = match decode::signature_manifest(body, MAX_SIGNATURES, &wanted) {
            Ok(SignatureManifest::Image(layers)) => layers,
            Ok(SignatureManifest::Index(referrers)) if follow.is_some() => {
                for digest in referrers {
                    let what = format!("{what}, its referrer {digest}");
                    let Some((body, ..)) = self.fetch_manifest(repo, &digest, &what).await? else {
                        return Err(RegistryError::NotFound { what, code: "MANIFEST_UNKNOWN".into() });
                    };
                    check_digest(&body, &digest, &what)?;
                    let found = Box::pin(self.evidence_of(repo, &body, &what, None)).await?;
                    evidence.layers.extend(found.layers);
                    evidence.bundles.extend(found.bundles);
                    evidence.problems.extend(found.problems);
                }
                return Ok(evidence);
            }
            Ok(SignatureManifest::Index(_)) => {
                evidence.problems.push(format!("{what}: a referrer is an index, not a signature"));
                return Ok(evidence);
            }
            Err(problem) => {
                evidence.problems.push(problem);
                return Ok(evidence);
            }
        };
        for layer in layers {
            if !(0..=MAX_PAYLOAD_BYTES as i64).contains(&layer.size) {
                evidence
                    .problems
                    .push(format!("layer {} is {} bytes, not a signature", layer.digest, layer.size));
                continue;
            }
            if let Holds::SimpleSigning { signature: None } = layer.holds {
                evidence.problems.push(format!("layer {} has no signature annotation", layer.digest));
                continue;
            }
            let payload = self.blob(repo, &layer.digest).await?;
            match layer.holds {
                Holds::SimpleSigning { signature: Some(signature) } => {
                    evidence.layers.push(SignedPayload { payload, signature })
                }
                Holds::SimpleSigning { signature: None } => {}
                Holds::Bundle => evidence.bundles.push(payload),
            }
        }
        Ok(evidence)
    }

    /// The blob `digest` of `repo` (at most [`MAX_PAYLOAD_BYTES`]), checked
    /// against its digest. An absent blob is an error, as a 500 is: a
    /// signature whose payload cannot be read now is not known to be bad.
    async fn blob(&self, repo: &RepositoryRef, digest: &str) -> Result<Vec<u8>> {
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
                None
            } else {
                check_status(&response, &what)?;
                Some(response.body.to_vec())
            }
        };
        let Some(body) = body else {
            return Err(RegistryError::NotFound { what, code: "BLOB_UNKNOWN".into() });
        };
        check_digest(&body, digest, &what)?;
        Ok(body)
    }
}

/// Whether an answer to `GET /v2/<name>/referrers/<digest>` comes from a
/// registry offering the API, as cosign's client (go-containerregistry,
/// `remote/referrers.go`) decides: 404, 400 and 406 mean it does not, and so
/// does a 200 that is not an OCI image index (a catch-all page); the tag
/// schema then stands in. Any other status is an error of the read.
fn offers_referrers(status: StatusCode, content_type: Option<&str>) -> bool {
    match status {
        StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST | StatusCode::NOT_ACCEPTABLE => false,
        StatusCode::OK => content_type
            .and_then(|t| t.split(';').next())
            .is_some_and(|t| t.trim().eq_ignore_ascii_case(OCI_IMAGE_INDEX_MEDIA_TYPE)),
        _ => true,
    }
}

/// Whether `body` hashes to `digest`.
fn check_digest(body: &[u8], digest: &str, what: &str) -> Result<()> {
    let hashed = format!("sha256:{}", hex::encode(Sha256::digest(body)));
    if hashed != digest {
        return Err(RegistryError::InvalidBody {
            what: what.to_string(),
            problem: format!("content does not match its digest (got {hashed}): truncated or corrupt"),
        });
    }
    Ok(())
}

/// `sha256-<hex>.sig` of `sha256:<hex>`; `None` for another digest form.
pub fn signature_tag(subject_digest: &str) -> Option<String> {
    let tag = ArtifactTag { kind: ArtifactKind::Signature, subject: subject_digest.to_string() }.name();
    ArtifactTag::parse(&tag).map(|_| tag)
}

fn blob_path(repo: &RepositoryRef, digest: &str) -> String {
    format!("/v2/{}/blobs/{digest}", repo.api_repository())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// go-containerregistry `pkg/v1/remote/referrers.go` (what cosign
    /// lists referrers with): `CheckError(resp, 200, 404, 400, 406)`, and the
    /// tag schema "if resp.StatusCode != 200 || Content-Type != OCIImageIndex".
    #[test]
    fn the_referrers_api_is_offered_as_cosigns_client_decides() {
        let index = Some("application/vnd.oci.image.index.v1+json");
        assert!(offers_referrers(StatusCode::OK, index));
        assert!(offers_referrers(
            StatusCode::OK,
            Some("application/vnd.oci.image.index.v1+json; charset=utf-8")
        ));
        for status in [StatusCode::NOT_FOUND, StatusCode::BAD_REQUEST, StatusCode::NOT_ACCEPTABLE] {
            assert!(!offers_referrers(status, index), "{status}: the tag schema stands in");
        }
        assert!(!offers_referrers(StatusCode::OK, Some("text/html")), "a catch-all page");
        assert!(!offers_referrers(StatusCode::OK, None));
        for status in
            [StatusCode::UNAUTHORIZED, StatusCode::INTERNAL_SERVER_ERROR, StatusCode::TOO_MANY_REQUESTS]
        {
            assert!(offers_referrers(status, None), "{status}: an error of the read, never \"no referrers\"");
        }
    }
}
