//! Durability of the embedded store: every state change is written to a fjall database
//! (an LSM tree with a checksummed write-ahead journal) by one writer thread with group
//! commit, and read back on start.
//!
//! Why this shape:
//! - **Group commit.** Requests queue their changes in ticket order and wait for their
//!   ticket to become durable. The writer takes whatever has queued, writes it as one
//!   atomic batch and syncs once, so a hundred concurrent joins share one fsync. In
//!   `relaxed` the requests write the queue themselves (see [`super::group_commit`]).
//! - **State, not history.** Keys hold the current state of each live place (a join
//!   record, plus small records when it is admitted and when it enters); an ended place's
//!   keys are deleted. The LSM compaction then keeps disk proportional to the live places,
//!   and a restart scans live places only, never the whole history of a long sale.
//! - **Heartbeats are never written**: they are the bulk of the traffic and only matter to
//!   the running process. After a restart every place gets a fresh grace period.
//! - **Torn tails, not damage**: fjall cuts a journal back at its first unreadable batch,
//!   wherever that is. Before it opens, [`super::watermark`] tells an unfinished last batch
//!   (dropped, as it was never acknowledged) from damage to what was known durable (refused
//!   unless repairing); after every sync the writer records what is durable there.
//! - **Private files**: the store's directory is 0700 and its files 0600.
//!
//! Key layout (keyspace `places`): `event_id ‖ 0x00 ‖ seq (u64 BE) ‖ kind`, with kind
//! 0 = joined, 1 = admitted, 2 = entered, 3 = expired (the nonce and when the expiry was
//! noticed, kept while `TOKEN_EXPIRED` is answered). Event ids never contain 0x00, so one
//! prefix scan reads one event in join order. Keyspace `events`: `event_id` → settings;
//! keyspace `counters`: `event_id` → counters (`journal_events.rs`: why apart).
//! Keyspace `invites`: `event_id ‖ 0x00 ‖ code` → whom the code seats (`None` while unused).
//! Kind 4 = a session's extensions and keyspace `items` (the inventory): `journal_sale.rs`.
//! Keyspace `purges`: `event_id` → nothing, while a deleted event's keys are being removed
//! (`journal/purge.rs`).
//! The places' keys and records are made in `journal_places.rs`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::background;
use super::group_commit::{GroupCommit, Handed, Refused, Sink};
use super::journal_events::{
    config_json, decode_counters, encode_counters, encode_settings, SettingsRec,
};
use super::journal_files::restrict_tree;
use super::journal_files::store_failure;
pub use super::journal_files::{create_private_dir, written_end};
use super::journal_places::{
    apply_effect, JoinRec, PlaceOps, KIND_ADMITTED, KIND_ENTERED, KIND_EXPIRED, KIND_JOINED,
};
use super::journal_sale::{self as sale, KIND_EXTENDED};
use super::journal_sync::Syncer;
use super::synced::{Synced, Watchdog};
use super::{watermark, StoreError};

mod purge;
use crate::core::{
    Effect, EventConfig, EventQueue, InviteHolder, Millis, QueueMeta, RestoredPlace,
};
use purge::{Part, Purging};

/// The `events` and `counters` keyspaces' memtables (see where they are opened).
const EVENTS_MEMTABLE: u64 = 32 * 1024 * 1024;
/// Longest a request waits for its change to be synced before it answers `UNAVAILABLE`
/// (`sync`: plus up to two of the watchdog's looks, every `WATCH_EVERY`).
pub(super) const MAX_DURABLE_WAIT: Duration = Duration::from_secs(3);
const WATCH_EVERY: Duration = Duration::from_millis(250);
/// `relaxed`: how old an unsynced write may get while changes are still answered, so what
/// a crash of the machine can take back while the disk is slow (`group_commit.rs`). Five
/// sync intervals. A write made just after a capture is covered by the next sync, at an
/// age of about sync + 100 ms + sync, so syncs up to ~200 ms (p99 under a saturated
/// machine was 73-176 ms) hold nothing back; a disk slower than that holds the answers
/// back, as the sync under the writer's flag did, instead of widening the window to the
/// 3 s above.
pub(super) const RELAXED_UNSYNCED_BOUND: Duration = Duration::from_millis(500);

