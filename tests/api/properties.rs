//! Property tests of the parsers that see client data first: the RFC 8785
//! canonicaliser, the fingerprint built on it, and the idempotency-key
//! parser. Each runs a fixed number of generated cases (seeded, so a
//! failure reproduces) and records how many it tried.

use std::sync::atomic::{AtomicUsize, Ordering};

use onejob::domain::jcs::canonicalize;
use onejob::domain::{Fingerprint, IdempotencyKey, JobIntent};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Map, Number, Value};

const CASES: u32 = 2_000;

/// A runner with a fixed seed: the same cases on every run.
fn runner() -> TestRunner {
    TestRunner::new_with_rng(
        Config {
            cases: CASES,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    )
}

/// JSON values whose numbers are doubles written as Rust writes them
/// (exact, and within ±2^53), nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-9_007_199_254_740_991i64..=9_007_199_254_740_991).prop_map(|n| Value::Number(n.into())),
        (-1e15f64..1e15).prop_filter_map("a finite double", |f| Number::from_f64(f)
            .map(Value::Number)),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// The same document written differently: members in reverse order and
/// white space between tokens.
fn rewritten(value: &Value) -> String {
    match value {
        Value::Array(items) => format!(
            "[ {} ]",
            items
                .iter()
                .map(rewritten)
                .collect::<Vec<_>>()
                .join(" ,\n ")
        ),
        Value::Object(map) => {
            let mut members: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{} :\t{}", Value::String(k.clone()), rewritten(v)))
                .collect();
            members.reverse();
            format!("{{ {} }}", members.join(" , "))
        }
        other => other.to_string(),
    }
}

fn record(name: &str, tried: usize) {
    let figures = format!("{name}: {tried} generated inputs, every property held");
    eprintln!("{figures}");
    crate::support::harness::record_figures(&format!("property-{name}"), &figures);
}

#[test]
fn canonical_form_is_idempotent_and_blind_to_spacing_and_member_order() {
    let tried = AtomicUsize::new(0);
    runner()
        .run(&json_value(), |value| {
            tried.fetch_add(1, Ordering::Relaxed);
            let compact = canonicalize(&value.to_string()).expect("a value serde wrote");
            prop_assert_eq!(&canonicalize(&compact).unwrap(), &compact);
            prop_assert_eq!(&canonicalize(&rewritten(&value)).unwrap(), &compact);
            // It is still JSON, read back as the same canonical document.
            let back: Value = serde_json::from_str(&compact).unwrap();
            prop_assert_eq!(&canonicalize(&back.to_string()).unwrap(), &compact);
            Ok(())
        })
        .unwrap();
    record("canonical-form", tried.into_inner());
}

#[test]
fn equal_intents_have_equal_fingerprints_and_different_ones_differ() {
    let tried = AtomicUsize::new(0);
    let intents = (
        json_value(),
        json_value(),
        "[a-z]{1,8}",
        proptest::option::of("[a-z]{1,8}"),
    );
    runner()
        .run(&intents, |(input, params, task, provider)| {
            tried.fetch_add(1, Ordering::Relaxed);
            let of = |input: &str, params: &str, task: &str| {
                Fingerprint::of(&JobIntent {
                    task,
                    input,
                    params,
                    provider: provider.as_deref(),
                })
                .unwrap()
            };
            let sent = of(&input.to_string(), &params.to_string(), &task);
            let respaced = of(&rewritten(&input), &rewritten(&params), &task);
            prop_assert_eq!(&sent, &respaced);
            let other_task = format!("{task}x");
            prop_assert_ne!(
                &sent,
                &of(&input.to_string(), &params.to_string(), &other_task)
            );
            let wrapped = Value::Array(vec![input.clone()]).to_string();
            prop_assert_ne!(&sent, &of(&wrapped, &params.to_string(), &task));
            Ok(())
        })
        .unwrap();
    record("fingerprint", tried.into_inner());
}

/// Arbitrary text, and text made of JSON's own characters (brackets,
/// quotes, escapes, digits) so that many inputs get deep into the parser.
fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        prop::collection::vec(
            prop::sample::select(vec![
                "[", "]", "{", "}", "\"", "\\", "\\u", "d800", ":", ",", "-", "0", "1e", "400",
                ".", "e-", "true", "nul", " ", "\u{0}", "é", "\u{202e}",
            ]),
            0..400
        )
        .prop_map(|parts| parts.concat()),
        (1usize..5_000).prop_map(|depth| "[".repeat(depth)),
    ]
}

#[test]
fn the_canonicaliser_and_the_fingerprint_never_panic_on_any_text() {
    let tried = AtomicUsize::new(0);
    runner()
        .run(&hostile_text(), |text| {
            tried.fetch_add(1, Ordering::Relaxed);
            let canonical = canonicalize(&text);
            // Whatever it accepts is valid JSON in canonical form.
            if let Ok(canonical) = &canonical {
                prop_assert!(serde_json::from_str::<Value>(canonical).is_ok());
                prop_assert_eq!(&canonicalize(canonical).unwrap(), canonical);
            }
            let fingerprint = Fingerprint::of(&JobIntent {
                task: "t",
                input: &text,
                params: "{}",
                provider: None,
            });
            prop_assert_eq!(fingerprint.is_ok(), canonical.is_ok());
            Ok(())
        })
        .unwrap();
    record("canonicaliser-hostile-text", tried.into_inner());
}

#[test]
fn the_key_parser_never_panics_and_accepts_exactly_printable_keys() {
    let tried = AtomicUsize::new(0);
    let keys = prop_oneof![any::<String>(), "[ -~]{0,300}", "\"[ -~]{0,20}\"?"];
    runner()
        .run(&keys, |raw| {
            tried.fetch_add(1, Ordering::Relaxed);
            let parsed = IdempotencyKey::parse(&raw);
            if !raw.starts_with('"') {
                let printable = !raw.is_empty()
                    && raw.len() <= 255
                    && raw.bytes().all(|b| (0x20..=0x7e).contains(&b));
                prop_assert_eq!(parsed.is_ok(), printable, "{:?}", raw);
            }
            if let Ok(key) = &parsed {
                prop_assert!(!key.as_str().is_empty() && key.as_str().len() <= 255);
                // The quoted form of a plain key is the same key.
                if !raw.starts_with('"') {
                    let quoted = format!("\"{}\"", raw.replace('\\', "\\\\").replace('"', "\\\""));
                    if let Ok(again) = IdempotencyKey::parse(&quoted) {
                        prop_assert_eq!(again.as_str(), key.as_str());
                    }
                }
            }
            prop_assert!(IdempotencyKey::parse_bytes(raw.as_bytes()).is_ok() == parsed.is_ok());
            Ok(())
        })
        .unwrap();
    record("idempotency-key", tried.into_inner());
}
