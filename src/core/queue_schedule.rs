//! The schedule's rules inside [`EventQueue`] (a child of `queue.rs`, so it reads the
//! queue's fields): which line a waiting place stands in, the order of admission (the
//! shuffled pre-queue, then first come first served, or a lottery), the queueing methods'
//! own rules, and the opening and the end as operations reach them. The pure pieces are in
//! `core::schedule`.
//!
//! Waiting places stand in one of two lines: the pre-queue (`pre`: places that joined
//! before `opens_at`, ordered by their shuffle key) and the line behind it (`rank`: by join
//! sequence). Admission takes the pre-queue first. Both are ordered at insertion, so the
//! opening itself moves nothing: it is only the moment `admit` starts to let people in.

use super::super::schedule::{draw, in_prequeue, prequeue_key, QueueingMethod};
use super::{EventConfig, EventQueue, Millis, PlaceState, QueueError};

impl EventQueue {
    /// The sale has not opened yet at `now`: nobody is admitted. An opening once reached
    /// stays reached (`EventConfig::opening_reached`), whatever `now` says after it.
    pub(super) fn before_opening(&self, now: Millis) -> bool {
        self.config.opening_ahead(now).is_some()
    }

    /// The sale is open and its pre-queue still waits (`advance` admits then).
    pub(super) fn opening_due(&self, now: Millis) -> bool {
        !self.pre.is_empty() && self.config.opens_at.is_some() && !self.before_opening(now)
    }

    /// Records the opening when `now` reaches it (`advance`, first thing in every
    /// operation): the store then writes the settings, so that the opening stays reached
    /// across a restart whose clock is behind it.
    pub(super) fn note_opening(&mut self, now: Millis) {
        self.config.note_opening(now);
    }

    /// Remembers the first operation that finds the sale over by `closes_at`. Operations can
    /// reach the event stamped out of order (the scheduler stamps a whole pass before it
    /// ticks the events one by one, a request reads the clock before it waits, nodes'
    /// clocks differ): once a place was told the sale is over, one stamped earlier must not
    /// admit it or let a join in. Only the first such `now` is kept, so that (on Redis) the
    /// end is written once, not on every later operation. Kept in the settings
    /// (`EventConfig::end_seen_at`: the embedded store writes it with them, Redis in the
    /// meta's numbers), so that their readers (a node answering an error's `reason`) count
    /// it too.
    pub(super) fn note_end(&mut self, now: Millis) {
        let seen = self.config.end_seen_at.unwrap_or(0);
        if self.config.closes_at.is_some_and(|c| now >= c && seen < c) {
            self.config.end_seen_at = Some(now);
        }
    }

    /// Whether the sale is over for an operation at `now`, counting an end an operation
    /// already saw ([`Self::note_end`]; `EventConfig::sale_ended` does).
    pub(super) fn sale_over(&self, now: Millis) -> bool {
        self.config.sale_ended(now).is_some()
    }

    /// The time a join at `now` is recorded as made: `now`, but never before an opening
    /// already reached. The pre-queue is who joined before the opening, and a clock behind
    /// a recorded opening (a node whose clock lags, or this one's after a step back) must
    /// not put a late joiner ahead of those who joined after it.
    pub(super) fn join_time(&self, now: Millis) -> Millis {
        match self.config.opens_at {
            Some(t) if !self.before_opening(now) => now.max(t),
            _ => now,
        }
    }

    fn pre_key(&self, seq: u64) -> [u8; 32] {
        let secret = self
            .config
            .event_secret
            .expect("an event with opens_at has a secret");
        prequeue_key(&secret.shuffle_seed(), seq)
    }

    /// How many places wait, in both lines.
    pub(super) fn waiting_len(&self) -> u64 {
        self.rank.len() + self.pre.len()
    }

    /// Puts a waiting place in its line. (A place after the pre-queue is inside the rank
    /// window: the caller re-windows it first.)
    pub(super) fn line_insert(&mut self, seq: u64, joined_at: Millis) {
        if in_prequeue(self.config.opens_at, joined_at) {
            // The pre-queue's latest join, counted afresh once it was empty: kept rather
            // than found, and never lowered by a departure (`check_config`).
            if self.pre.is_empty() || joined_at > self.pre_last_join {
                self.pre_last_join = joined_at;
            }
            let key = self.pre_key(seq);
            self.pre.insert(&key, seq);
        } else {
            self.rank.insert(seq);
        }
    }

    /// Takes a waiting place out of its line.
    pub(super) fn line_remove(&mut self, seq: u64, joined_at: Millis) {
        if in_prequeue(self.config.opens_at, joined_at) {
            let key = self.pre_key(seq);
            self.pre.remove(&key, seq);
        } else {
            self.rank.remove(seq);
        }
    }

    /// The 1-based place of a waiting place in the order of admission.
    pub(super) fn line_position(&self, seq: u64, joined_at: Millis) -> u64 {
        if in_prequeue(self.config.opens_at, joined_at) {
            self.pre.rank(&self.pre_key(seq), seq).unwrap_or(0)
        } else {
            self.pre.len() + self.rank.count_below(seq) + 1
        }
    }

    /// The `k`-th waiting place (1-based) in the order of admission.
    pub(super) fn line_kth(&self, k: u64) -> Option<u64> {
        if k <= self.pre.len() {
            self.pre.kth(k)
        } else {
            self.rank.kth(k - self.pre.len())
        }
    }

