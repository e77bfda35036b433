//! What a registry's answers say, decoded without I/O: tag-list pages, `Link`
//! and `WWW-Authenticate` headers, manifests and indexes, referrers and error
//! envelopes. The one place each body and header is read, so the client and
//! the fuzz targets (`fuzzing`) run the same code on the same bytes.
//! Nothing here trusts its input: each decoder answers a value or a problem
//! in words, never a panic.

use std::collections::{BTreeMap, HashMap};

use oci_client::manifest::OciManifest;

/// The tags of one `/tags/list` page (`tags` may be null or absent: none).
pub fn tag_page(body: &[u8]) -> Result<Vec<String>, String> {
    #[derive(serde::Deserialize)]
    struct TagList {
        tags: Option<Vec<String>>,
    }
    serde_json::from_slice::<TagList>(body)
        .map(|page| page.tags.unwrap_or_default())
        .map_err(|e| format!("tag list is not JSON: {e}"))
}

/// The path and query of `<…>; rel="next"` in a `Link` header sent with
/// the page at `current` (a path); `None` without a next page. The target is
/// resolved as an HTTP client resolves a link, on a placeholder origin, and
/// only its path and query are kept: the next page is asked of the same
/// registry whatever the link names (kept as text, a target such as
/// `@other.host/…` or `.other.host/…` glued behind the registry's URL named
/// another host, found by the fuzzer). A next link that cannot be followed
/// is an error, never the end of the list: the rest of the tags is unknown,
/// not absent.
pub fn next_link(header: &str, current: &str) -> Result<Option<String>, String> {
    let next = header.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        let is_next = params.split(';').any(|p| {
            let p = p.trim().replace(' ', "");
            p == "rel=\"next\"" || p == "rel=next"
        });
        is_next.then(|| target.trim())
    });
    let Some(target) = next else {
        return Ok(None);
    };
    let unusable = |why: String| format!("the next-page link {target:?} cannot be followed: {why}");
    let inner = target.strip_prefix('<').and_then(|t| t.strip_suffix('>'));
    let inner = inner.ok_or_else(|| unusable("it is not written <…>".into()))?;
    let base = url::Url::parse("https://registry.invalid")
        .and_then(|origin| origin.join(current))
        .map_err(|e| format!("the page {current:?} is not a path: {e}"))?;
    let next = base.join(inner).map_err(|e| unusable(e.to_string()))?;
    if !matches!(next.scheme(), "http" | "https") {
        return Err(unusable(format!("{} is not an http URL", next.scheme())));
    }
    Ok(Some(format!("{}{}", next.path(), next.query().map(|q| format!("?{q}")).unwrap_or_default())))
}

/// A manifest's annotations and, for an index, the digest of its first entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ManifestBody {
    pub annotations: BTreeMap<String, String>,
    pub first: Option<String>,
}

/// An image manifest or an index (OCI or Docker media types).
pub fn manifest(body: &[u8]) -> Result<ManifestBody, String> {
    let parsed: OciManifest =
        serde_json::from_slice(body).map_err(|e| format!("not an OCI manifest: {e}"))?;
    Ok(match parsed {
        OciManifest::Image(image) => ManifestBody {
            annotations: image.annotations.unwrap_or_default().into_iter().collect(),
            first: None,
        },
        OciManifest::ImageIndex(index) => ManifestBody {
            first: index.manifests.first().map(|m| m.digest.clone()),
            annotations: index.annotations.unwrap_or_default().into_iter().collect(),
        },
    })
}

/// One signature layer of a manifest: its blob's digest and size, and what
/// it holds: a simple-signing payload with its signature annotation
/// (`None`: it has none), or a Sigstore bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureLayer {
    pub digest: String,
    pub size: i64,
    pub holds: Holds,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holds {
    SimpleSigning { signature: Option<String> },
    Bundle,
}

/// What a revision's signature manifest is: an image manifest with
/// signature layers (cosign's `.sig`, a bundle's manifest), or a referrers
/// index (the OCI referrers tag schema `sha256-<hex>`, or the referrers
/// API's answer) listing the digests of the referrers that may be
/// signatures, at most `max` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureManifest {
    Image(Vec<SignatureLayer>),
    Index(Vec<String>),
}

/// The artifact type cosign gives a legacy (simple-signing) signature
/// attached as a referrer (`cosign sign --registry-referrers-mode=oci-1-1`).
pub const COSIGN_SIGNATURE_ARTIFACT_TYPE: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";

