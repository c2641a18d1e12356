//! Unit tests of the schedule's rules (`queue_schedule.rs`): the pre-queue, its shuffle
//! (with a chi-square test of uniformity), and the queueing methods.

use sha2::{Digest, Sha256};

use crate::core::schedule::{prequeue_key, EventSecret, QueueingMethod};
use crate::core::{Effect, EventQueue};
use crate::core::{EventConfig, JoinProof, Millis, PlaceState, PlaceView, QueueError};

const S: Millis = 1000;
const OPENS: Millis = 100 * S;

fn scheduled(max_active: u32, secret: [u8; 32], method: QueueingMethod) -> EventQueue {
    EventQueue::new(EventConfig {
        max_active,
        opens_at: Some(OPENS),
        queueing_method: method,
        event_secret: Some(EventSecret(secret)),
        waiting_idle_sec: 100_000,
        ..EventConfig::default()
    })
}

fn join(q: &mut EventQueue, now: Millis) -> Result<PlaceView, QueueError> {
    let nonce = u128::from(q.meta().next_seq) << 64 | 7;
    q.join(
        nonce,
        None,
        None,
        JoinProof::default(),
        now,
        &mut Vec::new(),
    )
}

/// The seqs admitted by effects, in order.
fn admitted(fx: &[Effect]) -> Vec<u64> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Admitted { seq, .. } => Some(*seq),
            _ => None,
        })
        .collect()
}

fn run_secret(run: u64) -> [u8; 32] {
    Sha256::digest(format!("schedule test run {run}")).into()
}

#[test]
fn the_prequeue_waits_for_the_opening_then_goes_first_in_shuffle_order() {
    let secret = [9u8; 32];
    let mut q = scheduled(1, secret, QueueingMethod::Fifo);
    let early: Vec<_> = (1..=6).map(|i| join(&mut q, i * S).unwrap()).collect();
    for v in &early {
        assert_eq!(
            v.status,
            PlaceState::Waiting,
            "nobody is admitted before the opening"
        );
        assert_eq!(v.position, None);
        assert_eq!(v.opens_in_sec, Some(OPENS / S - v.joined_at / S));
    }
    let mut fx = Vec::new();
    assert_eq!(
        q.tick(OPENS - 1, &mut fx),
        Some(OPENS),
        "wakes at the opening"
    );
    assert!(admitted(&fx).is_empty());
    // A late arrival, after the opening, stands behind the whole pre-queue.
    q.tick(OPENS, &mut fx);
    let late = join(&mut q, OPENS + 1).unwrap();
    assert_eq!(late.position, Some(6));
    assert_eq!(late.prequeue_rank, None);
    let seed = EventSecret(secret).shuffle_seed();
    let mut order: Vec<u64> = early.iter().map(|v| v.key.seq).collect();
    order.sort_by_key(|&s| prequeue_key(&seed, s));
    assert_ne!(
        order,
        early.iter().map(|v| v.key.seq).collect::<Vec<_>>(),
        "this seed does not keep the join order (else the test shows nothing)"
    );
    // Places of the pre-queue see their rank in it, the first was admitted.
    for (i, &seq) in order.iter().enumerate().skip(1) {
        let v = early.iter().find(|v| v.key.seq == seq).unwrap();
        let now = q.peek(v.key, OPENS + 1, &mut fx).unwrap();
        assert_eq!(
            (now.position, now.prequeue_rank),
            (Some(i as u64), Some(i as u64))
        );
        assert_eq!(now.opens_in_sec, None);
    }
    let mut got = admitted(&fx);
    // One admission per freed slot: each leave hands the slot to the next in line.
    for t in 0..6 {
        let seq = *got.last().unwrap();
        let key = early
            .iter()
            .chain([&late])
            .find(|v| v.key.seq == seq)
            .unwrap()
            .key;
        let mut fx = Vec::new();
        q.leave(key, OPENS + 2 + t, &mut fx).unwrap();
        got.extend(admitted(&fx));
    }
    order.push(late.key.seq);
    assert_eq!(got, order);
    q.check_invariants().unwrap();
}

