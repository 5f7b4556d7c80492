//! A job's stream (docs/design.md, "Streaming"): the worker that streams an
//! attempt releases each delta to the job's followers, and every request
//! under the job's key follows the same stream, from its first chunk (or
//! from the one after its `Last-Event-ID`), however it connected.
//!
//! - **In this process** the chunks are kept in memory while the stream
//!   runs (the hub); a follower here hears each one as it is released.
//! - **Through the database** the chunks are appended in small batches (at
//!   most [`BATCH_WINDOW`] after release), and a follower reads them, and
//!   its job's row, every [`POLL`]: a follower in another process, or one
//!   that comes after the stream ended, replays and follows from there.
//!
//! The stream ends when its job does: a follower reads the job's row to
//! learn how (an answer, a failure, an unknown outcome).
//!
//! Two limits bound what one job's stream costs a process (docs/design.md,
//! "Streaming", bounds): at most `server.max_followers_per_job` requests
//! follow it at once (one more is refused, [`FollowRefused`]), and at most
//! `server.max_stream_bytes` of released deltas are held for them (the
//! delta that would pass it is refused, [`TooLarge`], and the worker ends
//! the attempt as `domain::stream::fits_in_buffer` says).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::chat::openai_chat::WireDelta;
use crate::chat::Delta;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::{App, AppResult, Job, JobKey};
use crate::domain::{AttemptId, JobId};
use crate::store::stream_chunks::{self, StoredChunk};

/// How often a follower reads its job's chunks and row from the database.
pub const POLL: Duration = Duration::from_millis(200);
/// How long released chunks may wait to be written together.
pub const BATCH_WINDOW: Duration = Duration::from_millis(50);
/// The most chunks written in one transaction.
const BATCH_MAX: usize = 64;
/// How often a batch the database refused is written again before it is
/// given up (logged; followers elsewhere then miss those chunks).
const BATCH_TRIES: u32 = 5;

/// One released chunk: its number in the job's stream (from 1; the SSE
/// `id:`) and its delta as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub seq: i64,
    pub delta: Arc<str>,
}

/// The streams running in this process, by job.
#[derive(Default)]
pub struct StreamHub {
    streams: Mutex<HashMap<JobId, Weak<LiveStream>>>,
    /// How many requests follow each job's stream now.
    followers: Mutex<HashMap<JobId, usize>>,
}

/// A follower refused because its job's stream has as many as
/// `server.max_followers_per_job` already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowRefused {
    pub limit: usize,
}

impl std::fmt::Display for FollowRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this job's stream already has {} followers, the most allowed \
             (server.max_followers_per_job); try again when one has finished",
            self.limit
        )
    }
}

/// A delta refused because the stream would hold more than
/// `server.max_stream_bytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    pub cap: usize,
}

/// One follower's place among its job's: given back (and the gauge moved
/// down) when it is dropped, however the request ended.
struct FollowerSlot {
    app: App,
    job_id: JobId,
}

impl Drop for FollowerSlot {
    fn drop(&mut self) {
        let mut followers = self
            .app
            .inner
            .streams
            .followers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(count) = followers.get_mut(&self.job_id) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                followers.remove(&self.job_id);
            }
        }
        self.app.metrics().streams_followed.dec();
    }
}

/// A job's stream in this process: its chunks so far, and a counter moved
/// whenever a chunk is released or a writer ends.
pub struct LiveStream {
    chunks: Mutex<Vec<Chunk>>,
    moved: watch::Sender<u64>,
}

impl LiveStream {
    fn chunk_after(&self, seq: i64) -> Option<Chunk> {
        let chunks = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        usize::try_from(seq)
            .ok()
            .and_then(|index| chunks.get(index))
            .cloned()
    }

    /// Adds the next chunk; one out of order is dropped (the chunks are
    /// read by their place, which must be their number).
    fn push(&self, chunk: Chunk) {
        {
            let mut chunks = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
            if chunk.seq != chunks.len() as i64 + 1 {
                tracing::error!(
                    seq = chunk.seq,
                    held = chunks.len(),
                    "a stream chunk out of order was dropped"
                );
                return;
            }
            chunks.push(chunk);
        }
        self.moved.send_modify(|n| *n += 1);
    }

    fn is_empty(&self) -> bool {
        self.chunks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }
}

