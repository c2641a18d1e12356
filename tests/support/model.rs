//! A deliberately simple reference model of one event's queue (a vector of places in join
//! order, every answer computed by a linear scan) and a property test harness that drives a
//! `Store` and the model with the same random operations, checking after every step the six
//! guarantees: fair order, exact positions, no over-admission, one place per user, timely
//! expiry, and slots handed on.
//!
//! The sale is modelled too: a handful of seats, held, released, lapsing and sold by the
//! sessions, compared item by item with the store after every step (no seat ever has two
//! holders or two buyers: the model has one state per seat, and the store must match it),
//! and session extensions moving a session's maximum.
//!
//! The model does not re-implement the token bucket of `admit_per_minute`: with a pace set,
//! it accepts the store's choice of *how many* to admit, and checks *which* (the first in
//! line), that it fits the room, and that the count stays within the configured budget.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::sample::Index;
use waitroom::core::schedule::{draw, format_rfc3339, prequeue_key};
use waitroom::core::{
    EndCause, EventConfig, EventPatch, ItemState, Millis, PlaceKey, PlaceState, QueueError,
    QueueingMethod, SaleEnd, EXPIRED_RETENTION_MS,
};
use waitroom::store::{JoinRequest, Store, StoreError};

const T0: Millis = 1_700_000_000_000;
const USERS: [&str; 4] = ["ann", "bob", "cy", "dee"];
/// The seats of the modelled event.
const SEATS: usize = 6;
const HOLD_TTL_SEC: u64 = 3;
const MAX_HOLDS: usize = 2;
const EXTEND_SEC: u64 = 2;
const MAX_EXTENSIONS: u32 = 2;

fn seat(i: usize) -> String {
    format!("S-{i}")
}

#[derive(Debug, Clone)]
pub enum Op {
    /// A join, as a user or anonymous, with or without proof of being that user.
    Join(Option<usize>, bool),
    Status(Index),
    Heartbeat(Index),
    Enter(Index),
    Leave(Index),
    SessionHeartbeat(Index),
    Complete(Index),
    Clear,
    Tick,
    Advance(Millis),
    Configure(Settings),
    /// A session holds these seats.
    Hold(Index, Vec<usize>),
    /// A session releases these seats (all of its holds with `None`).
    Release(Index, Option<Vec<usize>>),
    Extend(Index),
    /// The admin's end of the sale, then ticks until its batches are done.
    End,
}

#[derive(Debug, Clone)]
pub struct Settings {
    max_active: u64,
    ratio: f64,
    paused: bool,
    admit_per_minute: Option<u64>,
    ready_ttl_sec: u64,
    session_idle_sec: u64,
    session_max_sec: u64,
    waiting_idle_sec: u64,
    max_queue_length: Option<u64>,
    accept_joins: bool,
    /// `queueing_method`.
    method: &'static str,
}

/// Every history starts with a pre-queue: the sale opens 3 s in (`opens_at`).
const OPENS: Millis = T0 + 3000;

