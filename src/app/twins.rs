//! Twins in flight: a request under a key that this process is already
//! creating a job for waits for that creation and answers from its job,
//! instead of taking a connection to ask the database the same question.
//!
//! A storm of retries or double-clicks under one key then costs the
//! database one insert per process, not one statement per request. The
//! first request (the leader) goes on as usual; each twin that arrives
//! while it is in flight (a follower) gets the job the leader's transaction
//! committed and answers exactly as the database would have answered it:
//! the same job as a replay for the same payload, 409 for another.
//!
//! This spares the database work; it decides nothing. `UNIQUE(owner, key)`
//! still settles twins that reach different processes, and a leader that
//! ends without a committed job to show (refused, failed, or dropped with
//! its client) lets its followers go to the database on their own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::{Attempt, Job};
use crate::domain::UserId;

/// A job as the leader's committed transaction left it.
#[derive(Debug)]
pub(crate) struct Landed {
    pub job: Job,
    pub attempts: Vec<Attempt>,
}

type Flight = Arc<watch::Sender<Option<Arc<Landed>>>>;

/// The keys this process is creating jobs for right now.
#[derive(Default)]
pub(crate) struct KeyFlights {
    flights: Mutex<HashMap<(UserId, String), Flight>>,
}

/// What a request under a key does.
pub(crate) enum Boarding<'a> {
    /// No twin is in flight: create, then [`Leader::land`].
    Leader(Leader<'a>),
    /// A twin is in flight: wait for its job ([`follow`]).
    Follower(watch::Receiver<Option<Arc<Landed>>>),
}

impl KeyFlights {
    pub fn board(&self, owner: &UserId, key: &str) -> Boarding<'_> {
        let mut flights = self.flights.lock().expect("the key flights lock");
        let id = (owner.clone(), key.to_owned());
        if let Some(flight) = flights.get(&id) {
            return Boarding::Follower(flight.subscribe());
        }
        let flight: Flight = Arc::new(watch::channel(None).0);
        flights.insert(id.clone(), flight.clone());
        Boarding::Leader(Leader {
            flights: self,
            id,
            flight,
        })
    }

    /// Keys in flight, and the followers waiting on them.
    pub fn counts(&self) -> (usize, usize) {
        let flights = self.flights.lock().expect("the key flights lock");
        let followers = flights.values().map(|f| f.receiver_count()).sum();
        (flights.len(), followers)
    }
}

/// The request that creates; its followers are released when it is
/// dropped, with its job if it landed one.
pub(crate) struct Leader<'a> {
    flights: &'a KeyFlights,
    id: (UserId, String),
    flight: Flight,
}

impl Leader<'_> {
    /// Hands the committed job to every follower, present and arriving.
    pub fn land(&self, job: &Job, attempts: &[Attempt]) {
        self.flight.send_replace(Some(Arc::new(Landed {
            job: job.clone(),
            attempts: attempts.to_vec(),
        })));
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        // Only this leader's flight is under its key: a new one boards only
        // after this removal. Dropping the last sender closes the channel,
        // which releases followers still waiting when nothing landed.
        self.flights
            .flights
            .lock()
            .expect("the key flights lock")
            .remove(&self.id);
    }
}

/// The leader's job, or `None` when it ended without one.
pub(crate) async fn follow(
    mut flight: watch::Receiver<Option<Arc<Landed>>>,
) -> Option<Arc<Landed>> {
    flight
        .wait_for(Option::is_some)
        .await
        .ok()
        .and_then(|landed| landed.clone())
}
