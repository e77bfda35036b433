use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    vynil_runtime::init_tracing("catalog");
    let config = vynil_catalog::Config::parse();
    vynil_catalog::run(config, vynil_runtime::termination_signal()?).await?;
    Ok(())
}
