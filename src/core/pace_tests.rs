//! Unit tests of the estimator in `pace.rs`, against simulated admission histories: a
//! deterministic simulation drives the real queue rules (`EventQueue`) with a crowd that
//! joins, enters when admitted and holds a session of random length, and compares the
//! estimate each waiting person is shown with the wait that followed.
//!
//! `cargo test --lib pace -- --nocapture` prints the figures quoted in
//! docs/PERFORMANCE.md (before: the previous estimator, the pace observed over the last
//! minute since the first admission, applied to the same histories).

use super::*;
use crate::core::queue::{EventQueue, JoinProof};
use crate::core::{Effect, EventConfig, PlaceState};

/// splitmix64: a few lines of deterministic randomness, so every run is the same.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// The estimator this one replaced: admissions over the last minute since the first one,
/// capped by the configured pace; else the configured pace; else capacity over the average
/// (or longest) session.
fn previous_eta(p: &Pace, position: u64, now: Millis) -> u64 {
    let cfg = p.admit_per_minute.map(|r| f64::from(r) / 60.0);
    let rate = if p.recent_admissions > 0 {
        let since = now.saturating_sub(p.first_admission_at.unwrap_or(now));
        let observed =
            p.recent_admissions as f64 / (since.clamp(1000, RATE_WINDOW_MS) as f64 / 1000.0);
        cfg.map_or(observed, |c| observed.min(c))
    } else if let Some(c) = cfg {
        c
    } else {
        let avg = p
            .session_sum_ms
            .checked_div(p.session_count)
            .map_or(f64::from(p.session_max_sec), |ms| ms as f64 / 1000.0);
        p.capacity as f64 / avg.max(1.0)
    };
    (position as f64 / rate.max(1e-6)).ceil() as u64
}

struct Scenario {
    config: EventConfig,
    people: u64,
    /// Time between two arrivals.
    arrive_every: Millis,
    /// A session lasts this long (uniform), from entering.
    session_ms: (Millis, Millis),
    /// A person enters this long after being admitted (the page reacting).
    enter_ms: (Millis, Millis),
    /// Estimates are also read every this long while waiting, not only at join.
    sample_every: Millis,
    seed: u64,
}

/// One estimate shown to someone, and the wait that followed it.
#[derive(Debug, Clone, Copy)]
struct Shown {
    eta: Eta,
    previous: u64,
    actual_ms: Millis,
}

/// Runs the crowd in 10 ms steps and answers every estimate shown while waiting.
fn simulate(s: &Scenario) -> Vec<Shown> {
    const STEP: Millis = 10;
    let mut rng = Rng(s.seed);
    let mut q = EventQueue::new(s.config.clone());
    let proof = JoinProof::default();
    // Per person: key, joined at, admitted at, enter at, complete at.
    let mut keys = Vec::new();
    let mut admitted_at: Vec<Option<Millis>> = Vec::new();
    let mut pending: Vec<(Millis, usize, bool)> = Vec::new(); // (when, who, true = complete)
                                                              // (who, shown at, position, eta, previous eta)
    let mut samples: Vec<(usize, Millis, u64, Eta, u64)> = Vec::new();
    let mut now: Millis = 1_000_000;
    let mut fx = Vec::new();
    let by_seq =
        |keys: &Vec<crate::core::PlaceKey>, seq: u64| keys.iter().position(|k| k.seq == seq);
    while (keys.len() as u64) < s.people || admitted_at.iter().any(Option::is_none) {
        if (keys.len() as u64) < s.people && now >= 1_000_000 + keys.len() as u64 * s.arrive_every {
            let v = q
                .join(keys.len() as u128 + 1, None, None, proof, now, &mut fx)
                .unwrap();
            keys.push(v.key);
            admitted_at.push(None);
        }
        q.tick(now, &mut fx);
        pending.sort_unstable();
        while pending.first().is_some_and(|p| p.0 <= now) {
            let (_, who, complete) = pending.remove(0);
            if complete {
                q.complete(keys[who], now, &mut fx).unwrap();
            } else {
                q.enter(keys[who], now, &mut fx).unwrap();
                pending.push((now + rng.between(s.session_ms.0, s.session_ms.1), who, true));
            }
        }
        for e in fx.drain(..) {
            if let Effect::Admitted { seq, at } = e {
                let who = by_seq(&keys, seq).expect("a person of the crowd");
                admitted_at[who] = Some(at);
                pending.push((at + rng.between(s.enter_ms.0, s.enter_ms.1), who, false));
            }
        }
        for (who, key) in keys.iter().enumerate() {
            if admitted_at[who].is_some() {
                continue;
            }
            let joined = 1_000_000 + who as u64 * s.arrive_every;
            if (now - joined) % s.sample_every != 0 {
                continue;
            }
            let v = q.peek(*key, now, &mut fx).unwrap();
            assert_eq!(v.status, PlaceState::Waiting);
            let pos = v.position.unwrap();
            let pace = q.pace(now);
            let eta = pace.estimate(pos, now);
            assert_eq!(Some(eta.sec), v.eta_sec, "the view shows the estimate");
            assert_eq!(eta.range, v.eta_range);
            samples.push((who, now, pos, eta, previous_eta(&pace, pos, now)));
        }
        now += STEP;
    }
    samples
        .into_iter()
        .map(|(who, at, _position, eta, previous)| Shown {
            eta,
            previous,
            actual_ms: admitted_at[who].unwrap() - at,
        })
        .collect()
}

