//! [`EventQueue`]: every place of one event and the rules that move them.
//!
//! A place is `Waiting` → `Admitted` (a slot is reserved) → `Active` (entered, holds a
//! session) → ended (`Completed`, `Left`, `Expired`, `Cleared`). The invariants that every
//! operation keeps, and that the property tests check after every step:
//!
//! - no admission takes admitted + active above capacity (lowering capacity lets running
//!   sessions finish; it admits nobody until they fit again);
//! - admission is FIFO by join sequence;
//! - a place's position is exactly the number of waiting places that joined before it, + 1;
//! - a user holds at most one live place;
//! - every operation first ends the places whose deadline has passed, so a ghost never counts
//!   in a position once its deadline is behind `now`, even before the background sweep runs.
//!
//! Mutating operations append the state changes they made to an `Effect` list: the durable
//! store writes them to its log and the notifier pushes them to live clients.

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use super::deadlines::DeadlineHeap;
use super::holds::Inventory;
use super::pace::{Bucket, Holds, RATE_WINDOW_MS};
use super::places::{Place, PlaceTable, ShardedMap, UserIndex};
use super::rank::RankIndex;
use super::schedule::PreQueue;
use super::schedule::{in_prequeue, QueueingMethod};
use super::view::{EventCounts, PlaceFacts, Timeouts};
use super::{
    Access, Effect, EndReason, EventConfig, EventFigures, HeadEntry, InviteHolder, Millis, Pace,
    PlaceKey, PlaceState, PlaceView, QueueError,
};

/// How long the token of an expired place keeps answering `TOKEN_EXPIRED` rather than
/// `TOKEN_NOT_FOUND`. Bounded so that a long sale does not accumulate tombstones forever.
pub const EXPIRED_RETENTION_MS: Millis = 3600 * 1000;

/// The counters of an event that outlive its places; persisted beside the config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct QueueMeta {
    pub next_seq: u64,
    pub completed: u64,
    pub left: u64,
    pub expired: u64,
    pub joins: u64,
    pub admissions: u64,
    pub wait_sum_ms: u64,
    pub session_sum_ms: u64,
    pub session_count: u64,
}

/// A live place as read back from disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredPlace {
    pub seq: u64,
    pub nonce: u128,
    pub user_id: Option<Box<str>>,
    /// Whether the joiner proved it is `user_id`; records from before the flag existed read
    /// as unproven.
    pub proven: bool,
    pub metadata: Option<Box<str>>,
    pub joined_at: Millis,
    pub admitted_at: Option<Millis>,
    pub entered_at: Option<Millis>,
}

#[derive(Debug, Clone)]
pub struct EventQueue {
    config: EventConfig,
    next_seq: u64,
    places: PlaceTable,
    /// Live places by user id, for the one-place-per-user rule.
    users: UserIndex,
    /// The waiting places after the pre-queue, by join sequence.
    rank: RankIndex,
    /// The waiting places of the pre-queue, in shuffle order (`queue_schedule.rs`).
    pre: PreQueue,
    /// The latest `joined_at` of a place put in the pre-queue since it was last empty: no
    /// waiting place of the pre-queue joined later (`check_config`). Not persisted: a
    /// restore rebuilds it from the places that wait.
    pre_last_join: Millis,
    admitted: u64,
    active: u64,
    completed: u64,
    left: u64,
    expired: u64,
    joins: u64,
    admissions: u64,
    deadlines: DeadlineHeap,
    /// Expired places still answered with `TOKEN_EXPIRED`, pruned in time order.
    tombstones: ShardedMap<u128>,
    tombstone_order: VecDeque<(Millis, u64)>,
    bucket: Bucket,
    /// Admission times in the last minute, oldest first.
    window: VecDeque<Millis>,
    first_admission_at: Option<Millis>,
    wait_sum_ms: u64,
    session_sum_ms: u64,
    session_count: u64,
    /// Slot-time of admitted and active places, behind the ETA. Not persisted: after a
    /// restart the estimate learns again (as the admission window does).
    holds: Holds,
    /// Invite codes, each with whom it seats once used.
    invites: HashMap<Box<str>, Option<InviteHolder>>,
    /// Seats and other items, and the sessions that hold them (`sale.rs`).
    inventory: Inventory,
    /// Extended sessions: how many times, and the milliseconds added to their maximum.
    extensions: HashMap<u64, (u32, Millis)>,
    /// The sale ended (as of the last operation's `now`): waiting places are gone.
    closed: bool,
    /// The earliest deadlines after a lowered timeout ([`Floors`]).
    floors: Floors,
}

