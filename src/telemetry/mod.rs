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
    let mut filter = filter
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let export = telemetry.export.as_ref().and_then(|settings| {
        start_export(settings)
            .map_err(|error| eprintln!("onejob: traces are not exported: {error}"))
            .ok()
    });
    // The job's own spans are for export, not the log: the logger never
    // formats them, and while nothing is exported they cost a disabled
    // call site, nothing more.
    filter = filter.add_directive(format!("{TRACE_TARGET}=off").parse().expect("a directive"));
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter);
    let traces = export.as_ref().map(|(_, tracer)| {
        tracing_opentelemetry::layer()
            .with_tracer(tracer.clone())
            // No busy/idle clocks, code locations, threads or levels: a
            // span carries what docs/tracing.md names, and costs no more.
            .with_tracked_inactivity(false)
            .with_location(false)
            .with_threads(false)
            .with_level(false)
            .with_filter(
                Targets::new()
                    .with_target(HTTP_TARGET, LevelFilter::INFO)
                    .with_target(TRACE_TARGET, LevelFilter::INFO),
            )
    });
    let installed = tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init()
        .is_ok();
    let (provider, _) = export?;
    if !installed {
        return None;
    }
    let _ = TRACING.set(Tracing {
        record_content: telemetry.record_content,
    });
    Some(Export { provider })
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