fn settings() -> impl Strategy<Value = Settings> {
    (
        1u64..4,
        prop_oneof![Just(1.0), Just(1.5), Just(2.0)],
        prop::bool::weighted(0.2),
        prop_oneof![3 => Just(None), 1 => (20u64..200).prop_map(Some)],
        1u64..6,
        1u64..6,
        2u64..12,
        // `waiting_idle_sec` starts at 3 (config.rs `MIN_WAITING_IDLE_SEC`).
        3u64..8,
        prop_oneof![3 => Just(None), 1 => (1u64..6).prop_map(Some)],
        prop::bool::weighted(0.9),
        prop_oneof![
            4 => Just("fifo"),
            1 => Just("random"),
            1 => Just("passthrough"),
            1 => Just("reject")
        ],
    )
        .prop_map(|(m, r, p, apm, rt, si, sm, wi, mq, aj, method)| Settings {
            max_active: m,
            ratio: r,
            paused: p,
            // A `reject` join under a pace depends on the rate budget, which the model
            // does not track to the token: no pace with `reject`.
            admit_per_minute: apm.filter(|_| method != "reject"),
            method,
            ready_ttl_sec: rt,
            session_idle_sec: si,
            session_max_sec: sm,
            waiting_idle_sec: wi,
            max_queue_length: mq,
            accept_joins: aj,
        })
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (
            prop::option::weighted(0.6, 0usize..USERS.len()),
            prop::bool::weighted(0.7)
        )
            .prop_map(|(u, proven)| Op::Join(u, proven)),
        3 => any::<Index>().prop_map(Op::Status),
        2 => any::<Index>().prop_map(Op::Heartbeat),
        3 => any::<Index>().prop_map(Op::Enter),
        2 => any::<Index>().prop_map(Op::Leave),
        2 => any::<Index>().prop_map(Op::SessionHeartbeat),
        2 => any::<Index>().prop_map(Op::Complete),
        1 => Just(Op::Clear),
        2 => Just(Op::Tick),
        4 => (1u64..4000).prop_map(Op::Advance),
        1 => settings().prop_map(Op::Configure),
        4 => (any::<Index>(), prop::collection::vec(0..SEATS, 1..4))
            .prop_map(|(ix, s)| Op::Hold(ix, s)),
        1 => (any::<Index>(), prop::option::of(prop::collection::vec(0..SEATS, 1..3)))
            .prop_map(|(ix, s)| Op::Release(ix, s)),
        1 => any::<Index>().prop_map(Op::Extend),
        1 => Just(Op::End),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum MState {
    Waiting,
    Admitted,
    Active,
    /// Ended by a deadline, at the given processing time.
    Expired(Millis),
    /// Ended any other way.
    Gone,
}

#[derive(Debug, Clone)]
struct MPlace {
    key: PlaceKey,
    user: Option<usize>,
    /// Made by a join that proved its user.
    proven: bool,
    state: MState,
    last_seen: Millis,
    admitted_at: Millis,
    entered_at: Millis,
    /// Session extensions: how many, and the milliseconds they added to the maximum.
    extensions: u32,
    extra: Millis,
    joined_at: Millis,
}

/// A seat: available, held by place `i` until a time, or sold to place `i`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum MSeat {
    Free,
    Held(usize, Millis),
    Sold(usize),
}

struct Model {
    cfg: EventConfig,
    places: Vec<MPlace>,
    now: Millis,
    /// Admissions since the pace was last set, and when it was set, for the budget check.
    paced_admissions: u64,
    pace_since: Millis,
    seats: Vec<MSeat>,
    /// Admissions so far: numbers the lottery's draws.
    admissions: u64,
    /// The earliest deadline of a waiting place (queue.rs `Floors::waiting`).
    wfloor: Millis,
    /// What lowerings of the ready window kept (view.rs `ReadyKept`): places admitted before
    /// `.0` keep at least the window `.1`, and none ends before `.2`.
    kept: (Millis, Millis, Millis),
}

/// The floor a lowering of the waiting idle time from `old` to `new`, at `now`, sets
/// (queue.rs `set_config`): not before a poller told the old interval (a third of the
/// shorter of the idle time and the ready window, 1–60 s) could be back, with a second to
/// spare. `None` when it is not lowered.
fn lowered_floor(old: &EventConfig, new: &EventConfig, now: Millis) -> Option<Millis> {
    (new.waiting_idle_sec < old.waiting_idle_sec).then(|| {
        let shorter = u64::from(old.waiting_idle_sec.min(old.ready_ttl_sec));
        let told = (shorter / 3).clamp(1, 60) * 1000;
        now + told + 1000
    })
}

/// What a lowering of the ready window from `old` to `new`, at `now`, keeps (queue.rs
/// `set_config`): places admitted before it keep the old window (or a longer one an
/// earlier lowering kept, while some place may hold it), and none ends before a poller
/// told the old interval could be back.
fn lowered_ready(
    kept: (Millis, Millis, Millis),
    old: &EventConfig,
    new: &EventConfig,
    now: Millis,
) -> (Millis, Millis, Millis) {
    if new.ready_ttl_sec >= old.ready_ttl_sec {
        return kept;
    }
    let old_ms = Millis::from(old.ready_ttl_sec) * 1000;
    let window = if kept.0 + kept.1 > now {
        kept.1.max(old_ms)
    } else {
        old_ms
    };
    let shorter = u64::from(old.waiting_idle_sec.min(old.ready_ttl_sec));
    let told = (shorter / 3).clamp(1, 60) * 1000;
    (now, window, kept.2.max(now + told + 1000))
}

impl Model {
    fn capacity(&self) -> u64 {
        (self.cfg.max_active as f64 * self.cfg.overbooking_ratio).floor() as u64
    }

    fn held(&self) -> u64 {
        self.places
            .iter()
            .filter(|p| matches!(p.state, MState::Admitted | MState::Active))
            .count() as u64
    }

