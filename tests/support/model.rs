//! A deliberately simple reference model of one event's queue (a vector of places in join
//! order, every answer computed by a linear scan) and a property test harness that drives a
//! `Store` and the model with the same random operations, checking after every step the six
//! guarantees: fair order, exact positions, no over-admission, one place per user, timely
//! expiry, and slots handed on.
//!
//! The model does not re-implement the token bucket of `admit_per_minute`: with a pace set,
//! it accepts the store's choice of *how many* to admit, and checks *which* (the first in
//! line), that it fits the room, and that the count stays within the configured budget.

#![allow(dead_code)]

use std::sync::Arc;

use proptest::prelude::*;
use proptest::sample::Index;
use waitroom::core::{
    EndCause, EventConfig, EventPatch, Millis, PlaceKey, PlaceState, QueueError, SaleEnd,
    EXPIRED_RETENTION_MS,
};
use waitroom::store::{JoinRequest, Store, StoreError};

const T0: Millis = 1_700_000_000_000;
const USERS: [&str; 4] = ["ann", "bob", "cy", "dee"];

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
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        1u64..4,
        prop_oneof![Just(1.0), Just(1.5), Just(2.0)],
        prop::bool::weighted(0.2),
        prop_oneof![3 => Just(None), 1 => (20u64..200).prop_map(Some)],
        1u64..6,
        1u64..6,
        2u64..12,
        1u64..8,
        prop_oneof![3 => Just(None), 1 => (1u64..6).prop_map(Some)],
        prop::bool::weighted(0.9),
    )
        .prop_map(|(m, r, p, apm, rt, si, sm, wi, mq, aj)| Settings {
            max_active: m,
            ratio: r,
            paused: p,
            admit_per_minute: apm,
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
}

struct Model {
    cfg: EventConfig,
    places: Vec<MPlace>,
    now: Millis,
    /// Admissions since the pace was last set, and when it was set, for the budget check.
    paced_admissions: u64,
    pace_since: Millis,
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
            MState::Waiting => Some(p.last_seen + s(c.waiting_idle_sec)),
            MState::Admitted => Some(p.admitted_at + s(c.ready_ttl_sec)),
            MState::Active => {
                Some((p.last_seen + s(c.session_idle_sec)).min(p.entered_at + s(c.session_max_sec)))
            }
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
    }

    fn waiting_indices(&self) -> Vec<usize> {
        (0..self.places.len())
            .filter(|&i| self.places[i].state == MState::Waiting)
            .collect()
    }

    fn position(&self, i: usize) -> u64 {
        self.places[..i]
            .iter()
            .filter(|p| p.state == MState::Waiting)
            .count() as u64
            + 1
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
        if self.cfg.paused || self.cfg.ended.is_some() {
            return 0;
        }
        let room = self.capacity().saturating_sub(self.held()) as usize;
        room.min(self.waiting_indices().len())
    }

    fn admit_first(&mut self, n: usize) {
        for i in self.waiting_indices().into_iter().take(n) {
            self.places[i].state = MState::Admitted;
            self.places[i].admitted_at = self.now;
            if self.cfg.admit_per_minute.is_some() {
                self.paced_admissions += 1;
            }
        }
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
    };
    let cfg = rt
        .block_on(store.put_event(ev, &patch_of(&initial), T0))
        .unwrap();
    let mut m = Model {
        cfg,
        places: Vec::new(),
        now: T0,
        paced_admissions: 0,
        pace_since: T0,
    };
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
                let mut live = user.and_then(|u| m.live_place_of(u));
                // A proven join does not adopt a place made without proof: it replaces it
                // (when a new place can be made at all), at the back of the queue.
                let squatted = live.filter(|&i| *proven && !m.places[i].proven);
                if let Some(i) = squatted {
                    live = None;
                    if m.places[i].state == MState::Waiting {
                        waiting -= 1;
                    }
                }
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
                let end = EventPatch {
                    end: Some(SaleEnd {
                        reason: EndCause::SoldOut,
                        message: None,
                        at: m.now,
                    }),
                    ..EventPatch::default()
                };
                m.cfg = qerr(rt.block_on(store.update_event(ev, &end, m.now))).unwrap();
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
                if cfg.admit_per_minute != m.cfg.admit_per_minute {
                    m.paced_admissions = 0;
                    m.pace_since = m.now;
                }
                // New timeouts apply at once: what they put behind `now` ends now.
                m.cfg = cfg;
                m.expire();
            }
        }
        after_step(&rt, &store, ev, &mut m, step, &op, before_held)?;
    }
    Ok(())
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
    prop_assert_eq!(
        &admitted[..],
        &waiting[..n],
        "step {}: admission out of order",
        step
    );
    if m.cfg.admit_per_minute.is_none() {
        prop_assert_eq!(n, room, "step {}: a free slot was not handed on", step);
    }
    m.admit_first(n);
    if let Some(rate) = m.cfg.admit_per_minute {
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
                prop_assert_eq!(
                    v.position,
                    Some(m.position(i)),
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
    prop_assert!(
        held <= m.capacity().max(before_held),
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