#[test]
fn the_admin_list_is_in_join_order_and_the_head_hides_the_shuffle_before_the_opening() {
    let mut q = scheduled(1, [5; 32], QueueingMethod::Fifo);
    let seqs: Vec<u64> = (1..=5).map(|i| join(&mut q, i).unwrap().key.seq).collect();
    assert_eq!(q.prequeue(0, 100), seqs);
    assert_eq!(q.prequeue(seqs[1], 2), seqs[2..4].to_vec());
    let head: Vec<u64> = q
        .head(10, 10, &mut Vec::new())
        .iter()
        .map(|h| h.joined_at)
        .collect();
    assert_eq!(head, vec![1, 2, 3, 4, 5], "join order before the opening");
}

#[test]
fn opens_at_may_move_only_while_it_and_the_new_time_are_ahead() {
    let mut q = scheduled(1, [5; 32], QueueingMethod::Fifo);
    join(&mut q, S).unwrap();
    let with = |t: Option<Millis>| EventConfig {
        opens_at: t,
        ..q.config().clone()
    };
    assert!(q.check_config(&with(Some(OPENS * 2)), 2 * S).is_ok());
    assert!(q.check_config(&with(Some(3 * S)), 2 * S).is_ok());
    assert!(q.check_config(&with(None), 2 * S).is_err());
    assert!(q.check_config(&with(Some(S)), 2 * S).is_err());
    assert!(q.check_config(&with(Some(OPENS * 2)), OPENS).is_err());
}

/// A clock behind the joins (this one's after a step back, or another node's) may take a
/// change that advances an opening still ahead to a time at or before some pre-queue
/// place's join. Which line a place is in comes from `joined_at < opens_at`, so it would
/// be taken out of the pre-queue while held there: such a change is refused, and one after
/// every join keeps the pre-queue whole (defect: both times ahead and nobody in the
/// first-come line was enough; positions came from the wrong line, and at the opening the
/// line's counts wrapped, admitting one place again and again).
#[test]
fn an_opening_advanced_before_a_pre_queue_join_is_refused_whatever_the_clock() {
    let mut q = scheduled(1, [4; 32], QueueingMethod::Fifo);
    let a = join(&mut q, 50 * S).unwrap();
    let b = join(&mut q, 51 * S).unwrap();
    assert!(a.prequeue_rank.is_none() && a.opens_in_sec == Some(50));
    // The clock steps back 30 s: both the opening and the new time are ahead of it.
    let now = 21 * S;
    let with = |t: Millis| EventConfig {
        opens_at: Some(t),
        ..q.config().clone()
    };
    for t in [now + 8 * S, 50 * S, 51 * S] {
        let e = q.check_config(&with(t), now).unwrap_err();
        assert!(matches!(e, QueueError::Invalid(_)), "{t}: {e:?}");
    }
    // After every join: allowed, and both places stay in the pre-queue.
    let opens = 51 * S + 1;
    q.check_config(&with(opens), now).unwrap();
    let mut fx = Vec::new();
    q.set_config(with(opens), now, &mut fx);
    q.check_invariants().unwrap();
    for v in [a, b] {
        let v = q.peek(v.key, now + S, &mut Vec::new()).unwrap();
        assert_eq!((v.position, v.queue_length), (None, 2));
        assert!(v.prequeue_rank.is_none() && v.opens_in_sec.is_some());
    }
    // The opening admits one of them, once; the other waits first in line.
    let mut fx = Vec::new();
    q.tick(opens, &mut fx);
    assert_eq!(admitted(&fx).len(), 1);
    let late = join(&mut q, opens + S).unwrap();
    assert_eq!(late.position, Some(2));
    q.check_invariants().unwrap();
    let f = q.figures(opens + S, &mut Vec::new());
    assert_eq!((f.admitted, f.waiting), (1, 2));
}

/// The pre-queue's latest join is a high-water mark: a place that left does not lower it
/// (the Redis store keeps the same mark: a scan of the pre-queue in its script would grow
/// with it), and it starts over once the pre-queue is empty.
#[test]
fn the_pre_queue_latest_join_is_kept_until_it_empties() {
    let mut q = scheduled(1, [4; 32], QueueingMethod::Fifo);
    join(&mut q, 10 * S).unwrap();
    let last = join(&mut q, 60 * S).unwrap();
    let with = |q: &EventQueue, t: Millis| EventConfig {
        opens_at: Some(t),
        ..q.config().clone()
    };
    assert!(q.leave(last.key, 30 * S, &mut Vec::new()).unwrap());
    assert!(q.check_config(&with(&q, 40 * S), 30 * S).is_err());
    q.clear(30 * S, &mut Vec::new());
    join(&mut q, 31 * S).unwrap();
    assert!(q.check_config(&with(&q, 40 * S), 31 * S).is_ok());
    q.check_invariants().unwrap();
}

