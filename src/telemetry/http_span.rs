//! Each HTTP request's span: its method, route and request id, and while
//! tracing is on its status, in OpenTelemetry's HTTP terms. While tracing
//! is on, a `traceparent` (and `tracestate`) from the client makes it a
//! child of the client's span; while it is off, no trace header is read.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::{Error, HttpMessage};
use tracing::field::Empty;
use tracing::Span;
use tracing_actix_web::{RequestId, RootSpanBuilder};

use crate::domain::TraceContext;

/// The root span builder onejob's `TracingLogger` uses.
pub struct HttpSpan;

/// The route pattern a request matched (`None`: no route), found once as
/// its span opens and kept in its extensions for what else names the
/// route (the metrics): actix finds it by matching the path against the
/// routes again each time it is asked.
#[derive(Debug)]
pub struct MatchedRoute(pub Option<String>);

/// The client's trace context, if its headers hold a valid one.
fn client_context(request: &ServiceRequest) -> Option<TraceContext> {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
    };
    TraceContext::parse(header("traceparent")?, header("tracestate"))
}

impl RootSpanBuilder for HttpSpan {
    fn on_request_start(request: &ServiceRequest) -> Span {
        let method = request.method().as_str();
        let matched = request.match_pattern();
        let route = matched.as_deref().unwrap_or("default");
        let request_id = tracing::field::display(
            request
                .extensions()
                .get::<RequestId>()
                .map_or(uuid::Uuid::nil(), |id| **id),
        );
        let span = if super::enabled() {
            let span = tracing::info_span!(
                target: "onejob::http",
                "HTTP request",
                http.request.method = method,
                http.route = route,
                request_id = request_id,
                http.response.status_code = Empty,
                otel.name = Empty,
                otel.kind = "server",
                otel.status_code = Empty,
            );
            span.record("otel.name", format!("{method} {route}"));
            super::trace::set_parent(&span, client_context(request).as_ref());
            span
        } else {
            // For the log alone: what names a request in a line logged
            // within it. The log formats a span's fields as it opens, and
            // every request opens one; the answer's status is in no line
            // logged within the request, and `otel.*` speak to a collector.
            tracing::info_span!(
                target: "onejob::http",
                "HTTP request",
                http.request.method = method,
                http.route = route,
                request_id = request_id,
            )
        };
        request.extensions_mut().insert(MatchedRoute(matched));
        span
    }

    fn on_request_end<B: MessageBody>(span: Span, outcome: &Result<ServiceResponse<B>, Error>) {
        if !super::enabled() {
            return;
        }
        let status = match outcome {
            Ok(response) => response.status(),
            Err(error) => error.as_response_error().status_code(),
        };
        span.record("http.response.status_code", i64::from(status.as_u16()));
        if status.is_server_error() {
            span.record("otel.status_code", "ERROR");
        }
    }
}
