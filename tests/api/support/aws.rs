//! What the Bedrock fake needs of AWS: the test credentials, a SigV4
//! verifier that recomputes a request's signature with AWS's own signer,
//! and event-stream frames written with AWS's own encoder.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::fake_provider::RecordedRequest;

/// The credentials the test configurations resolve (`test_environment`).
pub const ACCESS_KEY_ID: &str = "AKIDONEJOBTEST0000001";
pub const SECRET_ACCESS_KEY: &str = "onejob-test-secret-access-key-0123456789abcd";
pub const SESSION_TOKEN: &str = "onejob-test-session-token-0123456789";
pub const REGION: &str = "us-test-1";

/// `YYYYMMDDTHHMMSSZ` as a time.
fn amz_date(text: &str) -> Option<SystemTime> {
    let at = chrono::NaiveDateTime::parse_from_str(text, "%Y%m%dT%H%M%SZ").ok()?;
    let seconds = u64::try_from(at.and_utc().timestamp()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds))
}

/// Checks a request's SigV4 signature as Bedrock does: the credential's
/// key, region and service (`bedrock`), the session token, a fresh date,
/// and the signature itself, recomputed over the signed headers, the path
/// and the body bytes. Why not, if it fails.
pub fn verify_sigv4(request: &RecordedRequest) -> Result<(), String> {
    let authorization = request
        .header("authorization")
        .ok_or("no Authorization header")?;
    let fields = authorization
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or("not a SigV4 signature")?;
    let field = |name: &str| {
        fields
            .split(", ")
            .find_map(|f| f.strip_prefix(&format!("{name}=")))
            .map(str::to_owned)
            .ok_or(format!("no {name} in the signature"))
    };
    let credential = field("Credential")?;
    let scope: Vec<&str> = credential.split('/').collect();
    if scope.len() != 5 || scope[0] != ACCESS_KEY_ID || scope[2] != REGION || scope[3] != "bedrock"
    {
        return Err(format!(
            "signed for another key, region or service: {credential}"
        ));
    }
    if request.header("x-amz-security-token") != Some(SESSION_TOKEN) {
        return Err("the session token is missing".into());
    }
    let time = amz_date(request.header("x-amz-date").ok_or("no x-amz-date")?)
        .ok_or("a malformed x-amz-date")?;
    let skew = SystemTime::now()
        .duration_since(time)
        .unwrap_or_else(|e| e.duration());
    if skew > Duration::from_secs(300) {
        return Err("signed more than 5 minutes away".into());
    }
    let signed_headers = field("SignedHeaders")?;
    let headers: Vec<(&str, &str)> = signed_headers
        .split(';')
        .filter(|name| !matches!(*name, "x-amz-date" | "x-amz-security-token"))
        .map(|name| (name, request.header(name).unwrap_or_default()))
        .collect();
    let host = request.header("host").ok_or("no Host header")?;
    let url = format!("http://{host}{}", request.path);
    let signing = onejob::providers::bedrock::AwsSigning {
        access_key_id: ACCESS_KEY_ID.to_owned(),
        secret_access_key: onejob::domain::Secret::new(SECRET_ACCESS_KEY),
        session_token: Some(onejob::domain::Secret::new(SESSION_TOKEN)),
        region: REGION.to_owned(),
    };
    let expected = onejob::providers::bedrock::sign(&signing, &url, &headers, &request.raw, time)?;
    let expected = expected
        .iter()
        .find(|(name, _)| name == "authorization")
        .map(|(_, value)| value.as_str())
        .unwrap_or_default();
    let signature = |text: &str| {
        text.split("Signature=")
            .nth(1)
            .unwrap_or_default()
            .to_owned()
    };
    if signature(expected) != signature(authorization) {
        return Err(
            "The request signature we calculated does not match the signature you \
                    provided. Check your AWS Secret Access Key and signing method."
                .into(),
        );
    }
    Ok(())
}

/// One event-stream frame: `:message-type`, the event's (or exception's)
/// type and a JSON payload.
pub fn frame(message_type: &str, kind: &str, payload: &Value) -> Vec<u8> {
    use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
    let type_header = if message_type == "exception" {
        ":exception-type"
    } else {
        ":event-type"
    };
    let message = Message::new_from_parts(
        vec![
            Header::new(
                ":message-type",
                HeaderValue::String(message_type.to_owned().into()),
            ),
            Header::new(type_header, HeaderValue::String(kind.to_owned().into())),
            Header::new(
                ":content-type",
                HeaderValue::String("application/json".into()),
            ),
        ],
        bytes::Bytes::from(payload.to_string()),
    );
    let mut out = Vec::new();
    aws_smithy_eventstream::frame::write_message_to(&message, &mut out).expect("a frame writes");
    out
}
