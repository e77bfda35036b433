use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = vynil_scanner::Config::parse();
    let _telemetry = vynil_runtime::init_tracing("scanner", &config.shared.log);
    vynil_scanner::run(config, vynil_runtime::termination_signal()?).await?;
    Ok(())
}
