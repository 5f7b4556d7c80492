//! A model checker over onejob's own protocol (docs/design.md, "Invariants
//! and what enforces them").
//!
//! Stateright explores every interleaving of the model in [`protocol`]
//! breadth first, within bounds, and checks the properties of
//! [`properties`] in every reachable state: N onejob processes (each with
//! its calls in memory, lost when it is killed), one database (the rows the
//! schema holds, and its clock), providers that answer, fail, refuse
//! (`429`), stall or answer late (by the call or by a signed callback), and
//! whose replies may be lost, clients that send, retry and duplicate, and
//! an operator.
//!
//! Actions: job creation (queued, or started at once in the creating
//! transaction), claims (confirmed in the claiming statement), the send, a
//! claim given back before its send, answers and their delivery, soft
//! timeouts and late answers, lease renewal, the clock, the reaper, `kill
//! -9` and restart, abandon, new attempts and marking failed by an
//! operator, the end of a retention window and pruning.
//!
//! Streams are modelled: a sent attempt may release a chunk of its answer
//! to the job's followers while it runs; a definite failure after that is
//! taken through `domain::stream::failure_after`, so the job fails rather
//! than fail over (no second answer spliced onto the first); a stall after
//! a chunk is the soft timeout's `unknown`, and a kill mid-stream the
//! lease's. Where the chunks are kept (memory, database) is not modelled.
//!
//! Cancels and the webhook outbox are modelled: a cancel is
//! `domain::on_cancel` under the job's lock (the job to `cancelled`, its
//! version on, its queued attempt withdrawn), so a sent attempt's late
//! answer loses the compare-and-swap; each state change that has an event
//! writes its outbox row in its own transaction (`domain::webhook::
//! records_event`, one endpoint subscribed to every kind), and each
//! process's delivery loop claims rows by `domain::webhook::
//! may_claim_event` with a lease, sends, and records the receiver's 2xx
//! only while its claim holds. A kill loses the loop's deliveries in
//! memory; a lease that runs out lets another process deliver again (at
//! least once, deduplicable by `webhook-id`).
//!
//! Owner budgets are modelled: a creation reserves one token under the
//! budget row's lock if `domain::ledger::may_reserve` says it fits (else
//! it is refused and nothing is stored), a recorded answer spends one
//! (`BudgetCounters::spend`), and the job's end — the winning
//! compare-and-swap, `fail_job`, a cancel — gives its reservation back
//! (`BudgetCounters::release`), once. The usage ledger's rows are not
//! modelled (their key makes each call count once, as a unique key).
//!
//! What it does not cover yet:
//! - the outbox's retries, backoff and disabling (a failed delivery is a
//!   lease that runs out), and resends;
//! - twins in flight (they only spare the database work: each request is
//!   one atomic step at the database here, which the unique key decides);
//! - the providers' limits and pauses inside one process (a pause is the
//!   claim given back; admission only delays claims);
//! - two requests' statements interleaving inside one transaction: each
//!   store procedure is one atomic step, as the job-row lock (PostgreSQL)
//!   or the write lock (SQLite) makes it;
//! - time beyond its bound: `max_clock` ticks, a lease of one tick, a
//!   retry's wait rounded up to a tick.
//!
//! Rate-limit retries (issue 19) are modelled: a refused (`429`) outcome is
//! a definite failure in which nothing happened, and `domain::retry`
//! decides what follows (the qualified fallback first, then the same
//! provider after its wait); a soft timeout is never failed over.
//!
//! `cargo test --test model` runs the CI configurations and the broken
//! variants; `ONEJOB_MODEL_BIG=1` adds the bigger configuration whose
//! figures are in docs/design.md.

mod properties;
mod protocol;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model};

use protocol::{Bounds, Bug, Protocol};

/// Two processes, two keys (and a duplicate of each, and another payload
/// under one), three providers, a kill, two operator steps, retention.
fn ci_bounds() -> Bounds {
    Bounds {
        processes: 2,
        keys: 2,
        sends_per_key: 2,
        other_payload: true,
        kills: 1,
        operator_steps: 2,
        retention: true,
        give_backs: true,
        max_clock: 3,
        lease: 1,
        max_attempts: 3,
        fair: false,
        streams: false,
        cancels: 0,
        outbox: false,
        budget: None,
    }
}

