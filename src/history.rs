//! Each event's figures over time: a [`Sample`] every [`STEP_MS`] (10 s) in a ring of
//! [`SAMPLES`] (24 h) per event, so memory is bounded (about 400 KiB per event at most) and
//! an operator who opens the dashboard mid-sale sees the day so far.
//!
//! A background task ([`run`]) reads every event's figures from the store on a 10 s grid
//! of wall-clock time (a sample's time is a multiple of the step, so a restart continues
//! the same grid), drops the ring of an event the store says was deleted, and, when the
//! history has a file (the embedded store's data dir), writes it there every
//! [`SAVE_EVERY_MS`] and when it stops: a restart keeps the history, a crash loses at most
//! the last minute of it.
//!
//! On Redis every node samples the same shared figures into its own memory (no file): a
//! restarted node starts a fresh history while the others keep theirs. Sampling costs one
//! `list_events` per node every 10 s, and nothing is written to Redis.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::clock::Clock;
use crate::core::Millis;
use crate::store::{EventSnapshot, Notice, Store};
use crate::tasks::{stopped, Stop};

/// Time between two samples of an event.
pub const STEP_MS: Millis = 10_000;
/// Samples kept per event: 24 h at [`STEP_MS`].
pub const SAMPLES: usize = 8_640;
/// How often a history with a file writes it.
pub const SAVE_EVERY_MS: Millis = 60_000;
/// The history's file in the data dir.
pub const FILE: &str = "history.bin";
/// First bytes of the file: its format. A file of another format is not read (and is
/// replaced at the next save).
const MAGIC: &[u8; 8] = b"wrhist01";

/// One event's figures at one time. Counts are u32 (saturating) to keep the ring small.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// When (ms since the epoch; a multiple of the step).
    pub at: Millis,
    pub waiting: u32,
    pub admitted: u32,
    pub active: u32,
    pub capacity: u32,
    /// Admissions in the minute before `at` (the dashboard's rate chart).
    pub admitted_last_minute: u32,
    /// Totals since the event was created: a rate over any span is their difference.
    pub joins: u32,
    pub admissions: u32,
    pub completed: u32,
    pub expired: u32,
}

fn small(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Sample {
    pub fn of(snap: &EventSnapshot, at: Millis) -> Self {
        let f = &snap.figures;
        Sample {
            at,
            waiting: small(f.waiting),
            admitted: small(f.admitted),
            active: small(f.active),
            capacity: small(f.capacity),
            admitted_last_minute: small(f.admitted_last_minute),
            joins: small(f.joins),
            admissions: small(f.admissions),
            completed: small(f.completed),
            expired: small(f.expired),
        }
    }
}

/// The newest `cap` samples of one event, oldest first, in strictly increasing time.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Ring {
    samples: VecDeque<Sample>,
}

impl Ring {
    /// Adds `s` unless it is not newer than the last sample (a repeated or late tick);
    /// drops the oldest beyond `cap`. Answers whether it was added.
    pub fn push(&mut self, s: Sample, cap: usize) -> bool {
        if self.samples.back().is_some_and(|last| last.at >= s.at) {
            return false;
        }
        let cap = cap.max(1);
        while self.samples.len() >= cap {
            self.samples.pop_front();
        }
        // Grow by doubling, but never past `cap`: the default growth would reserve up to
        // twice the ring's bound.
        if self.samples.len() == self.samples.capacity() {
            let want = (self.samples.len() * 2).max(16).min(cap);
            self.samples.reserve_exact(want - self.samples.len());
        }
        self.samples.push_back(s);
        true
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Samples at or after `since`, oldest first; with `step` above the ring's own, the
    /// last sample of each `step`-long span of time (aligned to the epoch).
    pub fn since(&self, since: Millis, step: Millis) -> Vec<Sample> {
        let from = self.samples.partition_point(|s| s.at < since);
        let mut out: Vec<Sample> = Vec::new();
        for s in self.samples.range(from..) {
            match out.last_mut() {
                Some(last) if step > 0 && last.at / step == s.at / step => *last = *s,
                _ => out.push(*s),
            }
        }
        out
    }
}

/// Every event's ring.
pub struct History {
    rings: Mutex<HashMap<String, Ring>>,
    cap: usize,
    /// Where the history is kept across restarts (`None`: memory only).
    path: Option<PathBuf>,
}

impl Default for History {
    fn default() -> Self {
        Self::in_memory(SAMPLES)
    }
}

/// The file's content: a format marker, then the rings by event id.
#[derive(Serialize, Deserialize)]
struct Saved {
    rings: Vec<(String, Vec<Sample>)>,
}

impl History {
    /// A history in memory only, keeping `cap` samples per event.
    pub fn in_memory(cap: usize) -> Self {
        History {
            rings: Mutex::default(),
            cap,
            path: None,
        }
    }