/// The earliest deadlines a lowered timeout leaves places, so that none ends before what
/// it was told (0: never lowered). The Redis rules keep the same (rules.lua `wfloor`,
/// `rkb`, `rkept`, `rfloor`). Not persisted (kept small on purpose: they matter for a
/// minute or a window after a change): a restart starts every idle period afresh, which
/// covers the waiting floor, but applies a lowered ready window at once to the places
/// admitted before it (API.md says so).
#[derive(Debug, Clone, Copy, Default)]
struct Floors {
    /// A waiting place's, set when `waiting_idle_sec` is lowered (view.rs
    /// `lowered_idle_floor`).
    waiting: Millis,
    /// What lowerings of `ready_ttl_sec` promised the admitted places (view.rs
    /// `ReadyKept`).
    ready: super::view::ReadyKept,
}

/// What a joiner showed besides a user id.
#[derive(Debug, Clone, Copy, Default)]
pub struct JoinProof<'a> {
    /// The caller proved it is the user (a user token, or the site's server key). Only then
    /// does a repeat join get the user's live place back; otherwise it is `AlreadyJoined`,
    /// so knowing someone's user id is not enough to take their place. A proven join never
    /// adopts an unproven place of its user either: it ends it and makes a new one.
    pub proven: bool,
    /// The invite code, for an invite-only event.
    pub invite: Option<&'a str>,
}

impl EventQueue {
    pub fn new(config: EventConfig) -> Self {
        EventQueue {
            config,
            next_seq: 1,
            places: PlaceTable::default(),
            users: UserIndex::default(),
            rank: RankIndex::default(),
            pre: PreQueue::default(),
            pre_last_join: 0,
            admitted: 0,
            active: 0,
            completed: 0,
            left: 0,
            expired: 0,
            joins: 0,
            admissions: 0,
            deadlines: DeadlineHeap::default(),
            tombstones: ShardedMap::default(),
            tombstone_order: VecDeque::new(),
            bucket: Bucket::default(),
            window: VecDeque::new(),
            first_admission_at: None,
            wait_sum_ms: 0,
            session_sum_ms: 0,
            session_count: 0,
            holds: Holds::default(),
            invites: HashMap::new(),
            inventory: Inventory::default(),
            extensions: HashMap::new(),
            closed: false,
            floors: Floors::default(),
        }
    }

    pub fn config(&self) -> &EventConfig {
        &self.config
    }

    /// The counters to persist beside the config.
    pub fn meta(&self) -> QueueMeta {
        QueueMeta {
            next_seq: self.next_seq,
            completed: self.completed,
            left: self.left,
            expired: self.expired,
            joins: self.joins,
            admissions: self.admissions,
            wait_sum_ms: self.wait_sum_ms,
            session_sum_ms: self.session_sum_ms,
            session_count: self.session_count,
        }
    }

