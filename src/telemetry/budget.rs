//! A budget of log lines for failures that repeat per request. When the store stops
//! answering during a flash crowd, every request failed with a warning and an error line
//! of its own: tens of thousands of lines a second to stderr, written by the workers that
//! should be answering, burying the first line that said why. A kind of line is now
//! written at most a few times per window; the next one written counts those left out.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Lines a second for each kind of failure logged per request (a store that does not
/// answer, an internal error, a server error's answer, an origin that does not answer).
pub const PER_REQUEST_LINES: u32 = 5;

/// At most `lines` lines per `every`; the rest are counted, not written.
#[derive(Debug)]
pub struct LogBudget {
    lines: u32,
    every: Duration,
    state: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    /// When the current window began; none before the first line.
    began: Option<Instant>,
    /// Lines written in it.
    used: u32,
    /// Lines left out since the last one written.
    left_out: u64,
}

impl LogBudget {
    pub const fn new(lines: u32, every: Duration) -> Self {
        LogBudget {
            lines,
            every,
            state: Mutex::new(Window {
                began: None,
                used: 0,
                left_out: 0,
            }),
        }
    }

    /// Whether a line may be written now: `Some(n)` with the number of lines of this kind
    /// left out since the last one written (to say in it), or `None` to leave it out.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut w = self.state.lock();
        if w.began
            .is_none_or(|b| now.saturating_duration_since(b) >= self.every)
        {
            w.began = Some(now);
            w.used = 0;
        }
        if w.used < self.lines {
            w.used += 1;
            Some(std::mem::take(&mut w.left_out))
        } else {
            w.left_out += 1;
            None
        }
    }
}

/// Writes a `tracing` event at `level` if `budget` admits it, with a `suppressed` field
/// (lines of its kind left out since the last one written) when some were.
macro_rules! log_within {
    ($budget:expr, $level:ident, target: $target:expr, $($rest:tt)+) => {
        match $budget.admit() {
            None => {}
            Some(0) => tracing::$level!(target: $target, $($rest)+),
            Some(suppressed) => tracing::$level!(target: $target, suppressed, $($rest)+),
        }
    };
    ($budget:expr, $level:ident, $($rest:tt)+) => {
        match $budget.admit() {
            None => {}
            Some(0) => tracing::$level!($($rest)+),
            Some(suppressed) => tracing::$level!(suppressed, $($rest)+),
        }
    };
}
pub(crate) use log_within;

#[cfg(test)]
mod tests {
    use super::*;

    /// The first lines of a window are written, the rest counted; the first line of a later
    /// window says how many were left out, and only it does.
    #[test]
    fn a_window_writes_its_lines_and_counts_the_rest() {
        let b = LogBudget::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(b.admit_at(at(0)), Some(0));
        assert_eq!(b.admit_at(at(10)), Some(0));
        assert_eq!(b.admit_at(at(20)), Some(0));
        for ms in [30, 40, 500, 999] {
            assert_eq!(b.admit_at(at(ms)), None, "at {ms} ms");
        }
        assert_eq!(
            b.admit_at(at(1000)),
            Some(4),
            "a new window tells the count"
        );
        assert_eq!(b.admit_at(at(1001)), Some(0), "once");
        // A quiet spell: the next line is written at once.
        assert_eq!(b.admit_at(at(60_000)), Some(0));
    }

    /// Many threads at once: exactly the budget's lines are written per window.
    #[test]
    fn racing_threads_share_one_budget() {
        let b = std::sync::Arc::new(LogBudget::new(5, Duration::from_secs(3600)));
        let written: u64 = (0..8)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || (0..1000).filter(|_| b.admit().is_some()).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap() as u64)
            .sum();
        assert_eq!(written, 5);
        assert_eq!(
            b.admit_at(Instant::now() + Duration::from_secs(3600)),
            Some(7995)
        );
    }
}