    fn deadline(&self, p: &MPlace) -> Option<Millis> {
        let s = |v: u32| Millis::from(v) * 1000;
        let c = &self.cfg;
        match p.state {
            MState::Waiting => Some((p.last_seen + s(c.waiting_idle_sec)).max(self.wfloor)),
            MState::Admitted => {
                let (before, window, floor) = self.kept;
                let mut d = p.admitted_at + s(c.ready_ttl_sec);
                if p.admitted_at < before {
                    d = d.max(p.admitted_at + window);
                }
                Some(d.max(floor))
            }
            MState::Active => Some(
                (p.last_seen + s(c.session_idle_sec))
                    .min(p.entered_at + s(c.session_max_sec) + p.extra),
            ),
            _ => None,
        }
    }

    fn expire(&mut self) {
        let now = self.now;
        for i in 0..self.places.len() {
            if self.deadline(&self.places[i]).is_some_and(|d| d <= now) {
                self.places[i].state = MState::Expired(now);
            }
        }
        self.free_seats();
    }

    /// Holds lapse at their deadline; a place that is no longer in session holds nothing
    /// (whatever ended it: the store releases in the same step).
    fn free_seats(&mut self) {
        for i in 0..SEATS {
            if let MSeat::Held(p, until) = self.seats[i] {
                if until <= self.now || self.places[p].state != MState::Active {
                    self.seats[i] = MSeat::Free;
                }
            }
        }
    }

    fn method(&self) -> QueueingMethod {
        self.cfg.queueing_method
    }

    fn before_opening(&self) -> bool {
        self.now < OPENS
    }

    fn in_prequeue(&self, i: usize) -> bool {
        self.places[i].joined_at < OPENS
    }

    /// The waiting places in the order of admission: the pre-queue by its shuffle keys
    /// (sha256 of the seed and the seq), then the others by join order.
    fn waiting_indices(&self) -> Vec<usize> {
        let seed = self.cfg.event_secret.expect("a secret").shuffle_seed();
        let mut w: Vec<usize> = (0..self.places.len())
            .filter(|&i| self.places[i].state == MState::Waiting)
            .collect();
        w.sort_by_key(|&i| {
            let pre = self.in_prequeue(i);
            let key = pre.then(|| prequeue_key(&seed, self.places[i].key.seq));
            (!pre, key, i)
        });
        w
    }

    fn position(&self, i: usize) -> u64 {
        self.waiting_indices().iter().position(|&j| j == i).unwrap() as u64 + 1
    }

    /// The next `n` admissions, in the order they are made.
    fn next_admissions(&self, n: usize) -> Vec<usize> {
        let mut w = self.waiting_indices();
        if self.method() != QueueingMethod::Random {
            w.truncate(n);
            return w;
        }
        let key = self.cfg.event_secret.expect("a secret").lottery_key();
        (0..n as u64)
            .map(|k| {
                let d = draw(&key, self.admissions + k, w.len() as u64);
                w.remove(d as usize)
            })
            .collect()
    }

    fn live_place_of(&self, user: usize) -> Option<usize> {
        self.places.iter().position(|p| {
            p.user == Some(user)
                && matches!(p.state, MState::Waiting | MState::Admitted | MState::Active)
        })
    }

    /// The error a token of an ended place answers.
    fn ended_error(&self, i: usize) -> Option<QueueError> {
        match self.places[i].state {
            MState::Expired(at) if at + EXPIRED_RETENTION_MS > self.now => {
                Some(QueueError::TokenExpired)
            }
            MState::Expired(_) | MState::Gone => Some(QueueError::TokenNotFound),
            _ => None,
        }
    }

    /// How many the model itself would admit now, ignoring any pace.
    fn room(&self) -> usize {
        // Nobody is admitted from the queue once the sale ended.
        if self.cfg.paused || self.before_opening() || self.cfg.ended.is_some() {
            return 0;
        }
        if self.method() == QueueingMethod::Passthrough {
            return self.waiting_indices().len();
        }
        let room = self.capacity().saturating_sub(self.held()) as usize;
        room.min(self.waiting_indices().len())
    }

    fn admit_first(&mut self, n: usize) {
        for i in self.next_admissions(n) {
            self.places[i].state = MState::Admitted;
            self.places[i].admitted_at = self.now;
            self.admissions += 1;
            if self.paced() {
                self.paced_admissions += 1;
            }
        }
    }

