//! A streamed answer's chunks in the database: appended in small batches
//! by the worker that streams them, read back by followers in any process
//! (docs/design.md, "Streaming"). Every statement names the job's owner.

use diesel::prelude::*;

use super::connection::write_transaction;
use super::rows::JobKey;
use super::schema::stream_chunks;
use super::{DbConnection, StoreResult};
use crate::domain::{AttemptId, Timestamp};

/// The most chunks one read returns; a follower reads again for more.
pub const READ_LIMIT: i64 = 256;

/// One chunk of a job's streamed answer: its number (from 1, the SSE
/// `id:`) and its delta as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredChunk {
    pub seq: i64,
    pub delta: String,
}

/// Appends chunks of `attempt`'s stream, in one transaction. A chunk
/// already stored under its number (a batch written twice after a busy
/// answer) is left as it was.
pub fn append(
    conn: &mut DbConnection,
    job: &JobKey,
    attempt: &AttemptId,
    chunks: &[StoredChunk],
) -> StoreResult<()> {
    let now = Timestamp::now();
    write_transaction(conn, |conn| {
        for chunk in chunks {
            let stored: i64 = stream_chunks::table
                .filter(stream_chunks::job_id.eq(&job.id))
                .filter(stream_chunks::owner_id.eq(&job.owner_id))
                .filter(stream_chunks::seq.eq(chunk.seq))
                .count()
                .get_result(conn)?;
            if stored > 0 {
                continue;
            }
            diesel::insert_into(stream_chunks::table)
                .values((
                    stream_chunks::job_id.eq(&job.id),
                    stream_chunks::owner_id.eq(&job.owner_id),
                    stream_chunks::seq.eq(chunk.seq),
                    stream_chunks::attempt_id.eq(attempt),
                    stream_chunks::delta.eq(&chunk.delta),
                    stream_chunks::created_at.eq(now),
                ))
                .execute(conn)?;
        }
        Ok(())
    })
}

/// Up to [`READ_LIMIT`] of a job's chunks after number `after`, in order.
pub fn after(conn: &mut DbConnection, job: &JobKey, after: i64) -> StoreResult<Vec<StoredChunk>> {
    let rows: Vec<(i64, String)> = stream_chunks::table
        .filter(stream_chunks::job_id.eq(&job.id))
        .filter(stream_chunks::owner_id.eq(&job.owner_id))
        .filter(stream_chunks::seq.gt(after))
        .order(stream_chunks::seq.asc())
        .limit(READ_LIMIT)
        .select((stream_chunks::seq, stream_chunks::delta))
        .load(conn)?;
    Ok(rows
        .into_iter()
        .map(|(seq, delta)| StoredChunk { seq, delta })
        .collect())
}

/// How many chunks the job's stream stored (its highest number).
pub fn count(conn: &mut DbConnection, job: &JobKey) -> StoreResult<i64> {
    let highest: Option<i64> = stream_chunks::table
        .filter(stream_chunks::job_id.eq(&job.id))
        .filter(stream_chunks::owner_id.eq(&job.owner_id))
        .select(diesel::dsl::max(stream_chunks::seq))
        .first(conn)?;
    Ok(highest.unwrap_or(0))
}

/// Removes the job's chunks (an earlier attempt's, before a new attempt
/// streams).
pub fn clear(conn: &mut DbConnection, job: &JobKey) -> StoreResult<usize> {
    Ok(diesel::delete(
        stream_chunks::table
            .filter(stream_chunks::job_id.eq(&job.id))
            .filter(stream_chunks::owner_id.eq(&job.owner_id)),
    )
    .execute(conn)?)
}
