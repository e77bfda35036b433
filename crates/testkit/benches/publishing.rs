//! How fast the test kit fills a real registry: 2 000 tags published with 1
//! and with 16 pushes in flight, side by side in one run
//! (`cargo bench -p vynil-testkit`).

use std::time::Instant;

use vynil_testkit::{PackageSpec, PackageType, RegistryServer};

const TAGS: usize = 2_000;

fn specs(repository: &str) -> Vec<(String, PackageSpec)> {
    (0..TAGS)
        .map(|i| {
            let tag = format!("{}.{}.{}", i / 100, (i / 10) % 10, i % 10);
            (repository.to_string(), PackageSpec::new("bench", repository, PackageType::Tenant, &tag))
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = RegistryServer::start().await?;
    let publisher = registry.publisher();
    let mut rates = Vec::new();
    for concurrency in [1, 16] {
        let items = specs(&format!("bench-c{concurrency}"));
        let start = Instant::now();
        publisher.publish_all(&items, concurrency).await?;
        let seconds = start.elapsed().as_secs_f64();
        println!(
            "{TAGS} tags, {concurrency:>2} in flight: {seconds:>6.2} s ({:>6.0} tags/s)",
            TAGS as f64 / seconds
        );
        rates.push(TAGS as f64 / seconds);
    }
    println!("speed-up of 16 in flight over 1: {:.1}x", rates[1] / rates[0]);
    Ok(())
}
