//! Checks on the configuration file that serde cannot make. Each error names
//! the offending key.

use std::collections::HashSet;

use super::file::{ConfigFile, RetentionSettings};
use crate::contracts::TaskDefinition;
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

/// What a check found wrong: the offending key and what is wrong with it.
type Checked = Result<(), (String, String)>;

fn invalid(key: impl Into<String>, message: &str) -> Checked {
    Err((key.into(), message.to_owned()))
}

/// Checks what serde cannot, one section after another; the error names
/// the offending key.
pub fn check_file(file: &ConfigFile) -> Checked {
    check_server(file)?;
    check_database(file)?;
    check_worker(file)?;
    check_retention(&file.retention)?;
    check_providers(file)?;
    check_tasks(file)
}

/// `[server]`.
fn check_server(file: &ConfigFile) -> Checked {
    let server = &file.server;
    if server.body_limit_bytes == 0 {
        return invalid("server.body_limit_bytes", "must be greater than 0");
    }
    let ceiling = crate::domain::json_depth::MAX_NESTING_CEILING;
    if !(1..=ceiling).contains(&server.max_json_depth) {
        return invalid(
            "server.max_json_depth",
            &format!("must be between 1 and {ceiling}"),
        );
    }
    if server.body_timeout_ms == 0 {
        return invalid("server.body_timeout_ms", "must be greater than 0");
    }
    if let Some(url) = &server.public_url {
        if insecure_remote_http(url) && !server.allow_insecure_http {
            return invalid(
                "server.public_url",
                "is http:// to another host: callback secrets would travel in clear text; use \
                 https://, or set server.allow_insecure_http = true if the network is trusted",
            );
        }
    }
    if !(1..=86_400).contains(&server.callback_window_seconds) {
        return invalid(
            "server.callback_window_seconds",
            "must be between 1 and 86400",
        );
    }
    if !(1..=10_000).contains(&server.max_followers_per_job) {
        return invalid(
            "server.max_followers_per_job",
            "must be between 1 and 10000",
        );
    }
    if server.max_stream_bytes < 1024 {
        return invalid(
            "server.max_stream_bytes",
            "must be at least 1024: a stream smaller than that would refuse ordinary answers",
        );
    }
    if !(100..=600_000).contains(&server.stream_keepalive_ms) {
        return invalid(
            "server.stream_keepalive_ms",
            "must be between 100 and 600000",
        );
    }
    if server.session_hours == 0 {
        return invalid("server.session_hours", "must be at least 1");
    }
    if server.async_threads > super::file::MAX_ASYNC_THREADS {
        return invalid(
            "server.async_threads",
            &format!(
                "must be at most {} (0: a quarter of the CPU cores)",
                super::file::MAX_ASYNC_THREADS
            ),
        );
    }
    let longest_timeout = file
        .providers
        .iter()
        .map(|p| p.timeout_ms)
        .max()
        .unwrap_or(0);
    if server.shutdown_grace_ms != 0 && server.shutdown_grace_ms < longest_timeout {
        return invalid(
            "server.shutdown_grace_ms",
            &format!(
                "is shorter than the longest provider timeout_ms ({longest_timeout} ms): a deploy \
                 would cut calls off before they could answer; raise it, or leave it out to \
                 have it computed"
            ),
        );
    }
    Ok(())
}

/// `[database]`.
fn check_database(file: &ConfigFile) -> Checked {
    if file.database.pool_size == 0 {
        return invalid("database.pool_size", "must be at least 1");
    }
    if file.database.group_commit_rows == 0 {
        return invalid(
            "database.group_commit_rows",
            "must be at least 1 (1: no batching)",
        );
    }
    if file.database.pool_timeout_ms == 0 {
        return invalid("database.pool_timeout_ms", "must be greater than 0");
    }
    Ok(())
}

