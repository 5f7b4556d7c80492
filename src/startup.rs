//! Building and running the application: the database, the worker and the HTTP
//! server. The server takes a pre-bound listener, so tests bind port 0.

use std::net::TcpListener;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::middleware::from_fn;
use actix_web::web::Data;
use actix_web::{App as HttpApp, HttpServer};
use tracing_actix_web::TracingLogger;

use crate::app::App;
use crate::config::Config;
use crate::domain::ids::text_enum;
use crate::providers::Providers;
use crate::store::{migrations, DatabaseUrl, Store};
use crate::telemetry::http_span::HttpSpan;
use crate::web;
use crate::worker::{self, WorkerHandle};

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Connect(#[from] crate::store::connection::ConnectError),
    #[error("database migrations failed: {0}")]
    Migrate(String),
    #[error("cannot start the HTTP server: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Role(String),
}

/// Opens the pool and applies pending migrations.
pub fn open_store(url: &DatabaseUrl, config: &Config) -> Result<Store, StartupError> {
    let store = Store::connect(url, &config.database)?;
    let mut conn = store.conn()?;
    let applied =
        migrations::run_pending(&mut conn).map_err(|e| StartupError::Migrate(e.to_string()))?;
    for version in applied {
        tracing::info!(%version, "migration applied");
    }
    Ok(store)
}

text_enum! {
    /// What one `onejob serve` process does (`--role`, `ONEJOB_ROLE`).
    #[derive(Default, clap::ValueEnum)]
    pub enum ProcessRole {
        /// The API, the pages and the worker.
        #[default]
        All = "all",
        /// The API and the pages; no attempt is sent from here (as with
        /// `[worker] concurrency = 0`). Leases are still reaped.
        Http = "http",
        /// The worker, with an HTTP listener for the orchestrator and
        /// Prometheus only: `/healthz`, `/readyz`, `/metrics`.
        Worker = "worker",
    }
}

impl ProcessRole {
    /// Refuses a role this configuration cannot fill: a worker-only
    /// process without worker slots would do nothing.
    pub fn check(self, config: &Config) -> Result<(), StartupError> {
        if self == Self::Worker && config.worker.concurrency == 0 {
            return Err(StartupError::Role(
                "a worker-only process needs `[worker] concurrency` above 0".into(),
            ));
        }
        Ok(())
    }

    /// Whether this process serves the browser pages (and so can be
    /// signed in to).
    pub fn serves_pages(self) -> bool {
        !matches!(self, Self::Worker)
    }
}

pub struct Application {
    port: u16,
    server: Server,
    /// `[server] metrics_bind`'s server, if one was started: running in a
    /// task of its own (an actix server serves only while polled).
    metrics_server: Option<(
        actix_web::dev::ServerHandle,
        tokio::task::JoinHandle<std::io::Result<()>>,
    )>,
    worker: WorkerHandle,
    grace: Duration,
    app: App,
}

impl Application {
    /// Starts the worker and builds the HTTP server on `listener`; nothing is
    /// served until [`run_until_stopped`](Self::run_until_stopped). Simulated
    /// providers are qualified in the background: serving never waits for it.
    pub async fn build(
        config: Config,
        store: Store,
        listener: TcpListener,
    ) -> Result<Self, StartupError> {
        let providers = Providers::from_settings(&config.providers);
        Self::build_with_providers(config, store, providers, listener).await
    }

    /// As [`build`](Self::build), for a process with `role`.
    pub async fn build_as(
        role: ProcessRole,
        mut config: Config,
        store: Store,
        listener: TcpListener,
    ) -> Result<Self, StartupError> {
        role.check(&config)?;
        if role == ProcessRole::Http {
            config.worker.concurrency = 0;
        }
        let providers = Providers::from_settings(&config.providers);
        Self::assemble(role, config, store, providers, listener).await
    }

    /// As [`build`](Self::build), with the providers given (tests inject clients).
    pub async fn build_with_providers(
        config: Config,
        store: Store,
        providers: Providers,
        listener: TcpListener,
    ) -> Result<Self, StartupError> {
        Self::assemble(ProcessRole::All, config, store, providers, listener).await
    }

    async fn assemble(
        role: ProcessRole,
        config: Config,
        store: Store,
        providers: Providers,
        listener: TcpListener,
    ) -> Result<Self, StartupError> {
        let body_limit = config.server.body_limit_bytes;
        let routes = move |cfg: &mut actix_web::web::ServiceConfig| match role {
            ProcessRole::Worker => web::probe_routes(cfg),
            ProcessRole::All | ProcessRole::Http => web::routes(cfg, body_limit),
        };
        let app = App::with_providers(store, config, providers);
        app.qualify_simulated_in_background();
        let worker = worker::spawn(app.clone());
        let server_settings = app.config().server.clone();
        let port = listener.local_addr()?.port();
        let state = Data::new(app.clone());
        let mut server = HttpServer::new(move || {
            // Run by each HTTP worker as it starts, on its own thread.
            crate::store::mailbox::Mailbox::open_on_this_thread();
            HttpApp::new()
                .wrap(from_fn(web::around_each_request))
                .wrap(TracingLogger::<HttpSpan>::new())
                .app_data(state.clone())
                .configure(routes)
        })
        .listen(listener)?
        .shutdown_timeout(server_settings.shutdown_grace_ms.div_ceil(1000));
        if server_settings.http_workers > 0 {
            server = server.workers(server_settings.http_workers);
        }
        Ok(Self {
            port,
            server: server.run(),
            metrics_server: None,
            worker,
            grace: Duration::from_millis(server_settings.shutdown_grace_ms),
            app,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Also serves `/metrics`, without a token, on `listener` (`[server]
    /// metrics_bind`): one thread, stopped with the main server.
    pub fn serve_metrics_on(&mut self, listener: TcpListener) -> Result<(), StartupError> {
        let state = Data::new(self.app.clone());
        let server = HttpServer::new(move || {
            HttpApp::new()
                .wrap(from_fn(web::security_headers))
                .wrap(TracingLogger::<HttpSpan>::new())
                .app_data(state.clone())
                .configure(web::metrics_routes)
        })
        .listen(listener)?
        .workers(1)
        .disable_signals()
        .run();
        self.metrics_server = Some((server.handle(), tokio::spawn(server)));
        Ok(())
    }

    /// The application this server fronts (tests read the simulated
    /// providers' logs through it).
    pub fn app(&self) -> App {
        self.app.clone()
    }

    /// Serves until SIGINT/SIGTERM (handled by actix), then stops the worker:
    /// no new claims, in-flight calls get the grace period.
    pub async fn run_until_stopped(self) -> Result<(), std::io::Error> {
        let served = self.server.await;
        if let Some((handle, served)) = self.metrics_server {
            handle.stop(false).await;
            let _ = served.await;
        }
        tracing::info!("HTTP server stopped; stopping the worker");
        self.worker.shutdown(self.grace).await;
        served
    }
}
