//! Which tags are package versions, and how they are ordered.
//!
//! A package version is a strict SemVer 2.0 tag with an optional leading `v`
//! kept as published (upstream's "security filter", `docs/upstream-vynil.md` §3.4). Anything
//! else — cosign `sha256-….sig`, `latest`, `4.0`, `01.0.0`, `trivy--x` — is not
//! a version. Cosign-convention artifact tags are recognised separately
//! ([`ArtifactTag`]) because retention must keep those of kept digests.

use std::{
    cmp::Ordering,
    fmt,
    hash::{Hash, Hasher},
};

use semver::Version;

/// A tag that is a package version.
#[derive(Debug, Clone, Eq)]
pub struct Tag {
    raw: String,
    version: Version,
}

impl Tag {
    /// `Some` iff `raw` is a strict SemVer version, optionally prefixed by `v`.
    pub fn parse(raw: &str) -> Option<Tag> {
        Some(Tag { version: Self::version_of(raw)?, raw: raw.to_string() })
    }

    /// The version [`Tag::parse`] reads in `raw`, without keeping the text.
    pub fn version_of(raw: &str) -> Option<Version> {
        let digits = raw.strip_prefix('v').unwrap_or(raw);
        // semver accepts neither a leading zero, two components, nor spaces.
        if !digits.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        Version::parse(digits).ok()
    }

    pub fn as_str(&self) -> &str {
        &self.raw
    }

    pub fn version(&self) -> &Version {
        &self.version
    }

    fn has_v(&self) -> bool {
        self.raw.starts_with('v')
    }
}

/// Equal texts: the version is read from the text, so its numbers, compared
/// first, tell most unequal tags apart without comparing the texts (sorted
/// neighbours differ there; the planner compares every neighbouring pair).
impl PartialEq for Tag {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (&self.version, &other.version);
        a.patch == b.patch && a.minor == b.minor && a.major == b.major && self.raw == other.raw
    }
}

/// By the text, as equality.
impl Hash for Tag {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.raw.hash(state);
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

/// SemVer precedence; then upstream's tie-break (`1.0.0` < `v1.0.0`); then the
/// raw text, so that the order is total (build metadata has no precedence).
impl Ord for Tag {
    fn cmp(&self, other: &Self) -> Ordering {
        self.version
            .cmp_precedence(&other.version)
            .then(self.has_v().cmp(&other.has_v()))
            .then_with(|| self.raw.cmp(&other.raw))
    }
}

impl PartialOrd for Tag {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Whether `tag` is a version newer than `than` (false when either is not a version).
pub fn is_newer(tag: &str, than: &str) -> bool {
    matches!((Tag::parse(tag), Tag::parse(than)), (Some(tag), Some(than)) if tag > than)
}

/// Parses every version tag among `tags` and sorts them newest first.
pub fn versions_newest_first<'a>(tags: impl IntoIterator<Item = &'a str>) -> Vec<Tag> {
    let mut versions: Vec<Tag> = tags.into_iter().filter_map(Tag::parse).collect();
    versions.sort_by(|a, b| b.cmp(a));
    versions
}

/// Kinds of artifacts attached to a manifest by a tag naming its digest:
/// cosign's conventions (`sha256-<hex>.sig|att|sbom`) and the OCI referrers
/// tag schema's index (`sha256-<hex>`, where cosign v3 lists its bundles on
/// a registry without the referrers API). None is a package version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ArtifactKind {
    Signature,
    Attestation,
    Sbom,
    /// The referrers tag schema's index (opencontainers/distribution-spec
    /// v1.1 `spec.md`, "Referrers Tag Schema").
    Referrers,
}

impl ArtifactKind {
    pub const ALL: [ArtifactKind; 4] =
        [ArtifactKind::Signature, ArtifactKind::Attestation, ArtifactKind::Sbom, ArtifactKind::Referrers];

    /// The cosign tag suffix: `sig`, `att`, `sbom`; none for the referrers index.
    pub fn suffix(self) -> Option<&'static str> {
        match self {
            ArtifactKind::Signature => Some("sig"),
            ArtifactKind::Attestation => Some("att"),
            ArtifactKind::Sbom => Some("sbom"),
            ArtifactKind::Referrers => None,
        }
    }

    /// What reports call it.
    pub fn noun(self) -> &'static str {
        match self {
            ArtifactKind::Signature => "signature",
            ArtifactKind::Attestation => "attestation",
            ArtifactKind::Sbom => "SBOM",
            ArtifactKind::Referrers => "referrers index",
        }
    }
}

/// A tag `sha256-<64 hex>[.<sig|att|sbom>]`: an artifact of the manifest
/// whose digest is `sha256:<hex>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArtifactTag {
    pub kind: ArtifactKind,
    /// `sha256:<hex>`
    pub subject: String,
}

impl ArtifactTag {
    /// The tag name: `sha256-<hex>.<suffix>`, or `sha256-<hex>`.
    pub fn name(&self) -> String {
        let base = self.subject.replacen(':', "-", 1);
        match self.kind.suffix() {
            Some(suffix) => format!("{base}.{suffix}"),
            None => base,
        }
    }

