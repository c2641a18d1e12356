//! The admission pace: [`Pace`], what every backend estimates an ETA (and its range) from,
//! [`Holds`], the slot-time behind the capacity-bound pace, and the token `Bucket` behind
//! `admit_per_minute` (mirrored operation for operation by the Redis script, so both
//! backends admit at the same instants).
//!
//! **Why slot-time.** A capacity-bound event admits one person each time a slot frees, so
//! its steady pace is `capacity / mean hold` (a hold: from admission to the end of the
//! session, or of the ready window). The mean hold is estimated from the total slot-time
//! held by ended *and* live holds (see [`Pace::hold_weight`]), so that the first, shortest
//! sessions to end do not make the pace look faster than it is. Counting admissions over the last minute instead (what
//! the estimate used before) counts the first fill of every free slot as pace, and
//! overestimated the pace for the whole first minute of a sale (see docs/PERFORMANCE.md).

use super::Millis;

/// Width of the sliding window of admissions behind `admitted_last_minute`, and the check
/// of the estimate against what was observed.
pub const RATE_WINDOW_MS: Millis = 60_000;

/// Relative spread of an estimate that rests on the configured pace alone (the token
/// bucket admits evenly, so only the bucket's burst and rounding make it err).
const PACED_SPREAD: f64 = 0.1;
/// Assumed coefficient of variation of one hold: how much the time to the p-th free slot
/// varies, relative to its mean, is about this over sqrt(p).
const HOLD_CV: f64 = 0.4;
/// How many standard errors the range spans on each side.
const RANGE_SIGMAS: f64 = 1.0;

/// What the admission pace, and so the ETA, is estimated from. Every backend estimates
/// through this one function, so an ETA does not depend on where the queue lives.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Pace {
    /// Admissions in the last minute.
    pub recent_admissions: u64,
    pub first_admission_at: Option<Millis>,
    pub admit_per_minute: Option<u32>,
    pub capacity: u64,
    pub session_sum_ms: u64,
    pub session_count: u64,
    pub session_max_sec: u32,
    /// Admissions are stopped: nobody can say when they resume.
    pub paused: bool,
    /// Slot-time held so far by every hold, ended or live ([`Holds::total`]).
    pub hold_ms: u64,
    /// How many holds ended.
    pub hold_ends: u64,
    /// Live holds: admitted and active places.
    pub live: u64,
}

/// An estimated wait: the central figure and, when there is a basis for one, the range the
/// wait most likely falls in (`low <= sec <= high`). `None`: no basis (paused, or nothing
/// to estimate from yet).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Eta {
    pub sec: u64,
    pub range: Option<(u64, u64)>,
}

impl Pace {
    /// Places per second once slots free at the pace observed so far: the number of holds
    /// that ended per second of slot-time, times the capacity. `None` before any ended.
    fn capacity_rate(&self) -> Option<f64> {
        (self.hold_ends > 0).then(|| {
            let mean_hold_sec = (self.hold_ms.max(1) as f64 / 1000.0) / self.hold_weight();
            self.capacity as f64 / mean_hold_sec.max(1e-3)
        })
    }

    /// How many holds the slot-time stands for: the ended ones, and each live one as half
    /// of one. A live hold is, on average, about as far from its end as from its start
    /// (exactly so for holds of random length seen at a random moment), so its time so far
    /// is about half of its whole. Counting live holds as whole ones, or not at all, would
    /// make the first minutes of a sale look much slower or faster than they are.
    fn hold_weight(&self) -> f64 {
        self.hold_ends as f64 + self.live as f64 / 2.0
    }

    fn configured_rate(&self) -> Option<f64> {
        self.admit_per_minute.map(|r| f64::from(r) / 60.0)
    }

    /// Admissions per second over the last minute, when the whole minute lies after the
    /// first admission (so the first fill of the slots is no longer in it).
    fn settled_rate(&self, now: Millis) -> Option<f64> {
        let first = self.first_admission_at?;
        (now.saturating_sub(first) >= 2 * RATE_WINDOW_MS)
            .then(|| self.recent_admissions as f64 / (RATE_WINDOW_MS as f64 / 1000.0))
    }

