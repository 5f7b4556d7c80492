//! AWS Bedrock's transport: the signature every request carries (SigV4, by
//! AWS's own `aws-sigv4`), the model's path label, and the frames of
//! ConverseStream's binary event stream (decoded by AWS's own
//! `aws-smithy-eventstream`). What the requests, answers and events say is
//! the codec's: `chat::bedrock`.

use crate::domain::Secret;

/// The credentials and region every request is signed with, read once
/// from the standard AWS variables.
#[derive(Clone)]
pub struct AwsSigning {
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
    pub region: String,
}

impl std::fmt::Debug for AwsSigning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsSigning")
            .field("access_key_id", &self.access_key_id)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// The service name Bedrock Runtime's requests are signed for.
pub const SIGNING_NAME: &str = "bedrock";

/// The headers that sign `body`, sent as `POST` to `url` with
/// `content-type` (and `accept`) at `time`: `authorization`, `x-amz-date`,
/// and `x-amz-security-token` with a session token.
pub fn sign(
    signing: &AwsSigning,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    time: std::time::SystemTime,
) -> Result<Vec<(String, String)>, String> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings};
    let identity: aws_smithy_runtime_api::client::identity::Identity =
        aws_credential_types::Credentials::new(
            signing.access_key_id.clone(),
            signing.secret_access_key.expose().to_owned(),
            signing
                .session_token
                .as_ref()
                .map(|t| t.expose().to_owned()),
            None,
            "onejob",
        )
        .into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(&signing.region)
        .name(SIGNING_NAME)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let request = SignableRequest::new(
        "POST",
        url,
        headers.iter().copied(),
        SignableBody::Bytes(body),
    )
    .map_err(|e| e.to_string())?;
    let (instructions, _) = aws_sigv4::http_request::sign(request, &params)
        .map_err(|e| e.to_string())?
        .into_parts();
    Ok(instructions
        .headers()
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect())
}

/// A model id as a path label: `:` and `/` percent-encoded
/// (`anthropic.claude-3-haiku-20240307-v1:0` →
/// `anthropic.claude-3-haiku-20240307-v1%3A0`).
pub fn model_label(model: &str) -> String {
    model
        .chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '-' | '_' | '.' | '~' => c.to_string(),
            other => {
                let mut bytes = [0u8; 4];
                other
                    .encode_utf8(&mut bytes)
                    .bytes()
                    .map(|b| format!("%{b:02X}"))
                    .collect()
            }
        })
        .collect()
}

/// The header of a frame, as text.
pub fn header_of(message: &aws_smithy_types::event_stream::Message, name: &str) -> String {
    message
        .headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| h.value().as_string().ok())
        .map(|s| s.as_str().to_owned())
        .unwrap_or_default()
}

/// A frame's payload as text (`{}` when empty).
pub fn payload_of(message: &aws_smithy_types::event_stream::Message) -> Result<String, String> {
    if message.payload().is_empty() {
        return Ok("{}".to_owned());
    }
    std::str::from_utf8(message.payload())
        .map(str::to_owned)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_id_is_one_path_label() {
        assert_eq!(
            model_label("anthropic.claude-3-haiku-20240307-v1:0"),
            "anthropic.claude-3-haiku-20240307-v1%3A0"
        );
    }
}
