//! What a registry answers: tag-list pages, `Link` and `WWW-Authenticate`
//! headers, manifests and indexes (structure-aware: nearly OCI documents),
//! referrers indexes, error envelopes.
//!
//! Properties: the next page is always asked of the same registry (the path
//! a `Link` gives is a path, never anything that would change the host once
//! put behind it); a challenge's scheme and parameter names are lower case;
//! an error message taken from a body that is not an envelope is at most 200
//! bytes of it; a decoded manifest keeps every annotation it carried; a
//! signature manifest or referrers index yields no more than the cap asked.

use arbitrary::{Arbitrary, Result, Unstructured};
use serde_json::{Value, json};
use vynil_registry::decode;

use crate::input::{Json, Text, spoil};

#[derive(Debug)]
pub enum Answer {
    TagPage(String),
    Link(String),
    Challenge(String),
    Manifest(String),
    Referrers(String),
    Error(Vec<u8>),
}

const MEDIA_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "text/plain",
];

fn descriptor(u: &mut Unstructured<'_>) -> Result<Value> {
    Ok(json!({
        "mediaType": u.choose(MEDIA_TYPES)?,
        "digest": format!("sha256:{}", "ab".repeat(32)),
        "size": u64::arbitrary(u)?,
        "artifactType": Text::arbitrary(u)?.0,
    }))
}

fn manifest(u: &mut Unstructured<'_>) -> Result<Value> {
    let annotations: serde_json::Map<String, Value> = (0..u.int_in_range(0..=3usize)?)
        .map(|_| Ok((Text::arbitrary(u)?.0, json!(Text::arbitrary(u)?.0))))
        .collect::<Result<_>>()?;
    Ok(if bool::arbitrary(u)? {
        json!({"schemaVersion": 2, "mediaType": MEDIA_TYPES[0], "config": descriptor(u)?,
               "layers": [descriptor(u)?], "annotations": annotations})
    } else {
        json!({"schemaVersion": 2, "mediaType": MEDIA_TYPES[1],
               "manifests": [descriptor(u)?, descriptor(u)?], "annotations": annotations})
    })
}

impl<'a> Arbitrary<'a> for Answer {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(match u.int_in_range(0..=5u8)? {
            0 => {
                let tags: Vec<String> = (0..u.int_in_range(0..=4usize)?)
                    .map(|_| Text::arbitrary(u).map(|t| t.0))
                    .collect::<Result<_>>()?;
                let doc = json!({"name": "a/b", "tags": tags});
                Answer::TagPage(spoil(u, doc)?)
            }
            1 => {
                let target = match u.int_in_range(0..=4u8)? {
                    0 => "/v2/a/tags/list?last=x&n=2".to_string(),
                    1 => format!("https://{}/v2/a/tags/list?n=1", Text::arbitrary(u)?.0),
                    _ => Text::arbitrary(u)?.0,
                };
                let rel =
                    u.choose(&[r#"rel="next""#, "rel=next", r#"rel="prev""#, " rel = \"next\" ", ""])?;
                let extra = if bool::arbitrary(u)? {
                    format!(", <{}>; rel=\"prev\"", Text::arbitrary(u)?.0)
                } else {
                    String::new()
                };
                Answer::Link(format!("<{target}>; {rel}{extra}"))
            }
            2 => {
                let scheme = u.choose(&["Bearer", "Basic", "bearer", "", "Digest"])?;
                let params: Vec<String> = (0..u.int_in_range(0..=4usize)?)
                    .map(|_| {
                        let key = u.choose(&["realm", "service", "scope", "Realm", "", "x y"])?;
                        let value = Text::arbitrary(u)?.0;
                        Ok(if bool::arbitrary(u)? {
                            format!("{key}=\"{value}\"")
                        } else {
                            format!("{key}={value}")
                        })
                    })
                    .collect::<Result<_>>()?;
                Answer::Challenge(format!("{scheme} {}", params.join(",")))
            }
            3 => {
                let doc = manifest(u)?;
                Answer::Manifest(spoil(u, doc)?)
            }
            4 => {
                let doc =
                    json!({"schemaVersion": 2, "mediaType": MEDIA_TYPES[1], "manifests": [descriptor(u)?]});
                Answer::Referrers(spoil(u, doc)?)
            }
            _ => Answer::Error(match u.int_in_range(0..=2u8)? {
                0 => json!({"errors": [{"code": Text::arbitrary(u)?.0, "message": Text::arbitrary(u)?.0}]})
                    .to_string()
                    .into_bytes(),
                1 => Json::arbitrary(u)?.0.to_string().into_bytes(),
                _ => Vec::arbitrary(u)?,
            }),
        })
    }
}

pub fn run(data: &[u8]) {
    let Ok(answer) = Answer::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    check(&answer);
}

pub fn check(answer: &Answer) {
    match answer {
        Answer::TagPage(body) => {
            if let Ok(tags) = decode::tag_page(body.as_bytes()) {
                let doc: Value = serde_json::from_str(body).unwrap_or(Value::Null);
                assert_eq!(tags.len(), doc["tags"].as_array().map_or(0, Vec::len));
            }
        }
        Answer::Link(header) => {
            if let Ok(Some(path)) = decode::next_link(header, "/v2/a/tags/list?n=2") {
                assert!(
                    path.starts_with('/'),
                    "{header:?} gave {path:?}: not a path, so another host could be named"
                );
                let url = format!("https://registry.example{path}");
                let host = url::Url::parse(&url).ok().and_then(|u| u.host_str().map(String::from));
                assert_eq!(
                    host.as_deref(),
                    Some("registry.example"),
                    "{header:?} moved the next page to {url}"
                );
            }
        }
        Answer::Challenge(header) => {
            if let Some(challenge) = decode::challenge(header) {
                assert!(!challenge.scheme.is_empty());
                assert_eq!(challenge.scheme, challenge.scheme.to_ascii_lowercase());
                assert!(challenge.params.keys().all(|k| *k == k.to_ascii_lowercase()));
            }
        }
        Answer::Manifest(body) => {
            if let Ok(manifest) = decode::manifest(body.as_bytes()) {
                let doc: Value = serde_json::from_str(body).unwrap_or(Value::Null);
                let carried = doc["annotations"].as_object().map_or(0, serde_json::Map::len);
                assert_eq!(manifest.annotations.len(), carried, "annotations lost from {body}");
            }
            // A signature manifest or referrers index yields at most what is asked.
            match decode::signature_manifest(body.as_bytes(), 1, &[]) {
                Ok(decode::SignatureManifest::Image(layers)) => assert!(layers.len() <= 1, "{body}"),
                Ok(decode::SignatureManifest::Index(referrers)) => assert!(referrers.len() <= 1, "{body}"),
                Err(_) => {}
            }
        }
        Answer::Referrers(body) => {
            let _ = decode::referrers(body.as_bytes());
        }
        Answer::Error(body) => {
            let (code, message) = decode::error_envelope(body);
            if code.is_empty()
                && serde_json::from_slice::<Value>(body).map_or(true, |v| v.get("errors").is_none())
            {
                assert!(
                    message.chars().count() <= 200,
                    "a message of {} characters",
                    message.chars().count()
                );
            }
        }
    }
}
