use clap::Parser;

/// Many small allocations per request, on several threads at once: glibc's
/// allocator spent a fifth of the server's CPU on them (docs/benchmarks.md).
/// Built with mimalloc's `override` (Cargo.toml), it serves SQLite's own
/// allocations (a page split's scratch space, a record's buffer) as well.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // The log filter is the one environment variable read outside the
    // command line's own parsing and the configuration's loading.
    let log_filter = std::env::var("RUST_LOG").ok();
    let cli = onejob::cli::Cli::parse();
    if let Err(error) = onejob::cli::execute(cli, log_filter.as_deref()) {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}
