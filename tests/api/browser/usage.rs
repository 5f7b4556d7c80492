//! The console's charts (`/admin`) and the usage ledger (`/admin/usage`),
//! read through the DOM of their SVG at 1280 and 390 px: a known set of
//! jobs (three answered, one refused, one race) on priced fake providers,
//! so that every count and every amount the pages draw is known exactly.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use diesel::prelude::*;
use onejob::store::ledger::LedgerEntry;
use onejob::store::schema::usage_ledger;
use reqwest::StatusCode;
use serde_json::{json, Value};

use super::held_provider_toml;
use crate::support::db::race_rows;
use crate::support::fake_provider::{
    config_of, strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{spawn_app_with, summarize, TestApp, TestBackend};
use crate::support::webdriver::Browser;

/// The whole scenario, browser included, ends within this.
const WITHIN: Duration = Duration::from_secs(60);

/// Prices per million tokens: `acme` dear, `backup` cheap; `refuser`, which
/// only ever refuses, has none.
const PRICES: &str = r#"
[ledger]
currency = "EUR"

[[ledger.prices]]
provider = "acme"
model = "fake-model"
input = 2.5
output = 10.0

[[ledger.prices]]
provider = "backup"
model = "fake-model"
input = 1.0
output = 4.0
"#;

/// An answer with this usage, in OpenAI's shape.
fn answer_using(summary: &str, prompt: u64, completion: u64) -> Behaviour {
    Behaviour::AnswerWithUsage {
        value: json!({ "summary": summary }),
        usage: json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0},
        }),
    }
}

/// One of acme's answers: 20 000 × 2.5 + 5 000 × 10 per million, 0.10 EUR.
const ACME_ANSWER: (u64, u64) = (20_000, 5_000);
/// acme's late answer, which loses the race: 40 000 × 2.5 + 10 000 × 10
/// per million, 0.20 EUR.
const ACME_LATE: (u64, u64) = (40_000, 10_000);
/// backup's answer, which wins it: 30 000 × 1 + 5 000 × 4 per million,
/// 0.05 EUR.
const BACKUP_ANSWER: (u64, u64) = (30_000, 5_000);

/// A chart as its DOM says: each series' value per bucket label, the bucket
/// labels in order, and the drawn widths.
#[derive(Debug)]
struct DrawnChart {
    series_order: Vec<String>,
    series: BTreeMap<String, BTreeMap<String, f64>>,
    buckets: Vec<String>,
    svg_width: f64,
    viewport: f64,
    page_width: f64,
}

impl DrawnChart {
    fn value(&self, series: &str, bucket: &str) -> f64 {
        *self
            .series
            .get(series)
            .unwrap_or_else(|| panic!("no series {series:?}: {self:#?}"))
            .get(bucket)
            .unwrap_or_else(|| panic!("no bucket {bucket:?} in {series:?}: {self:#?}"))
    }

    /// Asserts that every point of every series is `expected`'s value for
    /// it (0 when not listed), and that every listed point is drawn.
    fn assert_values(&self, what: &str, expected: &BTreeMap<(String, String), f64>) {
        for ((series, bucket), value) in expected {
            let drawn = self.value(series, bucket);
            assert!(
                (drawn - value).abs() < 1e-9,
                "{what}: {series} at {bucket} is drawn {drawn}, not {value}"
            );
        }
        for (series, points) in &self.series {
            for (bucket, drawn) in points {
                let want = expected
                    .get(&(series.clone(), bucket.clone()))
                    .copied()
                    .unwrap_or(0.0);
                assert!(
                    (drawn - want).abs() < 1e-9,
                    "{what}: {series} at {bucket} is drawn {drawn}, not {want}"
                );
            }
        }
    }

    /// Asserts that the chart is no wider than the viewport, nor the page.
    fn assert_fits(&self, what: &str, width: u32) {
        assert_eq!(self.viewport, f64::from(width), "{what}: the viewport");
        assert!(
            self.svg_width > 0.0 && self.svg_width <= self.viewport,
            "{what} at {width} px: the SVG is {} px wide in a {} px viewport",
            self.svg_width,
            self.viewport
        );
        assert!(
            self.page_width <= self.viewport,
            "{what} at {width} px: the page is {} px wide",
            self.page_width
        );
    }
}

