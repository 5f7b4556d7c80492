//! The fingerprint of a job's intent (docs/design.md, "Idempotency"):
//! SHA-256 over the RFC 8785 canonical form ([`super::jcs`]) of
//! `{"input", "params", "provider", "task"}`, computed from the exact text the
//! client sent. Key order, spacing and `1` vs `1.0` never make a false
//! conflict; two different numbers never make a false replay.

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::jcs::{canonicalize, write_string, CanonicalError};

/// What a client asked for: the fields that make two requests "the same".
/// `input` and `params` are JSON text as sent.
#[derive(Debug, Clone, PartialEq)]
pub struct JobIntent<'a> {
    pub task: &'a str,
    pub input: &'a str,
    pub params: &'a str,
    /// The provider the client named, or `None` for the task's default chain.
    pub provider: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(String);

/// The members of `params` under which a door of another wire format keeps
/// the client's body as sent (`/v1/messages`, `/v1/responses`): such a
/// job's input is derived from that body by the door's codec.
pub const DOOR_BODY_PARAMS: [&str; 2] = [MESSAGES_BODY, RESPONSES_BODY];
/// `/v1/messages`' member.
pub const MESSAGES_BODY: &str = "messages_request";
/// `/v1/responses`' member.
pub const RESPONSES_BODY: &str = "responses";

/// Whether a stored intent and a sent one are the same request made
/// through a door of another wire format: the same task, the same named
/// provider, and `params` holding one and the same body as sent under the
/// same door member. Their inputs are then derived from that body, and may
/// have been derived differently by an earlier release: a retry across an
/// upgrade is still a replay. The inputs are not compared.
pub fn same_door_request(stored: &JobIntent<'_>, sent: &JobIntent<'_>) -> bool {
    let door_member = |params: &str| -> Option<String> {
        let value: Value = serde_json::from_str(params).ok()?;
        let object = value.as_object()?;
        let (member, _) = object.iter().next().filter(|_| object.len() == 1)?;
        DOOR_BODY_PARAMS
            .contains(&member.as_str())
            .then(|| member.clone())
    };
    stored.task == sent.task
        && stored.provider == sent.provider
        && door_member(stored.params).is_some()
        && door_member(stored.params) == door_member(sent.params)
        && matches!(
            (canonicalize(stored.params), canonicalize(sent.params)),
            (Ok(a), Ok(b)) if a == b
        )
}

/// Which part of an intent could not be canonicalized, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {error}")]
pub struct IntentError {
    pub field: &'static str,
    pub error: CanonicalError,
}