/// When a change is acknowledged relative to reaching the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Answer only after the change is synced to disk (group commit).
    #[default]
    Sync,
    /// Answer once handed to the OS; sync about every 100 ms (a machine's crash loses that).
    Relaxed,
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sync" => Ok(Durability::Sync),
            "relaxed" => Ok(Durability::Relaxed),
            other => Err(format!(
                "unknown durability {other:?} (expected sync or relaxed)"
            )),
        }
    }
}

/// One request's changes to one event.
enum Change {
    /// Effects of an operation, the event's counters after it, and its config when it
    /// changed.
    Event {
        event_id: Arc<str>,
        effects: Vec<Effect>,
        meta: QueueMeta,
        /// Boxed: settings changes are rare, and the queue holds many changes.
        config: Option<Box<EventConfig>>,
    },
    /// The event's record goes, and its mark in `purges` is set: its keys are removed by
    /// [`Change::Purge`] steps after it (see `journal/purge.rs`).
    Delete { event_id: Arc<str> },
    /// One step of removing a deleted event's keys; `last` removes its mark.
    Purge {
        event_id: Arc<str>,
        part: Part,
        keys: Vec<fjall::Slice>,
        last: bool,
    },
}

/// Everything read back on start.
pub struct Recovered {
    pub events: Vec<(String, EventQueue)>,
    pub places: u64,
}

pub struct Journal {
    /// The writer's queue, in ticket order.
    commit: Arc<GroupCommit<Writer>>,
    /// What is synced (`sync`), and whether writing failed (both modes).
    synced: Arc<Synced>,
    mode: Durability,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// `sync`: gives up on changes the disk does not confirm in time.
    watchdog: Mutex<Option<Watchdog>>,
    db: Database,
    /// Read by purges (`journal/purge.rs`), which choose each step's keys.
    places: Keyspace,
    invites: Keyspace,
    items: Keyspace,
    purging: Purging,
    /// Tests: the writer's sync state (its hook that stalls syncs).
    #[cfg(test)]
    pub(super) syncer: Arc<Mutex<Syncer>>,
}

fn event_prefix(event_id: &str) -> Vec<u8> {
    let mut k = event_id.as_bytes().to_vec();
    k.push(0);
    k
}

fn enc<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_stdvec(v).expect("serialising to memory does not fail")
}

impl Journal {
    /// Opens (or creates) the database under `dir`, reads back every event, and starts the
    /// writer. `now` is the restart time that idle grace periods count from. A damaged
    /// journal (not a torn tail: see [`super::watermark`]) is an error.
    pub fn open(dir: &Path, mode: Durability, now: Millis) -> anyhow::Result<(Journal, Recovered)> {
        Self::open_with(dir, mode, now, false)
    }

