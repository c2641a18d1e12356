//! Syncing the journal and recording what is durable; in `relaxed`, without holding the
//! writers up.
//!
//! fjall's `Database::persist` holds fjall's journal lock during the `fdatasync`, and the
//! `relaxed` thread used to call it holding the group commit's flag too: every request
//! that wrote during a sync (3–30 ms every 100 ms under load) waited for it, and one that
//! met fjall's lock blocked a runtime worker's thread (docs/PERFORMANCE.md, "The periodic
//! sync off the writers' path"). So the `relaxed` sync has two halves:
//!
//! 1. [`Syncer::capture`], the flag held and everything written handed to the OS (so
//!    nothing is appended meanwhile): reads the journal's new batches into the watermark's
//!    marks, without recording them; writes the next zeros ahead of the appends (which
//!    needs nothing appended meanwhile: [`super::zero_ahead`]); takes a handle of the
//!    journal being appended to.
//! 2. [`Capture::finish`], with neither the flag nor fjall's lock: starts the write-back
//!    of those zeros (it waits whenever the kernel throttles a busy disk), `fdatasync`s
//!    through that handle, then the watermark records exactly the captured marks.
//!
//! Why the watermark still names synced bytes only:
//! - A sync is per file, not per handle: ours makes durable every byte of the file written
//!   to the OS before it began, so every captured byte.
//! - Bytes appended during the sync may or may not be covered; the captured marks end
//!   before them, and the next pass syncs them (the group commit's `dirty`).
//! - fjall syncs a journal (`SyncAll`) before it starts `N+1.jnl`. A capture after such a
//!   rotation lists the journals again, so its handle is the newest journal's and the older
//!   ones are synced already; a rotation after the capture leaves our handle on `N`, which
//!   holds every captured byte.
//!
//! What a request is answered on (its change handed to the OS) does not move; only when
//! the pass's sync ends does, within the same ~100 ms.

use std::fs::File;
use std::sync::Arc;
use std::time::Instant;

use fjall::{Database, PersistMode};
use parking_lot::Mutex;

use super::watermark::{Marker, Marks};
use super::zero_ahead::{self, Writeback, ZeroAhead};

/// The journal writer's sync state: the watermark and the zeros ahead of the appends.
/// Used by one thread at a time (the flag's holder, or the `relaxed` thread after a
/// capture), so its lock is never contended.
pub(super) struct Syncer {
    db: Database,
    marker: Marker,
    /// Zeros written ahead of the active journal's appends (`None` once it failed: it only
    /// speeds syncs up, so the store goes on without it).
    zero_ahead: Option<ZeroAhead>,
    /// Tests: a disk that stalls.
    #[cfg(test)]
    pub(super) stall: Arc<Stall>,
}

/// Tests: holds a sync before its `fdatasync`, as a disk that stalls would.
#[cfg(test)]
#[derive(Default)]
pub(super) struct Stall {
    /// While set, syncs wait before their `fdatasync`.
    pub(super) on: std::sync::atomic::AtomicBool,
    /// Syncs that reached the stall.
    pub(super) reached: std::sync::atomic::AtomicU64,
}

