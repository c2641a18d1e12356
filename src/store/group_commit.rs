//! How changes reach the journal: one queue in ticket order, and whoever holds the
//! writer's flag writes what has queued as one batch.
//!
//! - **`sync`**: a thread of its own writes and syncs (an fsync must not block a runtime
//!   worker), then tells the waiting requests. Requests queue their changes and wake the
//!   thread only when it sleeps; it takes everything queued at once (one lock, no
//!   per-change channel operation).
//! - **`relaxed`**: nobody waits for the disk, so a request writes the queue itself
//!   ("inline group commit"): after queueing its change it lets the other ready requests
//!   of the runtime run once (they queue theirs meanwhile), then, unless one of them has
//!   written its change already, tries to become the writer; the one that does writes
//!   everything queued and hands it to the OS. A request answers only once its own change
//!   is with the OS (so a crash of the process loses nothing acknowledged): one that did
//!   not get the flag waits for the holder's batch ([`GroupCommit::handed_over`]). No
//!   thread is woken per change (that wake-up and the writer's context switches cost more
//!   than the write, see docs/PERFORMANCE.md). The thread only syncs about every 100 ms:
//!   holding the flag it writes what is left and notes what the sync will cover
//!   ([`Sink::capture`]), then gives the flag back and syncs that while requests go on
//!   writing ([`Sink::sync_captured`], [`super::journal_sync`]).
//! - **The bound on what a machine crash loses** (`relaxed`): a change is answered only
//!   while the oldest change handed to the OS and not yet synced is younger than
//!   `max_unsynced` (`RELAXED_UNSYNCED_BOUND` of `journal.rs`, 500 ms); past that (a sync that hangs, a thread that
//!   does not get to sync) requests wait for a sync to end, as they did when the sync held
//!   the flag, and answer [`Handed::Late`] after their own bound. Their changes are still
//!   written. So a stalled disk stops the answers after the bound, and what a crash of the
//!   machine can take back was answered within `max_unsynced` of the oldest unsynced write.
//!
//! Nothing is left behind: the writer gives the flag back, then looks whether changes
//! were queued that it did not take, and if so tries again. A request whose attempt failed
//! had queued its change before trying; sequentially consistent operations on the ticket
//! counter and the flag make the writer see that change (see [`GroupCommit::write_queued`]).
//! Changes are taken from the queue only by the holder of the flag, in queue order, so
//! they reach the disk in ticket order.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tokio::sync::Notify;

use super::journal::Durability;

/// Where the batches go: the journal writer's state.
pub(super) trait Sink: Send + 'static {
    type Change: Send;
    /// Writes one group as one atomic batch.
    fn write(&mut self, group: Vec<Self::Change>) -> Result<(), String>;
    /// Hands what was written to the OS (`relaxed`: a crash of the process then loses
    /// nothing).
    fn buffer(&mut self) -> Result<(), String>;
    /// Syncs what was written to disk (`all`: metadata too, at close).
    fn sync(&mut self, all: bool) -> Result<(), String>;
    /// What a `relaxed` sync covers.
    type Capture: Send;
    /// `relaxed`, as the flag's holder with everything written handed to the OS: notes
    /// what a sync started now covers, for [`Sink::sync_captured`].
    fn capture(&mut self) -> Result<Self::Capture, String>;
    /// `relaxed`: syncs exactly what was captured and records it as durable. Called with
    /// neither the flag nor the sink held, so requests go on writing meanwhile.
    fn sync_captured(capture: Self::Capture) -> Result<(), String>;
    /// `n` more changes are written (and in `sync`, synced).
    fn done(&mut self, n: u64);
    /// Writing failed: nothing more will be written.
    fn fail(&mut self, error: &str);
}

/// Most changes in one batch; bounds a batch's memory and latency.
const MAX_GROUP: usize = 8192;

struct Queue<C> {
    changes: Vec<C>,
    closed: bool,
    /// The `sync` thread sleeps on `wake` until changes come.
    sleeping: bool,
}

