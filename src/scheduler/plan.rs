//! The scheduler's plan: which event to tick next, and when to look again.
//!
//! Two ways lead to an event's tick, each with its own bound of ticks in flight:
//! - **due**: a deadline its last tick reported, or a change of its settings noticed (at
//!   once). These wait in a queue by time.
//! - **refresh**: rounds over every event in turn, each beginning [`MAX_SLEEP`] after the
//!   last one was through, as a pass over every event was followed by a sleep. An event
//!   whose reported deadline comes within [`MAX_SLEEP`] of its last tick is left out: that
//!   deadline's tick is its refresh.
//!
//! A round is a cursor over a list of the events, with no bookkeeping of its own per tick:
//! with 10,000 idle events on the embedded store, a queue by time for the refreshes (a
//! B-tree insert and removal per tick) tripled the scheduler's CPU.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{
    DUE_IN_FLIGHT, MAX_SLEEP, MIN_SLEEP, REFRESH_IN_FLIGHT, REFRESH_IN_FLIGHT_BEHIND, ROUND_BEHIND,
};
use crate::core::{Millis, QueueError};
use crate::store::{StoreError, StoreResult};

/// First and largest pause after a failed call (store unreachable). Doubling in between
/// keeps an outage from flooding the logs and the store with retries.
const BACKOFF_START: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// What finished: an event's tick, or a reading of the list of events.
pub(super) enum Done {
    Ticked {
        id: Arc<str>,
        kind: Kind,
        started: Instant,
        /// The time the tick was given.
        now: Millis,
        result: StoreResult<Option<Millis>>,
    },
    Listed {
        started: Instant,
        result: StoreResult<Vec<String>>,
    },
}

/// Why an event was ticked, which says whose bound of ticks in flight it counts in.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Due,
    Refresh,
}

/// A call that failed, tried again only once its pause is over; the pause doubles at each
/// failure, from [`BACKOFF_START`] to [`BACKOFF_MAX`].
#[derive(Clone, Copy)]
struct Backoff {
    until: Instant,
    pause: Duration,
}

impl Backoff {
    fn after(previous: Option<Backoff>) -> Backoff {
        let pause = previous.map_or(BACKOFF_START, |b| (b.pause * 2).min(BACKOFF_MAX));
        Backoff {
            until: Instant::now() + pause,
            pause,
        }
    }
}

/// Where an event waits among the due: its time, and a number that orders the events of
/// one instant by when they were queued (keys of numbers compare faster than ids).
type Place = (Instant, u64);

/// What the plan knows of one event.
struct Entry {
    /// Its tick is in flight.
    running: bool,
    /// When its last tick began.
    last: Option<Instant>,
    /// The deadline its last tick reported.
    reported: Option<Millis>,
    /// Its place among the due, if it is to be ticked for a deadline or a change.
    due: Option<Place>,
    /// A change was noticed while its tick was in flight: due at once after it.
    again: bool,
    /// Its last tick failed: left out until then. Each event is paused on its own, so that
    /// one that fails (on a Redis Cluster, its shard down) neither stops the others nor is
    /// asked at every turn, where each try may wait out the store's timeout.
    failed: Option<Backoff>,
    /// When the plan last heard that it exists (first known, created or changed): a
    /// listing begun before may not hold it yet, and must not forget it.
    since: Instant,
    /// Deleted or unlisted while its tick was in flight: forgotten once that tick is over
    /// (kept until then, so that an event listed again meanwhile is never ticked twice at
    /// once).
    gone: bool,
}

impl Entry {
    fn new(since: Instant) -> Entry {
        Entry {
            running: false,
            last: None,
            reported: None,
            due: None,
            again: false,
            failed: None,
            since,
            gone: false,
        }
    }
}

/// Every event's schedule, and the list's.
#[derive(Default)]
pub(super) struct Plan {
    events: HashMap<Arc<str>, Entry>,
    /// The due events, by time.
    due: BTreeMap<Place, Arc<str>>,
    queued: u64,
    /// The events of the current round of refreshes, and how far it got.
    round: Vec<Arc<str>>,
    /// When the current round began.
    round_began: Option<Instant>,
    cursor: usize,
    /// When the next round may begin (`None`: at once).
    next_round: Option<Instant>,
    /// The next round begins as soon as this one is through.
    hurry: bool,
    /// Ticks in flight of each kind.
    running_due: usize,
    running_refresh: usize,
    /// Events whose last tick failed.
    failed: usize,
    /// A listing is in flight.
    pub(super) listing: bool,
    /// When to read the list again (`None`: at once).
    list_at: Option<Instant>,
    /// The last listing failed: paused as an event is. On a Redis Cluster the list lives
    /// on one shard and the events on all: meanwhile the events known from the last
    /// listing tick on.
    list_failed: Option<Backoff>,
}

