//! Time in which this node did not run, or that its wall clock skipped, kept out of the
//! places' idle deadlines (embedded store).
//!
//! Idle deadlines count wall-clock time from a place's last poll. While the process is
//! frozen (`SIGSTOP`, `docker pause`, a paused VM) nobody's poll can reach it, and a
//! forward step of the wall clock makes time pass that nobody could poll in: either way,
//! without this, the first tick afterwards expired every waiting place and every session
//! that had polled as told. A restart gives every place a fresh idle period (heartbeats
//! are not persisted); a stall now moves every place's last poll forward by the time lost,
//! so the idle periods resume where they were.
//!
//! A thread beats every [`BEAT`]. The time lost is what passed between two looks at the
//! clocks beyond the beat (more than [`SLACK`]: a node only slowed by load loses nothing),
//! plus what the wall clock moved beyond the monotonic one. Every operation on an event
//! looks too before it applies anything ([`Stalls::lost`]), so the first one after a stall,
//! whichever thread runs first, already finds it counted; each event applies the total
//! lost since it last looked ([`Stalls::apply`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::clock::system_now;
use crate::core::{EventQueue, Millis};

/// How often the watcher looks at the clocks.
const BEAT: Duration = Duration::from_millis(100);
/// A gap between looks longer than the beat by more than this is time lost.
const SLACK: Millis = 1_000;

struct Look {
    /// Monotonic milliseconds since [`Stalls::start`] and wall-clock milliseconds, taken
    /// together at the last look.
    mono: Millis,
    wall: Millis,
}

pub struct Stalls {
    start: Instant,
    last: Mutex<Look>,
    /// The last look's monotonic time, readable without the lock.
    last_mono: AtomicU64,
    /// The last look's wall-clock time, readable without the lock.
    last_wall: AtomicU64,
    /// Milliseconds lost since the node started.
    total: AtomicU64,
}

impl Stalls {
    /// Starts watching, on a thread that ends when the answer is dropped; `None` (logged)
    /// if the thread cannot start: without it every quiet second between two requests
    /// would read as a stall.
    pub fn start() -> Option<Arc<Stalls>> {
        let stalls = Arc::new(Stalls::new(Instant::now()));
        let weak: Weak<Stalls> = Arc::downgrade(&stalls);
        let started = std::thread::Builder::new()
            .name("waitroom-stalls".into())
            .spawn(move || loop {
                std::thread::sleep(BEAT);
                match weak.upgrade() {
                    Some(s) => s.look(),
                    None => return,
                };
            });
        match started {
            Ok(_) => Some(stalls),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the stall watcher; a frozen node's places may expire");
                None
            }
        }
    }

    /// Whose last look was at `start` (no watcher).
    fn new(start: Instant) -> Stalls {
        let now = system_now();
        Stalls {
            start,
            last: Mutex::new(Look { mono: 0, wall: now }),
            last_mono: AtomicU64::new(0),
            last_wall: AtomicU64::new(now),
            total: AtomicU64::new(0),
        }
    }

    fn mono(&self) -> Millis {
        self.start.elapsed().as_millis() as Millis
    }

    /// Takes a look at both clocks and counts what was lost since the last one.
    fn look(&self) -> Millis {
        let mut last = self.last.lock();
        let (mono, wall) = (self.mono(), system_now());
        let ran = mono.saturating_sub(last.mono);
        let frozen = ran.saturating_sub(BEAT.as_millis() as Millis);
        let frozen = if frozen > SLACK { frozen } else { 0 };
        // A wall clock stepped back loses nothing: deadlines only come later.
        let stepped = wall.saturating_sub(last.wall).saturating_sub(ran);
        let stepped = if stepped > SLACK { stepped } else { 0 };
        *last = Look { mono, wall };
        // The total first: a `lost` that reads this look's times (and so skips looking)
        // must read a total that already holds what this look found.
        let total = self.total.fetch_add(frozen + stepped, Ordering::AcqRel) + frozen + stepped;
        self.last_mono.store(mono, Ordering::Release);
        self.last_wall.store(wall, Ordering::Release);
        total
    }

    /// Milliseconds lost since the node started, including a stall that ended a moment ago
    /// and the watcher has not looked at yet.
    pub fn lost(&self) -> Millis {
        let mono = self.mono();
        let since = mono.saturating_sub(self.last_mono.load(Ordering::Acquire));
        let wall = system_now().saturating_sub(self.last_wall.load(Ordering::Acquire));
        if since > SLACK || wall.saturating_sub(since) > SLACK {
            return self.look();
        }
        self.total.load(Ordering::Acquire)
    }

    /// Moves the last polls of `queue`'s places forward by what was lost since `applied`
    /// (what this event already applied), and records that it has.
    pub fn apply(&self, applied: &mut Millis, queue: &mut EventQueue) {
        let lost = self.lost();
        if lost > *applied {
            queue.forgive_idle(lost - *applied);
            *applied = lost;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freeze_longer_than_the_slack_is_lost_time_and_a_short_pause_is_not() {
        let begun = Instant::now();
        let s = Stalls::new(begun);
        std::thread::sleep(Duration::from_millis(300));
        let lost = s.lost();
        // (Unless this thread itself was held off its core for a second meanwhile.)
        if begun.elapsed() < Duration::from_millis(1_000) {
            assert_eq!(lost, 0, "300 ms without a look lose nothing");
        }
        // As if the whole process had stopped for 5 s since its last look.
        let s = Stalls::new(Instant::now() - Duration::from_secs(5));
        let lost = s.lost();
        assert!((4_800..=6_000).contains(&lost), "{lost}");
        assert_eq!(s.lost(), lost, "counted once");
    }

    #[test]
    fn a_forward_step_of_the_wall_clock_is_lost_time() {
        let s = Stalls::new(Instant::now());
        // As if the wall clock had been 60 s behind at the last look.
        {
            let mut last = s.last.lock();
            last.wall -= 60_000;
            s.last_wall.store(last.wall, Ordering::Release);
        }
        let lost = s.lost();
        assert!((59_000..=60_100).contains(&lost), "{lost}");
        assert_eq!(s.lost(), lost, "counted once");
    }

    #[test]
    fn the_watcher_looks_on_its_own() {
        let s = Stalls::start().expect("the watcher starts");
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.last_mono.load(Ordering::Acquire) == 0 {
            assert!(Instant::now() < deadline, "the watcher never looked");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
