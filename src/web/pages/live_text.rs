//! `GET /jobs/{id}/stream`: a chat job's text as it streams, for its job
//! page (docs/browser.md, "Live text"). A `text/event-stream` that follows
//! the job's stream through `app::streams`, from its first chunk (or the
//! one after `Last-Event-ID`), for the signed-in owner only: anyone else
//! gets the same `404` as for a job that does not exist.
//!
//! Its events, each with the `id:` of the job's stream (the same numbers as
//! `/v1/chat/completions` gives its chunks):
//!
//! - `text`: `{"text": "…"}`, the content of one released chunk (chunks
//!   without text, a tool call say, are passed over). The page inserts it
//!   as text, never as HTML: the answer is untrusted.
//! - `end`: `{"status": "succeeded" | "failed" | "unknown" | "pending",
//!   "message": "…"}` once the job has ended or waits for a person; the page
//!   then shows the job's final state.
//! - `refused`: `{"message": "…"}` when the job's stream already has
//!   `server.max_followers_per_job` followers; the page says so and still
//!   reaches the answer by its usual refresh.
//!
//! A stream that stays quiet for `server.max_wait_seconds` (or meets a busy
//! database) ends without a terminal event: the browser's `EventSource`
//! reconnects on its own, after the `retry:` it was given, with the
//! `Last-Event-ID` of the last text it received.

use std::convert::Infallible;

use actix_web::http::header;
use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::stream;
use serde_json::{json, Value};

use super::{PageError, SignedIn};
use crate::app::streams::{Followed, Follower};
use crate::app::{App, Job};
use crate::chat::openai_chat::{self, StoredAnswer, WireDelta};
use crate::domain::{JobId, JobStatus};
use crate::web::chat_door::{parse_event_id, KEEPALIVE};

/// How long the browser waits before reconnecting a stream that ended
/// without a terminal event.
const RECONNECT_MS: u64 = 1000;

/// Whether a job's page follows its text live: a chat request that asked
/// for a stream (its upstream call streams) and has not finished.
pub fn streams_live(job: &Job) -> bool {
    !job.status.is_terminal()
        && openai_chat::read_request_text(job.input.as_str()).is_ok_and(|read| read.request.stream)
}

/// The text of a released delta, if it has some.
fn text_of(delta: &str) -> Option<String> {
    WireDelta::read(delta)
        .delta()
        .text
        .filter(|text| !text.is_empty())
}

/// The text of a stored answer (a chat completion's message).
fn answer_text(job: &Job) -> Option<String> {
    let result = job.result.as_ref()?.value();
    StoredAnswer::read(&result)
        .answer()
        .text
        .filter(|text| !text.is_empty())
}

/// One event's text.
fn event(id: Option<i64>, name: &str, data: &Value) -> String {
    match id {
        Some(id) => format!("id: {id}\nevent: {name}\ndata: {data}\n\n"),
        None => format!("event: {name}\ndata: {data}\n\n"),
    }
}

/// What the page is told when the job ends without an answer, or waits.
fn ending(job: &Job, needs_support: bool) -> Value {
    let message = match job.status {
        JobStatus::Succeeded => "The answer is complete.".to_owned(),
        JobStatus::Failed => job.failure().map_or_else(
            || "The job failed.".to_owned(),
            |reason| format!("The job failed: {}", reason.for_owner()),
        ),
        JobStatus::Cancelled => "The job was cancelled: it gets no answer.".to_owned(),
        JobStatus::Unknown => "The provider stopped answering: the outcome is unknown, \
                               and the text above may be all there is until support resolves it."
            .to_owned(),
        _ if needs_support => "The job waits for support: its last attempt was abandoned \
                               and no new one has started."
            .to_owned(),
        _ => String::new(),
    };
    json!({"status": job.status.as_str(), "message": message})
}

