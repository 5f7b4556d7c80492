//! The load a full disk meets: clients creating jobs concurrently, each
//! under its own idempotency keys, each retrying a key that got a 503 (as
//! the problem document asks) until it is acknowledged. Every answer is
//! tallied; one that breaks the rules (a 500, a 503 that is not a clear
//! problem, a dropped connection) is kept in [`Tally::wrong`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::support::harness::summarize;

/// What the clients saw.
#[derive(Debug, Default)]
pub struct Tally {
    /// Answers by HTTP status.
    pub by_status: BTreeMap<u16, u64>,
    /// Acknowledged creations (a 201, or a 200 replay): key → job id.
    pub acknowledged: BTreeMap<String, String>,
    /// When each acknowledgement arrived.
    pub acknowledged_at: Vec<Instant>,
    /// The `detail` of each 503, and how often it came.
    pub unavailable: BTreeMap<String, u64>,
    /// Answers that break the rules, as read.
    pub wrong: Vec<String>,
    /// Requests that got no HTTP answer at all.
    pub no_answer: u64,
}

impl Tally {
    /// Acknowledgements that arrived after `since`.
    pub fn acknowledged_after(&self, since: Instant) -> usize {
        self.acknowledged_at
            .iter()
            .filter(|at| **at > since)
            .count()
    }

    /// How many 503s there were so far.
    pub fn unavailable_count(&self) -> u64 {
        self.by_status.get(&503).copied().unwrap_or(0)
    }

    /// `201: n, 200: n, 503: n`, by status.
    pub fn statuses(&self) -> String {
        self.by_status
            .iter()
            .map(|(status, n)| format!("{status}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Each 503 detail, quoted, with its count.
    pub fn details(&self) -> String {
        self.unavailable
            .iter()
            .map(|(detail, n)| format!("{n} × {detail:?}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

pub struct Load {
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<Tally>>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// `clients` concurrent clients against `base`, as the holder of
    /// `token`, each job's text `text_bytes` long (so the disk fills).
    pub fn start(base: &str, token: &str, clients: usize, text_bytes: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Mutex::new(Tally::default()));
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        let clients = (0..clients)
            .map(|client| {
                let client = Client {
                    id: client,
                    url: format!("{base}/api/v1/jobs"),
                    token: token.to_owned(),
                    text: "full disk ".repeat(text_bytes / 10),
                    http: http.clone(),
                    stop: stop.clone(),
                    tally: tally.clone(),
                };
                tokio::spawn(client.run())
            })
            .collect();
        Self {
            stop,
            tally,
            clients,
        }
    }

    /// Reads the tally as it stands.
    pub fn read<T>(&self, f: impl FnOnce(&Tally) -> T) -> T {
        f(&self.tally.lock().unwrap())
    }

    /// Waits until `done` holds of the tally; how long that took. Panics
    /// after `within`, naming `what`.
    pub async fn wait_for(
        &self,
        what: &str,
        within: Duration,
        done: impl Fn(&Tally) -> bool,
    ) -> Duration {
        match self.try_wait_for(within, done).await {
            Some(took) => took,
            None => panic!("{what}: not within {within:?}; {}", self.so_far()),
        }
    }

    /// Waits until `done` holds of the tally; how long that took, or
    /// `None` after `within`.
    pub async fn try_wait_for(
        &self,
        within: Duration,
        done: impl Fn(&Tally) -> bool,
    ) -> Option<Duration> {
        let started = Instant::now();
        while !self.read(&done) {
            if started.elapsed() > within {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Some(started.elapsed())
    }

    /// The answers so far, and those that broke the rules.
    pub fn so_far(&self) -> String {
        self.read(|t| format!("so far {}; wrong answers: {:?}", t.statuses(), t.wrong))
    }

    /// Stops the clients (each finishes the request it is in, 25 s at
    /// most) and hands back what they saw.
    pub async fn stop(self) -> Tally {
        self.stop.store(true, Ordering::SeqCst);
        for client in self.clients {
            tokio::time::timeout(Duration::from_secs(25), client)
                .await
                .expect("a load client stops within 25 s")
                .expect("a load client ran to its end");
        }
        Arc::try_unwrap(self.tally)
            .expect("the clients are gone")
            .into_inner()
            .unwrap()
    }
}

struct Client {
    id: usize,
    url: String,
    token: String,
    text: String,
    http: reqwest::Client,
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<Tally>>,
}

impl Client {
    /// Key after key; a key that got a 503 or no answer is sent again
    /// until acknowledged (or the load stops).
    async fn run(self) {
        let mut n = 0;
        while !self.stop.load(Ordering::SeqCst) {
            let key = format!("full-disk-{}-{n}", self.id);
            let body = summarize(&format!("{key}: {}", self.text));
            loop {
                let answered = self
                    .http
                    .post(&self.url)
                    .bearer_auth(&self.token)
                    .header("Idempotency-Key", &key)
                    .json(&body)
                    .send()
                    .await;
                let settled = match answered {
                    Ok(response) => self.read(&key, response).await,
                    Err(error) => {
                        let mut tally = self.tally.lock().unwrap();
                        tally.no_answer += 1;
                        tally.wrong.push(format!("{key}: no answer: {error}"));
                        false
                    }
                };
                if settled || self.stop.load(Ordering::SeqCst) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            n += 1;
        }
    }

    /// Tallies one answer; whether the key is settled (acknowledged, or
    /// answered in a way no retry mends).
    async fn read(&self, key: &str, response: reqwest::Response) -> bool {
        let status = response.status();
        let retry_after = response.headers().contains_key("retry-after");
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let mut tally = self.tally.lock().unwrap();
        *tally.by_status.entry(status.as_u16()).or_default() += 1;
        match status {
            StatusCode::CREATED | StatusCode::OK => match body["id"].as_str() {
                Some(id) => {
                    tally.acknowledged.insert(key.to_owned(), id.to_owned());
                    tally.acknowledged_at.push(Instant::now());
                    true
                }
                None => {
                    tally
                        .wrong
                        .push(format!("{key}: {status} without an id: {body}"));
                    true
                }
            },
            StatusCode::SERVICE_UNAVAILABLE => {
                let detail = body["detail"].as_str().unwrap_or_default().to_owned();
                let clear = retry_after
                    && content_type == "application/problem+json"
                    && body["type"] == "/problems/service-unavailable"
                    && !detail.is_empty();
                if !clear {
                    tally.wrong.push(format!(
                        "{key}: an unclear 503 (Retry-After: {retry_after}, {content_type}): {body}"
                    ));
                }
                *tally.unavailable.entry(detail).or_default() += 1;
                false
            }
            _ => {
                tally.wrong.push(format!("{key}: {status}: {body}"));
                true
            }
        }
    }
}
