//! What the chat doors (`/v1/chat/completions`, `/v1/responses`,
//! `/v1/messages`) share: one error ([`error`]), one create-or-join flow
//! ([`create_or_join`]), and one walk along a job's stream
//! ([`stream_response`]) that each door's [`StreamFormat`] writes in its
//! own events. A door is then its authentication, its codec (`chat`), and
//! the shape of its answer.

pub mod error;

use std::convert::Infallible;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::web::Bytes;
use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder, ResponseError};
use futures_util::stream;

use crate::app::intake::JobRequest;
use crate::app::streams::{Followed, Follower};
use crate::app::{App, Attempt, Job};
use crate::chat::openai_chat::WireDelta;
use crate::chat::Delta;
use crate::domain::{IdempotencyKey, JobStatus, JsonText};
use crate::web::auth::{authenticate_api_key_or, authenticate_or, Caller};
pub use error::{ChatCompletions, ChatError, Door, Messages, Responses, Retry};
use error::{RETRY_IN_FLIGHT_SECONDS, RETRY_UNKNOWN_SECONDS};

/// What a quiet stream sends every `server.stream_keepalive_ms`: an SSE
/// comment, which clients (the SDKs' parsers, `EventSource`) pass over.
pub const KEEPALIVE: &str = ": keep-alive\n\n";

/// What a `Last-Event-ID` may be, for the OpenAPI document: an event id,
/// 1 to 18 decimal digits (so it always fits an `i64`).
pub const LAST_EVENT_ID_PATTERN: &str = "^[0-9]{1,18}$";

/// The id of a stream's event as a client sent it back (`Last-Event-ID`):
/// 1 to 18 decimal digits ([`LAST_EVENT_ID_PATTERN`]), else `None`.
pub fn parse_event_id(value: &[u8]) -> Option<i64> {
    std::str::from_utf8(value)
        .ok()
        .filter(|v| (1..=18).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse::<i64>().ok())
}

/// The `Last-Event-ID` a reconnecting client sent: the events after it
/// are sent. A value that is not an event id ([`LAST_EVENT_ID_PATTERN`]) is
/// a 400, on any request.
pub fn last_event_id<D: Door>(req: &HttpRequest) -> Result<Option<i64>, ChatError<D>> {
    let Some(value) = req.headers().get("Last-Event-ID") else {
        return Ok(None);
    };
    match parse_event_id(value.as_bytes()) {
        Some(id) => Ok(Some(id)),
        None => Err(ChatError::invalid_request(
            "Last-Event-ID must be the id of an event of this stream: a whole number, 0 or more",
        )
        .param("Last-Event-ID")),
    }
}

/// The request's `Idempotency-Key`, or the door's 400 for it.
pub fn idempotency_key<D: Door>(req: &HttpRequest) -> Result<IdempotencyKey, ChatError<D>> {
    super::idempotency::idempotency_key(req).map_err(ChatError::from)
}

/// A job that is not finished and has no live attempt (its last one was
/// abandoned and nobody started another): nothing will move it but support.
pub fn needs_support(job: &Job, attempts: &[Attempt]) -> bool {
    !job.status.is_terminal() && !attempts.iter().any(|a| a.state.is_live())
}

/// Why a job gives no answer (yet): the error for it, or `None` once it
/// succeeded. `needs_support`: it has no live attempt and is not finished.
pub fn job_error<D: Door>(job: &Job, needs_support: bool) -> Option<ChatError<D>> {
    use actix_web::http::StatusCode;
    if needs_support {
        return Some(
            ChatError::new(
                StatusCode::CONFLICT,
                format!(
                    "Job {id} is pending with no attempt in flight: its last attempt was abandoned \
                     and no new one was started, so nothing will answer this request until support \
                     acts. Support must start a new attempt (POST /api/v1/jobs/{id}/attempts, or the \
                     console's job page) or mark the job failed; until then, retrying with the same \
                     Idempotency-Key gets this answer.",
                    id = job.id
                ),
            )
            .code("job_needs_support")
            .retry(Retry::Never)
            .job(job),
        );
    }
    let error = match job.status {
        JobStatus::Succeeded => return None,
        JobStatus::Failed => {
            let reason = job.failure().map_or_else(
                || "no provider could answer".to_owned(),
                |reason| reason.for_owner(),
            );
            ChatError::new(
                StatusCode::FAILED_DEPENDENCY,
                format!("The request failed: {reason}"),
            )
            .code("job_failed")
            .retry(Retry::Never)
        }
        JobStatus::Cancelled => ChatError::new(
            StatusCode::CONFLICT,
            format!(
                "Job {} was cancelled by its owner: it has no answer and will get none. \
                 Use a new Idempotency-Key for a new request.",
                job.id
            ),
        )
        .code("job_cancelled")
        .retry(Retry::Never),
        JobStatus::Unknown => ChatError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "A provider call timed out and its outcome is unknown; onejob will not call \
             again until support resolves it. Retry later with the same Idempotency-Key.",
        )
        .code("outcome_unknown")
        .retry(Retry::After(RETRY_UNKNOWN_SECONDS)),
        JobStatus::Pending | JobStatus::Running => ChatError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "The request is still running. Retry with the same Idempotency-Key to rejoin it; \
             the provider is not called again.",
        )
        .code("job_in_progress")
        .retry(Retry::After(RETRY_IN_FLIGHT_SECONDS)),
    };
    Some(error.job(job))
}

