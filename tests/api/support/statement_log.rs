//! A record of every SQL statement a store's connections send, for the
//! statement rule (docs/scaling.md) and for looking at what a path
//! costs: the store's [`Instrumenter`] hook, filled in by the tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use diesel::connection::{Instrumentation, InstrumentationEvent};
use onejob::store::Instrumenter;

/// One statement as sent, with where it ran: which connection, and which
/// of that connection's transactions (none: it committed alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The statement, with diesel's list of its bound values.
    pub sql: String,
    /// The connection, numbered from 1 in the order connections opened.
    pub connection: u64,
    /// The connection's outermost transaction, numbered from 1, if one
    /// was open.
    pub transaction: Option<u64>,
}

/// Statements as sent, in order, shared by every connection of a pool;
/// and apart, the text of each statement a connection's cache took.
#[derive(Debug, Clone, Default)]
pub struct StatementLog {
    sent: Arc<Mutex<Vec<Sent>>>,
    cached: Arc<Mutex<Vec<String>>>,
    connections: Arc<AtomicU64>,
}

impl StatementLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// Everything recorded since the last call.
    pub fn take(&self) -> Vec<String> {
        self.take_sent().into_iter().map(|sent| sent.sql).collect()
    }

    /// Everything recorded since the last call, with where each ran.
    pub fn take_sent(&self) -> Vec<Sent> {
        std::mem::take(&mut *self.sent.lock().expect("never poisoned"))
    }

    /// The statements prepared and kept since the last call: each text
    /// once per connection that kept it. A statement diesel's cache
    /// refuses is never here, however often it runs (prepared anew each
    /// time).
    pub fn take_cached(&self) -> Vec<String> {
        std::mem::take(&mut *self.cached.lock().expect("never poisoned"))
    }

    /// The hook that gives each new connection of a store its recorder.
    pub fn instrumenter(&self) -> Instrumenter {
        let log = self.clone();
        Instrumenter(Arc::new(move || Box::new(log.instrumentation())))
    }

    /// The instrumentation to install on one connection.
    fn instrumentation(&self) -> impl Instrumentation {
        let log = self.clone();
        let connection = self.connections.fetch_add(1, Ordering::Relaxed) + 1;
        let mut transactions = 0u64;
        let mut open: Option<u64> = None;
        move |event: InstrumentationEvent<'_>| match event {
            InstrumentationEvent::BeginTransaction { depth, .. } if depth.get() == 1 => {
                transactions += 1;
                open = Some(transactions);
            }
            InstrumentationEvent::CommitTransaction { depth, .. }
            | InstrumentationEvent::RollbackTransaction { depth, .. }
                if depth.get() == 1 =>
            {
                open = None;
            }
            InstrumentationEvent::StartQuery { query, .. } => {
                log.sent.lock().expect("never poisoned").push(Sent {
                    sql: query.to_string(),
                    connection,
                    transaction: open,
                })
            }
            InstrumentationEvent::CacheQuery { sql, .. } => log
                .cached
                .lock()
                .expect("never poisoned")
                .push(sql.to_owned()),
            _ => {}
        }
    }
}
