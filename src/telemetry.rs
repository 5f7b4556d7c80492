//! Tracing setup: human-readable logs on stderr, filtered by the `RUST_LOG`
//! value the command line passes in (default `info`). Request spans carry a
//! request id. Colours only when stderr is a terminal: a log file or a log
//! collector gets plain text.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

pub fn init(filter: Option<&str>) {
    let filter = filter
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