    /// The pace applies (passthrough has none).
    fn paced(&self) -> bool {
        self.cfg.admit_per_minute.is_some() && self.method() != QueueingMethod::Passthrough
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn qerr<T>(r: Result<T, StoreError>) -> Result<T, QueueError> {
    r.map_err(|e| match e {
        StoreError::Queue(q) => q,
        other => panic!("store failed: {other}"),
    })
}

fn patch_of(s: &Settings) -> EventPatch {
    serde_json::from_value(serde_json::json!({
        "queueing_method": s.method,
        "max_active": s.max_active, "overbooking_ratio": s.ratio, "paused": s.paused,
        "admit_per_minute": s.admit_per_minute, "ready_ttl_sec": s.ready_ttl_sec,
        "session_idle_sec": s.session_idle_sec, "session_max_sec": s.session_max_sec,
        "waiting_idle_sec": s.waiting_idle_sec, "max_queue_length": s.max_queue_length,
        "accept_joins": s.accept_joins,
    }))
    .unwrap()
}

/// Runs one random history against a fresh store and the model.
pub fn run_history(store: Arc<dyn Store>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let rt = rt();
    let ev = "prop";
    let sale = serde_json::from_value(serde_json::json!({
        "hold_ttl_sec": HOLD_TTL_SEC, "max_holds_per_session": MAX_HOLDS,
        "session_extend_sec": EXTEND_SEC, "max_extensions": MAX_EXTENSIONS,
    }))
    .unwrap();
    let created = rt.block_on(store.put_event(ev, &sale, T0)).unwrap();
    let seats: Vec<String> = (0..SEATS).map(seat).collect();
    rt.block_on(store.put_inventory(ev, &seats, T0)).unwrap();
    let initial = Settings {
        max_active: 2,
        ratio: 1.0,
        paused: false,
        admit_per_minute: None,
        ready_ttl_sec: 3,
        session_idle_sec: 3,
        session_max_sec: 8,
        waiting_idle_sec: 4,
        max_queue_length: None,
        accept_joins: true,
        method: "fifo",
    };
    let mut first = patch_of(&initial);
    first.opens_at = Some(Some(format_rfc3339(OPENS)));
    let cfg = rt.block_on(store.put_event(ev, &first, T0)).unwrap();
    let mut m = Model {
        cfg,
        places: Vec::new(),
        now: T0,
        paced_admissions: 0,
        pace_since: T0,
        seats: vec![MSeat::Free; SEATS],
        admissions: 0,
        wfloor: 0,
        kept: (0, 0, 0),
    };
    m.wfloor = lowered_floor(&created, &m.cfg, T0).unwrap_or(0);
    m.kept = lowered_ready((0, 0, 0), &created, &m.cfg, T0);
    let mut nonce = 0u128;
    for (step, op) in ops.into_iter().enumerate() {
        if let Op::Advance(ms) = op {
            m.now += ms;
        }
        // Every store operation first ends what is due and admits into the room that made.
        // Settling that here (by peeking at the same `now`, which changes nothing more)
        // lets the model judge the operation itself against the same starting state.
        let before_held = m.held();
        m.expire();
        settle_admissions(&rt, &store, ev, &mut m, step)?;
        let pick = |ix: &Index, m: &Model| (!m.places.is_empty()).then(|| ix.index(m.places.len()));
        match &op {
            Op::Advance(_) | Op::Tick => {
                qerr(rt.block_on(store.tick(ev, m.now))).unwrap();
            }
            Op::Join(user, proven) => {
                nonce += 1;
                let uname = user.map(|u| USERS[u].to_string());
                let got = qerr(rt.block_on(store.join(
                    ev,
                    &JoinRequest {
                        user_id: uname,
                        metadata: None,
                        nonce,
                        proven: *proven,
                        invite: None,
                    },
                    m.now,
                )));
                let mut waiting = m.waiting_indices().len() as u64;
                let mut held = m.held();
                let mut live = user.and_then(|u| m.live_place_of(u));
                // A proven join does not adopt a place made without proof: it replaces it
                // (when a new place can be made at all), at the back of the queue.
                let squatted = live.filter(|&i| *proven && !m.places[i].proven);
                if let Some(i) = squatted {
                    live = None;
                    if m.places[i].state == MState::Waiting {
                        waiting -= 1;
                    } else {
                        held -= 1;
                    }
                }
                // The reject rule counts the room a squatted place it replaces frees.
                let full = m.method() == QueueingMethod::Reject
                    && !m.before_opening()
                    && (m.cfg.paused || waiting > 0 || held >= m.capacity());
                if m.cfg.ended.is_some() {
                    // After the end of the sale, every join is refused.
                    prop_assert_eq!(got.map(|v| v.key), Err(QueueError::EventClosed));
                } else if live.is_some() && !proven {
                    // Knowing a user id is not enough: no place back, nothing renewed.
                    prop_assert_eq!(
                        got.map(|v| v.key),
                        Err(QueueError::AlreadyJoined),
                        "step {}: an unproven repeat join got a place",
                        step
                    );
                } else if let Some(i) = live {
                    let v = got.map_err(|e| {
                        TestCaseError::fail(format!("step {step}: rejoin failed {e:?}"))
                    })?;
                    prop_assert_eq!(
                        v.key,
                        m.places[i].key,
                        "step {}: a user got a second place",
                        step
                    );
                    if m.places[i].state == MState::Waiting {
                        m.places[i].last_seen = m.now;
                    }
                } else if !m.cfg.accept_joins {
                    prop_assert_eq!(got.map(|v| v.key), Err(QueueError::EventClosed));
                } else if full {
                    prop_assert_eq!(got.map(|v| v.key), Err(QueueError::EventFull));
                } else if m
                    .cfg
                    .max_queue_length
                    .is_some_and(|q| waiting >= u64::from(q))
                {
                    prop_assert_eq!(got.map(|v| v.key), Err(QueueError::QueueFull));
                } else {
                    let v = got.map_err(|e| {
                        TestCaseError::fail(format!("step {step}: join failed {e:?}"))
                    })?;
                    if let Some(i) = squatted {
                        prop_assert_ne!(v.key, m.places[i].key, "step {}: adopted", step);
                        m.places[i].state = MState::Gone;
                    }
                    m.places.push(MPlace {
                        key: v.key,
                        user: *user,
                        proven: *proven && user.is_some(),
                        state: MState::Waiting,
                        last_seen: m.now,
                        admitted_at: 0,
                        entered_at: 0,
                        extensions: 0,
                        extra: 0,
                        joined_at: m.now,
                    });
                }
            }
            Op::Status(ix) | Op::Heartbeat(ix) => {
                let Some(i) = pick(ix, &m) else { continue };
                let key = m.places[i].key;
                let got = if matches!(op, Op::Status(_)) {
                    qerr(rt.block_on(store.status(ev, key, m.now))).map(|_| ())
                } else {
                    qerr(rt.block_on(store.heartbeat(ev, key, m.now)))
                };
                match m.ended_error(i) {
                    Some(e) => prop_assert_eq!(got, Err(e), "step {}", step),
                    None => {
                        prop_assert_eq!(got, Ok(()), "step {}", step);
                        if matches!(m.places[i].state, MState::Waiting | MState::Active) {
                            m.places[i].last_seen = m.now;
                        }
                    }
                }
            }
            Op::Enter(ix) => {
                let Some(i) = pick(ix, &m) else { continue };
                let got =
                    qerr(rt.block_on(store.enter(ev, m.places[i].key, m.now))).map(|v| v.status);
                match (m.ended_error(i), m.places[i].state) {
                    (Some(e), _) => prop_assert_eq!(got, Err(e), "step {}", step),
                    (None, MState::Waiting) => {
                        prop_assert_eq!(got, Err(QueueError::NotReady), "step {}", step)
                    }
                    (None, s) => {
                        prop_assert_eq!(got, Ok(PlaceState::Active), "step {}", step);
                        if s == MState::Admitted {
                            let p = &mut m.places[i];
                            p.state = MState::Active;
                            p.entered_at = m.now;
                            p.last_seen = m.now;
                        }
                    }
                }
            }
            Op::Leave(ix) => {
                let Some(i) = pick(ix, &m) else { continue };
                let got = qerr(rt.block_on(store.leave(ev, m.places[i].key, m.now)));
                let live = m.ended_error(i).is_none();
                prop_assert_eq!(got, Ok(live), "step {}", step);
                if live {
                    m.places[i].state = MState::Gone;
                }
            }
            Op::SessionHeartbeat(ix) | Op::Complete(ix) => {
                let Some(i) = pick(ix, &m) else { continue };
                let key = m.places[i].key;
                let complete = matches!(op, Op::Complete(_));
                let got = if complete {
                    qerr(rt.block_on(store.complete(ev, key, m.now)))
                } else {
                    qerr(rt.block_on(store.session_heartbeat(ev, key, m.now))).map(|_| ())
                };
                if m.places[i].state == MState::Active {
                    prop_assert_eq!(got, Ok(()), "step {}", step);
                    if complete {
                        // Its holds are sold, in the same step.
                        for s in m.seats.iter_mut() {
                            if matches!(*s, MSeat::Held(p, _) if p == i) {
                                *s = MSeat::Sold(i);
                            }
                        }
                        m.places[i].state = MState::Gone;
                    } else {
                        m.places[i].last_seen = m.now;
                    }
                } else {
                    prop_assert_eq!(got, Err(QueueError::NoSession), "step {}", step);
                }
            }
            Op::Clear => {
                let n = qerr(rt.block_on(store.clear(ev, m.now))).unwrap();
                let w = m.waiting_indices();
                prop_assert_eq!(n, w.len() as u64, "step {}: cleared count", step);
                for i in w {
                    m.places[i].state = MState::Gone;
                }
            }
            Op::End => {
                let end = SaleEnd {
                    reason: EndCause::SoldOut,
                    message: None,
                    at: m.now,
                };
                let applied = qerr(rt.block_on(store.end_sale(ev, end, m.now))).unwrap();
                // It counts the places it ends: none when the sale had ended already.
                let ends = if m.cfg.ended.is_some() {
                    0
                } else {
                    m.waiting_indices().len() as u64
                };
                prop_assert_eq!(applied.waiting, ends, "step {}: places the end ended", step);
                prop_assert_eq!(
                    &applied.before.ended,
                    &m.cfg.ended,
                    "step {}: the end it replaced",
                    step
                );
                m.cfg = applied.config;
                // Waiting places end with the sale; admitted and active ones carry on.
                for i in m.waiting_indices() {
                    m.places[i].state = MState::Gone;
                }
                for _ in 0..4 {
                    if qerr(rt.block_on(store.tick(ev, m.now))).unwrap() != Some(m.now + 1) {
                        break;
                    }
                }
            }
            Op::Configure(s) => {
                let cfg = qerr(rt.block_on(store.put_event(ev, &patch_of(s), m.now))).unwrap();
                let paced = |c: &EventConfig| {
                    c.admit_per_minute
                        .filter(|_| c.queueing_method != QueueingMethod::Passthrough)
                };
                if paced(&cfg) != paced(&m.cfg) {
                    m.paced_admissions = 0;
                    m.pace_since = m.now;
                }
                // New timeouts apply at once: what they put behind `now` ends now. But a
                // shorter waiting idle counts from the change at the earliest (queue.rs
                // `set_config`), and not before a poller told the old interval could be back.
                if let Some(floor) = lowered_floor(&m.cfg, &cfg, m.now) {
                    m.wfloor = m.wfloor.max(floor);
                }
                // A shorter ready window keeps what admitted places were told.
                m.kept = lowered_ready(m.kept, &m.cfg, &cfg, m.now);
                m.cfg = cfg;
                m.expire();
            }
            Op::Hold(ix, want) => {
                let Some(i) = pick(ix, &m) else { continue };
                let names: Vec<String> = want.iter().map(|&s| seat(s)).collect();
                let got = qerr(rt.block_on(store.hold(ev, m.places[i].key, &names, m.now)));
                let want_err = model_hold(&m, i, want);
                // Any hold call of a session renews its idle deadline, refused or not.
                if m.places[i].state == MState::Active {
                    m.places[i].last_seen = m.now;
                }
                match want_err {
                    Some(e) => prop_assert_eq!(got.map(|_| ()), Err(e), "step {}", step),
                    None => {
                        let until = m.now + HOLD_TTL_SEC * 1000;
                        for &s in want {
                            m.seats[s] = MSeat::Held(i, until);
                        }
                        let got = got.map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                        let mut mine: Vec<String> = (0..SEATS)
                            .filter(|&s| matches!(m.seats[s], MSeat::Held(p, _) if p == i))
                            .map(seat)
                            .collect();
                        mine.sort();
                        let got: Vec<String> = got.holds.into_iter().map(|h| h.item).collect();
                        prop_assert_eq!(got, mine, "step {}: holds answered", step);
                    }
                }
            }
            Op::Release(ix, which) => {
                let Some(i) = pick(ix, &m) else { continue };
                let names: Option<Vec<String>> =
                    which.as_ref().map(|w| w.iter().map(|&s| seat(s)).collect());
                let got =
                    qerr(rt.block_on(store.release(ev, m.places[i].key, names.as_deref(), m.now)));
                if m.places[i].state != MState::Active {
                    prop_assert_eq!(got.map(|_| ()), Err(QueueError::NoSession), "step {}", step);
                } else {
                    prop_assert!(got.is_ok(), "step {}: release failed", step);
                    m.places[i].last_seen = m.now;
                    for s in 0..SEATS {
                        let chosen = which.as_ref().is_none_or(|w| w.contains(&s));
                        if chosen && matches!(m.seats[s], MSeat::Held(p, _) if p == i) {
                            m.seats[s] = MSeat::Free;
                        }
                    }
                }
            }
            Op::Extend(ix) => {
                let Some(i) = pick(ix, &m) else { continue };
                let got = qerr(rt.block_on(store.extend(ev, m.places[i].key, m.now)));
                let p = &mut m.places[i];
                if p.state != MState::Active {
                    prop_assert_eq!(got.map(|_| ()), Err(QueueError::NoSession), "step {}", step);
                } else if p.extensions >= MAX_EXTENSIONS {
                    prop_assert_eq!(
                        got.map(|_| ()),
                        Err(QueueError::ExtensionLimit),
                        "step {}",
                        step
                    );
                } else {
                    p.extensions += 1;
                    p.extra += EXTEND_SEC * 1000;
                    p.last_seen = m.now;
                    let ends = p.entered_at + Millis::from(m.cfg.session_max_sec) * 1000 + p.extra;
                    prop_assert_eq!(
                        got.map(|v| v.session_ends_at),
                        Ok(Some(ends)),
                        "step {}",
                        step
                    );
                }
            }
        }
        m.free_seats();
        after_step(&rt, &store, ev, &mut m, step, &op, before_held)?;
    }
    Ok(())
}

/// The refusal the rules give a hold of `want` by place `i`, if any (checked in the order
/// given, after the session check).
fn model_hold(m: &Model, i: usize, want: &[usize]) -> Option<QueueError> {
    if m.places[i].state != MState::Active {
        return Some(QueueError::NoSession);
    }
    let mine = m
        .seats
        .iter()
        .filter(|s| matches!(s, MSeat::Held(p, _) if *p == i))
        .count();
    let mut fresh = std::collections::BTreeSet::new();
    for &s in want {
        match m.seats[s] {
            MSeat::Free => {
                // The limit is checked at the new seat that breaks it.
                if fresh.insert(s) && mine + fresh.len() > MAX_HOLDS {
                    return Some(QueueError::TooManyHolds);
                }
            }
            MSeat::Held(p, _) if p == i => {}
            _ => return Some(QueueError::HoldConflict),
        }
    }
    None
}

/// Applies the admissions the store made, after checking they are the ones the rules allow:
/// the first in line, within the room, all of the room when no pace is set.
fn settle_admissions(
    rt: &tokio::runtime::Runtime,
    store: &Arc<dyn Store>,
    ev: &str,
    m: &mut Model,
    step: usize,
) -> Result<(), TestCaseError> {
    let room = m.room();
    let waiting = m.waiting_indices();
    let mut admitted = Vec::new();
    for &i in &waiting {
        // peek at the same `now` changes nothing more in the store.
        let s = qerr(rt.block_on(store.peek(ev, m.places[i].key, m.now)));
        match s.map(|v| v.status) {
            Ok(PlaceState::Waiting) => {}
            Ok(PlaceState::Admitted) => admitted.push(i),
            other => {
                return Err(TestCaseError::fail(format!(
                    "step {step}: waiting place became {other:?}"
                )))
            }
        }
    }
    let n = admitted.len();
    prop_assert!(
        n <= room,
        "step {}: admitted {} into room for {}",
        step,
        n,
        room
    );
    let mut want = m.next_admissions(n);
    want.sort_unstable_by_key(|i| waiting.iter().position(|j| j == i));
    prop_assert_eq!(
        &admitted[..],
        &want[..],
        "step {}: admission out of order",
        step
    );
    if !m.paced() {
        prop_assert_eq!(n, room, "step {}: a free slot was not handed on", step);
    }
    m.admit_first(n);
    if let Some(rate) = m.cfg.admit_per_minute.filter(|_| m.paced()) {
        let burst = (rate as f64 / 60.0).ceil().max(1.0);
        let budget = burst + (m.now - m.pace_since) as f64 * rate as f64 / 60_000.0;
        prop_assert!(
            m.paced_admissions as f64 <= budget + 1e-6,
            "step {}: {} admissions exceed the pace budget {:.2}",
            step,
            m.paced_admissions,
            budget
        );
    }
    Ok(())
}

/// After an operation: settle admissions, then compare every place with the store.
fn after_step(
    rt: &tokio::runtime::Runtime,
    store: &Arc<dyn Store>,
    ev: &str,
    m: &mut Model,
    step: usize,
    op: &Op,
    before_held: u64,
) -> Result<(), TestCaseError> {
    settle_admissions(rt, store, ev, m, step)?;
    let waiting_total = m.waiting_indices().len() as u64;
    for i in 0..m.places.len() {
        let got = qerr(rt.block_on(store.peek(ev, m.places[i].key, m.now)));
        let p = &m.places[i];
        match (p.state, got) {
            (MState::Waiting, Ok(v)) => {
                prop_assert_eq!(
                    v.status,
                    PlaceState::Waiting,
                    "step {} ({:?}): place {}",
                    step,
                    op,
                    i
                );
                // No position before the opening (pre-queue) nor in a lottery.
                let hidden = (m.before_opening() && m.in_prequeue(i))
                    || m.method() == QueueingMethod::Random;
                prop_assert_eq!(
                    v.position,
                    (!hidden).then(|| m.position(i)),
                    "step {} ({:?}): position of {}",
                    step,
                    op,
                    i
                );
                prop_assert_eq!(v.queue_length, waiting_total, "step {}: queue length", step);
            }
            (MState::Admitted, Ok(v)) => prop_assert_eq!(
                v.status,
                PlaceState::Admitted,
                "step {} ({:?}): place {}",
                step,
                op,
                i
            ),
            (MState::Active, Ok(v)) => prop_assert_eq!(
                v.status,
                PlaceState::Active,
                "step {} ({:?}): place {}",
                step,
                op,
                i
            ),
            (_, got) => {
                let want = m.ended_error(i).expect("ended");
                prop_assert_eq!(
                    got.map(|v| v.status),
                    Err(want),
                    "step {} ({:?}): ended place {}",
                    step,
                    op,
                    i
                );
            }
        }
    }
    // No over-admission: admissions never take the count above capacity (lowering capacity
    // lets running sessions finish).
    let held = m.held();
    let cap = if m.method() == QueueingMethod::Passthrough {
        u64::MAX
    } else {
        m.capacity()
    };
    prop_assert!(
        held <= cap.max(before_held),
        "step {}: {} held above capacity {}",
        step,
        held,
        m.capacity()
    );
    let f = qerr(rt.block_on(store.get_event(ev, m.now)))
        .unwrap()
        .figures;
    prop_assert_eq!(f.waiting, waiting_total, "step {}: figures.waiting", step);
    prop_assert_eq!(f.admitted + f.active, held, "step {}: figures held", step);
    // Every seat as the model has it: one state each, so never two holders or buyers.
    let inv = qerr(rt.block_on(store.inventory(ev, m.now))).unwrap();
    let got: BTreeMap<String, ItemState> = inv.items.into_iter().collect();
    prop_assert_eq!(got.len(), SEATS, "step {}: seats", step);
    for s in 0..SEATS {
        let want = match m.seats[s] {
            MSeat::Free => ItemState::Available,
            MSeat::Held(p, until) => ItemState::Held {
                seq: m.places[p].key.seq,
                until,
            },
            MSeat::Sold(p) => ItemState::Sold {
                seq: m.places[p].key.seq,
            },
        };
        prop_assert_eq!(got[&seat(s)], want, "step {} ({:?}): seat {}", step, op, s);
    }
    let held_seats = m
        .seats
        .iter()
        .filter(|s| matches!(s, MSeat::Held(..)))
        .count();
    prop_assert_eq!(
        inv.counts.held,
        held_seats as u64,
        "step {}: held count",
        step
    );
    // One place per user.
    for u in 0..USERS.len() {
        let live = m
            .places
            .iter()
            .filter(|p| {
                p.user == Some(u)
                    && matches!(p.state, MState::Waiting | MState::Admitted | MState::Active)
            })
            .count();
        prop_assert!(live <= 1, "step {}: user {} holds {} places", step, u, live);
    }
    Ok(())
}

/// The proptest entry point for a backend.
pub fn check_backend(make: impl Fn() -> Arc<dyn Store>, cases: u32, max_len: usize) {
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..max_len))| {
        run_history(make(), ops)?;
    });
}
