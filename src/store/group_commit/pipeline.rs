//! `sync`: the writer writes the next batch while the last ones sync.
//!
//! The writer thread used to write a batch, sync it, record the watermark and tell its
//! requests, and only then take what had queued meanwhile: a change queued just after a
//! sync began waited for the rest of that sync, then for its own batch's write, sync and
//! bookkeeping. Now the writer writes a batch, hands it to the OS, notes what a sync would
//! cover ([`Sink::capture`], as the `relaxed` thread does) and hands that to one of
//! [`SYNCERS`] syncing threads, then goes on writing. A change queued during a sync is
//! written at once and its sync starts beside the one in flight: this machine's disk serves
//! two `fdatasync`s of one file at once (`bench/fsync_floor.py DIR 2 one`: ~2.5× the syncs
//! of one thread), so the wait for the rest of the other sync goes.
//!
//! Why it stays exact:
//! - A sync is per file, not per handle or per write: an `fdatasync` makes durable every
//!   byte written to the file before it began. A capture is taken after its batch and
//!   every batch before it were handed to the OS, so when its sync ends every change up to
//!   it is durable, whichever syncs ended before; the durable count is the highest count
//!   of an ended sync ([`Synced::advance`] keeps the maximum), so a sync that ends late
//!   never lowers it.
//! - The watermark records a capture only if no newer one was recorded
//!   (`journal_sync.rs`), so what it names never goes back.
//! - fjall syncs a journal (`SyncAll`) before it starts the next one: a sync still holding
//!   the older journal's handle covers what its capture saw there, and a later capture lists
//!   the journals again (`journal_sync.rs`).
//! - A failed sync stops the store as a failed write does: nothing more is written or
//!   answered, and every waiter is told.
//!
//! While both syncs are in flight and a capture waits for one of them, the writer does not
//! write: changes queue meanwhile and go as one larger batch, so a slow disk makes batches
//! grow rather than captures pile up.

use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

#[cfg(doc)]
use super::Synced;
use super::{GroupCommit, Sink};
use std::sync::atomic::Ordering::SeqCst;

/// Syncs in flight at once.
const SYNCERS: usize = 2;

/// The capture waiting for a syncing thread.
struct Handoff<C> {
    /// The capture, and the changes written when it was taken (all of which its sync makes
    /// durable).
    next: Option<(C, u64)>,
    /// The writer stopped: the syncing threads end once `next` is taken.
    closed: bool,
}

struct Shared<C> {
    handoff: Mutex<Handoff<C>>,
    /// A capture was handed over, or the writer stopped.
    handed: Condvar,
    /// A syncing thread took the capture.
    taken: Condvar,
}

/// The syncing threads of a `sync` store, started with the writer.
pub(super) struct Syncing<C> {
    shared: Arc<Shared<C>>,
    threads: Vec<JoinHandle<()>>,
}

impl<C: Send + 'static> Syncing<C> {
    pub(super) fn spawn<S: Sink<Capture = C>>(gc: &Arc<GroupCommit<S>>) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            handoff: Mutex::new(Handoff {
                next: None,
                closed: false,
            }),
            handed: Condvar::new(),
            taken: Condvar::new(),
        });
        let mut threads = Vec::with_capacity(SYNCERS);
        for _ in 0..SYNCERS {
            let (gc, mine) = (gc.clone(), shared.clone());
            let spawned = std::thread::Builder::new()
                .name("waitroom-sync".into())
                .spawn(move || {
                    let _span = tracing::info_span!("journal_sync").entered();
                    gc.run_syncer(&mine)
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    // Let the ones started end before answering.
                    let me = Syncing { shared, threads };
                    me.close();
                    return Err(e);
                }
            }
        }
        Ok(Syncing { shared, threads })
    }

    /// Waits until no capture waits for a syncing thread.
    fn wait_taken(&self) {
        let mut h = self.shared.handoff.lock();
        while h.next.is_some() {
            self.shared.taken.wait(&mut h);
        }
    }

    fn hand(&self, capture: C, upto: u64) {
        let mut h = self.shared.handoff.lock();
        debug_assert!(
            h.next.is_none(),
            "the writer waits until the last one is taken"
        );
        h.next = Some((capture, upto));
        drop(h);
        self.shared.handed.notify_one();
    }

    /// Lets the syncing threads sync what was handed to them, and waits for them to end.
    fn close(self) {
        self.shared.handoff.lock().closed = true;
        self.shared.handed.notify_all();
        for t in self.threads {
            let _ = t.join();
        }
    }
}

