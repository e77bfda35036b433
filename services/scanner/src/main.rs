use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    vynil_runtime::init_tracing("scanner");
    let config = vynil_scanner::Config::parse();
    vynil_scanner::run(config, vynil_runtime::termination_signal()?).await?;
    Ok(())
}
