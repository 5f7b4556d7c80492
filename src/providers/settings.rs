//! A provider's settings: the `[[providers]]` entry of the configuration, with
//! its API key resolved once at load (never read from the environment later).

use serde::Deserialize;

use crate::domain::ids::text_enum;
use crate::domain::Secret;

text_enum! {
    #[derive(Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum ProviderKind {
        /// Offline and deterministic: answers JSON naming the provider and a digest of the prompt.
        Simulated = "simulated",
        /// OpenAI-compatible chat completions (`/v1/chat/completions`): OpenAI, vLLM,
        /// llama.cpp server, Ollama, OpenRouter, …
        Openai = "openai",
        /// Anthropic messages (`/v1/messages`).
        Anthropic = "anthropic",
        /// Azure OpenAI: OpenAI's chat completions at a resource's
        /// deployment (`{base_url}/openai/deployments/{deployment}/chat/completions
        /// ?api-version=…`), with an `api-key` or an Entra ID bearer token.
        #[serde(rename = "azure_openai")]
        AzureOpenai = "azure_openai",
        /// Google's Gemini API (`{base_url}/v1beta/models/{model}:generateContent`,
        /// `:streamGenerateContent?alt=sse`), the key as `x-goog-api-key`.
        Gemini = "gemini",
        /// AWS Bedrock's Converse API (`/model/{model}/converse`,
        /// `converse-stream`), signed with SigV4 from the standard AWS
        /// variables.
        Bedrock = "bedrock",
    }
}

impl ProviderKind {
    pub fn is_http(self) -> bool {
        !matches!(self, Self::Simulated)
    }

    /// Whether it speaks OpenAI's chat completions (its requests, answers,
    /// streams and errors), wherever it is addressed.
    pub fn speaks_openai(self) -> bool {
        matches!(self, Self::Openai | Self::AzureOpenai)
    }
}

/// What an OpenAI-compatible provider calls the answer's token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensField {
    /// `max_tokens`: most servers (vLLM, llama.cpp, Ollama, older OpenAI models).
    #[default]
    MaxTokens,
    /// `max_completion_tokens`: OpenAI's reasoning models, which refuse `max_tokens`.
    MaxCompletionTokens,
}

/// How a simulated provider misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SimulatedFailure {
    #[default]
    None,
    /// Refuses the call: a definite failure.
    Definite,
    /// Never answers.
    TimeoutForever,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSettings {
    pub name: String,
    pub kind: ProviderKind,
    /// Soft timeout: past it the attempt becomes `unknown`.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Streaming calls: once the first chunk arrived, past this long
    /// without another the attempt becomes `unknown`.
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// How long a timed-out call may still answer (its answer goes through the CAS).
    #[serde(default = "default_late_result_ms")]
    pub late_result_ms: u64,
    /// Simulated: how long an answer takes.
    #[serde(default = "default_latency_ms")]
    pub latency_ms: u64,
    /// Simulated: the failure mode.
    #[serde(default)]
    pub fail: SimulatedFailure,
    /// Simulated: behaviour for particular attempt numbers of a job.
    #[serde(default)]
    pub script: Vec<ScriptStep>,
    /// HTTP kinds: the server root; `/v1/chat/completions` or `/v1/messages` is appended.
    pub base_url: Option<String>,
    /// HTTP kinds: the model name sent with each request.
    pub model: Option<String>,
    /// HTTP kinds: the environment variable holding the API key (never stored or shown).
    pub api_key_env: Option<String>,
    /// The API key itself, resolved from `api_key_env` once, when the
    /// configuration is loaded.
    #[serde(skip)]
    pub api_key: Option<Secret>,
    /// `azure_openai`: the environment variable holding a bearer token (an
    /// Entra ID access token), sent instead of an `api-key`.
    pub bearer_token_env: Option<String>,
    /// The bearer token, resolved from `bearer_token_env` once.
    #[serde(skip)]
    pub bearer_token: Option<Secret>,
    /// `azure_openai`: the deployment the calls go to.
    pub deployment: Option<String>,
    /// `azure_openai`: the API version every call names (`api-version`).
    pub api_version: Option<String>,
    /// `bedrock`: the AWS region (default: `AWS_REGION`).
    pub region: Option<String>,
    /// `bedrock`: the credentials and region requests are signed with, read
    /// once from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_SESSION_TOKEN` and `AWS_REGION`.
    #[serde(skip)]
    pub aws: Option<super::bedrock::AwsSigning>,
    /// HTTP kinds: how long establishing a connection may take (a failure here is definite).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// OpenAI-compatible kinds: the name the token limit is sent under.
    #[serde(default)]
    pub max_tokens_field: MaxTokensField,
    /// HTTP kinds: the largest response body read, in bytes; a larger
    /// answer is refused (`invalid_output`), never read whole.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: usize,
    /// Sampling temperature for ordinary calls; qualification uses the task's.
    pub temperature: Option<f64>,
    /// The context budget in tokens (prompt + max_tokens must fit).
    pub context_tokens: Option<u32>,
    /// HTTP kinds: send a callback URL and a per-attempt secret with each call,
    /// for providers that answer asynchronously.
    #[serde(default)]
    pub callbacks: bool,
    /// The most calls open to this provider at once, from this process
    /// (timed-out calls kept open for a late answer count); unset: no limit.
    pub max_in_flight: Option<u32>,
    /// The most requests sent to it in any 60 seconds, from this process.
    pub requests_per_minute: Option<u32>,
    /// The most tokens sent to it in any 60 seconds, from this process:
    /// counted from each prompt's estimate, then from the answer's usage.
    pub tokens_per_minute: Option<u32>,
    /// The most timed-out calls kept open for a late answer at once; past
    /// it a call that reaches its soft timeout is dropped (its attempt stays
    /// `unknown`).
    #[serde(default = "default_max_late_calls")]
    pub max_late_calls: usize,
}

fn default_max_late_calls() -> usize {
    256
}

fn default_connect_timeout_ms() -> u64 {
    5_000
}
fn default_max_response_bytes() -> usize {
    4 * 1024 * 1024
}

fn default_max_tokens() -> u32 {
    1_024
}

impl ProviderSettings {
    /// The context budget: configured, else the kind's usual window.
    pub fn context_budget(&self) -> u32 {
        self.context_tokens.unwrap_or(match self.kind {
            ProviderKind::Simulated => 1_000_000,
            ProviderKind::Openai | ProviderKind::AzureOpenai => 128_000,
            ProviderKind::Anthropic => 200_000,
            ProviderKind::Gemini => 1_000_000,
            ProviderKind::Bedrock => 200_000,
        })
    }

    /// The limits the worker keeps to when sending to this provider.
    pub fn limits(&self) -> super::limits::Limits {
        super::limits::Limits {
            max_in_flight: self.max_in_flight,
            requests_per_minute: self.requests_per_minute,
            tokens_per_minute: self.tokens_per_minute,
            max_late_calls: self.max_late_calls,
        }
    }

    /// The model a qualification is bound to (`simulated` for the simulated kind).
    pub fn model_name(&self) -> &str {
        self.model.as_deref().unwrap_or("simulated")
    }
}

fn default_timeout_ms() -> u64 {
    30_000
}
fn default_idle_timeout_ms() -> u64 {
    20_000
}
fn default_late_result_ms() -> u64 {
    60_000
}
fn default_latency_ms() -> u64 {
    200
}

/// Overrides a simulated provider's behaviour for one attempt number.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptStep {
    pub attempt: u32,
    pub latency_ms: Option<u64>,
    pub fail: Option<SimulatedFailure>,
}
