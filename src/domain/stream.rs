//! The rules of a streamed answer (docs/design.md, "Streaming"): a stream
//! belongs to its job, and what its clients already saw binds what may
//! follow.
//!
//! A chunk counts as **released** once it is published to the job's
//! followers (in this process or through the database), whether or not a
//! client has read it yet: from then on some client may hold part of this
//! answer, and no other answer may be spliced onto it.

use std::time::{Duration, Instant};

use super::retry::Failure;

/// Whether a definite failure may still lead to a new attempt (a failover
/// or a retry): only while no chunk of the answer was released.
pub fn may_fail_over(released_chunks: u64) -> bool {
    released_chunks == 0
}

/// The kind of failure the job's next step is decided from: a failure after
/// a released chunk fails the job, whatever kind it was.
pub fn failure_after(released_chunks: u64, failure: Failure) -> Failure {
    if may_fail_over(released_chunks) {
        failure
    } else {
        Failure::PartlyDelivered
    }
}

/// Whether chunks may be released as they arrive. A task whose answer must
/// match an output schema is held whole until it is judged: a chunk of an
/// answer that turns out invalid would already have reached a client.
pub fn releases_as_generated(has_output_schema: bool) -> bool {
    !has_output_schema
}

/// Whether a stream that holds `buffered` bytes of released deltas may
/// release one of `next` bytes under its cap (`server.max_stream_bytes`).
///
/// Past the cap the answer is refused as too large: the delta is not
/// released, the call is dropped, and the attempt fails (`invalid_output`,
/// a definite failure: onejob refused the answer). What follows is the rule
/// for any failure ([`failure_after`]): with no chunk released yet the job
/// may fail over; with one released, the job fails, and its followers get a
/// terminal error event after what they saw.
pub fn fits_in_buffer(buffered: usize, next: usize, cap: usize) -> bool {
    buffered.saturating_add(next) <= cap
}

/// Why a streamed answer was refused past the buffer cap, for its `error`.
pub fn too_large_reason(cap: usize) -> String {
    format!(
        "the streamed answer is larger than the {cap} bytes a stream may hold (server.max_stream_bytes)"
    )
}

/// A streaming call's two clocks: the soft timeout until its first chunk,
/// then the idle timeout between chunks. Once the request was sent, either
/// makes the attempt `unknown` (the provider may still be generating).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamTimeouts {
    pub first_chunk: Duration,
    pub idle: Duration,
}

/// Which of the clocks a call is waiting on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    FirstChunk,
    NextChunk,
}

impl StreamTimeouts {
    /// When the call times out if nothing more arrives, and on which clock:
    /// `last_chunk_at` is when its latest chunk arrived, if any did.
    pub fn deadline(&self, sent_at: Instant, last_chunk_at: Option<Instant>) -> (Instant, Waiting) {
        match last_chunk_at {
            None => (sent_at + self.first_chunk, Waiting::FirstChunk),
            Some(at) => (at + self.idle, Waiting::NextChunk),
        }
    }

    /// Why the attempt became unknown, for its `error`.
    pub fn reason(&self, waiting: Waiting) -> String {
        match waiting {
            Waiting::FirstChunk => format!(
                "no answer within the soft timeout of {} ms",
                self.first_chunk.as_millis()
            ),
            Waiting::NextChunk => format!(
                "the stream stalled: no chunk within the idle timeout of {} ms",
                self.idle.as_millis()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failover_is_allowed_only_while_nothing_was_released() {
        assert!(may_fail_over(0));
        assert!(!may_fail_over(1));
        assert_eq!(failure_after(0, Failure::Definite), Failure::Definite);
        let refused = Failure::NothingHappened {
            retry_after_ms: Some(5),
        };
        assert_eq!(failure_after(0, refused), refused);
        assert_eq!(failure_after(3, refused), Failure::PartlyDelivered);
        assert_eq!(
            failure_after(1, Failure::Definite),
            Failure::PartlyDelivered
        );
    }

    #[test]
    fn a_stream_takes_deltas_up_to_its_cap_and_no_further() {
        assert!(fits_in_buffer(0, 10, 10));
        assert!(fits_in_buffer(6, 4, 10));
        assert!(!fits_in_buffer(6, 5, 10));
        assert!(!fits_in_buffer(0, 11, 10));
        assert!(!fits_in_buffer(usize::MAX, 1, 10), "no overflow");
        assert!(too_large_reason(4096).contains("4096 bytes"));
    }

    #[test]
    fn a_schema_holds_the_answer_whole() {
        assert!(releases_as_generated(false));
        assert!(!releases_as_generated(true));
    }

    #[test]
    fn the_first_chunk_has_the_soft_timeout_and_later_ones_the_idle_timeout() {
        let timeouts = StreamTimeouts {
            first_chunk: Duration::from_millis(400),
            idle: Duration::from_millis(100),
        };
        let sent = Instant::now();
        assert_eq!(
            timeouts.deadline(sent, None),
            (sent + Duration::from_millis(400), Waiting::FirstChunk)
        );
        let chunk = sent + Duration::from_millis(350);
        assert_eq!(
            timeouts.deadline(sent, Some(chunk)),
            (chunk + Duration::from_millis(100), Waiting::NextChunk)
        );
        assert!(timeouts.reason(Waiting::NextChunk).contains("100 ms"));
        assert!(timeouts.reason(Waiting::FirstChunk).contains("400 ms"));
    }
}