    /// [`Journal::open`]; with `repair`, a damaged journal is cut back at the damage (and
    /// what was dropped logged) instead of refusing to open.
    pub fn open_with(
        dir: &Path,
        mode: Durability,
        now: Millis,
        repair: bool,
    ) -> anyhow::Result<(Journal, Recovered)> {
        create_private_dir(dir)?;
        super::journal_files::check_version(dir)?;
        if let Some(damage) = watermark::check(dir)
            .map_err(|e| anyhow::anyhow!("reading the journals in {}: {e}", dir.display()))?
        {
            if !repair {
                anyhow::bail!(
                    "{damage}. Refusing to start: restore the data directory from a backup, or \
                     start with --repair to cut the journal at that offset (what it holds from \
                     there on is dropped)"
                );
            }
            watermark::repair(dir, &damage)?;
            tracing::error!(
                journal = %damage.file.display(),
                offset = damage.offset,
                dropped_records = damage.lost.records,
                dropped_place_joins = damage.lost.joins,
                dropped_batches = damage.lost.batches,
                exact = damage.exact,
                uncounted_batches = damage.uncounted_batches,
                "repair: {damage}; the journal was cut there. The counts are exact for what \
                 the durability watermark recorded (exact = false: no watermark, a lower \
                 bound); batches written after its last update cannot be counted. Of those \
                 changes, any the store had already moved into a keyspace's table files are \
                 kept: read the figures, and restore a backup when exactness matters"
            );
        }
        // Opened so that fjall's flushes and compactions run below the requests' priority.
        let db = background::open_at_background_priority(|| {
            Database::builder(dir)
                .manual_journal_persist(true)
                // Read only at start (the full scan); a small cache is enough.
                .cache_size(8 * 1024 * 1024)
                .max_journaling_size(64 * 1024 * 1024)
                .open()
        })
        .map_err(|e| store_failure(dir, "opening", &e))?;
        // Small memtables: everything live is in memory already (the queues), so the store
        // only needs enough buffer to batch its flushes, not 64 MiB per keyspace.
        // Except `counters`, which every batch writes again for its event, and `events`
        // (the settings: rewritten only when they change, in bursts of a schedule or an
        // operator's edits). Each flush (and every fifth, a compaction: 180-300 ms) holds the tree's
        // version lock over five fsyncs while every batch waits to insert
        // (docs/PERFORMANCE.md, "The periodic sync off the writers' path"). When the
        // counters were part of the ~1 KB settings record, a 4 MiB memtable filled in
        // 0.6-1.5 s at 10,000 joins/s; at ~30 bytes a 32 MiB one lasts minutes. Only the
        // latest version survives a flush, so this is memory for superseded versions,
        // used only while events change.
        let keyspaces = || -> fjall::Result<_> {
            let events = db.keyspace("events", || {
                KeyspaceCreateOptions::default().max_memtable_size(EVENTS_MEMTABLE)
            })?;
            let counters = db.keyspace("counters", || {
                KeyspaceCreateOptions::default().max_memtable_size(EVENTS_MEMTABLE)
            })?;
            let places = db.keyspace("places", || {
                KeyspaceCreateOptions::default().max_memtable_size(16 * 1024 * 1024)
            })?;
            let invites = db.keyspace("invites", KeyspaceCreateOptions::default)?;
            let items = db.keyspace("items", KeyspaceCreateOptions::default)?;
            // Deleted events whose keys were still being removed when the process stopped.
            let purges = db.keyspace("purges", KeyspaceCreateOptions::default)?;
            Ok((events, counters, places, invites, items, purges))
        };
        let (events, counters, places, invites, items, purges) =
            keyspaces().map_err(|e| store_failure(dir, "opening", &e))?;
        purge::finish_at_open(&db, &purges, [&places, &invites, &items])?;
        let (recovered, older) = recover(&events, &counters, &places, &invites, &items, now)
            .map_err(|e| match e.downcast_ref::<fjall::Error>() {
                Some(f) => store_failure(dir, "reading", f),
                None => e,
            })?;
        rewrite_older_records(&db, &events, &counters, older)?;
        restrict_tree(dir)?;
        // What the open itself wrote (keyspaces made, a purge finished) is made durable
        // before the first watermark names it as durable: after a machine crash right
        // after a start, a watermark ahead of the journal would read as damage.
        db.persist(PersistMode::SyncAll)?;
        let marker = watermark::Marker::new(dir)?;
        let configs: HashMap<String, String> = recovered
            .events
            .iter()
            .map(|(id, q)| (id.clone(), config_json(q.config())))
            .collect();
        let synced = Arc::new(Synced::default());
        let writer = Writer {
            synced: synced.clone(),
            woken: Vec::new(),
            db: db.clone(),
            events,
            counters,
            places: places.clone(),
            invites: invites.clone(),
            items: items.clone(),
            purges,
            configs,
            done: 0,
            syncer: Syncer::new(db.clone(), marker),
        };
        #[cfg(test)]
        let syncer = writer.syncer.clone();
        let commit = GroupCommit::new(writer, mode, RELAXED_UNSYNCED_BOUND);
        // Before the writer: if it cannot start, nothing is left running.
        let watchdog = match mode {
            Durability::Sync => Some(Watchdog::spawn(
                &synced,
                Arc::downgrade(&commit),
                GroupCommit::ticket,
                MAX_DURABLE_WAIT,
                WATCH_EVERY,
            )?),
            Durability::Relaxed => None,
        };
        let handle = commit.spawn()?;
        Ok((
            Journal {
                commit,
                synced,
                mode,
                writer: Mutex::new(Some(handle)),
                watchdog: Mutex::new(watchdog),
                db,
                places,
                invites,
                items,
                purging: Purging::default(),
                #[cfg(test)]
                syncer,
            },
            recovered,
        ))
    }

