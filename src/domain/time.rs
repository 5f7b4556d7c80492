//! Time as onejob stores and compares it: an instant is milliseconds since
//! the Unix epoch in a BIGINT column (sortable, and finer than SQLite's
//! one-second `CURRENT_TIMESTAMP`). A bare `i64` could as well be a count,
//! a span or Unix seconds (webhook signatures use seconds), so every instant
//! is a [`Timestamp`] and every span a number of milliseconds named `_ms`.

use diesel::expression::AsExpression;
use diesel::sql_types::BigInt;

/// An instant, in milliseconds since the Unix epoch. It has no `Display`
/// on purpose: SQL text takes [`Timestamp::millis`], people
/// [`Timestamp::rfc3339`], and a format string has to say which.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    AsExpression,
    diesel::deserialize::FromSqlRow,
)]
#[diesel(sql_type = BigInt)]
pub struct Timestamp(i64);

impl Timestamp {
    /// 1970-01-01T00:00:00Z.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// The instant `ms` milliseconds after the epoch.
    pub const fn from_millis(ms: i64) -> Self {
        Timestamp(ms)
    }

    /// This machine's wall clock. Statements that must agree across
    /// processes bind the database's clock instead (`store::connection`).
    pub fn now() -> Self {
        Timestamp(chrono::Utc::now().timestamp_millis())
    }

    /// Milliseconds since the epoch, for a column or a JSON field.
    pub const fn millis(self) -> i64 {
        self.0
    }

    /// Whole seconds since the epoch, rounded down, as signatures carry them.
    pub const fn unix_seconds(self) -> i64 {
        self.0.div_euclid(1000)
    }

    /// The start of the `width_ms`-wide slot holding this instant, slots
    /// counted from the epoch: a minute, an hour, a UTC day.
    pub const fn floor_to(self, width_ms: i64) -> Self {
        Timestamp(self.0 - self.0.rem_euclid(width_ms))
    }

    /// As RFC 3339 in UTC with milliseconds (`2026-12-05T07:11:40.123Z`).
    pub fn rfc3339(self) -> String {
        chrono::DateTime::from_timestamp_millis(self.0)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    }
}

/// The instant `ms` milliseconds later (earlier when negative), held at
/// the ends of the range rather than wrapping.
impl std::ops::Add<i64> for Timestamp {
    type Output = Timestamp;
    fn add(self, ms: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(ms))
    }
}

/// The instant `ms` milliseconds earlier.
impl std::ops::Sub<i64> for Timestamp {
    type Output = Timestamp;
    fn sub(self, ms: i64) -> Timestamp {
        Timestamp(self.0.saturating_sub(ms))
    }
}

/// Milliseconds from `earlier` to this instant: negative when `earlier` is
/// in fact later.
impl std::ops::Sub for Timestamp {
    type Output = i64;
    fn sub(self, earlier: Timestamp) -> i64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl serde::Serialize for Timestamp {
    /// As its milliseconds, the way the API has always written instants.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_i64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_down_before_the_epoch_too() {
        assert_eq!(Timestamp::from_millis(1_999).unix_seconds(), 1);
        assert_eq!(Timestamp::from_millis(-1).unix_seconds(), -1);
    }

    #[test]
    fn arithmetic_holds_at_the_ends_of_the_range() {
        let last = Timestamp::from_millis(i64::MAX);
        assert_eq!(last + 5, last);
        assert_eq!((Timestamp::from_millis(i64::MIN) - 5).millis(), i64::MIN);
        let start = Timestamp::from_millis(1_000);
        assert_eq!((start + 250) - start, 250);
        assert_eq!(start - (start + 250), -250);
    }

    #[test]
    fn an_instant_floors_to_the_start_of_its_slot() {
        assert_eq!(
            Timestamp::from_millis(61_500).floor_to(60_000).millis(),
            60_000
        );
        assert_eq!(Timestamp::from_millis(-1).floor_to(1_000).millis(), -1_000);
    }

    #[test]
    fn rfc3339_carries_milliseconds_in_utc() {
        assert_eq!(
            Timestamp::from_millis(1_764_918_700_123).rfc3339(),
            "2025-12-05T07:11:40.123Z"
        );
    }
}
