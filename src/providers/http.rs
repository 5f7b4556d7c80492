//! Providers over HTTP, with reqwest: each kind's endpoint, credentials
//! and framing; what the bodies say is its codec's ([`super::codec`]). No
//! automatic retries and no redirects (a repeat could run the work twice);
//! each call carries the attempt id as `Idempotency-Key` and
//! `X-Request-Id`; every outcome is classified by [`super::classify`].

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use serde::de::DeserializeOwned;

use super::classify::{classify_status, parse_retry_after_headers, StatusClass};
use super::codec::{conclude, Codec, ErrorReason};
use super::error_chain;
use super::streaming::{self, DeltaSink};
use super::{AnswerFacts, BoxFuture, Call, ProviderClient, ProviderKind, ProviderSettings, Reply};
use crate::chat::{anthropic, bedrock, gemini};
use crate::domain::outcome::Reason;
use crate::domain::{Outcome, Refusal, Secret};

/// The Anthropic API version this client speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// The beta that enables Anthropic's structured outputs.
pub const ANTHROPIC_STRUCTURED_OUTPUTS_BETA: &str = "structured-outputs-2025-11-13";

#[derive(Debug)]
pub struct HttpClient {
    kind: ProviderKind,
    client: reqwest::Client,
    endpoint: String,
    /// Where a call goes, for an answer and for a stream.
    answer_url: CallUrl,
    stream_url: CallUrl,
    model: String,
    api_key: Option<Secret>,
    /// `azure_openai`: an Entra ID token, sent as a bearer instead of a key.
    bearer_token: Option<Secret>,
    /// `bedrock`: what every request is signed with.
    aws: Option<super::bedrock::AwsSigning>,
    /// How long a token count may take: the soft timeout.
    count_timeout: Duration,
    codec: Codec,
    max_response_bytes: usize,
}

/// A call's URL, parsed once: given text, reqwest parses it again on every
/// request.
#[derive(Debug)]
struct CallUrl {
    text: String,
    /// `None` where the text is no URL: reqwest then refuses the request
    /// with its own error.
    parsed: Option<reqwest::Url>,
}

impl CallUrl {
    fn new(text: String) -> Self {
        let parsed = reqwest::Url::parse(&text).ok();
        Self { text, parsed }
    }

    fn post(&self, client: &reqwest::Client) -> reqwest::RequestBuilder {
        match &self.parsed {
            Some(url) => client.post(url.clone()),
            None => client.post(self.text.as_str()),
        }
    }
}

impl HttpClient {
    pub fn from_settings(config: &ProviderSettings) -> Self {
        let base_url = config.base_url.as_deref().unwrap_or_default();
        let endpoint = match config.kind {
            ProviderKind::Anthropic => format!("{}/v1/messages", api_root(base_url)),
            ProviderKind::AzureOpenai => azure_endpoint(
                base_url,
                config.deployment.as_deref().unwrap_or_default(),
                config.api_version.as_deref().unwrap_or_default(),
            ),
            ProviderKind::Gemini => format!(
                "{}/v1beta/models/{}",
                gemini_root(base_url),
                config.model.as_deref().unwrap_or_default()
            ),
            ProviderKind::Bedrock => {
                let region = config.aws.as_ref().map_or("", |aws| aws.region.as_str());
                let base = match base_url {
                    "" => format!("https://bedrock-runtime.{region}.amazonaws.com"),
                    given => given.trim_end_matches('/').to_owned(),
                };
                format!(
                    "{base}/model/{}",
                    super::bedrock::model_label(config.model.as_deref().unwrap_or_default())
                )
            }
            _ => format!("{}/v1/chat/completions", api_root(base_url)),
        };
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .build()
            .expect("an HTTP client with a rustls backend");
        Self {
            kind: config.kind,
            client,
            answer_url: CallUrl::new(Self::call_url(config.kind, &endpoint, false)),
            stream_url: CallUrl::new(Self::call_url(config.kind, &endpoint, true)),
            endpoint,
            model: config.model.clone().unwrap_or_default(),
            api_key: config.api_key.clone(),
            bearer_token: config.bearer_token.clone(),
            aws: config.aws.clone(),
            count_timeout: Duration::from_millis(config.timeout_ms),
            codec: Codec::from_settings(config),
            max_response_bytes: config.max_response_bytes,
        }
    }

    /// Whether this client streams a call that asks for it: every HTTP kind
    /// does.
    fn streams(&self, call: &Call) -> bool {
        call.wants_stream() && self.kind.is_http()
    }

