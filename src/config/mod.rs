//! Configuration: one TOML file (`--config FILE` or `ONEJOB_CONFIG`), or the
//! built-in default so that no file is needed to start. It is loaded,
//! checked and resolved once, into one [`Config`] value: task contracts
//! compiled, API keys and the callback key read from the environment into
//! [`Secret`]s. Nothing reads the environment after that. Every key is
//! documented in `docs/configuration.md`.
//!
//! Precedence for the two settings that also come from the command line or
//! the environment (resolved by the CLI): `--bind` > `ONEJOB_BIND` >
//! `[server] bind`; `--database-url` > `DATABASE_URL` > `[database] url`.

mod checks;
mod file;
pub mod ledger;
pub mod telemetry;
pub mod webhooks;

use std::collections::HashMap;
use std::path::Path;

pub use file::{RetentionSettings, ServerSettings, WorkerSettings};
pub use ledger::{LedgerConfig, LedgerSettings};
pub use telemetry::{TelemetryConfig, TelemetrySettings};
pub use webhooks::{WebhookConfig, WebhookSettings};

use crate::contracts::Contracts;
use crate::domain::{CallbackKey, Secret};
use crate::providers::ProviderSettings;
use crate::store::DatabaseSettings;

/// The configuration used when no file is given: two simulated providers and one task.
pub const DEFAULT_CONFIG_TOML: &str = include_str!("default_config.toml");

/// Where configuration values that are not in the file come from: the
/// process environment (read once, while loading) or, in tests, a map.
pub enum Environment {
    Process,
    Map(HashMap<String, String>),
}

impl Environment {
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Self::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    /// The variable's value, if it is set and not empty.
    fn get(&self, name: &str) -> Option<String> {
        match self {
            Self::Process => std::env::var(name).ok(),
            Self::Map(map) => map.get(name).cloned(),
        }
        .filter(|v| !v.is_empty())
    }
}

/// Which of the secrets the file names a command reads from the
/// environment. A server needs them all; administering users, pruning and
/// migrating need none, and qualifying one provider needs only its key, so
/// an operator's shell need not hold every provider's key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SecretsNeeded {
    /// Every provider's API key and the callback key (`serve`).
    #[default]
    All,
    /// None: providers keep no key, and callbacks are off.
    None,
    /// The API key of this provider only; callbacks are off.
    ProviderKey(String),
}

impl SecretsNeeded {
    fn wants_key_of(&self, provider: &str) -> bool {
        match self {
            Self::All => true,
            Self::None => false,
            Self::ProviderKey(name) => name == provider,
        }
    }
}

/// Callbacks: where providers reach this server, and the key per-attempt
/// secrets derive from.
#[derive(Clone, Debug)]
pub struct CallbackSettings {
    pub key: CallbackKey,
    /// `server.public_url` without a trailing slash.
    pub public_url: String,
}

/// The configuration, checked and resolved.
#[derive(Clone, Debug)]
pub struct Config {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub worker: WorkerSettings,
    /// How long finished jobs and the logs are kept.
    pub retention: RetentionSettings,
    /// Every provider, with its API key resolved.
    pub providers: Vec<ProviderSettings>,
    /// Every task's contract, compiled, in configuration order.
    pub contracts: Contracts,
    /// Set when `server.callback_secret_env` is.
    pub callbacks: Option<CallbackSettings>,
    /// `[webhooks]`, with the webhook key when `signing_key_env` names one.
    pub webhooks: WebhookConfig,
    /// `[ledger]`: the currency and the price table.
    pub ledger: LedgerConfig,
    /// `[telemetry]`: whether and where traces are exported.
    pub telemetry: TelemetryConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("configuration {origin}: {source}")]
    Parse {
        origin: String,
        source: Box<toml::de::Error>,
    },
    #[error("configuration {origin}: `{key}`: {message}")]
    Invalid {
        origin: String,
        key: String,
        message: String,
    },
}

