//! What an idle server keeps resident. A password check (argon2id: 19 MiB,
//! allocated and freed) must not leave its memory behind. mimalloc used to
//! keep it: a thread started before the delayed give-back took the block,
//! pages and all, and an idle server never gave them back. onejob runs
//! itself with `MIMALLOC_ARENA_PURGE_MULT=0` (`src/main.rs`) so that such
//! a block goes back to the operating system as it is freed.

use std::time::{Duration, Instant};

use crate::server_process::ServerProcess;
use crate::support::harness::{
    onejob_users_on, FormClient, TestBackend, TestDb, DEFAULT_TEST_PROVIDERS,
};

const OPTION: &str = "MIMALLOC_ARENA_PURGE_MULT";

/// More than an idle server's own drift, well under the 19 MiB a kept
/// password hash adds.
const MOST_A_HASH_MAY_LEAVE_KIB: u64 = 8 * 1024;

/// A server that has checked two passwords (the first admin's, made as it
/// started, and a sign-in) holds no more resident memory, within a few MiB,
/// than one that never checked any. The process runs with the allocator
/// option set, under the PID it was started with; a value set by whoever
/// starts it is kept.
#[tokio::test]
async fn a_password_check_leaves_no_memory_resident_in_an_idle_server() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("onejob.toml");
    std::fs::write(
        &config,
        format!("[server]\nhttp_workers = 4\n{DEFAULT_TEST_PROVIDERS}"),
    )
    .unwrap();

    // Never hashes: its one user has no password. Started with mimalloc's
    // own default for the option, which it keeps.
    let quiet_db = TestDb::create(TestBackend::Sqlite);
    drop(quiet_db.open_store().await);
    onejob_users_on(&quiet_db, &["add", "alice", "--role", "admin"]);
    let mut quiet = ServerProcess::spawn_on_with_env(
        dir.path(),
        "quiet",
        &config,
        quiet_db.url.as_str(),
        crate::server_process::free_port(),
        &[(OPTION, "10")],
    );
    quiet.wait_ready().await;
    assert_eq!(option_of(quiet.pid).as_deref(), Some("10"), "kept as set");
    let quiet_kib = settled_rss_kib(quiet.pid).await;

    // Hashes the first admin's password as it starts, then checks it.
    let hashing_db = TestDb::create_empty(TestBackend::Sqlite);
    let mut hashing = ServerProcess::spawn(dir.path(), "hashing", &config, hashing_db.url.as_str());
    hashing.wait_ready().await;
    assert_eq!(
        option_of(hashing.pid).as_deref(),
        Some("0"),
        "the process started runs with the option"
    );
    let password_file = hashing_db
        .url
        .sqlite_folder()
        .unwrap()
        .join("onejob-first-password.txt");
    let password = std::fs::read_to_string(password_file).unwrap();
    FormClient::at(&hashing.base)
        .sign_in("admin", password.trim())
        .await;
    let hashing_kib = settled_rss_kib(hashing.pid).await;

    assert!(
        hashing_kib < quiet_kib + MOST_A_HASH_MAY_LEAVE_KIB,
        "after two password checks the server holds {hashing_kib} KiB, one that checked none \
         {quiet_kib} KiB"
    );
}

/// The option's value in the environment process `pid` runs with.
fn option_of(pid: u32) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    environ.split(|b| *b == 0).find_map(|entry| {
        let entry = std::str::from_utf8(entry).ok()?;
        entry
            .strip_prefix(OPTION)?
            .strip_prefix('=')
            .map(str::to_owned)
    })
}

/// The process's resident memory once it has stopped moving: read again
/// every 200 ms until two readings are within 256 KiB (at most 10 s).
async fn settled_rss_kib(pid: u32) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = rss_kib(pid);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = rss_kib(pid);
        if now.abs_diff(last) < 256 || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}
