//! RBAC as the API server's authorizer evaluates it (`plugin/pkg/auth/
//! authorizer/rbac`): a request is allowed when a ClusterRoleBinding, or a
//! RoleBinding of the request's namespace, binds its user (by name, by one of
//! its groups, or as a ServiceAccount) to a role one of whose rules covers the
//! request — `apiGroups`, `resources` (`plural`, `plural/subresource`, `*`,
//! `*/subresource`), `verbs`, `resourceNames` (named requests only) — or, for
//! a path outside the API (`/version`, `/api`, `/openapi/v3`…),
//! `nonResourceURLs` (`*` as a trailing wildcard). Nothing is allowed that no
//! rule allows; there are no deny rules.
//!
//! The bootstrap roles a test relies on are preloaded: `cluster-admin`
//! (bound to the group `system:masters`) and `system:discovery` (discovery
//! and OpenAPI paths, bound to `system:authenticated`).

use serde_json::{Value, json};

use super::access::Identity;

/// What a request asks, in RBAC's terms.
#[derive(Debug, Clone)]
pub struct Attributes {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// A path outside the API (`/version`); `None` for a resource request.
    pub path: Option<String>,
}

impl Attributes {
    /// `resource` or `resource/subresource`, as RBAC rules name it.
    fn resource_path(&self) -> String {
        match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        }
    }
}

/// The bootstrap RBAC objects, as `(plural, object)`.
pub(super) fn bootstrap() -> Vec<(&'static str, Value)> {
    vec![
        (
            "clusterroles",
            json!({"metadata": {"name": "cluster-admin"}, "rules": [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["*"]},
            ]}),
        ),
        (
            "clusterrolebindings",
            json!({"metadata": {"name": "cluster-admin"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:masters"}]}),
        ),
        (
            "clusterroles",
            json!({"metadata": {"name": "system:discovery"}, "rules": [
                {"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*", "/version", "/version/", "/healthz", "/livez", "/readyz"],
                 "verbs": ["get"]},
            ]}),
        ),
        (
            "clusterrolebindings",
            json!({"metadata": {"name": "system:discovery"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:discovery"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}]}),
        ),
    ]
}

/// The groups the API server adds to every authenticated user.
fn groups_of(user: &Identity) -> Vec<String> {
    let mut groups = user.groups.clone();
    groups.push("system:authenticated".into());
    if let Some(rest) = user.username.strip_prefix("system:serviceaccount:")
        && let Some((namespace, _)) = rest.split_once(':')
    {
        groups.push("system:serviceaccounts".into());
        groups.push(format!("system:serviceaccounts:{namespace}"));
    }
    groups
}

fn binds(binding: &Value, user: &Identity, groups: &[String]) -> bool {
    binding["subjects"].as_array().into_iter().flatten().any(|subject| {
        let name = subject["name"].as_str().unwrap_or_default();
        match subject["kind"].as_str() {
            Some("User") => name == user.username,
            Some("Group") => groups.iter().any(|g| g == name),
            Some("ServiceAccount") => {
                let namespace = subject["namespace"]
                    .as_str()
                    .or(binding["metadata"]["namespace"].as_str())
                    .unwrap_or_default();
                user.username == format!("system:serviceaccount:{namespace}:{name}")
            }
            _ => false,
        }
    })
}

fn listed(values: &Value, wanted: &str) -> bool {
    values.as_array().into_iter().flatten().filter_map(Value::as_str).any(|v| v == "*" || v == wanted)
}

fn covers(rule: &Value, attrs: &Attributes) -> bool {
    if !listed(&rule["verbs"], &attrs.verb) {
        return false;
    }
    if let Some(path) = &attrs.path {
        return rule["nonResourceURLs"].as_array().into_iter().flatten().filter_map(Value::as_str).any(
            |url| {
                url == "*"
                    || url == path
                    || url.strip_suffix('*').is_some_and(|prefix| path.starts_with(prefix))
            },
        );
    }
    let resource = attrs.resource_path();
    let resource_hit =
        rule["resources"].as_array().into_iter().flatten().filter_map(Value::as_str).any(|r| {
            r == "*" || r == resource || attrs.subresource.as_ref().is_some_and(|sub| r == format!("*/{sub}"))
        });
    let names = rule["resourceNames"].as_array().filter(|n| !n.is_empty());
    let name_hit = match names {
        None => true,
        Some(names) => attrs.name.as_ref().is_some_and(|name| names.iter().any(|n| n == name.as_str())),
    };
    listed(&rule["apiGroups"], &attrs.group) && resource_hit && name_hit
}

/// Whether `user` may do `attrs`, given every stored role and binding:
/// `objects(plural)` lists `roles`, `clusterroles`, `rolebindings`,
/// `clusterrolebindings`.
pub(super) fn allows(objects: &dyn Fn(&str) -> Vec<Value>, user: &Identity, attrs: &Attributes) -> bool {
    let groups = groups_of(user);
    let cluster_roles = objects("clusterroles");
    let roles = objects("roles");
    let rules_of = |role_ref: &Value, namespace: Option<&str>| -> Vec<Value> {
        let name = role_ref["name"].as_str().unwrap_or_default();
        let role = match (role_ref["kind"].as_str(), namespace) {
            (Some("ClusterRole"), _) => cluster_roles.iter().find(|r| r["metadata"]["name"] == name),
            (Some("Role"), Some(ns)) => {
                roles.iter().find(|r| r["metadata"]["name"] == name && r["metadata"]["namespace"] == ns)
            }
            _ => None,
        };
        role.and_then(|r| r["rules"].as_array().cloned()).unwrap_or_default()
    };
    let cluster_wide = objects("clusterrolebindings")
        .into_iter()
        .filter(|b| binds(b, user, &groups))
        .flat_map(|b| rules_of(&b["roleRef"], None));
    let in_namespace: Vec<Value> = match (&attrs.namespace, &attrs.path) {
        (Some(ns), None) => objects("rolebindings")
            .into_iter()
            .filter(|b| b["metadata"]["namespace"] == ns.as_str() && binds(b, user, &groups))
            .flat_map(|b| rules_of(&b["roleRef"], Some(ns)))
            .collect(),
        _ => Vec::new(),
    };
    cluster_wide.chain(in_namespace).any(|rule| covers(&rule, attrs))
}

/// The API server's `403 Forbidden` message for a denied request.
pub(super) fn forbidden_message(user: &Identity, attrs: &Attributes) -> String {
    if let Some(path) = &attrs.path {
        return format!("forbidden: User \"{}\" cannot {} path \"{path}\"", user.username, attrs.verb);
    }
    let qualified = if attrs.group.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}.{}", attrs.resource, attrs.group)
    };
    let object = match &attrs.name {
        Some(name) => format!("{qualified} \"{name}\""),
        None => qualified,
    };
    let resource = attrs.resource_path();
    let scope = match &attrs.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    format!(
        "{object} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
        user.username, attrs.verb, attrs.group
    )
}
