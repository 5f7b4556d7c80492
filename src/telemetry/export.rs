//! The span processor between the SDK and the OTLP exporter: a bounded
//! queue and one export thread of its own. A collector that is down, slow
//! or refusing never slows a request: a finished span is queued without a
//! wait, or dropped when the queue is full; an export that fails or takes
//! longer than its timeout drops its batch. Every span ends counted in
//! `onejob_trace_spans_total` (docs/tracing.md).

use std::sync::mpsc as std_mpsc;
use std::sync::LazyLock;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::mpsc;

use crate::config::telemetry::ExportSettings;

/// What became of a finished span.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SpanFate {
    /// `exported`, `dropped_queue_full` or `dropped_export_failed`.
    pub outcome: &'static str,
}

/// The process's span counts, by fate: one export pipeline per process,
/// registered in every application's `/metrics`.
pub static SPANS: LazyLock<Family<SpanFate, Counter>> = LazyLock::new(Family::default);

fn count(outcome: &'static str, spans: usize) {
    SPANS
        .get_or_create(&SpanFate { outcome })
        .inc_by(spans as u64);
}

enum Control {
    /// The resource every export names (`service.name`).
    Resource(Resource),
    /// Export what is queued, then answer.
    Flush(std_mpsc::Sender<()>),
    /// Export what is queued, answer and stop.
    Shutdown(std_mpsc::Sender<()>),
}

/// Queues finished, sampled spans for the export thread.
#[derive(Debug)]
pub struct BoundedExport {
    spans: mpsc::Sender<SpanData>,
    control: mpsc::UnboundedSender<Control>,
}

impl BoundedExport {
    /// Starts the export thread, which sends through `exporter`.
    pub fn start<E>(exporter: E, settings: &ExportSettings) -> std::io::Result<Self>
    where
        E: SpanExporter + 'static,
    {
        let (spans, queue) = mpsc::channel(settings.max_queue_size);
        let (control, orders) = mpsc::unbounded_channel();
        let batching = Batching {
            max_batch: settings.max_export_batch_size,
            delay: Duration::from_millis(settings.schedule_delay_ms),
            timeout: Duration::from_millis(settings.export_timeout_ms),
        };
        std::thread::Builder::new()
            .name("onejob-trace-export".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread runtime builds");
                runtime.block_on(batching.run(exporter, queue, orders));
            })?;
        Ok(Self { spans, control })
    }

    fn ask(&self, order: fn(std_mpsc::Sender<()>) -> Control, wait: Duration) -> OTelSdkResult {
        let (done, answered) = std_mpsc::channel();
        if self.control.send(order(done)).is_err() {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        answered
            .recv_timeout(wait)
            .map_err(|_| OTelSdkError::Timeout(wait))
    }
}

impl SpanProcessor for BoundedExport {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.spans.try_send(span).is_err() {
            count("dropped_queue_full", 1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Control::Flush, Duration::from_secs(10))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.ask(Control::Shutdown, timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        let _ = self.control.send(Control::Resource(resource.clone()));
    }
}

struct Batching {
    max_batch: usize,
    delay: Duration,
    timeout: Duration,
}

impl Batching {
    /// Sends batches until shut down: a batch goes when it is full, or
    /// `delay` after its first span came.
    async fn run<E: SpanExporter>(
        self,
        mut exporter: E,
        mut queue: mpsc::Receiver<SpanData>,
        mut orders: mpsc::UnboundedReceiver<Control>,
    ) {
        loop {
            let first = tokio::select! {
                // Orders first: the resource comes before any export.
                biased;
                order = orders.recv() => match order {
                    Some(Control::Resource(resource)) => {
                        exporter.set_resource(&resource);
                        continue;
                    }
                    Some(Control::Flush(done)) => {
                        self.drain(&exporter, &mut queue).await;
                        let _ = done.send(());
                        continue;
                    }
                    Some(Control::Shutdown(done)) => {
                        self.drain(&exporter, &mut queue).await;
                        let _ = exporter.shutdown();
                        let _ = done.send(());
                        return;
                    }
                    None => return,
                },
                span = queue.recv() => match span {
                    Some(span) => span,
                    None => return,
                },
            };
            let mut batch = Vec::with_capacity(self.max_batch.min(64));
            batch.push(first);
            let deadline = tokio::time::Instant::now() + self.delay;
            while batch.len() < self.max_batch {
                match tokio::time::timeout_at(deadline, queue.recv()).await {
                    Ok(Some(span)) => batch.push(span),
                    Ok(None) | Err(_) => break,
                }
            }
            self.export(&exporter, batch).await;
        }
    }

    /// Exports everything queued now, in batches.
    async fn drain<E: SpanExporter>(&self, exporter: &E, queue: &mut mpsc::Receiver<SpanData>) {
        loop {
            let mut batch = Vec::new();
            while batch.len() < self.max_batch {
                match queue.try_recv() {
                    Ok(span) => batch.push(span),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                return;
            }
            self.export(exporter, batch).await;
        }
    }

    async fn export<E: SpanExporter>(&self, exporter: &E, batch: Vec<SpanData>) {
        let spans = batch.len();
        match tokio::time::timeout(self.timeout, exporter.export(batch)).await {
            Ok(Ok(())) => count("exported", spans),
            Ok(Err(error)) => {
                count("dropped_export_failed", spans);
                tracing::debug!(%error, spans, "exporting spans failed; they are dropped");
            }
            Err(_) => {
                count("dropped_export_failed", spans);
                tracing::debug!(spans, "exporting spans timed out; they are dropped");
            }
        }
    }
}
