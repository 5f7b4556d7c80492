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
use std::time::Duration;

use crate::chat::Delta;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Worker;
use crate::app::dispatch::Dispatch;
use crate::app::streams::{StreamWriter, TooLarge};
use crate::app::Claim;
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
    ) {
        let attempt_id = claim.attempt.key();
        let owner_id = claim.attempt.owner_id.clone();
        let provider = claim.attempt.provider.clone();
        let lease = Duration::from_millis(self.app.config().worker.lease_ms);
        let period = (lease / 3).max(Duration::from_millis(50));
        let mut heartbeat = tokio::time::interval_at(Instant::now() + period, period);
        let mut lease_until = Instant::now() + lease;
        let timeouts = dispatch.provider.stream_timeouts();
        let mut writer = self
            .app
            .open_stream(&claim.job.key(), &claim.attempt.id, &provider);
        // An answer that must match a schema is held whole until judged.
        let mut held: Option<Vec<Delta>> = (!dispatch.releases_as_generated()).then(Vec::new);
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
                _ = heartbeat.tick() => {
                    let renewed_at = Instant::now();
                    if self.renew_lease(&attempt_id.id, &owner_id).await {
                        lease_until = renewed_at + lease;
                    }
                }
                Some(delta) = deltas.recv() => {
                    last_chunk_at = Some(std::time::Instant::now());
                    if let Err(too_large) = release(&mut writer, held.as_mut(), &delta) {
                        break Err(Stop::TooLarge(too_large));
                    }
                }
                reply = &mut call => break Ok(reply),
                _ = tokio::time::sleep_until(Instant::from_std(deadline)) => break Err(Stop::TimedOut(waiting)),
            }
        };
        // What the call used, when it answered and said.
        let mut usage = None;
        let outcome = match answered {
            Ok(reply) => {
                // The call has ended, so its sender is gone: what is left
                // in the channel is all there is.
                let mut refused = None;
                while let Ok(delta) = deltas.try_recv() {
                    if let Err(too_large) = release(&mut writer, held.as_mut(), &delta) {
                        refused = Some(too_large);
                        break;
                    }
                }
                self.app
                    .metrics()
                    .observe_provider_call(&provider, sent_at.elapsed());
                let (outcome, reported) = self.settle(&provider, reply, slot.as_ref());
                usage = reported;
                if let (Some(held), Outcome::Succeeded(_), None) = (held, &outcome, &refused) {
                    for delta in &held {
                        if let Err(too_large) = writer.release(delta) {
                            refused = Some(too_large);
                            break;
                        }
                    }
                }
                match refused {
                    Some(too_large) => too_large_outcome(&too_large, writer.released()),
                    None => outcome,
                }
            }
            Err(Stop::TooLarge(too_large)) => {
                // Refused: nothing more of this call is read or released.
                drop(call);
                too_large_outcome(&too_large, writer.released())
            }
            Err(Stop::TimedOut(waiting)) => {
                // Closed: the provider may still be generating (and
                // billing), so the attempt is unknown, and nothing more of
                // this call is released.
                drop(call);
                let reason = timeouts.reason(waiting);
                tracing::warn!(
                    released = writer.released(),
                    "{reason}: attempt is now unknown"
                );
                Outcome::Unknown(reason.into())
            }
        };
        drop(slot);
        writer.flush().await;
        let released = writer.released();
        self.apply_released(
            &attempt_id,
            &provider,
            outcome,
            usage,
            lease_until,
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

/// Releases a delta, or holds it while the answer must be judged whole.
fn release(
    writer: &mut StreamWriter,
    held: Option<&mut Vec<Delta>>,
    delta: &Delta,
) -> Result<(), TooLarge> {
    match held {
        Some(held) => {
            held.push(delta.clone());
            Ok(())
        }
        None => writer.release(delta),
    }
}