/// An owner's budget that fits one unfinished job: two keys sent twice
/// each, two processes, a kill, a cancel, an operator step.
fn budget_bounds() -> Bounds {
    Bounds {
        sends_per_key: 2,
        other_payload: false,
        operator_steps: 1,
        retention: false,
        give_backs: false,
        cancels: 1,
        budget: Some(1),
        ..ci_bounds()
    }
}

/// Cancels and the webhook outbox: one key, two processes whose delivery
/// loops race for its events, a kill, a cancel, an operator step.
fn outbox_bounds() -> Bounds {
    Bounds {
        keys: 1,
        sends_per_key: 1,
        other_payload: false,
        operator_steps: 1,
        retention: false,
        give_backs: false,
        cancels: 1,
        outbox: true,
        ..ci_bounds()
    }
}

/// Streamed attempts: one key sent twice, two processes, a kill, an
/// operator step.
fn stream_bounds() -> Bounds {
    Bounds {
        keys: 1,
        other_payload: false,
        operator_steps: 1,
        retention: false,
        give_backs: false,
        streams: true,
        ..ci_bounds()
    }
}

/// One key, followed further: two kills, three operator steps.
fn deep_bounds() -> Bounds {
    Bounds {
        keys: 1,
        kills: 2,
        operator_steps: 3,
        max_clock: 4,
        ..ci_bounds()
    }
}

/// Fair runs (no kill, no lost reply, no pause), for liveness.
fn fair_bounds() -> Bounds {
    Bounds {
        keys: 1,
        kills: 0,
        operator_steps: 0,
        retention: false,
        give_backs: false,
        other_payload: false,
        max_clock: 4,
        fair: true,
        ..ci_bounds()
    }
}

/// The depth the CI configurations are checked to (every schedule of up
/// to this many steps), or `ONEJOB_MODEL_DEPTH`.
fn depth(ci: usize) -> usize {
    std::env::var("ONEJOB_MODEL_DEPTH")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(ci)
}

const CI_DEPTH: usize = 9;
const DEEP_DEPTH: usize = 12;
const STREAM_DEPTH: usize = 10;
const OUTBOX_DEPTH: usize = 11;
const BUDGET_DEPTH: usize = 10;

struct Run {
    label: String,
    states: usize,
    unique: usize,
    depth: usize,
    took: Duration,
    failures: Vec<(&'static str, String)>,
    examples: Vec<&'static str>,
    missing_examples: Vec<&'static str>,
}

impl Run {
    fn line(&self) -> String {
        format!(
            "{}: {} states explored ({} unique) to depth {} in {:.1} s",
            self.label,
            self.states,
            self.unique,
            self.depth,
            self.took.as_secs_f64()
        )
    }
}

/// Checks `model` breadth first (to `depth`, or exhaustively), on
/// `threads`, stopping early when `stop` says.
fn check(
    label: &str,
    model: Protocol,
    depth: Option<usize>,
    threads: usize,
    stop: HasDiscoveries,
) -> Run {
    let started = Instant::now();
    let properties = model.properties();
    let mut builder = model.checker().threads(threads).finish_when(stop);
    if let Some(depth) = depth {
        builder = builder.target_max_depth(depth);
    }
    let checker = builder.spawn_bfs().join();
    let took = started.elapsed();
    let discoveries = checker.discoveries();
    let mut failures = Vec::new();
    let mut examples = Vec::new();
    let mut missing_examples = Vec::new();
    for property in &properties {
        let found = discoveries.get(property.name);
        match (property.expectation.discovery_is_failure(), found) {
            (true, Some(path)) => failures.push((property.name, trace(checker.model(), path))),
            (false, Some(_)) => examples.push(property.name),
            (false, None) => missing_examples.push(property.name),
            (true, None) => {}
        }
    }
    Run {
        label: label.to_owned(),
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        took,
        failures,
        examples,
        missing_examples,
    }
}

/// A counterexample, one numbered step a line.
fn trace(_model: &Protocol, path: &stateright::Path<protocol::State, protocol::Action>) -> String {
    let mut out = String::new();
    for (i, action) in path.clone().into_actions().iter().enumerate() {
        let _ = writeln!(out, "  {:>2}. {action:?}", i + 1);
    }
    let last = path.last_state();
    let _ = writeln!(out, "  final jobs: {:?}", last.jobs);
    let _ = writeln!(out, "  final attempts: {:?}", last.attempts);
    out
}

fn invariant_names() -> Vec<&'static str> {
    Protocol::new(ci_bounds(), Bug::None)
        .properties()
        .iter()
        .filter(|p| p.expectation.discovery_is_failure())
        .map(|p| p.name)
        .collect()
}