    /// Whether the configured pace alone sets the pace up to `position`: there are free
    /// slots for everyone up to it, or slots cannot run out even if every session lasts
    /// its maximum, or the slots observed so far free faster than the pace.
    fn pace_binds(&self, position: u64) -> bool {
        let Some(cfg) = self.configured_rate() else {
            return false;
        };
        if self.live + position <= self.capacity {
            return true;
        }
        match self.capacity_rate() {
            Some(c) => cfg <= c,
            None => self.capacity as f64 / f64::from(self.session_max_sec.max(1)) >= cfg,
        }
    }

    /// Places per second: the configured pace, or the capacity-bound pace, whichever is
    /// slower; before any hold ended, the pace observed over the last minute (capped by
    /// the configured one), else the configured one, else capacity over the longest session.
    pub fn rate_per_sec(&self, now: Millis) -> f64 {
        let cfg_rate = self.configured_rate();
        if let Some(c) = self.capacity_rate() {
            return cfg_rate.map_or(c, |r| r.min(c));
        }
        if self.recent_admissions > 0 {
            let since = now.saturating_sub(self.first_admission_at.unwrap_or(now));
            let span = since.clamp(1000, RATE_WINDOW_MS) as f64 / 1000.0;
            let observed = self.recent_admissions as f64 / span;
            return cfg_rate.map_or(observed, |c| observed.min(c));
        }
        if let Some(c) = cfg_rate {
            return c;
        }
        let avg_session = self
            .session_sum_ms
            .checked_div(self.session_count)
            .map_or(f64::from(self.session_max_sec), |ms| ms as f64 / 1000.0);
        self.capacity as f64 / avg_session.max(1.0)
    }

    /// Places per second up to `position`: the configured pace where it alone sets the
    /// pace ([`Self::pace_binds`]), else [`Self::rate_per_sec`]. The admissions seen
    /// before any hold ended measure how many came as much as how fast the line moves:
    /// after a quiet spell they would make a binding pace look many times slower.
    fn rate_up_to(&self, position: u64, now: Millis) -> f64 {
        match self.configured_rate() {
            Some(c) if self.pace_binds(position) => c,
            _ => self.rate_per_sec(now),
        }
    }

    /// Seconds until `position` is admitted at this pace, rounded up.
    pub fn eta(&self, position: u64, now: Millis) -> u64 {
        (position as f64 / self.rate_up_to(position, now).max(1e-6)).ceil() as u64
    }

    /// The relative half-width of the range for `position`, or `None` without a basis.
    /// Unsure means wide: few holds ended (the mean hold is uncertain), a position near
    /// the front (few slots to free, each of random length), or a pace that disagrees with
    /// what the last minute showed.
    fn spread(&self, position: u64, now: Millis) -> Option<f64> {
        if self.paused {
            return None;
        }
        let mut w = if self.pace_binds(position) {
            PACED_SPREAD
        } else {
            if self.hold_ends == 0 {
                return None;
            }
            let var = 1.0 / self.hold_weight() + HOLD_CV * HOLD_CV / position.max(1) as f64;
            RANGE_SIGMAS * var.sqrt()
        };
        if let Some(seen) = self.settled_rate(now) {
            let r = self.rate_up_to(position, now).max(1e-6);
            w = w.max((seen - r).abs() / r);
        }
        Some(w)
    }

    /// The estimate for `position`, with its range.
    pub fn estimate(&self, position: u64, now: Millis) -> Eta {
        let sec = self.eta(position, now);
        let range = self.spread(position, now).map(|w| {
            let rate = self.rate_up_to(position, now).max(1e-6);
            let exact = position as f64 / rate;
            let mut low = (exact * (1.0 - w)).max(0.0).floor() as u64;
            // Under a binding pace the bucket may already hold up to a burst's worth of
            // the admissions ahead (earned since the last one, which the estimate does
            // not know): the turn can come that many intervals sooner. Without this, the
            // range of a place near the front of a slow line missed most waits (position
            // 1 at 6 a minute was told 9–11 s and came up anywhere within 10).
            if let Some(per_minute) = self.admit_per_minute.filter(|_| self.pace_binds(position)) {
                let ahead = position as f64 - Bucket::burst(per_minute);
                low = low.min((ahead / rate).max(0.0).floor() as u64);
            }
            let high = (exact * (1.0 + w)).ceil() as u64;
            (low.min(sec), high.max(sec))
        });
        Eta { sec, range }
    }
}

