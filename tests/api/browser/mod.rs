//! Real headless Chromium, driven through chromedriver, one module a page:
//! the Submit form ([`submit`]), the support console's Unknown queue and
//! race log ([`console`]), Users ([`users`]), job search ([`job_search`]),
//! the job page's forms while it refreshes itself ([`job_forms`]), a chat
//! job's live text ([`live_text`]), the console's charts and the usage
//! ledger ([`usage`]), webhook endpoints and a job's deliveries
//! ([`webhooks`]), and a traced job's timeline beside its span tree
//! ([`traces`]). The browser, the DevTools client, the holding proxy and
//! the row readers they use are in [`crate::support`]; whether pages fit at
//! 1280 and 390 px, and the README's screenshots of them, are in
//! [`crate::browser_pages`].
//!
//! State that another task commits after a page is read (a delivery
//! recorded, a late answer) is waited for by reading the page again,
//! [`Browser::reload_until`](crate::support::webdriver::Browser::reload_until),
//! unless the page follows it itself (a live job's page refreshes every
//! second): a page read once, before that commit, never shows it.

use crate::support::fake_provider::{
    config_of, strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape,
};
use crate::support::harness::{spawn_app_with, TestApp, TestBackend};

mod console;
mod job_forms;
mod job_search;
mod live_text;
mod submit;
mod traces;
mod usage;
mod users;
mod webhooks;

/// An OpenAI-compatible fake provider. `timeout_ms` is its soft timeout (the
/// connect timeout is shorter, as the configuration requires); the
/// late-result window is long, so that a held answer released after the soft
/// timeout is still heard, however slow the machine.
fn held_provider_toml(name: &str, base_url: &str, timeout_ms: u64) -> String {
    ProviderToml::openai(name, base_url)
        .timeout_ms(timeout_ms)
        .late_result_ms(600_000)
        .connect_timeout_ms(Some((timeout_ms / 2).min(1000)))
        .toml()
}

/// onejob with one task, `summarize`, on one fake provider that holds every
/// call until the test releases it, with a soft timeout long enough that a
/// held call stays `running`.
async fn app_with_a_held_provider(backend: TestBackend) -> (TestApp, FakeProvider) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(Behaviour::Hold);
    let toml = [
        held_provider_toml("held", &fake.base_url, 600_000),
        strict_task_toml("summarize", &["held"], "Summarize: {{ text }}"),
    ]
    .concat();
    (spawn_app_with(backend, config_of(&toml)).await, fake)
}