/// `GET /jobs/{id}/stream`.
pub async fn job_stream(
    app: web::Data<App>,
    user: SignedIn,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, PageError> {
    let job_id = JobId::parse(&path).ok_or_else(PageError::not_found)?;
    let (job, _) = app.job_for(&user.user, &job_id).await?;
    // Owner-only, staff included: the same answer as a job that is not there.
    if job.owner_id != user.user.id {
        return Err(PageError::not_found());
    }
    let resume = match req.headers().get("Last-Event-ID") {
        None => 0,
        Some(value) => parse_event_id(value.as_bytes()).ok_or_else(|| {
            PageError::bad_request(
                "Last-Event-ID must be the id of an event of this stream: a whole number, 0 or more.",
            )
        })?,
    };
    let mut response = HttpResponse::Ok();
    response
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-cache"));
    let first = format!("retry: {RECONNECT_MS}\n\n");
    let follower = match app.follow_stream(job.clone(), resume, app.max_wait()) {
        Ok(follower) => follower,
        Err(refused) => {
            let message = format!(
                "The live text is not shown: {refused}. This page shows the answer once the job ends."
            );
            let text = first + &event(None, "refused", &json!({ "message": message }));
            return Ok(response.body(text));
        }
    };
    let walk = Walk {
        follower,
        last_sent: resume,
        ended: false,
        first: Some(first),
    };
    Ok(
        response.streaming(stream::unfold(walk, |mut walk| async move {
            let text = walk.next_text().await?;
            Some((Ok::<_, Infallible>(Bytes::from(text)), walk))
        })),
    )
}

/// One page's walk along the job's stream.
struct Walk {
    follower: Follower,
    /// The id of the last event the page has.
    last_sent: i64,
    ended: bool,
    /// What is sent before anything else (the reconnect delay).
    first: Option<String>,
}

impl Walk {
    /// The next events' text; `None` once the stream has ended.
    async fn next_text(&mut self) -> Option<String> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        if self.ended {
            return None;
        }
        loop {
            // A busy database ends the response here: the browser reconnects.
            let Ok(Some(followed)) = self.follower.next().await else {
                return None;
            };
            return Some(match followed {
                Followed::Chunk(chunk) => {
                    let Some(text) = text_of(&chunk.delta) else {
                        continue;
                    };
                    self.last_sent = chunk.seq;
                    event(Some(chunk.seq), "text", &json!({ "text": text }))
                }
                Followed::Finished { job, chunks } => {
                    self.ended = true;
                    let mut text = String::new();
                    let mut n = chunks;
                    // An answer that was not streamed arrives whole.
                    if chunks == 0 {
                        n = 1;
                        if let Some(answer) = answer_text(&job).filter(|_| self.last_sent < 1) {
                            text.push_str(&event(Some(1), "text", &json!({ "text": answer })));
                        }
                    }
                    let end = (n + 1).max(self.last_sent + 1);
                    text.push_str(&event(Some(end), "end", &ending(&job, false)));
                    text
                }
                Followed::Ended { job, needs_support } => {
                    self.ended = true;
                    let end = self.last_sent + 1;
                    event(Some(end), "end", &ending(&job, needs_support))
                }
                // Quiet for the whole wait: the browser reconnects.
                Followed::StillWaiting { .. } => return None,
                Followed::Quiet => KEEPALIVE.to_owned(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_deltas_text_is_sent() {
        assert_eq!(
            text_of(r#"{"content":"<b>hi</b>"}"#).as_deref(),
            Some("<b>hi</b>")
        );
        assert_eq!(text_of(r#"{"content":""}"#), None);
        assert_eq!(text_of(r#"{"tool_calls":[{"index":0}]}"#), None);
        assert_eq!(text_of("not json"), None);
    }

    #[test]
    fn an_event_carries_its_id_name_and_json_on_one_data_line() {
        let text = event(Some(3), "text", &json!({"text": "two\nlines"}));
        assert_eq!(
            text,
            "id: 3\nevent: text\ndata: {\"text\":\"two\\nlines\"}\n\n"
        );
        assert_eq!(
            event(None, "refused", &json!({"message": "m"})),
            "event: refused\ndata: {\"message\":\"m\"}\n\n"
        );
    }
}