/// Once an operation reached the opening, a clock behind it (a node whose clock lags, or
/// this one's after a step back) finds the sale open all the same: no countdown, no
/// pre-queue for a new join (it is dated at the opening, behind those who joined after
/// it), no wake-up for the opening, and the opening may no longer move while places wait
/// (defect: decided from each clock anew, the sale closed again).
#[test]
fn an_opening_once_reached_stays_reached_when_the_clock_goes_back() {
    let mut q = scheduled(1, [3; 32], QueueingMethod::Fifo);
    let early: Vec<_> = (1..=3).map(|i| join(&mut q, i * S).unwrap()).collect();
    assert_eq!(q.config().opening_reached, None);
    let mut fx = Vec::new();
    q.tick(OPENS, &mut fx);
    assert_eq!(admitted(&fx).len(), 1);
    assert_eq!(q.config().opening_reached, Some(OPENS), "recorded");
    let after = join(&mut q, OPENS + S).unwrap();
    let back = OPENS - 10 * S;
    let waiting: Vec<_> = early
        .iter()
        .filter(|v| !admitted(&fx).contains(&v.key.seq))
        .collect();
    assert_eq!(waiting.len(), 2);
    for v in waiting {
        let now = q.peek(v.key, back, &mut Vec::new()).unwrap();
        assert_eq!(now.opens_in_sec, None, "no countdown again");
        assert!(now.prequeue_rank.is_some() && now.position.is_some());
    }
    let late = join(&mut q, back).unwrap();
    assert_eq!(late.prequeue_rank, None, "not in the pre-queue");
    assert_eq!(late.joined_at, OPENS, "dated at the opening");
    assert_eq!(
        late.position,
        Some(4),
        "behind who joined after the opening"
    );
    assert_eq!(
        q.peek(after.key, back, &mut Vec::new()).unwrap().position,
        Some(3)
    );
    assert_eq!(q.prequeue(0, 10).len(), 2, "the pre-queue did not grow");
    assert_ne!(
        q.tick(back, &mut Vec::new()),
        Some(OPENS),
        "no second opening"
    );
    let head: Vec<u64> = q
        .head(10, back, &mut Vec::new())
        .iter()
        .map(|h| h.position)
        .collect();
    assert_eq!(
        head,
        vec![1, 2, 3, 4],
        "the order of admission, not the join order"
    );
    // Moving the opening ahead would put the places that joined after it into a pre-queue.
    let moved = EventConfig {
        opens_at: Some(OPENS + 50 * S),
        ..q.config().clone()
    };
    assert!(q.check_config(&moved, back).is_err());
    q.check_invariants().unwrap();
}

/// An opening moved ahead again after it was reached makes a new pre-queue: it gets a new
/// secret (the old seed may be published), however the clock of the change reads the old
/// opening; an opening still ahead keeps its secret when it moves.
#[test]
fn an_opening_set_ahead_again_after_it_was_reached_gets_a_new_secret() {
    let reached = EventConfig {
        opens_at: Some(OPENS),
        event_secret: Some(EventSecret([1; 32])),
        opening_reached: Some(OPENS),
        ..EventConfig::default()
    };
    let mut patch: crate::core::EventPatch = serde_json::from_value(serde_json::json!({
        "opens_at": crate::core::schedule::format_rfc3339(OPENS + 50 * S)
    }))
    .unwrap();
    patch.fresh_secret = Some([2; 32]);
    let before = OPENS - 10 * S;
    let c = patch.apply("ev", &reached, before).unwrap();
    assert_eq!(c.event_secret, Some(EventSecret([2; 32])), "a new secret");
    assert_eq!(c.opening_reached, None, "the new opening is ahead");
    assert_eq!(c.opening_ahead(before), Some(OPENS + 50 * S));
    let ahead = EventConfig {
        opening_reached: None,
        ..reached.clone()
    };
    let c = patch.apply("ev", &ahead, before).unwrap();
    assert_eq!(
        c.event_secret,
        Some(EventSecret([1; 32])),
        "postponed: kept"
    );
    // Another change keeps the record; setting an opening already past records it.
    let c = crate::core::EventPatch::default()
        .apply("ev", &reached, before)
        .unwrap();
    assert_eq!(c.opening_reached, Some(OPENS));
    assert_eq!(c.opening_ahead(before), None);
    let past = patch.apply("ev", &ahead, OPENS + 60 * S).unwrap();
    assert_eq!(past.opening_reached, Some(OPENS + 50 * S));
}