    fn submit(&self, change: Change) -> Result<u64, StoreError> {
        self.commit.submit(change).map_err(|r| {
            StoreError::Unavailable(
                match r {
                    Refused::Closed => "the store is shutting down",
                    Refused::Stopped => "the store's writer stopped",
                }
                .into(),
            )
        })
    }

    /// Queues an operation's changes; must be called under the event's lock so changes to
    /// one event reach the disk in the order they were made. Answers the ticket to wait for.
    pub fn record(
        &self,
        event_id: &Arc<str>,
        effects: Vec<Effect>,
        meta: QueueMeta,
        config: Option<EventConfig>,
    ) -> Result<u64, StoreError> {
        if effects.is_empty() && config.is_none() {
            return Ok(self.ticket());
        }
        self.submit(Change::Event {
            event_id: event_id.clone(),
            effects,
            meta,
            config: config.map(Box::new),
        })
    }

    /// Queues the removal of an event's record; its keys are then removed by
    /// [`Journal::purge`], which the caller starts once this ticket is written. Until that
    /// ends, [`Journal::purged`] waits.
    pub fn delete(&self, event_id: &Arc<str>) -> Result<u64, StoreError> {
        let ticket = self.submit(Change::Delete {
            event_id: event_id.clone(),
        })?;
        self.purging.start(event_id);
        Ok(ticket)
    }

    /// The ticket of the last queued change: an operation that only read state waits for
    /// it, so it never answers with something a crash could still take back.
    pub fn ticket(&self) -> u64 {
        self.commit.ticket()
    }

    /// Waits until `ticket` is durable; in `relaxed`, until it is handed to the OS (written
    /// by this request with what others queued meanwhile, or by the writer of the moment).
    /// Call it after releasing the event's lock.
    pub async fn wait(&self, ticket: u64) -> Result<(), StoreError> {
        if self.mode == Durability::Relaxed {
            return match self.commit.handed_over(ticket, MAX_DURABLE_WAIT).await {
                Handed::Yes if !self.synced.failed() => Ok(()),
                Handed::Late => Err(StoreError::Unavailable(
                    "the store did not write the change in time".into(),
                )),
                _ => Err(StoreError::Unavailable(
                    "the store cannot write to disk".into(),
                )),
            };
        }
        if self.synced.failed() {
            return Err(StoreError::Unavailable(
                "the store cannot write to disk".into(),
            ));
        }
        if self.synced.upto() < ticket {
            self.synced.wait(ticket).await;
        }
        if self.synced.upto() >= ticket {
            return Ok(());
        }
        if self.synced.failed() {
            return Err(StoreError::Unavailable(
                "the store cannot write to disk".into(),
            ));
        }
        // Given up on by the watchdog: a stalled disk must not hang requests. The change
        // may still become durable later; the client retries, and joins are idempotent
        // per user.
        Err(StoreError::Unavailable(
            "the disk did not confirm the write in time".into(),
        ))
    }