    /// Where a call goes: Gemini names the method (and a stream's
    /// framing) in the URL, Bedrock the operation.
    fn call_url(kind: ProviderKind, endpoint: &str, streamed: bool) -> String {
        match (kind, streamed) {
            (ProviderKind::Gemini, true) => format!("{endpoint}:streamGenerateContent?alt=sse"),
            (ProviderKind::Gemini, false) => format!("{endpoint}:generateContent"),
            (ProviderKind::Bedrock, true) => format!("{endpoint}/converse-stream"),
            (ProviderKind::Bedrock, false) => format!("{endpoint}/converse"),
            _ => endpoint.to_owned(),
        }
    }

    fn url(&self, streamed: bool) -> &CallUrl {
        if streamed {
            &self.stream_url
        } else {
            &self.answer_url
        }
    }

    fn headers(&self, call: &Call, structured_outputs_beta: bool) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let id = HeaderValue::from_str(&call.request_id).expect("request ids are ASCII");
        headers.insert("Idempotency-Key", id.clone());
        headers.insert("X-Request-Id", id);
        if self.kind == ProviderKind::Anthropic {
            headers.insert(
                "anthropic-version",
                HeaderValue::from_static(ANTHROPIC_VERSION),
            );
            if structured_outputs_beta {
                headers.insert(
                    "anthropic-beta",
                    HeaderValue::from_static(ANTHROPIC_STRUCTURED_OUTPUTS_BETA),
                );
            }
        }
        if let Some(callback) = &call.callback {
            if let (Ok(url), Ok(mut secret)) = (
                HeaderValue::from_str(&callback.url),
                HeaderValue::from_str(callback.secret.expose()),
            ) {
                secret.set_sensitive(true);
                headers.insert("X-Onejob-Callback-Url", url);
                headers.insert("X-Onejob-Callback-Secret", secret);
            }
        }
        if let Some(trace) = &call.trace {
            for (name, value) in trace.headers() {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    headers.insert(name, value);
                }
            }
        }
        self.insert_credential(&mut headers);
        headers
    }

    /// The API key (or token) in the header this kind reads it from.
    fn insert_credential(&self, headers: &mut HeaderMap) {
        let credential = match (&self.api_key, &self.bearer_token) {
            (Some(key), _) => Some(match self.kind {
                ProviderKind::Anthropic => ("x-api-key", key.expose().to_owned()),
                ProviderKind::AzureOpenai => ("api-key", key.expose().to_owned()),
                // In a header, never in the URL (where logs keep it).
                ProviderKind::Gemini => ("x-goog-api-key", key.expose().to_owned()),
                _ => ("Authorization", format!("Bearer {}", key.expose())),
            }),
            (None, Some(token)) => Some(("Authorization", format!("Bearer {}", token.expose()))),
            (None, None) => None,
        };
        if let Some((name, value)) = credential {
            if let Ok(mut value) = HeaderValue::from_str(&value) {
                value.set_sensitive(true);
                headers.insert(name, value);
            }
        }
    }

    /// Counts `text`'s tokens with the provider's own counter: Anthropic's
    /// `POST /v1/messages/count_tokens`, Gemini's `countTokens`, Bedrock's
    /// `CountTokens`; `None` for a kind without one, or when the count
    /// fails (the caller then estimates). A count is a qualification's
    /// call, never an attempt: nothing is billed or recorded for it.
    pub async fn count_tokens(&self, text: &str) -> Option<(u32, &'static str)> {
        let (url, body, method) = match self.kind {
            ProviderKind::Anthropic => (
                format!("{}/count_tokens", self.endpoint),
                serde_json::to_vec(&anthropic::CountTokensRequest::of(&self.model, text)),
                "Anthropic count_tokens",
            ),
            ProviderKind::Gemini => (
                format!("{}:countTokens", self.endpoint),
                serde_json::to_vec(&gemini::CountTokensRequest::of(text)),
                "Gemini countTokens",
            ),
            ProviderKind::Bedrock => (
                format!("{}/count-tokens", self.endpoint),
                serde_json::to_vec(&bedrock::CountTokensRequest::of(text)),
                "Bedrock CountTokens",
            ),
            _ => return None,
        };
        let body = body.expect("JSON serializes");
        let mut headers = HeaderMap::new();
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.kind == ProviderKind::Anthropic {
            headers.insert(
                "anthropic-version",
                HeaderValue::from_static(ANTHROPIC_VERSION),
            );
        }
        self.insert_credential(&mut headers);
        self.sign(&url, &body, &mut headers).ok()?;
        let response = self
            .client
            .post(url)
            .headers(headers)
            .body(body)
            .timeout(self.count_timeout)
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            tracing::warn!(status = %response.status(), method, "a token count failed; estimating instead");
            return None;
        }
        let bytes = response.bytes().await.ok()?;
        let count = match self.kind {
            ProviderKind::Anthropic => {
                counted::<anthropic::CountTokensResponse>(&bytes)?.input_tokens
            }
            ProviderKind::Gemini => counted::<gemini::CountTokensResponse>(&bytes)?.total_tokens,
            _ => counted::<bedrock::CountTokensResponse>(&bytes)?.input_tokens,
        };
        Some((u32::try_from(count).unwrap_or(u32::MAX), method))
    }

    /// Adds the SigV4 headers of a `bedrock` request, signed over exactly
    /// the bytes sent; nothing for other kinds.
    fn sign(&self, url: &str, body: &[u8], headers: &mut HeaderMap) -> Result<(), String> {
        let Some(aws) = &self.aws else {
            return Ok(());
        };
        let signed = super::bedrock::sign(
            aws,
            url,
            &[("content-type", "application/json")],
            body,
            std::time::SystemTime::now(),
        )?;
        for (name, value) in signed {
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| e.to_string())?;
            let mut value = HeaderValue::from_str(&value).map_err(|e| e.to_string())?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        Ok(())
    }

    /// Sends the call and classifies what comes back. Reasons quote the
    /// provider (status bodies, answers), so the API key is redacted from them:
    /// some providers echo credentials in their errors. A pause the provider
    /// asks for is kept by the caller (`Provider::call` and the limiter),
    /// which never sends while one runs.
    pub async fn send_call(&self, call: &Call, sink: Option<&DeltaSink>) -> Reply {
        let mut reply = self.send(call, sink).await;
        reply.outcome = reply.outcome.map_reason(|reason| self.redact(call, reason));
        reply
    }

    /// Removes the API key and the call's callback secret from a reason (before
    /// it is shortened, so no fragment survives a cut), then shortens it.
    fn redact(&self, call: &Call, text: String) -> String {
        let secrets = [
            self.api_key.as_ref().map(Secret::expose),
            self.bearer_token.as_ref().map(Secret::expose),
            self.aws.as_ref().map(|aws| aws.secret_access_key.expose()),
            self.aws
                .as_ref()
                .and_then(|aws| aws.session_token.as_ref())
                .map(Secret::expose),
            call.callback.as_ref().map(|c| c.secret.expose()),
        ];
        crate::domain::outcome::redacted(&text, secrets.into_iter().flatten())
    }

    async fn send(&self, call: &Call, sink: Option<&DeltaSink>) -> Reply {
        let streamed = sink.is_some() && self.streams(call);
        let encoded = match self.codec.encode(&call.request, streamed) {
            Ok(encoded) => encoded,
            // Nothing was sent: the request cannot be put in its terms.
            Err(cannot) => return Outcome::Failed(Reason::new(cannot.0)).into(),
        };
        let url = self.url(streamed);
        let mut headers = self.headers(call, encoded.structured_outputs_beta);
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Err(why) = self.sign(&url.text, &encoded.body, &mut headers) {
            return Outcome::Failed(Reason::new(format!(
                "the request could not be signed: {why}"
            )))
            .into();
        }
        let sent = url
            .post(&self.client)
            .headers(headers)
            .body(encoded.body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            // Nothing reached the provider: refused, DNS, TLS, connect timeout.
            Err(e) if e.is_connect() => {
                return Outcome::Refused(Refusal::unreachable(
                    Reason::new("could not connect to the provider").with_detail(&error_chain(&e)),
                ))
                .into()
            }
            Err(e) => {
                return Outcome::Unknown(
                    Reason::new("the connection failed after the request was sent")
                        .with_detail(&error_chain(&e)),
                )
                .into()
            }
        };
        let status = response.status();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let retry_after = parse_retry_after_headers(
            header("retry-after-ms").as_deref(),
            header("retry-after").as_deref(),
        );
        let error_type = header("x-amzn-errortype");
        if let (Some(sink), true) = (sink, status.is_success()) {
            return self
                .read_streamed(call, response, sink, retry_after, error_type)
                .await;
        }
        self.read_whole(call, response, sink, retry_after, error_type)
            .await
    }

    /// Reads an answer asked for as a stream: an event stream (SSE, or
    /// Bedrock's binary one), each delta to `sink`; or one that came whole.
    async fn read_streamed(
        &self,
        call: &Call,
        response: reqwest::Response,
        sink: &DeltaSink,
        retry_after: Option<Duration>,
        error_type: Option<String>,
    ) -> Reply {
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let streamed = if content_type.starts_with("application/vnd.amazon.eventstream") {
            streaming::read_aws_event_stream(response, self.max_response_bytes, sink).await
        } else if content_type.starts_with("text/event-stream") {
            let reader = self.codec.stream_reader();
            let traced = call.trace.is_some();
            streaming::read_sse(response, self.max_response_bytes, reader, sink, traced).await
        } else {
            // An answer that came whole: handed on whole.
            return self
                .read_whole(call, response, Some(sink), retry_after, error_type)
                .await;
        };
        let usage = streamed.usage.map(crate::chat::TokenCounts::to_usage);
        let mut facts = AnswerFacts::default();
        let outcome = match streamed.ended {
            Ok(answer) => {
                facts = AnswerFacts::of(&answer, streamed.model.clone(), call.trace.is_some());
                conclude(call.shape, answer, None).await
            }
            Err(outcome) => outcome,
        };
        Reply {
            outcome,
            usage,
            facts,
        }
    }

    /// Reads an answer that came whole (or an error) and classifies it.
    async fn read_whole(
        &self,
        call: &Call,
        response: reqwest::Response,
        sink: Option<&DeltaSink>,
        retry_after: Option<Duration>,
        error_type: Option<String>,
    ) -> Reply {
        let status = response.status();
        let (bytes, complete) = match read_capped(response, self.max_response_bytes).await {
            Ok(read) => read,
            Err(e) => {
                return Outcome::Unknown(
                    Reason::new(format!("the answer was cut off ({status})"))
                        .with_detail(&error_chain(&e)),
                )
                .into()
            }
        };
        if status.is_success() && !complete {
            return Outcome::Failed(Reason::invalid_output(format!(
                "the answer is larger than the {} bytes allowed (max_response_bytes)",
                self.max_response_bytes
            )))
            .into();
        }
        if !status.is_success() {
            // Shortened only after redaction (see `send_call`).
            let retry_after = retry_after.or_else(|| self.codec.retry_delay(&bytes));
            let excerpt = match self.codec.error_reason(&bytes, error_type.as_deref()) {
                ErrorReason::Filtered(reason) => return Outcome::Failed(reason).into(),
                ErrorReason::Quoted(excerpt) => excerpt,
            };
            return match classify_status(status.as_u16(), retry_after, &excerpt) {
                StatusClass::Definite { reason } => Outcome::Failed(reason),
                StatusClass::NothingHappened(refusal) => Outcome::Refused(refusal),
                StatusClass::Unknown { reason } => Outcome::Unknown(reason),
            }
            .into();
        }
        let decoded = self.codec.decode(&bytes, status.as_u16());
        let usage = decoded.usage.map(crate::chat::TokenCounts::to_usage);
        let mut facts = AnswerFacts::default();
        let outcome = match decoded.answer {
            Ok(answer) => {
                facts = AnswerFacts::of(
                    &answer,
                    AnswerFacts::model_named(&bytes),
                    call.trace.is_some(),
                );
                conclude(call.shape, answer, sink).await
            }
            Err(outcome) => outcome,
        };
        Reply {
            outcome,
            usage,
            facts,
        }
    }
}

