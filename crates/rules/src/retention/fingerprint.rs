//! The plan's fingerprint: a hash of everything a decision depends on, in
//! an unambiguous encoding (each field its length, then its bytes), so a
//! confirmation names exactly what was planned.

use semver::Version;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::*;
use crate::{package::PackageType, view::RevisionFacts};

/// The fingerprint of a plan over several repositories (`(name, fingerprint)`
/// in plan order); a single repository's plan keeps its own.
pub fn combined_fingerprint<'a>(parts: &[(&'a str, &'a str)]) -> String {
    match parts {
        [(_, single)] => single.to_string(),
        many => {
            let mut hasher = Sha256::new();
            for (name, fingerprint) in many {
                hasher.update(format!("{name}\0{fingerprint}\n").as_bytes());
            }
            format!("sha256:{}", hex::encode(hasher.finalize()))
        }
    }
}

/// The plan's inputs hashed in one pass, in an order-free form: every tag's
/// name, digest and the metadata the plan reads (type, minimum, framework
/// requirements), usage, framework and pins, written by [`Encoding`] so that
/// no two inputs share an encoding. (Serialising each revision to canonical
/// JSON first made the fingerprint 60% of the planning time; hashing each
/// field by its own `update` with a digest's 71 hex characters, a quarter.)
pub(super) fn fingerprint(
    tags: &[RepositoryTag],
    Parsed { versions, places, order }: &Parsed,
    facts: &[Option<RevisionFacts>],
    digests: &[ReadDigest],
    usage: &Usage,
    config: &RetentionConfig,
) -> String {
    let mut out = Encoding::default();
    out.field(b"vynil retention plan, fingerprint schema 4");
    out.version(Some(&config.framework));
    let mut pins: Vec<&str> = config.pins.iter().map(|(p, _)| p.as_str()).collect();
    pins.sort_unstable();
    pins.dedup();
    out.number(pins.len() as u64);
    for pin in pins {
        out.field(pin.as_bytes());
    }
    out.number(order.len() as u64);
    for &at in order {
        let tag = &tags[at];
        // A version's name is read from its parsed copy: the copies were
        // made one after the other, so they share cache lines, where the
        // names listed sit among the rest of their tags.
        let name = match places[at].and_then(|place| versions.as_slice().get(place)) {
            Some(version) => version.as_str(),
            None => &tag.name,
        };
        out.field(name.as_bytes());
        match digests.get(at).and_then(|d| d.raw.as_ref()) {
            Some(raw) => out.sha256(raw),
            None => out.text_digest(&tag.digest),
        }
        // What the metadata is, in one byte (the type's, for a revision).
        match (&tag.metadata, facts.get(at).and_then(Option::as_ref)) {
            (ManifestMetadata::Vynil(_), Some(facts)) => {
                out.mark(match facts.package_type {
                    PackageType::Tenant => 3,
                    PackageType::Service => 4,
                    PackageType::System => 5,
                });
                out.version(facts.minimum.as_ref());
                out.number(facts.vynil_versions.len() as u64);
                for requirement in &facts.vynil_versions {
                    out.version(Some(requirement));
                }
            }
            // Not a version: its metadata decides nothing but that it has some.
            (ManifestMetadata::Vynil(_), None) => out.mark(2),
            (ManifestMetadata::NotVynil, _) => out.mark(1),
            (ManifestMetadata::Malformed(_), _) => out.mark(0),
        }
    }
    match usage {
        Usage::Unknown => out.field(b"usage unknown"),
        Usage::Known(used) => {
            let mut used: Vec<(&str, &str, &str, RevisionUse)> = used
                .iter()
                .map(|r| (r.tag.as_str(), r.digest.as_deref().unwrap_or(""), r.instance.as_str(), r.usage))
                .collect();
            used.sort_unstable();
            out.field(b"usage known");
            out.number(used.len() as u64);
            for (tag, digest, instance, usage) in used {
                out.field(tag.as_bytes());
                out.digest(digest);
                out.field(instance.as_bytes());
                out.field(format!("{usage:?}").as_bytes());
            }
        }
    }
    out.finish()
}

/// A prefix-free encoding fed to SHA-256 in whole buffers: numbers as LEB128
/// varints, byte strings after their length, a lowercase `sha256:` digest as
/// its 32 bytes (marked, so it cannot read as another string), a version as
/// its numbers and, unless it is a release, its pre-release and build texts.
pub(super) struct Encoding {
    hasher: Sha256,
    buffer: Vec<u8>,
}

impl Default for Encoding {
    fn default() -> Self {
        Self { hasher: Sha256::new(), buffer: Vec::with_capacity(Self::FLUSH_AT + 256) }
    }
}

impl Encoding {
    const FLUSH_AT: usize = 8192;

    fn number(&mut self, mut n: u64) {
        while n >= 0x80 {
            self.buffer.push((n as u8 & 0x7f) | 0x80);
            n >>= 7;
        }
        self.buffer.push(n as u8);
    }

    fn field(&mut self, bytes: &[u8]) {
        self.number(bytes.len() as u64);
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= Self::FLUSH_AT {
            self.hasher.update(&self.buffer);
            self.buffer.clear();
        }
    }

    fn digest(&mut self, digest: &str) {
        match digest.strip_prefix("sha256:").and_then(lowercase_hex_32) {
            Some(raw) => self.sha256(&raw),
            None => self.text_digest(digest),
        }
    }

