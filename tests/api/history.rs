//! A history checker for real runs (docs/design.md, "Invariants and what
//! enforces them"): a run records every client request and the answer it
//! got, every provider receipt, and the final rows; the checker then
//! verifies against that history the invariants the model checker proves
//! for the model (`tests/model`):
//!
//! - for every key, all acknowledged answers name one job, the job the
//!   final rows hold under the key;
//! - every provider receipt maps to one attempt row, which recorded
//!   `sent_at`, and no attempt id was received twice;
//! - every replayed result is the winner's: a replay that carried a result
//!   carried the final result of that job, and named the attempt the final
//!   rows say completed it;
//! - a job has at most one winner, and its result is the winner's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use serde_json::Value;

/// What a client saw for one request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// `201` or `200`: the job's body, and whether it was a replay.
    Job { replayed: bool, body: Value },
    /// Another status (a `503` to retry, say).
    Status(u16),
    /// No answer: the connection failed.
    Unanswered,
}

#[derive(Debug, Clone)]
pub struct Exchange {
    pub key: String,
    pub answer: Answer,
}

/// The final rows the checker reads: each job (key, id, result,
/// completed_by) and each attempt (id, job id, sent, won).
#[derive(Debug, Clone, Default)]
pub struct FinalRows {
    pub jobs: Vec<FinalJob>,
    pub attempts: Vec<FinalAttempt>,
}

#[derive(Debug, Clone)]
pub struct FinalJob {
    pub key: String,
    pub id: String,
    pub result: Option<Value>,
    pub completed_by: Option<String>,
}

#[derive(Debug, Clone)]
pub struct FinalAttempt {
    pub id: String,
    pub job_id: String,
    pub sent: bool,
    pub won: bool,
}

/// The history of a run, recorded as it happens (shared by the clients).
#[derive(Debug, Default)]
pub struct History {
    exchanges: Mutex<Vec<Exchange>>,
}

impl History {
    pub fn record(&self, key: &str, answer: Answer) {
        self.exchanges.lock().unwrap().push(Exchange {
            key: key.to_owned(),
            answer,
        });
    }

    pub fn exchanges(&self) -> Vec<Exchange> {
        self.exchanges.lock().unwrap().clone()
    }
}

/// What the checker found.
#[derive(Debug)]
pub struct Verdict {
    pub exchanges: usize,
    /// Answered `503` (retried under the same key).
    pub busy: usize,
    pub acknowledged: usize,
    pub replays_with_result: usize,
    pub receipts: usize,
    pub jobs: usize,
    pub attempts: usize,
    pub violations: Vec<String>,
}

impl Verdict {
    pub fn line(&self) -> String {
        format!(
            "history: {} client exchanges ({} acknowledged, {} answered 503, {} replays carrying a result), \
             {} provider receipts, {} jobs and {} attempts in the final rows; verdict: {}",
            self.exchanges,
            self.acknowledged,
            self.busy,
            self.replays_with_result,
            self.receipts,
            self.jobs,
            self.attempts,
            if self.violations.is_empty() {
                "consistent (every key names one job, every receipt one sent attempt, every \
                 replayed result the winner's)"
                    .to_owned()
            } else {
                format!("{} violations", self.violations.len())
            }
        )
    }
}

/// Checks `exchanges`, the provider's `receipts` (the attempt id each
/// request carried) and the `rows` against one another.
pub fn check(exchanges: &[Exchange], receipts: &[Option<String>], rows: &FinalRows) -> Verdict {
    let mut violations = Vec::new();
    let job_by_key: HashMap<&str, &FinalJob> =
        rows.jobs.iter().map(|j| (j.key.as_str(), j)).collect();
    if job_by_key.len() != rows.jobs.len() {
        violations.push("two jobs under one key in the final rows".to_owned());
    }
    let job_by_id: HashMap<&str, &FinalJob> =
        rows.jobs.iter().map(|j| (j.id.as_str(), j)).collect();
    let attempt_by_id: HashMap<&str, &FinalAttempt> =
        rows.attempts.iter().map(|a| (a.id.as_str(), a)).collect();

    // Every key's acknowledged answers name one job: the key's.
    let mut named: BTreeMap<&str, HashSet<&str>> = BTreeMap::new();
    let mut acknowledged = 0;
    let mut replays_with_result = 0;
    for exchange in exchanges {
        let Answer::Job { replayed, body } = &exchange.answer else {
            continue;
        };
        acknowledged += 1;
        let Some(id) = body["id"].as_str() else {
            violations.push(format!(
                "{}: an acknowledgement without a job id",
                exchange.key
            ));
            continue;
        };
        named.entry(&exchange.key).or_default().insert(id);
        match job_by_key.get(exchange.key.as_str()) {
            Some(job) if job.id == id => {}
            Some(job) => violations.push(format!(
                "{}: acknowledged with job {id}, but the key's job is {}",
                exchange.key, job.id
            )),
            None => violations.push(format!(
                "{}: acknowledged with job {id}, which the final rows do not hold",
                exchange.key
            )),
        }
        // Every replayed result is the winner's.
        if *replayed && !body["result"].is_null() {
            replays_with_result += 1;
            let Some(job) = job_by_id.get(id) else {
                continue;
            };
            if job.result.as_ref() != Some(&body["result"]) {
                violations.push(format!(
                    "{}: a replay carried a result that is not the job's final result",
                    exchange.key
                ));
            }
            if body["completed_by"].as_str() != job.completed_by.as_deref() {
                violations.push(format!(
                    "{}: a replay named {:?} the winner, the rows {:?}",
                    exchange.key, body["completed_by"], job.completed_by
                ));
            }
        }
    }
    for (key, ids) in &named {
        if ids.len() > 1 {
            violations.push(format!(
                "{key}: acknowledged with {} jobs: {ids:?}",
                ids.len()
            ));
        }
    }

    // Every provider receipt maps to one attempt row, sent, received once.
    let mut received = HashSet::new();
    for receipt in receipts {
        let Some(id) = receipt.as_deref() else {
            violations.push("a provider receipt without an attempt id".to_owned());
            continue;
        };
        if !received.insert(id) {
            violations.push(format!("attempt {id} received twice"));
        }
        match attempt_by_id.get(id) {
            Some(attempt) if attempt.sent => {}
            Some(_) => violations.push(format!("attempt {id} was received without sent_at")),
            None => violations.push(format!("receipt {id} names no attempt row")),
        }
    }

    // At most one winner per job, and its result is the winner's.
    let mut winners: HashMap<&str, Vec<&str>> = HashMap::new();
    for attempt in rows.attempts.iter().filter(|a| a.won) {
        winners
            .entry(&attempt.job_id)
            .or_default()
            .push(&attempt.id);
    }
    for job in &rows.jobs {
        let won = winners.get(job.id.as_str()).cloned().unwrap_or_default();
        let consistent = match (won.as_slice(), &job.completed_by) {
            ([], None) => true,
            ([w], Some(by)) => w == by && job.result.is_some(),
            _ => false,
        };
        if !consistent {
            violations.push(format!(
                "job {}: winners {won:?}, completed_by {:?}",
                job.id, job.completed_by
            ));
        }
    }
    Verdict {
        exchanges: exchanges.len(),
        busy: exchanges
            .iter()
            .filter(|e| matches!(e.answer, Answer::Status(503)))
            .count(),
        acknowledged,
        replays_with_result,
        receipts: receipts.len(),
        jobs: rows.jobs.len(),
        attempts: rows.attempts.len(),
        violations,
    }
}

