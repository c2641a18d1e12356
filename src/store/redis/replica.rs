//! Node-local replicas of the events a node answers `status` for, so that a poll costs no
//! Redis round trip, and the batched renewals those polls owe.
//!
//! **The log.** Every script that changes an event writes its meta once (`flush_meta` in
//! `rules.lua`); that same write appends one entry to the event's change log, a Stream under
//! the event's hash tag (`lua/replica.lua`), with one step per transition (a batch's
//! operations each have theirs): the version `v`, the numbers [`LOG_FIELDS`], and the
//! record of each place the transition changed. Redis runs the script alone, so
//! the log is the exact sequence of the event's states.
//!
//! **The replica.** The first `status` of an event on a node starts a task that reads a
//! snapshot (`replica` op: the numbers and the last log id in one step, the live places
//! in bounded pieces, chunk by chunk: [`read_snapshot`])
//! and then polls the log every [`POLL`] to [`POLL_IDLE`] (at once after this node's own
//! writes) and applies it. The order of the waiting places is the embedded store's Fenwick tree
//! ([`RankIndex`]), so a position is O(log n). A version that jumps (versions trimmed past
//! a lagging node: the log keeps [`LOG_MAXLEN`] to twice as many) or an incarnation that
//! changed (the event deleted and made again) resyncs from a new snapshot.
//!
//! **When the replica answers.** Only when its answer is the one the script would give:
//! - the replica holds this node's own latest write of the event (read your writes: each
//!   script answers its log version; `status` waits up to [`CATCH_UP`] for it, then falls
//!   back), and its last poll of the log succeeded within [`STALE_AFTER`];
//! - `now` is before the meta's `nd`, a time no deadline of the event is earlier than: no
//!   sweep is due, so the script would change nothing before answering (heartbeats only move
//!   deadlines later, so `nd` stays a lower bound whatever other nodes renewed);
//! - the sale has not ended, and no pre-queue is waiting past the opening (the script would
//!   admit it first);
//! - the place is known with this nonce and waits or is admitted (a session's status renews
//!   the session and reads its heartbeat: the script answers it).
//!
//! Anything else falls back to the script, which is exact by construction (unknown seqs
//! included: ended, expired, joined on another node but not yet applied). Changes made on
//! other nodes show once applied: the staleness is the log's delay, measured by the
//! histogram `waitroom_replica_lag_seconds` (apply time − operation time).
//!
//! **Renewals.** A poll the replica answered still renews its place, later: the node keeps
//! the latest poll time of each place per event and sends them in one `renew` script call at least every
//! [`FLUSH`], and before any other script call of the event from this node that could
//! sweep (`now` ≥ the replica's `nd`), so that on one node nothing expires a place whose
//! renewal is still queued; a poll of a place whose deadline may be near is sent at once
//! (see [`URGENT_MS`]), so that the node that sweeps does not expire it first. The script renews a place only if it was still alive at the
//! poll's time, so a late flush never revives one.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::Value;
use tokio::sync::{watch, Notify};

use super::decode::{array, bytes, field, int, text, Malformed};
pub(super) use super::log_meta::prelude;
use super::log_meta::Meta;
use super::{Inner, StoreResult};
use crate::core::rank::RankIndex;
use crate::core::{Millis, PlaceFacts, PlaceKey, PlaceState, PlaceView};
use crate::store::{Notice, StoreError};

