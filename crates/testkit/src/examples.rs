//! The example package set: what local mode's embedded default shows
//! (`examples/layout`, written by `vynil-examples layout`) and what
//! `scripts/dev-registry` publishes to a real registry, from one description.
//!
//! - `think/ollama`: upstream #12's type change — `0.1.8` and `0.1.9` as
//!   `tenant`, then `0.1.10` republished as `service`, signed (cosign tag).
//! - `apps/web`: waypoints — `2.1.0` needs ≥ `1.5.0`, `2.0.0` too (so it is
//!   redundant), `1.5.0` needs nothing; `3.0.0-beta.1` only on the beta
//!   channel; `latest` a tag without Vynil annotations (unmanaged).

use std::collections::HashMap;

use crate::{ArtifactKind, LayoutWriter, PackageSpec, PackageType, Publisher, Result};

/// One item of the set, in publication order.
#[derive(Debug, Clone)]
pub enum Example {
    Package(&'static str, Box<PackageSpec>),
    /// A tag without Vynil annotations.
    Plain(&'static str, &'static str),
    /// A signature of the revision with this tag.
    Signature(&'static str, &'static str),
}

/// The set, in publication order.
pub fn examples() -> Vec<Example> {
    use Example::*;
    let ollama = |tag: &str, kind| PackageSpec::new("think", "ollama", kind, tag);
    let web = |tag: &str| PackageSpec::new("apps", "web", PackageType::Tenant, tag);
    let p = |repository, spec| Package(repository, Box::new(spec));
    vec![
        p("think/ollama", ollama("0.1.8", PackageType::Tenant)),
        p("think/ollama", ollama("0.1.9", PackageType::Tenant).min("0.1.8")),
        p("think/ollama", ollama("0.1.10", PackageType::Service)),
        Signature("think/ollama", "0.1.10"),
        p("apps/web", web("1.0.0")),
        p("apps/web", web("1.5.0")),
        p("apps/web", web("2.0.0").min("1.5.0")),
        p("apps/web", web("2.1.0").min("1.5.0")),
        p("apps/web", web("3.0.0-beta.1").min("2.0.0")),
        Plain("apps/web", "latest"),
    ]
}

/// The repositories of the set.
pub const EXAMPLE_REPOSITORIES: [&str; 2] = ["think/ollama", "apps/web"];

/// Pushes the set to a registry.
pub async fn publish_examples(publisher: &Publisher) -> Result<()> {
    let mut digests: HashMap<(&str, String), String> = HashMap::new();
    for item in examples() {
        match item {
            Example::Package(repository, spec) => {
                let digest = publisher.publish(repository, &spec).await?;
                digests.insert((repository, spec.tag.clone()), digest);
            }
            Example::Plain(repository, tag) => {
                publisher.publish_plain(repository, tag).await?;
            }
            Example::Signature(repository, tag) => {
                if let Some(subject) = digests.get(&(repository, tag.to_string())) {
                    publisher.attach(repository, subject, ArtifactKind::Signature).await?;
                }
            }
        }
    }
    Ok(())
}

/// Writes the set as layouts under the writer's root.
pub fn write_examples(writer: &LayoutWriter) -> Result<()> {
    let mut digests: HashMap<(&str, String), String> = HashMap::new();
    for item in examples() {
        match item {
            Example::Package(repository, spec) => {
                let digest = writer.publish(repository, &spec)?;
                digests.insert((repository, spec.tag.clone()), digest);
            }
            Example::Plain(repository, tag) => {
                writer.publish_plain(repository, tag)?;
            }
            Example::Signature(repository, tag) => {
                if let Some(subject) = digests.get(&(repository, tag.to_string())) {
                    writer.attach(repository, subject, ArtifactKind::Signature)?;
                }
            }
        }
    }
    Ok(())
}