/// A count's answer, read as its type.
fn counted<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    serde_json::from_slice(bytes).ok()
}

impl ProviderClient for HttpClient {
    fn call<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Reply> {
        Box::pin(self.send_call(call, None))
    }

    fn count_tokens<'a>(&'a self, text: &'a str) -> BoxFuture<'a, Option<(u32, &'static str)>> {
        Box::pin(HttpClient::count_tokens(self, text))
    }

    fn stream<'a>(&'a self, call: &'a Call, sink: DeltaSink) -> BoxFuture<'a, Reply> {
        Box::pin(async move { self.send_call(call, Some(&sink)).await })
    }
}

/// An Azure OpenAI deployment's chat completions: the resource endpoint
/// (`https://<resource>.openai.azure.com`, with or without its `/openai`),
/// the deployment, and the API version every call must name.
pub fn azure_endpoint(base_url: &str, deployment: &str, api_version: &str) -> String {
    let base = base_url.trim_end_matches('/');
    let base = base.strip_suffix("/openai").unwrap_or(base);
    format!("{base}/openai/deployments/{deployment}/chat/completions?api-version={api_version}")
}

/// Gemini's server root, given with or without its `/v1beta`.
fn gemini_root(base_url: &str) -> &str {
    let base = base_url.trim_end_matches('/');
    base.strip_suffix("/v1beta").unwrap_or(base)
}

