//! Stored qualification runs.

use diesel::prelude::*;

use super::schema::qualifications;
use super::{DbConnection, StoreResult};

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Insertable)]
#[diesel(table_name = qualifications)]
pub struct QualificationRow {
    pub id: String,
    pub provider: String,
    pub model: String,
    pub task: String,
    pub template_sha256: String,
    pub output_schema_sha256: String,
    pub passed: bool,
    /// JSON: `[{"name": …, "passed": …, "detail": …}]`.
    pub checks: String,
    pub round_trip_ms: i64,
    pub qualified_at: i64,
}

pub fn record(conn: &mut DbConnection, row: &QualificationRow) -> StoreResult<()> {
    diesel::insert_into(qualifications::table)
        .values(row)
        .execute(conn)?;
    Ok(())
}

/// The latest run for each (provider, task) pair of `task` (or of every task).
pub fn latest(conn: &mut DbConnection, task: Option<&str>) -> StoreResult<Vec<QualificationRow>> {
    let mut query = qualifications::table
        .order((
            qualifications::qualified_at.desc(),
            qualifications::id.desc(),
        ))
        .select(QualificationRow::as_select())
        .into_boxed();
    if let Some(task) = task {
        query = query.filter(qualifications::task.eq(task.to_owned()));
    }
    let mut seen = std::collections::HashSet::new();
    Ok(query
        .load(conn)?
        .into_iter()
        .filter(|row| seen.insert((row.provider.clone(), row.task.clone())))
        .collect())
}