/// How often a replica polls its log when nothing woke it: every [`POLL`] while entries
/// come, backing off to [`POLL_IDLE`] on a quiet event (many replicated events on a node
/// must not each cost Redis 200 reads a second).
const POLL: Duration = Duration::from_millis(5);
const POLL_IDLE: Duration = Duration::from_millis(40);
/// Most entries applied per read of the log.
const READ_COUNT: usize = 2_000;
/// A replica whose last successful read is older answers nothing (Redis unreachable).
const STALE_AFTER: Duration = Duration::from_millis(500);
/// How long a `status` waits for the replica to hold this node's own latest write (or its
/// first snapshot) before asking the script.
const CATCH_UP: Duration = Duration::from_millis(50);
/// Renewals collected from polls are sent at least this often. The contract says a poll's
/// renewal is sent at most 0.5 s after it (API.md: a place polled every
/// `waiting_idle_sec` − 0.5 s stays); the loop looks at the time only between its pauses
/// (up to [`POLL_IDLE`]) and reads, and the call takes its round trip: at 500 ms here a
/// renewal went out up to ~540 ms after its poll, and a place polled 2.47 s apart with a 3 s
/// idle limit lapsed between two polls. 400 ms leaves 100 ms for those.
const FLUSH: Duration = Duration::from_millis(400);
/// Most renewals per `renew` call, so one call stays short.
const FLUSH_BATCH: usize = 4_000;
/// A poll of a place whose deadline may be this close is urgent: its renewal goes out
/// within [`URGENT_GAP`] rather than [`FLUSH`]. The node that sweeps would otherwise end
/// the place before the flush came, though the poll was answered in time; on that node
/// itself the sweep sends the queued renewals first, so the same poll kept or lost the
/// place depending on the node. Longer than a flush's worst lateness (`FLUSH`, a pause of
/// the loop and a round trip). The deadline is judged from what this node knows of the
/// place (its join, and this node's own previous poll of it): renewals through other nodes
/// only make it later, so the judgement errs towards urgency. (The event's `nd` is no
/// guide: it is also the admission window's slide and the tombstones' expiry, which in a
/// busy sale are always near, and made every poll urgent.)
const URGENT_MS: Millis = 600;
/// The least time between two flushes of one event, however many polls are urgent.
const URGENT_GAP: Duration = Duration::from_millis(20);
/// How often the record of this node's polls drops the places that are gone.
const PRUNE_POLLED: Duration = Duration::from_secs(10);
/// A replica nobody asked for this long is dropped (its task ends).
const IDLE: Duration = Duration::from_secs(60);
/// How often a replica checks that its log still exists (a deleted event's log is gone).
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// A place record as `encode` in places.lua writes it.
#[derive(Debug, Clone)]
struct Place {
    nonce: u128,
    state: PlaceState,
    joined: Millis,
    adm: Millis,
    ent: Millis,
    user: Option<String>,
    /// A proven join made it (`!` before the user id; `=` for a bare one).
    proven: bool,
    /// Waits in the main line (not the pre-queue): counted in the rank tree.
    ranked: bool,
}

fn parse_place(rec: &[u8]) -> Result<Place, Malformed> {
    let bad = || Malformed("a place record");
    if rec.len() < 18 {
        return Err(bad());
    }
    let nonce = u128::from_be_bytes(rec[..16].try_into().map_err(|_| bad())?);
    let state = match rec[16] {
        b'w' => PlaceState::Waiting,
        b'a' => PlaceState::Admitted,
        b's' => PlaceState::Active,
        _ => return Err(bad()),
    };
    let rest = std::str::from_utf8(&rec[17..]).map_err(|_| bad())?;
    let mut parts = rest.splitn(4, ',');
    let mut num =
        || -> Result<u64, Malformed> { parts.next().and_then(|x| x.parse().ok()).ok_or_else(bad) };
    let (joined, adm, ent) = (num()?, num()?, num()?);
    let user = parts.next().ok_or_else(bad)?;
    Ok(Place {
        nonce,
        state,
        joined,
        adm,
        ent,
        user: (!user.is_empty()).then(|| user[1..].to_string()),
        proven: user.starts_with('!'),
        ranked: false,
    })
}

/// One event's replica.
#[derive(Default)]
struct Replica {
    /// A snapshot was applied and every entry since: the replica may answer.
    synced: bool,
    meta: Meta,
    places: HashMap<u64, Place>,
    rank: RankIndex,
    /// The id of the last log entry applied (the next read starts after it).
    last_id: String,
    /// When a read of the log last succeeded.
    fresh_at: Option<Instant>,
}

impl Replica {
    fn add(&mut self, seq: u64, mut p: Place) {
        p.ranked = p.state == PlaceState::Waiting && !self.meta.in_prequeue(p.joined);
        if p.ranked {
            if self.rank.needs_rebuild(seq) {
                self.rebuild(seq);
            }
            self.rank.insert(seq);
        }
        self.places.insert(seq, p);
    }

    fn remove(&mut self, seq: u64) {
        if let Some(p) = self.places.remove(&seq) {
            if p.ranked {
                self.rank.remove(seq);
            }
        }
    }

    /// A new window for the rank tree that holds `extra` and every ranked place.
    fn rebuild(&mut self, extra: u64) {
        let ranked = || {
            self.places
                .iter()
                .filter(|(_, p)| p.ranked)
                .map(|(s, _)| *s)
        };
        let base = ranked().chain([extra]).min().unwrap_or(extra);
        let top = ranked().chain([extra]).max().unwrap_or(extra);
        self.rank = RankIndex::rebuild(base, top - base + 1, ranked());
    }

