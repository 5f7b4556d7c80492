//! Typed identifiers. All ids are UUIDv7 (time-ordered) and travel as lowercase
//! hyphenated text, which is also how they are stored.

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh, time-ordered id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// Parses the textual form; anything that is not a UUID is refused.
            pub fn parse(text: &str) -> Option<Self> {
                Uuid::from_str(text).ok().map(Self)
            }

            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0.hyphenated(), f)
            }
        }
    };
}

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
        assert_eq!(JobId::parse(&id.to_string()), Some(id));
    }

    #[test]
    fn non_uuid_text_is_refused() {
        assert_eq!(JobId::parse("not-a-uuid"), None);
        assert_eq!(AttemptId::parse(""), None);
    }

    #[test]
    fn later_ids_sort_after_earlier_ones_as_text() {
        let first = JobId::new().to_string();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = JobId::new().to_string();
        assert!(first < second);
    }
}
