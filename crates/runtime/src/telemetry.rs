//! Logging set-up. `RUST_LOG` selects what is printed (default `info`);
//! `--log-format json` (`LOG_FORMAT`) prints one JSON object per line for
//! log collectors.

use tracing_subscriber::{EnvFilter, fmt};

/// How log lines are printed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The logging flags every binary takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogConfig {
    /// `text`, or `json` for log collectors.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Installs the global subscriber once; later calls are no-ops.
pub fn init_tracing(service: &'static str, config: &LogConfig) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let result = if config.log_format == LogFormat::Json {
        fmt().with_env_filter(filter).json().try_init()
    } else {
        fmt().with_env_filter(filter).try_init()
    };
    if result.is_ok() {
        tracing::debug!(service, "tracing initialised");
    }
}
