//! What local mode's tests share: the `vynil` process on free loopback ports.

#![allow(dead_code)]

use std::{
    net::SocketAddr,
    process::{Child, Command},
};

use vynil_testkit::free_port;

/// A running `vynil`, killed on drop.
pub struct Local {
    pub child: Child,
    /// Catalog, scanner, purger, lifecycle, gateway.
    pub ports: [SocketAddr; 5],
    pub dir: tempfile::TempDir,
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port().unwrap()))
}

/// `vynil` with each service on a free loopback port, and those ports
/// (catalog, scanner, purger, lifecycle, gateway).
pub fn vynil_on_free_ports() -> (Command, [SocketAddr; 5]) {
    let ports = [loopback(), loopback(), loopback(), loopback(), loopback()];
    let flags =
        ["--catalog-listen", "--scanner-listen", "--purger-listen", "--lifecycle-listen", "--gateway-listen"];
    let mut command = Command::new(env!("CARGO_BIN_EXE_vynil"));
    for (flag, port) in flags.iter().zip(ports) {
        command.arg(flag).arg(port.to_string());
    }
    (command, ports)
}