    /// Replaces everything with a snapshot (`replica_snapshot` in replica.lua).
    fn load(&mut self, snapshot: Snapshot) {
        let Snapshot {
            meta,
            last_id,
            places,
            whole,
        } = snapshot;
        *self = Replica {
            meta,
            last_id,
            // Read in pieces, the places may be newer than the numbers: the replica answers
            // once a read of the log that began after the last piece brought them in step.
            fresh_at: whole.then(Instant::now),
            ..Replica::default()
        };
        for (seq, mut p) in places {
            p.ranked = p.state == PlaceState::Waiting && !meta.in_prequeue(p.joined);
            self.places.insert(seq, p);
        }
        let ranked: Vec<u64> = self
            .places
            .iter()
            .filter(|(_, p)| p.ranked)
            .map(|(s, _)| *s)
            .collect();
        if let (Some(&lo), Some(&hi)) = (ranked.iter().min(), ranked.iter().max()) {
            self.rank = RankIndex::rebuild(lo, hi - lo + 1, ranked.into_iter());
        }
        self.synced = true;
    }

    /// Applies one log entry, step by step (one step per version: a script call writes
    /// the steps of all its operations as one entry); `Ok(false)` when a step does not
    /// follow the last one applied (a gap or another incarnation): the replica must resync.
    fn apply(&mut self, fields: &[Value]) -> Result<bool, Malformed> {
        if fields.is_empty() {
            return Err(Malformed("a log entry"));
        }
        let mut rest = fields;
        while !rest.is_empty() {
            // A step runs up to the next `v` (its places' seqs are digits).
            let end = rest
                .chunks(2)
                .skip(1)
                .position(|p| matches!(bytes(&p[0]), Ok(Some(b"v"))))
                .map_or(rest.len(), |i| 2 * (i + 1));
            let (step, next) = rest.split_at(end);
            if !self.apply_step(step)? {
                return Ok(false);
            }
            rest = next;
        }
        Ok(true)
    }

    /// Applies one step of a log entry (see [`Replica::apply`]).
    fn apply_step(&mut self, fields: &[Value]) -> Result<bool, Malformed> {
        let mut it = fields.chunks(2);
        let mut next = |name: &[u8]| -> Result<&Value, Malformed> {
            match it.next() {
                Some([k, v]) if bytes(k)? == Some(name) => Ok(v),
                _ => Err(Malformed("a log entry")),
            }
        };
        let v = int(next(b"v")?)? as u64;
        // The time, left out by a step at the same time as the one before it.
        let mut after = it.next();
        let mut t = None;
        if let Some([k, at]) = after {
            if bytes(k)? == Some(b"t") {
                t = Some(int(at)? as u64);
                after = it.next();
            }
        }
        // All the numbers ('m': an event's first entry, or an older waitroom's), or those
        // the transition set ('d', on top of the step before; the incarnation only in an
        // entry's first step, the others being of the same script call), or none: a
        // seq/record pair at once is a step that only added one waiting place (a join's,
        // never an entry's first step), whose waiting count is one more.
        let mut first_place = None;
        let meta = match after {
            Some([k, m]) if bytes(k)? == Some(b"m") => {
                Meta::parse(bytes(m)?.ok_or(Malformed("numbers"))?)?
            }
            Some([k, d]) if bytes(k)? == Some(b"d") => {
                self.meta.patch(bytes(d)?.unwrap_or_default(), v)?
            }
            Some(pair) if seq_of(&pair[0]).is_ok() => {
                first_place = Some(pair);
                self.meta.one_more_waiting(v)
            }
            _ => return Err(Malformed("a log entry")),
        };
        if v != self.meta.lv + 1 || meta.inc != self.meta.inc || meta.lv != v {
            return Ok(false);
        }
        // (Under a test's manual clock the times are not the wall's: nothing to measure.)
        if let Some(t) = t {
            let lag = crate::clock::system_now().saturating_sub(t);
            if lag < 60_000 {
                metrics::histogram!("waitroom_replica_lag_seconds").record(lag as f64 / 1000.0);
            }
        }
        self.meta = meta;
        for pair in first_place.into_iter().chain(it) {
            let [seq, rec] = pair else {
                return Err(Malformed("seq/record pairs"));
            };
            if bytes(seq)? == Some(b"P") {
                let mut places = bytes(rec)?.unwrap_or_default();
                while !places.is_empty() {
                    let (seq, rec) = next_packed(&mut places)?;
                    self.put(seq, rec)?;
                }
            } else {
                self.put(seq_of(seq)?, bytes(rec)?.unwrap_or_default())?;
            }
        }
        Ok(true)
    }

    /// A place as a step left it: its record, or none (empty) once it ended.
    fn put(&mut self, seq: u64, rec: &[u8]) -> Result<(), Malformed> {
        self.remove(seq);
        if !rec.is_empty() {
            self.add(seq, parse_place(rec)?);
        }
        Ok(())
    }

