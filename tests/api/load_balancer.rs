//! A load balancer that keeps the identity (docs/deployment.md, "Routing
//! by key"): a real nginx running `deploy/nginx.conf` in front of three
//! onejob processes on one PostgreSQL database. Requests under one
//! idempotency key reach one process, so duplicates in flight meet in
//! memory and a duplicate of a stream follows it live; when that process
//! dies, its keys go to the others, where the database has their jobs.
//!
//! Each scenario prints its figures and keeps them for `.ci/run`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::balanced::{Balanced, LEASE_MS};
use crate::support::fake_provider::{Behaviour, FakeProvider, Shape, StreamStep};
use crate::support::harness::{
    record_figures, spawn_app_with, summarize, test_config, FormClient, TestBackend,
};
use crate::support::metrics::metric_sum;
use crate::support::nginx::{nginx_available, shipped_config, test_copy, Nginx};
use crate::support::sse::{content_of, SseEvent, SseReader};

/// How many duplicates are sent at once.
const DUPLICATES: usize = 20;

/// A streaming chat request's body.
fn streaming(text: &str) -> Value {
    json!({
        "model": "gpt-stream",
        "messages": [{"role": "user", "content": text}],
        "stream": true,
    })
}

/// The job a response names (`X-Onejob-Job-Id`).
fn job_of(response: &reqwest::Response) -> String {
    response.headers()["x-onejob-job-id"]
        .to_str()
        .unwrap()
        .to_owned()
}

/// The ids of `events`, as numbers.
fn ids_of(events: &[SseEvent]) -> Vec<i64> {
    events
        .iter()
        .filter_map(|e| e.id.as_deref()?.parse().ok())
        .collect()
}

#[tokio::test]
async fn nginx_t_passes_on_the_test_copy_of_deploy_nginx_conf() {
    let Some(binary) = nginx_available() else {
        return;
    };
    let upstreams = ["127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003"].map(String::from);
    let shipped = shipped_config();
    let copy = test_copy(&shipped, &upstreams, 18080, 18081);
    // Only what a deployment fills in differs: every location, upstream,
    // map and proxy directive is tested as shipped.
    let changed: Vec<&str> = shipped
        .lines()
        .filter(|line| !copy.lines().any(|kept| kept == *line))
        .map(str::trim)
        .collect();
    for line in &changed {
        assert!(
            line.starts_with("listen ")
                || line.starts_with("ssl_certificate")
                || line.starts_with("server 10.0.0."),
            "the test copy changed {line:?}"
        );
    }
    let nginx = Nginx::configure(binary, &upstreams);
    let (passed, said) = nginx.check();
    eprintln!("load balancer: nginx -t on the test copy of deploy/nginx.conf:\n{said}");
    assert!(passed, "nginx -t failed:\n{said}");
    assert!(said.contains("test is successful"), "{said}");
    record_figures(
        "load-balancer-nginx-t",
        &format!(
            "nginx -t on deploy/nginx.conf (test copy, {} lines changed of {}): passed",
            changed.len(),
            shipped.lines().count()
        ),
    );
}

