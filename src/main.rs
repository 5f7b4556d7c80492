use clap::Parser;

#[tokio::main]
async fn main() {
    onejob::telemetry::init();
    let cli = onejob::cli::Cli::parse();
    if let Err(error) = onejob::cli::execute(cli).await {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}
