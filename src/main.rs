use clap::Parser;

#[tokio::main]
async fn main() {
    // The log filter is the one environment variable read outside the
    // command line's own parsing and the configuration's loading.
    onejob::telemetry::init(std::env::var("RUST_LOG").ok().as_deref());
    let cli = onejob::cli::Cli::parse();
    if let Err(error) = onejob::cli::execute(cli).await {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}
