//! Structure-aware pieces shared by the targets: texts drawn mostly from the
//! words the decoders know (so that deep parsing is reached), sometimes
//! anything; versions mostly valid SemVer; JSON values of bounded depth.

use arbitrary::{Arbitrary, Result, Unstructured};
use serde_json::{Map, Number, Value};

/// Words the decoders give meaning to, and near misses of them.
pub const WORDS: &[&str] = &[
    "tenant",
    "service",
    "system",
    "stable",
    "beta",
    "alpha",
    "apps",
    "web",
    "db",
    "think",
    "ollama",
    "latest",
    "upgrade",
    "backup",
    "true",
    "false",
    "",
    " ",
    "-",
    "a/b",
    "a//b",
    "/",
    "v",
    "sha256:",
    "minimum_previous_version",
    "vynil_version",
    "custom_resource_definition",
    "prefly",
    "cpu",
    "Tenant",
    "SERVICE",
    "\u{0}",
    "é",
    "../x",
    "a b",
];

/// Pre-release and build parts of generated versions.
const PRE: &[&str] =
    &["", "-alpha.1", "-beta.2", "-rc.1", "-alpha", "-beta.alpha", "+build.5", "-0", "-01", "-x-y"];

/// Some text: a known word, a version, or anything.
#[derive(Debug, Clone)]
pub struct Text(pub String);

impl<'a> Arbitrary<'a> for Text {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(Text(match u.int_in_range(0..=9u8)? {
            0..=4 => (*u.choose(WORDS)?).to_string(),
            5..=7 => VersionText::arbitrary(u)?.0,
            _ => String::arbitrary(u)?,
        }))
    }
}

/// A version tag: mostly strict SemVer with an optional `v`, sometimes a
/// near miss (`4.0`, `01.0.0`, `v`).
#[derive(Debug, Clone)]
pub struct VersionText(pub String);

impl<'a> Arbitrary<'a> for VersionText {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let (major, minor, patch) =
            (u.int_in_range(0..=12u64)?, u.int_in_range(0..=12u64)?, u.int_in_range(0..=12u64)?);
        let pre = u.choose(PRE)?;
        let v = if u.ratio(1, 5)? { "v" } else { "" };
        Ok(VersionText(match u.int_in_range(0..=9u8)? {
            0 => format!("{major}.{minor}"),
            1 => format!("0{major}.{minor}.{patch}"),
            2 => format!("{v}{major}.{minor}.{patch}{pre}{}", String::arbitrary(u)?),
            _ => format!("{v}{major}.{minor}.{patch}{pre}"),
        }))
    }
}

/// A JSON value of bounded depth, strings mostly known words.
#[derive(Debug, Clone)]
pub struct Json(pub Value);

impl<'a> Arbitrary<'a> for Json {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        json(u, 3).map(Json)
    }
}

fn json(u: &mut Unstructured<'_>, depth: u8) -> Result<Value> {
    let choice = u.int_in_range(0..=if depth == 0 { 4 } else { 6u8 })?;
    Ok(match choice {
        0 => Value::Null,
        1 => Value::Bool(bool::arbitrary(u)?),
        2 => Value::Number(Number::from(i64::arbitrary(u)?)),
        3 => Number::from_f64(f64::arbitrary(u)?).map(Value::Number).unwrap_or(Value::Null),
        4 => Value::String(Text::arbitrary(u)?.0),
        5 => {
            let n = u.int_in_range(0..=4usize)?;
            Value::Array((0..n).map(|_| json(u, depth - 1)).collect::<Result<_>>()?)
        }
        _ => {
            let n = u.int_in_range(0..=4usize)?;
            let mut map = Map::new();
            for _ in 0..n {
                map.insert(Text::arbitrary(u)?.0, json(u, depth - 1)?);
            }
            Value::Object(map)
        }
    })
}

/// `value` as a document, or spoilt: a field dropped, retyped, or the text cut.
pub fn spoil(u: &mut Unstructured<'_>, value: Value) -> Result<String> {
    Ok(match u.int_in_range(0..=9u8)? {
        0 => {
            let text = value.to_string();
            let cut = u.int_in_range(0..=text.len())?;
            text.get(..cut).unwrap_or(&text).to_string()
        }
        1 => String::arbitrary(u)?,
        2 => match value {
            Value::Object(mut map) if !map.is_empty() => {
                let keys: Vec<String> = map.keys().cloned().collect();
                let key = u.choose(&keys)?.clone();
                if bool::arbitrary(u)? {
                    map.remove(&key);
                } else {
                    map.insert(key, json(u, 2)?);
                }
                Value::Object(map).to_string()
            }
            other => other.to_string(),
        },
        _ => value.to_string(),
    })
}
