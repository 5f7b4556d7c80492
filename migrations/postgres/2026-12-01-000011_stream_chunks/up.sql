-- A streamed answer's chunks, appended in small batches while the stream
-- runs, so that a follower in another process can replay and follow it
-- (docs/design.md, "Streaming"). `seq` numbers a job's chunks from 1; it
-- is also the SSE `id:` of each chunk. `delta` is the chunk's delta as JSON
-- text. One owner's rows: keyed and linked by (job, owner), ready to be
-- distributed by owner (docs/scaling.md); removed with their job.
CREATE TABLE stream_chunks (
    job_id      TEXT NOT NULL,
    owner_id    TEXT NOT NULL,
    seq         BIGINT NOT NULL CHECK (seq >= 1),
    attempt_id  TEXT NOT NULL,
    delta       TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    CONSTRAINT stream_chunks_pkey PRIMARY KEY (job_id, owner_id, seq),
    CONSTRAINT stream_chunks_job_fkey FOREIGN KEY (job_id, owner_id)
        REFERENCES jobs (id, owner_id) ON DELETE CASCADE
);
