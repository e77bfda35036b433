//! Names Kubernetes accepts, and the agent Job names derived from them.
//!
//! Upstream builds `<type>--<namespace>--<name>` without checking it; a long
//! namespace and name give a Job name the API refuses (and the `job-name` label
//! is limited to 63 characters). Here the derived name is always valid: when
//! too long it is cut and suffixed with a hash of the full name, so two
//! instances never share a Job.

use sha2::{Digest, Sha256};

use crate::CrdError;

const LABEL_MAX: usize = 63;
const SUBDOMAIN_MAX: usize = 253;

/// A DNS-1123 label: ≤ 63 of `[a-z0-9-]`, starting and ending alphanumeric
/// (namespaces, Job names).
pub fn validate_label(what: &str, value: &str) -> Result<(), CrdError> {
    check(what, value, LABEL_MAX, false)
}

/// A DNS-1123 subdomain: ≤ 253 of `[a-z0-9-.]`, starting and ending
/// alphanumeric (most object names).
pub fn validate_subdomain(what: &str, value: &str) -> Result<(), CrdError> {
    check(what, value, SUBDOMAIN_MAX, true)
}

fn check(what: &str, value: &str, max: usize, dots: bool) -> Result<(), CrdError> {
    let invalid = |problem: String| CrdError::InvalidName {
        what: what.to_string(),
        value: value.chars().take(80).collect(),
        problem,
    };
    if value.is_empty() {
        return Err(invalid("is empty".into()));
    }
    if value.len() > max {
        return Err(invalid(format!("is {} characters long, at most {max} are allowed", value.len())));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || (dots && *c == '.')))
    {
        return Err(invalid(format!(
            "contains {bad:?}: only lowercase letters, digits, '-'{} are allowed",
            if dots { " and '.'" } else { "" }
        )));
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !alnum(value.chars().next()) || !alnum(value.chars().last()) {
        return Err(invalid("must start and end with a lowercase letter or a digit".into()));
    }
    Ok(())
}

/// Upstream's agent Job name `<type>--<namespace>--<name>`, made to fit 63
/// characters when needed (`<prefix>-<10 hex of its hash>`).
pub fn agent_job_name(package_type: &str, namespace: &str, name: &str) -> Result<String, CrdError> {
    validate_label("namespace", namespace)?;
    validate_subdomain("instance name", name)?;
    // Dots are valid in object names but not in labels: Jobs carry their name as a label.
    let full = format!("{package_type}--{namespace}--{}", name.replace('.', "-"));
    if full.len() <= LABEL_MAX {
        return Ok(full);
    }
    Ok(hashed(&full, &full))
}

/// A label value for `value`: itself when it fits 63 characters (every
/// object name is made of label characters), else its first characters and a
/// hash of the whole, so the value stays valid and distinct.
pub fn label_value(value: &str) -> String {
    if value.len() <= LABEL_MAX {
        return value.to_string();
    }
    hashed(value, value)
}

/// `<prefix cut to fit>-<10 hex of sha256(identity)>`, 63 characters at most,
/// starting and ending alphanumeric.
fn hashed(prefix: &str, identity: &str) -> String {
    let hash = hex::encode(Sha256::digest(identity.as_bytes()));
    let cut = prefix.get(..LABEL_MAX - 11).unwrap_or(prefix);
    let cut = cut.trim_end_matches(['-', '.']);
    format!("{cut}-{}", &hash[..10])
}

