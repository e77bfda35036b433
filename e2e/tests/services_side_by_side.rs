//! The four services run side by side in one process, each on its own loopback
//! port, as local mode will run them, and each answers gRPC health.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use vynil_e2e::bound;

use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// A service's configuration from its flags, as its binary would parse them.
fn config<C: clap::Parser>(service: &str, listen: SocketAddr) -> C {
    C::parse_from([format!("vynil-{service}"), "--listen".into(), listen.to_string()])
}

async fn serving(addr: SocketAddr, service: &str) -> bool {
    let Ok(channel) =
        tonic::transport::Channel::from_shared(format!("http://{addr}")).unwrap().connect().await
    else {
        return false;
    };
    let request = HealthCheckRequest { service: service.into() };
    matches!(HealthClient::new(channel).check(request).await, Ok(r) if r.get_ref().status() == ServingStatus::Serving)
}

#[tokio::test]
async fn four_services_serve_health_on_their_own_ports_and_stop_together() {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let shutdown = move || {
        let mut rx = stopped.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let (catalog, scanner, purger, lifecycle) = (bound().await, bound().await, bound().await, bound().await);
    let addrs = [catalog.1, scanner.1, purger.1, lifecycle.1];
    let mut services = tokio::task::JoinSet::new();
    let sd = shutdown();
    services.spawn(async move {
        vynil_catalog::run_on(catalog.0, config("catalog", catalog.1), sd).await.map_err(|e| e.to_string())
    });
    let sd = shutdown();
    services.spawn(async move {
        vynil_scanner::run_on(scanner.0, config("scanner", scanner.1), sd).await.map_err(|e| e.to_string())
    });
    let sd = shutdown();
    services.spawn(async move {
        vynil_purger::run_on(purger.0, config("purger", purger.1), sd).await.map_err(|e| e.to_string())
    });
    let sd = shutdown();
    services.spawn(async move {
        let config = config("lifecycle", lifecycle.1);
        vynil_lifecycle::run_on(lifecycle.0, config, sd).await.map_err(|e| e.to_string())
    });
    let names = [
        "vynil.catalog.v1.Catalog",
        "vynil.scanner.v1.Scanner",
        "vynil.purger.v1.Purger",
        "vynil.lifecycle.v1.Lifecycle",
    ];
    for (addr, name) in addrs.iter().zip(names) {
        let mut ok = false;
        for _ in 0..200 {
            if serving(*addr, name).await {
                ok = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        assert!(ok, "{name} on {addr} never reported SERVING");
    }

    stop.send(true).unwrap();
    while let Some(done) = services.join_next().await {
        done.unwrap().unwrap();
    }
}