/// Chi-square critical values at p = 0.001 (the probability that a uniform shuffle fails
/// the test, were the seeds random; they are fixed, so the test cannot flake): df = 119
/// (the 120 orders of 5 places) and df = 9 (10 places). From the chi-square quantile
/// function (e.g. `scipy.stats.chi2.ppf(0.999, 119)`).
const CHI2_999_DF119: f64 = 172.4;
const CHI2_999_DF9: f64 = 27.88;

fn chi_square(counts: &[u64], expected: f64) -> f64 {
    counts
        .iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum()
}

/// Index of a permutation of 0..5 (its Lehmer code).
fn perm_index(p: &[usize]) -> usize {
    let mut idx = 0;
    for i in 0..p.len() {
        let smaller = p[i + 1..].iter().filter(|&&x| x < p[i]).count();
        idx = idx * (p.len() - i) + smaller;
    }
    idx
}

#[test]
fn the_shuffle_is_uniform_over_all_orders() {
    const RUNS: u64 = 12_000;
    let mut counts = vec![0u64; 120];
    for run in 0..RUNS {
        let mut q = scheduled(5, run_secret(run), QueueingMethod::Fifo);
        let first = q.meta().next_seq;
        for i in 0..5 {
            join(&mut q, i + 1).unwrap();
        }
        let mut fx = Vec::new();
        q.tick(OPENS, &mut fx);
        let order: Vec<usize> = admitted(&fx).iter().map(|s| (s - first) as usize).collect();
        assert_eq!(order.len(), 5);
        counts[perm_index(&order)] += 1;
    }
    let chi2 = chi_square(&counts, RUNS as f64 / 120.0);
    assert!(chi2 < CHI2_999_DF119, "chi-square {chi2} over 120 orders");
    // The same statistic for the join order (no shuffle) is enormous: the test can fail.
    let mut fifo = vec![0u64; 120];
    fifo[0] = RUNS;
    assert!(chi_square(&fifo, RUNS as f64 / 120.0) > CHI2_999_DF119);
}

#[test]
fn the_lottery_draws_uniformly_among_all_who_wait() {
    const RUNS: u64 = 5_000;
    let mut counts = [0u64; 10];
    for run in 0..RUNS {
        let mut q = EventQueue::new(EventConfig {
            max_active: 1,
            queueing_method: QueueingMethod::Random,
            event_secret: Some(EventSecret(run_secret(run))),
            waiting_idle_sec: 100_000,
            ..EventConfig::default()
        });
        let holder = join(&mut q, 0).unwrap();
        assert_eq!(holder.status, PlaceState::Admitted);
        let first = q.meta().next_seq;
        for _ in 0..10 {
            let v = join(&mut q, 1).unwrap();
            assert_eq!(v.position, None, "a lottery has no positions");
            assert!(v.eta_sec.is_some());
        }
        let mut fx = Vec::new();
        q.leave(holder.key, 2, &mut fx).unwrap();
        let drawn = admitted(&fx);
        assert_eq!(drawn.len(), 1);
        counts[(drawn[0] - first) as usize] += 1;
    }
    let chi2 = chi_square(&counts, RUNS as f64 / 10.0);
    assert!(chi2 < CHI2_999_DF9, "chi-square {chi2}: {counts:?}");
}

#[test]
fn passthrough_admits_everyone_and_reject_keeps_no_queue() {
    let mut q = EventQueue::new(EventConfig {
        max_active: 1,
        queueing_method: QueueingMethod::Passthrough,
        ..EventConfig::default()
    });
    for i in 0..5 {
        assert_eq!(join(&mut q, i).unwrap().status, PlaceState::Admitted);
    }
    let mut q = EventQueue::new(EventConfig {
        max_active: 1,
        queueing_method: QueueingMethod::Reject,
        ..EventConfig::default()
    });
    let a = join(&mut q, 0).unwrap();
    assert_eq!(a.status, PlaceState::Admitted);
    assert_eq!(join(&mut q, 1).unwrap_err(), QueueError::EventFull);
    assert_eq!(q.waiting(), 0);
    q.leave(a.key, 2, &mut Vec::new()).unwrap();
    assert_eq!(join(&mut q, 3).unwrap().status, PlaceState::Admitted);
}

