//! PostgreSQL's disks fill: a cluster of the test's own, its data
//! directory on one small tmpfs and its WAL on another, under the same
//! load, in two rounds.
//!
//! 1. The data disk fills: a table or index cannot grow, and PostgreSQL
//!    refuses the statement (`could not extend file …: No space left on
//!    device`, SQLSTATE 53100) and stays up. Once space returns, onejob
//!    serves again; nothing restarts.
//! 2. The WAL disk fills, held by an abandoned replication slot (the
//!    ordinary way a WAL disk fills): a commit cannot get a new WAL
//!    segment, PostgreSQL PANICs, and its crash recovery cannot write
//!    either, so it stops. onejob answers 503 while it is down; once space
//!    returns and the cluster is started again, the same onejob process
//!    serves again.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;

use super::load::{Load, Tally};
use super::{
    admin_token, assert_kept, config_file, disk_full_seen, kib, ms, reads_while_full, sent_twice,
    survival, DISK_FULL_DETAIL, FILL_WITHIN, FULL_FOR, SERVE_AGAIN_WITHIN, WARM_WITHIN,
};
use crate::server_process::ServerProcess;
use crate::support::fake_provider::{FakeProvider, Shape};
use crate::support::harness::record_figures;
use crate::support::scratch_cluster::{postgres_bin_dir, ScratchCluster};
use crate::support::tmpfs::{running_as_root, skip_or_fail, Tmpfs};

