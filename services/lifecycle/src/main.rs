use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = vynil_lifecycle::Config::parse();
    let _telemetry = vynil_runtime::init_tracing("lifecycle", &config.shared.log);
    vynil_lifecycle::run(config, vynil_runtime::termination_signal()?).await?;
    Ok(())
}