/// The signature layers of an image manifest, or the referrers of an index
/// that may be signatures: bundles whose predicate type, when annotated, is
/// cosign's signature's or one of `attestations` (the predicate types a
/// policy requires; other attestations are not read), and legacy signatures
/// attached as referrers. Other layers and entries are skipped.
pub fn signature_manifest(
    body: &[u8],
    max: usize,
    attestations: &[String],
) -> Result<SignatureManifest, String> {
    use vynil_rules::signature::{
        SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE,
        bundle::{PREDICATE_TYPE_ANNOTATION, SIGN_PREDICATE_TYPE, is_bundle_media_type},
    };
    match serde_json::from_slice::<OciManifest>(body) {
        Ok(OciManifest::Image(image)) => Ok(SignatureManifest::Image(
            image
                .layers
                .into_iter()
                .filter_map(|l| {
                    let holds = if l.media_type == SIMPLE_SIGNING_MEDIA_TYPE {
                        Holds::SimpleSigning {
                            signature: l.annotations.and_then(|a| a.get(SIGNATURE_ANNOTATION).cloned()),
                        }
                    } else if is_bundle_media_type(&l.media_type) {
                        Holds::Bundle
                    } else {
                        return None;
                    };
                    Some(SignatureLayer { digest: l.digest, size: l.size, holds })
                })
                .take(max)
                .collect(),
        )),
        Ok(OciManifest::ImageIndex(index)) => Ok(SignatureManifest::Index(
            index
                .manifests
                .into_iter()
                .filter(|m| {
                    let kind = m.artifact_type.as_deref().unwrap_or(&m.media_type);
                    let predicate = m.annotations.as_ref().and_then(|a| a.get(PREDICATE_TYPE_ANNOTATION));
                    let wanted = |p: &String| p == SIGN_PREDICATE_TYPE || attestations.contains(p);
                    (is_bundle_media_type(kind) && predicate.is_none_or(wanted))
                        || kind == COSIGN_SIGNATURE_ARTIFACT_TYPE
                })
                .map(|m| m.digest)
                .take(max)
                .collect(),
        )),
        Err(e) => Err(format!("not an OCI manifest: {e}")),
    }
}

/// One entry of a referrers index: `(digest, artifact type or media type)`.
pub fn referrers(body: &[u8]) -> Option<Vec<(String, String)>> {
    match serde_json::from_slice::<OciManifest>(body) {
        Ok(OciManifest::ImageIndex(index)) => Some(
            index
                .manifests
                .into_iter()
                .map(|m| (m.digest, m.artifact_type.unwrap_or(m.media_type)))
                .collect(),
        ),
        _ => None,
    }
}

/// The distribution error envelope's first `(code, message)`; for a body
/// that is not one, no code and at most its first 200 bytes as the message.
pub fn error_envelope(body: &[u8]) -> (String, String) {
    #[derive(serde::Deserialize)]
    struct Envelope {
        errors: Vec<Item>,
    }
    #[derive(serde::Deserialize)]
    struct Item {
        code: Option<String>,
        message: Option<String>,
    }
    match serde_json::from_slice::<Envelope>(body) {
        Ok(envelope) => envelope
            .errors
            .into_iter()
            .next()
            .map(|e| (e.code.unwrap_or_default(), e.message.unwrap_or_default()))
            .unwrap_or_default(),
        Err(_) => (String::new(), String::from_utf8_lossy(body.get(..200).unwrap_or(body)).into_owned()),
    }
}

/// A parsed `WWW-Authenticate` challenge: the scheme and the parameters,
/// names in lower case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub scheme: String,
    pub params: HashMap<String, String>,
}

/// Parses `Scheme key="value",key=value` (quoted values may hold commas).
pub fn challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    if scheme.is_empty() {
        return None;
    }
    let mut params = HashMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ',')).collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('=') {
            break;
        }
        let value = if chars.peek() == Some(&'"') {
            chars.next();
            let mut value = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => value.extend(chars.next()),
                    other => value.push(other),
                }
            }
            value
        } else {
            std::iter::from_fn(|| chars.next_if(|c| *c != ',')).collect::<String>().trim().to_string()
        };
        params.insert(key.trim().to_ascii_lowercase(), value);
    }
    Some(Challenge { scheme: scheme.to_ascii_lowercase(), params })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_is_read_from_the_link_header() {
        let current = "/v2/a/tags/list?n=2";
        let next = |header: &str| next_link(header, current).unwrap();
        assert_eq!(
            next(r#"</v2/a/tags/list?last=x&n=2>; rel="next""#).as_deref(),
            Some("/v2/a/tags/list?last=x&n=2")
        );
        assert_eq!(
            next(r#"<https://r.example/v2/a/tags/list?last=x>; rel="next""#).as_deref(),
            Some("/v2/a/tags/list?last=x")
        );
        assert_eq!(next(r#"</v2/a/tags/list?last=x>; rel="prev""#), None);
        assert_eq!(
            next(r#"<list?last=x>; rel="next""#).as_deref(),
            Some("/v2/a/tags/list?last=x"),
            "relative"
        );
    }

    #[test]
    fn a_link_never_moves_the_next_page_to_another_host() {
        // Glued behind `https://registry.example`, each of these named another host.
        for target in
            ["@evil.example/v2/a/tags/list", ".evil.example/v2/a/tags/list", "//evil.example/v2/x", "tenant"]
        {
            let path = next_link(&format!(r#"<{target}>; rel="next""#), "/v2/a/tags/list").unwrap().unwrap();
            let url = url::Url::parse(&format!("https://registry.example{path}")).unwrap();
            assert_eq!(url.host_str(), Some("registry.example"), "{target} gave {path}");
        }
        // One that cannot be followed is an error, not the end of the list.
        for target in [r#"sha256:>; rel="next""#, r#"no-brackets; rel="next""#] {
            assert!(next_link(target, "/v2/a/tags/list").is_err(), "{target}");
        }
        assert!(next_link(r#"<sha256:>; rel="next""#, "/v2/a/tags/list").is_err());
    }

    #[test]
    fn a_bearer_challenge_is_parsed_with_quoted_commas() {
        let c = challenge(r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#).unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.params["realm"], "https://auth.example/token");
        assert_eq!(c.params["scope"], "repository:a/b:pull,push");
        assert_eq!(challenge(r#"Basic realm="x""#).unwrap().scheme, "basic");
    }
}