/// The data disk: a fresh cluster takes about 25 MB of it.
const DATA_BYTES: u64 = 48 * 1024 * 1024;
/// The WAL disk: a few 1 MB segments.
const WAL_BYTES: u64 = 16 * 1024 * 1024;
/// What the fillers leave for the load to fill.
const DATA_HEADROOM: u64 = 1024 * 1024;
const WAL_HEADROOM: u64 = 256 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn full_data_and_wal_disks_answer_503_lose_no_acknowledged_job_and_serve_again() {
    if !running_as_root() {
        return skip_or_fail("not running as root: initdb runs as user postgres, mounts need root");
    }
    let Some(bin) = postgres_bin_dir() else {
        return skip_or_fail("no PostgreSQL server binaries under /usr/lib/postgresql");
    };
    let (Some(data_disk), Some(wal_disk)) = (
        Tmpfs::mount(DATA_BYTES, Some("postgres")),
        Tmpfs::mount(WAL_BYTES, Some("postgres")),
    ) else {
        return;
    };
    let logs = tempfile::tempdir().unwrap();
    std::fs::set_permissions(logs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cluster = ScratchCluster::init(
        &bin,
        &data_disk.path().join("data"),
        Some(&wal_disk.path().join("wal")),
        &logs.path().join("postgres.log"),
    );
    for (name, value) in [
        ("max_wal_size", "4MB"),
        ("min_wal_size", "2MB"),
        ("max_connections", "40"),
        ("lc_messages", "C"),
    ] {
        cluster.set(name, value);
    }
    cluster.start();
    execute(&cluster.url("postgres"), "CREATE DATABASE onejob");
    let url = cluster.url("onejob");

    let fake = FakeProvider::start(Shape::OpenAi).await;
    let config = config_file(logs.path(), &fake);
    let mut server = ServerProcess::spawn(logs.path(), "onejob", &config, &url);
    server.wait_ready().await;
    let token = admin_token(&url).await;
    let load = Load::start(&server.base, &token, super::CLIENTS, super::TEXT_BYTES);
    load.wait_for(
        "50 acknowledged jobs before a disk fills",
        WARM_WITHIN,
        |t| t.acknowledged.len() >= 50,
    )
    .await;

    let data = data_disk_round(&load, &data_disk, &cluster, (&server.base, &token)).await;
    let wal = wal_disk_round(&load, &wal_disk, &cluster, &server).await;

    tokio::time::sleep(Duration::from_millis(500)).await;
    let tally = load.stop().await;
    let still_running = server.exit_status().is_none();
    let survival = survival(&url, &tally).await;
    let sent_twice = sent_twice(&fake);
    let amcheck = amcheck(&bin, &cluster);
    let figures = format!(
        "PostgreSQL 1 MB WAL segments; data on a {} tmpfs, WAL on a {} tmpfs; {} clients:\n\
         data disk ({} left to the load): {}\n\
         WAL disk ({} left to the load, held by an abandoned replication slot): {}\n\
         requests answered: {}; no answer: {}\n\
         503 details: {}\n\
         acknowledged jobs: {}; found after: {}, succeeded: {}, lost: {}; keys with two jobs: {}; \
         attempts sent twice: {}\n\
         onejob: the same process throughout (pid {}, running: {still_running}), never restarted\n\
         pg_amcheck (heap and every B-tree index): {}",
        kib(DATA_BYTES),
        kib(WAL_BYTES),
        super::CLIENTS,
        kib(DATA_HEADROOM),
        data.figures,
        kib(WAL_HEADROOM),
        wal.figures,
        tally.statuses(),
        tally.no_answer,
        tally.details(),
        survival.acknowledged,
        survival.found,
        survival.succeeded,
        survival.lost.len(),
        survival.keys_with_two_jobs,
        sent_twice,
        server.pid,
        amcheck.as_deref().unwrap_or("ok"),
    );
    eprintln!("{figures}");
    record_figures("full_disk_postgres", &figures);

    assert!(
        still_running,
        "onejob kept running through the full disks:\n{}",
        server.stderr()
    );
    assert_kept(
        &tally,
        &survival,
        sent_twice,
        DISK_FULL_DETAIL,
        &server.stderr(),
    );
    assert!(
        data.postgres_stayed_up,
        "a full data disk refuses statements and PostgreSQL stays up:\n{}",
        cluster.log()
    );
    assert_eq!(
        data.reads,
        (200, 200),
        "reads are served while the data disk is full"
    );
    assert!(
        wal.panicked,
        "a full WAL disk made PostgreSQL PANIC:\n{}",
        cluster.log()
    );
    assert_eq!(amcheck, None, "pg_amcheck finds no corruption");
    server.terminate();
    assert!(
        server.wait_exit(Duration::from_secs(20)).await.success(),
        "onejob stops cleanly after:\n{}",
        server.stderr()
    );
}

struct Round {
    figures: String,
    postgres_stayed_up: bool,
    /// While the disk was full: a job read back, and `/readyz`.
    reads: (u16, u16),
    panicked: bool,
}

/// The data disk fills under the load; space returns; onejob serves again
/// with nothing restarted.
async fn data_disk_round(
    load: &Load,
    disk: &Tmpfs,
    cluster: &ScratchCluster,
    (base, token): (&str, &str),
) -> Round {
    let before = load.read(counts);
    disk.fill_leaving(DATA_HEADROOM);
    let filled_in = load
        .wait_for("the load fills the data disk", FILL_WITHIN, disk_full_seen)
        .await;
    tokio::time::sleep(FULL_FOR).await;
    let reads = reads_while_full(base, token, load).await;
    let postgres_stayed_up = cluster.running();
    disk.free_filler();
    let freed = Instant::now();
    let served_again = load
        .wait_for(
            "a creation succeeds once the data disk has space",
            SERVE_AGAIN_WITHIN,
            |t| t.acknowledged_after(freed) > 0 || !t.wrong.is_empty(),
        )
        .await;
    let during = load.read(counts) - before;
    Round {
        figures: format!(
            "filled in {}, full for {}; PostgreSQL up throughout: {postgres_stayed_up}; \
             while full a job read back {}, /readyz {}; meanwhile {during}; serving again {} after the filler was deleted (bound {}), \
             nothing restarted",
            ms(filled_in),
            ms(FULL_FOR),
            reads.0,
            reads.1,
            ms(served_again),
            ms(SERVE_AGAIN_WITHIN),
        ),
        postgres_stayed_up,
        reads,
        panicked: false,
    }
}

/// An abandoned replication slot holds every WAL segment; the WAL disk
/// fills, PostgreSQL PANICs and stops; onejob answers 503 meanwhile;
/// space returns, the operator starts the cluster and drops the slot,
/// and onejob serves again without a restart of its own.
async fn wal_disk_round(
    load: &Load,
    disk: &Tmpfs,
    cluster: &ScratchCluster,
    server: &ServerProcess,
) -> Round {
    let url = &cluster.url("onejob");
    execute(
        url,
        "SELECT pg_create_physical_replication_slot('abandoned', true)",
    );
    let before = load.read(counts);
    disk.fill_leaving(WAL_HEADROOM);
    let started = Instant::now();
    while !cluster.log().contains("PANIC") {
        assert!(
            started.elapsed() < FILL_WITHIN,
            "the load fills the WAL disk within {FILL_WITHIN:?}; answers: {}\n{}",
            load.read(Tally::statuses),
            cluster.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let panicked_in = started.elapsed();
    let stopped = cluster.wait_stopped(Duration::from_secs(5)).await;
    tokio::time::sleep(FULL_FOR).await;
    disk.free_filler();
    let freed = Instant::now();
    let restarted = !cluster.running();
    if restarted {
        cluster.start();
    }
    execute(url, "SELECT pg_drop_replication_slot('abandoned')");
    let served_again = load
        .try_wait_for(SERVE_AGAIN_WITHIN, |t| {
            t.acknowledged_after(freed) > 0 || !t.wrong.is_empty()
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "a creation succeeds within {SERVE_AGAIN_WITHIN:?} once the WAL disk has space \
                 (cluster started again: {restarted}); {}\nPostgreSQL's log:\n{}\nonejob's log:\n{}",
                load.so_far(),
                tail(&cluster.log(), 40),
                tail(&server.stderr(), 80),
            )
        });
    let during = load.read(counts) - before;
    Round {
        figures: format!(
            "PostgreSQL PANICked {} after the filler; stopped by itself: {stopped}; \
             down (503s) for {} more; meanwhile {during}; started again by the operator: {restarted}; \
             onejob serving again {} after the filler was deleted (cluster start included; bound {})",
            ms(panicked_in),
            ms(FULL_FOR),
            ms(served_again),
            ms(SERVE_AGAIN_WITHIN),
        ),
        postgres_stayed_up: false,
        reads: (0, 0),
        panicked: true,
    }
}

/// Answers so far: (acknowledged, 503s), for what a round saw.
#[derive(Clone, Copy)]
struct Counts(usize, u64);

impl std::ops::Sub for Counts {
    type Output = String;
    fn sub(self, before: Self) -> String {
        format!(
            "{} acknowledged, {} answered 503",
            self.0 - before.0,
            self.1 - before.1
        )
    }
}

fn counts(tally: &Tally) -> Counts {
    Counts(tally.acknowledged.len(), tally.unavailable_count())
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// One statement on a connection of its own.
fn execute(url: &str, sql: &str) {
    PgConnection::establish(url)
        .unwrap_or_else(|error| panic!("connect to {url}: {error}"))
        .batch_execute(sql)
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

/// `pg_amcheck` over the whole database (heaps, and every B-tree index
/// against its heap): `None` when it finds nothing wrong, else what it
/// said.
fn amcheck(bin: &std::path::Path, cluster: &ScratchCluster) -> Option<String> {
    let output = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(bin.join("pg_amcheck"))
        .args(["-h", "127.0.0.1", "-p", &cluster.port.to_string()])
        .args(["-U", "postgres", "-d", "onejob", "--install-missing"])
        .args(["--heapallindexed", "--rootdescend"])
        .current_dir("/")
        .output()
        .expect("run pg_amcheck");
    (!output.status.success()).then(|| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}