    /// The view the script would answer for `key` at `now`, if the replica can tell it.
    fn view(&self, key: PlaceKey, now: Millis) -> Option<PlaceView> {
        let m = &self.meta;
        if !self.synced || self.fresh_at.is_none_or(|t| t.elapsed() > STALE_AFTER) {
            return None;
        }
        if now >= m.nd || m.sale_ended(now) {
            return None;
        }
        // The opening is due (reached by this clock or recorded as reached) while the
        // pre-queue waits: the script admits it.
        if m.npre > 0 && m.opens > 0 && m.opening_ahead(now).is_none() {
            return None;
        }
        let p = self.places.get(&key.seq).filter(|p| p.nonce == key.nonce)?;
        let pre = p.state == PlaceState::Waiting && m.in_prequeue(p.joined);
        let position = match p.state {
            PlaceState::Waiting if p.ranked => m.npre + self.rank.count_below(key.seq) + 1,
            // Before the opening a pre-queue place has no position to show.
            PlaceState::Waiting if pre && m.opening_ahead(now).is_some() => 0,
            PlaceState::Admitted => 0,
            _ => return None,
        };
        let facts = PlaceFacts {
            key,
            state: p.state,
            user_id: p.user.clone(),
            user_proven: p.proven,
            joined_at: p.joined,
            admitted_at: p.adm,
            entered_at: p.ent,
            last_seen: 0,
            position,
            queue_length: m.nw,
            pre_queue: pre,
            opens_at: m.opening_ahead(now),
            lottery: m.method == 1,
        };
        let ctx = m.ctx(now);
        Some(PlaceView::new(facts, &ctx.timeouts, &ctx.pace, now))
    }
}

/// A replica's starting point as read from Redis.
struct Snapshot {
    meta: Meta,
    last_id: String,
    places: Vec<(u64, Place)>,
    /// Read in one script call: the places are exactly those of `meta` and `last_id`.
    whole: bool,
}

/// Seq/record pairs of a snapshot's piece, added to `out`.
fn snapshot_places(flat: &Value, out: &mut Vec<(u64, Place)>) -> Result<(), Malformed> {
    let flat = array(flat)?;
    out.reserve(flat.len() / 2);
    for pair in flat.chunks(2) {
        let [seq, rec] = pair else {
            return Err(Malformed("seq/record pairs"));
        };
        let seq = seq_of(seq)?;
        out.push((seq, parse_place(bytes(rec)?.ok_or(Malformed("a record"))?)?));
    }
    Ok(())
}

/// Reads a snapshot in bounded pieces, so that no script call holds Redis for the whole
/// event: `replica` (the numbers, the last log id, the first piece of the places), then
/// `replica_places` from the chunk each piece stopped at until the last. `None`: the event
/// is gone.
async fn read_snapshot(inner: &Inner, event_id: &str) -> StoreResult<Option<Snapshot>> {
    let now = crate::clock::system_now();
    let r = inner.run(event_id, "replica", now, &[], None).await?;
    if r.code != super::script::OK {
        return Ok(None);
    }
    let a = array(&r.payload)?;
    let meta = Meta::parse(bytes(field(a, 0)?)?.ok_or(Malformed("numbers"))?)?;
    let last_id = text(field(a, 1)?)?.ok_or(Malformed("a log id"))?;
    let mut places = Vec::new();
    snapshot_places(field(a, 2)?, &mut places)?;
    let mut next = int(field(a, 3)?)?;
    let whole = next < 0;
    while next >= 0 {
        let from = next.to_string();
        let r = inner
            .run(event_id, "replica_places", now, &[from.as_bytes()], None)
            .await?;
        if r.code != super::script::OK {
            return Ok(None);
        }
        let a = array(&r.payload)?;
        snapshot_places(field(a, 0)?, &mut places)?;
        next = int(field(a, 1)?)?;
    }
    Ok(Some(Snapshot {
        meta,
        last_id,
        places,
        whole,
    }))
}

/// The next place of a step's `P` field (a step of more than 1,000 places, `log_append` in
/// `lua/replica.lua`): `<seq>,<length>:<record>`, one after another, a record being bytes.
fn next_packed<'a>(blob: &mut &'a [u8]) -> Result<(u64, &'a [u8]), Malformed> {
    const BAD: Malformed = Malformed("packed places");
    fn number(blob: &mut &[u8], end: u8) -> Result<u64, Malformed> {
        let at = blob.iter().position(|&b| b == end).ok_or(BAD)?;
        let n = std::str::from_utf8(&blob[..at])
            .ok()
            .and_then(|t| t.parse().ok());
        *blob = &blob[at + 1..];
        n.ok_or(BAD)
    }
    let seq = number(blob, b',')?;
    let len = usize::try_from(number(blob, b':')?).map_err(|_| BAD)?;
    let rec = blob.get(..len).ok_or(BAD)?;
    *blob = &blob[len..];
    Ok((seq, rec))
}

