//! The command line: `serve`, `migrate`, `qualify`, `users …`, `prune`.

use std::net::TcpListener;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::app::App;

mod first_admin;
use crate::config::{Config, Environment, SecretsNeeded};
use crate::domain::{Role, Timestamp};
use crate::startup::{open_store, Application, ProcessRole};
use crate::store::DatabaseUrl;

#[derive(Debug, Parser)]
#[command(
    name = "onejob",
    version,
    about = "One user intent, exactly one durable Job."
)]
pub struct Cli {
    /// TOML configuration file (default: the built-in configuration).
    #[arg(long, env = "ONEJOB_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// `postgres://…` or a SQLite file path (default: `[database] url`, else `onejob.db`).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Let `users`, `qualify`, `prune` or `citus` create the SQLite file
    /// when it does not exist (without it they refuse: a new file is
    /// usually the wrong one; `serve` and `migrate` create it always).
    #[arg(long, global = true)]
    pub create_database: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP server and the worker.
    Serve {
        /// Address to listen on (default: `[server] bind`, else 127.0.0.1:8080).
        #[arg(long, env = "ONEJOB_BIND")]
        bind: Option<String>,
        /// `all`: the API, the pages and the worker; `http`: no worker;
        /// `worker`: the worker, and only health checks and metrics over HTTP.
        #[arg(long, env = "ONEJOB_ROLE", value_enum, default_value_t = ProcessRole::All)]
        role: ProcessRole,
    },
    /// Apply pending database migrations and exit.
    Migrate,
    /// Run a task's contract against a provider and record the result; exits
    /// non-zero when a check fails.
    Qualify {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        task: String,
    },
    /// Manage users and their API tokens.
    Users {
        #[command(subcommand)]
        command: UsersCommand,
    },
    /// Remove finished jobs (their attempts, freeing their idempotency
    /// keys) and race- and audit-log entries older than the `[retention]`
    /// windows; prints what went. The server also does this every minute.
    Prune,
    /// Past one PostgreSQL: Citus (docs/scaling.md).
    Citus {
        #[command(subcommand)]
        command: CitusCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum CitusCommand {
    /// Distribute a migrated database by owner, on the Citus coordinator
    /// `DATABASE_URL` names: registers the nodes, makes the reference
    /// tables, distributes and colocates the owner tables. Run it again
    /// and it changes nothing.
    Distribute {
        /// How the workers reach the coordinator, HOST:PORT (registered
        /// unless it already is).
        #[arg(long)]
        coordinator: Option<String>,
        /// A worker to add, HOST:PORT; repeat for each. The worker needs
        /// this database, with `CREATE EXTENSION citus`, made beforehand.
        #[arg(long = "worker")]
        workers: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum UsersCommand {
    /// Create a user; prints its first API token alone on the last line.
    Add {
        name: String,
        #[arg(long, value_enum, default_value_t = RoleArg::User)]
        role: RoleArg,
    },
    /// Issue a further API token for a user; prints it alone.
    Token {
        name: String,
        /// The token expires after this many days (default: never).
        #[arg(long)]
        days: Option<u32>,
    },
    /// Give a user a new random password for browser sign-in; prints it
    /// alone. Their sessions end.
    Password { name: String },
    /// Disable a user: their sessions and API tokens stop working at once.
    Disable { name: String },
    /// Enable a disabled user again.
    Enable { name: String },
    /// Delete every API token of a user.
    RevokeTokens { name: String },
    /// Rename a user (for instance one whose name differs from another's
    /// only in case); their tokens, sessions and jobs stay theirs.
    Rename { name: String, new_name: String },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RoleArg {
    User,
    Support,
    Admin,
}

impl From<RoleArg> for Role {
    fn from(r: RoleArg) -> Self {
        match r {
            RoleArg::User => Role::User,
            RoleArg::Support => Role::Support,
            RoleArg::Admin => Role::Admin,
        }
    }
}

pub type CliResult = Result<(), Box<dyn std::error::Error>>;

impl Command {
    /// The secrets this command reads from the environment: a server needs
    /// every one; `qualify` only the key of the provider it calls; the
    /// others none, so an operator's shell need not hold provider keys.
    fn secrets_needed(&self) -> SecretsNeeded {
        match self {
            Self::Serve { .. } => SecretsNeeded::All,
            Self::Qualify { provider, .. } => SecretsNeeded::ProviderKey(provider.clone()),
            Self::Migrate | Self::Users { .. } | Self::Prune | Self::Citus { .. } => {
                SecretsNeeded::None
            }
        }
    }

    /// Whether this command creates the database when there is none:
    /// `serve` and `migrate` do; the others work on an existing one.
    fn creates_database(&self) -> bool {
        matches!(self, Self::Serve { .. } | Self::Migrate)
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Serve { .. } => "serve",
            Self::Migrate => "migrate",
            Self::Qualify { .. } => "qualify",
            Self::Users { .. } => "users",
            Self::Prune => "prune",
            Self::Citus { .. } => "citus",
        }
    }
}

/// Refuses to make a new SQLite file for a command that administers an
/// existing database: run from another directory, or without the server's
/// `--config`, it would otherwise create an empty `onejob.db` and answer
/// as if the server's users were not there.
fn refuse_a_new_sqlite_file(command: &Command, url: &DatabaseUrl) -> CliResult {
    let Some(file) = url.sqlite_file() else {
        return Ok(());
    };
    if file.exists() {
        return Ok(());
    }
    let file = std::path::absolute(&file).unwrap_or(file);
    Err(format!(
        "there is no database at {}: `onejob {}` works on an existing one. Name the \
         server's database with the server's --config (or --database-url, DATABASE_URL), \
         or create this one first with `onejob migrate` (or pass --create-database)",
        file.display(),
        command.name()
    )
    .into())
}

/// Runs one command. The configuration (and the environment variables it
/// names, as far as the command needs them) is read here, once, before the
/// async runtime starts: it sizes the runtime (`server.async_threads`).
/// Then the logger is installed with `log_filter` (only a server exports
/// traces) and the command runs on the runtime.
pub fn execute(cli: Cli, log_filter: Option<&str>) -> CliResult {
    let config = Config::load_with(
        cli.config.as_deref(),
        &Environment::Process,
        &cli.command.secrets_needed(),
    )?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.server.async_threads())
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async {
        let traced = match cli.command {
            Command::Serve { .. } => config.telemetry.clone(),
            _ => crate::config::TelemetryConfig::default(),
        };
        let export = crate::telemetry::init(log_filter, &traced);
        let result = run(cli, config).await;
        if let Some(export) = export {
            export.shutdown(std::time::Duration::from_secs(5));
        }
        result
    })
}

async fn run(cli: Cli, config: Config) -> CliResult {
    let url = DatabaseUrl::parse(cli.database_url.as_deref().unwrap_or(&config.database.url))?;
    if matches!(cli.command, Command::Citus { .. })
        && url.backend() != crate::store::Backend::Postgres
    {
        return Err(crate::store::distribution::DistributeError::NotPostgres.into());
    }
    if !cli.command.creates_database() && !cli.create_database {
        refuse_a_new_sqlite_file(&cli.command, &url)?;
    }
    if !matches!(cli.command, Command::Serve { .. }) {
        // On stderr: stdout keeps only what a script captures (a token).
        eprintln!("onejob: using {}", url.described());
    }
    match cli.command {
        Command::Serve { bind, role } => serve(config, url, bind, role).await,
        Command::Migrate => {
            let store = open(&url, &config).await?;
            drop(store);
            eprintln!("migrations are up to date on {}", url.redacted());
            Ok(())
        }
        Command::Users { command } => {
            let app = App::new(open(&url, &config).await?, config);
            users_command(&app, command).await
        }
        Command::Qualify { provider, task } => {
            let app = App::new(open(&url, &config).await?, config);
            qualify_command(&app, &provider, &task).await
        }
        Command::Prune => {
            let app = App::new(open(&url, &config).await?, config);
            prune_command(&app).await
        }
        Command::Citus {
            command:
                CitusCommand::Distribute {
                    coordinator,
                    workers,
                },
        } => citus_distribute(&url, &config, coordinator.as_deref(), &workers).await,
    }
}

/// Opens the store (and migrates) off the async runtime's threads, and
/// names any users whose names differ only in case.
async fn open(
    url: &DatabaseUrl,
    config: &Config,
) -> Result<crate::store::Store, Box<dyn std::error::Error>> {
    let (url, config) = (url.clone(), config.clone());
    let store = tokio::task::spawn_blocking(move || open_store(&url, &config)).await??;
    let clashes = store.run(crate::store::users::case_clashes).await?;
    for (name, earlier) in clashes {
        tracing::warn!(
            "user {name:?} differs only in case from {earlier:?}, an earlier user; user names \
             are now compared without regard to case: rename it with \
             `onejob users rename {name} <new-name>`"
        );
    }
    Ok(store)
}

async fn users_command(app: &App, command: UsersCommand) -> CliResult {
    match command {
        UsersCommand::Add { name, role } => {
            let (user, token) = app.add_user(&name, role.into()).await?;
            eprintln!(
                "created user {} with role {}; its API token (shown once):",
                user.name, user.role
            );
            println!("{}", token.0);
        }
        UsersCommand::Token { name, days } => {
            let token = app.issue_token(&name, days).await?;
            println!("{}", token.0);
        }
        UsersCommand::Disable { name } => {
            app.set_disabled_by_name(&name, true).await?;
            eprintln!("disabled {name}: their sessions and tokens no longer work");
        }
        UsersCommand::Enable { name } => {
            app.set_disabled_by_name(&name, false).await?;
            eprintln!("enabled {name}");
        }
        UsersCommand::RevokeTokens { name } => {
            let n = app.revoke_tokens_by_name(&name).await?;
            eprintln!("revoked {n} API token(s) of {name}");
        }
        UsersCommand::Rename { name, new_name } => {
            app.rename_user(&name, &new_name).await?;
            eprintln!("renamed {name} to {new_name}");
        }
        UsersCommand::Password { name } => {
            let password = app.reset_password(&name).await?;
            eprintln!("new password for {name} (shown once):");
            println!("{password}");
        }
    }
    Ok(())
}

async fn qualify_command(app: &App, provider: &str, task: &str) -> CliResult {
    let settings = app
        .config()
        .provider(provider)
        .ok_or_else(|| format!("no provider named {provider:?} is configured"))?;
    let contract = app
        .config()
        .contracts
        .get(task)
        .ok_or_else(|| format!("no task named {task:?} is configured"))?;
    if !contract.chain().iter().any(|p| p == provider) {
        return Err(format!("provider {provider:?} is not in the chain of task {task:?}").into());
    }
    println!(
        "qualifying {provider} (model {}) for task {task}",
        settings.model_name()
    );
    let report = app.qualify(None, provider, task).await?;
    for check in &report.checks {
        println!(
            "{} {}: {}",
            if check.passed { "PASS" } else { "FAIL" },
            check.name,
            check.detail
        );
    }
    match report.first_failure() {
        None => {
            println!("qualified: {provider} may take failover for {task}");
            Ok(())
        }
        Some(check) => {
            Err(format!("not qualified: {} failed: {}", check.name, check.detail).into())
        }
    }
}

async fn prune_command(app: &App) -> CliResult {
    let windows = &app.config().retention;
    if !windows.prunes_anything() {
        println!("nothing to prune: no [retention] window is set, so everything is kept");
        return Ok(());
    }
    let pruned = app.prune_expired(Timestamp::now()).await?;
    let window = |days: Option<u32>, what: &str| match days {
        Some(days) => format!("{what} more than {days} days ago"),
        None => "none: kept forever".to_owned(),
    };
    let jobs_note = match windows.jobs_days {
        Some(_) => window(windows.jobs_days, "finished") + "; their keys are free again",
        None => window(None, ""),
    };
    println!("jobs       {:>9}  {jobs_note}", pruned.jobs);
    println!("attempts   {:>9}  of those jobs", pruned.attempts);
    println!(
        "race log   {:>9}  {}",
        pruned.race_entries,
        window(windows.races_days, "written")
    );
    println!(
        "audit log  {:>9}  {}",
        pruned.audit_entries,
        window(windows.audit_days, "written")
    );
    Ok(())
}

async fn citus_distribute(
    url: &DatabaseUrl,
    config: &Config,
    coordinator: Option<&str>,
    workers: &[String],
) -> CliResult {
    use crate::store::distribution::{self, DistributeError, Node};
    use diesel::Connection;
    let coordinator = coordinator.map(Node::parse).transpose()?;
    let workers = workers
        .iter()
        .map(|w| Node::parse(w))
        .collect::<Result<Vec<_>, _>>()?;
    if url.backend() != crate::store::Backend::Postgres {
        return Err(DistributeError::NotPostgres.into());
    }
    // Refused before the migrations touch a server without Citus.
    let mut check = diesel::PgConnection::establish(url.as_str())?;
    distribution::require_citus(&mut check)?;
    drop(check);
    let store = open(url, config).await?;
    let mut conn = store.conn()?;
    let crate::store::DbConnection::Postgresql(pg) = &mut *conn else {
        return Err(DistributeError::NotPostgres.into());
    };
    for step in distribution::distribute(pg, coordinator.as_ref(), &workers)? {
        println!("{step}");
    }
    Ok(())
}

async fn serve(
    config: Config,
    url: DatabaseUrl,
    bind: Option<String>,
    role: ProcessRole,
) -> CliResult {
    let bind = bind.unwrap_or_else(|| config.server.bind.clone());
    // Refused before anything is opened or created.
    role.check(&config)?;
    let store = open(&url, &config).await?;
    let listener = TcpListener::bind(&bind).map_err(|e| format!("cannot listen on {bind}: {e}"))?;
    // Only a process that serves the pages can be signed in to.
    if role.serves_pages() {
        let sign_in_at = match &config.server.public_url {
            Some(url) => format!("{}/login", url.trim_end_matches('/')),
            None => format!("http://{}/login", listener.local_addr()?),
        };
        let app = App::new(store.clone(), config.clone());
        first_admin::create_and_hand_over(&app, &url, &sign_in_at).await?;
    }
    tracing::info!(
        address = %listener.local_addr()?,
        database = %url.described(),
        backend = store.backend().as_str(),
        role = role.as_str(),
        async_threads = tokio::runtime::Handle::current().metrics().num_workers(),
        "onejob is serving"
    );
    let metrics_listener = match &config.server.metrics_bind {
        Some(address) => {
            let listener = TcpListener::bind(address)
                .map_err(|e| format!("cannot listen on {address} (metrics_bind): {e}"))?;
            tracing::info!(address = %listener.local_addr()?, "serving /metrics without a token");
            Some(listener)
        }
        None => None,
    };
    let mut app = Application::build_as(role, config, store, listener).await?;
    if let Some(listener) = metrics_listener {
        app.serve_metrics_on(listener)?;
    }
    app.run_until_stopped().await?;
    tracing::info!("stopped");
    Ok(())
}
