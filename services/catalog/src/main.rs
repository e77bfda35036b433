use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = vynil_catalog::Config::parse();
    let _telemetry = vynil_runtime::init_tracing("catalog", &config.shared.log);
    vynil_catalog::run(config, vynil_runtime::termination_signal()?).await?;
    Ok(())
}