/// How the client takes its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Waits for the job to finish (up to the server's wait).
    /// `ended_is_answer`: a failed or cancelled job is answered as it is
    /// (the format shows how it ended); else with its error.
    Wait { ended_is_answer: bool },
    /// Follows the job's stream. `while_live`: only while it may still
    /// answer (an ended job is answered with its error instead); else the
    /// stream itself tells how the job ended.
    Stream { while_live: bool },
    /// Answered at once, however far the job has got.
    Background,
}

impl Delivery {
    /// A chat door's: the stream while the job may answer, else the wait.
    pub fn streamed_or_waited(stream: bool) -> Self {
        if stream {
            Self::Stream { while_live: true }
        } else {
            Self::Wait {
                ended_is_answer: false,
            }
        }
    }
}

/// Middleware for a door that takes the onejob API token as a bearer; a
/// refusal is the door's 401.
pub async fn require_bearer<D: Door + std::fmt::Debug>(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let refuse = |refusal| ChatError::<D>::from(refusal).error_response();
    authenticate_or(req, next, refuse).await
}

/// [`require_bearer`] for a door whose SDK sends its key as `x-api-key`
/// (Anthropic's), which takes either.
pub async fn require_api_key<D: Door + std::fmt::Debug>(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let refuse = |refusal| ChatError::<D>::from(refusal).error_response();
    authenticate_api_key_or(req, next, refuse).await
}

/// A door's request, as onejob makes or joins its job.
#[derive(Debug)]
pub struct DoorRequest {
    /// The chat route `model` names.
    pub route: String,
    /// The job's input: the request as a Chat Completions request.
    pub input: JsonText,
    /// What else the fingerprint covers (a door of another format keeps
    /// the body as sent here).
    pub params: Option<JsonText>,
    pub delivery: Delivery,
}

/// Where the flow left the job.
#[derive(Debug)]
pub enum Settled {
    /// Follow its stream.
    Stream { job: Job, replayed: bool },
    /// Answer it as it is: succeeded, or (in the background) in flight.
    Answer { job: Job, replayed: bool },
}

/// Makes the request's job, or joins the one its key made: a retry or a
/// concurrent duplicate never calls a provider again; the same key with
/// another body is a 409. A name that is not a chat route today is left
/// to creation, which answers a replay from the key's job before it looks
/// at today's configuration. What only a person can move on (an unknown
/// outcome, a job left with no attempt) is answered at once, not after the
/// whole wait.
pub async fn create_or_join<D: Door>(
    app: &App,
    caller: &Caller,
    key: IdempotencyKey,
    request: DoorRequest,
) -> Result<Settled, ChatError<D>> {
    let watch = app.watch_finishes();
    let created = app
        .create_job(
            &caller.0,
            &caller.1,
            key,
            JobRequest {
                task: request.route,
                input: request.input,
                provider: None,
                params: request.params,
                chat_route: true,
            },
        )
        .await?;
    let stuck = needs_support(&created.job, &created.attempts);
    let replayed = created.replayed;
    match request.delivery {
        Delivery::Background => Ok(Settled::Answer {
            job: created.job,
            replayed,
        }),
        Delivery::Stream { while_live } => {
            let live = matches!(
                created.job.status,
                JobStatus::Pending | JobStatus::Running | JobStatus::Succeeded
            ) && !stuck;
            match job_error(&created.job, stuck).filter(|_| while_live && !live) {
                Some(error) => Err(error),
                None => Ok(Settled::Stream {
                    job: created.job,
                    replayed,
                }),
            }
        }
        Delivery::Wait { ended_is_answer } => {
            let (job, attempts) = if created.job.status == JobStatus::Unknown || stuck {
                (created.job, created.attempts)
            } else {
                app.wait_for_answer(watch, created.job, created.attempts)
                    .await?
            };
            let shown = ended_is_answer && job.status.is_terminal();
            match job_error(&job, needs_support(&job, &attempts)).filter(|_| !shown) {
                Some(error) => Err(error),
                None => Ok(Settled::Answer { job, replayed }),
            }
        }
    }
}