#[cfg(test)]
impl Stall {
    /// Stalls the syncs until the guard is dropped, even by a test that panics: a sync
    /// held for good would hang the journal's close, and so the test binary.
    pub(super) fn stall(&self) -> impl Drop + '_ {
        struct Release<'a>(&'a Stall);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.on.store(false, std::sync::atomic::Ordering::SeqCst);
            }
        }
        self.on.store(true, std::sync::atomic::Ordering::SeqCst);
        Release(self)
    }

    fn hold(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.reached.fetch_add(1, SeqCst);
        while self.on.load(SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// What a `relaxed` sync covers, captured under the flag.
pub(super) struct Capture {
    syncer: Arc<Mutex<Syncer>>,
    marks: Marks,
    /// The journal being appended to at the capture; `None`: synced already (no journal
    /// file was found, so the capture synced through fjall).
    file: Option<File>,
    /// The write-back of the zeros written ahead at the capture, started outside the flag.
    writeback: Option<Writeback>,
}

impl Syncer {
    pub(super) fn new(db: Database, marker: Marker) -> Arc<Mutex<Syncer>> {
        // Registered at zero: a node exports the summary before its first sync, rather than
        // nothing (a missing series reads "no data" on a dashboard, and fires `absent()`).
        let _ = metrics::histogram!(SYNC_SECONDS);
        Arc::new(Mutex::new(Syncer {
            db,
            marker,
            zero_ahead: Some(ZeroAhead::new()),
            #[cfg(test)]
            stall: Arc::default(),
        }))
    }

    /// Syncs through fjall (`sync` mode's group commits, the last sync at close), then
    /// records what is durable. The caller holds the group commit's flag.
    pub(super) fn sync_now(&mut self, mode: PersistMode) -> anyhow::Result<()> {
        #[cfg(test)]
        self.stall.hold();
        let started = Instant::now();
        self.db.persist(mode)?;
        record_sync_time(started);
        self.marker.synced()?;
        // The group commit's flag is held: nothing is appended meanwhile. (`sync` mode: the
        // thread that holds the flag is the one requests wait for anyway.)
        if let Some(w) = zero_ahead::after_sync(&mut self.zero_ahead, &self.marker) {
            w.start();
        }
        Ok(())
    }

    /// `relaxed`: the first half of a sync (see the module's notes). The caller holds the
    /// group commit's flag, and everything written is handed to the OS.
    pub(super) fn capture(me: &Arc<Mutex<Syncer>>) -> anyhow::Result<Capture> {
        let mut guard = me.lock();
        let s = &mut *guard;
        let marks = s.marker.capture()?;
        let file = match s.marker.active_file() {
            Some(f) => Some(f?),
            None => {
                // No journal file to hold: sync through fjall, as `sync_now` does.
                let started = Instant::now();
                s.db.persist(PersistMode::SyncData)?;
                record_sync_time(started);
                None
            }
        };
        // Nothing is appended meanwhile, so the zeros start past the captured end. Their
        // write-back starts in `finish`, once the flag is given back.
        let writeback = zero_ahead::after_sync(&mut s.zero_ahead, &s.marker);
        drop(guard);
        Ok(Capture {
            syncer: me.clone(),
            marks,
            file,
            writeback,
        })
    }
}

impl Capture {
    /// `relaxed`: the second half of a sync, with neither the flag nor fjall's lock held:
    /// syncs the captured journal, then records the captured marks as durable.
    pub(super) fn finish(mut self) -> anyhow::Result<()> {
        // Before the sync, so it carries the zeros too (as when the capture started them).
        if let Some(w) = self.writeback.take() {
            w.start();
        }
        #[cfg(test)]
        {
            let stall = self.syncer.lock().stall.clone();
            stall.hold();
        }
        if let Some(f) = &self.file {
            let started = Instant::now();
            f.sync_data()?;
            record_sync_time(started);
            let took = started.elapsed();
            if took >= std::time::Duration::from_millis(2) {
                tracing::debug!(us = took.as_micros() as u64, "slow relaxed sync");
            }
        }
        self.syncer.lock().marker.record(&self.marks)?;
        Ok(())
    }
}

/// The summary of the journal's sync times.
const SYNC_SECONDS: &str = "waitroom_store_sync_seconds";

fn record_sync_time(started: Instant) {
    metrics::histogram!(SYNC_SECONDS).record(started.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{EventConfig, QueueMeta};
    use crate::store::journal::{Durability, Journal, RELAXED_UNSYNCED_BOUND};
    use crate::store::watermark;
    use crate::store::StoreError;
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    use std::time::Duration;

    /// A journal whose syncs a test stalls, and changes to its one event.
    struct Stallable {
        _dir: tempfile::TempDir,
        journal: Arc<Journal>,
        stall: Arc<Stall>,
        id: Arc<str>,
        joins: AtomicU64,
    }

    impl Stallable {
        fn open(mode: Durability) -> Stallable {
            let dir = tempfile::tempdir().unwrap();
            let (journal, _) = Journal::open(dir.path(), mode, 0).unwrap();
            let stall = journal.syncer.lock().stall.clone();
            Stallable {
                _dir: dir,
                journal: Arc::new(journal),
                stall,
                id: "concert".into(),
                joins: AtomicU64::new(0),
            }
        }

        /// Queues a change of the event's record (a change with no places and no record is
        /// not written) and answers its ticket.
        fn change(&self) -> u64 {
            let meta = QueueMeta {
                joins: self.joins.fetch_add(1, SeqCst) + 1,
                ..QueueMeta::default()
            };
            let config = Some(EventConfig::default());
            self.journal
                .record(&self.id, Vec::new(), meta, config)
                .unwrap()
        }

        /// Waits for `ticket` on a task of its own.
        fn wait_on_a_task(&self, ticket: u64) -> tokio::task::JoinHandle<Result<(), StoreError>> {
            let journal = self.journal.clone();
            tokio::spawn(async move { journal.wait(ticket).await })
        }
    }

    /// A database whose journal is synced by hand, with one keyspace.
    fn open(dir: &std::path::Path) -> (Database, fjall::Keyspace) {
        let db = Database::builder(dir)
            .manual_journal_persist(true)
            .open()
            .unwrap();
        let ks = db
            .keyspace("places", fjall::KeyspaceCreateOptions::default)
            .unwrap();
        (db, ks)
    }

    fn append(db: &Database, ks: &fjall::Keyspace, from: u32, n: u32) {
        for i in from..from + n {
            let mut b = db.batch();
            b.insert(ks, i.to_be_bytes(), vec![7u8; 100]);
            b.commit().unwrap();
        }
        db.persist(PersistMode::Buffer).unwrap();
    }

    /// Batches appended between a capture and its sync's end are in the journal but not
    /// in the watermark that sync records; the next capture's sync records them.
    #[test]
    fn the_watermark_names_what_was_captured_only() {
        let dir = tempfile::tempdir().unwrap();
        let (db, ks) = open(dir.path());
        append(&db, &ks, 0, 10);
        let syncer = Syncer::new(db.clone(), Marker::new(dir.path()).unwrap());
        append(&db, &ks, 10, 5);
        let capture = Syncer::capture(&syncer).unwrap();
        // Requests write while the sync runs.
        append(&db, &ks, 15, 20);
        capture.finish().unwrap();
        let (id, path) = watermark::journals(dir.path())
            .into_iter()
            .next_back()
            .unwrap();
        let marked = |d: &std::path::Path| watermark::read_marks(d).unwrap()[&id];
        let all = watermark::scan_from(&path, 0).unwrap();
        let first = marked(dir.path());
        assert!(first.len < all.len, "the later batches are not named");
        assert_eq!(all.tally.records - first.tally.records, 20);
        // What the watermark names reads back as exactly the batches captured.
        let mut prefix = std::fs::read(&path).unwrap();
        prefix.truncate(first.len as usize);
        let cut = dir.path().join("cut.jnl");
        std::fs::write(&cut, &prefix).unwrap();
        assert_eq!(watermark::scan_from(&cut, 0).unwrap(), first);
        Syncer::capture(&syncer).unwrap().finish().unwrap();
        assert_eq!(marked(dir.path()), all, "the next sync names them");
    }

    /// The capture (under the group commit's flag) writes the next zeros ahead but leaves
    /// their write-back, which waits whenever the kernel throttles a busy disk, to `finish`
    /// (outside the flag): the step it hands over starts past the captured end, and once
    /// finished the journal's blocks there are allocated.
    #[cfg(unix)]
    #[test]
    fn the_capture_leaves_the_zeros_write_back_to_the_sync() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let (db, ks) = open(dir.path());
        let syncer = Syncer::new(db.clone(), Marker::new(dir.path()).unwrap());
        append(&db, &ks, 0, 10);
        let capture = Syncer::capture(&syncer).unwrap();
        let (id, end) = syncer.lock().marker.active_end().unwrap();
        let (at, n) = capture
            .writeback
            .as_ref()
            .expect("the capture hands the step's write-back over")
            .range();
        assert!(
            at >= end && n > 0,
            "step {at}+{n} starts past the appends ({end})"
        );
        capture.finish().unwrap();
        let path = syncer.lock().marker.journal_path(id);
        std::fs::File::open(&path).unwrap().sync_all().unwrap();
        let blocks = std::fs::metadata(&path).unwrap().blocks() * 512;
        assert!(
            blocks >= at + n,
            "the step's blocks are allocated ({blocks})"
        );
    }

    /// A disk that stalls in `relaxed`: while the sync in flight is young, changes are
    /// answered; once the oldest unsynced write is older than the bound (500 ms), a change is
    /// written but not answered, and answers `503` after its own 3 s; once the sync ends,
    /// changes are answered again. Without the bound every change would be answered while
    /// the sync hangs, and a crash of the machine could take back all of them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_sync_stops_relaxed_answers_after_the_bound() {
        let s = Stallable::open(Durability::Relaxed);
        let (journal, stall) = (&s.journal, &s.stall);
        let change = || s.change();
        let stalling = stall.stall();
        let first = change();
        journal.wait(first).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while stall.reached.load(SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the thread never synced");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let stalled_at = Instant::now();
        let young = change();
        journal
            .wait(young)
            .await
            .expect("answered while the sync is young");
        assert!(!journal.is_stalled(), "a young sync is not a stall");
        tokio::time::sleep(RELAXED_UNSYNCED_BOUND + Duration::from_millis(200)).await;
        let old = change();
        let asked = Instant::now();
        let answer = journal.wait(old).await;
        assert!(
            matches!(answer, Err(StoreError::Unavailable(_))),
            "answered {answer:?} while the sync was {:?} old",
            asked - stalled_at
        );
        assert!(
            asked.elapsed() >= Duration::from_secs(3),
            "waited its bound"
        );
        assert!(
            journal.is_stalled(),
            "stalled once a write waited the bound"
        );
        assert_eq!(stall.reached.load(SeqCst), 1, "the same sync still hangs");
        // Requests that are waiting when the sync ends are answered.
        let waiting = s.wait_on_a_task(change());
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(stalling);
        waiting
            .await
            .unwrap()
            .expect("answered once the sync ended");
        let after = change();
        journal.wait(after).await.expect("answered again");
        assert!(stall.reached.load(SeqCst) >= 2, "a later sync covered them");
        assert!(!journal.is_stalled(), "ready again once the disk confirmed");
    }

    /// A disk that stalls in `sync`: a waiting change answers `503` once it has waited the
    /// bound (3 s, give or take the watchdog's look), with no timer of its own; one queued
    /// later is still waiting when the sync ends, and is answered; and so are the next.
    /// Without the watchdog the first wait would never end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_sync_answers_unavailable_after_the_bound() {
        let s = Stallable::open(Durability::Sync);
        let (journal, stall) = (&s.journal, &s.stall);
        let change = || s.change();
        journal
            .wait(change())
            .await
            .expect("a healthy disk answers");
        let stalling = stall.stall();
        let reached = stall.reached.load(SeqCst);
        let asked = Instant::now();
        let stalled = change();
        let first = s.wait_on_a_task(stalled);
        let deadline = Instant::now() + Duration::from_secs(30);
        while stall.reached.load(SeqCst) == reached {
            assert!(Instant::now() < deadline, "the thread never synced");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!journal.is_stalled(), "not stalled before the bound");
        let answer = tokio::time::timeout(Duration::from_secs(20), first)
            .await
            .expect("a stalled sync hung the request")
            .unwrap();
        let waited = asked.elapsed();
        // What `/readyz` asks: the node is not ready while changes answer 503.
        assert!(
            journal.is_stalled(),
            "stalled once a change was given up on"
        );
        assert!(
            matches!(&answer, Err(StoreError::Unavailable(m)) if m.contains("in time")),
            "{answer:?}"
        );
        assert!(
            waited >= Duration::from_secs(3),
            "answered after {waited:?}"
        );
        let hung = stall.reached.load(SeqCst);
        // Queued now, it has not waited its bound when the sync ends.
        let waiting = s.wait_on_a_task(change());
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(stalling);
        assert_eq!(hung, reached + 1, "the same sync hung throughout");
        waiting
            .await
            .unwrap()
            .expect("answered once the sync ended");
        journal.wait(change()).await.expect("answered again");
        assert!(!journal.is_stalled(), "ready again once the disk confirmed");
        journal
            .wait(stalled)
            .await
            .expect("the given-up change was synced later");
    }

    /// Settings changed again and again rewrite the event's settings record (as every batch
    /// did before the counters had a record of their own): 8 MiB of such versions must not
    /// flush the `events` keyspace, whose flushes and compactions stall every write
    /// (docs/PERFORMANCE.md). `keyspaces/1` is `events`, the first keyspace opened.
    #[tokio::test]
    async fn rewriting_an_events_record_does_not_flush_its_keyspace() {
        use crate::core::{EventConfig, QueueMeta};
        use crate::store::journal::{Durability, Journal};
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(dir.path(), Durability::Relaxed, 0).unwrap();
        let id: std::sync::Arc<str> = "concert".into();
        let config = EventConfig {
            name: "n".repeat(200),
            ..EventConfig::default()
        };
        let mut meta = QueueMeta::default();
        let (mut written, mut n) = (0usize, 0u64);
        while written < 8 * 1024 * 1024 {
            n += 1;
            meta.joins = n;
            let ticket = journal
                .record(&id, Vec::new(), meta.clone(), Some(config.clone()))
                .unwrap();
            journal.wait(ticket).await.unwrap();
            // The record's settings (JSON) and counters, plus its key.
            written += serde_json::to_string(&config).unwrap().len() + 40;
        }
        // A flush is the worker's: give it time to show up.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let tables = dir.path().join("keyspaces/1/tables");
        let flushed = std::fs::read_dir(&tables).map_or(0, |d| d.count());
        assert_eq!(flushed, 0, "{n} versions of one record flushed `events`");
        drop(journal);
        let (_, recovered) = Journal::open(dir.path(), Durability::Relaxed, 0).unwrap();
        assert_eq!(
            recovered.events[0].1.meta().joins,
            n,
            "the latest version is kept"
        );
    }
}