impl<S: Sink> GroupCommit<S> {
    /// The `sync` writer: writes what is queued, batch by batch, and hands each batch's
    /// sync to the syncing threads; at close, waits for them and syncs everything.
    pub(super) fn run_sync(&self, syncing: Syncing<S::Capture>) {
        loop {
            {
                let mut q = self.queue.lock();
                while q.changes.is_empty() && !q.closed && !self.stopped.load(SeqCst) {
                    q.sleeping = true;
                    self.wake.wait(&mut q);
                }
                if self.stopped.load(SeqCst) || q.changes.is_empty() {
                    break; // stopped, or closed and everything written
                }
            }
            // Both syncs in flight and one waiting: let the queue grow instead.
            syncing.wait_taken();
            // The only writer in `sync`: the flag is free.
            self.take_flag();
            let capture = {
                let mut sink = self.sink.lock();
                self.drain(&mut sink);
                if self.stopped.load(SeqCst) {
                    None
                } else {
                    // Holding the flag: nothing is written while the sink notes what the
                    // sync covers.
                    sink.capture().map_err(|e| self.stop(&mut sink, &e)).ok()
                }
            };
            let upto = self.handed.load(SeqCst);
            self.give_flag();
            match capture {
                Some(c) => syncing.hand(c, upto),
                None => break, // stopped
            }
        }
        syncing.close();
        self.final_sync();
    }

