//! The canonical fingerprint of a job's intent (docs/design.md, "Idempotency"): SHA-256 over the
//! sorted-key, whitespace-free JSON of task, input, params and target provider, so
//! that key order or spacing in a request never makes a false conflict.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// What a client asked for: the fields that make two requests "the same".
#[derive(Debug, Clone, PartialEq)]
pub struct JobIntent<'a> {
    pub task: &'a str,
    pub input: &'a Value,
    pub params: &'a Value,
    /// The provider the client named, or `None` for the task's default chain.
    pub provider: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(String);

impl Fingerprint {
    pub fn of(intent: &JobIntent<'_>) -> Self {
        let provider = intent
            .provider
            .map_or(Value::Null, |p| Value::String(p.to_owned()));
        let mut canonical = String::new();
        canonical.push_str("{\"input\":");
        write_canonical(intent.input, &mut canonical);
        canonical.push_str(",\"params\":");
        write_canonical(intent.params, &mut canonical);
        canonical.push_str(",\"provider\":");
        write_canonical(&provider, &mut canonical);
        canonical.push_str(",\"task\":");
        write_canonical(&Value::String(intent.task.to_owned()), &mut canonical);
        canonical.push('}');
        Self(sha256_hex(canonical.as_bytes()))
    }

    /// Wraps a fingerprint read back from storage.
    pub fn from_stored(hex: String) -> Self {
        Self(hex)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Lowercase hex SHA-256 of some bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The canonical text of a JSON value: object keys sorted, no whitespace.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fp(task: &str, input: Value, params: Value, provider: Option<&str>) -> Fingerprint {
        Fingerprint::of(&JobIntent {
            task,
            input: &input,
            params: &params,
            provider,
        })
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_the_fingerprint() {
        let a: Value = serde_json::from_str(r#"{"text":"hi","opts":{"b":1,"a":[1,2]}}"#).unwrap();
        let b: Value = serde_json::from_str(
            "{ \"opts\" : { \"a\" : [ 1 , 2 ] , \"b\" : 1 } ,\n \"text\":\"hi\" }",
        )
        .unwrap();
        assert_eq!(
            fp("summarize", a, json!({}), None),
            fp("summarize", b, json!({}), None)
        );
    }

    #[test]
    fn every_intent_field_changes_the_fingerprint() {
        let base = fp("summarize", json!({"text": "hi"}), json!({}), None);
        assert_ne!(
            base,
            fp("translate", json!({"text": "hi"}), json!({}), None)
        );
        assert_ne!(
            base,
            fp("summarize", json!({"text": "ho"}), json!({}), None)
        );
        assert_ne!(
            base,
            fp("summarize", json!({"text": "hi"}), json!({"t": 0}), None)
        );
        assert_ne!(
            base,
            fp(
                "summarize",
                json!({"text": "hi"}),
                json!({}),
                Some("sim-fast")
            )
        );
    }

    #[test]
    fn array_order_is_significant() {
        assert_ne!(
            fp("t", json!({"xs": [1, 2]}), json!({}), None),
            fp("t", json!({"xs": [2, 1]}), json!({}), None)
        );
    }

    #[test]
    fn canonical_json_sorts_nested_keys_and_escapes_strings() {
        assert_eq!(
            canonical_json(&json!({"b": {"d": 1, "c": "\"x\""}, "a": null})),
            r#"{"a":null,"b":{"c":"\"x\"","d":1}}"#
        );
    }

    #[test]
    fn fingerprint_is_lowercase_hex_sha256() {
        let f = fp("t", json!({}), json!({}), None);
        assert_eq!(f.as_str().len(), 64);
        assert!(f
            .as_str()
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }
}