impl StreamHub {
    /// A stream for a new attempt of the job: the one followers wait on,
    /// unless an earlier attempt released chunks into it (then its
    /// followers have had their ending, and the new attempt starts anew).
    fn fresh_stream(&self, job_id: &JobId) -> Arc<LiveStream> {
        let live = self.stream_of(job_id);
        if live.is_empty() {
            return live;
        }
        let fresh = Arc::new(LiveStream {
            chunks: Mutex::default(),
            moved: watch::channel(0).0,
        });
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(job_id.clone(), Arc::downgrade(&fresh));
        fresh
    }

    /// The job's live stream, made if this process has none.
    fn stream_of(&self, job_id: &JobId) -> Arc<LiveStream> {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(live) = streams.get(job_id).and_then(Weak::upgrade) {
            return live;
        }
        streams.retain(|_, stream| stream.strong_count() > 0);
        let live = Arc::new(LiveStream {
            chunks: Mutex::default(),
            moved: watch::channel(0).0,
        });
        streams.insert(job_id.clone(), Arc::downgrade(&live));
        live
    }
}

/// What an attempt's worker releases through: each delta goes to this
/// process's followers at once and to the database in small batches.
pub struct StreamWriter {
    app: App,
    provider: String,
    opened_at: std::time::Instant,
    live: Arc<LiveStream>,
    released: i64,
    /// Bytes of released deltas (their JSON text), and the most allowed.
    buffered: usize,
    cap: usize,
    persist: Option<mpsc::UnboundedSender<StoredChunk>>,
    flusher: Option<tokio::task::JoinHandle<()>>,
}

impl StreamWriter {
    /// Releases one delta to every follower of the job, unless it would
    /// take the stream past `server.max_stream_bytes`: then nothing is
    /// released and the attempt must end (`domain::stream::fits_in_buffer`).
    /// The first release is the attempt's time to first token.
    pub fn release(&mut self, delta: &Delta) -> Result<(), TooLarge> {
        // Kept in the one delta shape, whichever format the provider
        // streamed in.
        let text = WireDelta::of(delta).to_text();
        if !crate::domain::stream::fits_in_buffer(self.buffered, text.len(), self.cap) {
            self.app.metrics().stream_limit_hit("buffer");
            return Err(TooLarge { cap: self.cap });
        }
        self.buffered += text.len();
        if self.released == 0 {
            self.app
                .metrics()
                .first_token(&self.provider, self.opened_at.elapsed());
        }
        self.released += 1;
        let text: Arc<str> = text.into();
        if let Some(persist) = &self.persist {
            let _ = persist.send(StoredChunk {
                seq: self.released,
                delta: text.to_string(),
            });
        }
        self.live.push(Chunk {
            seq: self.released,
            delta: text,
        });
        Ok(())
    }

    /// How many chunks were released.
    pub fn released(&self) -> u64 {
        self.released as u64
    }

    /// Waits until every released chunk is in the database (or was given
    /// up): called before the attempt's outcome is applied, so a follower
    /// that reads a finished job finds all its chunks.
    pub async fn flush(&mut self) {
        self.persist = None;
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.await;
        }
    }
}

impl Drop for StreamWriter {
    /// Followers in this process look at their job again: the attempt ended.
    fn drop(&mut self) {
        self.live.moved.send_modify(|n| *n += 1);
    }
}

/// What a follower hears next.
#[derive(Debug)]
pub enum Followed {
    Chunk(Chunk),
    /// The job succeeded; its answer was streamed in `chunks` chunks (0:
    /// none were stored, and the answer is sent whole).
    Finished {
        job: Job,
        chunks: i64,
    },
    /// The job ended without an answer, or waits for a person: failed,
    /// unknown, or (`needs_support`) left unfinished with no live attempt.
    Ended {
        job: Job,
        needs_support: bool,
    },
    /// Nothing moved within the wait; the job goes on.
    StillWaiting {
        job: Job,
    },
    /// Nothing moved for `server.stream_keepalive_ms`: the request should
    /// send something its client ignores (an SSE comment), so that a quiet
    /// stream stays open through proxies and a client that hung up is
    /// noticed when the write fails.
    Quiet,
}

