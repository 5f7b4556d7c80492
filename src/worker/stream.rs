//! Sending an attempt whose client asked for a stream (docs/design.md,
//! "Streaming"). The call belongs to the job, not to any connection: each
//! delta is released to the job's followers as it arrives, whoever is
//! listening, and the answer built from the deltas is applied as any other.
//!
//! Two clocks guard it (`domain::stream::StreamTimeouts`): the soft timeout
//! until the first chunk, then the idle timeout between chunks. Either
//! makes the attempt `unknown` and closes the stream: nothing more of that
//! call reaches a client, and no late answer is heard from it (the job's
//! followers already got their terminal event).

use std::sync::Arc;

use crate::chat::Delta;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Worker;
use crate::app::dispatch::Dispatch;
use crate::app::streams::{StreamWriter, TooLarge};
use crate::app::Claim;
use crate::domain::stream::StreamTimeouts;
use crate::domain::Outcome;
use crate::providers::limits::SendSlot;

/// How many deltas may wait between the provider's reader and the worker.
const DELTAS_IN_FLIGHT: usize = 64;

impl Worker {
    /// Sends a confirmed claim streaming, releases its deltas, and applies
    /// what it ends in.
    pub(super) async fn send_streaming(
        &self,
        claim: Claim,
        dispatch: Arc<Dispatch>,
        slot: Option<SendSlot>,
        traced: super::AttemptTrace,
    ) {
        let attempt_id = claim.attempt.key();
        let provider = claim.attempt.provider.clone();
        let mut lease = self.keep_lease(&claim);
        let timeouts = dispatch.provider.stream_timeouts();
        let mut outlet = Outlet {
            writer: self
                .app
                .open_stream(&claim.job.key(), &claim.attempt.id, &provider),
            // An answer that must match a schema is held whole until judged.
            held: (!dispatch.releases_as_generated()).then(Vec::new),
        };
        let (sink, mut deltas) = mpsc::channel(DELTAS_IN_FLIGHT);
        let sending = dispatch.clone();
        let mut call = Box::pin(async move { sending.send_streaming(sink).await });
        let sent_at = std::time::Instant::now();
        let mut last_chunk_at: Option<std::time::Instant> = None;
        let answered = loop {
            let (deadline, waiting) = timeouts.deadline(sent_at, last_chunk_at);
            tokio::select! {
                // The lease first, however fast the deltas come; then the
                // deltas, so a reply is taken only once every delta the call
                // handed on before it is released.
                biased;
                _ = lease.heartbeat.tick() => self.renew_kept(&mut lease).await,
                Some(delta) = deltas.recv() => {
                    last_chunk_at = Some(std::time::Instant::now());
                    if let Err(too_large) = outlet.release(&delta) {
                        break Err(Stop::TooLarge(too_large));
                    }
                }
                reply = &mut call => break Ok(reply),
                _ = tokio::time::sleep_until(Instant::from_std(deadline)) => break Err(Stop::TimedOut(waiting)),
            }
        };
        // What the call used, when it answered and said.
        let (outcome, usage) = match answered {
            Ok(reply) => {
                // The call has ended, so its sender is gone: what is left
                // in the channel is all there is.
                let refused = outlet.drain(&mut deltas).err();
                self.app
                    .metrics()
                    .observe_provider_call(&provider, sent_at.elapsed());
                traced.answered(&reply);
                let (outcome, usage) = self.settle(&provider, reply, slot.as_ref());
                (outlet.judged(outcome, refused), usage)
            }
            Err(stop) => {
                // Nothing more of this call is read or released.
                drop(call);
                let outcome = outlet.stopped(stop, &timeouts);
                traced.outcome(&outcome);
                (outcome, None)
            }
        };
        drop(slot);
        let Outlet { mut writer, .. } = outlet;
        writer.flush().await;
        let released = writer.released();
        self.apply_traced(
            &traced,
            &attempt_id,
            &provider,
            (outcome, usage),
            lease.until,
            released,
        )
        .await;
        // Dropping the writer tells this process's followers to read the
        // job: its outcome is written.
        drop(writer);
    }
}

/// Why the worker stopped listening to a streaming call before it ended.
enum Stop {
    /// A clock ran out (`domain::stream::StreamTimeouts`).
    TimedOut(crate::domain::stream::Waiting),
    /// A delta would take the stream past `server.max_stream_bytes`.
    TooLarge(TooLarge),
}

/// A streamed answer refused past the buffer cap: a definite failure, so
/// what follows is `domain::stream::failure_after`'s rule (no failover once
/// a chunk was released).
fn too_large_outcome(too_large: &TooLarge, released: u64) -> Outcome {
    let reason = crate::domain::stream::too_large_reason(too_large.cap);
    tracing::warn!(released, "{reason}: the attempt fails");
    Outcome::Failed(crate::domain::outcome::Reason::invalid_output(reason))
}

/// Where a streaming call's deltas go: released to the job's followers,
/// or held while the answer must be judged whole.
struct Outlet {
    writer: StreamWriter,
    held: Option<Vec<Delta>>,
}

impl Outlet {
    /// Releases a delta, or holds it while the answer must be judged whole.
    fn release(&mut self, delta: &Delta) -> Result<(), TooLarge> {
        match self.held.as_mut() {
            Some(held) => {
                held.push(delta.clone());
                Ok(())
            }
            None => self.writer.release(delta),
        }
    }

    /// Releases the deltas left in the channel, up to one refused.
    fn drain(&mut self, deltas: &mut mpsc::Receiver<Delta>) -> Result<(), TooLarge> {
        while let Ok(delta) = deltas.try_recv() {
            self.release(&delta)?;
        }
        Ok(())
    }

    /// What a call that answered ends in: a held answer that succeeded is
    /// released now; one refused past the buffer cap fails.
    fn judged(&mut self, outcome: Outcome, mut refused: Option<TooLarge>) -> Outcome {
        if let (Some(held), Outcome::Succeeded(_), None) = (self.held.take(), &outcome, &refused) {
            for delta in &held {
                if let Err(too_large) = self.writer.release(delta) {
                    refused = Some(too_large);
                    break;
                }
            }
        }
        match refused {
            Some(too_large) => too_large_outcome(&too_large, self.writer.released()),
            None => outcome,
        }
    }

    /// What a call the worker stopped listening to ends in.
    fn stopped(&self, stop: Stop, timeouts: &StreamTimeouts) -> Outcome {
        match stop {
            Stop::TooLarge(too_large) => too_large_outcome(&too_large, self.writer.released()),
            Stop::TimedOut(waiting) => {
                // Closed: the provider may still be generating (and
                // billing), so the attempt is unknown, and nothing more of
                // this call is released.
                let reason = timeouts.reason(waiting);
                tracing::warn!(
                    released = self.writer.released(),
                    "{reason}: attempt is now unknown"
                );
                Outcome::Unknown(reason.into())
            }
        }
    }
}
