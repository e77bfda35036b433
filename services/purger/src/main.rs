use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    vynil_runtime::init_tracing("purger");
    let config = vynil_purger::Config::parse();
    vynil_purger::run(config, vynil_runtime::termination_signal()?).await?;
    Ok(())
}
