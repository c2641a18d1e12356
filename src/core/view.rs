//! What the queue tells the outside: a client's [`PlaceView`], the admin's [`HeadEntry`]
//! and [`EventFigures`]. Each is computed here, from the raw facts a backend holds
//! ([`PlaceFacts`], [`EventCounts`]), so the in-memory queue and the Redis store answer
//! with one formula rather than two copies of it.

use serde::Serialize;

use super::{EventConfig, Millis, Pace, PlaceKey};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PlaceState {
    Waiting,
    Admitted,
    Active,
}

/// The status a client is shown: a place's state, except that a waiting place of the
/// pre-queue is `pre-queue` until the opening.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShownStatus {
    PreQueue,
    Waiting,
    Admitted,
    Active,
}

/// What a client learns about its place.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlaceView {
    #[serde(skip)]
    pub key: PlaceKey,
    pub status: PlaceState,
    pub user_id: Option<String>,
    /// The join proved `user_id` (a user token or the server key): an access token says
    /// so (`user_verified`), since anyone may make a place with a bare id.
    #[serde(skip)]
    pub user_proven: bool,
    pub position: Option<u64>,
    pub queue_length: u64,
    pub eta_sec: Option<u64>,
    pub waited_sec: u64,
    pub joined_at: Millis,
    pub enter_within_sec: Option<u64>,
    pub entered_at: Option<Millis>,
    /// When the session ends at the latest (entered + `session_max_sec`); also the `exp` of
    /// its access tokens.
    pub session_ends_at: Option<Millis>,
    pub session_expires_in_sec: Option<u64>,
    /// The range the wait most likely falls in (`eta_sec` is its central figure); `None`
    /// while there is no basis for one (paused, or nothing to estimate from yet).
    pub eta_range: Option<(u64, u64)>,
    /// Seconds a polling client should wait before its next `status` ([`poll_after_sec`]).
    pub poll_after_sec: u64,
    /// The event's admissions are paused.
    pub paused: bool,
    /// Seconds until the opening, while the place waits in the pre-queue before it.
    pub opens_in_sec: Option<u64>,
    /// The place's rank in the shuffled pre-queue (among those of it still waiting), once
    /// the sale has opened.
    pub prequeue_rank: Option<u64>,
    /// `join` only: the unproven place of the same user this proven join ended, so that
    /// the node's gate stops passing its session at once, as after a `leave`.
    #[serde(skip)]
    pub replaced: Option<PlaceKey>,
}

impl PlaceView {
    pub fn shown_status(&self) -> ShownStatus {
        match self.status {
            PlaceState::Waiting if self.opens_in_sec.is_some() => ShownStatus::PreQueue,
            PlaceState::Waiting => ShownStatus::Waiting,
            PlaceState::Admitted => ShownStatus::Admitted,
            PlaceState::Active => ShownStatus::Active,
        }
    }
}

/// Shortest polling interval a client is told; also the interval of places no longer
/// waiting (their next step should not be late).
pub const POLL_MIN_SEC: u64 = 2;
/// Longest polling interval, however far back: the page's figures stay fresh enough.
pub const POLL_MAX_SEC: u64 = 60;

/// How long a polling client should wait before asking again: a quarter of the earliest
/// it could be admitted (about 1 s per place ahead when there is no estimate), so people
/// far back ask rarely and those near the front often. Never more than a third of
/// `waiting_idle_sec` (a place that does not poll within it is removed: three chances) nor
/// of `ready_ttl_sec` (an admission the estimate did not foresee must not lapse unseen),
/// and never less than [`POLL_MIN_SEC`] unless those bounds are smaller still (then 1 s).
pub fn poll_after_sec(position: Option<u64>, eta_low: Option<u64>, t: &Timeouts) -> u64 {
    let ceiling = (t.waiting_idle_ms.min(t.ready_ttl_ms) / 3000).clamp(1, POLL_MAX_SEC);
    let Some(pos) = position else {
        return POLL_MIN_SEC.min(ceiling);
    };
    // Without a range, the earliest is taken as a second per place ahead (a quarter of
    // it, as of a range's low end).
    let want = eta_low.unwrap_or(pos) / 4;
    want.clamp(POLL_MIN_SEC.min(ceiling), ceiling)
}

/// How late past the interval it was told a poller may come back and still find its place
/// after `waiting_idle_sec` was lowered ([`lowered_idle_floor`]).
pub const POLL_SLACK_MS: Millis = 1000;

/// The earliest a waiting place may end after the waiting idle time was lowered at `now`
/// from the settings `old`: not before a poller told the longest interval they gave
/// ([`poll_after_sec`]'s ceiling) could come back, with [`POLL_SLACK_MS`] to spare. A
/// client far back in line was told to come back in up to a minute, and a page without
/// script reloads after it; a live stream renews its place at the change. A floor of the
/// deadline, not of the last sign of life: a second lowering soon after keeps the first
/// one's promise. The Redis rules compute the same (ops.lua `op_put`, rules.lua `wfloor`).
pub fn lowered_idle_floor(old: &Timeouts, now: Millis) -> Millis {
    let told = (old.waiting_idle_ms.min(old.ready_ttl_ms) / 3000).clamp(1, POLL_MAX_SEC) * 1000;
    now + told + POLL_SLACK_MS
}