#[test]
fn a_million_places_open_without_a_long_step() {
    // The opening is a tick that admits as many as there is room for: the pre-queue was
    // ordered as it formed, so nothing is sorted or moved at the opening. (Counted, not
    // timed: the tick's work is the admissions it makes.)
    let mut q = scheduled(10, [1; 32], QueueingMethod::Fifo);
    let n = if cfg!(debug_assertions) {
        100_000
    } else {
        1_000_000
    };
    for i in 0..n {
        join(&mut q, 1 + i % 1000).unwrap();
    }
    let mut fx = Vec::new();
    q.tick(OPENS, &mut fx);
    assert_eq!(
        fx.len(),
        10,
        "the opening did only its ten admissions: {}",
        fx.len()
    );
    assert_eq!(q.waiting(), n - 10);
}

#[test]
fn a_paced_prequeue_asks_for_the_opening_not_for_the_next_token() {
    let mut q = scheduled(10, [7; 32], QueueingMethod::Fifo);
    let mut c = q.config().clone();
    c.admit_per_minute = Some(60);
    q.set_config(c, 0, &mut Vec::new());
    let v = join(&mut q, S).unwrap();
    assert_eq!(v.status, PlaceState::Waiting);
    let mut fx = Vec::new();
    // Nobody can be admitted before the opening: the tick wakes for it (its place's idle
    // deadline is further off), not a millisecond later on every pass.
    for now in [2 * S, 50 * S, OPENS - 1] {
        assert_eq!(q.tick(now, &mut fx), Some(OPENS), "tick at {now}");
    }
    assert!(fx.is_empty());
    q.tick(OPENS, &mut fx);
    assert_eq!(admitted(&fx), vec![v.key.seq]);
}

#[test]
fn a_proven_join_replaces_a_squatter_in_a_full_reject_event() {
    let proven = JoinProof {
        proven: true,
        invite: None,
    };
    // The squatter holds the only slot (admitted, then active), or waits (paused).
    for (enter, paused) in [(false, false), (true, false), (false, true)] {
        let mut q = EventQueue::new(EventConfig {
            max_active: 1,
            queueing_method: QueueingMethod::Reject,
            paused,
            ..EventConfig::default()
        });
        let mut fx = Vec::new();
        let squat = if paused {
            // Paused, `reject` refuses every join: the place waits from before the switch.
            let mut c = q.config().clone();
            c.queueing_method = QueueingMethod::Fifo;
            q.set_config(c, 0, &mut fx);
            let v = q
                .join(1, Some("alice"), None, JoinProof::default(), 0, &mut fx)
                .unwrap();
            let mut c = q.config().clone();
            c.queueing_method = QueueingMethod::Reject;
            q.set_config(c, 0, &mut fx);
            v
        } else {
            q.join(1, Some("alice"), None, JoinProof::default(), 0, &mut fx)
                .unwrap()
        };
        if enter {
            q.enter(squat.key, 0, &mut fx).unwrap();
        }
        // Anyone else is refused: the event is full.
        assert_eq!(
            q.join(2, Some("bob"), None, proven, S, &mut fx),
            Err(QueueError::EventFull)
        );
        let got = q.join(3, Some("alice"), None, proven, S, &mut fx);
        if paused {
            // Paused, nobody could be admitted at once, freed room or not.
            assert_eq!(got, Err(QueueError::EventFull));
            assert!(q.peek(squat.key, S, &mut fx).is_ok(), "left as it was");
            continue;
        }
        let mine = got.unwrap();
        assert_eq!(mine.status, PlaceState::Admitted, "enter: {enter}");
        assert_ne!(mine.key, squat.key);
        assert_eq!(
            q.peek(squat.key, S, &mut fx),
            Err(QueueError::TokenNotFound)
        );
        q.check_invariants().unwrap();
    }
}