    /// The history kept in `path`, read back if it exists. An unreadable file is logged and
    /// set aside: losing the charts must not stop a sale from being served.
    pub fn open(path: &Path) -> Self {
        let mut h = Self::in_memory(SAMPLES);
        h.path = Some(path.to_path_buf());
        match std::fs::read(path) {
            Ok(bytes) => match decode(&bytes) {
                Some(saved) => {
                    let mut rings = h.rings.lock();
                    for (id, samples) in saved.rings {
                        if samples.is_empty() {
                            continue;
                        }
                        let ring = rings.entry(id).or_default();
                        for s in samples {
                            ring.push(s, h.cap);
                        }
                    }
                    tracing::info!(events = rings.len(), path = %path.display(), "history read back");
                }
                None => tracing::warn!(path = %path.display(),
                    "the history file cannot be read; starting a new history"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %path.display(), error = %e,
                "the history file cannot be read; starting a new history"),
        }
        h
    }

    /// Adds one sample per event of `events` at `at`, and forgets the rings of events that
    /// are not among them (deleted while a notice was missed).
    pub fn record(&self, events: &[EventSnapshot], at: Millis) {
        // A set, not a scan of `events` per ring: that was quadratic, and with 20,000 events
        // held the lock (and its worker) for most of a second at every sample.
        let live: std::collections::HashSet<&str> =
            events.iter().map(|e| e.event_id.as_str()).collect();
        let mut rings = self.rings.lock();
        rings.retain(|id, _| live.contains(id.as_str()));
        for e in events {
            let sample = Sample::of(e, at);
            match rings.get_mut(e.event_id.as_str()) {
                Some(ring) => ring.push(sample, self.cap),
                None => rings
                    .entry(e.event_id.clone())
                    .or_default()
                    .push(sample, self.cap),
            };
        }
    }

    /// Forgets a deleted event's history.
    pub fn forget(&self, event_id: &str) {
        self.rings.lock().remove(event_id);
    }

    /// An event's samples at or after `since`, at most one per `step` (see [`Ring::since`]);
    /// `None` for an event without history.
    pub fn samples(&self, event_id: &str, since: Millis, step: Millis) -> Option<Vec<Sample>> {
        self.rings
            .lock()
            .get(event_id)
            .map(|r| r.since(since, step))
    }

    /// Writes the history to its file, if it has one (a new file renamed over the old, so
    /// a crash leaves one or the other whole).
    pub fn save(&self) -> std::io::Result<()> {
        use std::io::Write;
        let Some(path) = &self.path else {
            return Ok(());
        };
        // One ring at a time, each copied under the lock on its own and written before the
        // next: a copy of every ring at once, then the whole file's bytes, doubled the
        // history's memory while it was written (about a second each minute at 10,000
        // events) and held the lock that samples and chart reads wait on for the copy.
        let ids: Vec<String> = self.rings.lock().keys().cloned().collect();
        let tmp = path.with_extension("bin.tmp");
        let file = std::fs::File::create(&tmp)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 16, file);
        out.write_all(MAGIC)?;
        // `Saved` as postcard writes it: the number of rings (a varint, as any length),
        // then each ring's `(id, samples)`. A ring forgotten meanwhile is written empty
        // and skipped when read back.
        postcard::to_io(&ids.len(), &mut out).map_err(std::io::Error::other)?;
        let mut samples: Vec<Sample> = Vec::new();
        for id in &ids {
            samples.clear();
            if let Some(ring) = self.rings.lock().get(id) {
                samples.extend(ring.samples.iter().copied());
            }
            postcard::to_io(&(id, &samples), &mut out).map_err(std::io::Error::other)?;
        }
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)
    }

