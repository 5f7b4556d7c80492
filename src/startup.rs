//! Building and running the application: the database, the worker and the HTTP
//! server. The server takes a pre-bound listener, so tests bind port 0.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::middleware::from_fn;
use actix_web::{App, HttpServer};
use tracing_actix_web::TracingLogger;

use crate::config::Config;
use crate::providers::Providers;
use crate::store::{migrations, DatabaseUrl, Store};
use crate::tasks::Tasks;
use crate::web::{self, AppState};
use crate::worker::{self, WorkerHandle};
use actix_web::web::Data;

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

pub struct Application {
    port: u16,
    server: Server,
    worker: WorkerHandle,
    grace: Duration,
    state: Data<AppState>,
}

impl Application {
    /// Qualifies simulated providers that need it, starts the worker and builds
    /// the HTTP server on `listener`; nothing is served until
    /// [`run_until_stopped`](Self::run_until_stopped).
    pub async fn build(
        config: Config,
        store: Store,
        listener: TcpListener,
    ) -> Result<Self, StartupError> {
        let config = Arc::new(config);
        let providers = Providers::from_config(&config);
        let tasks = Tasks::from_config(&config);
        crate::qualify::qualify_simulated(&store, &config, &providers, &tasks).await;
        let worker = worker::spawn(
            store.clone(),
            providers.clone(),
            tasks.clone(),
            config.clone(),
        );
        let state = Data::new(AppState {
            store,
            config: config.clone(),
            providers,
            tasks,
            worker_wake: worker.waker(),
        });
        let port = listener.local_addr()?.port();
        let app_state = state.clone();
        let mut server = HttpServer::new(move || {
            App::new()
                .wrap(from_fn(web::echo_request_id))
                .wrap(TracingLogger::default())
                .app_data(app_state.clone())
                .configure(web::routes)
        })
        .listen(listener)?
        .shutdown_timeout(config.server.shutdown_grace_ms.div_ceil(1000));
        if config.server.http_workers > 0 {
            server = server.workers(config.server.http_workers);
        }
        Ok(Self {
            port,
            server: server.run(),
            worker,
            grace: Duration::from_millis(config.server.shutdown_grace_ms),
            state,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The providers this application calls (tests read the simulated ones' logs).
    pub fn providers(&self) -> Providers {
        self.state.providers.clone()
    }

    /// Serves until SIGINT/SIGTERM (handled by actix), then stops the worker:
    /// no new claims, in-flight calls get the grace period.
    pub async fn run_until_stopped(self) -> Result<(), std::io::Error> {
        let served = self.server.await;
        tracing::info!("HTTP server stopped; stopping the worker");
        self.worker.shutdown(self.grace).await;
        served
    }
}
