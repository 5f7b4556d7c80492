//! Checks on the configuration file that serde cannot make. Each error names
//! the offending key.

use std::collections::HashSet;

use super::file::{ConfigFile, RetentionSettings};
use crate::providers::ProviderSettings;

fn provider<'a>(file: &'a ConfigFile, name: &str) -> Option<&'a ProviderSettings> {
    file.providers.iter().find(|p| p.name == name)
}

/// Whether `url` is `http://` to a host other than this machine: keys and
/// callback secrets would cross the network in clear text.
fn insecure_remote_http(url: &str) -> bool {
    let Ok(parsed) = reqwest::Url::parse(url) else {
        return false;
    };
    if parsed.scheme() != "http" {
        return false;
    }
    match parsed.host() {
        Some(url::Host::Domain(name)) => name != "localhost",
        Some(url::Host::Ipv4(ip)) => !ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => !ip.is_loopback(),
        None => true,
    }
}

/// Checks what serde cannot; the error names the offending key.
pub fn check_file(file: &ConfigFile) -> Result<(), (String, String)> {
    let this = file;
    let invalid = |key: String, message: &str| Err((key, message.to_owned()));
    if this.server.body_limit_bytes == 0 {
        return invalid("server.body_limit_bytes".into(), "must be greater than 0");
    }
    let ceiling = crate::domain::json_depth::MAX_NESTING_CEILING;
    if !(1..=ceiling).contains(&this.server.max_json_depth) {
        return invalid(
            "server.max_json_depth".into(),
            &format!("must be between 1 and {ceiling}"),
        );
    }
    if this.server.body_timeout_ms == 0 {
        return invalid("server.body_timeout_ms".into(), "must be greater than 0");
    }
    if let Some(url) = &this.server.public_url {
        if insecure_remote_http(url) && !this.server.allow_insecure_http {
            return invalid(
                "server.public_url".into(),
                "is http:// to another host: callback secrets would travel in clear text; use \
                 https://, or set server.allow_insecure_http = true if the network is trusted",
            );
        }
    }
    if !(1..=86_400).contains(&this.server.callback_window_seconds) {
        return invalid(
            "server.callback_window_seconds".into(),
            "must be between 1 and 86400",
        );
    }
    if this.server.session_hours == 0 {
        return invalid("server.session_hours".into(), "must be at least 1");
    }
    if this.database.pool_size == 0 {
        return invalid("database.pool_size".into(), "must be at least 1");
    }
    if this.database.pool_timeout_ms == 0 {
        return invalid("database.pool_timeout_ms".into(), "must be greater than 0");
    }
    if this.worker.lease_ms < 1_000 {
        return invalid("worker.lease_ms".into(), "must be at least 1000");
    }
    // A renewal may wait for a pooled connection and then for a lock; two
    // such waits must fit in a lease, or a busy database lets live claims
    // run out.
    let renewal_wait = this.database.pool_timeout_ms + this.database.lock_wait_ms();
    if this.worker.lease_ms < 2 * renewal_wait {
        return invalid(
            "worker.lease_ms".into(),
            &format!(
                "must be at least twice database.pool_timeout_ms + the lock wait \
                 (sqlite_busy_timeout_ms or postgres_lock_timeout_ms): {} ms here",
                2 * renewal_wait
            ),
        );
    }
    let longest_timeout = this
        .providers
        .iter()
        .map(|p| p.timeout_ms)
        .max()
        .unwrap_or(0);
    if this.server.shutdown_grace_ms != 0 && this.server.shutdown_grace_ms < longest_timeout {
        return invalid(
            "server.shutdown_grace_ms".into(),
            &format!(
                "is shorter than the longest provider timeout_ms ({longest_timeout} ms): a deploy \
                 would cut calls off before they could answer; raise it, or leave it out to \
                 have it computed"
            ),
        );
    }
    for (key, days) in this.retention.windows() {
        match days {
            Some(0) => {
                return invalid(
                    key.into(),
                    "must be at least 1; leave it out to keep everything",
                )
            }
            Some(days) if days > RetentionSettings::MAX_DAYS => {
                return invalid(
                    key.into(),
                    &format!(
                        "must be at most {} (a century); leave it out to keep everything",
                        RetentionSettings::MAX_DAYS
                    ),
                )
            }
            _ => {}
        }
    }
    if this.worker.poll_interval_ms == 0 {
        return invalid("worker.poll_interval_ms".into(), "must be greater than 0");
    }
    let mut names = HashSet::new();
    for (i, provider) in this.providers.iter().enumerate() {
        if !is_valid_name(&provider.name) {
            return invalid(
                format!("providers[{i}].name"),
                "must be 1-64 characters of a-z, 0-9, '-', '_' or '.'",
            );
        }
        if !names.insert(provider.name.as_str()) {
            return invalid(format!("providers[{i}].name"), "duplicate provider name");
        }
        if provider.timeout_ms == 0 {
            return invalid(
                format!("providers[{i}].timeout_ms"),
                "must be greater than 0",
            );
        }
        if provider.kind.is_http() {
            match &provider.base_url {
                Some(url) if url.starts_with("http://") || url.starts_with("https://") => {}
                _ => {
                    return invalid(
                        format!("providers[{i}].base_url"),
                        "an http:// or https:// URL is required",
                    )
                }
            }
            if provider
                .base_url
                .as_deref()
                .is_some_and(insecure_remote_http)
                && !this.server.allow_insecure_http
            {
                return invalid(
                    format!("providers[{i}].base_url"),
                    "is http:// to another host: the API key would travel in clear text; use \
                     https://, or set server.allow_insecure_http = true if the network is trusted",
                );
            }
            if provider.connect_timeout_ms >= provider.timeout_ms {
                // A connect that hangs has sent nothing: it must fail as
                // definite before the soft timeout calls it unknown.
                return invalid(
                    format!("providers[{i}].connect_timeout_ms"),
                    "must be shorter than timeout_ms: a connection that never opens sent nothing, \
                     and must fail as such before the soft timeout makes the attempt unknown",
                );
            }
            if provider.max_response_bytes == 0 {
                return invalid(
                    format!("providers[{i}].max_response_bytes"),
                    "must be greater than 0",
                );
            }
            if provider.model.as_deref().is_none_or(str::is_empty) {
                return invalid(format!("providers[{i}].model"), "a model name is required");
            }
        }
        for (key, limit) in [
            ("max_in_flight", provider.max_in_flight),
            ("requests_per_minute", provider.requests_per_minute),
            ("tokens_per_minute", provider.tokens_per_minute),
        ] {
            if limit == Some(0) {
                return invalid(
                    format!("providers[{i}].{key}"),
                    "must be at least 1; leave it out for no limit",
                );
            }
        }
        if let Some(t) = provider.temperature {
            if !(0.0..=2.0).contains(&t) {
                return invalid(
                    format!("providers[{i}].temperature"),
                    "must be between 0 and 2",
                );
            }
        }
        for (j, step) in provider.script.iter().enumerate() {
            if step.attempt == 0 {
                return invalid(
                    format!("providers[{i}].script[{j}].attempt"),
                    "attempt numbers start at 1",
                );
            }
        }
    }
    if this.tasks.is_empty() {
        return invalid("tasks".into(), "at least one task is required");
    }
    let mut task_names = HashSet::new();
    for (i, task) in this.tasks.iter().enumerate() {
        if !is_valid_name(&task.name) {
            return invalid(
                format!("tasks[{i}].name"),
                "must be 1-64 characters of a-z, 0-9, '-', '_' or '.'",
            );
        }
        if !task_names.insert(task.name.as_str()) {
            return invalid(format!("tasks[{i}].name"), "duplicate task name");
        }
        if task.providers.is_empty() {
            return invalid(
                format!("tasks[{i}].providers"),
                "name at least one provider",
            );
        }
        task.check()
            .map_err(|(key, message)| (format!("tasks[{i}].{key}"), message))?;
        let mut seen = HashSet::new();
        for (j, name) in task.providers.iter().enumerate() {
            if provider(this, name).is_none() {
                return invalid(
                    format!("tasks[{i}].providers[{j}]"),
                    &format!("no provider named {name:?} is configured"),
                );
            }
            if !seen.insert(name) {
                return invalid(format!("tasks[{i}].providers[{j}]"), "listed twice");
            }
            if provider(this, name).is_some_and(|p| p.kind.is_http())
                && task.template.is_none()
                && task.kind == crate::contracts::TaskKind::Prompt
            {
                return invalid(
                    format!("tasks[{i}].template"),
                    &format!(
                        "provider {name:?} is an HTTP provider: the task needs a prompt template"
                    ),
                );
            }
        }
        if task.providers.len() > 1 && task.golden.is_empty() {
            return invalid(
                format!("tasks[{i}].golden"),
                &format!(
                    "task {:?} has fallback providers ({}) but no golden examples, so they can \
                     never qualify and the task would never fail over; add at least one \
                     [[tasks.golden]] example (an input, and what the answer must hold)",
                    task.name,
                    task.providers[1..].join(", ")
                ),
            );
        }
    }
    Ok(())
}

fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}