/// One row of `GET /admin/events/{id}/queue`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct HeadEntry {
    pub position: u64,
    /// The place's number, as its join and every `status` answer it: an anonymous place
    /// has no `user_id`, and this is how an operator names it.
    pub place_id: u64,
    pub user_id: Option<String>,
    /// Unix ms.
    #[schema(value_type = u64)]
    pub joined_at: Millis,
    pub eta_sec: u64,
}

/// Counts and rates of one event.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct EventFigures {
    pub waiting: u64,
    pub admitted: u64,
    pub active: u64,
    pub completed: u64,
    pub left: u64,
    pub expired: u64,
    pub capacity: u64,
    pub available_slots: u64,
    pub avg_wait_sec: f64,
    pub admitted_last_minute: u64,
    pub joins: u64,
    pub admissions: u64,
}

fn secs_ceil(ms: Millis) -> u64 {
    ms.div_ceil(1000)
}

/// The timeouts of an event in milliseconds: what a place's deadline is computed from.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub waiting_idle_ms: Millis,
    pub ready_ttl_ms: Millis,
    pub session_idle_ms: Millis,
    pub session_max_ms: Millis,
    /// What lowerings of `ready_ttl_ms` promised the places they found ([`ReadyKept`]).
    pub ready_kept: ReadyKept,
}

/// What a lowered ready window leaves the admitted places (all 0: never lowered), so that
/// none ends before what it was told: a place admitted before the lowering keeps the
/// window of its admission (`enter_within_sec`), and none ends before a poller told the
/// old interval could be back to learn of its turn ([`lowered_idle_floor`]). Places
/// admitted later get the new window. The Redis rules keep the same (rules.lua `rkb`,
/// `rkept`, `rfloor`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadyKept {
    /// The last lowering: places admitted before it keep at least...
    pub before: Millis,
    /// ...this window (the window before it, or a longer one an earlier lowering kept
    /// that some place may still hold).
    pub window_ms: Millis,
    /// No admitted place ends before this.
    pub floor: Millis,
}

impl ReadyKept {
    /// After the window was lowered at `now` from the settings `old`.
    pub fn lowered(self, old: &Timeouts, now: Millis) -> ReadyKept {
        // An earlier lowering's promise still held by some place is kept too.
        let held = self.before + self.window_ms > now;
        ReadyKept {
            before: now,
            window_ms: if held {
                self.window_ms.max(old.ready_ttl_ms)
            } else {
                old.ready_ttl_ms
            },
            floor: self.floor.max(lowered_idle_floor(old, now)),
        }
    }

    /// The deadline of a place admitted at `admitted_at` whose window by the settings ends
    /// at `by_settings`.
    fn deadline(&self, admitted_at: Millis, by_settings: Millis) -> Millis {
        let kept = if admitted_at < self.before {
            admitted_at + self.window_ms
        } else {
            0
        };
        by_settings.max(kept).max(self.floor)
    }
}

impl Timeouts {
    pub fn of(c: &EventConfig) -> Self {
        let ms = |sec: u32| Millis::from(sec) * 1000;
        Timeouts {
            waiting_idle_ms: ms(c.waiting_idle_sec),
            ready_ttl_ms: ms(c.ready_ttl_sec),
            session_idle_ms: ms(c.session_idle_sec),
            session_max_ms: ms(c.session_max_sec),
            ready_kept: ReadyKept::default(),
        }
    }

    /// When a place in `state` ends unless something renews it: a waiting place when its
    /// page stops polling, an admitted one when its ready window closes, a session when it
    /// idles or reaches its maximum, whichever comes first. (`last_seen` is the last
    /// heartbeat of the waiting page or of the session.)
    pub fn deadline(
        &self,
        state: PlaceState,
        last_seen: Millis,
        admitted_at: Millis,
        entered_at: Millis,
    ) -> Millis {
        match state {
            PlaceState::Waiting => last_seen + self.waiting_idle_ms,
            PlaceState::Admitted => self
                .ready_kept
                .deadline(admitted_at, admitted_at + self.ready_ttl_ms),
            PlaceState::Active => {
                (last_seen + self.session_idle_ms).min(entered_at + self.session_max_ms)
            }
        }
    }
}

/// The raw facts of one live place, as a backend holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaceFacts {
    pub key: PlaceKey,
    pub state: PlaceState,
    pub user_id: Option<String>,
    /// The join proved `user_id` (never for a place without one).
    pub user_proven: bool,
    pub joined_at: Millis,
    /// Meaningful once admitted.
    pub admitted_at: Millis,
    /// Meaningful once entered.
    pub entered_at: Millis,
    /// The last heartbeat; only a session's deadline is shown, so only a session's matters.
    pub last_seen: Millis,
    /// The 1-based position; only read for a waiting place.
    pub position: u64,
    /// How many places wait.
    pub queue_length: u64,
    /// The place waits in the pre-queue (it joined before `opens_at`).
    pub pre_queue: bool,
    /// The event's `opens_at` while the opening is ahead (`EventConfig::opening_ahead`);
    /// `None` once it was reached, by this clock or by a record of an earlier operation.
    pub opens_at: Option<Millis>,
    /// The event draws its admissions by lottery (`random`): no place has a position.
    pub lottery: bool,
}

