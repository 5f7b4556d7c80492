//! Logs and traces.
//!
//! - **Logs:** human-readable lines on stderr, filtered by the `RUST_LOG`
//!   value the command line passes in (default `info`). Request spans carry
//!   a request id. Colours only when stderr is a terminal.
//! - **Traces** (docs/tracing.md): when `[telemetry]` (or OpenTelemetry's
//!   environment variables) names a collector, the spans of a job's trace
//!   are exported over OTLP/HTTP: the HTTP request spans (target
//!   [`HTTP_TARGET`]) and the job's own (target [`TRACE_TARGET`]). When it
//!   names none, the job's spans are disabled at their call sites, and no
//!   request reads a trace header.

mod export;
pub mod http_span;
pub mod trace;

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

pub use export::{SpanFate, SPANS};

use crate::config::telemetry::{ExportSettings, RootChoice, SamplerChoice};
use crate::config::TelemetryConfig;

/// The target of each HTTP request's span: logged always, exported when
/// tracing is on.
pub const HTTP_TARGET: &str = "onejob::http";
/// The target of a job's own spans (creation, provider calls, the
/// compare-and-swap, webhook deliveries): exported when tracing is on,
/// disabled otherwise.
pub const TRACE_TARGET: &str = "onejob::trace";

/// What tracing does in this process, once it is on.
struct Tracing {
    record_content: bool,
}

static TRACING: OnceLock<Tracing> = OnceLock::new();

/// Whether spans are exported from this process.
pub fn enabled() -> bool {
    TRACING.get().is_some()
}

/// Whether provider-call spans carry prompts and answers.
pub fn records_content() -> bool {
    TRACING.get().is_some_and(|t| t.record_content)
}

/// The export pipeline, flushed and stopped by [`Export::shutdown`].
pub struct Export {
    provider: SdkTracerProvider,
}

impl Export {
    /// Sends what is queued (for at most `within`) and stops exporting.
    pub fn shutdown(self, within: Duration) {
        if let Err(error) = self.provider.shutdown_with_timeout(within) {
            tracing::warn!(%error, "spans still queued at shutdown were not all exported");
        }
    }
}

/// Installs the logger and, when `telemetry` names a collector, the span
/// export. Called once per process, before anything logs.
pub fn init(filter: Option<&str>, telemetry: &TelemetryConfig) -> Option<Export> {
    let directives = log_directives(filter);
    let export = telemetry.export.as_ref().and_then(|settings| {
        start_export(settings)
            .map_err(|error| eprintln!("onejob: traces are not exported: {error}"))
            .ok()
    });
    let Some((provider, tracer)) = export else {
        // Only the log: its filter is the subscriber's own, and decides
        // once per call site. A filter of the log layer alone would be
        // asked again at every span's entry, exit and close; an
        // `EnvFilter` would also look each span up in a locked map there.
        // Spans are many (every request has one), their entries more.
        // (A process that installed one already, as tests do, keeps it.)
        let _ = match LogFilter::of(&directives) {
            LogFilter::Static(targets) => registry().with(*targets).with(log()).try_init(),
            LogFilter::Dynamic(filter) => registry().with(*filter).with(log()).try_init(),
        };
        return None;
    };
    let traces = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        // No busy/idle clocks, code locations, threads or levels: a span
        // carries what docs/tracing.md names, and costs no more.
        .with_tracked_inactivity(false)
        .with_location(false)
        .with_threads(false)
        .with_level(false)
        .with_filter(
            Targets::new()
                .with_target(HTTP_TARGET, LevelFilter::INFO)
                .with_target(TRACE_TARGET, LevelFilter::INFO),
        );
    let logs = log().with_filter(EnvFilter::new(&directives));
    if registry().with(logs).with(traces).try_init().is_err() {
        return None;
    }
    let _ = TRACING.set(Tracing {
        record_content: telemetry.record_content,
    });
    Some(Export { provider })
}

/// The log: readable lines on stderr, coloured on a terminal.
fn log<S>() -> impl Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
}

