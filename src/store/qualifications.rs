//! Stored qualification runs.

use diesel::prelude::*;

use super::rows::QualificationRun;
use super::schema::qualifications;
use super::{DbConnection, StoreResult};

pub fn record(conn: &mut DbConnection, row: &QualificationRun) -> StoreResult<()> {
    diesel::insert_into(qualifications::table)
        .values(row)
        .execute(conn)?;
    Ok(())
}

/// The latest run for each (provider, task) pair of `task` (or of every task).
pub fn latest(conn: &mut DbConnection, task: Option<&str>) -> StoreResult<Vec<QualificationRun>> {
    let mut query = qualifications::table
        .order((
            qualifications::qualified_at.desc(),
            qualifications::id.desc(),
        ))
        .select(QualificationRun::as_select())
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