impl Plan {
    pub(super) fn failing(&self) -> bool {
        self.failed > 0 || self.list_failed.is_some()
    }

    pub(super) fn list_due(&self, at: Instant) -> bool {
        !self.listing && self.list_at.is_none_or(|t| t <= at)
    }

    /// Makes the event due at `at` (or not due, `None`), in place of any earlier time.
    fn set_due(&mut self, id: &Arc<str>, at: Option<Instant>) {
        let Some(e) = self.events.get_mut(id) else {
            return;
        };
        if let Some(p) = e.due.take() {
            self.due.remove(&p);
        }
        if let Some(at) = at {
            self.queued += 1;
            let place = (at, self.queued);
            self.due.insert(place, id.clone());
            e.due = Some(place);
        }
    }

    /// The next event to tick at `at`, if one is due and its kind has room in flight: a
    /// due one first, else the next of the round. It counts as in flight.
    pub(super) fn take_due(&mut self, at: Instant) -> Option<(Arc<str>, Kind)> {
        while self.running_due < DUE_IN_FLIGHT {
            let Some(entry) = self.due.first_entry().filter(|e| e.key().0 <= at) else {
                break;
            };
            let id = entry.remove();
            let e = self.events.get_mut(&id).expect("the due are known");
            e.due = None;
            // Due while a refresh of it is in flight: that tick answers its deadline anew.
            if e.running {
                continue;
            }
            e.running = true;
            self.running_due += 1;
            return Some((id, Kind::Due));
        }
        if self.running_refresh >= self.refresh_bound(at) {
            return None;
        }
        loop {
            if self.cursor == self.round.len() {
                if !self.round.is_empty() {
                    // Through: the next round MAX_SLEEP from now, as a pass was followed by
                    // a sleep. (Back to back, rounds over thousands of events kept Redis
                    // busy while the node was idle.)
                    self.round.clear();
                    self.cursor = 0;
                    let hurry = std::mem::take(&mut self.hurry);
                    self.next_round = (!hurry).then_some(at + MAX_SLEEP);
                }
                if self.events.is_empty() {
                    // Nothing to refresh: no round is waited for either (a time to begin
                    // one kept in the past made `wake` answer the past at every turn, a
                    // spin once the last event was deleted). The first event known begins
                    // one at once.
                    self.next_round = None;
                    return None;
                }
                if self.next_round.is_some_and(|t| t > at) {
                    return None;
                }
                self.round = self.events.keys().cloned().collect();
                self.round_began = Some(at);
            }
            let id = self.round[self.cursor].clone();
            self.cursor += 1;
            let Some(e) = self.events.get_mut(&id) else {
                continue; // forgotten since the round began
            };
            let paused = e.failed.is_some_and(|b| b.until > at);
            // Its deadline's tick comes within MAX_SLEEP of its last: that is its refresh.
            let soon = match (e.due, e.last) {
                (Some((t, _)), Some(last)) => t <= last + MAX_SLEEP,
                _ => false,
            };
            if e.running || paused || soon {
                continue;
            }
            e.running = true;
            self.running_refresh += 1;
            return Some((id, Kind::Refresh));
        }
    }

    /// Refreshes in flight at once: more once the round has lasted [`ROUND_BEHIND`], so that
    /// a round slowed down by other work (on Redis, a node serving thousands of joins a
    /// second beside thousands of events) still renews every lease before it lapses.
    fn refresh_bound(&self, at: Instant) -> usize {
        match self.round_began {
            Some(began) if !self.round.is_empty() && at >= began + ROUND_BEHIND => {
                REFRESH_IN_FLIGHT_BEHIND
            }
            _ => REFRESH_IN_FLIGHT,
        }
    }

