//! Providers over HTTP: OpenAI-compatible chat completions and Anthropic
//! messages, with reqwest. No automatic retries and no redirects (a repeat
//! could run the work twice); each call carries the attempt id as
//! `Idempotency-Key` and `X-Request-Id`; every outcome is classified by
//! [`super::classify`].

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{json, Value};

use super::classify::{
    azure_content_filter, classify_status, parse_retry_after_headers, StatusClass,
};
use super::streaming::{self, DeltaSink};
use super::{
    chat, BoxFuture, Call, MaxTokensField, ProviderClient, ProviderKind, ProviderSettings, Reply,
};
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
    model: String,
    api_key: Option<Secret>,
    /// `azure_openai`: an Entra ID token, sent as a bearer instead of a key.
    bearer_token: Option<Secret>,
    /// `bedrock`: what every request is signed with.
    aws: Option<super::bedrock::AwsSigning>,
    /// How long a token count may take: the soft timeout.
    count_timeout: Duration,
    max_tokens: u32,
    temperature: Option<f64>,
    max_response_bytes: usize,
    max_tokens_field: MaxTokensField,
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
            endpoint,
            model: config.model.clone().unwrap_or_default(),
            api_key: config.api_key.clone(),
            bearer_token: config.bearer_token.clone(),
            aws: config.aws.clone(),
            count_timeout: Duration::from_millis(config.timeout_ms),
            max_tokens: config.max_tokens,
            temperature: config.temperature,
            max_response_bytes: config.max_response_bytes,
            max_tokens_field: config.max_tokens_field,
        }
    }

    /// Whether this client streams a call that asks for it: every HTTP kind
    /// does.
    fn streams(&self, call: &Call) -> bool {
        call.wants_stream() && self.kind.is_http()
    }

    /// Where the call goes: Gemini names the method (and a stream's
    /// framing) in the URL.
    fn url(&self, streamed: bool) -> String {
        match (self.kind, streamed) {
            (ProviderKind::Gemini, true) => {
                format!("{}:streamGenerateContent?alt=sse", self.endpoint)
            }
            (ProviderKind::Gemini, false) => format!("{}:generateContent", self.endpoint),
            (ProviderKind::Bedrock, true) => format!("{}/converse-stream", self.endpoint),
            (ProviderKind::Bedrock, false) => format!("{}/converse", self.endpoint),
            _ => self.endpoint.clone(),
        }
    }

    /// Gemini's request for the call, or why it cannot carry it.
    fn gemini_body(&self, call: &Call) -> Result<Value, String> {
        let ask = super::gemini::Ask {
            chat: call.chat.as_ref(),
            prompt: &call.prompt,
            output_schema: call.output_schema.as_ref(),
            max_tokens: self.max_tokens,
            temperature: call.temperature.or(self.temperature),
        };
        let request = super::gemini::request(&ask).map_err(|refused| refused.0)?;
        Ok(serde_json::to_value(request).expect("a request serializes"))
    }

    /// The request body; `streaming` when the caller takes the answer's
    /// deltas as they arrive (a call without a sink is never streamed).
    fn body(&self, call: &Call, streaming: bool) -> Value {
        let mut body = self.body_whole(call);
        if self.kind == ProviderKind::Gemini {
            return body;
        }
        if streaming && self.streams(call) {
            body["stream"] = json!(true);
            // Usage is asked for whatever the client asked: the stored
            // answer has it, as a non-streamed one does (Anthropic always
            // sends it).
            if self.kind != ProviderKind::Anthropic {
                body["stream_options"] = json!({ "include_usage": true });
            }
        }
        body
    }

    fn body_whole(&self, call: &Call) -> Value {
        let mut body = self.body_for_model(call);
        // Azure names the model by the deployment in the path; its request
        // has no `model` member.
        if self.kind == ProviderKind::AzureOpenai {
            if let Some(body) = body.as_object_mut() {
                body.remove("model");
            }
        }
        body
    }

    fn body_for_model(&self, call: &Call) -> Value {
        if let Some(request) = &call.chat {
            let defaults = chat::ChatDefaults {
                max_tokens: self.max_tokens,
                temperature: self.temperature,
            };
            let mut body = chat::request_body(
                self.kind,
                &self.model,
                self.max_tokens_field,
                defaults,
                request,
            );
            if let Some(t) = call.temperature {
                body["temperature"] = json!(t);
            }
            return body;
        }
        let temperature = call.temperature.or(self.temperature);
        let messages = json!([{ "role": "user", "content": call.prompt }]);
        let mut body =
            json!({ "model": self.model, "max_tokens": self.max_tokens, "messages": messages });
        if let Some(t) = temperature {
            body["temperature"] = json!(t);
        }
        if let Some(schema) = &call.output_schema {
            match self.kind {
                ProviderKind::Anthropic => {
                    body["output_format"] = json!({ "type": "json_schema", "schema": schema });
                }
                _ => {
                    body["response_format"] = json!({
                        "type": "json_schema",
                        "json_schema": { "name": schema_name(&call.task), "schema": schema, "strict": true }
                    });
                }
            }
        }
        body
    }

    fn headers(&self, call: &Call) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let id = HeaderValue::from_str(&call.request_id).expect("request ids are ASCII");
        headers.insert("Idempotency-Key", id.clone());
        headers.insert("X-Request-Id", id);
        if self.kind == ProviderKind::Anthropic {
            headers.insert(
                "anthropic-version",
                HeaderValue::from_static(ANTHROPIC_VERSION),
            );
            if call.output_schema.is_some() {
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
                json!({"model": self.model, "messages": [{"role": "user", "content": text}]}),
                "Anthropic count_tokens",
            ),
            ProviderKind::Gemini => (
                format!("{}:countTokens", self.endpoint),
                json!({"contents": [{"role": "user", "parts": [{"text": text}]}]}),
                "Gemini countTokens",
            ),
            ProviderKind::Bedrock => (
                format!("{}/count-tokens", self.endpoint),
                json!({"input": {"converse": {"messages": [{"role": "user", "content": [{"text": text}]}]}}}),
                "Bedrock CountTokens",
            ),
            _ => return None,
        };
        let body = serde_json::to_vec(&body).expect("JSON serializes");
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
        if let Some(aws) = &self.aws {
            let signed = super::bedrock::sign(
                aws,
                &url,
                &[("content-type", "application/json")],
                &body,
                std::time::SystemTime::now(),
            )
            .ok()?;
            for (name, value) in signed {
                let name = reqwest::header::HeaderName::from_bytes(name.as_bytes()).ok()?;
                headers.insert(name, HeaderValue::from_str(&value).ok()?);
            }
        }
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
        let answer: Value = response.json().await.ok()?;
        let count = ["input_tokens", "totalTokens", "inputTokens"]
            .iter()
            .find_map(|field| answer[field].as_u64())?;
        Some((u32::try_from(count).unwrap_or(u32::MAX), method))
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

    /// Bedrock's request for the call, or why it cannot carry it.
    fn bedrock_body(&self, call: &Call) -> Result<Value, String> {
        let ask = super::bedrock::Ask {
            chat: call.chat.as_ref(),
            prompt: &call.prompt,
            task: &call.task,
            output_schema: call.output_schema.as_ref(),
            max_tokens: self.max_tokens,
            temperature: call.temperature.or(self.temperature),
        };
        let request = super::bedrock::request(&ask)?;
        Ok(serde_json::to_value(request).expect("a request serializes"))
    }

    async fn send(&self, call: &Call, sink: Option<&DeltaSink>) -> Reply {
        let streamed = sink.is_some() && self.streams(call);
        let body = match self.kind {
            ProviderKind::Gemini => self.gemini_body(call),
            ProviderKind::Bedrock => self.bedrock_body(call),
            _ => Ok(self.body(call, sink.is_some())),
        };
        let body = match body {
            Ok(body) => serde_json::to_vec(&body).expect("JSON serializes"),
            // Nothing was sent: the request cannot be put in its terms.
            Err(why) => return Outcome::Failed(Reason::new(why)).into(),
        };
        let url = self.url(streamed);
        let mut headers = self.headers(call);
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(aws) = &self.aws {
            // Signed over exactly the bytes sent.
            let signed = super::bedrock::sign(
                aws,
                &url,
                &[("content-type", "application/json")],
                &body,
                std::time::SystemTime::now(),
            );
            match signed {
                Ok(signed) => {
                    for (name, value) in signed {
                        if let (Ok(name), Ok(mut value)) = (
                            reqwest::header::HeaderName::from_bytes(name.as_bytes()),
                            HeaderValue::from_str(&value),
                        ) {
                            value.set_sensitive(true);
                            headers.insert(name, value);
                        }
                    }
                }
                Err(why) => {
                    return Outcome::Failed(Reason::new(format!(
                        "the request could not be signed: {why}"
                    )))
                    .into()
                }
            }
        }
        let sent = self
            .client
            .post(url)
            .headers(headers)
            .body(body)
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
        let content_type = header("content-type").unwrap_or_default();
        let event_stream = content_type.starts_with("text/event-stream");
        let error_type = header("x-amzn-errortype");
        if let (Some(sink), true, true) = (
            sink,
            status.is_success(),
            content_type.starts_with("application/vnd.amazon.eventstream"),
        ) {
            let (outcome, usage) =
                streaming::read_aws_event_stream(response, self.max_response_bytes, sink).await;
            return Reply { outcome, usage };
        }
        if let (Some(sink), true, true) = (sink, status.is_success(), event_stream) {
            let (outcome, usage) =
                streaming::read_stream(self.kind, response, self.max_response_bytes, sink).await;
            return Reply { outcome, usage };
        }
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
            // Shortened only after redaction (see `call`).
            let excerpt = String::from_utf8_lossy(&bytes).into_owned();
            // Gemini says how long to wait in the body, not a header.
            let retry_after = match self.kind {
                ProviderKind::Gemini => retry_after.or_else(|| {
                    serde_json::from_slice::<Value>(&bytes)
                        .ok()
                        .and_then(|error| super::gemini::retry_delay(&error))
                }),
                _ => retry_after,
            };
            // Bedrock names its error's type: the reason starts with it.
            let excerpt = match self.kind {
                ProviderKind::Bedrock => {
                    let said = serde_json::from_slice::<Value>(&bytes).unwrap_or_default();
                    match super::bedrock::error_type(error_type.as_deref(), &said) {
                        Some(kind) => format!(
                            "{kind}: {}",
                            said["message"].as_str().unwrap_or(excerpt.trim())
                        ),
                        None => excerpt,
                    }
                }
                _ => excerpt,
            };
            // Azure's content filter: definite, with what it filtered.
            if let Some(filtered) = (self.kind == ProviderKind::AzureOpenai)
                .then(|| serde_json::from_slice::<Value>(&bytes).ok())
                .flatten()
                .as_ref()
                .and_then(azure_content_filter)
            {
                return Outcome::Failed(Reason::new(filtered).with_detail(excerpt.trim())).into();
            }
            return match classify_status(status.as_u16(), retry_after, excerpt.trim()) {
                StatusClass::Definite { reason } => Outcome::Failed(reason),
                StatusClass::NothingHappened(refusal) => Outcome::Refused(refusal),
                StatusClass::Unknown { reason } => Outcome::Unknown(reason),
            }
            .into();
        }
        let envelope: Value = match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(e) => {
                return Outcome::Unknown(
                    Reason::new(format!("the answer is truncated or garbled ({status})"))
                        .with_detail(&e.to_string()),
                )
                .into()
            }
        };
        match self.kind {
            ProviderKind::Gemini => return self.gemini_reply(call, &envelope, sink).await,
            ProviderKind::Bedrock => return self.bedrock_reply(call, &envelope, sink).await,
            _ => {}
        }
        let usage = match self.kind {
            ProviderKind::Anthropic => super::anthropic_usage(&envelope["usage"]),
            _ => super::openai_usage(&envelope["usage"]),
        };
        let outcome = if call.chat.is_some() {
            match chat::answer(self.kind, &envelope) {
                Ok(answer) => {
                    // A provider that answered a stream whole: its answer
                    // is handed on as it came.
                    if let Some(sink) = sink {
                        for delta in streaming::whole_answer_deltas(&answer) {
                            let _ = sink.send(delta).await;
                        }
                    }
                    Outcome::Succeeded(answer)
                }
                Err(reason) => Outcome::Failed(Reason::invalid_output(reason)),
            }
        } else {
            match self.answer_text(&envelope) {
                Err(reason) => Outcome::Failed(Reason::invalid_output(reason)),
                Ok(text) => match serde_json::from_str::<Value>(text.trim()) {
                    Ok(answer) => Outcome::Succeeded(answer),
                    Err(_) => {
                        let excerpt = text.trim();
                        Outcome::Failed(Reason::invalid_output(format!(
                            "the answer is not JSON: {excerpt:?}"
                        )))
                    }
                },
            }
        };
        Reply { outcome, usage }
    }

    /// A Gemini answer as a reply: a blocked prompt or an answer stopped
    /// by a filter is a definite failure naming why.
    async fn gemini_reply(&self, call: &Call, envelope: &Value, sink: Option<&DeltaSink>) -> Reply {
        use super::gemini;
        let response: gemini::GenerateContentResponse =
            match serde_json::from_value(envelope.clone()) {
                Ok(response) => response,
                Err(e) => {
                    return Outcome::Failed(Reason::invalid_output(format!(
                        "the answer is not a GenerateContentResponse: {e}"
                    )))
                    .into()
                }
            };
        let usage = response
            .usage_metadata
            .and_then(|u| super::openai_usage(&u.to_openai()));
        if let Some(why) = gemini::blocked(&response) {
            return Reply {
                outcome: Outcome::Failed(Reason::new(why)),
                usage,
            };
        }
        let outcome = if call.chat.is_some() {
            match gemini::answer(&response) {
                Ok(answer) => {
                    if let Some(sink) = sink {
                        for delta in streaming::whole_answer_deltas(&answer) {
                            let _ = sink.send(delta).await;
                        }
                    }
                    Outcome::Succeeded(answer)
                }
                Err(reason) => Outcome::Failed(Reason::invalid_output(reason)),
            }
        } else {
            match gemini::answer_text(&response) {
                Err(reason) => Outcome::Failed(Reason::invalid_output(reason)),
                Ok(text) => match serde_json::from_str::<Value>(text.trim()) {
                    Ok(answer) => Outcome::Succeeded(answer),
                    Err(_) => Outcome::Failed(Reason::invalid_output(format!(
                        "the answer is not JSON: {:?}",
                        text.trim()
                    ))),
                },
            }
        };
        Reply { outcome, usage }
    }

    /// A Converse answer as a reply: a stop for a guardrail or a content
    /// filter is a definite failure naming it.
    async fn bedrock_reply(
        &self,
        call: &Call,
        envelope: &Value,
        sink: Option<&DeltaSink>,
    ) -> Reply {
        use super::bedrock;
        let response: bedrock::ConverseResponse = match serde_json::from_value(envelope.clone()) {
            Ok(response) => response,
            Err(e) => {
                return Outcome::Failed(Reason::invalid_output(format!(
                    "the answer is not a ConverseResponse: {e}"
                )))
                .into()
            }
        };
        let usage = super::openai_usage(&response.usage.to_openai());
        if let Some(why) = bedrock::blocked(&response) {
            return Reply {
                outcome: Outcome::Failed(Reason::new(why)),
                usage,
            };
        }
        let outcome = if call.chat.is_some() {
            let answer = bedrock::answer(&response);
            if let Some(sink) = sink {
                for delta in streaming::whole_answer_deltas(&answer) {
                    let _ = sink.send(delta).await;
                }
            }
            Outcome::Succeeded(answer)
        } else {
            match bedrock::answer_text(&response) {
                Err(reason) => Outcome::Failed(Reason::invalid_output(reason)),
                Ok(text) => match serde_json::from_str::<Value>(text.trim()) {
                    Ok(answer) => Outcome::Succeeded(answer),
                    Err(_) => Outcome::Failed(Reason::invalid_output(format!(
                        "the answer is not JSON: {:?}",
                        text.trim()
                    ))),
                },
            }
        };
        Reply { outcome, usage }
    }

    /// The model's text out of the provider's response envelope.
    fn answer_text(&self, envelope: &Value) -> Result<String, String> {
        match self.kind {
            ProviderKind::Anthropic => {
                let parts = envelope["content"]
                    .as_array()
                    .ok_or("the response has no content")?;
                let text: String = parts.iter().filter_map(|p| p["text"].as_str()).collect();
                if text.is_empty() {
                    return Err("the response has no text content".into());
                }
                Ok(text)
            }
            _ => {
                let message = &envelope["choices"][0]["message"];
                if let Some(refusal) = message["refusal"].as_str() {
                    return Err(format!("the model refused: {refusal}"));
                }
                message["content"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| "the response has no message content".into())
            }
        }
    }
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

