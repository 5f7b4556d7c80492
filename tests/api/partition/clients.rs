//! The clients of the run: the owner's creations (each answer recorded
//! for the history checker), support's resolution of an unknown attempt,
//! and what A's clients see while A is cut off.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::STEP;
use crate::history::{Answer, History};
use crate::support::harness::summarize;

/// What one client request got, and how long it took.
#[derive(Debug)]
pub struct Seen {
    pub what: String,
    pub answer: Answer,
    pub took: Duration,
}

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let answer = match &self.answer {
            Answer::Job { replayed, .. } => format!("a job (replayed: {replayed})"),
            Answer::Status(status) => format!("{status}"),
            Answer::Unanswered => "no answer".to_owned(),
        };
        let took = self.took.as_secs_f64();
        write!(f, "{}: {answer} after {took:.1} s", self.what)
    }
}

fn client(patience: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(patience)
        .build()
        .unwrap()
}

/// Creates the job of `key` through the process at `base`, waiting at most
/// `patience`; records the answer in `history`.
pub async fn create(
    history: &History,
    base: &str,
    token: &str,
    key: &str,
    patience: Duration,
) -> Seen {
    let started = Instant::now();
    let sent = client(patience)
        .post(format!("{base}/api/v1/jobs"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&summarize(key))
        .send()
        .await;
    let answer = match sent {
        Err(_) => Answer::Unanswered,
        Ok(response) if response.status().is_success() => {
            let replayed = response.headers().contains_key("idempotent-replayed");
            match response.json::<Value>().await {
                Ok(body) => Answer::Job { replayed, body },
                Err(_) => Answer::Unanswered,
            }
        }
        Ok(response) => Answer::Status(response.status().as_u16()),
    };
    history.record(key, answer.clone());
    Seen {
        what: format!("create {key}"),
        answer,
        took: started.elapsed(),
    }
}

/// Creates the job of `key` at `base`, trying again (same key) on anything
/// but an acknowledgement, for at most [`STEP`]: its id, and what the
/// client saw in all.
pub async fn create_until_acknowledged(
    history: &History,
    base: &str,
    token: &str,
    key: &str,
) -> (String, Seen) {
    let started = Instant::now();
    for tries in 1.. {
        let seen = create(history, base, token, key, Duration::from_secs(3)).await;
        if let Answer::Job { body, .. } = &seen.answer {
            let id = body["id"].as_str().unwrap().to_owned();
            let seen = Seen {
                what: format!("{} ({tries} tries)", seen.what),
                took: started.elapsed(),
                ..seen
            };
            return (id, seen);
        }
        assert!(started.elapsed() < STEP, "{seen}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unreachable!()
}

/// Support's resolution of an unknown attempt: abandoned, with a reason,
/// and the job's next attempt started on the backup provider. The new
/// attempt's id.
pub async fn resolve_on_backup(base: &str, token: &str, job_id: &str, attempt_id: &str) -> String {
    let client = client(Duration::from_secs(5));
    let abandoned = client
        .post(format!("{base}/api/v1/attempts/{attempt_id}/abandon"))
        .bearer_auth(token)
        .json(&json!({"reason": "its process is cut off from the database; retry on backup"}))
        .send()
        .await
        .unwrap();
    assert_eq!(abandoned.status(), StatusCode::OK, "abandon {attempt_id}");
    let started = client
        .post(format!("{base}/api/v1/jobs/{job_id}/attempts"))
        .bearer_auth(token)
        .json(&json!({"provider": "backup"}))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), StatusCode::CREATED, "a new attempt");
    let started: Value = started.json().await.unwrap();
    started["id"].as_str().unwrap().to_owned()
}

/// What A's clients see while A is cut off: a readiness probe and a
/// creation, each with a client's patience; then the creation retried
/// through B.
pub async fn of_a_meanwhile(
    history: Arc<History>,
    a: String,
    b: String,
    token: String,
) -> Vec<Seen> {
    let key = "created-while-a-is-cut-off";
    let started = Instant::now();
    let probe = client(Duration::from_secs(2))
        .get(format!("{a}/readyz"))
        .send()
        .await;
    let ready = Seen {
        what: "A's /readyz".to_owned(),
        answer: match probe {
            Ok(response) => Answer::Status(response.status().as_u16()),
            Err(_) => Answer::Unanswered,
        },
        took: started.elapsed(),
    };
    let through_a = create(&history, &a, &token, key, Duration::from_secs(3)).await;
    let (_, through_b) = create_until_acknowledged(&history, &b, &token, key).await;
    let through_b = Seen {
        what: format!("then through B, {}", through_b.what),
        ..through_b
    };
    vec![ready, through_a, through_b]
}
