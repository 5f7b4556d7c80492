//! Tracing setup: human-readable logs on stderr, filtered by the `RUST_LOG`
//! value the command line passes in (default `info`). Request spans carry a
//! request id.

use tracing_subscriber::EnvFilter;

pub fn init(filter: Option<&str>) {
    let filter = filter
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
