//! Calls that requests share, by key. The first request to ask for a key
//! starts the call ([`Flight`]); the requests that ask while it is open
//! wait for what it hands on ([`Waiter`]). Two uses: a creation's twins
//! wait on their leader (`singleflight`), and the checks of one token on
//! one read of its grant (`credentials::GrantReads`).
//!
//! A call is open from its start until it is closed: when its [`Flight`]
//! is dropped, or earlier through [`Flights::close`] (a token's read closes
//! as it begins, so that it answers no request that asked after). A
//! request that asks for the key once it is closed starts another call.
//!
//! What a call hands on ([`Flight::share`]) reaches every request that
//! joined it, even one that waits only after it was sent. A call that ends
//! without handing anything on releases its waiters empty-handed
//! ([`Waiter::wait`] gives `None`), and each then does the work itself.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::watch;

type Channel<V> = watch::Sender<Option<V>>;

/// The calls open right now, by key.
pub(crate) struct Flights<K, V> {
    open: Mutex<HashMap<K, Arc<Channel<V>>>>,
}

impl<K, V> Default for Flights<K, V> {
    fn default() -> Self {
        Self {
            open: Mutex::new(HashMap::new()),
        }
    }
}

/// What a request that asked for a key does.
pub(crate) enum Joined<'a, K: Eq + Hash + Clone, V> {
    /// No call was open: this request makes it, then shares what it got.
    Started(Flight<'a, K, V>),
    /// A call was open: wait for what it hands on.
    Waiting(Waiter<V>),
}

/// Names one call, to close it from elsewhere ([`Flights::close`]) without
/// keeping it alive: a call whose [`Flight`] is dropped releases its
/// waiters at once, whatever still holds its ticket.
pub(crate) struct Ticket<V>(Weak<Channel<V>>);

impl<K: Eq + Hash + Clone, V> Flights<K, V> {
    fn lock(&self) -> MutexGuard<'_, HashMap<K, Arc<Channel<V>>>> {
        // Every change is one insert or removal: a panic leaves it whole.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins the call open under `key`, or starts one.
    pub fn join(&self, key: K) -> Joined<'_, K, V> {
        let mut open = self.lock();
        if let Some(channel) = open.get(&key) {
            return Joined::Waiting(Waiter(channel.subscribe()));
        }
        let channel = Arc::new(watch::channel(None).0);
        open.insert(key.clone(), channel.clone());
        Joined::Started(Flight {
            flights: self,
            key,
            channel,
        })
    }

    /// Closes the call `ticket` names to newcomers, if it is still the one
    /// open under `key`.
    pub fn close(&self, key: &K, ticket: &Ticket<V>) {
        self.close_channel(key, ticket.0.as_ptr());
    }

    /// Unlists the call open under `key` if its channel is `channel`.
    fn close_channel(&self, key: &K, channel: *const Channel<V>) {
        let mut open = self.lock();
        if open
            .get(key)
            .is_some_and(|open| std::ptr::eq(Arc::as_ptr(open), channel))
        {
            open.remove(key);
        }
    }

    /// Calls open, and the requests waiting on them.
    pub fn counts(&self) -> (usize, usize) {
        let open = self.lock();
        let waiting = open.values().map(|channel| channel.receiver_count()).sum();
        (open.len(), waiting)
    }
}

/// The request that makes a call. Dropped, it closes the call, and
/// releases the requests still waiting if it shared nothing.
pub(crate) struct Flight<'a, K: Eq + Hash + Clone, V> {
    flights: &'a Flights<K, V>,
    key: K,
    channel: Arc<Channel<V>>,
}

impl<K: Eq + Hash + Clone, V> Flight<'_, K, V> {
    pub fn key(&self) -> &K {
        &self.key
    }

    /// Names this call, for [`Flights::close`].
    pub fn ticket(&self) -> Ticket<V> {
        Ticket(Arc::downgrade(&self.channel))
    }

    /// Hands what `value` makes to every request that joined. Nothing is
    /// made while none waits, the common case: a request that joins after
    /// that, before the call is closed, is released empty-handed.
    pub fn share(&self, value: impl FnOnce() -> V) {
        if self.channel.receiver_count() > 0 {
            self.channel.send_replace(Some(value()));
        }
    }
}

impl<K: Eq + Hash + Clone, V> Drop for Flight<'_, K, V> {
    fn drop(&mut self) {
        // Once no longer listed, no one joins; the channel's last sender
        // goes with this flight, which releases whoever still waits.
        self.flights
            .close_channel(&self.key, Arc::as_ptr(&self.channel));
    }
}

/// A request waiting on a call another request makes.
pub(crate) struct Waiter<V>(watch::Receiver<Option<V>>);

impl<V: Clone> Waiter<V> {
    /// What the call handed on, or `None` when it ended without.
    pub async fn wait(mut self) -> Option<V> {
        self.0
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|shared| shared.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started<'a>(
        flights: &'a Flights<&'static str, u32>,
        key: &'static str,
    ) -> Flight<'a, &'static str, u32> {
        match flights.join(key) {
            Joined::Started(flight) => flight,
            Joined::Waiting(_) => panic!("no call was open under {key}"),
        }
    }

    fn waiting(flights: &Flights<&'static str, u32>, key: &'static str) -> Waiter<u32> {
        match flights.join(key) {
            Joined::Waiting(waiter) => waiter,
            Joined::Started(_) => panic!("a call was open under {key}"),
        }
    }

    #[tokio::test]
    async fn every_waiter_hears_what_its_call_shared_even_one_that_joined_after() {
        let flights = Flights::default();
        let flight = started(&flights, "k");
        let early = waiting(&flights, "k");
        assert!(matches!(flights.join("other"), Joined::Started(_)));
        assert_eq!(flights.counts(), (1, 1));
        flight.share(|| 7);
        let late = waiting(&flights, "k");
        drop(flight);
        assert_eq!(flights.counts(), (0, 0));
        assert_eq!(early.wait().await, Some(7));
        assert_eq!(late.wait().await, Some(7));
    }

    #[tokio::test]
    async fn a_call_dropped_without_sharing_releases_its_waiters_empty_handed() {
        let flights = Flights::<&'static str, u32>::default();
        let flight = started(&flights, "k");
        let waiter = tokio::spawn(waiting(&flights, "k").wait());
        tokio::task::yield_now().await;
        drop(flight);
        assert_eq!(waiter.await.unwrap(), None);
        assert_eq!(flights.counts(), (0, 0));
        started(&flights, "k");
    }

    #[tokio::test]
    async fn a_closed_call_takes_no_newcomer_and_its_ticket_closes_no_later_call() {
        let flights = Flights::default();
        let first = started(&flights, "k");
        let joined = waiting(&flights, "k");
        let ticket = first.ticket();
        flights.close(first.key(), &ticket);
        // A newcomer starts another call; the first one's ticket and its
        // drop leave that one open.
        let second = started(&flights, "k");
        flights.close(&"k", &ticket);
        first.share(|| 1);
        drop(first);
        assert_eq!(joined.wait().await, Some(1));
        let on_second = waiting(&flights, "k");
        second.share(|| 2);
        drop(second);
        assert_eq!(on_second.wait().await, Some(2));
    }
}