impl Fingerprint {
    pub fn of(intent: &JobIntent<'_>) -> Result<Self, IntentError> {
        let input = canonicalize(intent.input).map_err(|error| IntentError {
            field: "input",
            error,
        })?;
        let params = canonicalize(intent.params).map_err(|error| IntentError {
            field: "params",
            error,
        })?;
        // Canonical parts, members in order: the document is canonical as
        // written, without a second pass over the input and the params.
        let mut document = String::with_capacity(input.len() + params.len() + 64);
        document.push_str(r#"{"input":"#);
        document.push_str(&input);
        document.push_str(r#","params":"#);
        document.push_str(&params);
        document.push_str(r#","provider":"#);
        match intent.provider {
            Some(provider) => write_string(provider, &mut document),
            None => document.push_str("null"),
        }
        document.push_str(r#","task":"#);
        write_string(intent.task, &mut document);
        document.push('}');
        debug_assert_eq!(canonicalize(&document).as_deref(), Ok(document.as_str()));
        Ok(Self(sha256_hex(document.as_bytes())))
    }

    /// Wraps a fingerprint read back from storage.
    pub fn from_stored(hex: String) -> Self {
        Self(hex)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Lowercase hex SHA-256 of some bytes (a bearer token's digest, a
/// payload's fingerprint: once or twice a request).
pub fn sha256_hex(bytes: &[u8]) -> String {
    let mut text = [0u8; 64];
    // `hex::encode` collects its text a `char` at a time; this writes bytes.
    hex::encode_to_slice(Sha256::digest(bytes), &mut text).expect("64 digits for 32 bytes");
    std::str::from_utf8(&text)
        .expect("hex digits are ASCII")
        .to_owned()
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

    #[test]
    fn a_fingerprint_is_the_hash_of_the_whole_intent_canonicalized() {
        let whole = |intent: &JobIntent<'_>| {
            let provider = intent
                .provider
                .map_or(Value::Null, |p| Value::String(p.to_owned()));
            let task = Value::String(intent.task.to_owned());
            let document = format!(
                r#"{{"input":{},"params":{},"provider":{provider},"task":{task}}}"#,
                intent.input, intent.params
            );
            sha256_hex(canonicalize(&document).unwrap().as_bytes())
        };
        let odd = "q\"uote \\ tab\t nl\n bell\u{7} del\u{7f} é 😀 </";
        for (task, provider, input, params) in [
            ("summarize", None, r#"{"text":"hi"}"#, "{}"),
            (
                "chat",
                Some("openai-east"),
                r#"{ "b": 1.0, "a": [1e2, -0.0] }"#,
                r#"{"t":0.50}"#,
            ),
            (
                odd,
                Some(odd),
                r#"{"\u00e9":"\ud83d\ude00","a\u0000":null}"#,
                "[]",
            ),
        ] {
            let intent = JobIntent {
                task,
                input,
                params,
                provider,
            };
            assert_eq!(Fingerprint::of(&intent).unwrap().as_str(), whole(&intent));
        }
    }

    #[test]
    fn the_same_body_through_a_door_is_the_same_request_however_its_input_was_derived() {
        let intent = |input, params| JobIntent {
            task: "chat",
            input,
            params,
            provider: None,
        };
        let body = r#"{"messages_request":{"model":"chat","max_tokens":8,"messages":[]}}"#;
        let spaced =
            r#"{ "messages_request": {"max_tokens": 8.0, "model": "chat", "messages": []} }"#;
        assert!(same_door_request(
            &intent(
                r#"{"messages":[{"role":"user","content":"old form"}]}"#,
                body
            ),
            &intent(
                r#"{"messages":[{"role":"user","content":[{"type":"text","text":"new form"}]}]}"#,
                spaced
            ),
        ));
        let other = r#"{"messages_request":{"model":"chat","max_tokens":9,"messages":[]}}"#;
        assert!(!same_door_request(
            &intent("{}", body),
            &intent("{}", other)
        ));
        // Params a client wrote itself, or none, are not a door's body.
        assert!(!same_door_request(&intent("{}", "{}"), &intent("{}", "{}")));
        let own = r#"{"messages_request":{},"mine":1}"#;
        assert!(!same_door_request(&intent("{}", own), &intent("{}", own)));
        let wrong_task = JobIntent {
            task: "other",
            ..intent("{}", body)
        };
        assert!(!same_door_request(&intent("{}", body), &wrong_task));
    }

    fn fp(task: &str, input: &str, params: &str, provider: Option<&str>) -> Fingerprint {
        Fingerprint::of(&JobIntent {
            task,
            input,
            params,
            provider,
        })
        .unwrap()
    }

    #[test]
    fn key_order_white_space_and_number_spelling_do_not_change_the_fingerprint() {
        let a = r#"{"text":"hi","opts":{"b":1,"a":[1,2]}}"#;
        let b = "{ \"opts\" : { \"a\" : [ 1.0 , 2e0 ] , \"b\" : 1 } ,\n \"text\":\"hi\" }";
        assert_eq!(
            fp("summarize", a, "{}", None),
            fp("summarize", b, "{}", None)
        );
    }

    #[test]
    fn every_intent_field_changes_the_fingerprint() {
        let base = fp("summarize", r#"{"text":"hi"}"#, "{}", None);
        assert_ne!(base, fp("translate", r#"{"text":"hi"}"#, "{}", None));
        assert_ne!(base, fp("summarize", r#"{"text":"ho"}"#, "{}", None));
        assert_ne!(
            base,
            fp("summarize", r#"{"text":"hi"}"#, r#"{"t":0}"#, None)
        );
        assert_ne!(
            base,
            fp("summarize", r#"{"text":"hi"}"#, "{}", Some("sim-fast"))
        );
    }

    #[test]
    fn different_numbers_and_normalisation_forms_are_different_intents() {
        assert_ne!(
            fp("t", r#"{"n":0.1}"#, "{}", None),
            fp("t", r#"{"n":0.10000000000000002}"#, "{}", None)
        );
        assert_ne!(
            fp("t", "{\"s\":\"\u{e9}\"}", "{}", None),
            fp("t", "{\"s\":\"e\u{301}\"}", "{}", None)
        );
    }

    #[test]
    fn a_number_no_double_holds_is_refused_naming_the_field() {
        let error = Fingerprint::of(&JobIntent {
            task: "t",
            input: r#"{"seed":123456789012345678901}"#,
            params: "{}",
            provider: None,
        })
        .unwrap_err();
        assert_eq!(error.field, "input");
        assert!(matches!(error.error, CanonicalError::InexactNumber(_)));
    }

    #[test]
    fn array_order_is_significant() {
        assert_ne!(
            fp("t", r#"{"xs":[1,2]}"#, "{}", None),
            fp("t", r#"{"xs":[2,1]}"#, "{}", None)
        );
    }

    #[test]
    fn canonical_json_sorts_nested_keys_and_escapes_strings() {
        use serde_json::json;
        assert_eq!(
            canonical_json(&json!({"b": {"d": 1, "c": "\"x\""}, "a": null})),
            r#"{"a":null,"b":{"c":"\"x\"","d":1}}"#
        );
    }

    #[test]
    fn canonical_json_separates_array_items_with_one_comma_each() {
        use serde_json::json;
        assert_eq!(
            canonical_json(&json!({"b": [1, 2, 3], "a": [[], [true, null], ["x"]]})),
            r#"{"a":[[],[true,null],["x"]],"b":[1,2,3]}"#
        );
    }

    #[test]
    fn fingerprint_is_lowercase_hex_sha256() {
        let f = fp("t", "{}", "{}", None);
        assert_eq!(f.as_str().len(), 64);
        assert!(f
            .as_str()
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }
}
