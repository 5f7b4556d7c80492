//! An OpenTelemetry collector for the tests: it takes OTLP/HTTP exports
//! over real HTTP on 127.0.0.1 (the recording server of
//! [`webhook_receiver`](super::webhook_receiver), which can also refuse) and decodes each with the protocol's own definitions
//! (`opentelemetry-proto`). It prints a trace as an indented span tree.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;

use super::webhook_receiver::WebhookReceiver;

/// An attribute's value, as the span carried it.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Text(String),
    Int(i64),
    Bool(bool),
    Float(f64),
    Texts(Vec<String>),
}

impl Attr {
    fn of(value: Option<Any>) -> Self {
        match value {
            Some(Any::StringValue(s)) => Self::Text(s),
            Some(Any::IntValue(i)) => Self::Int(i),
            Some(Any::BoolValue(b)) => Self::Bool(b),
            Some(Any::DoubleValue(f)) => Self::Float(f),
            Some(Any::ArrayValue(array)) => Self::Texts(
                array
                    .values
                    .into_iter()
                    .filter_map(|v| match v.value {
                        Some(Any::StringValue(s)) => Some(s),
                        _ => None,
                    })
                    .collect(),
            ),
            other => Self::Text(format!("{other:?}")),
        }
    }

    fn shown(&self) -> String {
        match self {
            Self::Text(s) => format!("{s:?}"),
            Self::Int(i) => i.to_string(),
            Self::Bool(b) => b.to_string(),
            Self::Float(f) => f.to_string(),
            Self::Texts(v) => format!("{v:?}"),
        }
    }
}

/// One decoded span.
#[derive(Clone, Debug)]
pub struct Span {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root.
    pub parent_span_id: String,
    pub name: String,
    /// The protocol's number: 2 server, 3 client.
    pub kind: i32,
    pub attributes: BTreeMap<String, Attr>,
    /// (trace id, span id) of each link.
    pub links: Vec<(String, String)>,
    /// The protocol's number: 0 unset, 1 ok, 2 error.
    pub status: i32,
    pub start_ns: u64,
}

impl Span {
    pub fn attr(&self, key: &str) -> Option<&Attr> {
        self.attributes.get(key)
    }

    /// A text attribute, or panics naming the span.
    pub fn text(&self, key: &str) -> &str {
        match self.attr(key) {
            Some(Attr::Text(s)) => s,
            other => panic!("span {:?} has no text {key}: {other:?}", self.name),
        }
    }

    pub fn int(&self, key: &str) -> i64 {
        match self.attr(key) {
            Some(Attr::Int(i)) => *i,
            other => panic!("span {:?} has no number {key}: {other:?}", self.name),
        }
    }

    pub fn traceparent_prefix(&self) -> String {
        format!("00-{}-{}-", self.trace_id, self.span_id)
    }
}

fn decoded(body: &[u8]) -> Vec<Span> {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
    let mut spans = Vec::new();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .map(|r| r.attributes)
            .unwrap_or_default()
            .into_iter()
            .find(|kv| kv.key == "service.name")
            .map(|kv| Attr::of(kv.value.and_then(|v| v.value)).shown())
            .unwrap_or_default()
            .trim_matches('"')
            .to_owned();
        for scope in resource.scope_spans {
            for span in scope.spans {
                spans.push(Span {
                    service: service.clone(),
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    attributes: attributes(span.attributes),
                    links: span
                        .links
                        .into_iter()
                        .map(|l| (hex::encode(l.trace_id), hex::encode(l.span_id)))
                        .collect(),
                    status: span.status.map(|s| s.code).unwrap_or(0),
                    start_ns: span.start_time_unix_nano,
                });
            }
        }
    }
    spans
}

fn attributes(list: Vec<KeyValue>) -> BTreeMap<String, Attr> {
    list.into_iter()
        .map(|kv| (kv.key, Attr::of(kv.value.and_then(|v| v.value))))
        .collect()
}

/// The collector: OTLP/HTTP at [`Collector::endpoint`].
pub struct Collector {
    receiver: WebhookReceiver,
}

impl Collector {
    pub async fn start() -> Self {
        Self {
            receiver: WebhookReceiver::start().await,
        }
    }

