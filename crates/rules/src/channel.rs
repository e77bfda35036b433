//! Maturity channels and the framework-version check.
//!
//! Maturity is upstream's substring test on the raw tag, not pre-release
//! parsing: `alpha` admits everything, `beta` everything without "alpha",
//! `stable` (or no maturity) everything with neither "alpha" nor "beta" — so
//! `1.1.0-rc.1` is stable (`docs/upstream-vynil.md` §3.5).

use std::fmt;

use semver::Version;

use crate::package::PackageContent;

/// JukeBox `spec.maturity`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    #[default]
    Stable,
    Beta,
    Alpha,
}

impl Channel {
    pub const ALL: [Channel; 3] = [Channel::Stable, Channel::Beta, Channel::Alpha];

    /// Whether a consumer on this channel may be shown `raw_tag`.
    pub fn admits(self, raw_tag: &str) -> bool {
        Channel::narrowest_admitting(raw_tag) <= self
    }

    /// The narrowest channel that admits `raw_tag`: it and every wider one
    /// do (`stable` < `beta` < `alpha`), so a caller filtering a tag for
    /// several channels searches its text once.
    pub fn narrowest_admitting(raw_tag: &str) -> Channel {
        // Both words hold an `a`: most tags have none, and a byte search is
        // cheaper than two substring searches (views filter every tag). A tag
        // is short: comparing each window costs half what setting up
        // `str::contains`'s searcher did (finding every tag's maturity was 5%
        // of a plan).
        let bytes = raw_tag.as_bytes();
        let holds = |word: &[u8]| bytes.windows(word.len()).any(|window| window == word);
        if !bytes.contains(&b'a') {
            Channel::Stable
        } else if holds(b"alpha") {
            Channel::Alpha
        } else if holds(b"beta") {
            Channel::Beta
        } else {
            Channel::Stable
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Stable => "stable",
            Channel::Beta => "beta",
            Channel::Alpha => "alpha",
        }
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a revision can run on framework (`--vynil-version`) `framework`:
/// no valid `vynil_version` requirement exceeds it, by SemVer precedence
/// (so `0.7.8-alpha.4` does not satisfy `0.7.8`, as upstream).
pub fn runs_on(content: &PackageContent, framework: &Version) -> bool {
    satisfies(content.vynil_versions(), framework)
}

/// Whether `framework` meets every one of `required` (SemVer precedence).
pub fn satisfies<V: std::borrow::Borrow<Version>>(
    mut required: impl Iterator<Item = V>,
    framework: &Version,
) -> bool {
    required.all(|r| r.borrow().cmp_precedence(framework) != std::cmp::Ordering::Greater)
}

/// The first `vynil_version` requirement `framework` does not satisfy.
pub fn framework_shortfall(content: &PackageContent, framework: &Version) -> Option<Version> {
    content
        .vynil_versions()
        .find(|required| required.cmp_precedence(framework) == std::cmp::Ordering::Greater)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::content;

    #[test]
    fn stable_drops_alpha_and_beta_but_keeps_release_candidates() {
        let table = [
            ("1.0.0", true, true, true),
            ("1.1.0-rc.1", true, true, true),
            ("1.1.0-beta.1", false, true, true),
            ("1.1.0-alpha.1", false, false, true),
            // Substring, not pre-release parsing: upstream semantics.
            ("1.1.0-rc.1+alphabet", false, false, true),
        ];
        for (tag, stable, beta, alpha) in table {
            assert_eq!(Channel::Stable.admits(tag), stable, "stable {tag}");
            assert_eq!(Channel::Beta.admits(tag), beta, "beta {tag}");
            assert_eq!(Channel::Alpha.admits(tag), alpha, "alpha {tag}");
        }
    }

    #[test]
    fn a_revision_needing_a_newer_framework_does_not_run_on_an_older_one() {
        let framework = Version::new(0, 8, 0);
        assert!(runs_on(&content("tenant", None, None), &framework));
        assert!(runs_on(&content("tenant", None, Some("0.8.0")), &framework));
        assert!(!runs_on(&content("tenant", None, Some("0.9.0")), &framework));
        assert!(!runs_on(&content("tenant", None, Some("0.7.8")), &Version::parse("0.7.8-alpha.4").unwrap()));
        // An unparsable requirement is no requirement (upstream).
        assert!(runs_on(&content("tenant", None, Some("soon")), &framework));
    }
}