impl PlaceView {
    /// The view of a place at `now`, given its event's timeouts and pace.
    pub fn new(f: PlaceFacts, t: &Timeouts, pace: &Pace, now: Millis) -> Self {
        let waiting = f.state == PlaceState::Waiting;
        // Before the opening a pre-queue place has no position yet: the order is drawn
        // from a seed nobody knows until then.
        let opens_in_ms = f
            .opens_at
            .filter(|_| waiting && f.pre_queue)
            .and_then(|t| t.checked_sub(now))
            .filter(|&ms| ms > 0);
        let before = opens_in_ms.is_some();
        // A lottery has no order: the estimate is that of the middle of the line, the
        // mean rank of a uniformly drawn place.
        let position = (waiting && !before && !f.lottery).then_some(f.position);
        let basis = if f.lottery {
            (waiting && !before).then(|| f.queue_length.div_ceil(2).max(1))
        } else {
            position
        };
        let active = f.state == PlaceState::Active;
        let eta = basis.map(|pos| pace.estimate(pos, now));
        let eta_range = match eta {
            Some(e) => e.range,
            None if before => None,
            // Not waiting: nothing left to wait for, and that is certain.
            None => Some((0, 0)),
        };
        let opens_in_sec = opens_in_ms.map(secs_ceil);
        let poll_after = match opens_in_sec {
            // A quarter of the time to the opening, as for a far-back place.
            Some(sec) => poll_after_sec(Some(1), Some(sec), t),
            None => poll_after_sec(position.or(basis), eta_range.map(|r| r.0), t),
        };
        let left_sec = || {
            secs_ceil(
                t.deadline(f.state, f.last_seen, f.admitted_at, f.entered_at)
                    .saturating_sub(now),
            )
        };
        PlaceView {
            key: f.key,
            status: f.state,
            position,
            queue_length: f.queue_length,
            eta_sec: Some(eta.map_or(opens_in_sec.unwrap_or(0), |e| e.sec)),
            eta_range,
            poll_after_sec: poll_after,
            paused: pace.paused,
            opens_in_sec,
            prequeue_rank: (waiting && f.pre_queue && !before && !f.lottery).then_some(f.position),
            waited_sec: now.saturating_sub(f.joined_at) / 1000,
            joined_at: f.joined_at,
            enter_within_sec: (f.state == PlaceState::Admitted).then(left_sec),
            entered_at: active.then_some(f.entered_at),
            session_ends_at: active.then_some(f.entered_at + t.session_max_ms),
            session_expires_in_sec: active.then(left_sec),
            user_proven: f.user_proven && f.user_id.is_some(),
            user_id: f.user_id,
            replaced: None,
        }
    }
}

/// The counts of one event that its figures are computed from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventCounts {
    pub waiting: u64,
    pub admitted: u64,
    pub active: u64,
    pub completed: u64,
    pub left: u64,
    pub expired: u64,
    pub capacity: u64,
    /// Total time admitted places waited, behind the average wait.
    pub wait_sum_ms: u64,
    /// Admissions in the last [`super::pace::RATE_WINDOW_MS`].
    pub recent_admissions: u64,
    pub joins: u64,
    pub admissions: u64,
}

impl From<EventCounts> for EventFigures {
    fn from(c: EventCounts) -> Self {
        EventFigures {
            waiting: c.waiting,
            admitted: c.admitted,
            active: c.active,
            completed: c.completed,
            left: c.left,
            expired: c.expired,
            capacity: c.capacity,
            available_slots: c.capacity.saturating_sub(c.admitted + c.active),
            avg_wait_sec: c
                .wait_sum_ms
                .checked_div(c.admissions)
                .map_or(0.0, |ms| ms as f64 / 1000.0),
            admitted_last_minute: c.recent_admissions,
            joins: c.joins,
            admissions: c.admissions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A quarter of the earliest the turn could come: of the range's low end, or, without
    /// a range, of a second per place ahead (defect: without one, the second per place
    /// itself, four times as long as API.md says).
    #[test]
    fn polls_come_a_quarter_of_the_earliest_turn_apart() {
        let t = Timeouts {
            waiting_idle_ms: 300_000,
            ready_ttl_ms: 600_000,
            ..Timeouts::default()
        };
        assert_eq!(poll_after_sec(Some(20), None, &t), 5);
        assert_eq!(poll_after_sec(Some(100), None, &t), 25);
        assert_eq!(poll_after_sec(Some(100), Some(40), &t), 10);
        // At least 2, at most 60 and a third of the idle time.
        assert_eq!(poll_after_sec(Some(3), None, &t), 2);
        assert_eq!(poll_after_sec(Some(1000), None, &t), 60);
        let short = Timeouts {
            waiting_idle_ms: 30_000,
            ..t
        };
        assert_eq!(poll_after_sec(Some(1000), None, &short), 10);
    }
}