/// Reads `svg#id` through the DOM: `<g class="series" data-series>` and
/// their points' `data-bucket` and `data-value`.
async fn drawn_chart(browser: &Browser, id: &str) -> DrawnChart {
    let read = browser
        .client
        .execute(
            "const svg = document.getElementById(arguments[0]);
             if (!svg || svg.tagName.toLowerCase() !== 'svg') return null;
             const order = [], series = {}, buckets = [];
             for (const g of svg.querySelectorAll('g.series')) {
               const name = g.getAttribute('data-series');
               order.push(name);
               const points = {};
               for (const p of g.querySelectorAll('[data-bucket]')) {
                 const bucket = p.getAttribute('data-bucket');
                 if (order.length === 1) buckets.push(bucket);
                 points[bucket] = Number(p.getAttribute('data-value'));
               }
               series[name] = points;
             }
             return {order, series, buckets,
                     svg_width: svg.getBoundingClientRect().width,
                     viewport: window.innerWidth,
                     page_width: document.documentElement.scrollWidth};",
            vec![json!(id)],
        )
        .await
        .unwrap();
    assert_ne!(read, Value::Null, "no svg#{id} on {}", browser.path().await);
    DrawnChart {
        series_order: serde_json::from_value(read["order"].clone()).unwrap(),
        series: serde_json::from_value(read["series"].clone()).unwrap(),
        buckets: serde_json::from_value(read["buckets"].clone()).unwrap(),
        svg_width: read["svg_width"].as_f64().unwrap(),
        viewport: read["viewport"].as_f64().unwrap(),
        page_width: read["page_width"].as_f64().unwrap(),
    }
}

/// Resizes the window and waits until the page is laid out at `width`.
async fn resize(browser: &Browser, width: u32, height: u32) {
    browser.client.set_window_size(width, height).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while browser.eval("return window.innerWidth;").await.as_u64() != Some(u64::from(width)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the window did not resize"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    browser
        .client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             requestAnimationFrame(() => requestAnimationFrame(() => done(true)));",
            vec![],
        )
        .await
        .unwrap();
}

/// Saves the page at 1280 and 390 px wide to
/// `target/screenshots/NAME-WIDTH.png`, as [`Browser::screenshots`] does,
/// scrolled so that the element matching `css` is at the top.
async fn screenshots_from(browser: &Browser, name: &str, css: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    for (width, height) in [(1280, 900), (390, 844)] {
        resize(browser, width, height).await;
        browser
            .client
            .execute_async(
                "const [css, done] = arguments;
                 document.querySelector(css).scrollIntoView({block: 'start'});
                 requestAnimationFrame(() => requestAnimationFrame(() => done(true)));",
                vec![json!(css)],
            )
            .await
            .unwrap();
        let png = browser.client.screenshot().await.unwrap();
        std::fs::write(dir.join(format!("{name}-{width}.png")), png).unwrap();
    }
    resize(browser, 1280, 900).await;
}

/// The text of each cell of the ledger row for `key`, by its label.
async fn ledger_row(browser: &Browser, key: &str) -> BTreeMap<String, String> {
    let cells = browser
        .client
        .execute(
            "const row = document.querySelector(`tr.ledger-row[data-key='${arguments[0]}']`);
             if (!row) return null;
             const cells = {};
             for (const td of row.querySelectorAll('td'))
               cells[td.getAttribute('data-label')] = td.textContent.replace(/\\s+/g, ' ').trim();
             return cells;",
            vec![json!(key)],
        )
        .await
        .unwrap();
    assert_ne!(cells, Value::Null, "no ledger row for {key}");
    serde_json::from_value(cells).unwrap()
}

async fn ledger(app: &TestApp) -> Vec<LedgerEntry> {
    app.with_conn(|conn| {
        usage_ledger::table
            .order((usage_ledger::provider.asc(), usage_ledger::kind.asc()))
            .select(LedgerEntry::as_select())
            .load(conn)
            .unwrap()
    })
    .await
}

fn points(list: &[(&str, &str, f64)]) -> BTreeMap<(String, String), f64> {
    let mut map = BTreeMap::new();
    for (series, bucket, value) in list {
        *map.entry((series.to_string(), bucket.to_string()))
            .or_insert(0.0) += value;
    }
    map
}

