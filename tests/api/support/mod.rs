//! What the scenarios stand on, apart from them: the harness that starts
//! onejob on a fresh database ([`harness`], with `on_both_backends!`), a
//! fake provider over real HTTP and the configuration tests write for it
//! ([`fake_provider`]), a browser ([`webdriver`], [`devtools`]), a proxy
//! that holds an answer back ([`proxy`]), a reader of event streams
//! ([`sse`]), readers of the server's metrics ([`metrics`]) and stored
//! rows ([`db`]), a recorder of the statements sent ([`statement_log`]),
//! databases as an earlier release left them
//! ([`migrations`]), a real nginx running `deploy/nginx.conf`
//! ([`nginx`]) in front of three processes ([`balanced`]), a PostgreSQL
//! primary with its synchronous standby ([`standby`]), a size-limited
//! tmpfs that a test fills ([`tmpfs`]) and a PostgreSQL cluster of a
//! test's own ([`scratch_cluster`]).

#[macro_use]
pub mod harness;

pub mod aws;
pub mod balanced;
pub mod collector;
pub mod db;
pub mod db_proxy;
pub mod devtools;
pub mod fake_provider;
pub mod metrics;
pub mod migrations;
pub mod nginx;
pub mod proxy;
pub mod scratch_cluster;
pub mod sse;
pub mod standby;
pub mod statement_log;
pub mod statement_rule;
pub mod tmpfs;
pub mod webdriver;
pub mod webhook_receiver;