/// A 200 for `job`: `X-Onejob-Job-Id` names it, `Idempotent-Replayed`
/// says when the key had made it already.
pub fn answered(job: &Job, replayed: bool) -> HttpResponseBuilder {
    let mut response = HttpResponse::Ok();
    response.insert_header(("X-Onejob-Job-Id", job.id.to_string()));
    if replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    response
}

/// A door's events for one request's walk along a job's stream; each
/// returns the text to send (empty: nothing to send for it).
pub trait StreamFormat: Send + 'static {
    type Door: Door + std::fmt::Debug;

    /// What opens the stream.
    fn opening(&mut self) -> String;
    /// A released piece of the answer, the stream's chunk `seq`.
    fn chunk(&mut self, seq: i64, delta: &Delta) -> String;
    /// What ends a succeeded job's stream, after its `chunks` chunks (none
    /// stored: the answer is sent whole first).
    fn finished(&mut self, job: &Job, chunks: i64) -> String;
    /// What ends a stream that cannot go on (the database failed).
    fn failed(&mut self, error: ChatError<Self::Door>) -> String;
    /// What ends the stream of a job with no answer.
    fn ended(&mut self, job: &Job, needs_support: bool) -> String {
        match job_error::<Self::Door>(job, needs_support) {
            Some(error) => self.failed(error),
            None => String::new(),
        }
    }
}

/// The response that follows `job`'s stream from its chunk `from`, in
/// `format`'s events (a `429` when the job's stream has as many followers
/// as allowed).
pub fn stream_response<F: StreamFormat>(
    app: &App,
    job: Job,
    replayed: bool,
    from: i64,
    format: F,
) -> HttpResponse {
    let follower = match app.follow_stream(job.clone(), from, app.max_wait()) {
        Ok(follower) => follower,
        Err(refused) => {
            return ChatError::<F::Door>::too_many_followers(&job, &refused).error_response()
        }
    };
    let walk = Walk {
        format,
        follower,
        opened: false,
        ended: false,
    };
    answered(&job, replayed)
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .streaming(stream::unfold(walk, |mut walk| async move {
            let text = walk.next_text().await?;
            Some((Ok::<_, Infallible>(Bytes::from(text)), walk))
        }))
}

/// One request's walk along the stream.
struct Walk<F> {
    format: F,
    follower: Follower,
    opened: bool,
    ended: bool,
}

impl<F: StreamFormat> Walk<F> {
    /// The next events' text; `None` once the stream has ended.
    async fn next_text(&mut self) -> Option<String> {
        loop {
            if self.ended {
                return None;
            }
            let text = if self.opened {
                self.next_followed().await?
            } else {
                self.opened = true;
                self.format.opening()
            };
            // A chunk this client already has (before its Last-Event-ID)
            // may move the format on and send nothing.
            if !text.is_empty() {
                return Some(text);
            }
        }
    }

    async fn next_followed(&mut self) -> Option<String> {
        let followed = match self.follower.next().await {
            Ok(Some(followed)) => followed,
            Ok(None) => return None,
            Err(error) => {
                self.ended = true;
                return Some(self.format.failed(ChatError::from(error)));
            }
        };
        Some(match followed {
            Followed::Chunk(chunk) => {
                let delta = WireDelta::read(&chunk.delta).delta();
                self.format.chunk(chunk.seq, &delta)
            }
            Followed::Finished { job, chunks } => {
                self.ended = true;
                self.format.finished(&job, chunks)
            }
            Followed::Ended { job, needs_support } => {
                self.ended = true;
                self.format.ended(&job, needs_support)
            }
            Followed::StillWaiting { job } => {
                self.ended = true;
                self.format.ended(&job, false)
            }
            Followed::Quiet => KEEPALIVE.to_owned(),
        })
    }
}
