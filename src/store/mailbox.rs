//! Answers handed to a waiter's own thread, many for one wake-up.
//!
//! A batch's leader ([`super::group_commit`]) commits on a blocking thread
//! and then answers each request of the batch. An answer sent from there
//! to a task of an HTTP worker (a single-threaded runtime) wakes that
//! runtime from outside: a write to its event descriptor, and a thread
//! woken, for every request, though a batch's requests share two or three
//! workers. So each HTTP worker opens a [`Mailbox`] as it starts, a
//! request waiting on that worker's thread names it, and the leader posts
//! each mailbox its batch's answers at once: one wake-up a thread. A task
//! of the mailbox's own, on that runtime, hands them over, and waking a
//! task from its own runtime's thread costs no system call.
//!
//! A mailbox closes when its task is dropped (its runtime is shutting
//! down): what it still holds, and anything posted to it later, is handed
//! over at once, by the thread that has it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;

use futures_util::task::AtomicWaker;
use tokio::runtime::{Handle, RuntimeFlavor};

/// One answer to hand over: sends a value on its waiter's channel.
pub type Delivery = Box<dyn FnOnce() + Send>;

/// The answers waiting for one thread's runtime to take them.
#[derive(Default)]
pub struct Mailbox {
    waiting: Mutex<Vec<Delivery>>,
    task: AtomicWaker,
    closed: AtomicBool,
}

thread_local! {
    /// This thread's mailbox, if it opened one.
    static THIS_THREADS: RefCell<Option<Arc<Mailbox>>> = const { RefCell::new(None) };
}

impl Mailbox {
    /// Opens this thread's mailbox, its task spawned on the runtime this
    /// thread drives: called by each HTTP worker as it starts
    /// (`startup`), on the thread that runs it. A runtime of many threads
    /// gets none (answers reach its tasks without a wake-up each).
    pub fn open_on_this_thread() {
        let Ok(runtime) = Handle::try_current() else {
            return;
        };
        if runtime.runtime_flavor() != RuntimeFlavor::CurrentThread {
            return;
        }
        let mailbox = Arc::new(Mailbox::default());
        runtime.spawn(HandOver(mailbox.clone()));
        THIS_THREADS.with(|slot| *slot.borrow_mut() = Some(mailbox));
    }

    /// This thread's mailbox, if it opened one and its runtime still runs.
    pub fn of_this_thread() -> Option<Arc<Mailbox>> {
        THIS_THREADS.with(|slot| {
            slot.borrow()
                .as_ref()
                .filter(|mailbox| !mailbox.is_closed())
                .cloned()
        })
    }