/// Appends `text` to the model's figures, which `.ci/run` prints.
fn record(text: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-figures");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.txt");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    std::io::Write::write_all(&mut file, format!("{text}\n").as_bytes()).unwrap();
}

fn passes(run: &Run) {
    let mut figures = run.line();
    let _ = write!(
        figures,
        "; {} properties held: {}",
        invariant_names().len(),
        invariant_names().join("; ")
    );
    let _ = write!(figures, "; examples reached: {}", run.examples.join("; "));
    if !run.missing_examples.is_empty() {
        let _ = write!(
            figures,
            "; not within these bounds: {}",
            run.missing_examples.join("; ")
        );
    }
    eprintln!("{figures}");
    record(&figures);
    let failures: Vec<String> = run
        .failures
        .iter()
        .map(|(name, trace)| format!("{name}:\n{trace}"))
        .collect();
    assert!(
        failures.is_empty(),
        "counterexamples:\n{}",
        failures.join("\n")
    );
}

#[test]
fn two_processes_two_jobs_three_providers_keep_every_invariant() {
    let run = check(
        "model (2 processes, 2 keys, 3 providers, 1 kill, 2 operator steps, retention)",
        Protocol::new(ci_bounds(), Bug::None),
        Some(depth(CI_DEPTH)),
        2,
        HasDiscoveries::AnyFailures,
    );
    passes(&run);
    for example in [
        "a refused (429) attempt is retried as a new attempt",
        "a definite failure fails over to the qualified fallback",
        "a killed process's sent attempt becomes unknown",
    ] {
        assert!(run.examples.contains(&example), "not reached: {example}");
    }
}

#[test]
fn one_job_followed_further_keeps_every_invariant() {
    let run = check(
        "model (2 processes, 1 key, 3 providers, 2 kills, 3 operator steps, retention)",
        Protocol::new(deep_bounds(), Bug::None),
        Some(depth(DEEP_DEPTH)),
        1,
        HasDiscoveries::AnyFailures,
    );
    passes(&run);
    for example in [
        "a key freed by retention makes a new job",
        "a killed process's sent attempt becomes unknown",
    ] {
        assert!(run.examples.contains(&example), "not reached: {example}");
    }
}

#[test]
fn with_no_kill_and_answering_providers_every_job_ends() {
    let run = check(
        "model, fair runs (2 processes, 1 key sent twice, 3 providers, no kill), every schedule",
        Protocol::new(fair_bounds(), Bug::None),
        None,
        1,
        HasDiscoveries::AnyFailures,
    );
    passes(&run);
}

#[test]
fn streamed_attempts_keep_every_invariant() {
    let run = check(
        "model, streams (2 processes, 1 key sent twice, 3 providers, 1 kill, 1 operator step)",
        Protocol::new(stream_bounds(), Bug::None),
        Some(depth(STREAM_DEPTH)),
        2,
        HasDiscoveries::AnyFailures,
    );
    passes(&run);
    let example = "a stream that fails after a released chunk fails its job";
    assert!(run.examples.contains(&example), "not reached: {example}");
}

#[test]
fn cancels_and_the_webhook_outbox_keep_every_invariant() {
    let run = check(
        "model, cancels and outbox (2 processes, 1 key, 3 providers, 1 kill, 1 cancel, 1 operator step)",
        Protocol::new(outbox_bounds(), Bug::None),
        Some(depth(OUTBOX_DEPTH)),
        2,
        HasDiscoveries::AnyFailures,
    );
    passes(&run);
    for example in [
        "a cancelled job's late answer loses the race",
        "an event whose delivery lease ran out is delivered again",
    ] {
        assert!(run.examples.contains(&example), "not reached: {example}");
    }
}

#[test]
fn budgets_keep_every_invariant() {
    let run = check(
        "model, budgets (2 processes, 2 keys, a budget of one job, 1 kill, 1 cancel, 1 operator step)",
        Protocol::new(budget_bounds(), Bug::None),
        Some(depth(BUDGET_DEPTH)),
        2,
        HasDiscoveries::AnyFailures,
    );
    passes(&run);
    let example = "a creation past the budget is refused, and a later one fits again";
    assert!(run.examples.contains(&example), "not reached: {example}");
}