    /// Whether the disk stopped confirming writes for now: in `sync`, a change the watchdog
    /// gave up on is still not synced; in `relaxed`, a write has waited longer than
    /// [`MAX_DURABLE_WAIT`] for its sync. Changes answer `503` meanwhile, so the node is not
    /// ready (`/readyz`); unlike [`Journal::is_healthy`] it mends once the disk catches up.
    pub fn is_stalled(&self) -> bool {
        match self.mode {
            Durability::Sync => self.synced.stalled(),
            Durability::Relaxed => self
                .commit
                .unsynced_longer_than(MAX_DURABLE_WAIT, std::time::Instant::now()),
        }
    }

    pub fn is_healthy(&self) -> bool {
        !self.synced.failed()
    }

    /// Resolves once writing failed: the journal then refuses every change for good.
    pub async fn until_failed(&self) {
        self.synced.until_failed().await
    }

    /// Bytes on disk (journals and tables).
    pub fn disk_space(&self) -> u64 {
        self.db.disk_space().unwrap_or(0)
    }

    /// Stops accepting changes, writes and syncs what is queued, and stops the writer.
    pub fn close(&self) {
        if let Some(mut w) = self.watchdog.lock().take() {
            w.stop();
        }
        self.commit.close();
        if let Some(h) = self.writer.lock().take() {
            let _ = h.join();
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.close();
    }
}

/// An event whose record is of an older kind, holding its counters: its id, settings
/// (JSON) and counters, for [`rewrite_older_records`].
type OlderRecord = (String, String, QueueMeta);

/// What [`rewrite_older_records`] rewrites: records of an older kind, and counters records
/// of no event (by id).
type Rewrite = (Vec<OlderRecord>, Vec<String>);

fn recover(
    events: &Keyspace,
    counters: &Keyspace,
    places: &Keyspace,
    invites: &Keyspace,
    items: &Keyspace,
    now: Millis,
) -> anyhow::Result<(Recovered, Rewrite)> {
    let mut out = Vec::new();
    let mut total = 0u64;
    let mut known = HashMap::new();
    let mut older = Vec::new();
    let mut counts = HashMap::new();
    for kv in counters.iter() {
        let (k, v) = kv.into_inner()?;
        let id = String::from_utf8(k.to_vec())
            .map_err(|_| anyhow::anyhow!("the store holds counters with a non-UTF-8 id"))?;
        let meta = decode_counters(&v).map_err(|e| {
            anyhow::anyhow!("the store's counters of event {id:?} are unreadable: {e}")
        })?;
        counts.insert(id, meta);
    }
    for kv in events.iter() {
        let (k, v) = kv.into_inner()?;
        let id = String::from_utf8(k.to_vec())
            .map_err(|_| anyhow::anyhow!("the store holds an event with a non-UTF-8 id"))?;
        let rec = SettingsRec::decode(&v).map_err(|e| {
            anyhow::anyhow!("the store's record of event {id:?} is unreadable: {e}")
        })?;
        // A record of an older kind holds its counters and is rewritten. This version never
        // writes one, so its counters are the newer should a counters record exist too
        // (which this version never leaves: it writes both kinds' records together).
        let counted = counts.remove(&id);
        let meta = match (rec.counters, counted) {
            (Some(meta), _) => {
                older.push((id.clone(), config_json(&rec.config), meta.clone()));
                meta
            }
            (None, Some(meta)) => meta,
            // Never left by this version's writes (both records go in one batch), but a
            // repair's cut can leave it when one keyspace was flushed and the other not:
            // the event then starts again from its places (the queue's next seq follows
            // them), its totals from zero, rather than the store refusing to open.
            (None, None) => {
                tracing::warn!(event_id = %id,
                    "the event's counters are missing; they start again from its places");
                QueueMeta::default()
            }
        };
        known.insert(id, (rec.config, meta));
    }
    // Counters of no event (never left by this version: a deletion removes both records).
    let orphans: Vec<String> = counts.into_keys().collect();
    if !orphans.is_empty() {
        tracing::warn!(events = ?orphans, "counters without an event's settings are removed");
    }
    let mut ids: Vec<String> = known.keys().cloned().collect();
    ids.sort();
    for id in ids {
        let (config, meta) = known.remove(&id).expect("listed");
        let mut restored: Vec<RestoredPlace> = Vec::new();
        let mut tombstones = Vec::new();
        let mut extensions = Vec::new();
        for kv in places.prefix(event_prefix(&id)) {
            let (k, v) = kv.into_inner()?;
            let tail = &k[id.len() + 1..];
            if tail.len() != 9 {
                anyhow::bail!("the store holds a malformed key in event {id:?}");
            }
            let seq = u64::from_be_bytes(tail[..8].try_into().expect("length checked"));
            let bad = |what: &str, e: postcard::Error| {
                anyhow::anyhow!(
                    "the {what} record of place {seq} in event {id:?} is unreadable: {e}"
                )
            };
            match tail[8] {
                KIND_JOINED => {
                    let (j, proven) = JoinRec::decode(&v).map_err(|e| bad("join", e))?;
                    restored.push(RestoredPlace {
                        seq,
                        nonce: j.nonce,
                        user_id: j.user_id.map(Into::into),
                        proven,
                        metadata: j.metadata.map(Into::into),
                        joined_at: j.joined_at,
                        admitted_at: None,
                        entered_at: None,
                    });
                }
                KIND_ADMITTED | KIND_ENTERED => {
                    let at: Millis = postcard::from_bytes(&v).map_err(|e| bad("state", e))?;
                    // Keys sort by seq then kind, so the join record came just before.
                    match restored.last_mut() {
                        Some(p) if p.seq == seq => {
                            if tail[8] == KIND_ADMITTED {
                                p.admitted_at = Some(at);
                            } else {
                                p.entered_at = Some(at);
                            }
                        }
                        _ => anyhow::bail!(
                            "place {seq} in event {id:?} has a state record but no join record"
                        ),
                    }
                }
                KIND_EXPIRED => {
                    let (nonce, at): (u128, Millis) =
                        postcard::from_bytes(&v).map_err(|e| bad("expiry", e))?;
                    tombstones.push((seq, nonce, at));
                }
                KIND_EXTENDED => {
                    let (count, extra) =
                        sale::read_extension(&v).map_err(|e| bad("extension", e))?;
                    extensions.push((seq, count, extra));
                }
                other => anyhow::bail!(
                    "place {seq} in event {id:?} has a record of unknown kind {other}"
                ),
            }
        }
        total += restored.len() as u64;
        let mut queue = EventQueue::restore(config, meta, restored, tombstones, now);
        let mut codes = Vec::new();
        for kv in invites.prefix(event_prefix(&id)) {
            let (k, v) = kv.into_inner()?;
            let code = std::str::from_utf8(&k[id.len() + 1..])
                .map_err(|_| anyhow::anyhow!("event {id:?} holds a non-UTF-8 invite code"))?;
            let holder: Option<InviteHolder> = postcard::from_bytes(&v).map_err(|e| {
                anyhow::anyhow!("an invite record of event {id:?} is unreadable: {e}")
            })?;
            codes.push((code.into(), holder));
        }
        queue.restore_invites(codes);
        queue.restore_extensions(extensions);
        queue.restore_items(sale::recover_items(items, &id)?);
        out.push((id, queue));
    }
    Ok((
        Recovered {
            events: out,
            places: total,
        },
        (older, orphans),
    ))
}

/// Rewrites records of the older kinds (settings and counters in one) as a settings record
/// and a counters record, in one batch, synced before anything else is written: from then
/// on only the counters' record changes per batch, and an older waitroom refuses the store
/// rather than read counters that no longer change (see `journal_events.rs`).
fn rewrite_older_records(
    db: &Database,
    events: &Keyspace,
    counters: &Keyspace,
    (older, orphans): Rewrite,
) -> anyhow::Result<()> {
    if older.is_empty() && orphans.is_empty() {
        return Ok(());
    }
    let mut batch = db.batch();
    for (id, config, meta) in &older {
        batch.insert(events, id.as_bytes(), encode_settings(config));
        batch.insert(counters, id.as_bytes(), encode_counters(meta));
    }
    for id in &orphans {
        batch.remove(counters, id.as_bytes());
    }
    batch.commit()?;
    db.persist(PersistMode::SyncAll)?;
    tracing::info!(
        events = older.len(),
        "the events' records were rewritten with their counters apart"
    );
    Ok(())
}

struct Writer {
    db: Database,
    events: Keyspace,
    counters: Keyspace,
    places: Keyspace,
    invites: Keyspace,
    items: Keyspace,
    /// Marks of deleted events whose keys are still being removed.
    purges: Keyspace,
    /// Latest settings per event (as its record holds them, JSON): the events that have a
    /// settings record, whose counters a change may write.
    configs: HashMap<String, String>,
    synced: Arc<Synced>,
    /// Scratch space for the wakers a sync calls (see [`Synced::advance`]).
    woken: Vec<std::task::Waker>,
    /// Changes written (and in `sync`, synced) so far.
    done: u64,
    /// The durability watermark and the zeros ahead, kept up to date by each sync.
    syncer: Arc<Mutex<Syncer>>,
}

impl Sink for Writer {
    type Change = Change;