    /// Posts `deliveries`, waking the mailbox's task once for all of them;
    /// hands them over here if the mailbox has closed.
    pub fn post(&self, deliveries: Vec<Delivery>) {
        {
            let mut waiting = self.lock();
            if !self.is_closed() {
                waiting.extend(deliveries);
                drop(waiting);
                self.task.wake();
                return;
            }
        }
        deliveries.into_iter().for_each(|delivery| delivery());
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Delivery>> {
        // A delivery runs outside the lock: a panic leaves the list whole.
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Closes the mailbox (under its lock, so that no post is left in it
    /// after) and hands over what it held.
    fn close(&self) {
        let left = {
            let mut waiting = self.lock();
            self.closed.store(true, Ordering::Release);
            std::mem::take(&mut *waiting)
        };
        left.into_iter().for_each(|delivery| delivery());
    }
}

/// The mailbox's task: hands over what was posted, each time it is woken,
/// for as long as its runtime runs. Dropped (with its runtime, polled or
/// not yet), it closes the mailbox.
struct HandOver(Arc<Mailbox>);

impl std::future::Future for HandOver {
    type Output = ();

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        // Registered before the list is read: a post after the read wakes
        // this task again.
        self.0.task.register(cx.waker());
        let ready = std::mem::take(&mut *self.0.lock());
        ready.into_iter().for_each(|delivery| delivery());
        Poll::Pending
    }
}

impl Drop for HandOver {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Where one waiter's answer goes: its channel, and the mailbox of the
/// thread it waits on (if that thread has one), taken together when the
/// waiter queues so that the two cannot part.
pub struct Reply<T> {
    sender: tokio::sync::oneshot::Sender<T>,
    mailbox: Option<Arc<Mailbox>>,
}

impl<T: Send + 'static> Reply<T> {
    /// A reply to a waiter on this thread, and the receiver it waits on.
    pub fn channel() -> (Self, tokio::sync::oneshot::Receiver<T>) {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let mailbox = Mailbox::of_this_thread();
        (Reply { sender, mailbox }, receiver)
    }

    /// Sends `value` at once, past the mailbox (a refusal before anything
    /// ran). The waiter may have gone away: the answer is then dropped.
    pub fn send_now(self, value: T) {
        let _ = self.sender.send(value);
    }
}

/// Answers gathered while a batch is answered: each one whose waiter named
/// a mailbox is posted there with the others for the same mailbox when
/// this is dropped; the rest are sent at once.
#[derive(Default)]
pub struct Replies(Vec<(Arc<Mailbox>, Vec<Delivery>)>);

impl Replies {
    /// Sends `value` on `reply`: through its mailbox, or at once.
    pub fn send<T: Send + 'static>(&mut self, reply: Reply<T>, value: T) {
        let Reply { sender, mailbox } = reply;
        let Some(mailbox) = mailbox else {
            // The waiter may have gone away: the answer is then dropped.
            let _ = sender.send(value);
            return;
        };
        let delivery: Delivery = Box::new(move || {
            let _ = sender.send(value);
        });
        match self.0.iter_mut().find(|(to, _)| Arc::ptr_eq(to, &mailbox)) {
            Some((_, deliveries)) => deliveries.push(delivery),
            None => self.0.push((mailbox, vec![delivery])),
        }
    }
}

impl Drop for Replies {
    fn drop(&mut self) {
        for (mailbox, deliveries) in self.0.drain(..) {
            mailbox.post(deliveries);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    fn current_thread_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn answers_sent_from_another_thread_arrive_through_one_mailbox() {
        let runtime = current_thread_runtime();
        runtime.block_on(async {
            Mailbox::open_on_this_thread();
            let mailbox = Mailbox::of_this_thread().expect("a single-threaded runtime has one");
            let again = Mailbox::of_this_thread().unwrap();
            assert!(Arc::ptr_eq(&mailbox, &again), "one mailbox a thread");
            let (senders, receivers): (Vec<_>, Vec<_>) =
                (0..5).map(|_| Reply::<usize>::channel()).unzip();
            // The leader's side: another thread, answers together.
            std::thread::spawn(move || {
                let mut replies = Replies::default();
                for (n, reply) in senders.into_iter().enumerate() {
                    assert!(Arc::ptr_eq(reply.mailbox.as_ref().unwrap(), &mailbox));
                    replies.send(reply, n);
                }
            })
            .join()
            .unwrap();
            for (n, receiver) in receivers.into_iter().enumerate() {
                assert_eq!(receiver.await.unwrap(), n);
            }
        });
    }

    #[test]
    fn a_mailbox_closes_with_its_runtime_and_the_next_runtime_opens_another() {
        let first = current_thread_runtime();
        let old = first.block_on(async {
            Mailbox::open_on_this_thread();
            Mailbox::of_this_thread().unwrap()
        });
        drop(first);
        assert!(old.is_closed(), "its task was dropped with the runtime");
        assert!(
            Mailbox::of_this_thread().is_none(),
            "a closed one is not named"
        );
        // Posted after it closed: handed over at once, not left in it.
        let (sender, answer) = oneshot::channel::<&str>();
        let reply = Reply {
            sender,
            mailbox: Some(old.clone()),
        };
        Replies::default().send(reply, "late");
        assert_eq!(answer.blocking_recv().unwrap(), "late");
        let second = current_thread_runtime();
        let new = second.block_on(async {
            Mailbox::open_on_this_thread();
            Mailbox::of_this_thread().unwrap()
        });
        assert!(!Arc::ptr_eq(&old, &new), "a closed mailbox is not reused");
        assert!(!new.is_closed());
    }

    #[test]
    fn a_runtime_of_many_threads_has_no_mailbox() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        assert!(runtime
            .block_on(async { Mailbox::of_this_thread() })
            .is_none());
        assert!(Mailbox::of_this_thread().is_none(), "no runtime here");
    }
}