    /// A syncing thread: syncs each capture handed to it, then lets the requests whose
    /// changes it covered go on.
    fn run_syncer(&self, shared: &Shared<S::Capture>) {
        let mut woken = Vec::new();
        loop {
            let (capture, upto) = {
                let mut h = shared.handoff.lock();
                loop {
                    if let Some(next) = h.next.take() {
                        break next;
                    }
                    if h.closed {
                        return;
                    }
                    shared.handed.wait(&mut h);
                }
            };
            shared.taken.notify_one();
            if self.stopped.load(SeqCst) {
                continue; // what it covers will never be answered
            }
            match S::sync_captured(capture) {
                Ok(()) => self.synced.advance(upto, &mut woken),
                Err(e) => {
                    self.take_flag();
                    self.stop(&mut self.sink.lock(), &e);
                    self.give_flag();
                    // The writer may sleep waiting for changes: it ends now. (Under the
                    // queue's lock, so it cannot look at `stopped` and then miss this.)
                    let _q = self.queue.lock();
                    self.wake.notify_all();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Durability, GroupCommit, Refused, Sink};
    use parking_lot::{Condvar, Mutex};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// A disk whose syncs say what they covered: the changes written when their capture
    /// was taken. The first sync can be held open.
    #[derive(Default, Clone)]
    struct Disk {
        written: Arc<AtomicU64>,
        /// The most changes an ended sync covered.
        durable: Arc<AtomicU64>,
        captures: Arc<AtomicU64>,
        in_flight: Arc<AtomicU64>,
        most_in_flight: Arc<AtomicU64>,
        /// While set, the first capture's sync waits.
        hold_first: Arc<(Mutex<bool>, Condvar)>,
        failing: Arc<AtomicBool>,
    }

    struct Cap {
        upto: u64,
        seq: u64,
        disk: Disk,
    }

    impl Sink for Disk {
        type Change = u64;
        fn write(&mut self, group: Vec<u64>) -> Result<(), String> {
            self.written.fetch_add(group.len() as u64, SeqCst);
            Ok(())
        }
        fn buffer(&mut self) -> Result<(), String> {
            Ok(())
        }
        fn sync(&mut self, _all: bool) -> Result<(), String> {
            self.durable.fetch_max(self.written.load(SeqCst), SeqCst);
            Ok(())
        }
        fn done(&mut self, _n: u64) {}
        fn fail(&mut self, _error: &str) {}
        type Capture = Cap;
        fn capture(&mut self) -> Result<Cap, String> {
            Ok(Cap {
                upto: self.written.load(SeqCst),
                seq: self.captures.fetch_add(1, SeqCst) + 1,
                disk: self.clone(),
            })
        }
        fn sync_captured(c: Cap) -> Result<(), String> {
            let d = &c.disk;
            let now = d.in_flight.fetch_add(1, SeqCst) + 1;
            d.most_in_flight.fetch_max(now, SeqCst);
            if c.seq == 1 {
                let (held, cv) = &*d.hold_first;
                let mut held = held.lock();
                while *held {
                    cv.wait(&mut held);
                }
            } else if c.seq % 3 == 0 {
                // Some syncs slower than others, so they end out of order.
                std::thread::sleep(Duration::from_micros(200));
            }
            let failed = d.failing.load(SeqCst);
            if !failed {
                d.durable.fetch_max(c.upto, SeqCst);
            }
            d.in_flight.fetch_sub(1, SeqCst);
            if failed {
                Err("the disk is gone".into())
            } else {
                Ok(())
            }
        }
    }

    fn until(what: &str, ok: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ok() {
            assert!(Instant::now() < deadline, "timed out waiting: {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Many requests racing the writer and the two syncing threads: each is answered only
    /// once a sync that covers its change has ended (never on a sync that began before its
    /// change was written), and every one is answered.
    #[test]
    fn racing_requests_are_answered_only_after_a_sync_that_covers_them() {
        let rt = runtime();
        for _ in 0..5 {
            let disk = Disk::default();
            let (durable, most) = (disk.durable.clone(), disk.most_in_flight.clone());
            let gc = GroupCommit::new(disk, Durability::Sync, Duration::from_secs(3600));
            let writer = gc.spawn().unwrap();
            let tasks: Vec<_> = (0..16)
                .map(|t| {
                    let (gc, durable) = (gc.clone(), durable.clone());
                    rt.spawn(async move {
                        for i in 0..300 {
                            let ticket = gc.submit(t * 1000 + i).ok().unwrap();
                            gc.synced().wait(ticket).await;
                            assert!(!gc.synced().failed());
                            let covered = durable.load(SeqCst);
                            assert!(covered >= ticket, "{ticket} answered, {covered} synced");
                        }
                    })
                })
                .collect();
            rt.block_on(async {
                for t in tasks {
                    tokio::time::timeout(Duration::from_secs(30), t)
                        .await
                        .expect("a request was never answered")
                        .unwrap();
                }
            });
            gc.close();
            writer.join().unwrap();
            assert_eq!(gc.synced().upto(), 16 * 300);
            assert!(most.load(SeqCst) >= 1);
        }
    }

    /// While the first batch's sync hangs, the next batch is written and synced beside it,
    /// and its requests are answered (its sync covers the first batch too). The first sync
    /// ending late does not lower the count.
    #[test]
    fn a_batch_syncs_while_the_one_before_it_is_still_syncing() {
        let rt = runtime();
        let disk = Disk::default();
        *disk.hold_first.0.lock() = true;
        let d = disk.clone();
        let gc = GroupCommit::new(disk, Durability::Sync, Duration::from_secs(3600));
        let writer = gc.spawn().unwrap();
        let first = gc.submit(1).ok().unwrap();
        until("the first sync starts", || d.in_flight.load(SeqCst) == 1);
        let second = gc.submit(2).ok().unwrap();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), gc.synced().wait(second))
                .await
                .expect("the second change waited for the first sync")
        });
        assert_eq!((first, second), (1, 2));
        assert_eq!(d.durable.load(SeqCst), 2, "the second sync covered both");
        assert_eq!(d.in_flight.load(SeqCst), 1, "the first sync is still held");
        assert_eq!(gc.synced().upto(), 2);
        {
            let (held, cv) = &*d.hold_first;
            *held.lock() = false;
            cv.notify_all();
        }
        until("the first sync ends", || d.in_flight.load(SeqCst) == 0);
        assert_eq!(
            gc.synced().upto(),
            2,
            "a sync that ended late lowers nothing"
        );
        gc.close();
        writer.join().unwrap();
    }

    /// A failed sync stops the store: its waiters are told, later changes are refused.
    #[test]
    fn a_failed_sync_stops_the_store() {
        let rt = runtime();
        let disk = Disk::default();
        disk.failing.store(true, SeqCst);
        let gc = GroupCommit::new(disk, Durability::Sync, Duration::from_secs(3600));
        let writer = gc.spawn().unwrap();
        let ticket = gc.submit(1).ok().unwrap();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), gc.synced().wait(ticket))
                .await
                .expect("the waiter was not told")
        });
        assert!(gc.synced().failed());
        assert_eq!(gc.synced().upto(), 0, "nothing was synced");
        until("the writer stops", || writer.is_finished());
        assert!(matches!(gc.submit(2), Err(Refused::Stopped)));
        writer.join().unwrap();
    }
}
