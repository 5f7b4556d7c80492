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
    /// Written digit by digit for years 0 to 9999 (every job's three
    /// instants are, on every answer: chrono's general formatter was over
    /// a percent of a creation's instructions); others through chrono.
    pub fn rfc3339(self) -> String {
        let days = self.0.div_euclid(MS_PER_DAY);
        let ms_of_day = self.0.rem_euclid(MS_PER_DAY);
        let (year, month, day) = civil_from_days(days);
        if !(0..=9999).contains(&year) {
            return chrono::DateTime::from_timestamp_millis(self.0)
                .unwrap_or_default()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        }
        let mut text = [0u8; 24];
        let mut put = |at: usize, value: i64, width: usize| {
            let mut value = value;
            for i in (at..at + width).rev() {
                text[i] = b'0' + (value % 10) as u8;
                value /= 10;
            }
        };
        put(0, year, 4);
        put(5, month, 2);
        put(8, day, 2);
        put(11, ms_of_day / 3_600_000, 2);
        put(14, ms_of_day / 60_000 % 60, 2);
        put(17, ms_of_day / 1_000 % 60, 2);
        put(20, ms_of_day % 1_000, 3);
        for (at, mark) in [
            (4, b'-'),
            (7, b'-'),
            (10, b'T'),
            (13, b':'),
            (16, b':'),
            (19, b'.'),
        ] {
            text[at] = mark;
        }
        text[23] = b'Z';
        std::str::from_utf8(&text)
            .expect("ASCII digits and marks")
            .to_owned()
    }
}

const MS_PER_DAY: i64 = 86_400_000;

/// The proleptic Gregorian date (year, month, day) `days` days after
/// 1970-01-01: counted in 400-year eras of 146,097 days, each year taken
/// to start on 1 March so that the leap day falls at a year's end.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days.saturating_add(719_468); // from 0000-03-01
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
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

    /// chrono's general formatter, which [`Timestamp::rfc3339`] stands in for.
    fn by_chrono(ms: i64) -> String {
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    }

    #[test]
    fn rfc3339_writes_what_chrono_writes_across_ten_thousand_years_and_beyond() {
        // Years 0 and 9999 begin and end here.
        let (first, last) = (-62_167_219_200_000_i64, 253_402_300_799_999_i64);
        let mut ends = vec![
            first,
            first - 1,
            last,
            last + 1,
            0,
            -1,
            1,
            i64::MIN,
            i64::MAX,
        ];
        // Every leap day and year's end from 1600 to 2500, to the millisecond.
        for year in 1600..2500 {
            let start = chrono::NaiveDate::from_ymd_opt(year, 1, 1)
                .unwrap()
                .and_hms_opt(0, 0, 0)
                .unwrap()
                .and_utc()
                .timestamp_millis();
            ends.extend([
                start - 1,
                start,
                start + 59 * MS_PER_DAY,
                start + 60 * MS_PER_DAY - 1,
            ]);
        }
        for ms in ends {
            assert_eq!(Timestamp::from_millis(ms).rfc3339(), by_chrono(ms), "{ms}");
        }
        // And a walk over the whole range in uneven steps.
        let step = 7_919_993_311_i64;
        let mut ms = first - 10 * step;
        while ms < last + 10 * step {
            assert_eq!(Timestamp::from_millis(ms).rfc3339(), by_chrono(ms), "{ms}");
            ms += step;
        }
    }

    #[test]
    fn rfc3339_carries_milliseconds_in_utc() {
        assert_eq!(
            Timestamp::from_millis(1_764_918_700_123).rfc3339(),
            "2025-12-05T07:11:40.123Z"
        );
    }
}
