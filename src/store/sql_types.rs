//! How domain types live in TEXT columns: ids, states, statuses, roles and
//! JSON documents. Each is written as its text and read back checked, on
//! SQLite, PostgreSQL and the multi-backend connection alike; and how an
//! instant lives in a BIGINT column.

use diesel::backend::Backend;
use diesel::deserialize::{self, FromSql};
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, IsNull, Output, ToSql};
use diesel::sql_types::{BigInt, Text};
use diesel::sqlite::{Sqlite, SqliteValue};

use super::DbConnection;
use crate::domain::webhook::EventKind;
use crate::domain::{
    AttemptId, AttemptState, AuditAction, JobId, JobStatus, JsonText, RaceResult, ReasonKind, Role,
    Timestamp, UsageSource, UserId,
};

type Multi = <DbConnection as diesel::Connection>::Backend;

/// Implements `ToSql<Text>`/`FromSql<Text>` on the three backends for a type,
/// given how to view it as text and how to parse it back.
macro_rules! text_column {
    ($ty:ty, |$value:ident| $as_str:expr, |$text:ident| $parse:expr) => {
        impl ToSql<Text, Pg> for $ty {
            fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
                let $value = self;
                <str as ToSql<Text, Pg>>::to_sql($as_str, out)
            }
        }

        impl ToSql<Text, Sqlite> for $ty {
            fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Sqlite>) -> serialize::Result {
                let $value = self;
                <str as ToSql<Text, Sqlite>>::to_sql($as_str, out)
            }
        }

        impl ToSql<Text, Multi> for $ty {
            fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Multi>) -> serialize::Result {
                out.set_value((Text, self));
                Ok(IsNull::No)
            }
        }

        impl FromSql<Text, Pg> for $ty {
            fn from_sql(bytes: PgValue<'_>) -> deserialize::Result<Self> {
                let $text = <String as FromSql<Text, Pg>>::from_sql(bytes)?;
                $parse
            }
        }

        impl FromSql<Text, Sqlite> for $ty {
            fn from_sql(bytes: SqliteValue<'_, '_, '_>) -> deserialize::Result<Self> {
                let $text = <String as FromSql<Text, Sqlite>>::from_sql(bytes)?;
                $parse
            }
        }

        impl FromSql<Text, Multi> for $ty {
            fn from_sql(bytes: <Multi as Backend>::RawValue<'_>) -> deserialize::Result<Self> {
                bytes.from_sql::<Self, Text>()
            }
        }
    };
}

fn unknown(what: &str, text: &str) -> Box<dyn std::error::Error + Send + Sync> {
    format!("stored {what} {text:?} is not one onejob knows").into()
}

text_column!(JobId, |v| v.as_str(), |t| Ok(JobId::from_stored(t)));
text_column!(AttemptId, |v| v.as_str(), |t| Ok(AttemptId::from_stored(t)));
text_column!(UserId, |v| v.as_str(), |t| Ok(UserId::from_stored(t)));
text_column!(AttemptState, |v| v.as_str(), |t| AttemptState::parse(&t)
    .ok_or_else(|| unknown("attempt state", &t)));
text_column!(JobStatus, |v| v.as_str(), |t| JobStatus::parse(&t)
    .ok_or_else(|| unknown("job status", &t)));
text_column!(RaceResult, |v| v.as_str(), |t| RaceResult::parse(&t)
    .ok_or_else(|| unknown("race result", &t)));
text_column!(Role, |v| v.as_str(), |t| Role::parse(&t)
    .ok_or_else(|| unknown("role", &t)));
text_column!(EventKind, |v| v.as_str(), |t| EventKind::parse(&t)
    .ok_or_else(|| unknown("webhook event kind", &t)));
text_column!(ReasonKind, |v| v.as_str(), |t| ReasonKind::parse(&t)
    .ok_or_else(|| unknown("failure kind", &t)));
text_column!(AuditAction, |v| v.as_str(), |t| AuditAction::parse(&t)
    .ok_or_else(|| unknown("audit action", &t)));
text_column!(UsageSource, |v| v.as_str(), |t| UsageSource::parse(&t)
    .ok_or_else(|| unknown("usage source", &t)));
text_column!(JsonText, |v| v.as_str(), |t| JsonText::parse(t).map_err(
    |e| format!("a stored JSON column does not parse: {e}").into()
));

// An instant is its milliseconds in a BIGINT column.
impl ToSql<BigInt, Pg> for Timestamp {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        std::io::Write::write_all(out, &self.millis().to_be_bytes())?;
        Ok(IsNull::No)
    }
}

impl ToSql<BigInt, Sqlite> for Timestamp {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Sqlite>) -> serialize::Result {
        out.set_value(self.millis());
        Ok(IsNull::No)
    }
}

impl ToSql<BigInt, Multi> for Timestamp {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Multi>) -> serialize::Result {
        out.set_value((BigInt, self));
        Ok(IsNull::No)
    }
}

impl FromSql<BigInt, Pg> for Timestamp {
    fn from_sql(bytes: PgValue<'_>) -> deserialize::Result<Self> {
        <i64 as FromSql<BigInt, Pg>>::from_sql(bytes).map(Timestamp::from_millis)
    }
}

impl FromSql<BigInt, Sqlite> for Timestamp {
    fn from_sql(bytes: SqliteValue<'_, '_, '_>) -> deserialize::Result<Self> {
        <i64 as FromSql<BigInt, Sqlite>>::from_sql(bytes).map(Timestamp::from_millis)
    }
}

impl FromSql<BigInt, Multi> for Timestamp {
    fn from_sql(bytes: <Multi as Backend>::RawValue<'_>) -> deserialize::Result<Self> {
        bytes.from_sql::<Self, BigInt>()
    }
}