/// One request following a job's stream.
pub struct Follower {
    app: App,
    /// Its place among the job's followers, given back once it ends.
    slot: Option<FollowerSlot>,
    job: Job,
    cursor: i64,
    live: Arc<LiveStream>,
    moved: watch::Receiver<u64>,
    stored: VecDeque<StoredChunk>,
    look_now: bool,
    next_poll: Instant,
    within: Duration,
    quiet_until: Instant,
    keepalive: Duration,
    next_keepalive: Instant,
    done: bool,
}

impl App {
    /// Opens the stream of `job`'s attempt to `provider` for its worker,
    /// as its call starts.
    pub fn open_stream(&self, job: &JobKey, attempt: &AttemptId, provider: &str) -> StreamWriter {
        let live = self.inner.streams.fresh_stream(&job.id);
        let (persist, batches) = mpsc::unbounded_channel();
        let flusher = tokio::spawn(self.clone().persist_chunks(
            job.clone(),
            attempt.clone(),
            batches,
        ));
        StreamWriter {
            app: self.clone(),
            provider: provider.to_owned(),
            opened_at: std::time::Instant::now(),
            live,
            released: 0,
            buffered: 0,
            cap: self.config().server.max_stream_bytes,
            persist: Some(persist),
            flusher: Some(flusher),
        }
    }

    /// Writes released chunks in batches until the writer closes.
    async fn persist_chunks(
        self,
        job: JobKey,
        attempt: AttemptId,
        mut released: mpsc::UnboundedReceiver<StoredChunk>,
    ) {
        // Chunks an earlier attempt left (one that became unknown, after
        // which support started this one) are void: this answer is the
        // job's stream now, numbered from 1.
        let key = job.clone();
        if let Err(error) = self
            .store()
            .run(move |conn| stream_chunks::clear(conn, &key))
            .await
        {
            tracing::warn!(%error, "clearing an earlier attempt's stream chunks failed");
        }
        let mut batch = Vec::with_capacity(BATCH_MAX);
        loop {
            if released.recv_many(&mut batch, BATCH_MAX).await == 0 {
                return;
            }
            // A short window lets the next few chunks join this batch.
            let window = Instant::now() + BATCH_WINDOW;
            while batch.len() < BATCH_MAX {
                match tokio::time::timeout_at(window, released.recv()).await {
                    Ok(Some(chunk)) => batch.push(chunk),
                    Ok(None) | Err(_) => break,
                }
            }
            let mut delay = Duration::from_millis(50);
            for tries in 1..=BATCH_TRIES {
                let (key, id, chunks) = (job.clone(), attempt.clone(), batch.clone());
                match self
                    .store()
                    .run(move |conn| stream_chunks::append(conn, &key, &id, &chunks))
                    .await
                {
                    Ok(()) => break,
                    Err(error) if tries < BATCH_TRIES => {
                        tracing::warn!(%error, tries, "writing stream chunks failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay *= 2;
                    }
                    Err(error) => tracing::error!(
                        %error, job_id = %job.id, chunks = batch.len(),
                        "stream chunks could not be written: followers in other processes miss them"
                    ),
                }
            }
            batch.clear();
        }
    }

    /// Follows `job`'s stream from the chunk after `after` (0: from the
    /// first), as read when the request came; `within` bounds a wait in
    /// which nothing moves. Refused when the job's stream has
    /// `server.max_followers_per_job` followers in this process already.
    pub fn follow_stream(
        &self,
        job: Job,
        after: i64,
        within: Duration,
    ) -> Result<Follower, FollowRefused> {
        let limit = self.config().server.max_followers_per_job;
        let keepalive = Duration::from_millis(self.config().server.stream_keepalive_ms);
        {
            let mut followers = self
                .inner
                .streams
                .followers
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let count = followers.entry(job.id.clone()).or_default();
            if *count >= limit {
                drop(followers);
                self.metrics().stream_limit_hit("followers");
                return Err(FollowRefused { limit });
            }
            *count += 1;
        }
        self.metrics().streams_followed.inc();
        let slot = FollowerSlot {
            app: self.clone(),
            job_id: job.id.clone(),
        };
        let live = self.inner.streams.stream_of(&job.id);
        let moved = live.moved.subscribe();
        Ok(Follower {
            app: self.clone(),
            slot: Some(slot),
            job,
            cursor: after,
            live,
            moved,
            stored: VecDeque::new(),
            look_now: true,
            next_poll: Instant::now() + POLL,
            within,
            quiet_until: Instant::now() + within,
            keepalive,
            next_keepalive: Instant::now() + keepalive,
            done: false,
        })
    }

    /// How many requests follow `job_id`'s stream in this process now.
    pub fn followers_of(&self, job_id: &JobId) -> usize {
        self.inner
            .streams
            .followers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(job_id)
            .copied()
            .unwrap_or(0)
    }
}

impl Follower {
    /// The next thing to send; `None` once the stream has ended.
    pub async fn next(&mut self) -> AppResult<Option<Followed>> {
        if self.done {
            return Ok(None);
        }
        loop {
            if let Some(chunk) = self.next_chunk() {
                self.cursor = chunk.seq;
                self.quiet_until = Instant::now() + self.within;
                self.next_keepalive = Instant::now() + self.keepalive;
                return Ok(Some(Followed::Chunk(chunk)));
            }
            if self.look_now {
                self.look_now = false;
                self.next_poll = Instant::now() + POLL;
                if let Some(end) = self.read_stored().await? {
                    self.end();
                    return Ok(Some(end));
                }
                continue;
            }
            tokio::select! {
                moved = self.moved.changed() => {
                    // A change with no new chunk: a writer ended (or the
                    // hub dropped its stream); the job says what follows.
                    if moved.is_err() || self.live.chunk_after(self.cursor).is_none() {
                        self.look_now = true;
                    }
                }
                _ = tokio::time::sleep_until(self.next_poll) => self.look_now = true,
                _ = tokio::time::sleep_until(self.next_keepalive) => {
                    self.next_keepalive = Instant::now() + self.keepalive;
                    return Ok(Some(Followed::Quiet));
                }
                _ = tokio::time::sleep_until(self.quiet_until) => {
                    self.end();
                    return Ok(Some(Followed::StillWaiting { job: self.job.clone() }));
                }
            }
        }
    }

