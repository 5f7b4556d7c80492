//! The line for password checks. Argon2 is deliberately expensive, so only
//! a few run at once (`server.password_hashing_concurrency`). Sign-ins wait
//! their turn in arrival order, briefly, instead of being refused whenever
//! every slot happens to be busy: a flood then slows each sign-in down by
//! the length of the line, rather than refusing honest users outright.
//!
//! What keeps a flood from owning the line:
//! - one address (an IPv4 address or an IPv6 /64) may hold at most
//!   [`PER_ADDRESS`] places in it; more from the same address are refused
//!   at once, before they queue;
//! - the line is at most [`MAX_WAITING`] long per slot, and nobody waits in
//!   it longer than [`MAX_WAIT`]; past either, the sign-in is refused as
//!   busy (503, `Retry-After`), and nothing is counted against anyone.
//!
//! Setting and resetting passwords (admins, the command line) take the
//! same slots without those limits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Places in the line one address may hold at once.
pub const PER_ADDRESS: usize = 2;
/// Sign-ins that may wait per hashing slot.
pub const MAX_WAITING: usize = 32;
/// The longest a sign-in waits for its turn.
pub const MAX_WAIT: Duration = Duration::from_secs(2);

/// Why a sign-in got no turn. Either way nothing was counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoTurn {
    /// This address already has its share of places in the line.
    AddressBusy,
    /// The line is full, or the wait ran out.
    Busy,
}

pub struct PasswordQueue {
    slots: Arc<Semaphore>,
    max_waiting: usize,
    places: Mutex<Places>,
}

#[derive(Default)]
struct Places {
    by_address: HashMap<String, usize>,
    total: usize,
}

/// A place in the line, given back when dropped.
pub struct Place {
    queue: Arc<PasswordQueue>,
    address: String,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut places = self.queue.places.lock().expect("never poisoned");
        places.total -= 1;
        if let Some(n) = places.by_address.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                places.by_address.remove(&self.address);
            }
        }
    }
}

/// The right to run one password check now.
pub struct Turn {
    _slot: OwnedSemaphorePermit,
    _place: Place,
}

impl PasswordQueue {
    /// A line for `configured` concurrent checks (0: half the cores, at
    /// least one).
    pub fn new(configured: usize) -> Arc<Self> {
        let slots = if configured == 0 {
            std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
        } else {
            configured
        };
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(slots)),
            max_waiting: MAX_WAITING * slots,
            places: Mutex::default(),
        })
    }

    /// Takes a place in the line for `address`, or says why not.
    pub fn join(self: &Arc<Self>, address: &str) -> Result<Place, NoTurn> {
        let mut places = self.places.lock().expect("never poisoned");
        let held = places.by_address.get(address).copied().unwrap_or(0);
        if held >= PER_ADDRESS {
            return Err(NoTurn::AddressBusy);
        }
        if places.total >= self.max_waiting {
            return Err(NoTurn::Busy);
        }
        places.total += 1;
        *places.by_address.entry(address.to_owned()).or_default() += 1;
        Ok(Place {
            queue: self.clone(),
            address: address.to_owned(),
        })
    }

    /// Waits (in arrival order, at most [`MAX_WAIT`]) for a free slot.
    pub async fn turn(&self, place: Place) -> Result<Turn, NoTurn> {
        self.turn_within(place, MAX_WAIT).await
    }

    async fn turn_within(&self, place: Place, wait: Duration) -> Result<Turn, NoTurn> {
        match tokio::time::timeout(wait, self.slots.clone().acquire_owned()).await {
            Ok(Ok(slot)) => Ok(Turn {
                _slot: slot,
                _place: place,
            }),
            _ => Err(NoTurn::Busy),
        }
    }

    /// A slot for setting a password, waiting as long as it takes.
    pub async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().acquire_owned().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_address_holds_at_most_its_share_of_the_line() {
        let queue = PasswordQueue::new(1);
        let a = queue.join("192.0.2.1").unwrap();
        let b = queue.join("192.0.2.1").unwrap();
        assert_eq!(queue.join("192.0.2.1").err(), Some(NoTurn::AddressBusy));
        // Another address still gets in line.
        let other = queue.join("192.0.2.2").unwrap();
        drop(a);
        let again = queue.join("192.0.2.1").unwrap();
        drop((b, other, again));
        assert_eq!(queue.places.lock().unwrap().total, 0);
        assert!(queue.places.lock().unwrap().by_address.is_empty());
    }

    #[tokio::test]
    async fn turns_come_in_order_and_a_long_wait_is_refused() {
        let queue = PasswordQueue::new(1);
        let first = queue.turn(queue.join("a").unwrap()).await.unwrap();
        let waiting = {
            let queue = queue.clone();
            tokio::spawn(async move { queue.turn(queue.join("b").unwrap()).await.is_ok() })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(first);
        assert!(waiting.await.unwrap(), "the next in line gets the slot");

        let _held = queue.turn(queue.join("a").unwrap()).await.unwrap();
        let late = queue.turn_within(queue.join("c").unwrap(), Duration::from_millis(100));
        assert_eq!(late.await.err(), Some(NoTurn::Busy));
    }

    #[tokio::test]
    async fn the_line_is_bounded() {
        let queue = PasswordQueue::new(1);
        let places: Vec<_> = (0..MAX_WAITING)
            .map(|i| queue.join(&format!("10.0.0.{i}")).unwrap())
            .collect();
        assert_eq!(queue.join("10.0.1.1").err(), Some(NoTurn::Busy));
        drop(places);
        assert!(queue.join("10.0.1.1").is_ok());
    }
}