pub(super) struct GroupCommit<S: Sink> {
    queue: Mutex<Queue<S::Change>>,
    wake: Condvar,
    /// Changes queued so far (the latest ticket).
    queued: AtomicU64,
    /// Changes taken from the queue by a writer.
    taken: AtomicU64,
    /// Changes written and handed to the OS (in `sync`, also synced), in ticket order.
    handed: AtomicU64,
    /// `relaxed`: changes that may be answered (handed to the OS while the oldest unsynced
    /// write was younger than `max_unsynced`, or synced since). Only ever raised.
    answerable: AtomicU64,
    /// `relaxed`: when the first batch handed to the OS since the last capture was
    /// written, in µs since `epoch` plus one (0: none). Written by the flag's holder only.
    unsynced_since: AtomicU64,
    /// `relaxed`: the same for the oldest write the sync in flight covers (0: no sync in
    /// flight). Set at the capture, under the flag; cleared by the thread when it ends.
    syncing_since: AtomicU64,
    /// `relaxed`: how old an unsynced write may get while changes are still answered.
    max_unsynced: Duration,
    epoch: Instant,
    /// `relaxed`: told after every batch handed to the OS, and when the sink fails.
    progress: Notify,
    /// Held by whoever writes: only its holder takes from the queue and uses the sink.
    writing: AtomicBool,
    /// Set when the sink failed: later changes are refused.
    stopped: AtomicBool,
    /// `relaxed`: something was written since the last sync.
    dirty: AtomicBool,
    /// The thread wants the flag (to sync): requests leave their changes to it rather than
    /// take the flag, so a stream of requests cannot starve the sync.
    sync_wanted: AtomicBool,
    sink: Mutex<S>,
    mode: Durability,
}

/// How [`GroupCommit::handed_over`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Handed {
    Yes,
    /// The sink failed: the change will never be written.
    Failed,
    /// Not written within the bound (the writer of the moment is slow).
    Late,
}

/// Why a change was refused.
pub(super) enum Refused {
    Closed,
    Stopped,
}

impl<S: Sink> GroupCommit<S> {
    /// `max_unsynced`: see the module's notes (`relaxed` only).
    pub(super) fn new(sink: S, mode: Durability, max_unsynced: Duration) -> Arc<Self> {
        Arc::new(GroupCommit {
            queue: Mutex::new(Queue {
                changes: Vec::new(),
                closed: false,
                sleeping: false,
            }),
            wake: Condvar::new(),
            queued: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            handed: AtomicU64::new(0),
            answerable: AtomicU64::new(0),
            unsynced_since: AtomicU64::new(0),
            syncing_since: AtomicU64::new(0),
            max_unsynced,
            epoch: Instant::now(),
            progress: Notify::new(),
            writing: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            sync_wanted: AtomicBool::new(false),
            sink: Mutex::new(sink),
            mode,
        })
    }

