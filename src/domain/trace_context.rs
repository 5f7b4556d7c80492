//! W3C Trace Context (docs/tracing.md): the `traceparent`, and the
//! `tracestate` beside it, that a job keeps so that whichever process sends
//! its attempts or delivers its webhooks, after a restart or elsewhere,
//! continues the job's one trace.
//!
//! A header that does not parse is ignored, as the recommendation asks: the
//! request is served, in a trace of its own. Nothing here reads more than
//! the header's bounded length.

/// The longest `tracestate` kept: the recommendation's 512 characters.
pub const MAX_TRACESTATE_LEN: usize = 512;

/// Length of a version-00 `traceparent`: `00-` trace id (32) `-` parent id
/// (16) `-` flags (2).
const TRACEPARENT_LEN: usize = 55;

/// A valid trace context: a trace id and parent span id (neither all
/// zeros), its flags, and the vendors' `tracestate` if one came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// The version-00 form, lowercase: what is stored and sent.
    traceparent: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// Parses the headers as a client (or a parent service) sent them.
    /// `None` when `traceparent` is not a valid W3C trace context; a
    /// `tracestate` that is too long or not printable ASCII is dropped,
    /// keeping the parent.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let traceparent = parse_traceparent(traceparent.trim())?;
        let tracestate = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE_LEN)
            .filter(|s| s.bytes().all(|b| (0x20..=0x7e).contains(&b)))
            .map(str::to_owned);
        Some(Self {
            traceparent,
            tracestate,
        })
    }

    /// The context from its parts, as a span gives them: `None` unless
    /// both ids are valid.
    pub fn from_parts(trace_id: &str, span_id: &str, sampled: bool) -> Option<Self> {
        let flags = if sampled { "01" } else { "00" };
        Self::parse(&format!("00-{trace_id}-{span_id}-{flags}"), None)
    }

    /// This context with `tracestate` set (an empty one is none).
    pub fn with_tracestate(mut self, tracestate: &str) -> Self {
        self.tracestate =
            Self::parse(&self.traceparent, Some(tracestate)).and_then(|parsed| parsed.tracestate);
        self
    }

    /// The stored form: `traceparent`, then `tracestate` on a line of its
    /// own when there is one (a header value holds no line break).
    pub fn to_column(&self) -> String {
        match &self.tracestate {
            Some(state) => format!("{}\n{state}", self.traceparent),
            None => self.traceparent.clone(),
        }
    }

    /// The context from its stored form; `None` for a value that is not one.
    pub fn from_column(column: &str) -> Option<Self> {
        let (parent, state) = match column.split_once('\n') {
            Some((parent, state)) => (parent, Some(state)),
            None => (column, None),
        };
        Self::parse(parent, state)
    }

    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace id: 32 lowercase hex digits.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The parent span's id: 16 lowercase hex digits.
    pub fn span_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// The W3C headers that hand this context on: `traceparent`, and
    /// `tracestate` when there is one.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = vec![("traceparent", self.traceparent.clone())];
        if let Some(state) = &self.tracestate {
            headers.push(("tracestate", state.clone()));
        }
        headers
    }

    /// Whether the parent recorded its span (the `sampled` flag).
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.traceparent[53..55], 16).is_ok_and(|flags| flags & 1 == 1)
    }
}

/// A `traceparent` in its version-00 form, lowercase; `None` if invalid.
/// A later version is read by its first four fields, as the recommendation
/// asks, and passed on as version 00.
fn parse_traceparent(raw: &str) -> Option<String> {
    if raw.len() < TRACEPARENT_LEN || !raw.is_ascii() {
        return None;
    }
    let version = &raw[0..2];
    if !is_hex(version) || version.eq_ignore_ascii_case("ff") {
        return None;
    }
    let exact = version == "00";
    if (exact && raw.len() != TRACEPARENT_LEN)
        || (!exact && raw.len() > TRACEPARENT_LEN && raw.as_bytes()[TRACEPARENT_LEN] != b'-')
    {
        return None;
    }
    let bytes = raw.as_bytes();
    if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
        return None;
    }
    let (trace_id, span_id, flags) = (&raw[3..35], &raw[36..52], &raw[53..55]);
    let valid = [trace_id, span_id, flags].iter().all(|part| is_hex(part))
        && !is_zero(trace_id)
        && !is_zero(span_id);
    valid.then(|| format!("00-{trace_id}-{span_id}-{flags}").to_ascii_lowercase())
}

/// Lowercase (or uppercase, which is refused by the recommendation but
/// harmless to read) hex digits only.
fn is_hex(part: &str) -> bool {
    part.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_zero(part: &str) -> bool {
    part.bytes().all(|b| b == b'0')
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_gives_its_ids_and_flag() {
        let context = TraceContext::parse(VALID, None).unwrap();
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.span_id(), "00f067aa0ba902b7");
        assert!(context.sampled());
        assert_eq!(context.traceparent(), VALID);
    }

    #[test]
    fn invalid_traceparents_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é",
        ] {
            assert_eq!(TraceContext::parse(bad, None), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_fields_and_passed_on_as_00() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more";
        assert_eq!(
            TraceContext::parse(later, None).unwrap().traceparent(),
            VALID
        );
    }

    #[test]
    fn the_stored_form_keeps_both_headers() {
        let context = TraceContext::parse(VALID, Some("vendor=a,other=b")).unwrap();
        let stored = context.to_column();
        assert_eq!(TraceContext::from_column(&stored), Some(context));
        let bare = TraceContext::parse(VALID, None).unwrap();
        assert_eq!(bare.to_column(), VALID);
        assert_eq!(TraceContext::from_column(VALID), Some(bare));
    }

    #[test]
    fn a_tracestate_too_long_or_not_text_is_dropped_and_the_parent_kept() {
        let long = "a=".to_owned() + &"b".repeat(MAX_TRACESTATE_LEN);
        for state in [long.as_str(), "a=b\u{7f}", ""] {
            let context = TraceContext::parse(VALID, Some(state)).unwrap();
            assert_eq!(context.tracestate(), None, "{state:?}");
        }
    }

    #[test]
    fn parts_make_a_context_and_invalid_parts_none() {
        let context = TraceContext::from_parts(
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "00f067aa0ba902b7",
            false,
        )
        .unwrap();
        assert!(!context.sampled());
        assert_eq!(
            TraceContext::from_parts("0".repeat(32).as_str(), "00f067aa0ba902b7", true),
            None
        );
    }
}