    /// Rebuilds a queue from what was persisted. Heartbeats are not persisted, so every
    /// waiting place and every session gets a fresh idle grace period from `now`; ready
    /// windows and session maxima keep their deadlines. Expired places within their
    /// retention keep answering `TOKEN_EXPIRED`: each tombstone is `(seq, nonce, noticed_at)`,
    /// the retention counting from when the expiry was noticed (`Effect::Ended::noticed_at`). Nothing is ended or admitted here: the
    /// first operation or tick does that, and its effects are persisted like any other.
    pub fn restore(
        config: EventConfig,
        meta: QueueMeta,
        places: impl IntoIterator<Item = RestoredPlace>,
        tombstones: impl IntoIterator<Item = (u64, u128, Millis)>,
        now: Millis,
    ) -> Self {
        let mut q = EventQueue::new(config);
        q.bucket = Bucket::restored(now);
        q.next_seq = meta.next_seq.max(1);
        q.completed = meta.completed;
        q.left = meta.left;
        q.expired = meta.expired;
        q.joins = meta.joins;
        q.admissions = meta.admissions;
        q.wait_sum_ms = meta.wait_sum_ms;
        q.session_sum_ms = meta.session_sum_ms;
        q.session_count = meta.session_count;
        let places = places.into_iter();
        // Sized once: growing a million-entry map step by step doubles the peak memory
        // and a good part of the restart time.
        q.places.reserve(places.size_hint().0);
        let mut waiting = Vec::with_capacity(places.size_hint().0);
        for r in places {
            let state = match (r.admitted_at, r.entered_at) {
                (_, Some(_)) => PlaceState::Active,
                (Some(_), None) => PlaceState::Admitted,
                (None, None) => PlaceState::Waiting,
            };
            match state {
                PlaceState::Waiting if in_prequeue(q.config.opens_at, r.joined_at) => {}
                PlaceState::Waiting => waiting.push(r.seq),
                PlaceState::Admitted => q.admitted += 1,
                PlaceState::Active => q.active += 1,
            }
            q.next_seq = q.next_seq.max(r.seq + 1);
            if let Some(u) = &r.user_id {
                q.users.insert(u, r.seq);
            }
            let mut p = Place {
                nonce: r.nonce,
                proven: r.proven && r.user_id.is_some(),
                user_id: r.user_id,
                metadata: r.metadata,
                joined_at: r.joined_at,
                last_seen: now,
                admitted_at: r.admitted_at.unwrap_or(0),
                entered_at: r.entered_at.unwrap_or(0),
                state,
                sched: 0,
            };
            p.sched = Self::deadline_of(&q.config, &p, 0, q.floors);
            if state == PlaceState::Waiting && in_prequeue(q.config.opens_at, p.joined_at) {
                q.line_insert(r.seq, p.joined_at);
            }
            q.places.insert(r.seq, p);
        }
        // The admissions of the last minute that are still admitted or active, so that
        // `admitted_last_minute` does not read as if nobody had been let in (those whose
        // session already ended are not known).
        let mut recent: Vec<Millis> = q
            .places
            .values()
            .filter(|p| p.state != PlaceState::Waiting)
            .map(|p| p.admitted_at)
            .filter(|&t| t <= now && t + RATE_WINDOW_MS > now)
            .collect();
        recent.sort_unstable();
        q.window.extend(recent);
        waiting.sort_unstable();
        let base = waiting.first().copied().unwrap_or(q.next_seq);
        q.rank = RankIndex::rebuild(base, q.next_seq - base + 1, waiting.into_iter());
        q.deadlines = DeadlineHeap::from_entries(q.places.iter().map(|(s, p)| (p.sched, s)));
        let mut tombs: Vec<_> = tombstones.into_iter().collect();
        tombs.sort_unstable_by_key(|t| t.2);
        for (seq, nonce, at) in tombs {
            q.tombstones.insert(seq, nonce);
            q.tombstone_order.push_back((at, seq));
        }
        q
    }

    pub fn waiting(&self) -> u64 {
        self.waiting_len()
    }

    /// Replaces the settings. Deadlines are re-filed (timeouts may have shrunk) and the
    /// queue is re-admitted (capacity may have grown, the event may be resumed).
    pub fn set_config(&mut self, config: EventConfig, now: Millis, fx: &mut Vec<Effect>) {
        // What fell due under the old settings ends under them.
        self.advance(now, fx);
        // The record of an end by `closes_at` is the queue's, not the new settings': it
        // stays (and ends nothing if the new `closes_at` is later than it).
        let end_seen_at = self.config.end_seen_at;
        // A shorter `waiting_idle_sec` ends no waiting place before a poller told the old
        // interval could be back (view.rs `lowered_idle_floor`): a live stream renews its
        // place at the change (live.rs `settings`), a poller when it comes back as told,
        // and their last sign of life, at the old period, may be older than the new value.
        // Ending those places at once lost every follower. (The Redis rules keep the same
        // floor: `wfloor`.)
        let old = Timeouts::of(&self.config);
        let floor = (config.waiting_idle_sec < self.config.waiting_idle_sec)
            .then(|| super::view::lowered_idle_floor(&old, now));
        // So does a shorter `ready_ttl_sec` end no admitted place before the window it was
        // told, nor before a poller told the old interval could be back to learn of its
        // turn (view.rs `ReadyKept`; rules.lua `rkb`).
        let ready_lowered = config.ready_ttl_sec < self.config.ready_ttl_sec;
        self.config = EventConfig {
            end_seen_at,
            ..config
        };
        self.note_end(now);
        self.closed = self.sale_over(now);
        if let Some(floor) = floor {
            self.floors.waiting = self.floors.waiting.max(floor);
        }
        if ready_lowered {
            self.floors.ready = self.floors.ready.lowered(&old, now);
        }
        self.deadlines.clear();
        let mut entries = Vec::with_capacity(self.places.len());
        for (seq, p) in self.places.iter_mut() {
            let extra = self.extensions.get(&seq).map_or(0, |e| e.1);
            let d = Self::deadline_of(&self.config, p, extra, self.floors);
            p.sched = d;
            entries.push((d, seq));
        }
        self.deadlines = DeadlineHeap::from_entries(entries);
        self.expire_due(now, fx);
        self.admit(now, fx);
    }