impl Config {
    /// Loads the file if one is given, else the built-in default, and
    /// resolves it, with every secret it names.
    pub fn load(path: Option<&Path>, env: &Environment) -> Result<Self, ConfigError> {
        Self::load_with(path, env, &SecretsNeeded::All)
    }

    /// As [`load`](Self::load), reading only the secrets `needed`.
    pub fn load_with(
        path: Option<&Path>,
        env: &Environment,
        needed: &SecretsNeeded,
    ) -> Result<Self, ConfigError> {
        match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                Self::from_toml_with(&text, &path.display().to_string(), env, needed)
            }
            None => Self::from_toml_with(DEFAULT_CONFIG_TOML, "(built-in default)", env, needed),
        }
    }

    pub fn from_toml(text: &str, origin: &str, env: &Environment) -> Result<Self, ConfigError> {
        Self::from_toml_with(text, origin, env, &SecretsNeeded::All)
    }

    /// As [`from_toml`](Self::from_toml), reading only the secrets `needed`.
    pub fn from_toml_with(
        text: &str,
        origin: &str,
        env: &Environment,
        needed: &SecretsNeeded,
    ) -> Result<Self, ConfigError> {
        let raw: file::ConfigFile = toml::from_str(text).map_err(|source| ConfigError::Parse {
            origin: origin.into(),
            source: Box::new(source),
        })?;
        resolve(raw, env, needed).map_err(|(key, message)| ConfigError::Invalid {
            origin: origin.into(),
            key,
            message,
        })
    }

    pub fn provider(&self, name: &str) -> Option<&ProviderSettings> {
        self.providers.iter().find(|p| p.name == name)
    }

    /// The most output tokens a job of `contract` may ask for: the largest
    /// context window among its route's providers (`domain::ledger::
    /// check_max_tokens` holds requests to it).
    pub fn output_token_ceiling(&self, contract: &crate::contracts::TaskContract) -> u64 {
        contract
            .chain()
            .iter()
            .filter_map(|name| self.provider(name))
            .map(|p| u64::from(p.context_budget()))
            .max()
            .unwrap_or(0)
    }
}

/// Checks the file and resolves secrets and contracts.
fn resolve(
    raw: file::ConfigFile,
    env: &Environment,
    needed: &SecretsNeeded,
) -> Result<Config, (String, String)> {
    checks::check_file(&raw)?;
    let contracts = Contracts::compile(&raw.tasks)?;
    let mut providers = raw.providers;
    for (i, provider) in providers.iter_mut().enumerate() {
        if needed.wants_key_of(&provider.name) {
            resolve_provider_secrets(i, provider, env)?;
        }
    }
    let callbacks = match &raw.server.callback_secret_env {
        None => None,
        Some(_) if *needed != SecretsNeeded::All => None,
        Some(var) => Some(callback_settings(&raw.server, var, env)?),
    };
    raw.webhooks.check()?;
    let webhook_key = match &raw.webhooks.signing_key_env {
        None => None,
        Some(_) if *needed != SecretsNeeded::All => None,
        Some(var) => {
            let key = signing_key(env, "webhooks.signing_key_env", var)?;
            Some(crate::domain::webhook::WebhookKey::new(&Secret::new(key)))
        }
    };
    let webhooks = WebhookConfig {
        settings: raw.webhooks,
        key: webhook_key,
    };
    let ledger = raw.ledger.resolve(&providers)?;
    let telemetry = raw.telemetry.resolve(env)?;
    let mut server = raw.server;
    if server.shutdown_grace_ms == 0 {
        let longest = providers.iter().map(|p| p.timeout_ms).max().unwrap_or(0);
        server.shutdown_grace_ms = (longest + 2_000).max(10_000);
    }
    Ok(Config {
        server,
        database: raw.database,
        worker: raw.worker,
        retention: raw.retention,
        providers,
        contracts,
        callbacks,
        webhooks,
        ledger,
        telemetry,
    })
}