/// The routes nginx sends by the `Idempotency-Key` header.
const KEYED_ROUTES: [&str; 4] = [
    "/api/v1/jobs",
    "/v1/chat/completions",
    "/v1/messages",
    "/v1/responses",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_key_carrying_route_goes_where_its_key_does_and_the_others_are_spread() {
    let up = FakeProvider::start(Shape::OpenAi).await;
    let Some(site) = Balanced::start(&up).await else {
        return;
    };
    // The ring hangs on the processes' ports, new each run, and may give
    // one process most of it: with 24 keys the chance that all land on one
    // is below one in a million even at two thirds of the ring (6 keys
    // once all landed on one).
    let keys: Vec<String> = (0..24).map(|i| format!("routed-{i}")).collect();
    // A browser's form post is answered with a redirect: its answer is the
    // one to look at, not the page it leads to.
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut homes = Vec::new();
    for key in &keys {
        let home = site.route_of(key).await;
        homes.push(home);
        // An empty body is refused before anything is created: only the
        // route matters here.
        for route in KEYED_ROUTES {
            let response = site
                .post(route)
                .header("Idempotency-Key", key)
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            assert!(response.status().is_client_error(), "{route}: {response:?}");
            assert_eq!(site.served(&response), home, "{route} under {key}");
        }
        // The browser's form, its key in its address (signed out: the
        // answer is the sign-in page, from the key's process).
        let form = browser
            .post(site.nginx.url(&format!("/jobs?idempotency_key={key}")))
            .form(&[("idempotency_key", key.as_str())])
            .send()
            .await
            .unwrap();
        assert_eq!(form.status(), StatusCode::SEE_OTHER, "to sign in: {form:?}");
        assert_eq!(site.served(&form), home, "the form under {key}");
    }
    let mut spread = BTreeMap::<&str, std::collections::BTreeSet<usize>>::new();
    for path in ["/healthz", "/api/v1/jobs", "/v1/models"] {
        for _ in 0..12 {
            let response = site
                .client
                .get(site.nginx.url(path))
                .bearer_auth(&site.token)
                .send()
                .await
                .unwrap();
            assert!(response.status().is_success(), "{path}: {response:?}");
            spread
                .entry(path)
                .or_default()
                .insert(site.served(&response));
        }
    }
    let figures = format!(
        "{} keys, each on one process for {} routes and the form: processes {homes:?}; \
         12 requests without a key reached processes {spread:?}; upstream calls {}",
        keys.len(),
        KEYED_ROUTES.len(),
        up.total_requests()
    );
    eprintln!("load balancer: {figures}");
    record_figures("load-balancer-routes", &figures);
    let distinct: std::collections::BTreeSet<_> = homes.iter().collect();
    assert!(distinct.len() > 1, "the keys are spread: {figures}");
    assert!(spread.values().all(|seen| seen.len() > 1), "{figures}");
    assert_eq!(up.total_requests(), 0, "nothing was created: {figures}");
}

/// Twenty copies of one request under one key, sent at once through
/// nginx, with `Prefer: wait` so that each waits for the answer.
async fn send_duplicates(site: &Balanced) -> Vec<reqwest::Response> {
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(DUPLICATES));
    let sends = (0..DUPLICATES).map(|_| {
        let request = site
            .post("/api/v1/jobs")
            .header("Idempotency-Key", "twenty-at-once")
            .header("Prefer", "wait=15")
            .json(&summarize("twenty copies of one request"));
        let barrier = barrier.clone();
        async move {
            barrier.wait().await;
            request.send().await.unwrap()
        }
    });
    futures::future::join_all(sends).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_duplicates_are_served_by_one_process_and_reach_the_upstream_once() {
    let up = FakeProvider::start(Shape::OpenAi).await;
    let Some(site) = Balanced::start(&up).await else {
        return;
    };
    // The provider holds the one call until every duplicate has arrived.
    up.set_default(Behaviour::Hold);
    let started = Instant::now();
    let (responses, ()) = tokio::join!(send_duplicates(&site), async {
        let held = up.wait_held_count(1).await;
        // Time for the other copies to arrive; what is asserted does not
        // depend on it.
        tokio::time::sleep(Duration::from_millis(500)).await;
        up.release(
            &held[0],
            Behaviour::Answer(json!({"summary": "one answer"})),
        );
    });
    let took = started.elapsed();

    let mut servers = BTreeMap::<usize, usize>::new();
    let mut statuses = BTreeMap::<u16, usize>::new();
    let mut jobs = BTreeMap::<String, usize>::new();
    for response in responses {
        *servers.entry(site.served(&response)).or_default() += 1;
        *statuses.entry(response.status().as_u16()).or_default() += 1;
        let job: Value = response.json().await.unwrap();
        assert_eq!(job["status"], "succeeded", "{job:#}");
        assert_eq!(job["result"]["summary"], "one answer", "{job:#}");
        *jobs
            .entry(job["id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    let mut answered = Vec::new();
    for index in 0..site.processes.len() {
        answered.push(site.answered_by(index, "POST", "/api/v1/jobs").await);
    }
    let figures = format!(
        "{DUPLICATES} concurrent duplicates through nginx: served by {} process(es) \
         (by nginx's X-Served-By: {servers:?}; POST /api/v1/jobs answered per process, \
         by its own metrics: {answered:?}); statuses {statuses:?}; jobs {}; \
         upstream calls {}; all answered in {} ms",
        servers.len(),
        jobs.len(),
        up.total_requests(),
        took.as_millis()
    );
    eprintln!("load balancer: {figures}");
    record_figures("load-balancer-duplicates", &figures);

    assert_eq!(servers.len(), 1, "one process served them all: {figures}");
    let holder = *servers.keys().next().unwrap();
    let mut expected = vec![0; site.processes.len()];
    expected[holder] = DUPLICATES as u64;
    assert_eq!(answered, expected, "{figures}");
    assert_eq!(jobs.len(), 1, "{figures}");
    assert_eq!(statuses.get(&201), Some(&1), "one creation: {figures}");
    assert_eq!(up.total_requests(), 1, "one upstream call: {figures}");
    let job_id = jobs.keys().next().unwrap();
    assert_eq!(
        site.senders_of(job_id).await,
        [site.processes[holder].pid],
        "sent by the process that took the requests"
    );
}

/// Opens a streaming chat request under `key` through nginx, with
/// `Last-Event-ID` when given: the process that answered, and its events.
async fn open_stream(site: &Balanced, key: &str, resume: Option<i64>) -> (usize, SseReader) {
    let mut request = site
        .post("/v1/chat/completions")
        .header("Idempotency-Key", key)
        .json(&streaming(key));
    if let Some(id) = resume {
        request = request.header("Last-Event-ID", id.to_string());
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{response:?}");
    (site.served(&response), SseReader::new(response))
}

/// The next event of `reader` with content, and when it came.
async fn next_content(reader: &mut SseReader) -> (SseEvent, Instant) {
    let event = reader.until_content().await.pop().unwrap();
    (event, Instant::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_of_a_running_stream_follows_it_live_from_the_same_process() {
    let up = FakeProvider::start(Shape::OpenAi).await;
    let Some(site) = Balanced::start(&up).await else {
        return;
    };
    up.push(Behaviour::Stream(vec![
        StreamStep::Text("live ".into()),
        StreamStep::Gate,
        StreamStep::Text("from ".into()),
        StreamStep::Gate,
        StreamStep::Text("one process".into()),
    ]));
    let (first_at, mut first) = open_stream(&site, "followed-live", None).await;
    let mut seen_first = first.until_content().await;
    up.wait_requests(1).await;
    let request_id = up.request_ids()[0].clone();
    let (duplicate_at, mut duplicate) = open_stream(&site, "followed-live", None).await;
    let mut seen_duplicate = duplicate.until_content().await;
    assert_eq!(content_of(&seen_duplicate), "live ", "the stream so far");
    // For comparison, what round-robin could give: the same request sent
    // straight to another process, which follows through the database.
    let elsewhere_at = (first_at + 1) % site.processes.len();
    let mut elsewhere = SseReader::new(
        site.client
            .post(format!(
                "{}/v1/chat/completions",
                site.processes[elsewhere_at].base
            ))
            .bearer_auth(&site.token)
            .header("Idempotency-Key", "followed-live")
            .json(&streaming("followed-live"))
            .send()
            .await
            .unwrap(),
    );
    let mut seen_elsewhere = elsewhere.until_content().await;

    // Both follow the stream in the process that runs it; the third
    // follows it in its own.
    let job_id = seen_first[0].json()["id"].as_str().unwrap()["chatcmpl-".len()..].to_owned();
    let mut followers = Vec::new();
    for index in 0..site.processes.len() {
        let exposition = site.metrics_of(index).await;
        followers.push(metric_sum(&exposition, "onejob_streams_followed", &[]) as u64);
    }
    let sender = site.senders_of(&job_id).await;

    // Live: the next chunk reaches both while the upstream is held at its
    // second gate, before the rest of the answer exists (the gate opens
    // only once both have it).
    up.wait_gate(&request_id, 1).await;
    up.open_gate(&request_id);
    let (
        (first_chunk, first_came),
        (duplicate_chunk, duplicate_came),
        (elsewhere_chunk, elsewhere_came),
    ) = tokio::join!(
        next_content(&mut first),
        next_content(&mut duplicate),
        next_content(&mut elsewhere)
    );
    let sent_when_all_had_it = up.chunks_sent(&request_id);
    let lag = duplicate_came.saturating_duration_since(first_came);
    let lag_elsewhere = elsewhere_came.saturating_duration_since(first_came);
    up.wait_gate(&request_id, 2).await;
    seen_first.push(first_chunk);
    seen_duplicate.push(duplicate_chunk);
    seen_elsewhere.push(elsewhere_chunk);
    up.open_gate(&request_id);
    seen_first.extend(first.rest().await);
    seen_duplicate.extend(duplicate.rest().await);
    seen_elsewhere.extend(elsewhere.rest().await);

    let figures = format!(
        "a stream and its duplicate through nginx: served by processes {first_at} and \
         {duplicate_at}; followers per process {followers:?}; the attempt sent by pid \
         {sender:?} (processes {:?}); the duplicate had the live chunk {} ms after the \
         first reader (the same request sent straight to process {elsewhere_at}, which \
         follows through the database: {} ms); upstream calls {}",
        site.processes.iter().map(|p| p.pid).collect::<Vec<_>>(),
        lag.as_millis(),
        lag_elsewhere.as_millis(),
        up.total_requests()
    );
    eprintln!("load balancer: {figures}");
    record_figures("load-balancer-live-duplicate", &figures);

    assert_eq!(duplicate_at, first_at, "one process: {figures}");
    let mut expected = vec![0; site.processes.len()];
    expected[first_at] = 2;
    expected[elsewhere_at] = 1;
    assert_eq!(followers, expected, "{figures}");
    assert_eq!(sender, [site.processes[first_at].pid], "{figures}");
    assert_eq!(
        sent_when_all_had_it, 2,
        "the live chunk came before the rest"
    );
    assert_eq!(content_of(&seen_first), "live from one process");
    assert_eq!(seen_duplicate, seen_first, "the same events, ids and all");
    assert_eq!(seen_elsewhere, seen_first, "the same events elsewhere too");
    assert!(seen_first.last().unwrap().is_done());
    assert_eq!(up.total_requests(), 1, "one upstream call");
}

/// Which process nginx routes each of `keys` to now.
async fn routes_of(site: &Balanced, keys: &[String]) -> Vec<usize> {
    let mut routes = Vec::new();
    for key in keys {
        routes.push(site.route_of(key).await);
    }
    routes
}

/// Waits (at most 10 s) until the database holds `n` chunks of `job_id`'s
/// stream: what a process in another place can replay.
async fn wait_stored(site: &Balanced, job_id: &str, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while site.stored_chunks(job_id).await < n {
        assert!(Instant::now() < deadline, "{n} chunks not stored in 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_process_that_holds_a_key_sends_its_keys_elsewhere_where_the_stream_resumes() {
    let up = FakeProvider::start(Shape::OpenAi).await;
    let Some(mut site) = Balanced::start(&up).await else {
        return;
    };
    up.push(Behaviour::Stream(vec![
        StreamStep::Text("before ".into()),
        StreamStep::Gate,
        StreamStep::Text("the kill".into()),
        StreamStep::Stall,
    ]));
    let key = "held-by-one".to_owned();
    let keys: Vec<String> = std::iter::once(key.clone())
        .chain((0..23).map(|i| format!("probe-{i}")))
        .collect();
    let before = routes_of(&site, &keys).await;

    // The client has the role chunk and chunk 1; chunk 2 is released and
    // stored, but its connection breaks before it reads it.
    let (holder, mut reader) = open_stream(&site, &key, None).await;
    assert_eq!(before[0], holder, "the key's POST went where its GET did");
    let seen = reader.until_content().await;
    assert_eq!(content_of(&seen), "before ");
    assert_eq!(ids_of(&seen), [0, 1]);
    let job_id = seen[0].json()["id"].as_str().unwrap()["chatcmpl-".len()..].to_owned();
    up.wait_requests(1).await;
    let request_id = up.request_ids()[0].clone();
    up.wait_gate(&request_id, 1).await;
    up.open_gate(&request_id);
    wait_stored(&site, &job_id, 2).await;
    let sender = site.senders_of(&job_id).await;
    assert_eq!(sender, [site.processes[holder].pid], "the holder sends it");

    site.processes[holder].kill();
    site.processes[holder]
        .wait_exit(Duration::from_secs(10))
        .await;
    drop(reader);
    let killed_at = Instant::now();

    // The reconnect, as an SSE client makes it: the same request under the
    // same key, with the last id it had.
    let (resumed_at, mut resumed) = open_stream(&site, &key, Some(1)).await;
    let rest = resumed.rest().await;
    let ended_after = killed_at.elapsed();
    let after = routes_of(&site, &keys).await;
    // Nothing claims the attempt again, however often the survivors look.
    tokio::time::sleep(Duration::from_millis(LEASE_MS / 2)).await;
    let upstream_calls = up.total_requests();
    let attempts = site.senders_of(&job_id).await.len();

    let moved = (0..keys.len()).filter(|&i| before[i] != after[i]).count();
    let on_holder = before.iter().filter(|&&p| p == holder).count();
    let stayed = (0..keys.len())
        .filter(|&i| before[i] != holder && before[i] == after[i])
        .count();
    let figures = format!(
        "kill -9 of the process holding a stream's key (process {holder}): the reconnect \
         (Last-Event-ID: 1) was served by process {resumed_at} and got {:?} (ids {:?}), \
         its end {} ms after the kill; of {} keys, {on_holder} were on the killed process \
         and {moved} moved, {stayed} of the others stayed where they were; upstream calls \
         {upstream_calls}, attempts {attempts}",
        rest.iter()
            .map(|e| e.content().or_else(|| e.error_code()).unwrap_or_default())
            .collect::<Vec<_>>(),
        ids_of(&rest),
        ended_after.as_millis(),
        keys.len()
    );
    eprintln!("load balancer: {figures}");
    record_figures("load-balancer-kill", &figures);

    assert_ne!(resumed_at, holder, "{figures}");
    assert_eq!(content_of(&rest), "the kill", "the rest, once: {figures}");
    assert_eq!(ids_of(&rest), [2, 3], "after the last id it had: {figures}");
    assert_eq!(
        rest.last().unwrap().error_code().as_deref(),
        Some("outcome_unknown"),
        "a clear error event: {figures}"
    );
    assert!(!rest.iter().any(SseEvent::is_done), "{figures}");
    assert!(after.iter().all(|&p| p != holder), "{figures}");
    assert_eq!(
        moved, on_holder,
        "only the killed process's keys moved: {figures}"
    );
    assert_eq!(stayed, keys.len() - on_holder, "{figures}");
    assert_eq!(upstream_calls, 1, "never sent again: {figures}");
    assert_eq!(attempts, 1, "{figures}");
}

/// Every event stream onejob makes says `X-Accel-Buffering: no`, so a
/// proxy passes each event on as it comes, whatever its settings for the
/// path: the three `/v1` doors' streams and a job page's live text.
async fn every_event_stream_says_x_accel_buffering_no(backend: TestBackend) {
    let up = FakeProvider::start(Shape::OpenAi).await;
    up.set_default(Behaviour::stream_of(&["un", "buffered"]));
    let mut config = test_config(&format!(
        "{}\n[[tasks]]\nname = \"gpt-stream\"\nkind = \"chat\"\nproviders = [\"up\"]\n",
        crate::support::fake_provider::ProviderToml::openai("up", &up.base_url)
            .timeout_ms(10_000)
            .toml()
    ));
    config.server.max_wait_seconds = 20;
    let app = spawn_app_with(backend, config).await;
    let doors = [
        ("/v1/chat/completions", streaming("chat")),
        (
            "/v1/messages",
            json!({"model": "gpt-stream", "max_tokens": 20, "stream": true,
                   "messages": [{"role": "user", "content": "messages"}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "gpt-stream", "input": "responses", "stream": true}),
        ),
    ];
    let mut job_id = String::new();
    for (path, body) in doors {
        let response = app
            .client
            .post(app.url(path))
            .bearer_auth(&app.alice.token)
            .header("Idempotency-Key", path)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_eq!(response.headers()["x-accel-buffering"], "no", "{path}");
        job_id = job_of(&response);
        SseReader::new(response).rest().await;
    }
    app.set_password("alice", "alice-password").await;
    let browser = FormClient::new(&app);
    browser.sign_in("alice", "alice-password").await;
    let page_stream = browser.get(&format!("/jobs/{job_id}/stream")).await;
    assert_eq!(page_stream.status(), StatusCode::OK);
    assert_eq!(page_stream.headers()["x-accel-buffering"], "no");
    assert!(page_stream.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    // Nothing else says it.
    let plain = app.get(&app.alice.token, "/api/v1/jobs").await;
    assert!(!plain.headers().contains_key("x-accel-buffering"));
}

on_both_backends!(every_event_stream_says_x_accel_buffering_no);
