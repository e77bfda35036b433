use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = vynil_purger::Config::parse();
    let _telemetry = vynil_runtime::init_tracing("purger", &config.shared.log);
    vynil_purger::run(config, vynil_runtime::termination_signal()?).await?;
    Ok(())
}