    fn write(&mut self, group: Vec<Change>) -> Result<(), String> {
        Writer::write(self, group).map_err(|e| e.to_string())
    }

    fn buffer(&mut self) -> Result<(), String> {
        self.db
            .persist(PersistMode::Buffer)
            .map_err(|e| e.to_string())
    }

    fn sync(&mut self, all: bool) -> Result<(), String> {
        let mode = if all {
            PersistMode::SyncAll
        } else {
            PersistMode::SyncData
        };
        Writer::sync(self, mode).map_err(|e| e.to_string())
    }

    type Capture = super::journal_sync::Capture;

    fn capture(&mut self) -> Result<Self::Capture, String> {
        Syncer::capture(&self.syncer).map_err(|e| e.to_string())
    }

    fn sync_captured(capture: Self::Capture) -> Result<(), String> {
        capture.finish().map_err(|e| e.to_string())
    }

    fn done(&mut self, n: u64) {
        self.done += n;
        self.synced.advance(self.done, &mut self.woken);
    }

    fn fail(&mut self, error: &str) {
        Writer::fail(self, &error);
    }
}

impl Writer {
    /// Syncs the journal, then records what is now durable in the watermark.
    fn sync(&mut self, mode: PersistMode) -> anyhow::Result<()> {
        self.syncer.lock().sync_now(mode)
    }

