//! Logging set-up. `RUST_LOG` selects what is printed (default `info`);
//! `LOG_FORMAT=json` prints one JSON object per line for log collectors.

use tracing_subscriber::{EnvFilter, fmt};

/// Installs the global subscriber once; later calls are no-ops.
pub fn init_tracing(service: &'static str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("LOG_FORMAT").is_ok_and(|f| f == "json");
    let result = if json {
        fmt().with_env_filter(filter).json().try_init()
    } else {
        fmt().with_env_filter(filter).try_init()
    };
    if result.is_ok() {
        tracing::debug!(service, "tracing initialised");
    }
}