    /// `extra`: what extensions added to the session's maximum; `floors`: the earliest
    /// deadlines after a lowered timeout.
    fn deadline_of(c: &EventConfig, p: &Place, extra: Millis, floors: Floors) -> Millis {
        let mut t = Timeouts::of(c);
        t.session_max_ms += extra;
        t.ready_kept = floors.ready;
        let d = t.deadline(p.state, p.last_seen, p.admitted_at, p.entered_at);
        match p.state {
            PlaceState::Waiting => d.max(floors.waiting),
            _ => d,
        }
    }

    /// The place's timeouts: the event's, with its session's extensions.
    fn timeouts_of(&self, seq: u64) -> Timeouts {
        let mut t = Timeouts::of(&self.config);
        t.session_max_ms += self.extensions.get(&seq).map_or(0, |e| e.1);
        // The view's `enter_within_sec` counts down to the deadline kept.
        t.ready_kept = self.floors.ready;
        t
    }

    /// Files the place's current deadline if it is earlier than the one on file.
    fn schedule(&mut self, seq: u64) {
        let extra = self.extensions.get(&seq).map_or(0, |e| e.1);
        if let Some(p) = self.places.get_mut(&seq) {
            let d = Self::deadline_of(&self.config, p, extra, self.floors);
            if d < p.sched {
                p.sched = d;
                self.deadlines.push((d, seq));
            }
        }
    }

    /// Ends every place whose deadline is at or before `now` and admits into the slots that
    /// freed. Called first by every operation.
    ///
    /// It admits only when something ended: every other source of room (leave, complete,
    /// a config change) admits in the operation that made it, and fresh rate budget is
    /// spent by [`Self::tick`], which the scheduler runs exactly when the next token is due.
    /// Keeping reads from admitting also lets tests see a slot that an operation failed to
    /// hand on.
    fn advance(&mut self, now: Millis, fx: &mut Vec<Effect>) {
        self.note_opening(now);
        self.note_end(now);
        self.closed = self.sale_over(now);
        // Past the opening, a pre-queue still waiting is the opening itself, not yet seen
        // by an operation: any operation admits it, whichever comes first after `opens_at`.
        if self.expire_due(now, fx) || self.opening_due(now) {
            self.admit(now, fx);
        }
    }

    /// Ends what is due; answers whether anything ended.
    fn expire_due(&mut self, now: Millis, fx: &mut Vec<Effect>) -> bool {
        let mut ended = false;
        while let Some((at, seq)) = self.deadlines.peek() {
            if at > now {
                break;
            }
            self.deadlines.pop();
            let Some(p) = self.places.get_mut(&seq) else {
                continue;
            };
            if p.sched != at {
                continue; // superseded by an earlier entry that was already handled
            }
            let extra = self.extensions.get(&seq).map_or(0, |e| e.1);
            let d = Self::deadline_of(&self.config, p, extra, self.floors);
            if d <= now {
                self.end(seq, EndReason::Expired, d, now, fx);
                ended = true;
            } else {
                p.sched = d;
                self.deadlines.push((d, seq));
            }
        }
        while let Some(&(at, seq)) = self.tombstone_order.front() {
            if at + EXPIRED_RETENTION_MS > now {
                break;
            }
            self.tombstone_order.pop_front();
            self.tombstones.remove(&seq);
            fx.push(Effect::Forgotten { seq });
        }
        while self
            .window
            .front()
            .is_some_and(|&t| t + RATE_WINDOW_MS <= now)
        {
            self.window.pop_front();
        }
        ended
    }

