//! `sync`: how the journal thread tells the requests waiting for their batch's sync that
//! it is on disk.
//!
//! The requests wait on a `watch` of the durable count. Sent from the journal thread, that
//! `watch` wakes every waiter from outside the runtime: each wake-up goes through the
//! runtime's shared (injection) queue and may unpark a worker (an `eventfd` write or a
//! futex wake, then that worker's context switch), several times per batch as the workers
//! park again between wake-ups (docs/PERFORMANCE.md, "Sync joins: one wake-up per
//! batch"). So the journal thread wakes one task instead, the relay, which runs on the
//! runtime and sends the `watch` there: its wake-ups are pushes onto that worker's own run
//! queue, with at most one unpark of the other worker to share them. The journal thread
//! is also back to its next batch sooner.
//!
//! Nothing is answered earlier than before: the count the relay sends is the one the
//! journal thread published after the sync ([`Relay::publish`]). Without a runtime (a
//! journal opened outside one), or once the relay's runtime is gone, the journal thread
//! sends the `watch` itself, as it always did.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use tokio::sync::{watch, Notify};

pub(super) struct Relay {
    durable: watch::Sender<u64>,
    /// The durable count, for [`super::journal::Journal::wait`]'s fast path and the relay.
    upto: Arc<AtomicU64>,
    /// Told by the journal thread after each synced batch.
    ready: Notify,
    /// The relay task is running: the journal thread leaves the `watch` to it.
    alive: AtomicBool,
    /// The journal is gone: the relay ends.
    closed: AtomicBool,
}

/// Held by the relay task: when the task ends (closed, or its runtime shut down), the
/// journal thread sends the `watch` itself again.
struct Running(Arc<Relay>);

impl Drop for Running {
    fn drop(&mut self) {
        // SeqCst with `publish`: either the journal thread sees `alive` false and sends,
        // or this load sees its count and sends it here; no batch is left untold.
        self.0.alive.store(false, SeqCst);
        self.0.send(self.0.upto.load(SeqCst));
    }
}

impl Relay {
    pub(super) fn new(durable: watch::Sender<u64>, upto: Arc<AtomicU64>) -> Arc<Self> {
        Arc::new(Relay {
            durable,
            upto,
            ready: Notify::new(),
            alive: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        })
    }

    /// Starts the relay task on the caller's runtime, if it runs in one (the server opens
    /// its store inside its runtime); otherwise the journal thread keeps sending.
    pub(super) fn start(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.alive.store(true, SeqCst);
        let running = Running(self.clone());
        runtime.spawn(async move {
            let relay = &running.0;
            loop {
                relay.ready.notified().await;
                if relay.closed.load(SeqCst) {
                    break;
                }
                relay.send(relay.upto.load(SeqCst));
            }
            drop(running);
        });
    }

    /// Raises the `watch` to `upto` (never lowers it: the relay and the journal thread may
    /// both send around the relay's end).
    fn send(&self, upto: u64) {
        self.durable.send_if_modified(|d| {
            let raise = *d < upto;
            if raise {
                *d = upto;
            }
            raise
        });
    }

    /// The journal thread, after a sync: the first `upto` changes are durable.
    pub(super) fn publish(&self, upto: u64) {
        // Before the wake-up: a waiter woken finds the count at least as high here.
        self.upto.store(upto, SeqCst);
        if self.alive.load(SeqCst) {
            // One wake-up of one task; a permit if it is busy, so nothing is missed.
            self.ready.notify_one();
        } else {
            self.send(upto);
        }
    }

    /// Wakes every waiter now, from whichever thread (the writer failed: they look at the
    /// failure flag).
    pub(super) fn wake_all(&self) {
        self.durable.send_modify(|_| {});
    }

    /// The journal is dropped: the relay task ends (and with it the last sender, so a
    /// waiter left sees the writer gone).
    pub(super) fn close(&self) {
        self.closed.store(true, SeqCst);
        self.ready.notify_one();
    }

    #[cfg(test)]
    fn alive(&self) -> bool {
        self.alive.load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn relay() -> (Arc<Relay>, watch::Receiver<u64>) {
        let (tx, rx) = watch::channel(0);
        (Relay::new(tx, Arc::new(AtomicU64::new(0))), rx)
    }

    /// Many requests on a runtime of two workers wait for their tickets while a plain
    /// thread publishes synced counts: each is woken, through the relay, and never before
    /// its ticket was published.
    #[test]
    fn waiters_are_woken_through_the_relay_and_never_early() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let (relay, rx) = relay();
        rt.block_on(async { relay.start() });
        assert!(relay.alive());
        let total = 20_000u64;
        let waiters: Vec<_> = (1..=200u64)
            .map(|w| {
                let (mut rx, relay) = (rx.clone(), relay.clone());
                rt.spawn(async move {
                    let ticket = w * total / 200;
                    rx.wait_for(|d| *d >= ticket).await.unwrap();
                    // What woke us was published after the sync, never before.
                    assert!(relay.upto.load(SeqCst) >= ticket, "answered early");
                })
            })
            .collect();
        let journal = {
            let relay = relay.clone();
            std::thread::spawn(move || {
                for upto in (1..=total).step_by(7).chain([total]) {
                    relay.publish(upto);
                }
            })
        };
        journal.join().unwrap();
        rt.block_on(async {
            for w in waiters {
                tokio::time::timeout(Duration::from_secs(30), w)
                    .await
                    .expect("a waiter was never woken")
                    .unwrap();
            }
        });
        assert!(relay.alive(), "the relay carried the wake-ups");
    }

    /// Once the relay's runtime is gone, the journal thread's counts still reach waiters
    /// (it sends them itself), and what was published just before the end is not lost.
    #[test]
    fn without_its_runtime_the_journal_thread_sends_itself() {
        let (relay, mut rx) = relay();
        {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(async { relay.start() });
            // Published while the relay cannot run (its runtime is not driven now).
            relay.publish(5);
        }
        assert!(!relay.alive(), "the relay ended with its runtime");
        assert_eq!(
            *rx.borrow_and_update(),
            5,
            "the relay's end sent the last count"
        );
        relay.publish(9);
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), 9);
    }

    /// Outside a runtime there is no relay: publishing sends at once.
    #[test]
    fn outside_a_runtime_publishing_sends_at_once() {
        let (relay, rx) = relay();
        relay.start();
        assert!(!relay.alive());
        relay.publish(3);
        assert_eq!(*rx.borrow(), 3);
    }

    /// Closing ends the relay and drops its sender, so waiters see the writer gone once
    /// the journal's own handle is dropped too.
    #[test]
    fn closing_ends_the_relay() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let (relay, mut rx) = relay();
        rt.block_on(async { relay.start() });
        relay.close();
        drop(relay);
        let gone = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|d| *d > 0)).await
        });
        assert!(gone.expect("the relay kept its sender").is_err());
    }
}