    /// The place the next admission takes: the first in line, or under `random` the
    /// lottery's draw among all who wait (`core::schedule::draw`, numbered by admissions).
    pub(super) fn line_next(&self) -> Option<u64> {
        let n = self.waiting_len();
        if n == 0 {
            return None;
        }
        match (self.config.queueing_method, self.config.event_secret) {
            (QueueingMethod::Random, Some(secret)) => {
                self.line_kth(draw(&secret.lottery_key(), self.admissions, n) + 1)
            }
            _ => self.line_kth(1),
        }
    }

    /// Capacity and rate as the method sees them: `passthrough` has neither.
    pub(super) fn limits(&self) -> (u64, Option<u32>) {
        if self.config.queueing_method == QueueingMethod::Passthrough {
            (u64::MAX, None)
        } else {
            (self.config.capacity(), self.config.admit_per_minute)
        }
    }

    /// The `reject` rule: after the opening, a join that could not be admitted at once
    /// (nobody ahead, a free slot, rate budget, not paused) is refused. Before the opening
    /// joins wait in the pre-queue whatever the method. `replaced`: the state of the place
    /// a proven join ends if it gets in, whose slot or spot in line it counts as free.
    pub(super) fn check_reject(
        &mut self,
        now: Millis,
        replaced: Option<PlaceState>,
    ) -> Result<(), QueueError> {
        if self.config.queueing_method != QueueingMethod::Reject || self.before_opening(now) {
            return Ok(());
        }
        let (waiting, held) = match replaced {
            None => (0, 0),
            Some(PlaceState::Waiting) => (1, 0),
            Some(_) => (0, 1),
        };
        let room = self.admitted + self.active - held < self.config.capacity();
        let mut ok = !self.config.paused && self.waiting_len() - waiting == 0 && room;
        if let (true, Some(rate)) = (ok, self.config.admit_per_minute) {
            self.bucket.refill(rate, now);
            ok = self.bucket.tokens >= 1.0;
        }
        if ok {
            Ok(())
        } else {
            Err(QueueError::EventFull)
        }
    }

    /// Refuses settings whose `opens_at` would move a waiting place into or out of the
    /// pre-queue: with places waiting, `opens_at` may change only while both the old and
    /// the new time are ahead (a postponed or advanced opening), and the new one is after
    /// every join of the pre-queue. Also refuses reopening an ended sale while places it
    /// ended still wait to be removed (`lifecycle::reopen_allowed`).
    pub fn check_config(&self, new: &EventConfig, now: Millis) -> Result<(), QueueError> {
        schedule_change_allowed(
            self.config.opens_at,
            self.before_opening(now),
            new.opens_at,
            self.waiting_len(),
            self.rank.len(),
            self.pre_last_join,
            now,
        )?;
        // Both counting an end an operation already saw (`note_end`), as every rule does:
        // the new settings keep that record (`set_config`).
        let seen = self.config.end_seen_at.unwrap_or(0);
        crate::core::lifecycle::reopen_allowed(
            self.config.sale_ended(now),
            new.sale_ended(now.max(seen)),
            self.waiting_len(),
        )
    }

    /// [`Self::prequeue`] as the admin reads it: what is due ended first, as every read
    /// does, and nothing once the sale ended (every waiting place is over then, removed or
    /// not yet by `tick`'s batches).
    pub fn prequeue_now(
        &mut self,
        after: u64,
        limit: usize,
        now: Millis,
        fx: &mut Vec<super::Effect>,
    ) -> Vec<u64> {
        let _ = self.figures(now, fx);
        if self.closed {
            return Vec::new();
        }
        self.prequeue(after, limit)
    }

    /// The pre-queue's waiting places in join order, after `after`, at most `limit`.
    pub fn prequeue(&self, after: u64, limit: usize) -> Vec<u64> {
        // The table iterates in sequence order.
        self.places
            .iter()
            .filter(|(s, p)| {
                *s > after
                    && p.state == super::PlaceState::Waiting
                    && in_prequeue(self.config.opens_at, p.joined_at)
            })
            .map(|(s, _)| s)
            .take(limit)
            .collect()
    }
}

/// The rule of [`EventQueue::check_config`], shared with the Redis store's check (which
/// mirrors it in `ops.lua`). `old_ahead`: the old opening is still ahead
/// ([`EventConfig::opening_ahead`]: by this clock, and not recorded as reached).
/// `pre_last_join`: no waiting place of the pre-queue joined later (a high-water mark of
/// its joins, which a departure does not lower).
pub fn schedule_change_allowed(
    old: Option<Millis>,
    old_ahead: bool,
    new: Option<Millis>,
    waiting: u64,
    first_come: u64,
    pre_last_join: Millis,
    now: Millis,
) -> Result<(), QueueError> {
    let new_ahead = new.is_some_and(|t| now < t);
    // Both ahead, yet someone waits in the first-come line: a join past the opening that
    // no record tells of (a store written before openings were recorded). The change
    // would move that place into the pre-queue. Or both ahead, yet a place of the
    // pre-queue joined at or after the new time: a clock behind the joins (this one's
    // after a step back, or another node's) takes the change. Which line a place is in
    // comes from `joined_at < opens_at`, so the change would take the place out of the
    // pre-queue while it is held there.
    let keeps_prequeue = new.is_some_and(|t| t > pre_last_join);
    if old == new || waiting == 0 || (old_ahead && new_ahead && first_come == 0 && keeps_prequeue) {
        Ok(())
    } else {
        Err(QueueError::Invalid(SCHEDULE_LOCKED.into()))
    }
}

/// Why a change of `opens_at` was refused.
pub const SCHEDULE_LOCKED: &str =
    "opens_at cannot change now: places are waiting and the change would move them into or out of the pre-queue (it may move only while both times are ahead, and only to a time after every pre-queue join)";

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
