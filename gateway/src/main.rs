use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    vynil_runtime::init_tracing("gateway");
    let config = vynil_gateway::Config::parse();
    vynil_gateway::run(config, vynil_runtime::termination_signal()?).await?;
    Ok(())
}
