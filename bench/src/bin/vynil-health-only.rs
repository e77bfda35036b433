//! P6's baseline: the smallest tonic server a service could be, serving only
//! gRPC health on `--listen <addr>`, on the same runtime and stack as ours.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip_while(|a| a != "--listen").skip(1);
    let listen: std::net::SocketAddr = args.next().unwrap_or_else(|| "127.0.0.1:50051".into()).parse()?;
    let (_reporter, health) = tonic_health::server::health_reporter();
    tonic::transport::Server::builder().add_service(health).serve(listen).await?;
    Ok(())
}