    /// Starts the thread that writes (`sync`) or syncs (`relaxed`).
    pub(super) fn spawn(self: &Arc<Self>) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("waitroom-journal".into())
            .spawn(move || {
                let _span = tracing::info_span!("journal_writer").entered();
                match me.mode {
                    Durability::Sync => me.run_sync(),
                    Durability::Relaxed => me.run_relaxed(),
                }
            })
    }

    /// Queues a change; answers its ticket. Tickets follow the queue's order.
    pub(super) fn submit(&self, change: S::Change) -> Result<u64, Refused> {
        let mut q = self.queue.lock();
        if q.closed {
            return Err(Refused::Closed);
        }
        if self.stopped.load(SeqCst) {
            return Err(Refused::Stopped);
        }
        q.changes.push(change);
        let ticket = self.queued.fetch_add(1, SeqCst) + 1;
        let wake = std::mem::take(&mut q.sleeping);
        drop(q);
        if wake {
            self.wake.notify_one();
        }
        Ok(ticket)
    }

    /// The ticket of the last queued change.
    pub(super) fn ticket(&self) -> u64 {
        self.queued.load(SeqCst)
    }

    /// `relaxed`: writes everything queued unless another writer holds the flag (it then
    /// writes ours too). Called by a request after it released its event's lock.
    pub(super) fn write_queued(&self) {
        // Why nothing is stranded: a request that fails to take the flag has already
        // counted its change in `queued` (SeqCst), and its failed `swap` comes before the
        // holder's `store(false)` in the single order of SeqCst operations, so the holder's
        // following load of `queued` sees the change and it goes round again. The same
        // holds for a request that steps aside because the thread wants the flag: the
        // thread clears `sync_wanted` after giving the flag back, then looks again.
        // After a failed write nothing is taken any more (`drain` stops at once), so the
        // queue's count would never catch up: stop, or the holder spins for good.
        while !self.stopped.load(SeqCst) && self.queued.load(SeqCst) > self.taken.load(SeqCst) {
            if self.sync_wanted.load(SeqCst) || self.writing.swap(true, SeqCst) {
                return;
            }
            {
                let mut sink = self.sink.lock();
                self.drain(&mut sink, false);
            }
            self.writing.store(false, SeqCst);
        }
    }

    /// `relaxed`: answers once the change of `ticket` is written and handed to the OS
    /// ([`Handed::Yes`]), so a crash of the process loses nothing that was answered, and
    /// the oldest unsynced write is younger than `max_unsynced` (or a sync has covered the
    /// change since); or the sink failed, or neither happened within `bound` (the writer
    /// of the moment is slow, or the disk does not sync). Cancel-safe: a change left
    /// behind is written by the next writer or the thread's pass within 100 ms.
    pub(super) async fn handed_over(&self, ticket: u64, bound: Duration) -> Handed {
        if self.answerable.load(SeqCst) >= ticket {
            return Handed::Yes;
        }
        // One scheduling round first: the other requests ready on the runtime queue their
        // changes meanwhile, and the first of them back writes them all as one batch (one
        // fjall batch and one `write(2)` for many joins, as the `sync` thread's batches).
        tokio::task::yield_now().await;
        // The bound counts from here, not from after this request's own write: a request
        // that became the writer and met a stalled disk is held inside `write` (it cannot
        // answer sooner), and once it is out, its answer is late, not a `Yes` after a sync
        // that came seconds after the bound.
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            if self.answerable.load(SeqCst) >= ticket {
                return Handed::Yes;
            }
            if self.stopped.load(SeqCst) {
                return Handed::Failed;
            }
            // Registered before trying, so the holder's batch after a failed try wakes us.
            let notified = self.progress.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Taking the flag fails only while another writes: it then writes our change
            // too (see `write_queued`), and tells `progress` after.
            self.write_queued();
            // Past the bound (this request was the writer, held in `write` by a stalled
            // disk): late, even if a sync covered the change meanwhile.
            if tokio::time::Instant::now() >= deadline {
                return Handed::Late;
            }
            if self.answerable.load(SeqCst) >= ticket {
                return Handed::Yes;
            }
            if self.stopped.load(SeqCst) {
                return Handed::Failed;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Handed::Late;
            }
        }
    }

    /// Changes written and handed to the OS so far.
    #[cfg(test)]
    fn handed(&self) -> u64 {
        self.handed.load(SeqCst)
    }

    /// Takes the flag, waiting for the current holder (a request's write: microseconds).
    /// Requests step aside meanwhile; call [`Self::give_flag`] after.
    fn take_flag(&self) {
        self.sync_wanted.store(true, SeqCst);
        while self.writing.swap(true, SeqCst) {
            std::thread::yield_now();
        }
    }

    fn give_flag(&self) {
        self.writing.store(false, SeqCst);
        self.sync_wanted.store(false, SeqCst);
    }

    /// `relaxed`: whether the oldest write not yet synced is older than `bound` at `now`.
    /// The thread syncs about every 100 ms, so only a sync that hangs gets there.
    pub(super) fn unsynced_longer_than(&self, bound: Duration, now: Instant) -> bool {
        let oldest = match self.syncing_since.load(SeqCst) {
            0 => self.unsynced_since.load(SeqCst),
            s => s,
        };
        oldest != 0 && self.micros(now).saturating_sub(oldest) > bound.as_micros() as u64
    }

    /// `at` in µs since `epoch`, plus one (0 stands for "none").
    fn micros(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_micros() as u64 + 1
    }

    /// Whether a write at `since` (from [`Self::micros`]; 0: none) is younger than
    /// `max_unsynced` at `now`.
    fn young(&self, since: u64, now: Instant) -> bool {
        since == 0 || self.micros(now).saturating_sub(since) <= self.max_unsynced.as_micros() as u64
    }

    /// `relaxed`, after the thread's sync of a capture ended: what it covered is on disk,
    /// so every change handed over may be answered unless a write since the capture is
    /// itself older than the bound (the next pass syncs it; answers whether it is behind).
    fn sync_ended(&self) -> bool {
        self.syncing_since.store(0, SeqCst);
        // `handed` before `unsynced_since`: a change counted in it that the sync did not
        // cover set `unsynced_since` before it was counted (`drain`).
        let handed = self.handed.load(SeqCst);
        let behind = !self.young(self.unsynced_since.load(SeqCst), Instant::now());
        if !behind {
            self.answerable.fetch_max(handed, SeqCst);
        }
        self.progress.notify_waiters();
        behind
    }

    /// As the flag's holder: writes what is queued, batch by batch, in order. `synced`:
    /// each batch is synced before it counts as done (`sync` mode); otherwise it is handed
    /// to the OS.
    fn drain(&self, sink: &mut S, synced: bool) {
        loop {
            if self.stopped.load(SeqCst) {
                return;
            }
            let group: Vec<S::Change> = {
                let mut q = self.queue.lock();
                if q.changes.len() <= MAX_GROUP {
                    std::mem::take(&mut q.changes)
                } else {
                    q.changes.drain(..MAX_GROUP).collect()
                }
            };
            if group.is_empty() {
                return;
            }
            let n = group.len() as u64;
            self.taken.fetch_add(n, SeqCst);
            let started = Instant::now();
            let written = sink.write(group).and_then(|()| {
                if synced {
                    sink.sync(false)
                } else {
                    sink.buffer()
                }
            });
            let ended = Instant::now();
            note_slow_write(ended - started, n, synced);
            if let Err(e) = written {
                self.stop(sink, &e);
                return;
            }
            if !synced {
                self.dirty.store(true, SeqCst);
                // Before `handed`: the thread's look after a sync relies on it.
                if self.unsynced_since.load(SeqCst) == 0 {
                    self.unsynced_since.store(self.micros(started), SeqCst);
                }
            }
            let handed = self.handed.fetch_add(n, SeqCst) + n;
            sink.done(n);
            if !synced {
                // `syncing_since` first: a sync that ends meanwhile clears it after our
                // `handed`, and then answers these changes itself (`sync_ended`).
                let oldest = match self.syncing_since.load(SeqCst) {
                    0 => self.unsynced_since.load(SeqCst),
                    s => s,
                };
                if self.young(oldest, ended) {
                    self.answerable.fetch_max(handed, SeqCst);
                }
                self.progress.notify_waiters();
            }
        }
    }

    fn run_sync(&self) {
        loop {
            {
                let mut q = self.queue.lock();
                while q.changes.is_empty() && !q.closed {
                    q.sleeping = true;
                    self.wake.wait(&mut q);
                }
                if q.changes.is_empty() {
                    break; // closed, and everything written
                }
            }
            // The only writer in `sync`: the flag is free.
            self.take_flag();
            self.drain(&mut self.sink.lock(), true);
            self.give_flag();
            if self.stopped.load(SeqCst) {
                return;
            }
        }
        self.final_sync();
    }

    fn run_relaxed(&self) {
        const EVERY: Duration = Duration::from_millis(100);
        // Answers wait for the next sync: do not sleep before it.
        let mut behind = false;
        loop {
            let closed = {
                let mut q = self.queue.lock();
                if !q.closed && !behind {
                    self.wake.wait_for(&mut q, EVERY);
                }
                q.closed
            };
            behind = false;
            self.take_flag();
            let capture = {
                let mut sink = self.sink.lock();
                // Anything a request left (one whose answer was cancelled before it
                // wrote, or a change queued with no request waiting on it, an event's
                // creation).
                self.drain(&mut sink, false);
                // Holding the flag: nothing is written while the sink notes what the sync
                // covers, so the watermark will name synced bytes only.
                if !self.stopped.load(SeqCst) && self.dirty.swap(false, SeqCst) {
                    // What the sync will cover, and since when it is unsynced; later
                    // writes start `unsynced_since` again.
                    self.syncing_since
                        .store(self.unsynced_since.swap(0, SeqCst), SeqCst);
                    sink.capture().map_err(|e| self.stop(&mut sink, &e)).ok()
                } else {
                    None
                }
            };
            self.give_flag();
            if self.stopped.load(SeqCst) {
                return;
            }
            // What requests queued while we held the flag, they left to us.
            self.write_queued();
            // Requests write meanwhile; what they write is `dirty` for the next pass.
            if let Some(c) = capture {
                if let Err(e) = S::sync_captured(c) {
                    self.take_flag();
                    self.stop(&mut self.sink.lock(), &e);
                    self.give_flag();
                    return;
                }
                behind = self.sync_ended();
            }
            if closed {
                break;
            }
        }
        self.final_sync();
    }

    /// The sink failed: nothing more is written; waiters are told. Holding the flag.
    fn stop(&self, sink: &mut S, error: &str) {
        // The sink first: a change refused as `Stopped` must find the failure recorded
        // (`/healthz` answers 503 from it), and one queued meanwhile is never written, as
        // nothing is taken after a failed write; its waiter sees the failure too.
        sink.fail(error);
        self.stopped.store(true, SeqCst);
        self.progress.notify_waiters();
    }

    /// At close: writes what is left and syncs everything.
    fn final_sync(&self) {
        self.take_flag();
        let mut sink = self.sink.lock();
        self.drain(&mut sink, false);
        if !self.stopped.load(SeqCst) {
            match sink.sync(true) {
                Err(e) => self.stop(&mut sink, &e),
                // Everything written is on disk.
                Ok(()) => {
                    self.answerable.fetch_max(self.handed.load(SeqCst), SeqCst);
                    self.progress.notify_waiters();
                }
            }
        }
        self.give_flag();
    }

    /// Refuses further changes and wakes the thread, which writes and syncs what is
    /// queued and ends.
    pub(super) fn close(&self) {
        self.queue.lock().closed = true;
        self.wake.notify_all();
    }
}

