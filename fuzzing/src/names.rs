//! Names a user or a registry hands us: tags, artifact tags, partial-scan
//! filters, repository references, Kubernetes names.
//!
//! Properties: a version tag keeps its text and parses again the same; the
//! channels admit nested sets (stable ⊆ beta ⊆ alpha); an artifact tag spells
//! its own name; a filter has one or two non-empty segments without spaces;
//! a repository reference prints as text that parses back to itself; a
//! valid Kubernetes name is within its length and alphabet.

use arbitrary::{Arbitrary, Result, Unstructured};
use vynil_rules::{ArtifactTag, Channel, ScanFilter, Tag};

use crate::input::{Text, VersionText};

#[derive(Debug)]
pub struct Names {
    pub texts: Vec<String>,
}

impl<'a> Arbitrary<'a> for Names {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let n = u.int_in_range(1..=8usize)?;
        let mut texts = Vec::with_capacity(n);
        for _ in 0..n {
            texts.push(match u.int_in_range(0..=5u8)? {
                0 => VersionText::arbitrary(u)?.0,
                1 => format!("sha256-{}.{}", hex_like(u)?, u.choose(&["sig", "att", "sbom", "SIG", "x"])?),
                2 => format!("{}/{}", Text::arbitrary(u)?.0, Text::arbitrary(u)?.0),
                3 => format!("{}/{}/{}", Text::arbitrary(u)?.0, Text::arbitrary(u)?.0, Text::arbitrary(u)?.0),
                _ => Text::arbitrary(u)?.0,
            });
        }
        Ok(Names { texts })
    }
}

fn hex_like(u: &mut Unstructured<'_>) -> Result<String> {
    let len = if u.ratio(4, 5)? { 64 } else { u.int_in_range(0..=70usize)? };
    (0..len).map(|_| u.choose(b"0123456789abcdefABX").map(|b| *b as char)).collect()
}

pub fn run(data: &[u8]) {
    let Ok(names) = Names::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    for text in &names.texts {
        check(text);
    }
}

pub fn check(text: &str) {
    if let Some(tag) = Tag::parse(text) {
        assert_eq!(tag.as_str(), text);
        assert_eq!(Tag::parse(tag.as_str()).as_ref(), Some(&tag));
        assert_eq!(Tag::version_of(text).as_ref(), Some(tag.version()));
    }
    assert!(Channel::Alpha.admits(text), "alpha admits everything");
    if Channel::Stable.admits(text) {
        assert!(Channel::Beta.admits(text), "{text:?}: stable but not beta");
    }
    if let Some(artifact) = ArtifactTag::parse(text) {
        assert_eq!(artifact.name(), text);
        assert!(artifact.subject.starts_with("sha256:"));
    }
    match ScanFilter::parse(text) {
        Ok(filter) => {
            let segments: Vec<&str> = text.split('/').collect();
            assert!((1..=2).contains(&segments.len()) && segments.iter().all(|s| !s.is_empty()));
            assert!(!text.chars().any(|c| c.is_whitespace() || c.is_control()));
            assert!(filter.names(&filter.category, filter.name.as_deref().unwrap_or("any")));
        }
        Err(error) => assert!(error.to_string().contains("`<category>/<name>`"), "says what to do: {error}"),
    }
    if let Ok(repository) = vynil_registry::RepositoryRef::parse(text) {
        let printed = repository.to_string();
        assert_eq!(vynil_registry::RepositoryRef::parse(&printed).ok().as_ref(), Some(&repository));
    }
    if vynil_crds::names::validate_subdomain("name", text).is_ok() {
        assert!(
            text.len() <= 253
                && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b))
        );
    }
    if vynil_crds::names::validate_label("name", text).is_ok() {
        assert!(
            text.len() <= 63
                && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        );
    }
}
