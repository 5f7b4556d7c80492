//! A record of every SQL statement a store's connections send, for the
//! statement rule (`store::distribution`) and for looking at what a path
//! costs. Off unless a store is built with one.

use std::sync::{Arc, Mutex};

use diesel::connection::{Instrumentation, InstrumentationEvent};

/// Statements as sent, in order, shared by every connection of a pool.
#[derive(Debug, Clone, Default)]
pub struct StatementLog(Arc<Mutex<Vec<String>>>);

impl StatementLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// Everything recorded since the last call.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().expect("never poisoned"))
    }

    /// The instrumentation to install on one connection.
    pub fn instrumentation(&self) -> impl Instrumentation {
        let log = self.clone();
        move |event: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::StartQuery { query, .. } = event {
                log.0
                    .lock()
                    .expect("never poisoned")
                    .push(query.to_string());
            }
        }
    }
}
