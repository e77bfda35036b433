use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = vynil_gateway::Config::parse();
    let _telemetry = vynil_runtime::init_tracing("gateway", &config.log);
    vynil_gateway::run(config, vynil_runtime::termination_signal()?).await?;
    Ok(())
}
