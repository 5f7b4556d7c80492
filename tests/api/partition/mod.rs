//! A process cut off from the database while it holds leases and has calls
//! in flight (docs/deployment.md, "When a process is cut off from the
//! database"). PostgreSQL only: the cut is a proxy between a process and
//! its server ([`DbProxy`](crate::support::db_proxy::DbProxy)), which at the
//! partition holds every byte either way (nothing lost, nothing answered)
//! and at the heal lets it all through, in order.
//!
//! - [`cut_off`]: three real `onejob serve` processes; A, through the
//!   proxy, is cut off with its calls in flight. Its leases run out, B's
//!   and C's reapers make its sent attempts `unknown` (never sent again),
//!   B and C take the queued work, support resolves some unknown attempts
//!   on another provider. A's answers come back to A while it is still cut
//!   off; at the heal its stale renewals and compare-and-swaps reach the
//!   database and write nothing over what happened meanwhile.
//! - [`locked_row`]: a cut that catches a process inside a transaction
//!   (its renewal ran, its `COMMIT` is held) leaves that row locked until
//!   PostgreSQL ends the session; the reapers reap the other attempts
//!   meanwhile, and that one after.

mod clients;
mod cut_off;
mod locked_row;
mod rows;
mod setup;

use std::time::Duration;

/// The calls A holds open when it is cut off (its worker's concurrency).
const HELD: usize = 4;
/// Jobs left queued behind A's full slots, for B and C to take.
const QUEUED: usize = 2;
/// A's unknown attempts support resolves on the backup provider.
const RESOLVED: usize = 2;
/// Short leases, so A's run out while it is cut off.
const LEASE_MS: u64 = 2_000;
/// PostgreSQL ends a session idle inside a transaction this long after its
/// last statement, rolling it back and freeing its rows.
const IDLE_IN_TRANSACTION_MS: u64 = 5_000;
/// Every wait of the scenarios is bounded by this.
const STEP: Duration = Duration::from_secs(20);

mod postgres {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_cut_off_process_sends_nothing_again_and_overwrites_no_result() {
        if crate::support::harness::postgres_available() {
            super::cut_off::a_cut_off_process_sends_nothing_again_and_overwrites_no_result().await
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_renewal_caught_open_by_the_cut_delays_only_its_own_attempts_reaping() {
        if crate::support::harness::postgres_available() {
            super::locked_row::a_renewal_caught_open_by_the_cut_delays_only_its_own_attempts_reaping()
                .await
        }
    }
}