/// Slot-time held by admitted and active places: what [`Pace::capacity_rate`] reads.
/// Accrued whenever the number of live holds changes, so the total at any time is
/// `busy_ms + live × (now − since)`; integers only, mirrored by the Redis script.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Holds {
    pub busy_ms: u64,
    /// When `busy_ms` was last brought up to date; 0 before the first time.
    pub since: Millis,
    pub ends: u64,
}

impl Holds {
    /// Brings `busy_ms` up to `now`, with `live` holds running since the last time.
    pub fn accrue(&mut self, live: u64, now: Millis) {
        if self.since == 0 {
            self.since = now;
        } else if now > self.since {
            self.busy_ms = self.busy_ms.saturating_add(live * (now - self.since));
            self.since = now;
        }
    }

    /// One of `live` holds ended at `at` (noticed at `now`, after it ended for an expiry:
    /// the time between is not held).
    pub fn end(&mut self, live: u64, at: Millis, now: Millis) {
        self.accrue(live, now);
        self.busy_ms = self.busy_ms.saturating_sub(now.saturating_sub(at));
        self.ends += 1;
    }

    /// The slot-time held up to `now` by ended holds and the `live` ones.
    pub fn total(&self, live: u64, now: Millis) -> u64 {
        if self.since == 0 || now <= self.since {
            return self.busy_ms;
        }
        self.busy_ms.saturating_add(live * (now - self.since))
    }
}

/// Token bucket behind `admit_per_minute`. Its burst is one second's worth (at least one),
/// so the pace stays even instead of a whole minute's budget going out at once.
#[derive(Debug, Clone, Default)]
pub(super) struct Bucket {
    pub(super) tokens: f64,
    last: Millis,
    primed: bool,
}

impl Bucket {
    /// The bucket of a queue read back from disk: primed and empty as of `now`. What the
    /// old process had left is not persisted, and a full burst at every start let a
    /// process that restarts (or crash-loops) admit a second's worth each time, far past
    /// the cap. Empty, it admits after a restart no more than it could have without one:
    /// the tokens it would have had are at least zero.
    pub(super) fn restored(now: Millis) -> Bucket {
        Bucket {
            tokens: 0.0,
            last: now,
            primed: true,
        }
    }

    pub(super) fn burst(per_minute: u32) -> f64 {
        (f64::from(per_minute) / 60.0).ceil().max(1.0)
    }

    /// Adds the tokens earned since the last refill. A clock that went back (a step of
    /// the system clock, here or across a restart) adds nothing, and time counts from the
    /// new `now` on: keeping the latest time seen instead stalled every paced admission for
    /// as long as the step. (The Redis script keeps the latest time: its bucket is shared by
    /// nodes whose clocks disagree by a little, and counting from each one's own time
    /// would hand out the skew's worth of tokens at every change of node.)
    pub(super) fn refill(&mut self, per_minute: u32, now: Millis) {
        let burst = Self::burst(per_minute);
        if !self.primed {
            self.tokens = burst;
            self.primed = true;
        } else if now > self.last {
            self.tokens += (now - self.last) as f64 * f64::from(per_minute) / 60_000.0;
        }
        // Also caps what was saved under a faster pace when the pace is lowered.
        self.tokens = self.tokens.min(burst);
        self.last = now;
    }

    /// When the next whole token will be there.
    pub(super) fn next_token_at(&self, per_minute: u32) -> Millis {
        let missing = (1.0 - self.tokens).max(0.0);
        self.last + (missing * 60_000.0 / f64::from(per_minute)).ceil() as Millis
    }
}

#[cfg(test)]
#[path = "pace_tests.rs"]
mod tests;
