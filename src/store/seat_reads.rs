//! Seat-map reads shared between the requests of one node that ask for the same event's at
//! once. A seat map is the event's whole inventory (up to 100,000 items): on Redis one
//! script that holds every event for tens of milliseconds, on the embedded store a copy
//! made under the event's lock. Two dozen shoppers opening the map at the same moment made
//! two dozen such reads back to back, and the other events' operations waited behind them
//! past their bound (`503`).
//!
//! A request shares only a read that **started after it arrived**, so its answer is as
//! fresh as one of its own would be (no hold made before it asked is missing, no session
//! that ended before it asked shows a hold): the requests that arrive while a read is under
//! way wait for it to end, and then one of them reads for all of them. Two reads serve any
//! burst, however large. A failed read is shared the same way: a store that is down fails
//! the waiting requests together, not one after another, each its own wait.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use super::StoreResult;
use crate::core::InventoryView;

/// Per event: how many reads started, how many requests wait for one, and the last read's
/// answer while any of them may take it.
#[derive(Default)]
struct EventReads {
    started: AtomicU64,
    waiting: AtomicUsize,
    /// Held by the reading request while it reads: the others queue on it (in order).
    last: tokio::sync::Mutex<Option<(u64, Answer)>>,
}

/// A read's answer, as its sharers take it: a failure too, so that a store that is down
/// fails the waiting requests together rather than one after another, each its own wait.
type Answer = StoreResult<Arc<InventoryView>>;

/// Counts a request among an event's waiting ones until dropped: a request dropped while it
/// waits (its deadline passed, its client gone) is no longer counted, and when it was the
/// last one, the answer kept for it goes (unless a reader holds the lock: that one looks
/// at the count as it ends).
struct Waiting<'a>(&'a EventReads);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.0.waiting.fetch_sub(1, SeqCst) == 1 {
            if let Ok(mut last) = self.0.last.try_lock() {
                *last = None;
            }
        }
    }
}

/// An event's entry in use by one call; when dropped (the call ended, or was dropped
/// itself), the table keeps the entry only if another call holds it too. Counted and
/// dropped under the table's lock, so that of two calls ending together one removes it.
struct InUse<'a> {
    table: &'a SeatReads,
    event_id: &'a str,
    reads: Option<Arc<EventReads>>,
}

impl Drop for InUse<'_> {
    fn drop(&mut self) {
        let mut events = self.table.events.lock();
        if let Some(reads) = self.reads.take() {
            if Arc::strong_count(&reads) == 2 {
                events.remove(self.event_id);
            }
        }
    }
}

/// The node's shared seat-map reads, by event.
#[derive(Default)]
pub struct SeatReads {
    events: parking_lot::Mutex<HashMap<Arc<str>, Arc<EventReads>>>,
}

impl SeatReads {
    /// The event's inventory, from a read that started after this call: this caller's own
    /// (`read`), or one another caller made meanwhile.
    pub async fn inventory<F, Fut>(&self, event_id: &str, read: F) -> Answer
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = StoreResult<InventoryView>>,
    {
        let reads = self
            .events
            .lock()
            .entry(event_id.into())
            .or_default()
            .clone();
        // The table keeps no event nobody reads (a deleted one, say), whether this call
        // ends or is dropped.
        let in_use = InUse {
            table: self,
            event_id,
            reads: Some(reads.clone()),
        };
        drop(reads);
        let reads = in_use.reads.as_deref().expect("set above");
        Self::read_of(reads, read).await
    }

