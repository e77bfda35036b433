//! Label and field selectors, as the API server reads them from `labelSelector`
//! and `fieldSelector`: equality (`=`, `==`, `!=`), existence (`key`, `!key`)
//! and sets (`in (...)`, `notin (...)`) for labels; `=`, `==`, `!=` on any
//! dotted path for fields (a real server allows only a few fields per kind; the
//! fake allows every path, so a test never fails for a selector our code may
//! legitimately use).

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelTerm {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed `labelSelector` (all terms must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelTerm>);

/// Splits on commas that are not inside parentheses.
fn terms(text: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(text[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(text[start..].trim());
    out.into_iter().filter(|t| !t.is_empty()).collect()
}

fn set_values(text: &str) -> Result<Vec<String>, String> {
    let inner = text
        .trim()
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .ok_or_else(|| format!("set {text:?} must be written `(a,b)`"))?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect())
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for term in terms(text) {
            let parsed = if let Some((k, v)) = term.split_once("!=") {
                LabelTerm::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                LabelTerm::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once(" notin ") {
                LabelTerm::NotIn(k.trim().into(), set_values(v)?)
            } else if let Some((k, v)) = term.split_once(" in ") {
                LabelTerm::In(k.trim().into(), set_values(v)?)
            } else if let Some(k) = term.strip_prefix('!') {
                LabelTerm::Absent(k.trim().into())
            } else if term.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) {
                LabelTerm::Exists(term.into())
            } else {
                return Err(format!("unable to parse requirement {term:?}"));
            };
            out.push(parsed);
        }
        Ok(Self(out))
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|term| match term {
            LabelTerm::Equals(k, v) => get(k) == Some(v.as_str()),
            LabelTerm::NotEquals(k, v) => get(k) != Some(v.as_str()),
            LabelTerm::Exists(k) => get(k).is_some(),
            LabelTerm::Absent(k) => get(k).is_none(),
            LabelTerm::In(k, set) => get(k).is_some_and(|v| set.iter().any(|s| s == v)),
            LabelTerm::NotIn(k, set) => get(k).is_none_or(|v| !set.iter().any(|s| s == v)),
        })
    }
}

/// A parsed `fieldSelector` (all terms must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for term in terms(text) {
            let (path, equal, value) = if let Some((k, v)) = term.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (k, true, v)
            } else {
                return Err(format!(
                    "invalid field selector {term:?}: expected `path=value` or `path!=value`"
                ));
            };
            out.push((path.trim().to_string(), equal, value.trim().to_string()));
        }
        Ok(Self(out))
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(path, equal, value)| {
            let pointer = format!("/{}", path.replace('.', "/"));
            let found = match object.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (found == *value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors_follow_the_api_server_grammar() {
        let object = json!({"metadata": {"labels": {"app": "web", "tier": "front", "vynil.solidite.fr/type": "tenant"}}});
        let table = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("tier in (front,back)", true),
            ("tier in (back)", false),
            ("tier notin (back)", true),
            ("missing notin (back)", true),
            ("tier notin (front, back)", false),
            ("app=web,tier in (front, back),vynil.solidite.fr/type=tenant", true),
            ("app=web,tier=back", false),
        ];
        for (text, expected) in table {
            let selector = LabelSelector::parse(text).map_err(|e| format!("{text}: {e}"));
            assert_eq!(selector.map(|s| s.matches(&object)), Ok(expected), "{text}");
        }
        assert!(LabelSelector::parse("a in b").is_err());
        assert!(LabelSelector::parse("a b").is_err());
    }

    #[test]
    fn field_selectors_read_any_dotted_path() {
        let object = json!({"metadata": {"name": "x", "namespace": "ns"}, "status": {"phase": "Running"}});
        let table = [
            ("metadata.name=x", true),
            ("metadata.name==y", false),
            ("metadata.namespace!=other", true),
            ("metadata.name=x,status.phase=Running", true),
            ("status.phase!=Running", false),
            ("spec.nodeName=", true),
        ];
        for (text, expected) in table {
            let selector = FieldSelector::parse(text).map_err(|e| format!("{text}: {e}"));
            assert_eq!(selector.map(|s| s.matches(&object)), Ok(expected), "{text}");
        }
        assert!(FieldSelector::parse("metadata.name").is_err());
    }
}