    /// Whether a revision's signatures may be under it: cosign's `.sig`, or
    /// the referrers tag schema's index (bundles).
    pub fn holds_signatures(&self) -> bool {
        matches!(self.kind, ArtifactKind::Signature | ArtifactKind::Referrers)
    }

    pub fn parse(raw: &str) -> Option<ArtifactTag> {
        let rest = raw.strip_prefix("sha256-")?;
        let (hex, kind) = match rest.split_once('.') {
            Some((hex, suffix)) => (hex, ArtifactKind::ALL.into_iter().find(|k| k.suffix() == Some(suffix))?),
            None => (rest, ArtifactKind::Referrers),
        };
        let valid_hex = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        valid_hex.then(|| ArtifactTag { kind, subject: format!("sha256:{hex}") })
    }
}

/// The tag of the OCI referrers tag schema for `subject` (`sha256:<hex>`):
/// `sha256-<hex>`, an image index listing the subject's referrers, which a
/// client maintains on a registry without the referrers API. `None` for a
/// digest that is not `sha256:` and 64 hex digits.
pub fn referrers_tag(subject: &str) -> Option<String> {
    let tag = ArtifactTag { kind: ArtifactKind::Referrers, subject: subject.to_string() }.name();
    ArtifactTag::parse(&tag).map(|_| tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_strict_semver_tags_are_versions() {
        let table = [
            ("1.0.0", true),
            ("v1.0.0", true),
            ("1.1.0-rc.1", true),
            ("1.0.0-beta.2+build.5", true),
            ("4.0", false),
            ("latest", false),
            ("01.0.0", false),
            ("1.0.0 ", false),
            ("V1.0.0", false),
            ("vv1.0.0", false),
            ("trivy--x", false),
            ("sha256-abc.sig", false),
            ("", false),
            ("1.0.0.0", false),
        ];
        for (raw, expected) in table {
            assert_eq!(Tag::parse(raw).is_some(), expected, "{raw:?}");
        }
    }

    #[test]
    fn a_leading_v_is_kept_as_published() {
        assert_eq!(Tag::parse("v1.2.3").unwrap().as_str(), "v1.2.3");
    }

    #[test]
    fn versions_sort_by_semver_precedence_newest_first() {
        let sorted = versions_newest_first([
            "1.0.0",
            "1.10.0",
            "1.2.0",
            "1.10.0-rc.1",
            "latest",
            "v1.0.0",
            "2.0.0-alpha.10",
            "2.0.0-alpha.9",
        ]);
        let raw: Vec<&str> = sorted.iter().map(Tag::as_str).collect();
        assert_eq!(
            raw,
            ["2.0.0-alpha.10", "2.0.0-alpha.9", "1.10.0", "1.10.0-rc.1", "1.2.0", "v1.0.0", "1.0.0"]
        );
    }

    #[test]
    fn cosign_artifact_tags_name_their_subject_digest() {
        let hex = "a".repeat(64);
        let sig = ArtifactTag::parse(&format!("sha256-{hex}.sig")).unwrap();
        assert_eq!(sig.name(), format!("sha256-{hex}.sig"), "a name round-trips");
        assert_eq!(sig.kind, ArtifactKind::Signature);
        assert_eq!(sig.subject, format!("sha256:{hex}"));
        assert_eq!(ArtifactTag::parse(&format!("sha256-{hex}.sbom")).unwrap().kind, ArtifactKind::Sbom);
        assert!(ArtifactTag::parse("sha256-abc.sig").is_none(), "short digest");
        assert!(ArtifactTag::parse(&format!("sha256-{hex}.txt")).is_none());
        assert!(ArtifactTag::parse(&format!("sha256-{}.sig", "A".repeat(64))).is_none());
        let holds =
            |suffix: &str| ArtifactTag::parse(&format!("sha256-{hex}{suffix}")).unwrap().holds_signatures();
        assert!(holds(".sig") && holds(""), "cosign's .sig and the tag schema's index hold signatures");
        assert!(!holds(".att") && !holds(".sbom"));
    }

    /// The referrers tag schema: `<alg>-<ref>` of the subject's digest, no
    /// suffix (distribution-spec v1.1, "Referrers Tag Schema").
    #[test]
    fn the_referrers_tag_schema_index_is_an_artifact_not_a_version() {
        let hex = "b".repeat(64);
        let index = ArtifactTag::parse(&format!("sha256-{hex}")).unwrap();
        assert_eq!(index.kind, ArtifactKind::Referrers);
        assert_eq!(index.subject, format!("sha256:{hex}"));
        assert_eq!(index.name(), format!("sha256-{hex}"));
        assert_eq!(referrers_tag(&format!("sha256:{hex}")), Some(format!("sha256-{hex}")));
        assert!(Tag::parse(&format!("sha256-{hex}")).is_none(), "never a version");
        for not in [format!("sha256-{hex}."), format!("sha256-{}", "b".repeat(63)), "sha256-".into()] {
            assert!(ArtifactTag::parse(&not).is_none(), "{not}");
        }
        assert_eq!(referrers_tag("sha512:abc"), None);
    }
}