fn seq_of(v: &Value) -> Result<u64, Malformed> {
    let s = text(v)?.ok_or(Malformed("a seq"))?;
    s.parse().map_err(|_| Malformed("a seq"))
}

/// One event's replica on this node, its task's signals and the renewals it owes.
struct Entry {
    replica: Mutex<Replica>,
    /// The log version applied so far (0 before the first snapshot).
    applied: watch::Sender<u64>,
    /// The log version of this node's latest write of the event.
    written: Mutex<u64>,
    /// Wakes the task at once (this node wrote, or a status is waiting).
    wake: Notify,
    used_at: Mutex<Instant>,
    /// Waiting places whose polls the replica answered: seq -> time of the latest poll.
    renewals: Mutex<HashMap<u64, Millis>>,
    /// A queued renewal is due at once (see [`URGENT_MS`]).
    urgent: std::sync::atomic::AtomicBool,
    /// Waiting places this node answered a poll of: seq -> time of the latest (kept after
    /// the flush, unlike `renewals`), what [`URGENT_MS`] judges a deadline from.
    polled: Mutex<HashMap<u64, Millis>>,
    /// The log ended before what the replica applied (a failover lost writes): the next
    /// snapshot lowers `written` to what Redis holds.
    set_back: std::sync::atomic::AtomicBool,
}

/// Registers the replicas' metrics at zero (every `answer` of the status counter): a node
/// exports them before its first replica, rather than nothing (a missing series reads "no
/// data" on a dashboard, and fires `absent()`).
pub(super) fn register_metrics() {
    let _ = metrics::histogram!("waitroom_replica_lag_seconds");
    for answer in ["replica", "script"] {
        metrics::counter!("waitroom_replica_status_total", "answer" => answer).increment(0);
    }
    metrics::counter!("waitroom_replica_resyncs_total").increment(0);
}

/// This node's replicas, by event.
#[derive(Default)]
pub(super) struct Replicas {
    map: Mutex<HashMap<String, Arc<Entry>>>,
}

impl Replicas {
    /// Notes the log version a script of this node answered (the fifth field of its reply);
    /// a `delete` drops the replica at once.
    pub(super) fn wrote(&self, event_id: &str, op: &str, reply: &Value) {
        if op == "delete" {
            self.forget(event_id);
            return;
        }
        let Some(entry) = self.map.lock().get(event_id).cloned() else {
            return;
        };
        let lv = match reply {
            Value::Array(a) => a.get(4).and_then(|v| int(v).ok()).unwrap_or(0),
            _ => 0,
        };
        let mut w = entry.written.lock();
        if lv as u64 > *w {
            *w = lv as u64;
            drop(w);
            entry.wake.notify_one();
        }
    }

    /// Drops the event's replica and its queued renewals (the event was deleted).
    pub(super) fn forget(&self, event_id: &str) {
        self.map.lock().remove(event_id);
    }

    fn get(&self, event_id: &str) -> Option<Arc<Entry>> {
        self.map.lock().get(event_id).cloned()
    }
}

/// `status` from this node's replica of the event, or `None` when only the script can
/// answer it (see the module doc). Starts the replica on the event's first status.
pub(super) async fn status(
    inner: &Arc<Inner>,
    event_id: &str,
    key: PlaceKey,
    now: Millis,
) -> Option<PlaceView> {
    if !inner.options.replica {
        return None;
    }
    let entry = {
        let mut map = inner.replicas.map.lock();
        match map.get(event_id) {
            Some(e) => e.clone(),
            None => {
                let e = Arc::new(Entry {
                    replica: Mutex::new(Replica::default()),
                    applied: watch::channel(0).0,
                    written: Mutex::new(0),
                    wake: Notify::new(),
                    used_at: Mutex::new(Instant::now()),
                    renewals: Mutex::new(HashMap::new()),
                    urgent: std::sync::atomic::AtomicBool::new(false),
                    polled: Mutex::new(HashMap::new()),
                    set_back: std::sync::atomic::AtomicBool::new(false),
                });
                map.insert(event_id.to_string(), e.clone());
                // The task ends by itself (store dropped or closed, event deleted, idle).
                tokio::spawn(follow(
                    Arc::downgrade(inner),
                    event_id.to_string(),
                    e.clone(),
                ));
                e
            }
        }
    };
    *entry.used_at.lock() = Instant::now();
    let want = (*entry.written.lock()).max(1);
    if *entry.applied.borrow() < want {
        entry.wake.notify_one();
        let mut rx = entry.applied.subscribe();
        let caught = tokio::time::timeout(CATCH_UP, rx.wait_for(|&v| v >= want)).await;
        if !matches!(caught, Ok(Ok(_))) {
            metrics::counter!("waitroom_replica_status_total", "answer" => "script").increment(1);
            return None;
        }
    }
    let (view, widle) = {
        let r = entry.replica.lock();
        (r.view(key, now), r.meta.widle)
    };
    match &view {
        Some(v) => {
            if v.status == PlaceState::Waiting {
                {
                    let mut r = entry.renewals.lock();
                    let at = r.entry(key.seq).or_insert(now);
                    *at = (*at).max(now);
                }
                // The latest renewal this node knows of: the join, or its own last poll.
                let before = entry.polled.lock().insert(key.seq, now).unwrap_or(0);
                let known = before.max(v.joined_at);
                if known.saturating_add(widle) < now.saturating_add(URGENT_MS)
                    && !entry.urgent.swap(true, std::sync::atomic::Ordering::SeqCst)
                {
                    // Once per flush: a wake-up per urgent poll would keep the loop from
                    // ever pausing between its reads.
                    entry.wake.notify_one();
                }
            }
            metrics::counter!("waitroom_replica_status_total", "answer" => "replica").increment(1);
        }
        None => {
            metrics::counter!("waitroom_replica_status_total", "answer" => "script").increment(1)
        }
    }
    view
}

