//! P3: retention planning of 100 repositories × 1 000 tags, beside the
//! floor: merely parsing and sorting the same tags. The best of 15 rounds
//! each, the two taking turns, so a noisy stretch of the machine falls on
//! both (the floor alone varied from 5 to 20 ms between runs); and the same
//! at 10 repositories, for the cost per tag at both sizes.
//!
//! P9: the purger's planning path at size, in a process of its own (this
//! bench run again with `--p9-child`, so its peak RSS is its own): 1 000
//! repositories × 1 000 tags, each listing made as the registry snapshot
//! would hand it, planned (`vynil_purger::plan_repository`) and dropped, the
//! plans assembled and encoded as the plan store stores them.

use std::{hint::black_box, time::Instant};

use semver::Version;
use vynil_rules::{
    PackageContent, PackageType, Requirement, RetentionConfig, plan_retention,
    retention::{ManifestMetadata, RepositoryTag, Usage},
    tag::versions_newest_first,
};

use crate::report::{Figure, Row, growth};

const REPOSITORIES: usize = 100;
pub const TAGS: usize = 1_000;
const ROUNDS: usize = 15;

pub fn repository(seed: usize) -> Vec<RepositoryTag> {
    (0..TAGS)
        .map(|i| {
            let (major, minor, patch) = (i / 100, (i / 10) % 10, i % 10);
            let pre = match i % 7 {
                0 => "-alpha.1",
                1 => "-beta.1",
                _ => "",
            };
            let package_type = if i < 300 { PackageType::Tenant } else { PackageType::Service };
            let mut requirements = vec![];
            if i % 3 != 0 {
                requirements
                    .push(Requirement::MinimumPreviousVersion(format!("{}.0.0", major.saturating_sub(1))));
            }
            if i % 50 == 0 {
                requirements.push(Requirement::VynilVersion(format!("0.{}.0", 7 + i % 3)));
            }
            RepositoryTag {
                name: format!("{major}.{minor}.{patch}{pre}"),
                digest: format!("sha256:{seed:032x}{i:032x}"),
                metadata: ManifestMetadata::Vynil(Box::new(PackageContent {
                    requirements,
                    ..PackageContent::minimal("bench", &format!("pkg{seed}"), package_type)
                })),
            }
        })
        .collect()
}

fn timed<F: FnMut()>(mut f: F) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_secs_f64()
}

pub fn planning() -> Figure {
    let name = "purge planning, 100 x 1 000 tags";
    let (small, large) = match (best_of(REPOSITORIES / 10), best_of(REPOSITORIES)) {
        (Ok(small), Ok(large)) => (small, large),
        (Err(why), _) | (_, Err(why)) => return Figure::failed("P3", name, why),
    };
    let mut rows = vec![
        Row::new("plan every repository", large.0 * 1e3, "ms")
            .against("parse + sort the same tags", large.1 * 1e3),
    ];
    let tags = |repositories: usize| (repositories * TAGS) as f64;
    rows.extend(growth(
        "plan",
        "us per tag",
        (tags(REPOSITORIES / 10), small.0 * 1e6),
        (tags(REPOSITORIES), large.0 * 1e6),
    ));
    Figure::measured("P3", name, rows)
}

/// The best of [`ROUNDS`] of planning `count` repositories, and of its floor
/// (seconds).
fn best_of(count: usize) -> Result<(f64, f64), String> {
    let repositories: Vec<Vec<RepositoryTag>> = (0..count).map(repository).collect();
    let config = RetentionConfig::new(Version::new(0, 8, 0), &[]).map_err(|e| e.to_string())?;
    let usage = Usage::Known(vec![]);
    let (mut floor, mut planning, mut planned) = (f64::INFINITY, f64::INFINITY, 0);
    for _ in 0..ROUNDS {
        floor = floor.min(timed(|| {
            for tags in &repositories {
                black_box(versions_newest_first(tags.iter().map(|t| t.name.as_str())));
            }
        }));
        planning = planning.min(timed(|| {
            planned = 0;
            for tags in &repositories {
                if plan_retention(black_box(tags), &usage, &config).is_ok() {
                    planned += 1;
                }
            }
        }));
    }
    if planned != count {
        return Err(format!("only {planned} of {count} repositories planned"));
    }
    Ok((planning, floor))
}