    fn admit(&mut self, now: Millis, fx: &mut Vec<Effect>) {
        // After the end of the sale nobody waiting is let in (`core::lifecycle`).
        if self.config.paused || self.before_opening(now) || self.sale_over(now) {
            return;
        }
        let (cap, rate) = self.limits();
        while self.admitted + self.active < cap && self.waiting_len() > 0 {
            if let Some(rate) = rate {
                self.bucket.refill(rate, now);
                if self.bucket.tokens < 1.0 {
                    break;
                }
                self.bucket.tokens -= 1.0;
            }
            let seq = self.line_next().expect("somebody waits");
            let joined_at = self.places[&seq].joined_at;
            self.line_remove(seq, joined_at);
            self.holds.accrue(self.admitted + self.active, now);
            let p = self.places.get_mut(&seq).expect("ranked places exist");
            p.state = PlaceState::Admitted;
            p.admitted_at = now;
            self.wait_sum_ms = self
                .wait_sum_ms
                .saturating_add(now.saturating_sub(p.joined_at));
            self.admitted += 1;
            self.admissions += 1;
            self.window.push_back(now);
            self.first_admission_at.get_or_insert(now);
            fx.push(Effect::Admitted { seq, at: now });
            self.schedule(seq);
        }
    }

    /// Removes a live place. `at` is when it ended (its deadline, for expiries).
    fn end(&mut self, seq: u64, reason: EndReason, at: Millis, now: Millis, fx: &mut Vec<Effect>) {
        let Some(p) = self.places.remove(&seq) else {
            return;
        };
        if p.state != PlaceState::Waiting {
            self.holds.end(self.admitted + self.active, at, now);
        }
        match p.state {
            PlaceState::Waiting => self.line_remove(seq, p.joined_at),
            PlaceState::Admitted => self.admitted -= 1,
            PlaceState::Active => {
                self.active -= 1;
                self.session_sum_ms = self
                    .session_sum_ms
                    .saturating_add(at.saturating_sub(p.entered_at));
                self.session_count += 1;
            }
        }
        if let Some(u) = &p.user_id {
            self.users.remove(u, seq);
        }
        // The session's holds end with it, in this same step: sold when it completed,
        // released on any other end.
        if p.state == PlaceState::Active {
            if reason == EndReason::Completed {
                self.inventory.sell(seq, fx);
            } else {
                self.inventory.release(seq, None, fx);
            }
            self.extensions.remove(&seq);
        }
        match reason {
            EndReason::Left | EndReason::Cleared | EndReason::Closed => self.left += 1,
            EndReason::Completed => self.completed += 1,
            EndReason::Expired => {
                self.expired += 1;
                self.tombstones.insert(seq, p.nonce);
                self.tombstone_order.push_back((now, seq));
            }
        }
        fx.push(Effect::Ended {
            seq,
            nonce: p.nonce,
            reason,
            at,
            noticed_at: now,
        });
    }

    fn lookup(&self, key: PlaceKey) -> Result<&Place, QueueError> {
        match self.places.get(&key.seq) {
            // Ended with the sale, even before the sweep removes it (`core::lifecycle`).
            Some(p) if p.nonce == key.nonce && p.state == PlaceState::Waiting && self.closed => {
                Err(QueueError::TokenNotFound)
            }
            Some(p) if p.nonce == key.nonce => Ok(p),
            _ if self.tombstones.get(&key.seq) == Some(&key.nonce) => Err(QueueError::TokenExpired),
            _ => Err(QueueError::TokenNotFound),
        }
    }

    fn lookup_mut(&mut self, key: PlaceKey) -> Result<&mut Place, QueueError> {
        self.lookup(key)?;
        Ok(self.places.get_mut(&key.seq).expect("looked up"))
    }

    /// What this event's pace is estimated from.
    pub(crate) fn pace(&self, now: Millis) -> Pace {
        Pace {
            recent_admissions: self.window.len() as u64,
            first_admission_at: self.first_admission_at,
            admit_per_minute: self.config.admit_per_minute,
            capacity: self.config.capacity(),
            session_sum_ms: self.session_sum_ms,
            session_count: self.session_count,
            session_max_sec: self.config.session_max_sec,
            paused: self.config.paused,
            hold_ms: self.holds.total(self.admitted + self.active, now),
            hold_ends: self.holds.ends,
            live: self.admitted + self.active,
        }
    }

    fn eta(&self, position: u64, now: Millis) -> u64 {
        self.pace(now).eta(position, now)
    }

    fn view(&self, seq: u64, now: Millis) -> PlaceView {
        let p = &self.places[&seq];
        let facts = PlaceFacts {
            key: PlaceKey {
                seq,
                nonce: p.nonce,
            },
            state: p.state,
            user_id: p.user_id.as_deref().map(str::to_string),
            user_proven: p.proven,
            joined_at: p.joined_at,
            admitted_at: p.admitted_at,
            entered_at: p.entered_at,
            last_seen: p.last_seen,
            position: match p.state {
                PlaceState::Waiting => self.line_position(seq, p.joined_at),
                _ => 0,
            },
            queue_length: self.waiting_len(),
            pre_queue: in_prequeue(self.config.opens_at, p.joined_at),
            opens_at: self.config.opening_ahead(now),
            lottery: self.config.queueing_method == QueueingMethod::Random,
        };
        PlaceView::new(facts, &self.timeouts_of(seq), &self.pace(now), now)
    }

