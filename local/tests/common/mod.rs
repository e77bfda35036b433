//! What local mode's tests share: the `vynil` process on ports the system
//! chooses (every listen flag given as port 0), found in the banner it
//! prints: no port is handed out before it is bound.

#![allow(dead_code)]

use std::{
    net::SocketAddr,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// A running `vynil`, killed on drop.
pub struct Local {
    pub child: Child,
    /// Catalog, scanner, purger, lifecycle, gateway.
    pub ports: [SocketAddr; 5],
    pub dir: tempfile::TempDir,
    /// Its standard output so far.
    printed: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const LISTEN_FLAGS: [&str; 5] =
    ["--catalog-listen", "--scanner-listen", "--purger-listen", "--lifecycle-listen", "--gateway-listen"];

/// `vynil` with every service on port 0 of loopback, except those `own`
/// names (flag, address).
pub fn vynil(own: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vynil"));
    for flag in LISTEN_FLAGS {
        let address = own.iter().find(|(f, _)| *f == flag).map_or("127.0.0.1:0", |(_, a)| a);
        command.arg(flag).arg(address);
    }
    command
}

impl Local {
    /// Spawns `command` (from [`vynil`]) with its standard output read here,
    /// and waits for the banner that says where each service listens.
    pub fn spawn(mut command: Command, dir: tempfile::TempDir) -> Self {
        let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
        let printed = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stdout.take().unwrap();
        let sink = printed.clone();
        let reader = std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n) = std::io::Read::read(&mut pipe, &mut buffer) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        let deadline = Instant::now() + Duration::from_secs(90);
        let ports = loop {
            if let Some(ports) = banner(&printed.lock().unwrap()) {
                break ports;
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "vynil exited ({status}) before saying where it listens:\n{}",
                    printed.lock().unwrap()
                );
            }
            assert!(
                Instant::now() < deadline,
                "vynil never said where it listens:\n{}",
                printed.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Self { child, ports, dir, printed, reader: Some(reader) }
    }

    pub fn gateway(&self) -> SocketAddr {
        self.ports[4]
    }

    /// What it printed so far.
    pub fn printed(&self) -> String {
        self.printed.lock().unwrap().clone()
    }

    /// Waits for the process to end (after a signal) and its output to be read.
    pub fn wait_stopped(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "vynil did not stop");
            std::thread::sleep(Duration::from_millis(50));
        };
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        status
    }
}

/// The addresses (catalog, scanner, purger, lifecycle, gateway) in local
/// mode's start banner, once it is printed whole.
fn banner(printed: &str) -> Option<[SocketAddr; 5]> {
    let line = |label: &str| printed.lines().find_map(|l| l.trim_start().strip_prefix(label).map(str::trim));
    let gateway = line("gateway:")?.strip_prefix("http://")?.parse().ok()?;
    let services = line("services:")?.strip_suffix("(gRPC)")?;
    let mut at = services.split(',').map(|s| s.trim().split_once(' ').and_then(|(_, a)| a.parse().ok()));
    Some([at.next()??, at.next()??, at.next()??, at.next()??, gateway])
}
