//! Reading the server's Prometheus exposition (`GET /metrics`): a sample
//! parser and sums over label sets.

use crate::support::harness::TestApp;

/// One sample of a Prometheus text exposition.
pub struct Sample<'a> {
    pub name: &'a str,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample<'_> {
    pub fn has(&self, key: &str, value: &str) -> bool {
        self.labels.iter().any(|(k, v)| k == key && v == value)
    }
}

/// Reads one sample line (`name{key="value",…} number`); `None` for
/// comments and anything else.
pub fn parse_sample(line: &str) -> Option<Sample<'_>> {
    if line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(mut set) = rest.strip_prefix('{') {
        loop {
            set = set.trim_start_matches(',');
            if let Some(after) = set.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, quoted) = set.split_once("=\"")?;
            let (mut value, mut escaped, mut end) = (String::new(), false, None);
            for (i, c) in quoted.char_indices() {
                match (escaped, c) {
                    (true, 'n') => value.push('\n'),
                    (true, other) => value.push(other),
                    (false, '\\') => {
                        escaped = true;
                        continue;
                    }
                    (false, '"') => {
                        end = Some(i);
                        break;
                    }
                    (false, other) => value.push(other),
                }
                escaped = false;
            }
            labels.push((key.to_owned(), value));
            set = &quoted[end? + 1..];
        }
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The sum of the samples called `name` whose labels include all of `labels`.
pub fn metric_sum(exposition: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    exposition
        .lines()
        .filter_map(parse_sample)
        .filter(|sample| sample.name == name && labels.iter().all(|(k, v)| sample.has(k, v)))
        .map(|sample| sample.value)
        .sum()
}

pub async fn metrics(app: &TestApp) -> String {
    let response = app.get(&app.ada.token, "/metrics").await;
    assert_eq!(response.status(), 200, "GET /metrics");
    response.text().await.unwrap()
}

/// How many `POST /jobs` (the submit form) the server has answered, any status.
pub async fn form_posts_served(app: &TestApp) -> u64 {
    let exposition = metrics(app).await;
    metric_sum(
        &exposition,
        "onejob_http_request_seconds_count",
        &[("method", "POST"), ("route", "/jobs")],
    ) as u64
}

/// The server's count of `method route` answered with `status`.
pub fn answered(exposition: &str, method: &str, route: &str, status: &str) -> u64 {
    metric_sum(
        exposition,
        "onejob_http_request_seconds_count",
        &[("method", method), ("route", route), ("status", status)],
    ) as u64
}