/// Reads the secrets of `provider` (the `i`th) from the environment: its
/// API key or bearer token, and Bedrock's AWS credentials and region.
fn resolve_provider_secrets(
    i: usize,
    provider: &mut ProviderSettings,
    env: &Environment,
) -> Result<(), (String, String)> {
    let secret = |key: &str, var: &str| {
        env.get(var).map(Secret::new).ok_or_else(|| {
            (
                format!("providers[{i}].{key}"),
                format!("the environment variable {var} is not set"),
            )
        })
    };
    if let Some(var) = &provider.api_key_env {
        provider.api_key = Some(secret("api_key_env", var)?);
    }
    if let Some(var) = &provider.bearer_token_env {
        provider.bearer_token = Some(secret("bearer_token_env", var)?);
    }
    if provider.kind == crate::providers::ProviderKind::Bedrock {
        let region = match &provider.region {
            Some(region) => region.clone(),
            None => secret("region", "AWS_REGION")?.expose().to_owned(),
        };
        provider.aws = Some(crate::providers::bedrock::AwsSigning {
            access_key_id: secret("kind", "AWS_ACCESS_KEY_ID")?.expose().to_owned(),
            secret_access_key: secret("kind", "AWS_SECRET_ACCESS_KEY")?,
            session_token: env.get("AWS_SESSION_TOKEN").map(Secret::new),
            region,
        });
    }
    Ok(())
}

/// The callback key (read from `var`) and the URL providers reach this
/// server at.
fn callback_settings(
    server: &ServerSettings,
    var: &str,
    env: &Environment,
) -> Result<CallbackSettings, (String, String)> {
    let key = signing_key(env, "server.callback_secret_env", var)?;
    let public_url = server.public_url.as_deref().ok_or_else(|| {
        (
            "server.public_url".to_owned(),
            "callbacks need the URL providers reach this server at".to_owned(),
        )
    })?;
    Ok(CallbackSettings {
        key: CallbackKey::new(&Secret::new(key)),
        public_url: public_url.trim_end_matches('/').to_owned(),
    })
}

