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

    /// The compact text of a value.
    pub fn from_value(value: &Value) -> Self {
        Self(value.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
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

#[cfg(test)]
mod tests {
    use super::*;

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