    /// The stream has ended for this follower: its place is given back.
    fn end(&mut self) {
        self.done = true;
        self.slot = None;
    }

    /// The chunk after the cursor, from this process's stream or from what
    /// was read from the database.
    fn next_chunk(&mut self) -> Option<Chunk> {
        while self
            .stored
            .front()
            .is_some_and(|chunk| chunk.seq <= self.cursor)
        {
            self.stored.pop_front();
        }
        if let Some(chunk) = self.live.chunk_after(self.cursor) {
            return Some(chunk);
        }
        // The next stored one, in order; a gap (a batch the database kept
        // refusing) is passed over rather than waited for.
        let chunk = self.stored.pop_front()?;
        Some(Chunk {
            seq: chunk.seq,
            delta: chunk.delta.into(),
        })
    }

    /// Reads the chunks after the cursor and the job's row; what ends the
    /// stream, if the job has ended.
    async fn read_stored(&mut self) -> AppResult<Option<Followed>> {
        let (key, after) = (self.job.key(), self.cursor);
        // Each read is its own statement, so their order matters: the
        // attempts before the job (an attempt stops being live in the
        // transaction that finishes its job, so a finished attempt is
        // never seen beside an unfinished job), and the chunks after the
        // job (every chunk is written before its job finishes, so a
        // finished job's chunks are all seen).
        let (attempts, job, chunks, count) = self
            .app
            .store()
            .run(move |conn| {
                let attempts = crate::store::reads::attempts_of(conn, &key)?;
                let job = crate::store::reads::get_job(conn, &key)?;
                let chunks = stream_chunks::after(conn, &key, after)?;
                let count = match job.status {
                    crate::domain::JobStatus::Succeeded => stream_chunks::count(conn, &key)?,
                    _ => 0,
                };
                Ok((attempts, job, chunks, count))
            })
            .await?;
        self.job = job;
        if !chunks.is_empty() {
            // Sent first; then the job is read again at once.
            self.stored = chunks.into();
            self.look_now = true;
            return Ok(None);
        }
        let job = self.job.clone();
        Ok(match job.status {
            crate::domain::JobStatus::Succeeded => Some(Followed::Finished { job, chunks: count }),
            crate::domain::JobStatus::Failed
            | crate::domain::JobStatus::Unknown
            | crate::domain::JobStatus::Cancelled => Some(Followed::Ended {
                job,
                needs_support: false,
            }),
            _ if !attempts.iter().any(|a| a.state.is_live()) => Some(Followed::Ended {
                job,
                needs_support: true,
            }),
            _ => None,
        })
    }
}