#[derive(Debug)]
struct Score {
    shown: usize,
    mape: f64,
    within_20: f64,
    previous_mape: f64,
    previous_within_20: f64,
    /// Shares of the estimates with a range, and of those whose range held the wait.
    with_range: f64,
    range_held: f64,
    /// Mean width of the ranges of waits of 10 s or more, relative to the central estimate.
    range_width: f64,
}

/// The score of the estimates of waits of at least `min_wait_ms`.
fn score(shown: &[Shown], min_wait_ms: Millis) -> Score {
    let s: Vec<&Shown> = shown
        .iter()
        .filter(|s| s.actual_ms >= min_wait_ms)
        .collect();
    let n = s.len() as f64;
    let err = |eta: u64, actual: Millis| {
        (eta as f64 - actual as f64 / 1000.0).abs() / (actual as f64 / 1000.0)
    };
    let ranged: Vec<_> = s
        .iter()
        .filter_map(|x| x.eta.range.map(|r| (x, r)))
        .collect();
    Score {
        shown: s.len(),
        mape: s.iter().map(|x| err(x.eta.sec, x.actual_ms)).sum::<f64>() / n,
        within_20: s
            .iter()
            .filter(|x| err(x.eta.sec, x.actual_ms) <= 0.2)
            .count() as f64
            / n,
        previous_mape: s.iter().map(|x| err(x.previous, x.actual_ms)).sum::<f64>() / n,
        previous_within_20: s
            .iter()
            .filter(|x| err(x.previous, x.actual_ms) <= 0.2)
            .count() as f64
            / n,
        with_range: ranged.len() as f64 / n,
        range_held: ranged
            .iter()
            .filter(|(x, (lo, hi))| {
                let a = x.actual_ms as f64 / 1000.0;
                *lo as f64 - 1.0 <= a && a <= *hi as f64 + 1.0
            })
            .count() as f64
            / ranged.len().max(1) as f64,
        // Over waits of 10 s and more: whole seconds make the range of a short wait wide.
        range_width: {
            let long: Vec<_> = ranged.iter().filter(|(x, _)| x.eta.sec >= 10).collect();
            long.iter()
                .map(|(x, (lo, hi))| (hi - lo) as f64 / x.eta.sec as f64)
                .sum::<f64>()
                / long.len().max(1) as f64
        },
    }
}

fn report(name: &str, s: &Score) {
    eprintln!(
        "{name}: {} estimates; before MAPE {:.1} % ({:.0} % within ±20 %), after MAPE {:.1} % \
         ({:.0} % within ±20 %); {:.0} % with a range, {:.0} % of ranges held the wait, \
         mean width {:.0} % of the estimate",
        s.shown,
        100.0 * s.previous_mape,
        100.0 * s.previous_within_20,
        100.0 * s.mape,
        100.0 * s.within_20,
        100.0 * s.with_range,
        100.0 * s.range_held,
        100.0 * s.range_width,
    );
}

/// The case measured by hand in the issue: five slots, sessions of 1–4 s, 70 people
/// arriving 10 per second. The estimate at join was 28 % off on average.
fn capacity_bound(seed: u64, sample_every: Millis) -> Scenario {
    Scenario {
        config: EventConfig {
            max_active: 5,
            ..EventConfig::default()
        },
        people: 70,
        arrive_every: 100,
        session_ms: (1000, 4000),
        enter_ms: (50, 300),
        sample_every,
        seed,
    }
}