async fn the_console_charts_and_the_usage_ledger_draw_known_jobs_and_spend(backend: TestBackend) {
    tokio::time::timeout(WITHIN, charts_and_ledger(backend))
        .await
        .unwrap_or_else(|_| panic!("the scenario took longer than {WITHIN:?}"));
}

async fn charts_and_ledger(backend: TestBackend) {
    let acme = FakeProvider::start(Shape::OpenAi).await;
    let backup = FakeProvider::start(Shape::OpenAi).await;
    let refuser = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        // acme answers at once; the one call it holds goes unknown after
        // its 2 s soft timeout. backup's is long.
        held_provider_toml("acme", &acme.base_url, 2000),
        held_provider_toml("backup", &backup.base_url, 600_000),
        ProviderToml::openai("refuser", &refuser.base_url).toml(),
        strict_task_toml("summarize", &["acme", "backup"], "Summarize: {{ text }}"),
        strict_task_toml("refused", &["refuser"], "Summarize: {{ text }}"),
        PRICES.to_owned(),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    app.set_password("ada", "ada-pw").await;
    // The race's second attempt may go to backup only once it is qualified.
    let report = app.app.qualify(None, "backup", "summarize").await.unwrap();
    assert!(report.passed(), "{:?}", report.checks);

    // Three answers from acme, one after the other.
    let mut job_ids = Vec::new();
    for n in 1..=3 {
        acme.push(answer_using("done", ACME_ANSWER.0, ACME_ANSWER.1));
        let id = app
            .create_job(&app.alice.token, &format!("order-{n}"), &summarize("ok"))
            .await;
        app.wait_for_status(&id, "succeeded", WAIT).await;
        job_ids.push(id);
    }
    // One refused (400, no fallback in its chain): failed.
    refuser.set_default(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: r#"{"error":{"message":"bad request","type":"invalid_request_error"}}"#.into(),
    });
    let refused = app
        .create_job(
            &app.alice.token,
            "order-4",
            &json!({"task": "refused", "input": {"text": "no"}}),
        )
        .await;
    app.wait_for_status(&refused, "failed", WAIT).await;
    job_ids.push(refused);

    // A race: acme holds the call past its soft timeout (unknown), support
    // abandons it, backup answers the next attempt and wins, then acme's
    // answer arrives and loses.
    acme.push(Behaviour::Hold);
    let race = app
        .create_job(&app.alice.token, "order-5", &summarize("race"))
        .await;
    let held = acme.wait_held_count(1).await.remove(0);
    app.wait_for_status(&race, "unknown", WAIT).await;
    assert_eq!(
        app.abandon(&app.sue.token, &held, "acme is slow")
            .await
            .status(),
        StatusCode::OK
    );
    backup.push(answer_using("backup", BACKUP_ANSWER.0, BACKUP_ANSWER.1));
    let response = app.start_attempt(&app.alice.token, &race, None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let second: Value = response.json().await.unwrap();
    assert_eq!(second["provider"], "backup");
    app.wait_for_status(&race, "succeeded", WAIT).await;
    acme.release(&held, answer_using("too late", ACME_LATE.0, ACME_LATE.1));
    app.wait_for_job(&race, WAIT, |j| j["attempts"][0]["outcome"] == "lost")
        .await;
    job_ids.push(race.clone());
    assert_eq!(race_rows(&app, &race).await.len(), 1);

    // The ledger: every call that answered, once, at its price.
    let deadline = tokio::time::Instant::now() + WAIT;
    let rows = loop {
        let rows = ledger(&app).await;
        if rows.len() >= 6 || tokio::time::Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let calls: Vec<(&str, &str, bool, Option<i64>)> = rows
        .iter()
        .map(|r| (r.provider.as_str(), r.kind.as_str(), r.late, r.cost_micros))
        .collect();
    assert_eq!(
        calls,
        vec![
            ("acme", "lost", true, Some(200_000)),
            ("acme", "won", false, Some(100_000)),
            ("acme", "won", false, Some(100_000)),
            ("acme", "won", false, Some(100_000)),
            ("backup", "won", false, Some(50_000)),
            ("refuser", "failed", false, None),
        ],
        "{rows:#?}"
    );
    // The days (UTC) a provider's calls were recorded on, as the chart
    // labels them.
    let day_of = |provider: &str| -> Vec<String> {
        rows.iter()
            .filter(|r| r.provider == provider)
            .map(|r| onejob::web::views::rfc3339(r.recorded_at)[..10].to_owned())
            .collect()
    };

    // Each job's minute (UTC), as the chart labels it, and its status.
    let mut jobs_by_minute = Vec::new();
    for id in &job_ids {
        let job = app.get_job(&app.ada.token, id).await;
        let created = job["created_at"].as_str().unwrap();
        jobs_by_minute.push((
            job["status"].as_str().unwrap().to_owned(),
            created[11..16].to_owned(),
        ));
    }
    let mut statuses: Vec<&str> = jobs_by_minute.iter().map(|(s, _)| s.as_str()).collect();
    statuses.sort();
    assert_eq!(
        statuses,
        ["failed", "succeeded", "succeeded", "succeeded", "succeeded"]
    );
    let jobs_expected = points(
        &jobs_by_minute
            .iter()
            .map(|(status, minute)| (status.as_str(), minute.as_str(), 1.0))
            .collect::<Vec<_>>(),
    );
    let mut spend_list: Vec<(String, String, f64)> = Vec::new();
    for row in &rows {
        let day = onejob::web::views::rfc3339(row.recorded_at)[..10].to_owned();
        spend_list.push((
            row.provider.clone(),
            day,
            row.cost_micros.unwrap_or(0) as f64 / 1e6,
        ));
    }
    let spend_expected = points(
        &spend_list
            .iter()
            .map(|(p, d, v)| (p.as_str(), d.as_str(), *v))
            .collect::<Vec<_>>(),
    );

    // A monthly budget for alice, set now: it counts what she has spent
    // this month.
    let response = app
        .client
        .put(app.url("/api/v1/budgets/alice"))
        .bearer_auth(&app.ada.token)
        .json(&json!({"spend_limit": 10.0, "reason": "a budget to show"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "{:?}",
        response.text().await
    );

    let Some(browser) = Browser::start().await else {
        return;
    };
    let save = backend == TestBackend::Sqlite;
    browser.sign_in(&app, "ada", "ada-pw").await;
    browser.goto(&app, "/admin").await;
    for (width, height) in [(1280, 900), (390, 844)] {
        resize(&browser, width, height).await;
        let jobs = drawn_chart(&browser, "chart-jobs-hour").await;
        jobs.assert_fits("#chart-jobs-hour", width);
        assert_eq!(
            jobs.series_order,
            [
                "succeeded",
                "failed",
                "cancelled",
                "unknown",
                "running",
                "pending"
            ]
        );
        assert_eq!(jobs.buckets.len(), 60, "a bucket a minute for an hour");
        // The jobs were made within the last minutes: their buckets are
        // among the last three (the page may be loaded a minute or two
        // after the first job).
        for (_, minute) in &jobs_by_minute {
            let at = jobs.buckets.iter().position(|b| b == minute);
            assert!(
                at.is_some_and(|i| i >= jobs.buckets.len() - 3),
                "the job's minute {minute} is not among the last buckets: {:?}",
                &jobs.buckets[jobs.buckets.len() - 3..]
            );
        }
        jobs.assert_values("#chart-jobs-hour", &jobs_expected);
        let total = |series: &str| jobs.series[series].values().sum::<f64>();
        assert_eq!(
            (total("succeeded"), total("failed")),
            (4.0, 1.0),
            "{jobs:#?}"
        );
        // Nothing else in the hour.
        for other in ["cancelled", "unknown", "running", "pending"] {
            assert_eq!(total(other), 0.0, "{other}");
        }

        let spend = drawn_chart(&browser, "chart-spend").await;
        spend.assert_fits("#chart-spend", width);
        assert_eq!(spend.buckets.len(), 30, "a bucket a day for 30 days");
        let mut names = spend.series_order.clone();
        names.sort();
        assert_eq!(names, ["acme", "backup", "refuser"]);
        // Today is the last day; every call was recorded today (or, should
        // the test straddle midnight UTC, yesterday).
        let today = spend.buckets.last().unwrap();
        let days = day_of("acme");
        assert!(days.iter().all(|d| d <= today), "{days:?} after {today}");
        if days.iter().all(|d| d == today) {
            assert_eq!(spend.value("acme", today), 0.5, "3 × 0.10 + 0.20 EUR");
        }
        let total = |series: &str| spend.series[series].values().sum::<f64>();
        assert!((total("acme") - 0.5).abs() < 1e-9, "{spend:#?}");
        assert!((total("backup") - 0.05).abs() < 1e-9, "{spend:#?}");
        assert_eq!(total("refuser"), 0.0, "unpriced");
        spend.assert_values("#chart-spend", &spend_expected);

        let races = drawn_chart(&browser, "chart-races").await;
        races.assert_fits("#chart-races", width);
        assert_eq!(races.series_order, ["races"]);
        assert_eq!(races.series["races"].values().sum::<f64>(), 1.0);

        for other in ["chart-jobs-day", "chart-unknown-backlog"] {
            drawn_chart(&browser, other)
                .await
                .assert_fits(&format!("#{other}"), width);
        }
    }
    browser.assert_fits_at_each_width("console", false).await;
    if save {
        screenshots_from(&browser, "console-charts", "section.charts").await;
    }

    // The ledger by provider.
    let mark = browser.mark_document().await;
    browser
        .client
        .goto(&app.url("/admin/usage?group_by=provider"))
        .await
        .unwrap();
    browser
        .wait_for_fresh_page(&mark, |p| p == "/admin/usage")
        .await;
    for (width, height) in [(1280, 900), (390, 844)] {
        resize(&browser, width, height).await;
        let keys = browser
            .eval(
                "return [...document.querySelectorAll('tr.ledger-row')]
                   .map(r => r.getAttribute('data-key'));",
            )
            .await;
        assert_eq!(keys, json!(["acme", "backup", "refuser"]));
        let acme_row = ledger_row(&browser, "acme").await;
        assert_eq!(acme_row["Calls"], "4");
        assert_eq!(acme_row["Prompt"], "100000", "3 × 20 000 + 40 000");
        assert_eq!(acme_row["Completion"], "25000", "3 × 5 000 + 10 000");
        assert_eq!(acme_row["Spend"], "0.50");
        assert_eq!(acme_row["Races lost"], "1 · 0.20");
        assert_eq!(acme_row["Late answers"], "1 · 0.20");
        let backup_row = ledger_row(&browser, "backup").await;
        assert_eq!(backup_row["Calls"], "1");
        assert_eq!(backup_row["Spend"], "0.05");
        assert_eq!(backup_row["Races lost"], "0 · 0.00");
        let refuser_row = ledger_row(&browser, "refuser").await;
        assert_eq!(refuser_row["Failed"], "1");
        assert_eq!(refuser_row["Spend"], "0.00 + 1 unpriced");
        let budget = browser
            .eval(
                "return [...document.querySelectorAll('tr.budget-row')].map(r =>
                   [...r.querySelectorAll('td')].map(td => td.textContent.trim()));",
            )
            .await;
        let budget = &budget[0];
        assert_eq!(budget[0], "alice", "{budget}");
        assert_eq!(budget[1], "10.00 EUR", "{budget}");
        assert!(
            budget[3].as_str().unwrap().starts_with("0.55 EUR · "),
            "spent this month: {budget}"
        );
        assert_eq!(browser.text_of("#total-spend").await, "0.55");
        assert_eq!(browser.text_of("#total-races").await, "0.20");

        let chart = drawn_chart(&browser, "chart-usage-spend").await;
        chart.assert_fits("#chart-usage-spend", width);
        assert_eq!(chart.series_order, ["answers used", "races lost"]);
        assert_eq!(chart.buckets, ["acme", "backup", "refuser"]);
        assert_eq!(chart.value("answers used", "acme"), 0.3, "3 × 0.10 EUR");
        chart.assert_values(
            "#chart-usage-spend",
            &points(&[
                ("answers used", "acme", 0.3),
                ("answers used", "backup", 0.05),
                ("races lost", "acme", 0.2),
            ]),
        );
    }
    browser
        .assert_fits_at_each_width("usage ledger", false)
        .await;
    if save {
        screenshots_from(&browser, "usage-ledger", "#figure-usage-spend").await;
    }
    browser.close().await;
}

on_both_backends!(the_console_charts_and_the_usage_ledger_draw_known_jobs_and_spend);