/// The key in the environment variable `var`, which the setting `setting`
/// names: it must be set, and at least 32 bytes long.
fn signing_key(env: &Environment, setting: &str, var: &str) -> Result<String, (String, String)> {
    let key = env.get(var).ok_or_else(|| {
        (
            setting.to_owned(),
            format!("the environment variable {var} is not set"),
        )
    })?;
    if key.len() < 32 {
        return Err((
            setting.to_owned(),
            format!(
                "the key in {var} is {} bytes long; use at least 32 random bytes \
                 (e.g. `openssl rand -hex 32`)",
                key.len()
            ),
        ));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::ProviderKind;
    use crate::store::SqliteSynchronous;

    fn no_env() -> Environment {
        Environment::from_pairs([])
    }

    #[test]
    fn the_built_in_default_is_valid_and_has_two_simulated_providers() {
        let config = Config::load(None, &no_env()).unwrap();
        assert_eq!(config.providers.len(), 2);
        assert!(config
            .providers
            .iter()
            .all(|p| p.kind == ProviderKind::Simulated));
        assert_eq!(
            config.contracts.get("summarize").unwrap().chain(),
            ["sim-fast", "sim-slow"]
        );
        assert_eq!(config.database.sqlite_synchronous, SqliteSynchronous::Full);
    }

    fn invalid_key(toml: &str) -> String {
        match Config::from_toml(toml, "test", &no_env()) {
            Err(ConfigError::Invalid { key, .. }) => key,
            Err(ConfigError::Parse { source, .. }) => format!("parse: {source}"),
            other => panic!("expected an invalid configuration, got {other:?}"),
        }
    }

    /// `azure_openai` names its deployment, its API version and one
    /// credential; the keys are its alone.
    #[test]
    fn an_azure_provider_is_addressed_whole_and_its_keys_are_its_own() {
        let azure = |lines: &str| {
            format!(
                "[[providers]]\nname = \"az\"\nkind = \"azure_openai\"\n\
                 base_url = \"https://r.openai.azure.com\"\nmodel = \"gpt-4o\"\n{lines}\n\
                 [[tasks]]\nname = \"t\"\nproviders = [\"az\"]\n"
            )
        };
        let key = "api_key_env = \"K\"";
        assert_eq!(
            invalid_key(&azure(&format!("api_version = \"2024-10-21\"\n{key}"))),
            "providers[0].deployment"
        );
        assert_eq!(
            invalid_key(&azure(&format!("deployment = \"d\"\n{key}"))),
            "providers[0].api_version"
        );
        assert_eq!(
            invalid_key(&azure(&format!(
                "deployment = \"d/../x\"\napi_version = \"2024-10-21\"\n{key}"
            ))),
            "providers[0].deployment"
        );
        assert_eq!(
            invalid_key(&azure(
                "deployment = \"d\"\napi_version = \"2024-10-21\"\n\
                 api_key_env = \"K\"\nbearer_token_env = \"T\""
            )),
            "providers[0].api_key_env"
        );
        assert_eq!(
            invalid_key(&azure("deployment = \"d\"\napi_version = \"2024-10-21\"")),
            "providers[0].api_key_env"
        );
        let openai_with_deployment = "[[providers]]\nname = \"o\"\nkind = \"openai\"\n\
            base_url = \"https://api.openai.com\"\nmodel = \"m\"\ndeployment = \"d\"\n\
            [[tasks]]\nname = \"t\"\nproviders = [\"o\"]\n";
        assert_eq!(
            invalid_key(openai_with_deployment),
            "providers[0].deployment"
        );
    }

    #[test]
    fn a_task_naming_an_unknown_provider_is_refused_naming_the_key() {
        let toml = r#"
            [[providers]]
            name = "a"
            kind = "simulated"
            [[tasks]]
            name = "t"
            providers = ["a", "b"]
        "#;
        assert_eq!(invalid_key(toml), "tasks[0].providers[1]");
    }

    #[test]
    fn unknown_keys_are_refused_naming_the_key() {
        let toml = r#"
            [[providers]]
            name = "a"
            kind = "simulated"
            latncy_ms = 5
            [[tasks]]
            name = "t"
            providers = ["a"]
        "#;
        let message = invalid_key(toml);
        assert!(message.contains("latncy_ms"), "{message}");
    }

    #[test]
    fn the_stream_limits_have_defaults_and_are_checked() {
        let config = Config::load(None, &no_env()).unwrap();
        assert_eq!(config.server.max_followers_per_job, 64);
        assert_eq!(config.server.max_stream_bytes, 1024 * 1024);
        let with = |server: &str| {
            format!(
                "[server]\n{server}\n[[providers]]\nname = \"a\"\nkind = \"simulated\"\n\
                 [[tasks]]\nname = \"t\"\nproviders = [\"a\"]\n"
            )
        };
        assert_eq!(
            invalid_key(&with("max_followers_per_job = 0")),
            "server.max_followers_per_job"
        );
        assert_eq!(
            invalid_key(&with("max_stream_bytes = 100")),
            "server.max_stream_bytes"
        );
        assert_eq!(config.server.stream_keepalive_ms, 15_000);
        assert_eq!(
            invalid_key(&with("stream_keepalive_ms = 10")),
            "server.stream_keepalive_ms"
        );
        let fine = Config::from_toml(
            &with("max_followers_per_job = 2\nmax_stream_bytes = 4096"),
            "test",
            &no_env(),
        )
        .unwrap();
        assert_eq!(fine.server.max_followers_per_job, 2);
        assert_eq!(fine.server.max_stream_bytes, 4096);
    }

    #[test]
    fn the_webhook_key_is_read_at_start_and_must_be_long_enough() {
        let toml = |extra: &str| {
            format!(
                "[webhooks]\nsigning_key_env = \"WH_KEY\"\n{extra}\n[[providers]]\nname = \"a\"\n\
                 kind = \"simulated\"\n[[tasks]]\nname = \"t\"\nproviders = [\"a\"]\n"
            )
        };
        let short = Environment::from_pairs([("WH_KEY", "too-short")]);
        match Config::from_toml(&toml(""), "test", &short) {
            Err(ConfigError::Invalid { key, message, .. }) => {
                assert_eq!(key, "webhooks.signing_key_env");
                assert!(message.contains("at least 32"), "{message}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(invalid_key(&toml("")), "webhooks.signing_key_env");
        let long = Environment::from_pairs([("WH_KEY", "k0123456789abcdef0123456789abcdef")]);
        let config = Config::from_toml(&toml(""), "test", &long).unwrap();
        assert!(config.webhooks.key.is_some());
        assert_eq!(
            format!("{:?}", config.webhooks.key),
            "Some(WebhookKey(***))"
        );
        // Commands that read no secrets leave webhooks off.
        let none = Config::from_toml_with(&toml(""), "test", &long, &SecretsNeeded::None).unwrap();
        assert!(none.webhooks.key.is_none());
        assert_eq!(
            match Config::from_toml(&toml("batch_size = 0"), "test", &long) {
                Err(ConfigError::Invalid { key, .. }) => key,
                other => panic!("{other:?}"),
            },
            "webhooks.batch_size"
        );
        let off = Config::load(None, &no_env()).unwrap();
        assert!(off.webhooks.key.is_none() && !off.webhooks.settings.allow_private_addresses);
    }

    #[test]
    fn duplicate_provider_names_are_refused() {
        let toml = r#"
            [[providers]]
            name = "a"
            kind = "simulated"
            [[providers]]
            name = "a"
            kind = "simulated"
            [[tasks]]
            name = "t"
            providers = ["a"]
        "#;
        assert_eq!(invalid_key(toml), "providers[1].name");
    }

    #[test]
    fn an_unknown_failure_mode_is_refused() {
        let toml = r#"
            [[providers]]
            name = "a"
            kind = "simulated"
            fail = "sometimes"
            [[tasks]]
            name = "t"
            providers = ["a"]
        "#;
        assert!(invalid_key(toml).contains("fail"));
    }

    const TWO_PROVIDERS: &str = r#"
        [[providers]]
        name = "a"
        kind = "simulated"
        timeout_ms = 20000
        [[providers]]
        name = "b"
        kind = "simulated"
        timeout_ms = 1000
    "#;

    #[test]
    fn a_chain_with_fallbacks_but_no_golden_examples_is_refused() {
        let toml =
            format!("{TWO_PROVIDERS}\n[[tasks]]\nname = \"t\"\nproviders = [\"a\", \"b\"]\n");
        match Config::from_toml(&toml, "test", &no_env()) {
            Err(ConfigError::Invalid { key, message, .. }) => {
                assert_eq!(key, "tasks[0].golden");
                assert!(
                    message.contains("never fail over") && message.contains("\"t\""),
                    "{message}"
                );
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        let single = format!("{TWO_PROVIDERS}\n[[tasks]]\nname = \"t\"\nproviders = [\"a\"]\n");
        assert!(
            Config::from_toml(&single, "test", &no_env()).is_ok(),
            "no fallback, no golden needed"
        );
    }

    #[test]
    fn the_shutdown_grace_covers_the_longest_soft_timeout() {
        let task = "[[tasks]]\nname = \"t\"\nproviders = [\"a\"]\n";
        let config =
            Config::from_toml(&format!("{TWO_PROVIDERS}{task}"), "test", &no_env()).unwrap();
        assert_eq!(
            config.server.shutdown_grace_ms, 22_000,
            "computed: 20 s + 2 s"
        );
        let short = format!("[server]\nshutdown_grace_ms = 5000\n{TWO_PROVIDERS}{task}");
        assert_eq!(invalid_key(&short), "server.shutdown_grace_ms");
    }

    #[test]
    fn a_lease_that_a_busy_database_can_outlast_is_refused() {
        let task = "[[tasks]]\nname = \"t\"\nproviders = [\"a\"]\n";
        let toml = format!("[worker]\nlease_ms = 15000\n{TWO_PROVIDERS}{task}");
        assert_eq!(invalid_key(&toml), "worker.lease_ms");
        let toml = format!(
            "[worker]\nlease_ms = 15000\n[database]\npool_timeout_ms = 2000\nsqlite_busy_timeout_ms = 2000\npostgres_lock_timeout_ms = 2000\n{TWO_PROVIDERS}{task}"
        );
        assert!(Config::from_toml(&toml, "test", &no_env()).is_ok());
    }

    #[test]
    fn clear_text_http_to_another_host_is_refused_unless_allowed() {
        let provider = |url: &str| {
            format!(
                "[[providers]]\nname = \"a\"\nkind = \"openai\"\nbase_url = \"{url}\"\nmodel = \"m\"\n\
                 [[tasks]]\nname = \"t\"\nproviders = [\"a\"]\ntemplate = \"{{{{ text }}}}\"\n"
            )
        };
        assert_eq!(
            invalid_key(&provider("http://api.example.com")),
            "providers[0].base_url"
        );
        for fine in [
            "https://api.example.com",
            "http://127.0.0.1:8000",
            "http://localhost:11434/v1",
            "http://[::1]:9",
        ] {
            assert!(
                Config::from_toml(&provider(fine), "test", &no_env()).is_ok(),
                "{fine}"
            );
        }
        let allowed = format!(
            "[server]\nallow_insecure_http = true\n{}",
            provider("http://gpu-box:8000")
        );
        assert!(Config::from_toml(&allowed, "test", &no_env()).is_ok());
        let public = format!(
            "[server]\npublic_url = \"http://onejob.example.com\"\n{}",
            provider("https://x.example")
        );
        assert_eq!(invalid_key(&public), "server.public_url");
    }

    #[test]
    fn a_short_callback_key_is_refused() {
        let toml = "[server]\npublic_url = \"https://onejob.example.com\"\ncallback_secret_env = \"CB\"\n\
                    [[providers]]\nname = \"a\"\nkind = \"simulated\"\n[[tasks]]\nname = \"t\"\nproviders = [\"a\"]\n";
        let short = Environment::from_pairs([("CB", "tooshort")]);
        match Config::from_toml(toml, "test", &short) {
            Err(ConfigError::Invalid { key, message, .. }) => {
                assert_eq!(key, "server.callback_secret_env");
                assert!(message.contains("at least 32"), "{message}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        let long = Environment::from_pairs([("CB", "0123456789abcdef0123456789abcdef")]);
        let config = Config::from_toml(toml, "test", &long).unwrap();
        assert!(
            config.server.secure_cookies(),
            "https public_url: Secure cookies by default"
        );
    }

    #[test]
    fn retention_keeps_everything_unless_a_window_is_set() {
        let config = Config::load(None, &no_env()).unwrap();
        assert_eq!(config.retention, RetentionSettings::default());
        assert!(!config.retention.prunes_anything());
        let task = "[[providers]]\nname = \"a\"\nkind = \"simulated\"\n\
                    [[tasks]]\nname = \"t\"\nproviders = [\"a\"]\n";
        let toml = format!("[retention]\njobs_days = 30\naudit_days = 365\n{task}");
        let config = Config::from_toml(&toml, "test", &no_env()).unwrap();
        assert_eq!(
            config.retention,
            RetentionSettings {
                jobs_days: Some(30),
                races_days: None,
                audit_days: Some(365),
            }
        );
    }

    #[test]
    fn retention_windows_of_zero_or_past_a_century_or_misspelt_are_refused() {
        let task = "[[providers]]\nname = \"a\"\nkind = \"simulated\"\n\
                    [[tasks]]\nname = \"t\"\nproviders = [\"a\"]\n";
        let refused = |section: &str| match Config::from_toml(
            &format!("[retention]\n{section}\n{task}"),
            "test",
            &no_env(),
        ) {
            Err(ConfigError::Invalid { key, message, .. }) => format!("{key}: {message}"),
            Err(ConfigError::Parse { source, .. }) => format!("parse: {source}"),
            Ok(_) => panic!("accepted: {section}"),
            Err(other) => panic!("{other}"),
        };
        let zero = refused("jobs_days = 0");
        assert!(
            zero.starts_with("retention.jobs_days: must be at least 1")
                && zero.contains("leave it out to keep everything"),
            "{zero}"
        );
        assert!(refused("races_days = 36501")
            .starts_with("retention.races_days: must be at most 36500"));
        assert!(refused("audit_days = -1").contains("audit_days"));
        assert!(refused("job_days = 7").contains("job_days"));
        assert!(refused("audit_days = \"90d\"").contains("audit_days"));
    }

    #[test]
    fn a_command_reads_only_the_secrets_it_needs() {
        let toml = r#"
            [server]
            public_url = "https://onejob.example.com"
            callback_secret_env = "ONEJOB_UNIT_CALLBACK"
            [[providers]]
            name = "a"
            kind = "openai"
            base_url = "https://api.example.com"
            model = "m"
            api_key_env = "ONEJOB_UNIT_KEY_A"
            [[providers]]
            name = "b"
            kind = "anthropic"
            base_url = "https://api.example.com"
            model = "m"
            api_key_env = "ONEJOB_UNIT_KEY_B"
            [[tasks]]
            name = "t"
            providers = ["a"]
            template = "{{ text }}"
        "#;
        let load = |env: &Environment, needed: SecretsNeeded| {
            Config::from_toml_with(toml, "test", env, &needed)
        };
        let config = load(&no_env(), SecretsNeeded::None).unwrap();
        assert!(config.providers.iter().all(|p| p.api_key.is_none()));
        assert!(config.callbacks.is_none());
        let only_b = Environment::from_pairs([("ONEJOB_UNIT_KEY_B", "sk-b")]);
        let config = load(&only_b, SecretsNeeded::ProviderKey("b".into())).unwrap();
        assert!(config.providers[0].api_key.is_none());
        assert_eq!(
            config.providers[1].api_key.as_ref().unwrap().expose(),
            "sk-b"
        );
        assert!(matches!(
            load(&no_env(), SecretsNeeded::ProviderKey("b".into())),
            Err(ConfigError::Invalid { key, .. }) if key == "providers[1].api_key_env"
        ));
        assert!(matches!(
            load(&only_b, SecretsNeeded::All),
            Err(ConfigError::Invalid { key, .. }) if key == "providers[0].api_key_env"
        ));
    }

    #[test]
    fn api_keys_come_from_the_environment_given_at_load_and_stay_secret() {
        let toml = r#"
            [[providers]]
            name = "a"
            kind = "openai"
            base_url = "https://api.example.com"
            model = "m"
            api_key_env = "ONEJOB_UNIT_KEY"
            [[tasks]]
            name = "t"
            providers = ["a"]
            template = "{{ text }}"
        "#;
        assert_eq!(invalid_key(toml), "providers[0].api_key_env");
        let env = Environment::from_pairs([("ONEJOB_UNIT_KEY", "sk-from-the-environment")]);
        let config = Config::from_toml(toml, "test", &env).unwrap();
        let key = config.providers[0].api_key.as_ref().unwrap();
        assert_eq!(key.expose(), "sk-from-the-environment");
        assert!(!format!("{config:?}").contains("sk-from-the-environment"));
    }
}