/// Runs `make(seed)` for five seeds; reports the estimates of all waits of a second or
/// more, and answers the score of those of five seconds or more (on a wait of one or two
/// seconds, whole seconds alone are 20 % off, and the next free slot is a matter of luck).
fn run(name: &str, make: impl Fn(u64) -> Scenario) -> Score {
    let all: Vec<Shown> = (1..=5).flat_map(|seed| simulate(&make(seed))).collect();
    report(&format!("{name}, waits >= 1 s"), &score(&all, 1000));
    let s = score(&all, 5000);
    report(&format!("{name}, waits >= 5 s"), &s);
    s
}

#[test]
fn capacity_bound_estimates_hold_within_20_percent_for_most() {
    let at_join = run("capacity-bound, at join", |seed| {
        capacity_bound(seed, 1_000_000)
    });
    let throughout = run("capacity-bound, every 2 s", |seed| {
        capacity_bound(seed, 2000)
    });
    // A longer sale: 400 people, 20 slots, sessions of 2-10 s.
    let long = run("capacity-bound, 400 people", |seed| Scenario {
        config: EventConfig {
            max_active: 20,
            ..EventConfig::default()
        },
        people: 400,
        session_ms: (2000, 10_000),
        sample_every: 5000,
        ..capacity_bound(seed, 0)
    });
    for s in [&at_join, &throughout, &long] {
        assert!(s.mape <= 0.15, "{s:?}");
        assert!(s.within_20 >= 0.7, "{s:?}");
        assert!(s.range_held >= 0.8, "{s:?}");
        assert!(
            s.mape <= s.previous_mape * 1.1,
            "no worse than before: {s:?}"
        );
    }
    // At join, in the first seconds of a sale, the previous estimator counted the first
    // fill of the slots as pace; the simulation reproduces that.
    assert!(at_join.previous_mape > 1.25 * at_join.mape, "{at_join:?}");
}

#[test]
fn a_configured_pace_is_estimated_closely_and_narrowly() {
    let mut all = Vec::new();
    for seed in 1..=3 {
        all.extend(simulate(&Scenario {
            config: EventConfig {
                max_active: 1000,
                admit_per_minute: Some(120),
                ..EventConfig::default()
            },
            people: 80,
            arrive_every: 100,
            session_ms: (1000, 4000),
            enter_ms: (50, 300),
            sample_every: 2000,
            seed,
        }));
    }
    let s = score(&all, 1000);
    report("configured pace 120/min, waits >= 1 s", &s);
    assert!(s.mape <= 0.1, "{s:?}");
    assert!(s.within_20 >= 0.9, "{s:?}");
    assert!(
        s.with_range >= 0.99,
        "a steady pace always has a basis: {s:?}"
    );
    assert!(
        s.range_width <= 0.3,
        "steady admission, narrow range: {s:?}"
    );
    assert!(s.range_held >= 0.9, "{s:?}");
}

#[test]
fn no_basis_means_no_range() {
    let p = Pace {
        capacity: 5,
        session_max_sec: 600,
        live: 5,
        ..Pace::default()
    };
    assert_eq!(
        p.estimate(3, 0).range,
        None,
        "nothing has ended, no pace set"
    );
    let paused = Pace {
        admit_per_minute: Some(120),
        capacity: 1000,
        paused: true,
        ..p
    };
    assert_eq!(paused.estimate(3, 0).range, None, "paused");
    let paced = Pace {
        paused: false,
        ..paused
    };
    let e = paced.estimate(3, 0);
    assert_eq!(e.sec, 2);
    let (lo, hi) = e.range.unwrap();
    assert!(lo <= 2 && hi >= 2 && hi - lo <= 2, "{e:?}");
}

#[test]
fn few_ended_holds_give_a_wide_range_and_many_a_narrow_one() {
    let base = Pace {
        capacity: 10,
        session_max_sec: 600,
        ..Pace::default()
    };
    // Mean hold 10 s either way (no live holds): 1 place per second.
    let few = Pace {
        hold_ms: 20_000,
        hold_ends: 2,
        ..base
    };
    let many = Pace {
        hold_ms: 2_000_000,
        hold_ends: 200,
        ..base
    };
    let (f, m) = (few.estimate(100, 0), many.estimate(100, 0));
    assert_eq!((f.sec, m.sec), (100, 100));
    let width = |e: Eta| e.range.map(|(lo, hi)| hi - lo).unwrap();
    assert!(width(f) > 2 * width(m), "{f:?} {m:?}");
    assert!(width(m) <= 30, "{m:?}");
}