/// OpenAI schema names allow `[a-zA-Z0-9_-]`.
fn schema_name(task: &str) -> String {
    task.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// An error with its sources, for a reason people can act on.
pub(super) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::CallbackTarget;

    fn client_with_key(key: &str) -> HttpClient {
        let mut settings: ProviderSettings = toml::from_str(
            "name = \"p\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:1\"\nmodel = \"m\"",
        )
        .unwrap();
        settings.api_key = Some(Secret::new(key));
        HttpClient::from_settings(&settings)
    }

    #[test]
    fn secrets_are_redacted_before_a_reason_is_shortened() {
        let key = "sk-unit-test-0123456789abcdefghij";
        let client = client_with_key(key);
        let target = CallbackTarget {
            url: "http://x".into(),
            secret: Secret::new("cb-secret-abcdef"),
        };
        let call = Call {
            request_id: "a".into(),
            attempt_number: 1,
            task: "t".into(),
            prompt: "p".into(),
            output_schema: None,
            temperature: None,
            callback: Some(target.clone()),
            chat: None,
        };
        // The key straddles the 400-character cut.
        let text = format!("{}{key} and {}", "x".repeat(390), target.secret.expose());
        let redacted = client.redact(&call, text);
        assert!(!redacted.contains("sk-unit"), "{redacted}");
        assert!(!redacted.contains("cb-secret"), "{redacted}");
        assert!(redacted.chars().count() <= 401);
        assert!(!format!("{client:?}").contains(key), "Debug hides the key");
    }

    /// A chat task's call carrying the client's `chat` request.
    fn chat_call(chat: Value) -> Call {
        Call {
            request_id: "a".into(),
            attempt_number: 1,
            task: "chat".into(),
            prompt: String::new(),
            output_schema: None,
            temperature: None,
            callback: None,
            chat: Some(chat),
        }
    }

    #[test]
    fn a_chat_call_streams_only_when_asked_and_taken_as_it_arrives() {
        let client = client_with_key("sk-unit");
        let call = |stream: bool| {
            chat_call(json!({"messages": [], "stream": stream,
                             "stream_options": {"include_usage": false}}))
        };
        let streamed = client.body(&call(true), true);
        assert_eq!(streamed["stream"], true);
        assert_eq!(streamed["stream_options"], json!({"include_usage": true}));
        // No sink (a qualification's golden call), or no stream asked for:
        // a whole answer.
        for body in [
            client.body(&call(true), false),
            client.body(&call(false), true),
        ] {
            assert!(body.get("stream").is_none(), "{body}");
            assert!(body.get("stream_options").is_none(), "{body}");
        }
    }

    #[test]
    fn an_anthropic_chat_call_streams_in_anthropics_terms() {
        let mut settings: ProviderSettings = toml::from_str(
            "name = \"c\"\nkind = \"anthropic\"\nbase_url = \"http://127.0.0.1:1\"\nmodel = \"m\"",
        )
        .unwrap();
        settings.api_key = Some(Secret::new("sk-unit"));
        let client = HttpClient::from_settings(&settings);
        let call =
            chat_call(json!({"messages": [{"role": "user", "content": "Hi"}], "stream": true}));
        let streamed = client.body(&call, true);
        assert_eq!(streamed["stream"], true);
        assert!(streamed.get("stream_options").is_none(), "{streamed}");
        assert!(client.body(&call, false).get("stream").is_none());
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

    #[test]
    fn schema_names_keep_to_the_allowed_characters() {
        assert_eq!(schema_name("sum.marize v2"), "sum_marize_v2");
    }
}
