//! Passwords (argon2id, deliberately expensive: callers run these off the
//! async workers and behind a concurrency limit), and the sign-in name.

use std::sync::OnceLock;

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

/// A user name: 1–64 ASCII letters, digits, `-`, `_` or `.`. Checked before
/// any database or hashing work, so a sign-in with a 64 KiB "name" costs
/// nothing and stores nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserName(String);

impl UserName {
    pub fn parse(raw: &str) -> Option<Self> {
        let name = raw.trim();
        let valid = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        valid.then(|| Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as uniqueness compares it: `admin` and `Admin` are one
    /// name. For the ASCII a name is made of, Unicode's compatibility case
    /// folding (NFKC_Casefold) is exactly ASCII lower case; characters
    /// whose compatibility forms are ASCII (fullwidth `ａｄｍｉｎ`, say) are
    /// refused by [`UserName::parse`], so no look-alike gets in that way.
    pub fn folded(&self) -> String {
        self.0.to_ascii_lowercase()
    }
}

/// A readable random password: 20 characters from an unambiguous alphabet.
pub fn generate_password() -> String {
    const ALPHABET: &[u8] = b"abcdefghjkmnpqrstuvwxyzABCDEFGHJKMNPQRSTUVWXYZ23456789";
    let mut bytes = [0u8; 20];
    getrandom::fill(&mut bytes).expect("the operating system's random source is available");
    bytes
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

/// The argon2id hash of a password (CPU-heavy).
pub fn hash_password(password: &str) -> String {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2id hashing with default parameters")
        .to_string()
}

/// Whether `password` matches `stored` (CPU-heavy). With no stored hash
/// (an unknown name, or a user without a password) the same work is done
/// against a dummy hash, so timing does not tell names apart.
pub fn verify_password(password: &str, stored: Option<&str>) -> bool {
    static DUMMY: OnceLock<String> = OnceLock::new();
    let (hash, real) = match stored {
        Some(hash) => (hash, true),
        None => (
            DUMMY
                .get_or_init(|| hash_password("not a password"))
                .as_str(),
            false,
        ),
    };
    let matches = PasswordHash::new(hash)
        .map(|hash| {
            Argon2::default()
                .verify_password(password.as_bytes(), &hash)
                .is_ok()
        })
        .unwrap_or(false);
    real && matches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_hash_with_argon2id_and_verify() {
        let hash = hash_password("correct horse");
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password("correct horse", Some(&hash)));
        assert!(!verify_password("wrong horse", Some(&hash)));
        assert!(!verify_password("anything", Some("not a hash")));
        assert!(
            !verify_password("not a password", None),
            "the dummy opens nothing"
        );
    }

    #[test]
    fn generated_passwords_are_long_and_differ() {
        let a = generate_password();
        assert_eq!(a.len(), 20);
        assert_ne!(a, generate_password());
    }

    #[test]
    fn names_are_short_plain_ascii() {
        assert_eq!(UserName::parse(" ada ").unwrap().as_str(), "ada");
        for bad in ["", "a b", "ä", "x".repeat(65).as_str(), "a\u{0}"] {
            assert!(UserName::parse(bad).is_none(), "{bad:?}");
        }
        assert!(UserName::parse(&"x".repeat(64)).is_some());
    }
}