    async fn read_of<F, Fut>(reads: &EventReads, read: F) -> Answer
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = StoreResult<InventoryView>>,
    {
        let arrived = reads.started.load(SeqCst);
        reads.waiting.fetch_add(1, SeqCst);
        let waiting = Waiting(reads);
        let mut last = reads.last.lock().await;
        drop(waiting);
        // A read numbered past `arrived` started after this call did.
        let shared = last
            .as_ref()
            .filter(|(n, _)| *n > arrived)
            .map(|(_, a)| a.clone());
        let answer = match shared {
            Some(a) => a,
            None => {
                let n = reads.started.fetch_add(1, SeqCst) + 1;
                let a = read().await.map(Arc::new);
                *last = Some((n, a.clone()));
                a
            }
        };
        // Kept only while someone waits who may take it, not for as long as the event.
        if reads.waiting.load(SeqCst) == 0 {
            *last = None;
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A burst of callers shares two reads; each read started after every caller it
    /// serves arrived.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_shares_reads_that_started_after_it_arrived() {
        let shared = Arc::new(SeatReads::default());
        let reads = Arc::new(AtomicUsize::new(0));
        let read = |reads: Arc<AtomicUsize>| async move {
            let n = reads.fetch_add(1, SeqCst) + 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut v = InventoryView::default();
            v.counts.total = n as u64;
            Ok(v)
        };
        // The first read is under way when the burst arrives.
        let first = {
            let (s, r) = (shared.clone(), reads.clone());
            tokio::spawn(async move { s.inventory("ev", || read(r)).await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let burst: Vec<_> = (0..24)
            .map(|_| {
                let (s, r) = (shared.clone(), reads.clone());
                tokio::spawn(async move { s.inventory("ev", || read(r)).await.unwrap() })
            })
            .collect();
        assert_eq!(first.await.unwrap().counts.total, 1);
        for b in burst {
            // Never the read that was under way when it arrived.
            assert_eq!(b.await.unwrap().counts.total, 2);
        }
        assert_eq!(reads.load(SeqCst), 2);
        // Nothing is kept once answered: a later caller reads afresh.
        let later = shared
            .inventory("ev", || read(reads.clone()))
            .await
            .unwrap();
        assert_eq!(later.counts.total, 3);
        assert!(shared.events.lock().is_empty());
    }

    /// A failed read fails the requests that waited for it together (each retrying in turn
    /// made the k-th wait k reads' time), and is nobody's answer after them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_read_fails_its_waiters_together_and_no_later_one() {
        let shared = Arc::new(SeatReads::default());
        let reads = Arc::new(AtomicUsize::new(0));
        let failing = |reads: Arc<AtomicUsize>| async move {
            reads.fetch_add(1, SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            Err(crate::store::StoreError::Unavailable("down".into()))
        };
        let first = {
            let (s, r) = (shared.clone(), reads.clone());
            tokio::spawn(async move { s.inventory("ev", || failing(r)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let burst: Vec<_> = (0..8)
            .map(|_| {
                let (s, r) = (shared.clone(), reads.clone());
                tokio::spawn(async move { s.inventory("ev", || failing(r)).await })
            })
            .collect();
        assert!(first.await.unwrap().is_err());
        for b in burst {
            assert!(b.await.unwrap().is_err());
        }
        assert_eq!(reads.load(SeqCst), 2);
        let ok = shared
            .inventory("ev", || async { Ok(InventoryView::default()) })
            .await;
        assert!(ok.is_ok());
        assert!(shared.events.lock().is_empty());
    }

    /// A request dropped while it waits (its deadline passed) is not counted as waiting:
    /// the answer is not kept for it.
    #[tokio::test]
    async fn a_dropped_waiter_keeps_nothing_alive() {
        let shared = Arc::new(SeatReads::default());
        let slow = {
            let s = shared.clone();
            tokio::spawn(async move {
                s.inventory("ev", || async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok(InventoryView::default())
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let dropped = tokio::time::timeout(
            Duration::from_millis(10),
            shared.inventory("ev", || async { Ok(InventoryView::default()) }),
        )
        .await;
        assert!(dropped.is_err(), "it timed out waiting");
        assert!(slow.await.unwrap().is_ok());
        assert!(shared.events.lock().is_empty(), "nothing kept");
    }
}