#[test]
fn a_pace_unlike_the_last_minute_widens_the_range() {
    let steady = Pace {
        capacity: 10,
        session_max_sec: 600,
        hold_ms: 2_000_000,
        hold_ends: 200,
        first_admission_at: Some(0),
        recent_admissions: 60, // one per second, as the holds say
        ..Pace::default()
    };
    let now = 10 * RATE_WINDOW_MS;
    let unsteady = Pace {
        recent_admissions: 20,
        ..steady
    };
    let width = |p: Pace| p.estimate(100, now).range.map(|(lo, hi)| hi - lo).unwrap();
    assert!(width(unsteady) > 2 * width(steady));
}

#[test]
fn holds_count_live_time_and_not_the_time_after_a_deadline() {
    let mut h = Holds::default();
    h.accrue(0, 1000); // starts the clock
    h.accrue(0, 2000);
    assert_eq!(h.total(2, 3000), 2000, "two live holds for a second");
    h.accrue(2, 3000);
    // One expired at 3500, noticed at 4000: it held 500 ms of that second, the other 1000.
    h.end(2, 3500, 4000);
    assert_eq!((h.busy_ms, h.ends), (3500, 1));
    assert_eq!(h.total(1, 5000), 4500);
    assert_eq!(h.total(1, 3000), 3500, "a clock behind adds nothing");
}

/// A configured pace that binds sets the estimate, not the admissions seen so far: after a
/// quiet spell those measure how few came, not how fast the line moves (defect: 2
/// admissions over 55 s told the 4th in line 111 s, with a narrow range around it, where
/// the configured 60 a minute admitted them in 4 s).
#[test]
fn a_binding_configured_pace_is_not_slowed_by_a_quiet_spell() {
    let now = 100_000;
    let p = Pace {
        admit_per_minute: Some(60),
        capacity: 100,
        session_max_sec: 600,
        live: 2,
        recent_admissions: 2,
        first_admission_at: Some(now - 55_000),
        ..Pace::default()
    };
    let e = p.estimate(4, now);
    assert_eq!(e.sec, 4, "{e:?}");
    let (lo, hi) = e.range.unwrap();
    assert!(lo <= 4 && (4..=5).contains(&hi), "{e:?}");
    // Where the slots may run out first, what was seen still counts (capped by the pace).
    let full = Pace {
        capacity: 2,
        live: 2,
        ..p
    };
    assert!(full.estimate(4, now).sec > 4);
}

/// A clock that steps back refills nothing and the bucket goes on from the new time
/// (defect: it kept the latest time seen, so a step of 15 s back admitted nobody for 15 s).
#[test]
fn a_clock_that_steps_back_refills_nothing_and_resumes_from_there() {
    let mut b = Bucket::default();
    b.refill(120, 100_000); // primed: a burst of 2
    b.tokens = 0.0;
    b.refill(120, 85_000); // 15 s back
    assert_eq!(b.tokens, 0.0, "a clock that went back earns nothing");
    assert_eq!(
        b.next_token_at(120),
        85_500,
        "the next token half a second on"
    );
    b.refill(120, 85_500);
    assert_eq!(
        b.tokens, 1.0,
        "half a second later, one token at 120 a minute"
    );
    b.tokens = 0.0;
    b.refill(120, 86_000);
    assert_eq!(b.tokens, 1.0);
}

/// Under a slow configured pace a place near the front waits anywhere from nothing to one
/// interval: the bucket may have earned most of the next admission already. The range
/// must hold that wait, not only the central figure (position intervals from now), which
/// told position 1 "about 10 s" at 6 a minute while its turn came within 2.
#[test]
fn a_slow_pace_range_holds_the_waits_near_the_front() {
    let mut all = Vec::new();
    for seed in 1..=3 {
        all.extend(simulate(&Scenario {
            config: EventConfig {
                max_active: 1000,
                admit_per_minute: Some(6),
                ..EventConfig::default()
            },
            people: 6,
            arrive_every: 700,
            session_ms: (600_000, 600_000),
            enter_ms: (50, 300),
            sample_every: 1000,
            seed,
        }));
    }
    // What API.md gives as its example.
    let slow = Pace {
        admit_per_minute: Some(6),
        capacity: 1000,
        ..Pace::default()
    };
    assert_eq!(
        slow.estimate(1, 0),
        Eta {
            sec: 10,
            range: Some((0, 11))
        }
    );
    let s = score(&all, 0);
    report("configured pace 6/min, every wait", &s);
    assert!(s.with_range >= 0.99, "{s:?}");
    // Whole seconds and the 10 ms steps aside (score's one-second slack), every range
    // holds its wait.
    assert!(s.range_held >= 0.999, "{s:?}");
}
