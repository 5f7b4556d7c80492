//! What every codec's serde types share: reading a client's JSON into them
//! with the path of whatever is wrong ([`decode`]), a member that is a text
//! or a list ([`TextOr`]), and a whole number however it is written
//! ([`WholeNumber`]).

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeOwned, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

/// A request refused where it is read: what is wrong, and the member it is
/// about (as the format writes paths: `messages[0].content` for OpenAI's,
/// `messages.0.content` for Anthropic's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub param: String,
    pub message: String,
}

impl Refused {
    pub fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            param: param.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// How a format writes the path to a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathStyle {
    /// `messages[0].content`
    Brackets,
    /// `messages.0.content`
    Dots,
}

impl PathStyle {
    /// `base` and then `member` (a name or an index).
    pub fn join(self, base: &str, member: impl fmt::Display) -> String {
        let member = member.to_string();
        let index = member.bytes().all(|b| b.is_ascii_digit()) && !member.is_empty();
        match (self, base.is_empty(), index) {
            (_, true, _) => member,
            (Self::Brackets, false, true) => format!("{base}[{member}]"),
            _ => format!("{base}.{member}"),
        }
    }
}

/// Reads `value` as `T`; what does not fit is refused with its path, in
/// `style`, under `base` (the path of `value` itself, empty at the top).
pub fn decode<T: DeserializeOwned>(
    value: &Value,
    style: PathStyle,
    base: &str,
) -> Result<T, Refused> {
    // Read plainly first: the path is tracked only to word a refusal.
    if let Ok(read) = T::deserialize(value) {
        return Ok(read);
    }
    serde_path_to_error::deserialize::<_, T>(value).map_err(|error| {
        let mut param = base.to_owned();
        for segment in error.path() {
            param = match segment {
                serde_path_to_error::Segment::Seq { index } => style.join(&param, index),
                serde_path_to_error::Segment::Map { key } => style.join(&param, key),
                serde_path_to_error::Segment::Enum { .. }
                | serde_path_to_error::Segment::Unknown => param,
            };
        }
        let at = if param.is_empty() { "body" } else { &param };
        Refused {
            message: format!("{at}: {}", error.inner()),
            param: at.to_owned(),
        }
    })
}

/// A member that is one text or a list of items (a message's content, a
/// stop sequence or a list of them), kept as the client wrote it.
#[derive(Debug, Clone, PartialEq)]
pub enum TextOr<T> {
    Text(String),
    Items(Vec<T>),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for TextOr<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextOrVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for TextOrVisitor<T> {
            type Value = TextOr<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                Ok(TextOr::Text(text.to_owned()))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<Self::Value, E> {
                Ok(TextOr::Text(text))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                // Through the seq itself, so that an item's path is kept.
                Vec::<T>::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(TextOr::Items)
            }
        }

        deserializer.deserialize_any(TextOrVisitor(PhantomData))
    }
}

impl<T: Serialize> Serialize for TextOr<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Text(text) => serializer.serialize_str(text),
            Self::Items(items) => items.serialize(serializer),
        }
    }
}

/// A whole number, 0 or more, written as an integer or not (`64` and
/// `64.0` are one number, as in the fingerprint); anything else is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WholeNumber(pub u64);

/// The largest whole number every JSON reader holds exactly (2^53 - 1).
const MAX_EXACT: f64 = 9_007_199_254_740_991.0;

impl WholeNumber {
    /// `value` as a whole number, if it is one.
    pub fn of(value: &Value) -> Option<u64> {
        value
            .as_u64()
            .filter(|n| *n as f64 <= MAX_EXACT)
            .or_else(|| {
                value
                    .as_f64()
                    .filter(|f| f.fract() == 0.0 && (0.0..=MAX_EXACT).contains(f))
                    .map(|f| f as u64)
            })
    }
}

impl<'de> Deserialize<'de> for WholeNumber {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let number = serde_json::Number::deserialize(deserializer)?;
        Self::of(&Value::Number(number.clone()))
            .map(WholeNumber)
            .ok_or_else(|| de::Error::custom(format!("expected a whole number, not {number}")))
    }
}

impl Serialize for WholeNumber {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

/// A whole number, negative or not, written as an integer or not (`7` and
/// `7.0` are one number, as JSON Schema's `integer` says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WholeInteger(pub i64);

impl WholeInteger {
    /// `value` as a whole number, if it is one every JSON reader holds
    /// exactly.
    pub fn of(value: &Value) -> Option<i64> {
        value
            .as_i64()
            .filter(|n| (*n as f64).abs() <= MAX_EXACT)
            .or_else(|| {
                value
                    .as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() <= MAX_EXACT)
                    .map(|f| f as i64)
            })
    }
}

impl<'de> Deserialize<'de> for WholeInteger {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let number = serde_json::Number::deserialize(deserializer)?;
        Self::of(&Value::Number(number.clone()))
            .map(WholeInteger)
            .ok_or_else(|| de::Error::custom(format!("expected a whole number, not {number}")))
    }
}

impl Serialize for WholeInteger {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_i64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct Probe {
        #[allow(dead_code)]
        content: TextOr<Item>,
    }

    #[derive(Debug, Deserialize)]
    struct Item {
        #[allow(dead_code)]
        text: String,
    }

    #[test]
    fn a_refusal_names_the_member_in_the_formats_own_path_style() {
        let value = json!({"content": [{"text": "a"}, {"text": 5}]});
        let refused = decode::<Probe>(&value, PathStyle::Brackets, "messages[2]").unwrap_err();
        assert_eq!(refused.param, "messages[2].content[1].text");
        let refused = decode::<Probe>(&value, PathStyle::Dots, "").unwrap_err();
        assert_eq!(refused.param, "content.1.text");
        assert!(
            refused.message.starts_with("content.1.text: invalid type"),
            "{}",
            refused.message
        );
        assert!(decode::<Probe>(&json!({"content": "hi"}), PathStyle::Dots, "").is_ok());
        let refused = decode::<Probe>(&json!({"content": 7}), PathStyle::Dots, "").unwrap_err();
        assert_eq!(refused.param, "content");
    }

    #[test]
    fn whole_numbers_are_whole_however_written() {
        let read = |v: Value| serde_json::from_value::<WholeNumber>(v).map(|n| n.0).ok();
        assert_eq!(read(json!(64)), Some(64));
        assert_eq!(read(json!(64.0)), Some(64));
        assert_eq!(read(json!(64.5)), None);
        assert_eq!(read(json!(-1)), None);
        assert_eq!(read(json!("64")), None);
        assert_eq!(read(json!(9_007_199_254_740_993_u64)), None, "past 2^53");
    }
}