/// The log's directives: `filter` (`RUST_LOG`) if it parses, else `info`;
/// and the job's own spans off, whatever it says. Those are for export,
/// not the log: the logger never formats them, and while nothing is
/// exported they cost a disabled call site, nothing more.
fn log_directives(filter: Option<&str>) -> String {
    let given = filter
        .filter(|f| EnvFilter::try_new(f).is_ok())
        .unwrap_or("info");
    let mut directives: Vec<&str> = given
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    let off = format!("{TRACE_TARGET}=off");
    directives.push(&off);
    directives.join(",")
}

/// The log's filter: [`Targets`] where every directive names only a
/// target and a level, as most do; an [`EnvFilter`] where one names a
/// span or fields (`target[span{field=value}]=level`), which only it
/// understands.
enum LogFilter {
    Static(Box<Targets>),
    Dynamic(Box<EnvFilter>),
}

impl LogFilter {
    fn of(directives: &str) -> Self {
        let names_spans_or_fields = directives.contains(['[', '{']);
        match directives.parse::<Targets>() {
            Ok(targets) if !names_spans_or_fields => Self::Static(Box::new(targets)),
            _ => Self::Dynamic(Box::new(EnvFilter::new(directives))),
        }
    }
}

/// The OTLP exporter behind a bounded queue, and the tracer onejob's spans
/// go to.
fn start_export(
    settings: &ExportSettings,
) -> Result<(SdkTracerProvider, opentelemetry_sdk::trace::Tracer), String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(settings.traces_url.clone())
        .with_timeout(Duration::from_millis(settings.export_timeout_ms))
        .with_http_client(
            reqwest::Client::builder()
                .timeout(Duration::from_millis(settings.export_timeout_ms))
                .build()
                .map_err(|e| e.to_string())?,
        )
        .build()
        .map_err(|e| e.to_string())?;
    let processor = export::BoundedExport::start(exporter, settings).map_err(|e| e.to_string())?;
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(sampler(settings.sampler))
        .with_resource(
            Resource::builder()
                .with_service_name(settings.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("onejob");
    Ok((provider, tracer))
}

fn sampler(choice: SamplerChoice) -> Sampler {
    let root = |root: RootChoice| match root {
        RootChoice::AlwaysOn => Sampler::AlwaysOn,
        RootChoice::AlwaysOff => Sampler::AlwaysOff,
        RootChoice::TraceIdRatio(ratio) => Sampler::TraceIdRatioBased(ratio),
    };
    match choice {
        SamplerChoice::AlwaysOn => Sampler::AlwaysOn,
        SamplerChoice::AlwaysOff => Sampler::AlwaysOff,
        SamplerChoice::TraceIdRatio(ratio) => Sampler::TraceIdRatioBased(ratio),
        SamplerChoice::ParentBased(choice) => Sampler::ParentBased(Box::new(root(choice))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn the_log_keeps_the_jobs_own_spans_off_whatever_it_is_given() {
        assert_eq!(log_directives(None), "info,onejob::trace=off");
        assert_eq!(
            log_directives(Some("warn,onejob=debug")),
            "warn,onejob=debug,onejob::trace=off"
        );
        // A filter that does not parse is replaced by the default.
        assert_eq!(
            log_directives(Some("onejob=loud")),
            "info,onejob::trace=off"
        );
    }

    #[test]
    fn targets_and_levels_alone_make_a_static_filter_that_decides_as_the_directives_say() {
        let LogFilter::Static(targets) = LogFilter::of(&log_directives(Some("info,onejob=debug")))
        else {
            panic!("targets and levels alone are a static filter");
        };
        assert!(targets.would_enable(HTTP_TARGET, &Level::INFO));
        assert!(targets.would_enable("onejob::app::intake", &Level::DEBUG));
        assert!(!targets.would_enable("actix_server", &Level::DEBUG));
        assert!(targets.would_enable("actix_server", &Level::INFO));
        assert!(!targets.would_enable(TRACE_TARGET, &Level::INFO));
        assert!(!targets.would_enable(TRACE_TARGET, &Level::ERROR));
    }

    #[test]
    fn a_directive_naming_a_span_or_fields_keeps_the_full_filter() {
        for given in ["info,onejob[run_attempt]=debug", "onejob[{job_id}]=trace"] {
            assert!(
                matches!(
                    LogFilter::of(&log_directives(Some(given))),
                    LogFilter::Dynamic(_)
                ),
                "{given}"
            );
        }
    }
}