/// Reads the final rows of `store`, takes the provider's receipts from
/// `requests` (a qualification run's calls are not attempts), and checks
/// the run's history.
pub async fn check_run(
    history: &History,
    requests: &[crate::support::fake_provider::RecordedRequest],
    store: &onejob::store::Store,
) -> Verdict {
    use diesel::prelude::*;
    use onejob::domain::{AttemptId, JobId, JsonText, RaceResult};
    use onejob::store::schema::{attempts, jobs};
    let store = store.clone();
    let rows = tokio::task::spawn_blocking(move || {
        let conn = &mut store.conn().unwrap();
        let jobs = jobs::table
            .select((
                jobs::idempotency_key,
                jobs::id,
                jobs::result,
                jobs::completed_by,
            ))
            .load::<(String, JobId, Option<JsonText>, Option<AttemptId>)>(conn)
            .unwrap()
            .into_iter()
            .map(|(key, id, result, completed_by)| FinalJob {
                key,
                id: id.to_string(),
                result: result.map(|r| r.value()),
                completed_by: completed_by.map(|a| a.to_string()),
            })
            .collect();
        let attempts = attempts::table
            .select((
                attempts::id,
                attempts::job_id,
                attempts::sent_at,
                attempts::outcome,
            ))
            .load::<(AttemptId, JobId, Option<i64>, Option<RaceResult>)>(conn)
            .unwrap()
            .into_iter()
            .map(|(id, job_id, sent_at, outcome)| FinalAttempt {
                id: id.to_string(),
                job_id: job_id.to_string(),
                sent: sent_at.is_some(),
                won: outcome == Some(RaceResult::Won),
            })
            .collect();
        FinalRows { jobs, attempts }
    })
    .await
    .unwrap();
    let receipts: Vec<Option<String>> = requests
        .iter()
        .map(|r| r.header("x-request-id").map(str::to_owned))
        .filter(|id| !id.as_deref().is_some_and(|id| id.starts_with("qualify-")))
        .collect();
    check(&history.exchanges(), &receipts, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rows() -> FinalRows {
        FinalRows {
            jobs: vec![FinalJob {
                key: "k".into(),
                id: "j1".into(),
                result: Some(json!({"summary": "s"})),
                completed_by: Some("a1".into()),
            }],
            attempts: vec![FinalAttempt {
                id: "a1".into(),
                job_id: "j1".into(),
                sent: true,
                won: true,
            }],
        }
    }

    fn ack(id: &str, replayed: bool, result: Value) -> Exchange {
        Exchange {
            key: "k".into(),
            answer: Answer::Job {
                replayed,
                body: json!({"id": id, "result": result, "completed_by": "a1"}),
            },
        }
    }

    #[test]
    fn the_checker_accepts_a_consistent_history_and_names_each_breach() {
        let good = [
            ack("j1", false, Value::Null),
            ack("j1", true, json!({"summary": "s"})),
        ];
        let verdict = check(&good, &[Some("a1".into())], &rows());
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);

        let two_jobs = [ack("j1", false, Value::Null), ack("j2", true, Value::Null)];
        assert!(!check(&two_jobs, &[], &rows()).violations.is_empty());
        let other_result = [ack("j1", true, json!({"summary": "other"}))];
        assert!(!check(&other_result, &[], &rows()).violations.is_empty());
        let twice = [Some("a1".to_owned()), Some("a1".to_owned())];
        assert!(!check(&[], &twice, &rows()).violations.is_empty());
        let stranger = [Some("a9".to_owned())];
        assert!(!check(&[], &stranger, &rows()).violations.is_empty());
    }
}
