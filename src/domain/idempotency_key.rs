//! The client's idempotency key (docs/design.md, "Idempotency"): 1–255 printable ASCII characters.
//! The RFC 8941 quoted-string form `"…"` is accepted and kept unquoted.

use std::fmt;

pub const MAX_KEY_LEN: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdempotencyKeyError {
    #[error("the idempotency key is missing")]
    Missing,
    #[error("the idempotency key is empty")]
    Empty,
    #[error("the idempotency key is {0} characters long; at most {MAX_KEY_LEN} are allowed")]
    TooLong(usize),
    #[error("the idempotency key may contain only printable ASCII characters (space to '~')")]
    NotPrintableAscii,
    #[error("the idempotency key is a malformed quoted string")]
    MalformedQuotedString,
    /// Several keys where one is the identity: a proxy that adds its own
    /// would split or merge jobs, so none of them is chosen.
    #[error("the request carries {0} idempotency keys; send exactly one")]
    Repeated(usize),
}

impl IdempotencyKey {
    /// Parses a key as sent by a client (header value or form field).
    pub fn parse(raw: &str) -> Result<Self, IdempotencyKeyError> {
        if !raw.bytes().all(is_printable_ascii) {
            return Err(IdempotencyKeyError::NotPrintableAscii);
        }
        let key = match raw.strip_prefix('"') {
            Some(rest) => unquote(rest)?,
            None => raw.to_owned(),
        };
        if key.is_empty() {
            return Err(IdempotencyKeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(IdempotencyKeyError::TooLong(key.len()));
        }
        Ok(Self(key))
    }

    /// Parses raw header bytes, which may not be text at all.
    pub fn parse_bytes(raw: &[u8]) -> Result<Self, IdempotencyKeyError> {
        let text = std::str::from_utf8(raw).map_err(|_| IdempotencyKeyError::NotPrintableAscii)?;
        Self::parse(text)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn is_printable_ascii(byte: u8) -> bool {
    (0x20..=0x7e).contains(&byte)
}

/// Undoes RFC 8941 §3.3.3 quoting: the body after the opening quote must end with
/// the closing quote, and only `\"` and `\\` are valid escapes.
fn unquote(after_open_quote: &str) -> Result<String, IdempotencyKeyError> {
    let mut out = String::with_capacity(after_open_quote.len());
    let mut chars = after_open_quote.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => return Err(IdempotencyKeyError::MalformedQuotedString),
            },
            '"' => {
                return if chars.next().is_none() {
                    Ok(out)
                } else {
                    Err(IdempotencyKeyError::MalformedQuotedString)
                };
            }
            other => out.push(other),
        }
    }
    Err(IdempotencyKeyError::MalformedQuotedString)
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_printable_keys_are_accepted_as_is() {
        assert_eq!(
            IdempotencyKey::parse("order-42 retry").unwrap().as_str(),
            "order-42 retry"
        );
        assert_eq!(IdempotencyKey::parse("~").unwrap().as_str(), "~");
    }

    #[test]
    fn quoted_string_form_is_stored_unquoted() {
        assert_eq!(IdempotencyKey::parse("\"abc\"").unwrap().as_str(), "abc");
        assert_eq!(
            IdempotencyKey::parse(r#""a\"b\\c""#).unwrap().as_str(),
            r#"a"b\c"#
        );
    }

    #[test]
    fn malformed_quoted_strings_are_refused() {
        for raw in ["\"abc", "\"a\"b\"", r#""a\nb""#] {
            assert_eq!(
                IdempotencyKey::parse(raw),
                Err(IdempotencyKeyError::MalformedQuotedString),
                "{raw}"
            );
        }
    }

    #[test]
    fn empty_keys_are_refused_quoted_or_not() {
        assert_eq!(IdempotencyKey::parse(""), Err(IdempotencyKeyError::Empty));
        assert_eq!(
            IdempotencyKey::parse("\"\""),
            Err(IdempotencyKeyError::Empty)
        );
    }

    #[test]
    fn the_length_limit_is_255() {
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        assert_eq!(
            IdempotencyKey::parse(&"k".repeat(256)),
            Err(IdempotencyKeyError::TooLong(256))
        );
    }

    #[test]
    fn non_ascii_and_control_characters_are_refused() {
        for raw in ["clé", "tab\there", "nul\0", "del\x7f"] {
            assert_eq!(
                IdempotencyKey::parse(raw),
                Err(IdempotencyKeyError::NotPrintableAscii),
                "{raw:?}"
            );
        }
        assert_eq!(
            IdempotencyKey::parse_bytes(&[0x6b, 0xff]),
            Err(IdempotencyKeyError::NotPrintableAscii)
        );
    }
}
