//! Closed-loop load: `concurrency` clients, each sending its next request as
//! soon as the last one answered, for a fixed time.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one timed run saw.
#[derive(Debug, Default)]
pub struct Run {
    pub latencies: Vec<Duration>,
    pub errors: u64,
    pub first_error: Option<String>,
    pub elapsed: Duration,
}

impl Run {
    pub fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }

    pub fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        if sorted.is_empty() {
            return Duration::ZERO;
        }
        sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
    }

    pub fn p50(&self) -> Duration {
        self.percentile(0.50)
    }

    pub fn p99(&self) -> Duration {
        self.percentile(0.99)
    }

    pub fn summary(&self) -> String {
        let errors = match &self.first_error {
            Some(e) => format!(", {} errors (first: {e})", self.errors),
            None => String::new(),
        };
        format!(
            "{} ok in {:.1} s = {:.0}/s, p50 {} p99 {} max {}{errors}",
            self.latencies.len(),
            self.elapsed.as_secs_f64(),
            self.rate(),
            ms(self.p50()),
            ms(self.p99()),
            ms(self.percentile(1.0)),
        )
    }
}

pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// A duration in whole microseconds, for differences finer than `ms` shows.
pub fn us(d: Duration) -> String {
    format!("{} µs", d.as_micros())
}

/// Runs `request(n)` (n counts up from 0 across all clients) from
/// `concurrency` clients until `duration` has passed; a request's latency
/// is the time it took.
pub async fn run<F, Fut>(concurrency: usize, duration: Duration, request: F) -> Run
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    run_measured(concurrency, duration, move |n| {
        let request = request.clone();
        async move {
            let sent = Instant::now();
            request(n).await.map(|()| sent.elapsed())
        }
    })
    .await
}

/// Like [`run`], but each request reports the latency it measured itself
/// (the time to its first token, say).
pub async fn run_measured<F, Fut>(concurrency: usize, duration: Duration, request: F) -> Run
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Duration, String>> + Send,
{
    let counter = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let mut clients = Vec::new();
    for _ in 0..concurrency {
        let (request, counter) = (request.clone(), counter.clone());
        clients.push(tokio::spawn(async move {
            let mut run = Run::default();
            while Instant::now() < deadline {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                match request(n).await {
                    Ok(latency) => run.latencies.push(latency),
                    Err(error) => {
                        run.errors += 1;
                        run.first_error.get_or_insert(error);
                    }
                }
            }
            run
        }));
    }
    let mut total = Run::default();
    for client in clients {
        let run = client.await.expect("a load client panicked");
        total.latencies.extend(run.latencies);
        total.errors += run.errors;
        if total.first_error.is_none() {
            total.first_error = run.first_error;
        }
    }
    total.elapsed = started.elapsed();
    total
}

/// Sends `requests` all at once (each its own client) and waits for all.
pub async fn burst<F, Fut>(requests: usize, request: F) -> Run
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let started = Instant::now();
    let gate = Arc::new(tokio::sync::Barrier::new(requests));
    let mut clients = Vec::new();
    for n in 0..requests as u64 {
        let (request, gate) = (request.clone(), gate.clone());
        clients.push(tokio::spawn(async move {
            gate.wait().await;
            let sent = Instant::now();
            request(n).await.map(|()| sent.elapsed())
        }));
    }
    let mut total = Run::default();
    for client in clients {
        match client.await.expect("a burst client panicked") {
            Ok(latency) => total.latencies.push(latency),
            Err(error) => {
                total.errors += 1;
                total.first_error.get_or_insert(error);
            }
        }
    }
    total.elapsed = started.elapsed();
    total
}
