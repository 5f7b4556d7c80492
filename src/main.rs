use std::os::unix::process::CommandExt;

use clap::Parser;

/// Many small allocations per request, on several threads at once: glibc's
/// allocator spent a fifth of the server's CPU on them (docs/benchmarks.md).
/// Built with mimalloc's `override` (Cargo.toml), it serves SQLite's own
/// allocations (a page split's scratch space, a record's buffer) as well.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc gives a large freed block (a password hash's 19 MiB) back to
/// the operating system only after a delay, and only when it next tidies
/// up; a thread started meanwhile may take the block for its own, pages
/// still resident, and an idle server kept them for good (docs/benchmarks.md,
/// "A password hash's memory"). With this option such blocks go back as
/// they are freed.
const ALLOCATOR_OPTION: (&str, &str) = ("MIMALLOC_ARENA_PURGE_MULT", "0");

fn main() {
    with_allocator_option();
    // Besides the allocator's option, the log filter is the one environment
    // variable read outside the command line's own parsing and the
    // configuration's loading.
    let log_filter = std::env::var("RUST_LOG").ok();
    let cli = onejob::cli::Cli::parse();
    if let Err(error) = onejob::cli::execute(cli, log_filter.as_deref()) {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

/// mimalloc reads its options from the environment as the process starts,
/// before `main`, and setting one from the program takes `unsafe` code.
/// So when [`ALLOCATOR_OPTION`] is unset, onejob runs itself again with it
/// set, by `exec`: the same process, its PID, arguments and open files
/// kept. A value set by whoever started onejob is left as it is.
fn with_allocator_option() {
    let (name, value) = ALLOCATOR_OPTION;
    if std::env::var_os(name).is_some() {
        return;
    }
    let Ok(program) = std::env::current_exe() else {
        return;
    };
    let mut args = std::env::args_os();
    let mut command = std::process::Command::new(program);
    if let Some(arg0) = args.next() {
        command.arg0(arg0);
    }
    // Returns only if the program could not be started again.
    let error = command.args(args).env(name, value).exec();
    eprintln!(
        "onejob: could not run itself again with {name}={value} ({error}); going on without it"
    );
}