    /// When the loop must look again, at the latest: the first due time or the next round,
    /// if their kind has room in flight, or the next listing (a finished call wakes it too).
    pub(super) fn wake(&self, at: Instant) -> Instant {
        let mut wake = at + MAX_SLEEP;
        if !self.listing {
            wake = wake.min(self.list_at.unwrap_or(at));
        }
        if self.running_due < DUE_IN_FLIGHT {
            if let Some(((t, _), _)) = self.due.first_key_value() {
                wake = wake.min(*t);
            }
        }
        if self.running_refresh < self.refresh_bound(at)
            && self.round.is_empty()
            && !self.events.is_empty()
        {
            if let Some(t) = self.next_round {
                wake = wake.min(t);
            }
        }
        wake
    }

    /// Takes in what finished; answers its error, if it failed.
    pub(super) fn done(&mut self, done: Done) -> Option<StoreError> {
        match done {
            Done::Ticked {
                id,
                kind,
                started,
                now,
                result,
            } => self.ticked(id, kind, started, now, result),
            Done::Listed { started, result } => self.listed(started, result),
        }
    }

    fn ticked(
        &mut self,
        id: Arc<str>,
        kind: Kind,
        started: Instant,
        now: Millis,
        result: StoreResult<Option<Millis>>,
    ) -> Option<StoreError> {
        match kind {
            Kind::Due => self.running_due -= 1,
            Kind::Refresh => self.running_refresh -= 1,
        }
        let e = self.events.get_mut(&id).expect("a tick in flight is known");
        e.running = false;
        if e.gone {
            self.remove(&id);
            return None;
        }
        e.last = Some(started);
        let again = std::mem::take(&mut e.again);
        let failed = e.failed.take();
        match result {
            Ok(next) => {
                if failed.is_some() {
                    self.failed -= 1;
                }
                let reported = std::mem::replace(&mut e.reported, next);
                if again {
                    self.set_due(&id, Some(Instant::now()));
                } else if e.due.is_none() || reported != next {
                    // (The same deadline again keeps its place: with thousands of events
                    // most ticks answer the one they answered before.)
                    let due = next.map(|t| {
                        started + Duration::from_millis(t.saturating_sub(now)).max(MIN_SLEEP)
                    });
                    self.set_due(&id, due);
                }
                None
            }
            // Deleted between listing and ticking: nothing to do. A listing that still
            // holds it brings it back.
            Err(StoreError::Queue(QueueError::EventNotFound)) => {
                e.failed = failed;
                if again {
                    // Deleted and made again while this tick ran, which came between the
                    // two: the new event is ticked at once, as its creation asked (not a
                    // listing and a round later).
                    e.reported = None;
                    if failed.is_none() {
                        self.set_due(&id, Some(Instant::now()));
                    }
                } else {
                    self.remove(&id);
                }
                None
            }
            Err(err) => {
                tracing::debug!(event = %id, error = %err, "tick of one event failed");
                if failed.is_none() {
                    self.failed += 1;
                }
                e.failed = Some(Backoff::after(failed));
                // Tried again by the first round after its pause; a change noticed
                // meanwhile waits for it too.
                e.reported = None;
                self.set_due(&id, None);
                Some(err)
            }
        }
    }