    fn fail(&self, e: &dyn std::fmt::Display) {
        // Wakes every waiter so it can see the failure; before the log line, which may
        // take a while to write.
        self.synced.fail();
        tracing::error!(
            error = %e,
            "writing to the store failed; refusing further changes until a restart"
        );
    }

    /// Writes one group as one atomic batch. Later changes to a key override earlier ones
    /// in the group (a batch must not hold one key twice).
    fn write(&mut self, group: Vec<Change>) -> fjall::Result<()> {
        let mut place_ops = PlaceOps::new();
        // An event's counters are encoded once per batch, from its last change in it (a
        // batch of a hundred joins to one event writes one record), and its settings only
        // when a change in the batch set them (`true`).
        let mut event_ops: BTreeMap<Arc<str>, Option<(QueueMeta, bool)>> = BTreeMap::new();
        let mut invite_ops: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        let mut item_ops = sale::Ops::new();
        // Deleted events' marks: set (`true`) by a deletion, removed by its purge's end.
        let mut purge_ops: BTreeMap<Arc<str>, bool> = BTreeMap::new();
        for change in group {
            match change {
                Change::Event {
                    event_id,
                    effects,
                    meta,
                    config,
                } => {
                    for fx in effects {
                        match fx {
                            Effect::Invited { codes } => {
                                for c in codes {
                                    let k = [event_prefix(&event_id), c.as_bytes().to_vec()];
                                    invite_ops.insert(k.concat(), Some(enc(&None::<InviteHolder>)));
                                }
                            }
                            Effect::InviteBound { code, holder } => {
                                let k = [event_prefix(&event_id), code.as_bytes().to_vec()];
                                invite_ops.insert(k.concat(), Some(enc(&Some(holder))));
                            }
                            Effect::Item { id, state } => {
                                sale::record_item(&mut item_ops, &event_id, &id, &state);
                            }
                            fx => apply_effect(&mut place_ops, &event_id, fx),
                        }
                    }
                    let set = config.is_some();
                    if let Some(c) = config {
                        self.configs.insert(event_id.to_string(), config_json(&c));
                    }
                    if self.configs.contains_key(&*event_id) {
                        // Settings set by an earlier change in the batch are still to write.
                        let set = set || matches!(event_ops.get(&event_id), Some(Some((_, true))));
                        event_ops.insert(event_id, Some((meta, set)));
                    }
                }
                Change::Delete { event_id } => {
                    // This batch's own changes to the event are dropped; what earlier
                    // batches wrote is removed by the purge's steps.
                    let prefix = event_prefix(&event_id);
                    let pending: Vec<fjall::Slice> = place_ops
                        .range(fjall::Slice::new(&prefix)..)
                        .take_while(|(k, _)| k.starts_with(&prefix))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in pending {
                        place_ops.insert(k, None);
                    }
                    let pending: Vec<Vec<u8>> = invite_ops
                        .range(prefix.clone()..)
                        .take_while(|(k, _)| k.starts_with(&prefix))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in pending {
                        invite_ops.insert(k, None);
                    }
                    sale::drop_pending_items(&mut item_ops, &event_id);
                    self.configs.remove(&*event_id);
                    purge_ops.insert(event_id.clone(), true);
                    event_ops.insert(event_id, None);
                }
                Change::Purge {
                    event_id,
                    part,
                    keys,
                    last,
                } => {
                    for k in keys {
                        match part {
                            Part::Places => {
                                place_ops.insert(k, None);
                            }
                            Part::Invites => {
                                invite_ops.insert(k.to_vec(), None);
                            }
                            Part::Items => {
                                item_ops.insert(k.to_vec(), None);
                            }
                        }
                    }
                    if last {
                        purge_ops.insert(event_id, false);
                    }
                }
            }
        }
        let mut batch = self.db.batch();
        for (k, v) in place_ops {
            match v {
                Some(v) => batch.insert(&self.places, k, v),
                None => batch.remove(&self.places, k),
            }
        }
        for (k, v) in invite_ops {
            match v {
                Some(v) => batch.insert(&self.invites, k, v),
                None => batch.remove(&self.invites, k),
            }
        }
        for (k, v) in item_ops {
            match v {
                Some(v) => batch.insert(&self.items, k, v),
                None => batch.remove(&self.items, k),
            }
        }
        for (k, op) in event_ops {
            match op.zip(self.configs.get(&*k)) {
                Some(((meta, set), config)) => {
                    if set {
                        batch.insert(&self.events, k.as_bytes(), encode_settings(config));
                    }
                    batch.insert(&self.counters, k.as_bytes(), encode_counters(&meta));
                }
                None => {
                    batch.remove(&self.events, k.as_bytes());
                    batch.remove(&self.counters, k.as_bytes());
                }
            }
        }
        for (id, marked) in purge_ops {
            if marked {
                batch.insert(&self.purges, id.as_bytes(), b"");
            } else {
                batch.remove(&self.purges, id.as_bytes());
            }
        }
        batch.commit()
    }
}

#[cfg(test)]
mod tests;
