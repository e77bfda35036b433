//! P3: retention planning of 100 repositories × 1 000 tags, beside the
//! floor: merely parsing and sorting the same tags. The best of 15 rounds
//! each, the two taking turns, so a noisy stretch of the machine falls on
//! both (the floor alone varied from 5 to 20 ms between runs).

use std::{hint::black_box, time::Instant};

use semver::Version;
use vynil_rules::{
    PackageContent, PackageType, Requirement, RetentionConfig, plan_retention,
    retention::{ManifestMetadata, RepositoryTag, Usage},
    tag::versions_newest_first,
};

use crate::report::{Figure, Row};

const REPOSITORIES: usize = 100;
const TAGS: usize = 1_000;
const ROUNDS: usize = 15;

fn repository(seed: usize) -> Vec<RepositoryTag> {
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
    let repositories: Vec<Vec<RepositoryTag>> = (0..REPOSITORIES).map(repository).collect();
    let config = match RetentionConfig::new(Version::new(0, 8, 0), &[]) {
        Ok(config) => config,
        Err(error) => return Figure::failed("P3", name, error),
    };
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
    if planned != REPOSITORIES {
        return Figure::failed("P3", name, format!("only {planned} of {REPOSITORIES} repositories planned"));
    }
    Figure::measured(
        "P3",
        name,
        vec![
            Row::new("plan every repository", planning * 1e3, "ms")
                .against("parse + sort the same tags", floor * 1e3),
        ],
    )
}
