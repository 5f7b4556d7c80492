//! Typed identifiers. All ids are UUIDv7 (time-ordered) and travel as
//! lowercase hyphenated text, which is also how they are stored (a TEXT
//! column on both backends; the SQL conversion lives in `store::sql_types`).

use std::fmt;

use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord,
            serde::Serialize, diesel::AsExpression, diesel::FromSqlRow,
        )]
        #[serde(transparent)]
        #[diesel(sql_type = diesel::sql_types::Text)]
        pub struct $name(String);

        impl $name {
            /// A fresh, time-ordered id.
            pub fn new() -> Self {
                Self(Uuid::now_v7().hyphenated().to_string())
            }

            /// Parses the hyphenated textual form; anything else is refused.
            /// The stored form is always lowercase and hyphenated.
            pub fn parse(text: &str) -> Option<Self> {
                // Only the hyphenated form (36 characters), as ids are written.
                if text.len() != 36 {
                    return None;
                }
                Uuid::try_parse(text)
                    .ok()
                    .map(|uuid| Self(uuid.hyphenated().to_string()))
            }

            /// Wraps text read back from a column that only ever holds ids.
            pub fn from_stored(text: String) -> Self {
                Self(text)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

/// An enum stored and shown as text: each variant names its text once, and
/// the macro writes `ALL` (every variant, in order), `as_str`, `parse` (the
/// exact text, nothing else) and `Display` from it. Every such enum is a
/// plain `Copy` value (`Debug, Clone, Copy, PartialEq, Eq, Hash`); `stored`
/// before the enum also makes it a diesel `Text` column's type (its
/// `ToSql`/`FromSql` come from `store::sql_types`). Other derives and
/// attributes are the caller's.
macro_rules! text_enum {
    (
        $(#[$meta:meta])*
        stored $vis:vis enum $name:ident {
            $($(#[$variant_meta:meta])* $variant:ident = $text:literal),+ $(,)?
        }
    ) => {
        $crate::domain::ids::text_enum! {
            #[derive(diesel::AsExpression, diesel::FromSqlRow)]
            #[diesel(sql_type = diesel::sql_types::Text)]
            $(#[$meta])*
            $vis enum $name {
                $($(#[$variant_meta])* $variant = $text),+
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$variant_meta:meta])* $variant:ident = $text:literal),+ $(,)?
        }
    ) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $(#[$meta])*
        $vis enum $name {
            $($(#[$variant_meta])* $variant),+
        }

        impl $name {
            /// Every value, in the order they are declared.
            pub const ALL: [$name; [$($text),+].len()] = [$(Self::$variant),+];

            /// The text it is stored and shown as.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text),+
                }
            }

            /// The value whose text is exactly `text`.
            pub fn parse(text: &str) -> Option<Self> {
                match text {
                    $($text => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        /// A value equals its text.
        impl PartialEq<&str> for $name {
            fn eq(&self, text: &&str) -> bool {
                self.as_str() == *text
            }
        }
    };
}
pub(crate) use text_enum;

uuid_id!(
    /// Identifies a Job: one user intent.
    JobId
);
uuid_id!(
    /// Identifies an Attempt: one try at a Job against one provider.
    AttemptId
);
uuid_id!(
    /// Identifies a user (the owner of jobs and API tokens).
    UserId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_text() {
        let id = JobId::new();
        assert_eq!(JobId::parse(id.as_str()), Some(id));
    }

    #[test]
    fn non_uuid_text_is_refused() {
        assert_eq!(JobId::parse("not-a-uuid"), None);
        assert_eq!(AttemptId::parse(""), None);
    }

    #[test]
    fn parsing_normalises_to_lowercase_hyphenated() {
        let id = JobId::new();
        let upper = id.as_str().to_uppercase();
        assert_eq!(JobId::parse(&upper), Some(id.clone()));
        // Only the hyphenated form is an id, as the API documents it.
        let simple = id.as_str().replace('-', "");
        assert_eq!(JobId::parse(&simple), None);
        assert_eq!(JobId::parse(&format!("{{{id}}}")), None);
        assert_eq!(JobId::parse(&format!("urn:uuid:{id}")), None);
    }

    #[test]
    fn later_ids_sort_after_earlier_ones_as_text() {
        let first = JobId::new().to_string();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = JobId::new().to_string();
        assert!(first < second);
    }
}
