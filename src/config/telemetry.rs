//! The `[telemetry]` section: traces exported over OTLP/HTTP (docs/tracing.md;
//! every key in docs/configuration.md). Off unless a collector is named,
//! in the file or by OpenTelemetry's own environment variables, which win
//! over the file as the specification has them do.

use serde::Deserialize;

use super::Environment;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySettings {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`); spans
    /// go to its `/v1/traces`. Unset (the default): no export.
    pub otlp_endpoint: Option<String>,
    /// `service.name` on every span.
    pub service_name: String,
    /// Which traces are recorded: `parentbased_always_on` (the default),
    /// `parentbased_always_off`, `parentbased_traceidratio`, `always_on`,
    /// `always_off` or `traceidratio`.
    pub sampler: String,
    /// The ratio of the `traceidratio` samplers, 0 to 1.
    pub sampler_arg: f64,
    /// Whether provider-call spans carry the prompt and the answer
    /// (`gen_ai.input.messages`, `gen_ai.output.messages`). Secrets never.
    pub record_content: bool,
    /// The most finished spans waiting for export; past it a span is
    /// dropped, and counted.
    pub max_queue_size: usize,
    /// The most spans one export carries.
    pub max_export_batch_size: usize,
    /// How long a span may wait for a batch to fill.
    pub schedule_delay_ms: u64,
    /// How long one export may take; then its spans are dropped, counted.
    pub export_timeout_ms: u64,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "onejob".to_owned(),
            sampler: "parentbased_always_on".to_owned(),
            sampler_arg: 1.0,
            record_content: false,
            max_queue_size: 2048,
            max_export_batch_size: 512,
            schedule_delay_ms: 1000,
            export_timeout_ms: 5000,
        }
    }
}

/// Which traces are recorded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplerChoice {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio(f64),
    /// A request's parent decides; a root is decided by the inner choice.
    ParentBased(RootChoice),
}

/// How a trace with no parent is sampled under `parentbased_*`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RootChoice {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio(f64),
}

/// Where and how spans are exported: present only when export is on.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSettings {
    /// The full URL spans are posted to (`…/v1/traces`).
    pub traces_url: String,
    pub service_name: String,
    pub sampler: SamplerChoice,
    pub max_queue_size: usize,
    pub max_export_batch_size: usize,
    pub schedule_delay_ms: u64,
    pub export_timeout_ms: u64,
}

/// `[telemetry]` resolved with the environment.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TelemetryConfig {
    /// `None`: tracing is off and costs nothing.
    pub export: Option<ExportSettings>,
    pub record_content: bool,
}

type Invalid = (String, String);

fn invalid(key: &str, message: impl Into<String>) -> Invalid {
    (format!("telemetry.{key}"), message.into())
}

impl TelemetrySettings {
    /// Resolves the section with OpenTelemetry's variables:
    /// `OTEL_SDK_DISABLED`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full
    /// URL), `OTEL_EXPORTER_OTLP_ENDPOINT` (the base), `OTEL_SERVICE_NAME`,
    /// `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`,
    /// `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`,
    /// `OTEL_BSP_SCHEDULE_DELAY` and `OTEL_EXPORTER_OTLP_TIMEOUT`.
    pub fn resolve(&self, env: &Environment) -> Result<TelemetryConfig, Invalid> {
        let disabled = env
            .get("OTEL_SDK_DISABLED")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let traces_url = match (
            env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            env.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
            &self.otlp_endpoint,
        ) {
            _ if disabled => None,
            (Some(full), _, _) => Some(full),
            (None, Some(base), _) => Some(traces_url_of(&base)),
            (None, None, Some(base)) => Some(traces_url_of(base)),
            (None, None, None) => None,
        };
        let record_content = self.record_content;
        let Some(traces_url) = traces_url else {
            return Ok(TelemetryConfig {
                export: None,
                record_content,
            });
        };
        check_url(&traces_url)?;
        let number = |var: &str, key: &str, file: u64| -> Result<u64, Invalid> {
            match env.get(var) {
                Some(v) => v
                    .parse()
                    .map_err(|_| invalid(key, format!("{var}={v:?} is not a whole number"))),
                None => Ok(file),
            }
        };
        let sampler_name = env
            .get("OTEL_TRACES_SAMPLER")
            .unwrap_or_else(|| self.sampler.clone());
        let sampler_arg = match env.get("OTEL_TRACES_SAMPLER_ARG") {
            Some(v) => v.parse().map_err(|_| {
                invalid(
                    "sampler_arg",
                    format!("OTEL_TRACES_SAMPLER_ARG={v:?} is not a number"),
                )
            })?,
            None => self.sampler_arg,
        };
        let settings = ExportSettings {
            traces_url,
            service_name: env
                .get("OTEL_SERVICE_NAME")
                .unwrap_or_else(|| self.service_name.clone()),
            sampler: sampler_of(&sampler_name, sampler_arg)?,
            max_queue_size: number(
                "OTEL_BSP_MAX_QUEUE_SIZE",
                "max_queue_size",
                self.max_queue_size as u64,
            )? as usize,
            max_export_batch_size: number(
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                "max_export_batch_size",
                self.max_export_batch_size as u64,
            )? as usize,
            schedule_delay_ms: number(
                "OTEL_BSP_SCHEDULE_DELAY",
                "schedule_delay_ms",
                self.schedule_delay_ms,
            )?,
            export_timeout_ms: number(
                "OTEL_EXPORTER_OTLP_TIMEOUT",
                "export_timeout_ms",
                self.export_timeout_ms,
            )?,
        };
        check_bounds(&settings)?;
        Ok(TelemetryConfig {
            export: Some(settings),
            record_content,
        })
    }
}

/// A base URL's traces endpoint.
fn traces_url_of(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

fn check_url(url: &str) -> Result<(), Invalid> {
    let parsed = url::Url::parse(url)
        .map_err(|e| invalid("otlp_endpoint", format!("{url:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(invalid(
            "otlp_endpoint",
            format!("{url:?}: OTLP is exported over http or https"),
        ));
    }
    Ok(())
}

fn check_bounds(settings: &ExportSettings) -> Result<(), Invalid> {
    if !(1..=1_000_000).contains(&settings.max_queue_size) {
        return Err(invalid("max_queue_size", "must be 1 to 1000000"));
    }
    if settings.max_export_batch_size == 0
        || settings.max_export_batch_size > settings.max_queue_size
    {
        return Err(invalid(
            "max_export_batch_size",
            "must be at least 1 and at most max_queue_size",
        ));
    }
    if !(1..=60_000).contains(&settings.schedule_delay_ms) {
        return Err(invalid("schedule_delay_ms", "must be 1 to 60000"));
    }
    if !(1..=60_000).contains(&settings.export_timeout_ms) {
        return Err(invalid("export_timeout_ms", "must be 1 to 60000"));
    }
    Ok(())
}

fn sampler_of(name: &str, arg: f64) -> Result<SamplerChoice, Invalid> {
    let ratio = || {
        if (0.0..=1.0).contains(&arg) {
            Ok(arg)
        } else {
            Err(invalid(
                "sampler_arg",
                format!("{arg} is not between 0 and 1"),
            ))
        }
    };
    Ok(match name {
        "always_on" => SamplerChoice::AlwaysOn,
        "always_off" => SamplerChoice::AlwaysOff,
        "traceidratio" => SamplerChoice::TraceIdRatio(ratio()?),
        "parentbased_always_on" => SamplerChoice::ParentBased(RootChoice::AlwaysOn),
        "parentbased_always_off" => SamplerChoice::ParentBased(RootChoice::AlwaysOff),
        "parentbased_traceidratio" => {
            SamplerChoice::ParentBased(RootChoice::TraceIdRatio(ratio()?))
        }
        other => {
            return Err(invalid(
                "sampler",
                format!(
                    "{other:?} is not a sampler onejob knows: always_on, always_off, traceidratio, \
                     parentbased_always_on, parentbased_always_off or parentbased_traceidratio"
                ),
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(
        settings: &TelemetrySettings,
        env: &[(&str, &str)],
    ) -> Result<TelemetryConfig, Invalid> {
        settings.resolve(&Environment::from_pairs(env.iter().copied()))
    }

    #[test]
    fn export_is_off_unless_a_collector_is_named() {
        let config = resolve(&TelemetrySettings::default(), &[]).unwrap();
        assert_eq!(config.export, None);
    }

    #[test]
    fn the_environment_wins_over_the_file_and_the_sdk_can_be_disabled() {
        let file = TelemetrySettings {
            otlp_endpoint: Some("http://file:4318/".to_owned()),
            ..TelemetrySettings::default()
        };
        let from_file = resolve(&file, &[]).unwrap().export.unwrap();
        assert_eq!(from_file.traces_url, "http://file:4318/v1/traces");
        assert_eq!(
            from_file.sampler,
            SamplerChoice::ParentBased(RootChoice::AlwaysOn)
        );
        let from_env = resolve(
            &file,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
                ("OTEL_SERVICE_NAME", "gateway"),
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ],
        )
        .unwrap()
        .export
        .unwrap();
        assert_eq!(from_env.traces_url, "http://env:4318/v1/traces");
        assert_eq!(from_env.service_name, "gateway");
        assert_eq!(from_env.sampler, SamplerChoice::TraceIdRatio(0.25));
        let full = resolve(
            &file,
            &[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://env:4318/custom",
            )],
        )
        .unwrap();
        assert_eq!(full.export.unwrap().traces_url, "http://env:4318/custom");
        let disabled = resolve(&file, &[("OTEL_SDK_DISABLED", "true")]).unwrap();
        assert_eq!(disabled.export, None);
    }

    #[test]
    fn bad_values_name_their_key() {
        let bad = |settings: TelemetrySettings, env: &[(&str, &str)]| {
            resolve(&settings, env).unwrap_err().0
        };
        let on = TelemetrySettings {
            otlp_endpoint: Some("http://c:4318".to_owned()),
            ..TelemetrySettings::default()
        };
        assert_eq!(
            bad(
                TelemetrySettings {
                    sampler: "sometimes".to_owned(),
                    ..on.clone()
                },
                &[]
            ),
            "telemetry.sampler"
        );
        assert_eq!(
            bad(
                on.clone(),
                &[
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "2")
                ]
            ),
            "telemetry.sampler_arg"
        );
        assert_eq!(
            bad(
                TelemetrySettings {
                    otlp_endpoint: Some("grpc://c:4317".to_owned()),
                    ..on.clone()
                },
                &[]
            ),
            "telemetry.otlp_endpoint"
        );
        assert_eq!(
            bad(
                TelemetrySettings {
                    max_queue_size: 0,
                    ..on.clone()
                },
                &[]
            ),
            "telemetry.max_queue_size"
        );
        assert_eq!(
            bad(on, &[("OTEL_BSP_SCHEDULE_DELAY", "soon")]),
            "telemetry.schedule_delay_ms"
        );
    }
}