#[test]
fn reserving_without_the_budget_check_is_caught() {
    rejected(
        Bug::NoBudgetCheck,
        properties::BUDGET_HELD,
        budget_bounds(),
        BUDGET_DEPTH,
    );
}

#[test]
fn a_win_that_keeps_its_reservation_is_caught() {
    rejected(
        Bug::KeepReservation,
        properties::RESERVATIONS_BALANCE,
        budget_bounds(),
        BUDGET_DEPTH,
    );
}

#[test]
fn the_bigger_configuration_behind_a_flag() {
    if std::env::var_os("ONEJOB_MODEL_BIG").is_none() {
        eprintln!("model: the bigger configuration runs with ONEJOB_MODEL_BIG=1");
        return;
    }
    let bounds = Bounds {
        processes: 3,
        kills: 2,
        max_clock: 4,
        ..ci_bounds()
    };
    let run = check(
        "model, bigger (3 processes, 2 keys, 3 providers, 2 kills, 2 operator steps, retention)",
        Protocol::new(bounds, Bug::None),
        Some(depth(10)),
        2,
        HasDiscoveries::AnyFailures,
    );
    passes(&run);
}

/// Runs the model with `bug` until the checker finds a counterexample to
/// `property`, and prints its trace.
fn rejected(bug: Bug, property: &'static str, bounds: Bounds, depth: usize) {
    let run = check(
        &format!("broken variant {bug:?}"),
        Protocol::new(bounds, bug),
        Some(depth),
        1,
        HasDiscoveries::AnyOf(BTreeSet::from([property])),
    );
    let found = run.failures.iter().find(|(name, _)| *name == property);
    let Some((_, trace)) = found else {
        panic!(
            "{bug:?}: no counterexample to \"{property}\"; {}",
            run.line()
        );
    };
    let figures = format!(
        "{}: rejected, counterexample to \"{property}\":\n{trace}",
        run.line()
    );
    eprintln!("{figures}");
    record(&figures);
}

#[test]
fn requeueing_a_sent_attempt_is_caught() {
    rejected(
        Bug::RequeueSentAttempts,
        properties::SENT_ONCE,
        deep_bounds(),
        10,
    );
}

#[test]
fn an_index_that_leaves_unknown_out_is_caught() {
    rejected(Bug::UnknownNotLive, properties::ONE_LIVE, deep_bounds(), 12);
}

#[test]
fn a_cas_without_its_guard_is_caught() {
    let bounds = Bounds {
        processes: 1,
        kills: 0,
        retention: false,
        other_payload: false,
        give_backs: false,
        ..deep_bounds()
    };
    rejected(Bug::CasWithoutGuard, properties::ONE_WINNER, bounds, 14);
}

#[test]
fn pruning_before_the_window_ends_is_caught() {
    rejected(
        Bug::PruneBeforeWindow,
        properties::ACKED_EXISTS,
        deep_bounds(),
        10,
    );
}

#[test]
fn replaying_another_payload_is_caught() {
    rejected(
        Bug::NoFingerprintCheck,
        properties::ONE_JOB_PER_KEY,
        ci_bounds(),
        4,
    );
}

#[test]
fn a_key_without_its_unique_constraint_is_caught() {
    rejected(
        Bug::NoUniqueKey,
        properties::ONE_JOB_PER_KEY,
        ci_bounds(),
        4,
    );
}

#[test]
fn failing_over_from_a_timeout_is_caught() {
    rejected(
        Bug::FailoverOnTimeout,
        properties::FAILOVER_DEFINITE,
        ci_bounds(),
        8,
    );
}

#[test]
fn failing_over_after_a_released_chunk_is_caught() {
    rejected(
        Bug::FailoverAfterChunk,
        properties::NO_SPLICE,
        stream_bounds(),
        8,
    );
}

#[test]
fn a_cancel_that_keeps_the_version_is_caught() {
    rejected(
        Bug::CancelWithoutVersion,
        properties::CANCEL_IS_FINAL,
        outbox_bounds(),
        8,
    );
}

#[test]
fn an_event_written_after_the_commit_is_caught() {
    rejected(
        Bug::EventAfterCommit,
        properties::EVENT_NEVER_LOST,
        outbox_bounds(),
        8,
    );
}

#[test]
fn a_claim_that_ignores_the_lease_is_caught() {
    rejected(
        Bug::ClaimIgnoresLease,
        properties::DELIVERED_ONCE_WHILE_HEALTHY,
        outbox_bounds(),
        10,
    );
}
