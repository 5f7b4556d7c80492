//! A record of every SQL statement a store's connections send, for the
//! statement rule (`store::distribution`) and for looking at what a path
//! costs. Off unless a store is built with one.

use std::sync::{Arc, Mutex};

use diesel::connection::{Instrumentation, InstrumentationEvent};

/// Statements as sent, in order, shared by every connection of a pool;
/// and apart, the text of each statement a connection's cache took.
#[derive(Debug, Clone, Default)]
pub struct StatementLog {
    sent: Arc<Mutex<Vec<String>>>,
    cached: Arc<Mutex<Vec<String>>>,
}

impl StatementLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// Everything recorded since the last call.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.sent.lock().expect("never poisoned"))
    }

    /// The statements prepared and kept since the last call: each text
    /// once per connection that kept it. A statement diesel's cache
    /// refuses is never here, however often it runs (prepared anew each
    /// time).
    pub fn take_cached(&self) -> Vec<String> {
        std::mem::take(&mut *self.cached.lock().expect("never poisoned"))
    }

    /// The instrumentation to install on one connection.
    pub fn instrumentation(&self) -> impl Instrumentation {
        let log = self.clone();
        move |event: InstrumentationEvent<'_>| match event {
            InstrumentationEvent::StartQuery { query, .. } => log
                .sent
                .lock()
                .expect("never poisoned")
                .push(query.to_string()),
            InstrumentationEvent::CacheQuery { sql, .. } => log
                .cached
                .lock()
                .expect("never poisoned")
                .push(sql.to_owned()),
            _ => {}
        }
    }
}