/// Logs a batch whose write took long: every request of the batch, and in `relaxed` every
/// request behind the writer, waited for it. Lined up with the store's own log lines
/// (`RUST_LOG=info,waitroom::store=debug,fjall=debug,lsm_tree=debug`), it names the stall.
fn note_slow_write(took: Duration, changes: u64, synced: bool) {
    if took >= Duration::from_millis(50) {
        tracing::warn!(
            ms = took.as_millis() as u64,
            changes,
            synced,
            "a journal write took long"
        );
    } else if took >= Duration::from_millis(2) {
        tracing::debug!(
            us = took.as_micros() as u64,
            changes,
            synced,
            "slow journal write"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bound on unsynced writes that tests about ordering never reach.
    const UNBOUNDED: Duration = Duration::from_secs(3600);

    /// Records what is written, and checks batches are never written concurrently.
    #[derive(Default)]
    struct Recorder {
        written: Arc<Mutex<Vec<(usize, u64)>>>,
        done: Arc<AtomicU64>,
        synced: Arc<AtomicU64>,
        /// Held by a test to keep a writer inside `write`.
        hold: Arc<Mutex<()>>,
        /// Set by a test: writes fail from then on.
        failing: Arc<AtomicBool>,
        /// Held by a test to keep the thread inside a captured sync.
        sync_hold: Arc<Mutex<()>>,
        /// Set while the thread is inside a captured sync.
        syncing: Arc<AtomicBool>,
        /// Changes a captured sync covered, for each one that ended.
        covered: Arc<Mutex<Vec<usize>>>,
    }

    /// What a captured sync covers: the changes written by then.
    struct Captured {
        upto: usize,
        hold: Arc<Mutex<()>>,
        syncing: Arc<AtomicBool>,
        covered: Arc<Mutex<Vec<usize>>>,
    }

    impl Sink for Recorder {
        type Change = (usize, u64);
        fn write(&mut self, group: Vec<(usize, u64)>) -> Result<(), String> {
            drop(self.hold.lock());
            if self.failing.load(SeqCst) {
                return Err("the disk is gone".into());
            }
            let mut w = self.written.try_lock().expect("one writer at a time");
            w.extend(group);
            Ok(())
        }
        fn buffer(&mut self) -> Result<(), String> {
            Ok(())
        }
        fn sync(&mut self, _all: bool) -> Result<(), String> {
            self.synced.fetch_add(1, SeqCst);
            Ok(())
        }
        fn done(&mut self, n: u64) {
            self.done.fetch_add(n, SeqCst);
        }
        fn fail(&mut self, _error: &str) {}
        type Capture = Captured;
        fn capture(&mut self) -> Result<Captured, String> {
            Ok(Captured {
                upto: self.written.try_lock().expect("one writer at a time").len(),
                hold: self.sync_hold.clone(),
                syncing: self.syncing.clone(),
                covered: self.covered.clone(),
            })
        }
        fn sync_captured(c: Captured) -> Result<(), String> {
            c.syncing.store(true, SeqCst);
            drop(c.hold.lock());
            c.covered.lock().push(c.upto);
            c.syncing.store(false, SeqCst);
            Ok(())
        }
    }

    /// Submits from `threads` threads at once (each calling `write_queued` after each
    /// submission when `inline`), and answers each change's ticket.
    fn storm(
        gc: &Arc<GroupCommit<Recorder>>,
        threads: usize,
        each: u64,
        inline: bool,
    ) -> Vec<Vec<u64>> {
        let start = Arc::new(std::sync::Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let gc = gc.clone();
                let start = start.clone();
                std::thread::spawn(move || {
                    start.wait();
                    (0..each)
                        .map(|i| {
                            let ticket = gc.submit((t, i)).ok().unwrap();
                            if inline {
                                gc.write_queued();
                            }
                            ticket
                        })
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// Every change written once, in ticket order.
    fn check_order(written: &[(usize, u64)], tickets: &[Vec<u64>]) {
        let total: usize = tickets.iter().map(Vec::len).sum();
        assert_eq!(written.len(), total, "every change is written exactly once");
        for (pos, &(t, i)) in written.iter().enumerate() {
            assert_eq!(
                tickets[t][i as usize],
                pos as u64 + 1,
                "written in ticket order"
            );
        }
    }

    #[test]
    fn racing_inline_writers_leave_nothing_behind() {
        for _ in 0..20 {
            let sink = Recorder::default();
            let written = sink.written.clone();
            let done = sink.done.clone();
            // No thread: the requests' own writes must cover every change.
            let gc = GroupCommit::new(sink, Durability::Relaxed, UNBOUNDED);
            let tickets = storm(&gc, 4, 2000, true);
            assert_eq!(done.load(SeqCst), 8000);
            check_order(&written.lock(), &tickets);
        }
    }

    /// `relaxed`: a request whose change another writer is writing answers only once that
    /// writer has handed it to the OS, not when its own try for the flag fails.
    #[test]
    fn a_relaxed_answer_waits_until_its_change_is_handed_over() {
        let sink = Recorder::default();
        let (written, hold) = (sink.written.clone(), sink.hold.clone());
        let gc = GroupCommit::new(sink, Durability::Relaxed, UNBOUNDED);
        let held = hold.lock();
        let first = {
            let gc = gc.clone();
            std::thread::spawn(move || {
                gc.submit((0, 0)).ok().unwrap();
                gc.write_queued(); // takes the flag, then waits in `write` on `hold`
            })
        };
        while !gc.writing.load(SeqCst) {
            std::thread::yield_now();
        }
        let ticket = gc.submit((1, 0)).ok().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let bound = Duration::from_secs(30);
        let early = rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(100), gc.handed_over(ticket, bound)).await
        });
        assert!(early.is_err(), "answered while its change was not written");
        assert!(written.lock().is_empty());
        drop(held);
        assert_eq!(rt.block_on(gc.handed_over(ticket, bound)), Handed::Yes);
        assert_eq!(*written.lock(), vec![(0, 0), (1, 0)]);
        first.join().unwrap();
    }

    /// `relaxed`: a write that fails while a change waits behind it ends the writer's
    /// loop (the failed sink takes nothing more, so the queue never empties).
    #[test]
    fn a_failed_write_ends_the_writers_loop() {
        let sink = Recorder::default();
        let (hold, failing) = (sink.hold.clone(), sink.failing.clone());
        let gc = GroupCommit::new(sink, Durability::Relaxed, UNBOUNDED);
        let held = hold.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = {
            let gc = gc.clone();
            let tx = tx.clone();
            std::thread::spawn(move || {
                gc.submit((0, 0)).ok().unwrap();
                gc.write_queued(); // takes the flag, then waits in `write` on `hold`
                tx.send("first").unwrap();
            })
        };
        while !gc.writing.load(SeqCst) {
            std::thread::yield_now();
        }
        gc.submit((1, 0)).ok().unwrap();
        failing.store(true, SeqCst);
        drop(held);
        let bound = Duration::from_secs(5);
        assert_eq!(rx.recv_timeout(bound), Ok("first"), "the writer spins");
        writer.join().unwrap();
        let late = {
            let gc = gc.clone();
            std::thread::spawn(move || {
                gc.write_queued();
                tx.send("late").unwrap();
            })
        };
        assert_eq!(rx.recv_timeout(bound), Ok("late"), "a later writer spins");
        late.join().unwrap();
    }

    /// Many requests on a runtime of two workers: each answers only after its change is
    /// handed over, every change is written once, in ticket order, and batches form.
    #[test]
    fn racing_relaxed_answers_follow_their_changes() {
        let sink = Recorder::default();
        let (written, done) = (sink.written.clone(), sink.done.clone());
        let gc = GroupCommit::new(sink, Durability::Relaxed, UNBOUNDED);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let (tasks, each) = (64usize, 200u64);
        let tickets: Vec<Vec<u64>> = rt.block_on(async {
            let handles: Vec<_> = (0..tasks)
                .map(|t| {
                    let gc = gc.clone();
                    tokio::spawn(async move {
                        let mut mine = Vec::new();
                        for i in 0..each {
                            let ticket = gc.submit((t, i)).ok().unwrap();
                            let answer = gc.handed_over(ticket, Duration::from_secs(30)).await;
                            assert_eq!(answer, Handed::Yes);
                            assert!(gc.handed() >= ticket, "answered before handed over");
                            mine.push(ticket);
                        }
                        mine
                    })
                })
                .collect();
            let mut all = Vec::new();
            for h in handles {
                all.push(h.await.unwrap());
            }
            all
        });
        assert_eq!(done.load(SeqCst), tasks as u64 * each);
        check_order(&written.lock(), &tickets);
    }

    /// `relaxed`: while the thread's sync is under way, requests still write and are
    /// answered (the sync holds neither the flag nor the sink); that sync covers only what
    /// was written when it was captured, and the next pass covers the rest.
    #[test]
    fn relaxed_writers_go_on_during_the_threads_sync() {
        let sink = Recorder::default();
        let (written, sync_hold, syncing, covered) = (
            sink.written.clone(),
            sink.sync_hold.clone(),
            sink.syncing.clone(),
            sink.covered.clone(),
        );
        let gc = GroupCommit::new(sink, Durability::Relaxed, UNBOUNDED);
        let held = sync_hold.lock();
        let thread = gc.spawn().unwrap();
        gc.submit((0, 0)).ok().unwrap();
        gc.write_queued();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !syncing.load(SeqCst) {
            assert!(
                std::time::Instant::now() < deadline,
                "the thread never synced"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        for i in 1..=50 {
            let ticket = gc.submit((0, i)).ok().unwrap();
            let bound = Duration::from_secs(5);
            assert_eq!(rt.block_on(gc.handed_over(ticket, bound)), Handed::Yes);
        }
        assert!(syncing.load(SeqCst), "the sync is still under way");
        assert_eq!(written.lock().len(), 51, "written during the sync");
        drop(held);
        gc.close();
        thread.join().unwrap();
        let covered = covered.lock();
        assert_eq!(
            covered[0], 1,
            "the first sync covers what was captured only"
        );
        assert_eq!(*covered.last().unwrap(), 51, "a later pass covers the rest");
    }

    /// `relaxed`: a sync that hangs bounds what a crash of the machine can take back.
    /// While the oldest unsynced write is younger than the bound, changes are answered;
    /// past it a change is written but answers `Late` after its own bound; once a sync
    /// has covered them, changes are answered again.
    #[test]
    fn relaxed_answers_stop_while_a_sync_hangs_past_the_bound() {
        let sink = Recorder::default();
        let (written, sync_hold, syncing, covered) = (
            sink.written.clone(),
            sink.sync_hold.clone(),
            sink.syncing.clone(),
            sink.covered.clone(),
        );
        let bound = Duration::from_millis(300);
        let gc = GroupCommit::new(sink, Durability::Relaxed, bound);
        let held = sync_hold.lock();
        let thread = gc.spawn().unwrap();
        gc.submit((0, 0)).ok().unwrap();
        gc.write_queued();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !syncing.load(SeqCst) {
            assert!(Instant::now() < deadline, "the thread never synced");
            std::thread::sleep(Duration::from_millis(1));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let young = gc.submit((0, 1)).ok().unwrap();
        assert_eq!(rt.block_on(gc.handed_over(young, bound)), Handed::Yes);
        std::thread::sleep(bound + Duration::from_millis(100));
        let old = gc.submit((0, 2)).ok().unwrap();
        assert_eq!(rt.block_on(gc.handed_over(old, bound)), Handed::Late);
        assert_eq!(
            written.lock().len(),
            3,
            "its change is written all the same"
        );
        assert!(syncing.load(SeqCst), "the first sync still hangs");
        drop(held);
        let after = gc.submit((0, 3)).ok().unwrap();
        let wait = Duration::from_secs(30);
        assert_eq!(rt.block_on(gc.handed_over(after, wait)), Handed::Yes);
        assert_eq!(rt.block_on(gc.handed_over(old, wait)), Handed::Yes);
        assert!(
            covered.lock().iter().any(|&upto| upto >= 3),
            "answered once a sync covered the late change"
        );
        gc.close();
        thread.join().unwrap();
    }

    /// A request that became the writer and was held inside `write` past its bound (a
    /// stalled disk) answers `Late` once it is out, even though the thread's sync would
    /// cover its change at once (defect: the bound counted from after its write, so it
    /// answered `Yes` seconds past it).
    #[test]
    fn a_writer_held_in_its_write_past_the_bound_answers_late() {
        let sink = Recorder::default();
        let hold = sink.hold.clone();
        let bound = Duration::from_millis(300);
        let gc = GroupCommit::new(sink, Durability::Relaxed, bound);
        let thread = gc.spawn().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        // Another thread holds the writer inside `write` for 700 ms (a stalled disk).
        let (taken, is_taken) = std::sync::mpsc::channel();
        let release = std::thread::spawn(move || {
            let held = hold.lock();
            taken.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(700));
            drop(held);
        });
        is_taken.recv().unwrap();
        let ticket = gc.submit((0, 0)).ok().unwrap();
        let started = Instant::now();
        assert_eq!(rt.block_on(gc.handed_over(ticket, bound)), Handed::Late);
        assert!(started.elapsed() >= Duration::from_millis(600));
        release.join().unwrap();
        // Written all the same, and answered once a sync covered it.
        let wait = Duration::from_secs(30);
        assert_eq!(rt.block_on(gc.handed_over(ticket, wait)), Handed::Yes);
        gc.close();
        thread.join().unwrap();
    }

    #[test]
    fn the_sync_thread_writes_and_syncs_everything_in_order() {
        let sink = Recorder::default();
        let (written, done, synced) =
            (sink.written.clone(), sink.done.clone(), sink.synced.clone());
        let gc = GroupCommit::new(sink, Durability::Sync, UNBOUNDED);
        let thread = gc.spawn().unwrap();
        let tickets = storm(&gc, 4, 2000, false);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while done.load(SeqCst) < 8000 {
            assert!(std::time::Instant::now() < deadline, "the writer stalled");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(synced.load(SeqCst) >= 1);
        gc.close();
        thread.join().unwrap();
        check_order(&written.lock(), &tickets);
        assert!(gc.submit((0, 0)).is_err(), "closed refuses changes");
    }

    #[test]
    fn relaxed_close_writes_what_is_queued_and_syncs() {
        let sink = Recorder::default();
        let (written, synced) = (sink.written.clone(), sink.synced.clone());
        let gc = GroupCommit::new(sink, Durability::Relaxed, UNBOUNDED);
        let thread = gc.spawn().unwrap();
        // Queued without writing (as an event's creation is): the thread's pass or its
        // close must write it.
        for i in 0..10 {
            gc.submit((0, i)).ok().unwrap();
        }
        gc.close();
        thread.join().unwrap();
        assert_eq!(written.lock().len(), 10);
        assert!(synced.load(SeqCst) >= 1, "closing syncs");
    }
}
