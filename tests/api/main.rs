//! onejob's integration tests: the real server on a free port of 127.0.0.1,
//! against a fresh database per test, the same suite on SQLite and PostgreSQL.
//!
//! Each scenario is an `async fn(TestBackend)`; `on_both_backends!` turns it
//! into `<module>::sqlite::<name>` and `<module>::postgres::<name>`.
//!
//! Every module here is scenarios, except [`support`]: the harness that
//! starts the app, the fake provider, the browser and the readers of what
//! the server stored and counted.

#[macro_use]
mod support;

mod accounts;
mod admin;
mod ambiguous_requests;
mod attempts;
mod authorization;
mod azure_openai;
mod bad_input;
mod bedrock;
mod browser;
mod browser_pages;
mod budget_limits;
mod callbacks;
mod classification;
mod command_line;
mod concurrency;
mod constraints;
mod demo;
mod deploys;
mod docs_check;
mod docs_examples;
mod door_matrix;
mod edges;
mod failover;
mod full_disk;
mod gemini;
mod group_commit;
mod guard_agreement;
mod guards;
mod health;
mod history;
mod hostile;
mod idempotency;
mod kept_tokens;
mod late_answers;
mod ledger;
mod load_balancer;
mod lost_commit;
mod messages;
mod metrics;
mod multi_process;
mod openai_compat;
mod pages;
mod partition;
mod plain_win;
mod properties;
mod qualification;
mod rate_limits;
mod readme_walkthrough;
mod resident_memory;
mod responses;
mod retention;
mod schema_rules;
mod secrecy;
mod send_path;
mod server_process;
mod sessions;
mod sign_in_abuse;
mod start_on_create;
mod statement_rules;
mod storage;
mod streaming;
mod traces;
mod twins;
mod upgrades;
mod webhook_fairness;
mod webhook_paging;
mod webhooks;