/// `[worker]`, whose lease must outlast the database's waits.
fn check_worker(file: &ConfigFile) -> Checked {
    let worker = &file.worker;
    if worker.lease_ms < 1_000 {
        return invalid("worker.lease_ms", "must be at least 1000");
    }
    // A renewal may wait for a pooled connection and then for a lock; two
    // such waits must fit in a lease, or a busy database lets live claims
    // run out.
    let renewal_wait = file.database.pool_timeout_ms + file.database.lock_wait_ms();
    if worker.lease_ms < 2 * renewal_wait {
        return invalid(
            "worker.lease_ms",
            &format!(
                "must be at least 2 × (database.pool_timeout_ms + the lock wait, \
                 sqlite_busy_timeout_ms or postgres_lock_timeout_ms): {} ms here",
                2 * renewal_wait
            ),
        );
    }
    if worker.poll_interval_ms == 0 {
        return invalid("worker.poll_interval_ms", "must be greater than 0");
    }
    if worker.claim_gather_ms > 1_000 {
        return invalid("worker.claim_gather_ms", "must be at most 1000");
    }
    Ok(())
}

/// `[retention]`.
fn check_retention(retention: &RetentionSettings) -> Checked {
    for (key, days) in retention.windows() {
        match days {
            Some(0) => return invalid(key, "must be at least 1; leave it out to keep everything"),
            Some(days) if days > RetentionSettings::MAX_DAYS => {
                return invalid(
                    key,
                    &format!(
                        "must be at most {} (a century); leave it out to keep everything",
                        RetentionSettings::MAX_DAYS
                    ),
                )
            }
            _ => {}
        }
    }
    Ok(())
}

/// `[[providers]]`: names, then each provider's own settings.
fn check_providers(file: &ConfigFile) -> Checked {
    let mut names = HashSet::new();
    for (i, provider) in file.providers.iter().enumerate() {
        if !is_valid_name(&provider.name) {
            return invalid(
                format!("providers[{i}].name"),
                "must be 1-64 characters of a-z, 0-9, '-', '_' or '.'",
            );
        }
        if !names.insert(provider.name.as_str()) {
            return invalid(format!("providers[{i}].name"), "duplicate provider name");
        }
        check_provider(provider, file.server.allow_insecure_http)
            .map_err(|(key, message)| (format!("providers[{i}].{key}"), message))?;
    }
    Ok(())
}

/// One provider's settings; keys are relative to its entry.
fn check_provider(provider: &ProviderSettings, allow_insecure_http: bool) -> Checked {
    if provider.timeout_ms == 0 {
        return invalid("timeout_ms", "must be greater than 0");
    }
    if provider.idle_timeout_ms == 0 {
        return invalid("idle_timeout_ms", "must be greater than 0");
    }
    if provider.kind.is_http() {
        check_http_provider(provider, allow_insecure_http)?;
    }
    for (key, limit) in [
        ("max_in_flight", provider.max_in_flight),
        ("requests_per_minute", provider.requests_per_minute),
        ("tokens_per_minute", provider.tokens_per_minute),
    ] {
        if limit == Some(0) {
            return invalid(key, "must be at least 1; leave it out for no limit");
        }
    }
    if let Some(t) = provider.temperature {
        if !(0.0..=2.0).contains(&t) {
            return invalid("temperature", "must be between 0 and 2");
        }
    }
    for (j, step) in provider.script.iter().enumerate() {
        if step.attempt == 0 {
            return invalid(format!("script[{j}].attempt"), "attempt numbers start at 1");
        }
    }
    Ok(())
}