    fn has_file(&self) -> bool {
        self.path.is_some()
    }
}

fn decode(bytes: &[u8]) -> Option<Saved> {
    let body = bytes.strip_prefix(MAGIC.as_slice())?;
    postcard::from_bytes(body).ok()
}

/// The sample time of `now`: the start of its step.
fn slot(now: Millis) -> Millis {
    now - now % STEP_MS
}

/// Samples every event into `history` at every step of wall-clock time (from the next
/// step's start: a sample is stamped with its step's start, so one taken mid-step would
/// show later figures as the step's, beside another node's of that time, or a step the
/// node was down for as sampled), forgets deleted events on their notices, and saves the
/// history every minute and when `stop` comes.
pub async fn run(
    history: Arc<History>,
    store: Arc<dyn Store>,
    clock: Clock,
    mut notices: broadcast::Receiver<Notice>,
    mut stop: Stop,
) {
    let mut saved_at = clock.now();
    let mut next = {
        let now = clock.now();
        if now % STEP_MS == 0 {
            now
        } else {
            slot(now) + STEP_MS
        }
    };
    // A deletion heard since the last save: saved at the next wake-up a second or more
    // after the last save (within a step; a burst of deletions is one save), not a minute
    // later, so that a crash does not bring the deleted history back.
    let mut deleted = false;
    loop {
        let now = clock.now();
        if now >= next {
            // A store that hangs must not hold the shutdown.
            let listed = tokio::select! {
                biased;
                _ = stopped(&mut stop) => break,
                r = store.list_events(now) => r,
            };
            match listed {
                Ok(events) => history.record(&events, slot(now)),
                Err(e) => tracing::warn!(error = %e, "history: the figures cannot be read"),
            }
            next = slot(now) + STEP_MS;
        }
        let since = now.saturating_sub(saved_at);
        if history.has_file() && ((deleted && since >= 1_000) || since >= SAVE_EVERY_MS) {
            save(&history).await;
            saved_at = now;
            deleted = false;
        }
        // A deletion not saved yet (the last save was under a second ago) wakes the loop
        // for its save a second after the last.
        let until = if deleted {
            next.min(saved_at + 1_000)
        } else {
            next
        };
        let wait = Duration::from_millis(until.saturating_sub(clock.now()).max(1));
        tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            r = notices.recv() => match r {
                Ok(Notice::EventDeleted { event_id }) => {
                    history.forget(&event_id);
                    deleted = true;
                }
                // A missed deletion is caught by the next sample (see `History::record`).
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => break,
            },
            _ = tokio::time::sleep(wait) => {}
        }
    }
    if history.has_file() {
        save(&history).await;
    }
}

