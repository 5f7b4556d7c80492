//! Signatures of late results sent by callback, for providers that answer
//! asynchronously. Each attempt has its own secret, derived from the server's
//! callback key (resolved from the environment once, at start; never stored):
//! HMAC-SHA256(key, attempt id). The provider signs the callback's body with
//! it; the signature travels as `X-Onejob-Signature: sha256=<hex>`.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::Secret;

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

    /// The signature header value a provider sends for `body`.
    pub fn sign(&self, attempt_id: &str, body: &[u8]) -> String {
        format!(
            "sha256={}",
            hmac_hex(self.attempt_secret(attempt_id).expose().as_bytes(), body)
        )
    }

    /// Checks `X-Onejob-Signature` in constant time.
    pub fn verify(&self, attempt_id: &str, body: &[u8], signature: Option<&str>) -> bool {
        let Some(hex_sig) = signature.and_then(|s| s.trim().strip_prefix("sha256=")) else {
            return false;
        };
        let Ok(bytes) = hex::decode(hex_sig) else {
            return false;
        };
        let mut mac =
            HmacSha256::new_from_slice(self.attempt_secret(attempt_id).expose().as_bytes())
                .expect("HMAC takes keys of any length");
        mac.update(body);
        mac.verify_slice(&bytes).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_for_its_attempt_and_body() {
        let key = CallbackKey::new(&Secret::new("server secret"));
        let signature = key.sign("attempt-1", b"{\"result\":{}}");
        assert!(key.verify("attempt-1", b"{\"result\":{}}", Some(&signature)));
        assert!(
            !key.verify("attempt-2", b"{\"result\":{}}", Some(&signature)),
            "another attempt"
        );
        assert!(
            !key.verify("attempt-1", b"{\"result\":{\"x\":1}}", Some(&signature)),
            "another body"
        );
        assert!(
            !CallbackKey::new(&Secret::new("other")).verify(
                "attempt-1",
                b"{\"result\":{}}",
                Some(&signature)
            ),
            "another key"
        );
        assert!(!key.verify("attempt-1", b"{}", None));
        assert!(!key.verify("attempt-1", b"{}", Some("sha256=zz")));
    }

    #[test]
    fn attempt_secrets_differ_per_attempt_and_hide_the_key() {
        let key = CallbackKey::new(&Secret::new("server secret"));
        assert_ne!(key.attempt_secret("a"), key.attempt_secret("b"));
        assert!(!key.attempt_secret("a").expose().contains("server secret"));
        assert_eq!(format!("{key:?}"), "CallbackKey(***)");
    }
}