/// What an HTTP provider needs: where it is, reached safely, in time, and
/// which model to ask.
fn check_http_provider(provider: &ProviderSettings, allow_insecure_http: bool) -> Checked {
    let bedrock = provider.kind == crate::providers::ProviderKind::Bedrock;
    match &provider.base_url {
        Some(url) if url.starts_with("http://") || url.starts_with("https://") => {}
        // Bedrock's is the region's own endpoint unless given.
        None if bedrock => {}
        _ => return invalid("base_url", "an http:// or https:// URL is required"),
    }
    if provider.region.is_some() && !bedrock {
        return invalid("region", "is for kind = \"bedrock\" only");
    }
    if bedrock && (provider.api_key_env.is_some() || provider.bearer_token_env.is_some()) {
        return invalid(
            "api_key_env",
            "bedrock signs its requests with SigV4 from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY \
             and AWS_SESSION_TOKEN: leave api_key_env out",
        );
    }
    if provider
        .base_url
        .as_deref()
        .is_some_and(insecure_remote_http)
        && !allow_insecure_http
    {
        return invalid(
            "base_url",
            "is http:// to another host: the API key would travel in clear text; use \
             https://, or set server.allow_insecure_http = true if the network is trusted",
        );
    }
    if provider.connect_timeout_ms >= provider.timeout_ms {
        // A connect that hangs has sent nothing: it must fail as
        // definite before the soft timeout calls it unknown.
        return invalid(
            "connect_timeout_ms",
            "must be shorter than timeout_ms: a connection that never opens sent nothing, \
             and must fail as such before the soft timeout makes the attempt unknown",
        );
    }
    if provider.max_response_bytes == 0 {
        return invalid("max_response_bytes", "must be greater than 0");
    }
    if provider.model.as_deref().is_none_or(str::is_empty) {
        return invalid("model", "a model name is required");
    }
    check_azure_addressing(provider)
}

/// `azure_openai` names its deployment, its API version and one way to
/// authenticate; no other kind takes those keys.
fn check_azure_addressing(provider: &ProviderSettings) -> Checked {
    let azure = provider.kind == crate::providers::ProviderKind::AzureOpenai;
    for (key, set) in [
        ("deployment", provider.deployment.is_some()),
        ("api_version", provider.api_version.is_some()),
        ("bearer_token_env", provider.bearer_token_env.is_some()),
    ] {
        if set && !azure {
            return invalid(key, "is for kind = \"azure_openai\" only");
        }
    }
    if !azure {
        return Ok(());
    }
    let path_safe = |value: &Option<String>| {
        value.as_deref().is_some_and(|v| {
            !v.is_empty()
                && v.len() <= 64
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        })
    };
    if !path_safe(&provider.deployment) {
        return invalid(
            "deployment",
            "the deployment's name is required: 1-64 characters of A-Z, a-z, 0-9, '.', '_' or '-'",
        );
    }
    if !path_safe(&provider.api_version) {
        return invalid(
            "api_version",
            "the API version is required (for example \"2024-10-21\"): Azure refuses a call without one",
        );
    }
    if provider.api_key_env.is_some() == provider.bearer_token_env.is_some() {
        return invalid(
            "api_key_env",
            "set exactly one of api_key_env (sent as `api-key`) and bearer_token_env (an Entra ID token, sent as a bearer)",
        );
    }
    Ok(())
}

/// `[[tasks]]`: names, their provider chains, and each task's own checks.
fn check_tasks(file: &ConfigFile) -> Checked {
    if file.tasks.is_empty() {
        return invalid("tasks", "at least one task is required");
    }
    let mut task_names = HashSet::new();
    for (i, task) in file.tasks.iter().enumerate() {
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
        check_chain(file, task).map_err(|(key, message)| (format!("tasks[{i}].{key}"), message))?;
    }
    Ok(())
}

/// A task's provider chain: each named once and configured, a template for
/// HTTP providers, and golden examples when there is a fallback to qualify.
fn check_chain(file: &ConfigFile, task: &TaskDefinition) -> Checked {
    let mut seen = HashSet::new();
    for (j, name) in task.providers.iter().enumerate() {
        let Some(settings) = provider(file, name) else {
            return invalid(
                format!("providers[{j}]"),
                &format!("no provider named {name:?} is configured"),
            );
        };
        if !seen.insert(name) {
            return invalid(format!("providers[{j}]"), "listed twice");
        }
        if settings.kind.is_http()
            && task.template.is_none()
            && task.kind == crate::contracts::TaskKind::Prompt
        {
            return invalid(
                "template",
                &format!("provider {name:?} is an HTTP provider: the task needs a prompt template"),
            );
        }
    }
    if task.providers.len() > 1 && task.golden.is_empty() {
        return invalid(
            "golden",
            &format!(
                "task {:?} has fallback providers ({}) but no golden examples, so they can \
                 never qualify and the task would never fail over; add at least one \
                 [[tasks.golden]] example (an input, and what the answer must hold)",
                task.name,
                task.providers[1..].join(", ")
            ),
        );
    }
    Ok(())
}

fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}
