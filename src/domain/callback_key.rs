//! Signatures of late results sent by callback, for providers that answer
//! asynchronously. Each attempt has its own secret, derived from the server's
//! callback key (resolved from the environment once, at start; never stored):
//! HMAC-SHA256(key, attempt id). The provider signs the callback's timestamp
//! and body with it, as `<Unix seconds>.<body>`; the timestamp travels as
//! `X-Onejob-Timestamp`, the signature as `X-Onejob-Signature: sha256=<hex>`.
//! A callback signed longer ago than the window is refused, so a captured
//! one cannot be replayed later.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::{Secret, Timestamp};

type HmacSha256 = Hmac<Sha256>;

/// The server's callback key. `Debug` never shows it.
#[derive(Clone)]
pub struct CallbackKey(Vec<u8>);

impl std::fmt::Debug for CallbackKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallbackKey(***)")
    }
}

fn hmac_hex(key: &[u8], message: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(message);
    hex::encode(mac.finalize().into_bytes())
}

impl CallbackKey {
    pub fn new(secret: &Secret) -> Self {
        Self(secret.expose().as_bytes().to_vec())
    }

    /// The secret one attempt's callbacks are signed with.
    pub fn attempt_secret(&self, attempt_id: &str) -> Secret {
        Secret::new(hmac_hex(
            &self.0,
            format!("onejob-attempt:{attempt_id}").as_bytes(),
        ))
    }

    /// The signature header value a provider sends for `body` at
    /// `timestamp` (Unix seconds).
    pub fn sign(&self, attempt_id: &str, timestamp: i64, body: &[u8]) -> String {
        format!(
            "sha256={}",
            hmac_hex(
                self.attempt_secret(attempt_id).expose().as_bytes(),
                &signed_message(timestamp, body)
            )
        )
    }

    /// Checks a callback: `X-Onejob-Signature` over `X-Onejob-Timestamp`
    /// and the body (in constant time), then the timestamp's age against
    /// `now`: at most `window_seconds` old, and no more than
    /// that ahead (clocks differ).
    pub fn verify(
        &self,
        attempt_id: &str,
        timestamp: Option<&str>,
        body: &[u8],
        signature: Option<&str>,
        now: Timestamp,
        window_seconds: u64,
    ) -> Result<(), CallbackRefusal> {
        let timestamp = timestamp
            .and_then(|t| t.trim().parse::<i64>().ok())
            .ok_or(CallbackRefusal::BadSignature)?;
        let hex_sig = signature
            .and_then(|s| s.trim().strip_prefix("sha256="))
            .ok_or(CallbackRefusal::BadSignature)?;
        let bytes = hex::decode(hex_sig).map_err(|_| CallbackRefusal::BadSignature)?;
        let mut mac =
            HmacSha256::new_from_slice(self.attempt_secret(attempt_id).expose().as_bytes())
                .expect("HMAC takes keys of any length");
        mac.update(&signed_message(timestamp, body));
        mac.verify_slice(&bytes)
            .map_err(|_| CallbackRefusal::BadSignature)?;
        let age = now.unix_seconds().saturating_sub(timestamp);
        let window = window_seconds.min(i64::MAX as u64) as i64;
        if age > window || age < -window {
            return Err(CallbackRefusal::Expired {
                age_seconds: age,
                window_seconds,
            });
        }
        Ok(())
    }
}

/// What a signature covers: the timestamp, a dot, the body.
fn signed_message(timestamp: i64, body: &[u8]) -> Vec<u8> {
    let mut message = format!("{timestamp}.").into_bytes();
    message.extend_from_slice(body);
    message
}

/// Why a callback was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallbackRefusal {
    /// No timestamp, no signature, or one that does not match this
    /// attempt, timestamp and body.
    BadSignature,
    /// Signed correctly, but too long ago (or too far ahead): `age_seconds`
    /// is negative for a timestamp in the future.
    Expired {
        age_seconds: i64,
        window_seconds: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_790_000_000;
    const NOW_AT: Timestamp = Timestamp::from_millis(NOW * 1000);

    #[test]
    fn a_signature_verifies_only_for_its_attempt_timestamp_and_body() {
        let key = CallbackKey::new(&Secret::new("server secret"));
        let body = b"{\"result\":{}}";
        let signature = key.sign("attempt-1", NOW, body);
        let at = NOW.to_string();
        let verify =
            |key: &CallbackKey, attempt: &str, at: &str, body: &[u8], sig: Option<&str>| {
                key.verify(attempt, Some(at), body, sig, NOW_AT, 300)
            };
        assert_eq!(
            verify(&key, "attempt-1", &at, body, Some(&signature)),
            Ok(())
        );
        let bad = Err(CallbackRefusal::BadSignature);
        assert_eq!(
            verify(&key, "attempt-2", &at, body, Some(&signature)),
            bad,
            "another attempt"
        );
        assert_eq!(
            verify(
                &key,
                "attempt-1",
                &at,
                b"{\"result\":{\"x\":1}}",
                Some(&signature)
            ),
            bad,
            "another body"
        );
        assert_eq!(
            verify(
                &key,
                "attempt-1",
                &(NOW - 1).to_string(),
                body,
                Some(&signature)
            ),
            bad,
            "another timestamp"
        );
        assert_eq!(
            verify(
                &CallbackKey::new(&Secret::new("other")),
                "attempt-1",
                &at,
                body,
                Some(&signature)
            ),
            bad,
            "another key"
        );
        assert_eq!(verify(&key, "attempt-1", &at, b"{}", None), bad);
        assert_eq!(
            verify(&key, "attempt-1", &at, b"{}", Some("sha256=zz")),
            bad
        );
        assert_eq!(
            key.verify("attempt-1", None, body, Some(&signature), NOW_AT, 300),
            bad,
            "no timestamp"
        );
    }

    #[test]
    fn a_callback_signed_outside_the_window_is_expired() {
        let key = CallbackKey::new(&Secret::new("server secret"));
        let body = b"{}";
        let old = NOW - 301;
        let signature = key.sign("a", old, body);
        assert_eq!(
            key.verify(
                "a",
                Some(&old.to_string()),
                body,
                Some(&signature),
                NOW_AT,
                300
            ),
            Err(CallbackRefusal::Expired {
                age_seconds: 301,
                window_seconds: 300
            })
        );
        let edge = NOW - 300;
        let signature = key.sign("a", edge, body);
        assert_eq!(
            key.verify(
                "a",
                Some(&edge.to_string()),
                body,
                Some(&signature),
                NOW_AT,
                300
            ),
            Ok(())
        );
        let ahead = NOW + 400;
        let signature = key.sign("a", ahead, body);
        assert!(key
            .verify(
                "a",
                Some(&ahead.to_string()),
                body,
                Some(&signature),
                NOW_AT,
                300
            )
            .is_err());
    }

    #[test]
    fn attempt_secrets_differ_per_attempt_and_hide_the_key() {
        let key = CallbackKey::new(&Secret::new("server secret"));
        assert_ne!(key.attempt_secret("a"), key.attempt_secret("b"));
        assert!(!key.attempt_secret("a").expose().contains("server secret"));
        assert_eq!(format!("{key:?}"), "CallbackKey(***)");
    }
}
