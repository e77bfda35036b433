use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    vynil_runtime::init_tracing("vynil");
    let config = vynil_local::Config::parse();
    vynil_local::run(config, vynil_runtime::termination_signal()?).await?;
    Ok(())
}