    fn listed(&mut self, started: Instant, result: StoreResult<Vec<String>>) -> Option<StoreError> {
        self.listing = false;
        let ids = match result {
            Ok(ids) => ids,
            Err(e) => {
                let b = Backoff::after(self.list_failed);
                self.list_failed = Some(b);
                self.list_at = Some(b.until);
                return Some(e);
            }
        };
        self.list_failed = None;
        self.list_at = Some(started + MAX_SLEEP);
        let listed: HashSet<&str> = ids.iter().map(String::as_str).collect();
        let gone: Vec<Arc<str>> = self
            .events
            .iter()
            .filter(|(id, e)| e.since < started && !listed.contains(&***id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            self.forget(&id);
        }
        // New ones are refreshed by the next round (a creation noticed is ticked at once).
        for id in ids {
            match self.events.get_mut(id.as_str()) {
                Some(e) => e.gone = false,
                None => {
                    self.events.insert(Arc::from(id), Entry::new(started));
                }
            }
        }
        None
    }

    /// The event's settings changed (or it was created): ticked at once, or again once its
    /// tick in flight is over. One that failed waits for its pause.
    pub(super) fn changed(&mut self, id: &str, at: Instant) {
        if !self.events.contains_key(id) {
            self.events.insert(Arc::from(id), Entry::new(at));
        }
        let e = self.events.get_mut(id).expect("just made");
        // A listing begun before this notice may have missed it (deleted and made again
        // meanwhile): it must not forget the event.
        e.since = e.since.max(at);
        if e.running {
            e.again = true;
            e.gone = false;
        } else if e.failed.is_none() {
            let id = Arc::from(id);
            self.set_due(&id, Some(at));
        }
    }

    /// Missed notices: every event again (the next round begins as soon as this one is
    /// through), and the list.
    pub(super) fn lagged(&mut self) {
        if self.round.is_empty() {
            self.next_round = None;
        } else {
            self.hurry = true;
        }
        if self.list_failed.is_none() {
            self.list_at = None;
        }
    }

    /// The event is gone: no more ticks (one in flight is answered into the void).
    pub(super) fn forget(&mut self, id: &str) {
        match self.events.get_mut(id) {
            Some(e) if e.running => {
                e.gone = true;
                e.again = false;
            }
            Some(_) => self.remove(id),
            None => {}
        }
    }

    /// Drops the event and its due time.
    fn remove(&mut self, id: &str) {
        let Some(e) = self.events.remove(id) else {
            return;
        };
        if let Some(p) = e.due {
            self.due.remove(&p);
        }
        if e.failed.is_some() {
            self.failed -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(plan: &mut Plan, started: Instant, ids: &[&str]) {
        let result = Ok(ids.iter().map(|s| s.to_string()).collect());
        assert!(plan.done(Done::Listed { started, result }).is_none());
    }

    fn ticked(
        plan: &mut Plan,
        id: &str,
        kind: Kind,
        at: Instant,
        result: StoreResult<Option<Millis>>,
    ) {
        let done = Done::Ticked {
            id: Arc::from(id),
            kind,
            started: at,
            now: 1_000_000,
            result,
        };
        plan.done(done);
    }

    /// Once its last event is gone the plan waits for nothing (defect: the time the next
    /// round could begin stayed in the past, `wake` answered it at every turn, and the
    /// loop spun a core until an event existed again).
    #[test]
    fn no_time_to_wake_in_the_past_once_the_last_event_is_gone() {
        let t0 = Instant::now();
        let mut plan = Plan::default();
        listed(&mut plan, t0, &["a"]);
        let (id, kind) = plan.take_due(t0).expect("the first round");
        assert_eq!(&*id, "a");
        ticked(&mut plan, "a", kind, t0, Ok(None));
        assert!(plan.take_due(t0).is_none(), "the round is through");
        plan.forget("a");
        let later = t0 + Duration::from_millis(300);
        assert!(plan.take_due(later).is_none());
        plan.listing = true; // the list's own time aside
        assert!(plan.wake(later) > later, "a wake-up in the past: a spin");
        // An event known again is refreshed at once.
        plan.listing = false;
        listed(&mut plan, later, &["b"]);
        assert_eq!(plan.take_due(later).map(|(id, _)| id), Some(Arc::from("b")));
    }

    /// An event deleted and made again while its tick ran, the tick between the two and so
    /// answering that it does not exist, is ticked at once, as its creation asked (defect:
    /// it was forgotten until a listing and a round later).
    #[test]
    fn an_event_made_again_while_its_tick_ran_is_ticked_at_once() {
        let t0 = Instant::now();
        let mut plan = Plan::default();
        listed(&mut plan, t0, &["x"]);
        let (_, kind) = plan.take_due(t0).expect("its refresh");
        plan.forget("x");
        let t1 = t0 + Duration::from_millis(1);
        plan.changed("x", t1);
        let gone = Err(StoreError::Queue(QueueError::EventNotFound));
        ticked(&mut plan, "x", kind, t0, gone);
        let now = Instant::now() + Duration::from_millis(2);
        assert!(matches!(plan.take_due(now), Some((id, Kind::Due)) if &*id == "x"));
    }

    /// A listing begun before an event was made again (deleted meanwhile) does not hold
    /// it: it must not forget the event its notice made due.
    #[test]
    fn a_listing_older_than_a_change_does_not_forget_the_event() {
        let t0 = Instant::now();
        let mut plan = Plan::default();
        listed(&mut plan, t0, &["x"]);
        let (_, kind) = plan.take_due(t0).expect("its refresh");
        ticked(&mut plan, "x", kind, t0, Ok(None));
        let listing_began = t0 + Duration::from_millis(10);
        let changed = t0 + Duration::from_millis(20);
        plan.changed("x", changed);
        listed(&mut plan, listing_began, &[]);
        assert!(matches!(plan.take_due(changed), Some((id, Kind::Due)) if &*id == "x"));
    }
}
