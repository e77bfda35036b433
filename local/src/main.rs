use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = vynil_local::Config::parse();
    let _telemetry = vynil_runtime::init_tracing("vynil", &config.shared.log);
    vynil_local::run(config, vynil_runtime::termination_signal()?).await?;
    Ok(())
}
