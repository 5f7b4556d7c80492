//! Configurations and waits for tests that point onejob at fake providers.

use std::time::Duration;

use serde_json::{json, Value};

use super::{Behaviour, FakeProvider};

/// How long a test waits for a job to settle.
pub const WAIT: Duration = Duration::from_secs(20);

/// The one way tests write a `[[providers]]` entry for a fake server.
///
/// Defaults: OpenAI-compatible, model `fake-model`, the test API key
/// (`ONEJOB_TEST_FAKE_KEY`), a 400 ms soft timeout, a 60 s late-result
/// window and a 300 ms connect timeout. Each setter changes one of them;
/// [`ProviderToml::with`] adds lines of its own (`callbacks = true`).
#[derive(Clone, Debug)]
pub struct ProviderToml {
    name: String,
    kind: &'static str,
    base_url: String,
    model: String,
    timeout_ms: u64,
    late_result_ms: u64,
    connect_timeout_ms: Option<u64>,
    /// The key naming the credential's variable.
    credential: &'static str,
    extra: Vec<String>,
}

impl ProviderToml {
    /// An OpenAI-compatible provider called `name` at `base_url`.
    pub fn openai(name: &str, base_url: &str) -> Self {
        Self {
            name: name.to_owned(),
            kind: "openai",
            base_url: base_url.to_owned(),
            model: "fake-model".to_owned(),
            timeout_ms: 400,
            late_result_ms: 60_000,
            connect_timeout_ms: Some(300),
            credential: "api_key_env",
            extra: Vec::new(),
        }
    }

    /// An Anthropic provider called `name` at `base_url`.
    pub fn anthropic(name: &str, base_url: &str) -> Self {
        Self {
            kind: "anthropic",
            ..Self::openai(name, base_url)
        }
    }

    /// An Azure OpenAI provider called `name`: the resource at `base_url`,
    /// `deployment`, API version 2024-10-21, the test key as `api-key`.
    pub fn azure(name: &str, base_url: &str, deployment: &str) -> Self {
        Self {
            kind: "azure_openai",
            ..Self::openai(name, base_url)
        }
        .with(&format!(
            "deployment = \"{deployment}\"\napi_version = \"2024-10-21\""
        ))
    }

    /// A Gemini provider called `name` at `base_url` (model `gemini-2.5-flash`).
    pub fn gemini(name: &str, base_url: &str) -> Self {
        Self {
            kind: "gemini",
            model: "gemini-2.5-flash".to_owned(),
            ..Self::openai(name, base_url)
        }
    }

    /// A Bedrock provider called `name` at `base_url` (model
    /// `anthropic.claude-3-haiku-20240307-v1:0`), signed with the test AWS
    /// credentials.
    pub fn bedrock(name: &str, base_url: &str) -> Self {
        Self {
            kind: "bedrock",
            model: "anthropic.claude-3-haiku-20240307-v1:0".to_owned(),
            credential: "",
            ..Self::openai(name, base_url)
        }
    }

    /// Authenticates with the test key as a bearer token (`azure_openai`'s
    /// Entra ID token) instead of an API key.
    pub fn bearer_token(mut self) -> Self {
        self.credential = "bearer_token_env";
        self
    }

    pub fn model(mut self, model: &str) -> Self {
        model.clone_into(&mut self.model);
        self
    }

    /// Points it at another server.
    pub fn base_url(mut self, base_url: &str) -> Self {
        base_url.clone_into(&mut self.base_url);
        self
    }

    /// The soft timeout.
    pub fn timeout_ms(mut self, ms: u64) -> Self {
        self.timeout_ms = ms;
        self
    }

    /// How long a late answer is still heard.
    pub fn late_result_ms(mut self, ms: u64) -> Self {
        self.late_result_ms = ms;
        self
    }

    /// The connect timeout; `None` leaves the configuration's default.
    pub fn connect_timeout_ms(mut self, ms: Option<u64>) -> Self {
        self.connect_timeout_ms = ms;
        self
    }

    /// More settings of this provider, as TOML lines.
    pub fn with(mut self, lines: &str) -> Self {
        self.extra.push(lines.to_owned());
        self
    }

    pub fn toml(&self) -> String {
        let Self {
            name,
            kind,
            base_url,
            model,
            timeout_ms,
            late_result_ms,
            connect_timeout_ms,
            credential,
            extra,
        } = self;
        let credential = if credential.is_empty() {
            String::new()
        } else {
            format!("{credential} = \"ONEJOB_TEST_FAKE_KEY\"")
        };
        let mut toml = format!(
            r#"
[[providers]]
name = "{name}"
kind = "{kind}"
base_url = "{base_url}"
model = "{model}"
{credential}
timeout_ms = {timeout_ms}
late_result_ms = {late_result_ms}
"#
        );
        if let Some(ms) = connect_timeout_ms {
            toml.push_str(&format!("connect_timeout_ms = {ms}\n"));
        }
        for lines in extra {
            toml.push_str(lines);
            toml.push('\n');
        }
        toml
    }
}

/// A fake provider's answer: a summary, as the strict task's schema wants.
pub fn answer(summary: &str) -> Behaviour {
    Behaviour::Answer(json!({ "summary": summary }))
}

/// A task with a template, a strict output schema and one golden example.
pub fn strict_task_toml(name: &str, chain: &[&str], template: &str) -> String {
    let chain = chain
        .iter()
        .map(|p| format!("{p:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
[[tasks]]
name = "{name}"
providers = [{chain}]
input_fields = ["text"]
template = "{template}"
output_schema = {{ type = "object", required = ["summary"], additionalProperties = false, properties = {{ summary = {{ type = "string" }} }} }}

[[tasks.golden]]
input = {{ text = "golden" }}
expect = {{ "/summary" = "fake summary" }}
"#
    )
}

/// One fake provider, `fake`, as the only provider of a strict `summarize`
/// task; the worker has one slot.
pub fn one_fake_config(fake: &FakeProvider) -> onejob::config::Config {
    config_of(
        &[
            ProviderToml::openai("fake", &fake.base_url).toml(),
            strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
        ]
        .concat(),
    )
}

pub fn config_of(toml: &str) -> onejob::config::Config {
    let mut config = crate::support::harness::test_config(toml);
    config.worker.concurrency = 1;
    config
}

pub async fn settled_attempt(
    app: &crate::support::harness::TestApp,
    job_id: &str,
    index: usize,
) -> Value {
    let job = app
        .wait_for_job(job_id, WAIT, |j| {
            let state = &j["attempts"][index]["state"];
            !state.is_null() && state != "queued" && state != "running"
        })
        .await;
    job["attempts"][index].clone()
}

pub fn closed_port_url() -> String {
    let port = crate::server_process::free_port();
    format!("http://127.0.0.1:{port}")
}
