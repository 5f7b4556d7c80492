//! The built-in configuration's demo: sim-slow qualifies at start and can
//! take failover; a provider that cannot qualify is explained in words in
//! the start log; and the configuration the slow demo walk-throughs run
//! (the README's curl commands, the browser's) is the built-in one with
//! only the late answer's delay shortened.
//!
//! The walk-throughs pause [`PERSON_PAUSE`] between steps, as a person
//! reading the README does, and longer where the README says to wait. The built-in late answer comes after 3 minutes;
//! they use [`DEMO_LATE_ANSWER_MS`] instead, so each runs in under a minute.
//! The soft timeout (5 s) is the built-in one.

use std::time::Duration;

use onejob::config::{Config, DEFAULT_CONFIG_TOML};
use toml::{Table, Value as Toml};

use crate::server_process::ServerProcess;
use crate::support::harness::{spawn_app_with, summarize, test_config, TestBackend, TestDb};

/// How long a person takes between two steps of the demo (about 4 s
/// between the README's commands). A step the README times ("5 s later")
/// waits at least that long.
pub const PERSON_PAUSE: Duration = Duration::from_secs(4);

/// When sim-slow's late answer comes in the walk-throughs (3 minutes in the
/// built-in configuration): after every step of the demo at
/// [`PERSON_PAUSE`], with room for a slow machine.
pub const DEMO_LATE_ANSWER_MS: i64 = 50_000;

/// The built-in configuration's tables.
fn built_in() -> Table {
    DEFAULT_CONFIG_TOML
        .parse()
        .expect("the built-in TOML parses")
}

fn provider_mut<'a>(table: &'a mut Table, name: &str) -> &'a mut Table {
    table["providers"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .map(|p| p.as_table_mut().unwrap())
        .find(|p| p["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no provider {name} in the built-in configuration"))
}

/// sim-slow's first-attempt latency and its late-result window, in ms.
fn slow_timings(table: &mut Table) -> (i64, i64) {
    let slow = provider_mut(table, "sim-slow");
    let first = slow["script"][0]["latency_ms"].as_integer().unwrap();
    (first, slow["late_result_ms"].as_integer().unwrap())
}

fn set_slow_timings(table: &mut Table, first: i64, window: i64) {
    let slow = provider_mut(table, "sim-slow");
    slow["script"].as_array_mut().unwrap()[0]
        .as_table_mut()
        .unwrap()
        .insert("latency_ms".into(), Toml::Integer(first));
    slow.insert("late_result_ms".into(), Toml::Integer(window));
}

/// The built-in configuration, with sim-slow's late answer after
/// [`DEMO_LATE_ANSWER_MS`] (and its window to match): the walk-throughs'.
pub fn demo_config_toml() -> String {
    let mut table = built_in();
    set_slow_timings(
        &mut table,
        DEMO_LATE_ANSWER_MS,
        DEMO_LATE_ANSWER_MS + 30_000,
    );
    toml::to_string(&table).unwrap()
}

/// The walk-throughs' configuration, resolved, with the suite's fast
/// polling.
pub fn demo_config() -> Config {
    test_config(&demo_config_toml())
}

/// The built-in timings the README states; the walk-throughs change only
/// the late answer's.
#[test]
fn the_demo_is_the_built_in_configuration_with_a_sooner_late_answer() {
    let mut original = built_in();
    let mut demo: Table = demo_config_toml().parse().unwrap();
    {
        let slow = provider_mut(&mut original, "sim-slow");
        assert_eq!(slow["timeout_ms"].as_integer(), Some(5_000));
        assert_eq!(slow["latency_ms"].as_integer(), Some(1_000));
    }
    assert_eq!(
        slow_timings(&mut original),
        (180_000, 300_000),
        "3 minutes, in a window of 5"
    );
    let (first, window) = slow_timings(&mut demo);
    assert_eq!(first, DEMO_LATE_ANSWER_MS);
    assert!(window > first);
    set_slow_timings(&mut original, 0, 0);
    set_slow_timings(&mut demo, 0, 0);
    assert_eq!(original, demo, "nothing else differs");
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for said in [
        "after 5 s its attempt is unknown",
        "3 minutes after it was sent",
    ] {
        assert!(readme.contains(said), "the README says {said:?}");
    }
}

/// sim-slow qualifies at start, so the built-in chain `sim-fast →
/// sim-slow` really fails over: with sim-fast refusing, a job is answered
/// by sim-slow, automatically, in about a second.
async fn the_built_in_chain_qualifies_sim_slow_and_fails_over_to_it(backend: TestBackend) {
    let mut table = built_in();
    provider_mut(&mut table, "sim-fast").insert("fail".into(), Toml::String("definite".into()));
    let config = test_config(&toml::to_string(&table).unwrap());
    let app = spawn_app_with(backend, config).await;
    app.app.startup_qualification_settled().await;
    let statuses = app.app.statuses_for_task("summarize").await.unwrap();
    assert_eq!(statuses["sim-slow"].label(), "qualified");
    assert_eq!(
        statuses["sim-fast"].label(),
        "failed",
        "a refusing provider does not qualify"
    );
    let job_id = app
        .create_job(&app.alice.token, "fails-over", &summarize("fail over"))
        .await;
    let job = app
        .wait_for_status(&job_id, "succeeded", Duration::from_secs(15))
        .await;
    let attempts: Vec<(&str, &str)> = job["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["provider"].as_str().unwrap(),
                a["state"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        vec![("sim-fast", "failed"), ("sim-slow", "succeeded")]
    );
    assert_eq!(job["result"]["provider"], "sim-slow");
}

/// A simulated provider that cannot qualify (here sim-slow with its old
/// timings: a 3 s answer, a 0.5 s soft timeout) is named in the start log
/// with what failed, in words.
async fn the_start_log_says_why_a_provider_did_not_qualify(backend: TestBackend) {
    let db = TestDb::create(backend);
    let dir = tempfile::tempdir().unwrap();
    let mut table = built_in();
    let slow = provider_mut(&mut table, "sim-slow");
    slow.insert("latency_ms".into(), Toml::Integer(3_000));
    slow.insert("timeout_ms".into(), Toml::Integer(500));
    let config = dir.path().join("onejob.toml");
    std::fs::write(&config, toml::to_string(&table).unwrap()).unwrap();
    let mut server = ServerProcess::spawn(dir.path(), "serve", &config, db.url.as_str());
    server.wait_ready().await;
    let wanted = [
        "simulated provider sim-slow did not qualify for task summarize at start, so no job \
         fails over to it (a job may still name it): golden[0] answer failed: no answer within \
         the provider's soft timeout of 500 ms (`timeout_ms`)",
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !wanted.iter().all(|w| server.stderr().contains(w)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the start log does not explain it:\n{}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        server
            .stderr()
            .contains("simulated provider qualified at start"),
        "sim-fast did: {}",
        server.stderr()
    );
    server.terminate();
    server.wait_exit(Duration::from_secs(30)).await;
}

on_both_backends!(
    the_built_in_chain_qualifies_sim_slow_and_fails_over_to_it,
    the_start_log_says_why_a_provider_did_not_qualify,
);
