use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = vynil_local::Config::parse();
    vynil_runtime::init_tracing("vynil", &config.shared.log);
    vynil_local::run(config, vynil_runtime::termination_signal()?).await?;
    Ok(())
}