async fn save(history: &Arc<History>) {
    let h = history.clone();
    match tokio::task::spawn_blocking(move || h.save()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "history: cannot write its file"),
        Err(e) => tracing::warn!(error = %e, "history: the writer failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at: Millis, waiting: u32) -> Sample {
        Sample {
            at,
            waiting,
            ..Sample::default()
        }
    }

    #[test]
    fn the_ring_is_bounded_keeps_the_newest_and_wraps_in_order() {
        let mut r = Ring::default();
        for i in 1..=25u32 {
            assert!(r.push(s(Millis::from(i) * STEP_MS, i), 10));
            assert!(r.len() <= 10);
        }
        let all = r.since(0, 0);
        assert_eq!(all.len(), 10);
        assert_eq!(
            all.iter().map(|x| x.waiting).collect::<Vec<_>>(),
            (16..=25).collect::<Vec<_>>(),
            "the oldest went first, the order is kept across the wrap"
        );
    }

    #[test]
    fn a_sample_not_newer_than_the_last_is_refused() {
        let mut r = Ring::default();
        assert!(r.push(s(20_000, 1), 10));
        assert!(!r.push(s(20_000, 2), 10), "the same slot twice");
        assert!(!r.push(s(10_000, 3), 10), "an older slot");
        assert_eq!(r.since(0, 0), [s(20_000, 1)]);
    }

    #[test]
    fn since_and_step_select_and_thin() {
        let mut r = Ring::default();
        for i in 0..12u32 {
            r.push(s(Millis::from(i) * STEP_MS, i), SAMPLES);
        }
        let from = r.since(50_000, 0);
        assert_eq!(from.first().unwrap().at, 50_000);
        assert_eq!(from.len(), 7);
        // One a minute: the last of each minute.
        let per_min = r.since(0, 60_000);
        assert_eq!(
            per_min.iter().map(|x| x.waiting).collect::<Vec<_>>(),
            [5, 11]
        );
        assert!(r.since(200_000, 0).is_empty());
    }

    #[test]
    fn a_full_day_fits_and_a_day_and_a_bit_stays_bounded() {
        let mut r = Ring::default();
        for i in 0..(SAMPLES as u64 + 100) {
            r.push(s(i * STEP_MS, 0), SAMPLES);
        }
        assert_eq!(r.len(), SAMPLES);
        assert_eq!(r.since(0, 0)[0].at, 100 * STEP_MS);
        assert!(
            r.samples.capacity() <= SAMPLES + 16,
            "memory stays at the bound: {}",
            r.samples.capacity()
        );
        assert!(std::mem::size_of::<Sample>() <= 48);
    }

    /// A full day of one busy event, as written to the file: well under half a MiB
    /// (about 240 KB).
    #[test]
    fn a_full_day_on_disk_is_small() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let h = History::open(&path);
        {
            let mut rings = h.rings.lock();
            let ring = rings.entry("busy".into()).or_default();
            for i in 0..SAMPLES as u32 {
                let sample = Sample {
                    at: 1_700_000_000_000 + Millis::from(i) * STEP_MS,
                    waiting: 40_000 + i,
                    admitted: 300,
                    active: 4_700,
                    capacity: 5_000,
                    admitted_last_minute: 1_200,
                    joins: 100_000 + 50 * i,
                    admissions: 50_000 + 40 * i,
                    completed: 45_000 + 39 * i,
                    expired: 2_000 + i,
                };
                ring.push(sample, SAMPLES);
            }
        }
        h.save().unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size < 512 * 1024, "{size} bytes");
        assert_eq!(
            History::open(&path).samples("busy", 0, 0).unwrap().len(),
            SAMPLES
        );
    }

    /// The file written ring by ring is byte for byte the `Saved` value earlier versions
    /// wrote in one piece, so either version reads the other's file.
    #[test]
    fn the_history_file_written_ring_by_ring_has_the_one_piece_form() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let h = History::open(&path);
        for (n, id) in ["a", "bb", "ccc"].iter().enumerate() {
            let mut rings = h.rings.lock();
            let ring = rings.entry((*id).into()).or_default();
            for i in 0..(200 * n as u32 + 3) {
                ring.push(s(1_700_000_000_000 + Millis::from(i) * STEP_MS, i), SAMPLES);
            }
        }
        h.save().unwrap();
        let written = std::fs::read(&path).unwrap();
        let ids: Vec<String> = h.rings.lock().keys().cloned().collect();
        let one_piece = Saved {
            rings: ids
                .iter()
                .map(|id| (id.clone(), h.samples(id, 0, 0).unwrap()))
                .collect(),
        };
        let mut expected = MAGIC.to_vec();
        expected.extend(postcard::to_stdvec(&one_piece).unwrap());
        assert_eq!(written, expected);
        let back = History::open(&path);
        for id in ["a", "bb", "ccc"] {
            assert_eq!(back.samples(id, 0, 0), h.samples(id, 0, 0));
        }
    }

    /// A node's first sample waits for the next step's start (defect: a node started 2.8 s
    /// into a step, or back from 12 s down, sampled at once and stamped its figures of then
    /// with the step's start: beside another node's sample of that time, or in a step it was
    /// down for).
    #[tokio::test]
    async fn the_first_sample_waits_for_the_next_step() {
        let store = Arc::new(crate::store::fault::FaultStore::embedded());
        let patch: crate::core::EventPatch = serde_json::from_value(serde_json::json!({})).unwrap();
        store.put_event("hx", &patch, 0).await.unwrap();
        let history = Arc::new(History::default());
        let clock = Clock::manual(22_800);
        let (_tx, stop) = crate::tasks::stop_channel();
        let task = tokio::spawn(run(
            history.clone(),
            store.clone(),
            clock.clone(),
            store.subscribe(),
            stop,
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(history.samples("hx", 0, 0).is_none(), "sampled mid-step");
        clock.advance(7_200);
        // A notice wakes the task before its timer (set for 7.2 s of real time).
        store.put_event("wake", &patch, 30_000).await.unwrap();
        let mut first = None;
        for _ in 0..400 {
            first = history
                .samples("hx", 0, 0)
                .and_then(|s| s.first().map(|s| s.at));
            if first.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        task.abort();
        assert_eq!(first, Some(30_000));
    }

    /// A deletion is saved soon after it is heard, not at the next minute's save: a crash
    /// meanwhile must not bring the deleted event's history back.
    #[tokio::test]
    async fn a_deletion_is_saved_within_moments() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let store = Arc::new(crate::store::fault::FaultStore::embedded());
        let patch = serde_json::from_value(serde_json::json!({})).unwrap();
        store.put_event("hx", &patch, 0).await.unwrap();
        let history = Arc::new(History::open(&path));
        let clock = Clock::manual(20_000);
        let (_tx, stop) = crate::tasks::stop_channel();
        let task = tokio::spawn(run(
            history.clone(),
            store.clone(),
            clock.clone(),
            store.subscribe(),
            stop,
        ));
        while history.samples("hx", 0, 0).is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        history.save().unwrap();
        assert!(History::open(&path).samples("hx", 0, 0).is_some());
        clock.advance(1_000);
        store.delete_event("hx").await.unwrap();
        let mut saved = false;
        for _ in 0..400 {
            if History::open(&path).samples("hx", 0, 0).is_none() {
                saved = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        task.abort();
        assert!(saved, "the file still held the deleted event's history");
    }

    /// A store that hangs does not hold the shutdown, and the task writes its file as it
    /// stops.
    #[tokio::test]
    async fn the_task_stops_even_on_a_hanging_store_and_saves() {
        use crate::store::fault::{Fault, FaultStore, Op};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let store = Arc::new(FaultStore::embedded());
        store.inject(Op::ListEvents, Fault::Hang);
        let history = Arc::new(History::open(&path));
        let (tx, stop) = crate::tasks::stop_channel();
        let task = tokio::spawn(run(
            history,
            store.clone(),
            Clock::manual(20_000),
            store.subscribe(),
            stop,
        ));
        while store.calls(Op::ListEvents) == 0 {
            tokio::task::yield_now().await;
        }
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("stopped while the store hung")
            .unwrap();
        assert!(path.is_file(), "saved as it stopped");
    }

    #[test]
    fn the_history_file_reads_back_and_a_bad_one_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let h = History::open(&path);
        h.rings
            .lock()
            .entry("ev".into())
            .or_default()
            .push(s(10_000, 7), SAMPLES);
        h.save().unwrap();
        let back = History::open(&path);
        assert_eq!(back.samples("ev", 0, 0).unwrap(), [s(10_000, 7)]);
        std::fs::write(&path, b"not a history").unwrap();
        assert!(History::open(&path).samples("ev", 0, 0).is_none());
    }
}
