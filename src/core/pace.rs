//! The admission pace: [`Pace`], what every backend estimates an ETA from, and the token
//! `Bucket` behind `admit_per_minute` (mirrored operation for operation by the Redis
//! script, so both backends admit at the same instants).

use super::Millis;

/// Width of the sliding window of admissions behind the ETA and `admitted_last_minute`.
pub const RATE_WINDOW_MS: Millis = 60_000;

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
}

impl Pace {
    /// Places per second: observed over the last minute (capped by the configured pace),
    /// else the configured pace, else capacity over the average session length.
    pub fn rate_per_sec(&self, now: Millis) -> f64 {
        let cfg_rate = self.admit_per_minute.map(|r| f64::from(r) / 60.0);
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

    /// Seconds until `position` is admitted at this pace, rounded up.
    pub fn eta(&self, position: u64, now: Millis) -> u64 {
        (position as f64 / self.rate_per_sec(now).max(1e-6)).ceil() as u64
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
    pub(super) fn burst(per_minute: u32) -> f64 {
        (f64::from(per_minute) / 60.0).ceil().max(1.0)
    }

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
        self.last = self.last.max(now);
    }

    /// When the next whole token will be there.
    pub(super) fn next_token_at(&self, per_minute: u32) -> Millis {
        let missing = (1.0 - self.tokens).max(0.0);
        self.last + (missing * 60_000.0 / f64::from(per_minute)).ceil() as Millis
    }
}