/// A heartbeat from this node's replica: a status without its answer, so the replica renews
/// it the same way (queued, dated by the beat). `false`: only the script can take it.
pub(super) async fn heartbeat(
    inner: &Arc<Inner>,
    event_id: &str,
    key: PlaceKey,
    now: Millis,
) -> bool {
    status(inner, event_id, key, now).await.is_some()
}

impl Inner {
    /// Sends the renewals queued for the event before a script call of this node at `now`
    /// that could sweep it (`now` at or past the replica's `nd`, no synced replica, or a
    /// `put`, which may change the timeouts).
    pub(super) async fn renewals_before(
        &self,
        event_id: &str,
        op: &str,
        now: Millis,
    ) -> StoreResult<()> {
        if matches!(op, "renew" | "replica" | "replica_places") {
            return Ok(());
        }
        let Some(entry) = self.replicas.get(event_id) else {
            return Ok(());
        };
        // A `put` sweeps with the new settings, which may bring a deadline before `nd`: it
        // sees every renewal first, as the embedded store sees every poll. (A shorter
        // waiting idle counts from the change at the earliest, rules.lua `wfloor`, so no
        // renewal queued at the change decides a place's fate.)
        let safe = op != "put" && {
            let r = entry.replica.lock();
            r.synced && now < r.meta.nd
        };
        if safe || entry.renewals.lock().is_empty() {
            return Ok(());
        }
        // Boxed: `run` calls this, and this calls `run` (never recursively at run time).
        Box::pin(self.flush_renewals(event_id, &entry)).await
    }

