//! One identity per repository. Users write a repository many ways —
//! `docker.io/redis`, `index.docker.io/library/redis`, `DOCKER.IO/redis`,
//! `registry-1.docker.io/library/redis` — and the registry client reaches
//! the same one for each; every rule that matches repositories by name
//! (usage of installed revisions, purge exclusions, recorded revisions)
//! compares their identity, never the text, or a plan made under an alias
//! would see no usage and bypass exclusions.

/// Docker Hub's names, all one registry.
const DOCKER_HUB: &[&str] =
    &["docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"];

/// How a JukeBox's OCI image layout directory is named as a registry.
pub const LAYOUT_SCHEME: &str = "oci-layout:";

/// Docker Hub's canonical name.
pub const DOCKER_HUB_HOST: &str = "docker.io";

/// The canonical host of a registry as users and Docker config files write
/// it (`https://index.docker.io/v1/`, `DOCKER.IO`, `registry-1.docker.io`):
/// lowercased, without scheme or path, a trailing dot or the port 443,
/// Docker Hub's names as `docker.io`.
/// Credentials, insecure-registry declarations and repository identities
/// all key on it. An OCI layout (`oci-layout:<path>`) is its path, kept
/// as written: paths are case-sensitive.
pub fn host(registry: &str) -> String {
    if registry.starts_with(LAYOUT_SCHEME) {
        return registry.to_string();
    }
    let without_scheme = registry.split_once("://").map(|(_, rest)| rest).unwrap_or(registry);
    let host = folded(&without_scheme.split('/').next().unwrap_or_default().to_ascii_lowercase());
    if DOCKER_HUB.contains(&host.as_str()) { DOCKER_HUB_HOST.to_string() } else { host }
}

/// A host without what names the same endpoint twice: a trailing dot
/// (`reg.corp.`, the root of DNS) and HTTPS's default port (`reg.corp:443`),
/// which registries are reached on (#66 item 3). Another port is another
/// registry.
fn folded(host: &str) -> String {
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port))
            if !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!name.contains(':') || name.ends_with(']')) =>
        {
            (name, Some(port))
        }
        _ => (host, None),
    };
    let name = name.trim_end_matches('.');
    match port {
        Some(port) if port.trim_start_matches('0') != "443" => format!("{name}:{port}"),
        _ => name.to_string(),
    }
}

/// The canonical `registry/repository` of a repository: its [`host`],
/// Docker Hub's official images under `library/`.
pub fn canonical(registry: &str, repository: &str) -> String {
    let host = host(registry);
    let repository = repository.trim_matches('/');
    if host == DOCKER_HUB_HOST {
        if repository.contains('/') {
            return format!("docker.io/{repository}");
        }
        return format!("docker.io/library/{repository}");
    }
    format!("{host}/{repository}")
}

/// Whether two `(registry, repository)` name the same repository.
pub fn same(a: (&str, &str), b: (&str, &str)) -> bool {
    canonical(a.0, a.1) == canonical(b.0, b.1)
}

/// The entry [`listed`] reads for a repository: its [`canonical`] name,
/// `oci-layout:<path>//repository` for an OCI layout (whose path holds `/`).
pub fn entry(registry: &str, repository: &str) -> String {
    if registry.starts_with(LAYOUT_SCHEME) {
        return format!("{registry}//{}", repository.trim_matches('/'));
    }
    canonical(registry, repository)
}

/// Whether `registry/repository` is in `list` (entries `registry/repository`,
/// as the retention config's `excluded_repositories`, or
/// `oci-layout:<path>//repository`), under any alias.
pub fn listed(list: &[String], registry: &str, repository: &str) -> bool {
    let wanted = canonical(registry, repository);
    list.iter().any(|entry| {
        let entry = entry.trim();
        let split = if entry.starts_with(LAYOUT_SCHEME) {
            entry.split_once("//")
        } else {
            entry.split_once("://").map(|(_, rest)| rest).unwrap_or(entry).split_once('/')
        };
        let (host, path) = split.unwrap_or((entry, ""));
        canonical(host, path) == wanted
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_hubs_aliases_are_one_repository_and_other_hosts_only_differ_by_case() {
        let redis = canonical("docker.io", "redis");
        for (registry, repository) in [
            ("index.docker.io", "library/redis"),
            ("DOCKER.IO", "redis"),
            ("registry-1.docker.io", "library/redis"),
            ("https://index.docker.io/", "redis"),
        ] {
            assert_eq!(canonical(registry, repository), redis, "{registry}/{repository}");
        }
        assert_eq!(redis, "docker.io/library/redis");
        assert!(same(("Registry.Example:5000", "apps/web"), ("registry.example:5000", "apps/web")));
        assert!(!same(("registry.example", "apps/web"), ("registry.example", "apps/web2")));
        assert!(!same(("docker.io", "bitnami/redis"), ("docker.io", "redis")));
        let excluded = vec!["index.docker.io/library/redis".to_string()];
        assert!(listed(&excluded, "docker.io", "redis"));
        assert!(!listed(&excluded, "docker.io", "bitnami/redis"));
        assert!(
            !same(("oci-layout:/srv/A", "apps/web"), ("oci-layout:/srv/a", "apps/web")),
            "paths keep their case"
        );
        assert!(!same(("oci-layout:/srv/a", "apps/web"), ("oci-layout:/srv/b", "apps/web")));
        assert!(listed(&["oci-layout:/srv/a//apps/web".to_string()], "oci-layout:/srv/a", "apps/web"));
    }

    #[test]
    fn an_entry_is_listed_under_every_alias_and_a_layouts_path_keeps_its_slashes() {
        let layout = "oci-layout:/var/lib/vynil/layout";
        let entries = [entry("DOCKER.IO", "redis"), entry(layout, "apps/web")];
        assert!(listed(&entries, "index.docker.io", "library/redis"));
        assert!(listed(&entries, layout, "apps/web"));
        assert!(!listed(&entries, layout, "apps/other"));
    }
}