    /// One of a few alternatives, where the position says which are possible.
    fn mark(&mut self, byte: u8) {
        self.buffer.push(byte);
    }

    /// A lowercase `sha256:` digest, as its 32 bytes.
    fn sha256(&mut self, raw: &[u8; 32]) {
        self.mark(1);
        self.buffer.extend_from_slice(raw);
    }

    /// Any other digest text.
    fn text_digest(&mut self, digest: &str) {
        self.mark(0);
        self.field(digest.as_bytes());
    }

    /// A version: `0` for none, `2` and its numbers for a release (most
    /// minimums), `1`, its numbers and both texts for any other.
    fn version(&mut self, version: Option<&Version>) {
        let Some(v) = version else {
            return self.mark(0);
        };
        let release = v.pre.is_empty() && v.build.is_empty();
        self.mark(if release { 2 } else { 1 });
        self.number(v.major);
        self.number(v.minor);
        self.number(v.patch);
        if !release {
            self.field(v.pre.as_str().as_bytes());
            self.field(v.build.as_str().as_bytes());
        }
    }

    fn finish(mut self) -> String {
        self.hasher.update(&self.buffer);
        format!("sha256:{}", hex::encode(self.hasher.finalize()))
    }
}

/// The 32 bytes of 64 lowercase hex digits; `None` for anything else (upper
/// case included, so that two spellings never meet in one encoding).
/// Eight digits at a time in a `u64` (SWAR), checked by spelling the values
/// back and comparing, once at the end: every digest of every plan is
/// decoded, and a table lookup per digit was a twentieth of the planning.
pub(super) fn lowercase_hex_32(hex: &str) -> Option<[u8; 32]> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let bytes: &[u8; 64] = hex.as_bytes().try_into().ok()?;
    let mut raw = [0u8; 32];
    let mut wrong = 0;
    for (out, eight) in raw.as_chunks_mut::<4>().0.iter_mut().zip(bytes.as_chunks::<8>().0) {
        let x = u64::from_le_bytes(*eight);
        // What each byte is worth if it is a digit: its low four bits, plus
        // 9 for a letter (bit 6). At most 24: no byte carries into the next.
        let nibbles = (x & (0x0f * ONES)) + ((x >> 6) & ONES) * 9;
        // Those values spelled in lowercase (from 10, `a` is `0` + 10 +
        // 0x27): only a lowercase digit spells back as itself, given values
        // under 16 (`g`..`o` would too: they are worth 16..24).
        let letter = ((nibbles + 6 * ONES) >> 4) & ONES;
        let spelled = nibbles + 0x30 * ONES + letter * 0x27;
        wrong |= (x ^ spelled) | ((nibbles + 0x70 * ONES) & (0x80 * ONES));
        // Pairs (high, low) into bytes, then the four bytes side by side.
        let pairs = ((nibbles & 0x00ff_00ff_00ff_00ff) << 4) | ((nibbles >> 8) & 0x00ff_00ff_00ff_00ff);
        let packed = (pairs | (pairs >> 8)) & 0x0000_ffff_0000_ffff;
        let packed = (packed | (packed >> 16)) as u32;
        *out = packed.to_le_bytes();
    }
    (wrong == 0).then_some(raw)
}

/// JSON text with object keys sorted at every depth, whatever map order
/// serde_json was built with.
pub(crate) fn canonical(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let body: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical(&map[k])))
                .collect();
            format!("{{{}}}", body.join(","))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(canonical).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

pub(super) fn version_suffix(framework: &Option<Version>) -> String {
    framework.as_ref().map(|v| format!(" on vynil {v}")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `lowercase_hex_32` must answer, one digit at a time.
    fn reference(hex: &str) -> Option<[u8; 32]> {
        let lowercase = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let decoded = hex::decode(hex).ok()?;
        lowercase.then(|| decoded.try_into().ok()).flatten()
    }

    #[test]
    fn a_field_is_encoded_as_its_length_and_every_one_of_its_bytes() {
        for length in 0..40u8 {
            let bytes: Vec<u8> = (0..length).map(|i| i.wrapping_mul(37).wrapping_add(length)).collect();
            let mut out = Encoding::default();
            out.mark(0xee);
            out.field(&bytes);
            out.mark(0xff);
            let expected: Vec<u8> = [vec![0xee, length], bytes, vec![0xff]].concat();
            assert_eq!(out.buffer, expected, "a field of {length} bytes");
        }
    }

    #[test]
    fn a_digest_decodes_as_its_bytes_and_any_other_digit_is_refused() {
        let base: String = (0..64).map(|i| char::from(b"0123456789abcdef"[(i * 7 + 3) % 16])).collect();
        assert_eq!(lowercase_hex_32(&base), reference(&base));
        assert!(lowercase_hex_32(&base).is_some());
        // Every byte value at every position.
        for position in 0..64 {
            for byte in 0..=255u8 {
                let mut bytes = base.clone().into_bytes();
                bytes[position] = byte;
                let Ok(text) = String::from_utf8(bytes) else { continue };
                assert_eq!(lowercase_hex_32(&text), reference(&text), "{text:?}");
            }
        }
        for wrong in ["", "ab", &base[1..], &format!("{base}0"), &base.to_uppercase()] {
            assert_eq!(lowercase_hex_32(wrong), None, "{wrong:?}");
        }
    }
}