    /// Sends the event's queued renewals, in batches of at most [`FLUSH_BATCH`].
    async fn flush_renewals(&self, event_id: &str, entry: &Entry) -> StoreResult<()> {
        let pending: Vec<(u64, Millis)> = entry.renewals.lock().drain().collect();
        for (i, chunk) in pending.chunks(FLUSH_BATCH).enumerate() {
            let args: Vec<String> = chunk
                .iter()
                .flat_map(|(seq, at)| [seq.to_string(), at.to_string()])
                .collect();
            let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            let now = chunk.iter().map(|(_, at)| *at).max().unwrap_or(0);
            match self.run(event_id, "renew", now, &args, None).await {
                Ok(_) => {}
                // Deleted meanwhile: nothing left to renew.
                Err(StoreError::Queue(_)) => {}
                Err(e) => {
                    // Keep them for the next flush: Redis may be back by then.
                    let mut r = entry.renewals.lock();
                    for &(seq, at) in &pending[i * FLUSH_BATCH..] {
                        let t = r.entry(seq).or_insert(at);
                        *t = (*t).max(at);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Drops every replica (their tasks end) and sends their queued renewals (at shutdown),
    /// [`CLOSE_IN_FLIGHT`](super::close::CLOSE_IN_FLIGHT) events at once (`close.rs`
    /// bounds the whole).
    pub(super) async fn close_replicas(&self) {
        use futures_util::StreamExt as _;
        let entries: Vec<(String, Arc<Entry>)> = self.replicas.map.lock().drain().collect();
        futures_util::stream::iter(entries)
            .for_each_concurrent(super::close::CLOSE_IN_FLIGHT, |(id, e)| async move {
                if let Err(err) = self.flush_renewals(&id, &e).await {
                    tracing::debug!(event = %id, error = %err, "could not send the renewals");
                }
            })
            .await;
    }

    fn log_key(&self, event_id: &str) -> String {
        let at = super::script::KEYS.iter().position(|(k, _)| *k == "lg");
        self.keys(event_id)[at.expect("the log is a key of the script")].clone()
    }

    /// Reads the log after `after`: the entries' field lists, oldest first.
    async fn read_log(&self, key: &str, after: &str) -> StoreResult<Vec<(String, Vec<Value>)>> {
        let mut conn = self.connection().await?;
        let reply: Value = self
            .bounded(
                redis::cmd("XREAD")
                    .arg("COUNT")
                    .arg(READ_COUNT)
                    .arg("STREAMS")
                    .arg(key)
                    .arg(after)
                    .query_async(&mut conn),
            )
            .await?;
        Ok(log_entries(&reply)?)
    }
}

/// The entries of an `XREAD` reply on one stream (RESP2 arrays or RESP3 maps).
fn log_entries(reply: &Value) -> Result<Vec<(String, Vec<Value>)>, Malformed> {
    let streams: Vec<&Value> = match reply {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(a) => a.iter().collect(),
        Value::Map(m) => m.iter().map(|(_, v)| v).collect(),
        _ => return Err(Malformed("an XREAD reply")),
    };
    let mut out = Vec::new();
    for s in streams {
        let entries = match s {
            Value::Array(a) if a.len() == 2 => array(&a[1])?,
            other => array(other)?,
        };
        for e in entries {
            let e = array(e)?;
            let id = text(field(e, 0)?)?.ok_or(Malformed("an entry id"))?;
            let fields = match field(e, 1)? {
                Value::Map(m) => m.iter().flat_map(|(k, v)| [k.clone(), v.clone()]).collect(),
                other => array(other)?.to_vec(),
            };
            out.push((id, fields));
        }
    }
    Ok(out)
}

/// The task behind one replica: snapshot, then the log, the renewals' flushes, until the
/// store is gone, the event deleted or nobody asked for [`IDLE`].
async fn follow(inner: Weak<Inner>, event_id: String, entry: Arc<Entry>) {
    let mut flushed_at = Instant::now();
    let mut pruned_at = Instant::now();
    let mut pause = POLL;
    let mut checked_at = Instant::now();
    let mut notices = match inner.upgrade() {
        Some(i) => i.notices.subscribe(),
        None => return,
    };
    loop {
        let Some(inner) = inner.upgrade() else { return };
        let gone = |inner: &Inner| {
            inner
                .replicas
                .map
                .lock()
                .get(&event_id)
                .is_none_or(|e| !Arc::ptr_eq(e, &entry))
        };
        if gone(&inner) || entry.used_at.lock().elapsed() > IDLE {
            let _ = inner.flush_renewals(&event_id, &entry).await;
            let mut map = inner.replicas.map.lock();
            if map.get(&event_id).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
                map.remove(&event_id);
            }
            return;
        }
        // Another node deleted the event: its log went with it.
        loop {
            match notices.try_recv() {
                Ok(Notice::EventDeleted { event_id: id }) if *id == *event_id => {
                    entry.replica.lock().synced = false;
                    inner.replicas.forget(&event_id);
                }
                Ok(_) | Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => {}
                Err(_) => break,
            }
        }
        let since = flushed_at.elapsed();
        if since >= FLUSH
            || (since >= URGENT_GAP && entry.urgent.load(std::sync::atomic::Ordering::SeqCst))
        {
            entry
                .urgent
                .store(false, std::sync::atomic::Ordering::SeqCst);
            flushed_at = Instant::now();
            if let Err(e) = inner.flush_renewals(&event_id, &entry).await {
                tracing::debug!(event = %event_id, error = %e, "could not send the renewals");
            }
        }
        if pruned_at.elapsed() >= PRUNE_POLLED {
            pruned_at = Instant::now();
            let r = entry.replica.lock();
            entry.polled.lock().retain(|seq, _| {
                r.places
                    .get(seq)
                    .is_some_and(|p| p.state == PlaceState::Waiting)
            });
        }
        let synced = entry.replica.lock().synced;
        let progressed = if synced {
            read(&inner, &event_id, &entry, &mut checked_at).await
        } else {
            snapshot(&inner, &event_id, &entry).await
        };
        drop(inner);
        if progressed {
            pause = POLL;
        } else {
            // An urgent renewal waiting out the gap: back when it may go, not later.
            let nap = if entry.urgent.load(std::sync::atomic::Ordering::SeqCst) {
                pause.min(URGENT_GAP.saturating_sub(flushed_at.elapsed()))
            } else {
                pause
            };
            tokio::select! {
                _ = entry.wake.notified() => pause = POLL,
                _ = tokio::time::sleep(nap) => pause = (pause * 2).min(POLL_IDLE),
            }
        }
    }
}

/// Loads a snapshot; whether it did.
async fn snapshot(inner: &Inner, event_id: &str, entry: &Entry) -> bool {
    match read_snapshot(inner, event_id).await {
        Ok(Some(s)) => {
            let mut replica = entry.replica.lock();
            replica.load(s);
            let lv = replica.meta.lv.max(1);
            // After a set-back log, this node's own writes past the snapshot are gone from
            // Redis (a failover lost them): a status must not wait for the replica to reach
            // them. Only then: otherwise a write answered while the snapshot was read is
            // one the replica must still reach before answering (read-your-writes).
            if entry
                .set_back
                .swap(false, std::sync::atomic::Ordering::AcqRel)
            {
                let mut written = entry.written.lock();
                *written = (*written).min(lv);
            }
            entry.applied.send_replace(lv);
            metrics::counter!("waitroom_replica_resyncs_total").increment(1);
            true
        }
        // No such event (yet, or any more): the script answers its statuses. The replica
        // goes, and a waiting status is let go at once (the view of an unsynced replica is
        // always `None`).
        Ok(None) => {
            inner.replicas.forget(event_id);
            entry.applied.send_replace(u64::MAX);
            false
        }
        Err(e) => {
            tracing::debug!(event = event_id, error = %e, "could not read a snapshot");
            false
        }
    }
}

/// Whether a log whose last entry is `tail` (`None`: empty or gone) no longer holds the
/// entry `applied` this replica read last. Stream ids are `ms-seq` and only grow.
fn log_went_back(tail: Option<&str>, applied: &str) -> bool {
    let id = |s: &str| -> Option<(u64, u64)> {
        let (ms, seq) = s.split_once('-').unwrap_or((s, "0"));
        Some((ms.parse().ok()?, seq.parse().ok()?))
    };
    match (tail, id(applied)) {
        (_, None) | (_, Some((0, 0))) => false,
        (None, Some(_)) => true,
        (Some(t), Some(a)) => id(t).is_some_and(|t| t < a),
    }
}

/// Reads and applies the log; whether anything was applied.
async fn read(inner: &Inner, event_id: &str, entry: &Entry, checked_at: &mut Instant) -> bool {
    let key = inner.log_key(event_id);
    let after = entry.replica.lock().last_id.clone();
    let started = Instant::now();
    let entries = match inner.read_log(&key, &after).await {
        Ok(e) => e,
        Err(e) => {
            // Redis is away: the replica stops answering at once rather than when its
            // last read ages past the bound.
            entry.replica.lock().fresh_at = None;
            tracing::debug!(event = %event_id, error = %e, "could not read the change log");
            return false;
        }
    };
    if entries.is_empty() && checked_at.elapsed() >= CHECK_EVERY {
        *checked_at = Instant::now();
        // A log that vanished (the event deleted; a notice lost), or that ends before what
        // this replica applied (a failover to a replica of Redis that had not received the
        // last writes: they are lost, and no new entry may come to show it on a quiet
        // event): start over from a snapshot.
        if let Ok(mut conn) = inner.connection().await {
            let last: StoreResult<Value> = inner
                .bounded(
                    redis::cmd("XREVRANGE")
                        .arg(&key)
                        .arg("+")
                        .arg("-")
                        .arg("COUNT")
                        .arg(1)
                        .query_async(&mut conn),
                )
                .await;
            if let Ok(last) = last {
                let tail = match &last {
                    Value::Array(a) => a.first().and_then(|e| match e {
                        Value::Array(e) => e.first().and_then(|id| text(id).ok().flatten()),
                        _ => None,
                    }),
                    _ => None,
                };
                if log_went_back(tail.as_deref(), &after) {
                    entry
                        .set_back
                        .store(true, std::sync::atomic::Ordering::Release);
                    entry.replica.lock().synced = false;
                    return false;
                }
            }
        }
    }
    let mut replica = entry.replica.lock();
    let n = entries.len();
    // Fresh only when this read reached the end of the log: the replica then held
    // everything written before the read began.
    if n < READ_COUNT {
        replica.fresh_at = Some(started);
    }
    for (id, fields) in entries {
        match replica.apply(&fields) {
            Ok(true) => replica.last_id = id,
            Ok(false) | Err(_) => {
                // A gap (trimmed past this node) or another incarnation: resync.
                replica.synced = false;
                return false;
            }
        }
    }
    if n > 0 {
        entry.applied.send_replace(replica.meta.lv.max(1));
    }
    n > 0
}

#[cfg(test)]
mod tests;