    /// The base URL onejob is configured with (`/v1/traces` is added).
    pub fn endpoint(&self) -> String {
        self.receiver.url("")
    }

    /// Answers the next `n` exports 500.
    pub fn refuse_first(&self, n: usize) {
        self.receiver.fail_first(n);
    }

    /// How many exports came.
    pub fn exports(&self) -> usize {
        self.receiver.received().len()
    }

    /// Every span exported so far, decoded.
    pub fn spans(&self) -> Vec<Span> {
        self.receiver
            .received()
            .iter()
            .filter(|r| r.path == "/v1/traces")
            .flat_map(|r| decoded(&r.body))
            .collect()
    }

    /// The spans of one trace.
    pub fn trace(&self, trace_id: &str) -> Vec<Span> {
        self.spans()
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect()
    }

    /// Waits until `done` holds of the spans exported, or panics after
    /// `within` with what came.
    pub async fn wait_until(
        &self,
        what: &str,
        within: Duration,
        done: impl Fn(&[Span]) -> bool,
    ) -> Vec<Span> {
        let deadline = Instant::now() + within;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "the collector saw no {what} within {within:?}; it has:\n{}",
                tree(&spans)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The spans as indented trees, one per root (a span whose parent is not
/// among them), children in start order, each line with its attributes.
pub fn tree(spans: &[Span]) -> String {
    tree_with(spans, true, &|key, _| {
        key.starts_with("gen_ai.") || key.starts_with("onejob.") || key.starts_with("http.")
    })
}

/// [`tree`] with fewer attributes: what tells the attempts and the
/// verdicts apart.
pub fn brief_tree(spans: &[Span]) -> String {
    const KEYS: [&str; 7] = [
        "onejob.provider",
        "onejob.attempt.outcome",
        "onejob.attempt.unknown",
        "onejob.cas.verdict",
        "onejob.failover.provider",
        "onejob.webhook.outcome",
        "http.response.status_code",
    ];
    tree_with(spans, false, &|key, value| {
        KEYS.contains(&key) && value != &Attr::Bool(false)
    })
}

/// What a span's line shows of it: its id, and which attributes.
struct Shown<'a> {
    ids: bool,
    attribute: &'a dyn Fn(&str, &Attr) -> bool,
}

fn tree_with(spans: &[Span], ids: bool, attribute: &dyn Fn(&str, &Attr) -> bool) -> String {
    let shown = Shown { ids, attribute };
    let ids: std::collections::HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let mut children: HashMap<&str, Vec<&Span>> = HashMap::new();
    let mut roots = Vec::new();
    for span in spans {
        if ids.contains(span.parent_span_id.as_str()) {
            children.entry(&span.parent_span_id).or_default().push(span);
        } else {
            roots.push(span);
        }
    }
    roots.sort_by_key(|s| s.start_ns);
    let mut out = String::new();
    for root in roots {
        let parent = if root.parent_span_id.is_empty() {
            String::new()
        } else {
            format!(" (remote parent {})", root.parent_span_id)
        };
        out.push_str(&format!("trace {}{parent}\n", root.trace_id));
        write_span(&mut out, root, &children, 1, &shown);
    }
    out
}

fn write_span(
    out: &mut String,
    span: &Span,
    children: &HashMap<&str, Vec<&Span>>,
    depth: usize,
    shown: &Shown<'_>,
) {
    let attrs: Vec<String> = span
        .attributes
        .iter()
        .filter(|(k, v)| (shown.attribute)(k, v))
        .map(|(k, v)| format!("{k}={}", v.shown()))
        .collect();
    let status = match span.status {
        2 => " [error]",
        _ => "",
    };
    let links = if span.links.is_empty() {
        String::new()
    } else {
        format!(" links={:?}", span.links)
    };
    let id = if shown.ids {
        format!(" [{}]", span.span_id)
    } else {
        String::new()
    };
    out.push_str(&format!(
        "{}{}{id}{status}{links} {}\n",
        "  ".repeat(depth),
        span.name,
        attrs.join(" ")
    ));
    let mut kids = children
        .get(span.span_id.as_str())
        .cloned()
        .unwrap_or_default();
    kids.sort_by_key(|s| s.start_ns);
    for kid in kids {
        write_span(out, kid, children, depth + 1, shown);
    }
}