/// The server root of a `base_url` given with or without its `/v1` (the
/// OpenAI SDK, vLLM and Ollama all write `…/v1`): never `/v1/v1`.
pub fn api_root(base_url: &str) -> &str {
    let base = base_url.trim_end_matches('/');
    base.strip_suffix("/v1").unwrap_or(base)
}

/// Reads a response body in chunks, keeping at most `cap` bytes; whether
/// the whole body fit.
async fn read_capped(
    mut response: reqwest::Response,
    cap: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > cap {
            body.extend_from_slice(&chunk[..cap - body.len()]);
            return Ok((body, false));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::openai_chat;
    use crate::providers::CallbackTarget;
    use serde_json::{json, Value};

    fn client(kind: &str, key: &str) -> HttpClient {
        let mut settings: ProviderSettings = toml::from_str(&format!(
            "name = \"p\"\nkind = \"{kind}\"\nbase_url = \"http://127.0.0.1:1\"\nmodel = \"m\""
        ))
        .unwrap();
        settings.api_key = Some(Secret::new(key));
        HttpClient::from_settings(&settings)
    }

    #[test]
    fn secrets_are_redacted_before_a_reason_is_shortened() {
        let key = "sk-unit-test-0123456789abcdefghij";
        let client = client("openai", key);
        let mut call = Call::for_task("a".into(), 1, "t", "p".into(), None, None);
        let target = CallbackTarget {
            url: "http://x".into(),
            secret: Secret::new("cb-secret-abcdef"),
        };
        call.callback = Some(target.clone());
        // The key straddles the 400-character cut.
        let text = format!("{}{key} and {}", "x".repeat(390), target.secret.expose());
        let redacted = client.redact(&call, text);
        assert!(!redacted.contains("sk-unit"), "{redacted}");
        assert!(!redacted.contains("cb-secret"), "{redacted}");
        assert!(redacted.chars().count() <= 401);
        assert!(!format!("{client:?}").contains(key), "Debug hides the key");
    }

    /// A chat route's call for the client's Chat Completions `request`.
    fn chat_call(request: Value) -> Call {
        let read = openai_chat::read_request(&request).unwrap();
        Call::for_chat("a".into(), 1, "chat", read.request, None)
    }

    fn body(client: &HttpClient, call: &Call, streamed: bool) -> Value {
        let encoded = client.codec.encode(&call.request, streamed).unwrap();
        serde_json::from_slice(&encoded.body).unwrap()
    }

    #[test]
    fn a_chat_call_streams_only_when_asked_and_taken_as_it_arrives() {
        let client = client("openai", "sk-unit");
        let call = |stream: bool| {
            chat_call(
                json!({"messages": [{"role": "user", "content": "Hi"}], "stream": stream,
                             "stream_options": {"include_usage": false}}),
            )
        };
        assert!(client.streams(&call(true)));
        assert!(!client.streams(&call(false)));
        let streamed = body(&client, &call(true), true);
        assert_eq!(streamed["stream"], true);
        assert_eq!(streamed["stream_options"], json!({"include_usage": true}));
        // No sink (a qualification's golden call): a whole answer.
        let whole = body(&client, &call(true), false);
        assert!(whole.get("stream").is_none(), "{whole}");
        assert!(whole.get("stream_options").is_none(), "{whole}");
    }

    #[test]
    fn an_anthropic_chat_call_streams_in_anthropics_terms() {
        let client = client("anthropic", "sk-unit");
        let call =
            chat_call(json!({"messages": [{"role": "user", "content": "Hi"}], "stream": true}));
        let streamed = body(&client, &call, true);
        assert_eq!(streamed["stream"], true);
        assert!(streamed.get("stream_options").is_none(), "{streamed}");
        assert!(body(&client, &call, false).get("stream").is_none());
    }

    #[test]
    fn base_urls_with_or_without_v1_reach_the_same_endpoint() {
        for base in [
            "http://h:1",
            "http://h:1/",
            "http://h:1/v1",
            "http://h:1/v1/",
        ] {
            assert_eq!(api_root(base), "http://h:1", "{base}");
        }
        assert_eq!(
            api_root("https://proxy.example/openai/v1"),
            "https://proxy.example/openai"
        );
    }
}