    /// Joins the queue, or returns the live place the user already holds (with its
    /// heartbeat renewed) when the caller proved it is that user and that place was made
    /// by a proven join too. A proven join that finds an unproven place of its user ends
    /// it (`Left`: its tokens stop working, its slot or position is handed on) and makes a
    /// new place at the back: whoever made the old one may only have known the user id.
    /// A new place is admitted at once when there is room, budget and nobody waiting
    /// ahead. An invite-only event first checks the invite code; a new place binds an
    /// unused one for good: to the user when proven, else to the place itself.
    pub fn join(
        &mut self,
        nonce: u128,
        user_id: Option<&str>,
        metadata: Option<&str>,
        proof: JoinProof<'_>,
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<PlaceView, QueueError> {
        self.advance(now, fx);
        if self.closed {
            return Err(QueueError::EventClosed);
        }
        let proven = proof.proven && user_id.is_some();
        let bind = self.check_invite(user_id, proof)?;
        // An unproven place of this user that a proven join replaces.
        let mut squatted = None;
        if let Some(seq) = user_id.and_then(|u| self.users.get(u, &self.places)) {
            if !proven {
                return Err(QueueError::AlreadyJoined);
            }
            let p = self
                .places
                .get_mut(&seq)
                .expect("user index points at live places");
            if p.proven {
                if p.state == PlaceState::Waiting {
                    p.last_seen = now;
                }
                return Ok(self.view(seq, now));
            }
            squatted = Some((seq, p.state, p.nonce));
        }
        if !self.config.accept_joins {
            return Err(QueueError::EventClosed);
        }
        self.check_reject(now, squatted.map(|(_, state, _)| state))?;
        if let Some(max) = self.config.max_queue_length {
            // The replaced place, if waiting, makes room for the new one.
            let freed = matches!(squatted, Some((_, PlaceState::Waiting, _)));
            if self.waiting_len() - u64::from(freed) >= u64::from(max) {
                return Err(QueueError::QueueFull);
            }
        }
        if let Some((seq, _, _)) = squatted {
            // Its slot, if it held one, goes to the head of the queue by the `admit` below.
            self.end(seq, EndReason::Left, now, now, fx);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let user_id: Option<Box<str>> = user_id.map(Into::into);
        let metadata: Option<Box<str>> = metadata.map(Into::into);
        self.insert_waiting(seq, nonce, user_id.clone(), proven, metadata.clone(), now);
        // Dated at the opening at the earliest (`join_time`).
        let joined_at = self.places[&seq].joined_at;
        self.joins += 1;
        // Bound to a user only when the joiner proved it is that user: a code bound to a
        // bare user id would seat anyone who claims that id once the place ends.
        let bound = bind.map(|code| match &user_id {
            Some(u) if proven => (code, InviteHolder::User(u.clone())),
            _ => (code, InviteHolder::Place(seq)),
        });
        // The effect takes the user id itself: a copy of it per join fewer.
        fx.push(Effect::Joined {
            seq,
            nonce,
            user_id,
            proven,
            metadata,
            at: joined_at,
        });
        if let Some((code, holder)) = bound {
            self.invites.insert(code.clone(), Some(holder.clone()));
            fx.push(Effect::InviteBound { code, holder });
        }
        self.admit(now, fx);
        let mut view = self.view(seq, now);
        view.replaced = squatted.map(|(seq, _, nonce)| PlaceKey { seq, nonce });
        Ok(view)
    }

    fn insert_waiting(
        &mut self,
        seq: u64,
        nonce: u128,
        user_id: Option<Box<str>>,
        proven: bool,
        metadata: Option<Box<str>>,
        now: Millis,
    ) {
        let joined_at = self.join_time(now);
        if self.rank.needs_rebuild(seq) && !in_prequeue(self.config.opens_at, joined_at) {
            let base = self.rank.kth(1).unwrap_or(seq).min(seq);
            self.rank.rewindow(base, seq - base + 1);
        }
        self.line_insert(seq, joined_at);
        if let Some(u) = &user_id {
            self.users.insert(u, seq);
        }
        let mut p = Place {
            nonce,
            user_id,
            proven,
            metadata,
            joined_at,
            last_seen: now,
            admitted_at: 0,
            entered_at: 0,
            state: PlaceState::Waiting,
            sched: Millis::MAX,
        };
        p.sched = Self::deadline_of(&self.config, &p, 0, self.floors);
        self.deadlines.push((p.sched, seq));
        self.places.insert(seq, p);
    }

    /// The place's status; renews its heartbeat (waiting page or session).
    pub fn status(
        &mut self,
        key: PlaceKey,
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<PlaceView, QueueError> {
        self.heartbeat(key, now, fx)?;
        Ok(self.view(key.seq, now))
    }

    /// Renews the heartbeat of a waiting place or an active session. O(1).
    pub fn heartbeat(
        &mut self,
        key: PlaceKey,
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<(), QueueError> {
        self.advance(now, fx);
        let p = self.lookup_mut(key)?;
        if matches!(p.state, PlaceState::Waiting | PlaceState::Active) {
            p.last_seen = p.last_seen.max(now);
        }
        Ok(())
    }

    /// Moves every place's last heartbeat `lost` ms later: time in which no heartbeat could
    /// arrive (the node stalled, see `store::stalls`) does not count against anyone's idle
    /// period. Deadlines on file that come due early are filed again when they do.
    pub fn forgive_idle(&mut self, lost: Millis) {
        for (_, p) in self.places.iter_mut() {
            p.last_seen = p.last_seen.saturating_add(lost);
        }
    }

    /// The place's status without renewing anything (for live pushes and admin views).
    pub fn peek(
        &mut self,
        key: PlaceKey,
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<PlaceView, QueueError> {
        self.advance(now, fx);
        self.lookup(key)?;
        Ok(self.view(key.seq, now))
    }

    /// Turns an admitted place into an active session; idempotent for an active one.
    pub fn enter(
        &mut self,
        key: PlaceKey,
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<PlaceView, QueueError> {
        self.advance(now, fx);
        let p = self.lookup_mut(key)?;
        match p.state {
            PlaceState::Waiting => return Err(QueueError::NotReady),
            PlaceState::Admitted => {
                p.state = PlaceState::Active;
                p.entered_at = now;
                p.last_seen = now;
                self.admitted -= 1;
                self.active += 1;
                fx.push(Effect::Entered {
                    seq: key.seq,
                    at: now,
                });
                self.schedule(key.seq);
            }
            PlaceState::Active => {}
        }
        Ok(self.view(key.seq, now))
    }

    /// Ends a place of any state; `Ok(false)` if it was already gone.
    pub fn leave(
        &mut self,
        key: PlaceKey,
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<bool, QueueError> {
        self.advance(now, fx);
        match self.lookup(key) {
            Ok(_) => {
                self.end(key.seq, EndReason::Left, now, now, fx);
                self.admit(now, fx);
                Ok(true)
            }
            Err(QueueError::TokenNotFound | QueueError::TokenExpired) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The active session of the place, or `NoSession`.
    fn session(
        &mut self,
        key: PlaceKey,
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<&mut Place, QueueError> {
        self.advance(now, fx);
        match self.lookup_mut(key) {
            Ok(p) if p.state == PlaceState::Active => Ok(p),
            _ => Err(QueueError::NoSession),
        }
    }

    /// Renews an active session's idle deadline.
    pub fn session_heartbeat(
        &mut self,
        key: PlaceKey,
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<PlaceView, QueueError> {
        let p = self.session(key, now, fx)?;
        p.last_seen = p.last_seen.max(now);
        Ok(self.view(key.seq, now))
    }

    /// The active session, for verification; renews nothing.
    pub fn session_view(
        &mut self,
        key: PlaceKey,
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<PlaceView, QueueError> {
        self.session(key, now, fx)?;
        Ok(self.view(key.seq, now))
    }

    /// Ends an active session as used and hands its slot on; its holds become sold.
    pub fn complete(
        &mut self,
        key: PlaceKey,
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<(), QueueError> {
        self.session(key, now, fx)?;
        // A hold that lapsed is not sold.
        self.inventory.expire(now, fx);
        self.end(key.seq, EndReason::Completed, now, now, fx);
        self.admit(now, fx);
        Ok(())
    }

    /// Removes every waiting place; answers how many.
    pub fn clear(&mut self, now: Millis, fx: &mut Vec<Effect>) -> u64 {
        self.advance(now, fx);
        if self.closed {
            // The waiting places were over at the end of the sale; the sweep ends them as
            // `closed` (`tick`), not as cleared by this call.
            return 0;
        }
        let mut seqs: Vec<u64> = self
            .places
            .iter()
            .filter(|(_, p)| p.state == PlaceState::Waiting)
            .map(|(s, _)| s)
            .collect();
        seqs.sort_unstable();
        for &seq in &seqs {
            self.end(seq, EndReason::Cleared, now, now, fx);
        }
        seqs.len() as u64
    }

    /// Background work: expiries and rate-paced admissions. Answers when it next needs to
    /// run (the earliest deadline or the next rate token), if ever.
    pub fn tick(&mut self, now: Millis, fx: &mut Vec<Effect>) -> Option<Millis> {
        self.note_opening(now);
        self.note_end(now);
        self.closed = self.sale_over(now);
        self.expire_due(now, fx);
        self.admit(now, fx);
        if self.closed {
            // One bounded batch per tick; the next tick comes at once while any are left.
            for _ in 0..super::END_BATCH {
                // Both lines: the pre-queue's places end with the sale too.
                let Some(seq) = self.line_kth(1) else { break };
                self.end(seq, EndReason::Closed, now, now, fx);
            }
            if self.waiting_len() > 0 {
                return Some(now + 1);
            }
        }
        let mut next = self.deadlines.peek().map(|r| r.0);
        if let Some(t) = self.config.closes_at.filter(|&t| t > now) {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        let (cap, rate) = self.limits();
        // Before the opening nobody is admitted, so no token is spent and the next one
        // stays due: the wake for the opening below is the one that counts.
        if let Some(rate) = rate.filter(|_| !self.before_opening(now)) {
            let room = self.admitted + self.active < cap;
            if room && !self.config.paused && self.waiting_len() > 0 {
                let t = self.bucket.next_token_at(rate).max(now + 1);
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        if let Some(t) = self.config.opening_ahead(now) {
            // The opening: the pre-queue starts to be admitted. Asked for even while nobody
            // waits: a join does not re-plan the scheduler.
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        if let Some(&(at, _)) = self.tombstone_order.front() {
            let t = at + EXPIRED_RETENTION_MS;
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        next
    }

    /// The first `limit` waiting places, in order.
    pub fn head(&mut self, limit: usize, now: Millis, fx: &mut Vec<Effect>) -> Vec<HeadEntry> {
        self.advance(now, fx);
        // Before the opening the shuffle order is secret, even from the admin: the
        // pre-queue is listed in join order.
        let early = self.before_opening(now).then(|| self.prequeue(0, limit));
        // The sale ended: every waiting place is over, removed or not yet (`tick`'s batches).
        let limit = if self.closed { 0 } else { limit };
        (1..=limit as u64)
            .map_while(|k| match &early {
                Some(seqs) => seqs.get(k as usize - 1).map(|&seq| (k, seq)),
                None => self.line_kth(k).map(|seq| (k, seq)),
            })
            .map(|(k, seq)| {
                let p = &self.places[&seq];
                HeadEntry {
                    position: k,
                    place_id: seq,
                    user_id: p.user_id.as_deref().map(str::to_string),
                    joined_at: p.joined_at,
                    eta_sec: self.eta(k, now),
                }
            })
            .collect()
    }

    pub fn figures(&mut self, now: Millis, fx: &mut Vec<Effect>) -> EventFigures {
        self.advance(now, fx);
        EventCounts {
            waiting: self.waiting_len(),
            admitted: self.admitted,
            active: self.active,
            completed: self.completed,
            left: self.left,
            expired: self.expired,
            capacity: self.config.capacity(),
            wait_sum_ms: self.wait_sum_ms,
            recent_admissions: self.window.len() as u64,
            joins: self.joins,
            admissions: self.admissions,
        }
        .into()
    }

    /// The metadata a place joined with (raw JSON), if any.
    pub fn metadata(&self, key: PlaceKey) -> Result<Option<&str>, QueueError> {
        Ok(self.lookup(key)?.metadata.as_deref())
    }
}

#[path = "queue_invariants.rs"]
mod invariants;
#[path = "queue_invites.rs"]
mod invites;
#[path = "sale.rs"]
mod sale;
#[path = "queue_schedule.rs"]
mod schedule_rules;
pub use schedule_rules::{schedule_change_allowed, SCHEDULE_LOCKED};

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
