//! A JSON document kept as the text it arrived as: stored verbatim and sent
//! back verbatim, so that nothing (not a digit of a large number) is lost on
//! the way through.

use std::fmt;

use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

#[derive(Clone, PartialEq, Eq, diesel::AsExpression, diesel::FromSqlRow)]
#[diesel(sql_type = diesel::sql_types::Text)]
pub struct JsonText(String);

impl JsonText {
    /// Checks that `text` is one well-formed JSON document and keeps it as is.
    pub fn parse(text: impl Into<String>) -> Result<Self, serde_json::Error> {
        let text = text.into();
        serde_json::from_str::<&RawValue>(&text)?;
        Ok(Self(text))
    }

    /// [`parse`](Self::parse), refusing an object that names a member twice
    /// (a reader that keeps the first and one that keeps the last would see
    /// two different requests): for what clients send. One pass.
    pub fn parse_unique(text: impl Into<String>) -> Result<Self, NotUnique> {
        let text = text.into();
        check_unique_names(text.as_bytes())?;
        Ok(Self(text))
    }

    /// The compact text of a value.
    pub fn from_value(value: &Value) -> Self {
        Self(value.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the document is an object, read from its first character
    /// (it is one well-formed document): nothing is parsed.
    pub fn is_object(&self) -> bool {
        self.0
            .trim_start_matches([' ', '\t', '\n', '\r'])
            .starts_with('{')
    }

    /// An empty object, `{}`.
    pub fn empty_object() -> Self {
        Self("{}".to_owned())
    }

    /// The document as a `serde_json::Value` (for templates and checks).
    pub fn value(&self) -> Value {
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }
}

impl fmt::Debug for JsonText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JsonText({})", self.0)
    }
}

impl fmt::Display for JsonText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for JsonText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let raw: &RawValue =
            serde_json::from_str(&self.0).map_err(<S::Error as serde::ser::Error>::custom)?;
        raw.serialize(serializer)
    }
}

/// Why a client's JSON text was refused by [`check_unique_names`].
#[derive(Debug, thiserror::Error)]
pub enum NotUnique {
    #[error("the member name {0:?} appears twice in one object")]
    Duplicate(String),
    #[error("{0}")]
    Malformed(serde_json::Error),
}

impl From<serde_json::Error> for NotUnique {
    fn from(error: serde_json::Error) -> Self {
        Self::Malformed(error)
    }
}

/// Checks that `text` is one well-formed JSON document in which no object
/// names a member twice. Values are walked, never kept; serde_json's own
/// recursion limit bounds the walk.
pub fn check_unique_names(text: &[u8]) -> Result<(), NotUnique> {
    /// Marks the error a duplicate raised, to tell it from a malformed text.
    const DUPLICATE: &str = "onejob: duplicate member name: ";

    struct Unique;

    impl<'de> serde::Deserialize<'de> for Unique {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_any(Unique)
        }
    }

    impl<'de> serde::de::Visitor<'de> for Unique {
        type Value = Unique;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
            let mut names = std::collections::HashSet::new();
            while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if !names.insert(name.clone()) {
                    return Err(serde::de::Error::custom(format!("{DUPLICATE}{name}")));
                }
                map.next_value::<Unique>()?;
            }
            Ok(Unique)
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
            while seq.next_element::<Unique>()?.is_some() {}
            Ok(Unique)
        }

        fn visit_bool<E>(self, _: bool) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_str<E>(self, _: &str) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_unit<E>(self) -> Result<Unique, E> {
            Ok(Unique)
        }
    }

    match serde_json::from_slice::<Unique>(text) {
        Ok(Unique) => Ok(()),
        Err(error) => {
            let said = error.to_string();
            match said.strip_prefix(DUPLICATE) {
                Some(rest) => {
                    // serde_json appends " at line L column C".
                    let name = rest.rsplit_once(" at line ").map_or(rest, |(name, _)| name);
                    Err(NotUnique::Duplicate(name.to_owned()))
                }
                None => Err(NotUnique::Malformed(error)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_is_told_from_its_first_character_as_a_parse_would_tell_it() {
        for text in [
            "{}",
            " \n\t\r{\"a\": [1]}",
            "[{}]",
            "\"{\"",
            "null",
            "12",
            " [ ] ",
        ] {
            let parsed = JsonText::parse(text).expect("well-formed");
            assert_eq!(parsed.is_object(), parsed.value().is_object(), "{text:?}");
        }
        assert!(JsonText::empty_object().is_object());
        assert_eq!(JsonText::empty_object(), JsonText::parse("{}").unwrap());
    }

    #[test]
    fn a_name_given_twice_in_any_object_is_refused() {
        assert!(check_unique_names(br#"{"a": 1, "b": [{"a": 2}, {"a": 3}]}"#).is_ok());
        for (text, name) in [
            (r#"{"store": false, "store": true}"#, "store"),
            (r#"{"a": {"x": 1, "x": 1}}"#, "x"),
            (r#"[1, {"k": [], "k": null}]"#, "k"),
            (r#"{"a\u0062": 1, "ab": 2}"#, "ab"),
            (
                r#"{"a b at line 1": 1, "a b at line 1": 2}"#,
                "a b at line 1",
            ),
        ] {
            match check_unique_names(text.as_bytes()) {
                Err(NotUnique::Duplicate(found)) => assert_eq!(found, name, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(matches!(
            check_unique_names(b"{\"a\": }"),
            Err(NotUnique::Malformed(_))
        ));
        assert!(matches!(
            JsonText::parse_unique(r#"{"n": 1, "n": 2}"#),
            Err(NotUnique::Duplicate(_))
        ));
    }

    #[test]
    fn the_text_is_kept_and_sent_back_verbatim() {
        let text = r#"{"seed":123456789012345678901,"b":1.0}"#;
        let json = JsonText::parse(text).unwrap();
        assert_eq!(json.as_str(), text);
        assert_eq!(serde_json::to_string(&json).unwrap(), text);
    }

    #[test]
    fn anything_but_one_json_document_is_refused() {
        assert!(JsonText::parse("{").is_err());
        assert!(JsonText::parse("1 2").is_err());
    }
}