/// The agent Job name used when upstream's [`agent_job_name`] is taken by
/// another instance's Job: two instances whose names collide under
/// upstream's rule (`a--b/c` and `a/b--c`, `web.v2` and `web-v2`) hash
/// their unambiguous identity `<type>/<namespace>/<name>` apart.
pub fn unique_agent_job_name(package_type: &str, namespace: &str, name: &str) -> Result<String, CrdError> {
    let upstream = agent_job_name(package_type, namespace, name)?;
    let identity = format!("{package_type}/{namespace}/{name}");
    let prefix = upstream.get(..LABEL_MAX - 11).unwrap_or(&upstream);
    Ok(hashed(prefix, &identity))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_against_dns_1123_with_the_reason() {
        let table = [
            ("app", true, ""),
            ("my-app.v2", true, ""),
            ("", false, "is empty"),
            ("App", false, "contains 'A'"),
            ("-app", false, "must start and end"),
            ("app_1", false, "contains '_'"),
            ("a/b", false, "contains '/'"),
        ];
        for (value, ok, fragment) in table {
            match validate_subdomain("name", value) {
                Ok(()) => assert!(ok, "{value:?} accepted"),
                Err(e) => {
                    assert!(!ok, "{value:?} refused: {e}");
                    assert!(e.to_string().contains(fragment), "{e}");
                }
            }
        }
        assert!(validate_label("namespace", "a.b").is_err());
        assert!(validate_label("namespace", &"a".repeat(64)).is_err());
    }

    #[test]
    fn the_agent_job_name_is_upstreams_when_it_fits() {
        assert_eq!(agent_job_name("tenant", "apps", "ollama").unwrap(), "tenant--apps--ollama");
    }

    #[test]
    fn a_long_agent_job_name_is_cut_and_hashed_but_stays_unique_and_valid() {
        let ns = "a-rather-long-namespace-name";
        let a = agent_job_name("service", ns, "an-equally-long-instance-name-one").unwrap();
        let b = agent_job_name("service", ns, "an-equally-long-instance-name-two").unwrap();
        assert!(a.len() <= 63, "{a}");
        assert_ne!(a, b);
        validate_label("job", &a).unwrap();
        validate_label("job", &b).unwrap();
    }

    #[test]
    fn names_colliding_under_upstreams_rule_get_distinct_unique_job_names() {
        let pairs = [(("a--b", "c"), ("a", "b--c")), (("apps", "web.v2"), ("apps", "web-v2"))];
        for ((ns1, n1), (ns2, n2)) in pairs {
            assert_eq!(
                agent_job_name("tenant", ns1, n1).unwrap(),
                agent_job_name("tenant", ns2, n2).unwrap()
            );
            let (a, b) = (
                unique_agent_job_name("tenant", ns1, n1).unwrap(),
                unique_agent_job_name("tenant", ns2, n2).unwrap(),
            );
            assert_ne!(a, b);
            validate_label("job", &a).unwrap();
            validate_label("job", &b).unwrap();
        }
        let long = "x".repeat(253);
        let name = unique_agent_job_name("service", &"n".repeat(63), &long).unwrap();
        validate_label("job", &name).unwrap();
    }

    #[test]
    fn a_label_value_is_the_name_up_to_63_characters_else_a_distinct_hash() {
        assert_eq!(label_value("web"), "web");
        let exact = "a".repeat(63);
        assert_eq!(label_value(&exact), exact);
        let (a, b) = (format!("{}.one", "a".repeat(249)), format!("{}.two", "a".repeat(249)));
        let (la, lb) = (label_value(&a), label_value(&b));
        assert!(la.len() <= 63 && lb.len() <= 63, "{la}");
        assert_ne!(la, lb);
        // A label value: alphanumeric at both ends, [-_.a-zA-Z0-9] inside.
        for value in [la, lb, label_value(&format!("{}-.b", "a".repeat(51)))] {
            assert!(value.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)), "{value}");
            assert!(value.starts_with(|c: char| c.is_ascii_alphanumeric()));
            assert!(value.ends_with(|c: char| c.is_ascii_alphanumeric()), "{value}");
        }
    }

    #[test]
    fn a_hostile_name_is_refused_before_any_job_is_named() {
        assert!(agent_job_name("tenant", "ns", "x; rm -rf /").is_err());
        assert!(agent_job_name("tenant", "NS", "x").is_err());
    }
}
