//! The promises as numbers: pure functions over what the virtual users and the admin
//! figures recorded, so each formula is tested on known answers apart from any server.
//!
//! Times are seconds since the run's start (`f64`). Client observations are intervals
//! where the server's instant is not known exactly: a place's admission happened after
//! the last answer that still said "waiting" was asked for (`lo`) and before the first
//! answer that said "admitted" arrived (`hi`). Only what is certain from these bounds
//! counts against a promise, so noise in observation never shows as a broken promise.

/// Percentiles of a sample by the nearest-rank method (sorted in place). Empty: `None`.
pub fn percentile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = (q * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

/// Counts inversions of `v` (pairs i < j with v[i] > v[j], ties not counted) by merge
/// sort, O(n log n); sorts `v`.
fn count_inversions(v: &mut [f64]) -> u64 {
    let n = v.len();
    if n < 2 {
        return 0;
    }
    let mid = n / 2;
    let mut inv = count_inversions(&mut v[..mid]) + count_inversions(&mut v[mid..]);
    let mut merged = Vec::with_capacity(n);
    let (mut i, mut j) = (0, mid);
    while i < mid && j < n {
        if v[j] < v[i] {
            inv += (mid - i) as u64;
            merged.push(v[j]);
            j += 1;
        } else {
            merged.push(v[i]);
            i += 1;
        }
    }
    merged.extend_from_slice(&v[i..mid]);
    merged.extend_from_slice(&v[j..n]);
    v.copy_from_slice(&merged);
    inv
}

/// Pairs tied within runs of equal values of a sorted slice.
fn tied_pairs(sorted: &[f64]) -> u64 {
    let mut total = 0u64;
    let mut run = 1u64;
    for w in sorted.windows(2) {
        if w[0] == w[1] {
            run += 1;
        } else {
            total += run * (run - 1) / 2;
            run = 1;
        }
    }
    total + run * (run - 1) / 2
}

/// Kendall's tau-b between two rankings (`x[i]`, `y[i]` belong to one item), by Knight's
/// O(n log n) algorithm. Ties count as neither concordant nor discordant, as in tau-b.
/// Fewer than two items, or a ranking that is all ties: `None`.
pub fn kendall_tau_b(x: &[f64], y: &[f64]) -> Option<f64> {
    assert_eq!(x.len(), y.len());
    let n = x.len() as u64;
    if n < 2 {
        return None;
    }
    let mut pairs: Vec<(f64, f64)> = x.iter().copied().zip(y.iter().copied()).collect();
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let n0 = n * (n - 1) / 2;
    let xs: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let n1 = tied_pairs(&xs);
    // Pairs tied in both: runs of equal (x, y).
    let mut n3 = 0u64;
    let mut run = 1u64;
    for w in pairs.windows(2) {
        if w[0] == w[1] {
            run += 1;
        } else {
            n3 += run * (run - 1) / 2;
            run = 1;
        }
    }
    n3 += run * (run - 1) / 2;
    let mut ys: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    // Sorted by (x, y), so a pair tied in x is never an inversion of y.
    let discordant = count_inversions(&mut ys);
    let n2 = tied_pairs(&ys); // `ys` is sorted now
    let concordant = n0 - n1 - n2 + n3 - discordant;
    let denom = ((n0 - n1) as f64 * (n0 - n2) as f64).sqrt();
    if denom == 0.0 {
        return None;
    }
    Some((concordant as f64 - discordant as f64) / denom)
}

/// One place as seen by its client, for the order promise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OrderObs {
    /// The join request was sent (the server queued it after this)…
    pub join_sent: f64,
    /// …and its answer arrived (the server queued it before this).
    pub join_ack: f64,
    /// Admission happened after `admit_lo` and before `admit_hi`.
    pub admit_lo: f64,
    pub admit_hi: f64,
}

/// FIFO inversions that are certain: pairs where A's join was answered before B's was
/// sent (so A is ahead of B in any FIFO queue) and B was admitted before A certainly was
/// (B's `admit_hi` < A's `admit_lo`). O(n log n): B's are taken in order of `join_sent`,
/// the A's answered before it are inserted into a Fenwick tree over `admit_lo` ranks.
pub fn fifo_inversions(obs: &[OrderObs]) -> u64 {
    let n = obs.len();
    if n < 2 {
        return 0;
    }
    let mut lo_sorted: Vec<f64> = obs.iter().map(|o| o.admit_lo).collect();
    lo_sorted.sort_by(f64::total_cmp);
    let mut by_ack: Vec<usize> = (0..n).collect();
    by_ack.sort_by(|&a, &b| obs[a].join_ack.total_cmp(&obs[b].join_ack));
    let mut by_sent: Vec<usize> = (0..n).collect();
    by_sent.sort_by(|&a, &b| obs[a].join_sent.total_cmp(&obs[b].join_sent));
    let mut tree = vec![0u64; n + 1];
    let mut inserted = 0u64;
    let mut next_a = 0;
    let mut total = 0u64;
    for &b in &by_sent {
        while next_a < n && obs[by_ack[next_a]].join_ack < obs[b].join_sent {
            let a = by_ack[next_a];
            // 1-based rank among the `admit_lo` values (ties share the first rank).
            let mut i = lo_sorted.partition_point(|&x| x < obs[a].admit_lo) + 1;
            while i <= n {
                tree[i] += 1;
                i += i & i.wrapping_neg();
            }
            inserted += 1;
            next_a += 1;
        }
        // Inserted A's with admit_lo <= B's admit_hi are not certain inversions.
        let mut i = lo_sorted.partition_point(|&x| x <= obs[b].admit_hi);
        let mut not_after = 0u64;
        while i > 0 {
            not_after += tree[i];
            i -= i & i.wrapping_neg();
        }
        total += inserted - not_after;
    }
    total
}

/// The largest number of intervals `[start, end)` open at once: the concurrent sessions
/// that clients certainly held.
pub fn max_overlap(intervals: &[(f64, f64)]) -> u64 {
    let mut edges: Vec<(f64, i64)> = Vec::with_capacity(intervals.len() * 2);
    for &(s, e) in intervals {
        if e > s {
            edges.push((s, 1));
            edges.push((e, -1));
        }
    }
    // Ends before starts at the same instant: [a, b) and [b, c) do not overlap.
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut cur, mut best) = (0i64, 0i64);
    for (_, d) in edges {
        cur += d;
        best = best.max(cur);
    }
    best as u64
}

/// How long freed slots stayed empty while people waited: each freed slot (`frees`,
/// already limited to moments when someone was waiting) is matched, oldest first, with
/// the next admission seen after it; the gap is the slot's idle time. Admissions with no
/// freed slot pending (the first fill, capacity growth) match nothing. A slot still
/// pending at `end` counts as idle until then.
pub fn idle_slot_gaps(frees: &[f64], admissions: &[f64], end: f64) -> Vec<f64> {
    let mut frees = frees.to_vec();
    frees.sort_by(f64::total_cmp);
    let mut admissions = admissions.to_vec();
    admissions.sort_by(f64::total_cmp);
    let mut gaps = Vec::with_capacity(frees.len());
    let mut pending = std::collections::VecDeque::new();
    let mut f = 0;
    for &a in &admissions {
        while f < frees.len() && frees[f] <= a {
            pending.push_back(frees[f]);
            f += 1;
        }
        if let Some(free) = pending.pop_front() {
            gaps.push(a - free);
        }
    }
    pending.extend(frees[f..].iter().copied());
    gaps.extend(pending.into_iter().map(|free| (end - free).max(0.0)));
    gaps
}

/// Matches silent departures with the removals the server reported, in order (every
/// place idles the same `waiting_idle_sec`, so the first silent is the first removed):
/// the delays, and the departures that saw no removal (their instants: whether each one was
/// overdue depends on how long the run watched after it).
pub fn ghost_delays(silent_at: &[f64], removed_at: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut s = silent_at.to_vec();
    s.sort_by(f64::total_cmp);
    let mut r = removed_at.to_vec();
    r.sort_by(f64::total_cmp);
    let mut delays = Vec::with_capacity(s.len());
    let mut missing = Vec::new();
    let mut j = 0;
    for &t in &s {
        // A removal before the departure cannot be its own.
        while j < r.len() && r[j] < t {
            j += 1;
        }
        if j < r.len() {
            delays.push(r[j] - t);
            j += 1;
        } else {
            missing.push(t);
        }
    }
    (delays, missing)
}

/// An estimate shown to a person and the wait that followed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EtaSample {
    pub estimate_sec: f64,
    pub real_sec: f64,
    pub low_sec: Option<f64>,
    pub high_sec: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct EtaScore {
    pub samples: usize,
    /// Mean of |estimate − real| / real (a fraction).
    pub mape: Option<f64>,
    /// Share of samples with |estimate − real| ≤ 20 % of real.
    pub within_20pct: Option<f64>,
    /// Share of samples that showed a range and whose real wait fell inside it.
    pub range_samples: usize,
    pub within_range: Option<f64>,
    /// MAPE and bias of the samples that showed a range: the estimates the waiting page
    /// shows as a figure (without a range it says "We don't know yet").
    pub ranged_mape: Option<f64>,
    pub ranged_bias: Option<f64>,
    /// Mean of (estimate − real) / real: negative when the estimate promises too little.
    pub bias: Option<f64>,
}

/// Scores estimates against real waits. Waits shorter than `min_real_sec` are left out:
/// a whole-second estimate of a sub-second wait has no meaningful percentage error.
pub fn eta_score(samples: &[EtaSample], min_real_sec: f64) -> EtaScore {
    let kept: Vec<&EtaSample> = samples
        .iter()
        .filter(|s| s.real_sec >= min_real_sec && s.real_sec > 0.0)
        .collect();
    let n = kept.len();
    let mut score = EtaScore {
        samples: n,
        ..EtaScore::default()
    };
    if n > 0 {
        let rel: Vec<f64> = kept
            .iter()
            .map(|s| (s.estimate_sec - s.real_sec) / s.real_sec)
            .collect();
        score.mape = Some(rel.iter().map(|r| r.abs()).sum::<f64>() / n as f64);
        score.bias = Some(rel.iter().sum::<f64>() / n as f64);
        let within = rel.iter().filter(|r| r.abs() <= 0.2 + 1e-9).count();
        score.within_20pct = Some(within as f64 / n as f64);
    }
    let ranged: Vec<&&EtaSample> = kept
        .iter()
        .filter(|s| s.low_sec.is_some() && s.high_sec.is_some())
        .collect();
    score.range_samples = ranged.len();
    if !ranged.is_empty() {
        let inside = ranged
            .iter()
            .filter(|s| {
                s.low_sec.unwrap_or(0.0) <= s.real_sec && s.real_sec <= s.high_sec.unwrap_or(0.0)
            })
            .count();
        score.within_range = Some(inside as f64 / ranged.len() as f64);
        let rel: Vec<f64> = ranged
            .iter()
            .map(|s| (s.estimate_sec - s.real_sec) / s.real_sec)
            .collect();
        score.ranged_mape = Some(rel.iter().map(|r| r.abs()).sum::<f64>() / rel.len() as f64);
        score.ranged_bias = Some(rel.iter().sum::<f64>() / rel.len() as f64);
    }
    score
}

/// Arrival instants of `users` people: a share `spike_share` of them within the first
/// `spike_sec` (front-loaded: the density falls linearly to a fifth of its start, as a
/// crowd that was waiting for the opening), the rest evenly over the `tail_sec` after it.
/// Deterministic for a seed; sorted.
pub fn arrival_times(
    users: usize,
    spike_sec: f64,
    spike_share: f64,
    tail_sec: f64,
    seed: u64,
) -> Vec<f64> {
    let spike = ((users as f64) * spike_share.clamp(0.0, 1.0)).round() as usize;
    let spike = if tail_sec <= 0.0 { users } else { spike };
    let mut state = seed;
    let mut out = Vec::with_capacity(users);
    // Density f(t) ∝ 1 − 0.8 t/S on [0, S]: the inverse of its CDF, for a uniform u.
    let a = 0.8 / spike_sec.max(1e-9);
    for _ in 0..spike {
        let u = unit(&mut state);
        let t = if spike_sec <= 0.0 {
            0.0
        } else {
            let c = 1.0 - 0.4; // ∫₀^S (1 − a t) dt / S
            (1.0 - (1.0 - 2.0 * a * u * c * spike_sec).max(0.0).sqrt()) / a
        };
        out.push(t.clamp(0.0, spike_sec.max(0.0)));
    }
    for _ in spike..users {
        out.push(spike_sec.max(0.0) + unit(&mut state) * tail_sec.max(0.0));
    }
    out.sort_by(f64::total_cmp);
    out
}

/// A uniform draw in [0, 1) from a splitmix64 state.
pub fn unit(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The O(n²) definition, to check the fast one against.
    fn tau_b_naive(x: &[f64], y: &[f64]) -> f64 {
        let (mut c, mut d, mut tx, mut ty) = (0.0f64, 0.0, 0.0, 0.0);
        for i in 0..x.len() {
            for j in i + 1..x.len() {
                // (`f64::signum(0.0)` is 1, so ties are sorted out first.)
                let s = (x[i] - x[j]).signum() * (y[i] - y[j]).signum();
                if x[i] == x[j] && y[i] == y[j] {
                    continue;
                } else if x[i] == x[j] {
                    tx += 1.0;
                } else if y[i] == y[j] {
                    ty += 1.0;
                } else if s > 0.0 {
                    c += 1.0;
                } else if s < 0.0 {
                    d += 1.0;
                }
            }
        }
        (c - d) / ((c + d + tx) * (c + d + ty)).sqrt()
    }

    #[test]
    fn kendall_tau_known_answers() {
        // The identity and the reversal.
        let x = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(kendall_tau_b(&x, &x), Some(1.0));
        assert_eq!(kendall_tau_b(&x, &[5.0, 4.0, 3.0, 2.0, 1.0]), Some(-1.0));
        // One swapped neighbour pair among 5: (9 − 1) / 10.
        let t = kendall_tau_b(&x, &[1.0, 2.0, 4.0, 3.0, 5.0]).unwrap();
        assert!((t - 0.8).abs() < 1e-12, "{t}");
        // SciPy's documented example with ties: kendalltau([12, 2, 1, 12, 2], [1, 4, 7, 1, 0])
        // is -0.47140452079103173.
        let t = kendall_tau_b(&[12.0, 2.0, 1.0, 12.0, 2.0], &[1.0, 4.0, 7.0, 1.0, 0.0]).unwrap();
        assert!((t + 0.471_404_520_791_031_73).abs() < 1e-12, "{t}");
        assert_eq!(kendall_tau_b(&[1.0], &[1.0]), None);
        assert_eq!(kendall_tau_b(&[1.0, 1.0], &[1.0, 2.0]), None);
    }

    #[test]
    fn kendall_tau_matches_the_definition_on_random_rankings_with_ties() {
        let mut s = 7u64;
        for n in [2usize, 3, 10, 57, 200] {
            let x: Vec<f64> = (0..n).map(|_| (unit(&mut s) * 20.0).floor()).collect();
            let y: Vec<f64> = (0..n).map(|_| (unit(&mut s) * 20.0).floor()).collect();
            let fast = kendall_tau_b(&x, &y).unwrap();
            let slow = tau_b_naive(&x, &y);
            assert!((fast - slow).abs() < 1e-9, "n={n}: {fast} vs {slow}");
        }
    }

    fn obs(join: f64, lo: f64, hi: f64) -> OrderObs {
        OrderObs {
            join_sent: join,
            join_ack: join + 0.01,
            admit_lo: lo,
            admit_hi: hi,
        }
    }

    #[test]
    fn fifo_inversions_known_answers() {
        // In order: none.
        let v = [obs(0.0, 1.0, 1.1), obs(1.0, 2.0, 2.1), obs(2.0, 3.0, 3.1)];
        assert_eq!(fifo_inversions(&v), 0);
        // Admitted in reverse order, certainly: all 3 pairs.
        let v = [obs(0.0, 3.0, 3.1), obs(1.0, 2.0, 2.1), obs(2.0, 1.0, 1.1)];
        assert_eq!(fifo_inversions(&v), 3);
        // Overlapping admission windows are not certain inversions…
        let v = [obs(0.0, 2.0, 2.5), obs(1.0, 1.8, 2.1)];
        assert_eq!(fifo_inversions(&v), 0);
        // …nor are joins whose answers overlap (the server may have queued either first).
        let v = [
            OrderObs {
                join_sent: 0.0,
                join_ack: 0.5,
                admit_lo: 3.0,
                admit_hi: 3.1,
            },
            OrderObs {
                join_sent: 0.4,
                join_ack: 0.6,
                admit_lo: 1.0,
                admit_hi: 1.1,
            },
        ];
        assert_eq!(fifo_inversions(&v), 0);
        // The 2nd and 4th swapped: one inversion; the 5th overtakes the 3rd and 4th.
        let v = [
            obs(0.0, 1.0, 1.1),
            obs(1.0, 4.0, 4.1),
            obs(2.0, 5.0, 5.1),
            obs(3.0, 2.0, 2.1),
            obs(4.0, 3.0, 3.1),
        ];
        // Pairs (2,4), (2,5), (3,4), (3,5): 4.
        assert_eq!(fifo_inversions(&v), 4);
    }

    #[test]
    fn fifo_inversions_match_the_definition_on_random_observations() {
        let mut s = 11u64;
        let v: Vec<OrderObs> = (0..300)
            .map(|_| {
                let j = unit(&mut s) * 10.0;
                let lo = unit(&mut s) * 10.0;
                OrderObs {
                    join_sent: j,
                    join_ack: j + unit(&mut s) * 0.3,
                    admit_lo: lo,
                    admit_hi: lo + unit(&mut s) * 0.5,
                }
            })
            .collect();
        let mut naive = 0;
        for a in &v {
            for b in &v {
                if a.join_ack < b.join_sent && b.admit_hi < a.admit_lo {
                    naive += 1;
                }
            }
        }
        assert!(naive > 0);
        assert_eq!(fifo_inversions(&v), naive);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&mut v, 0.5), Some(50.0));
        assert_eq!(percentile(&mut v, 0.99), Some(99.0));
        assert_eq!(percentile(&mut v, 1.0), Some(100.0));
        assert_eq!(percentile(&mut v, 0.0), Some(1.0));
        assert_eq!(percentile(&mut [], 0.5), None);
    }

    #[test]
    fn overlap_counts_concurrent_sessions() {
        assert_eq!(max_overlap(&[]), 0);
        assert_eq!(max_overlap(&[(0.0, 2.0), (1.0, 3.0), (2.0, 4.0)]), 2);
        assert_eq!(max_overlap(&[(0.0, 5.0), (1.0, 2.0), (1.5, 3.0)]), 3);
        // Touching intervals do not overlap; empty ones do not count.
        assert_eq!(max_overlap(&[(0.0, 1.0), (1.0, 2.0), (3.0, 3.0)]), 1);
    }

    #[test]
    fn idle_slots_pair_frees_with_the_next_admissions() {
        // Two slots freed at 1 and 2; admissions at 0.5 (first fill), 1.25 and 4.
        let gaps = idle_slot_gaps(&[2.0, 1.0], &[4.0, 0.5, 1.25], 10.0);
        assert_eq!(gaps, vec![0.25, 2.0]);
        // A freed slot nobody took counts until the end.
        assert_eq!(idle_slot_gaps(&[3.0], &[], 10.0), vec![7.0]);
    }

    #[test]
    fn ghosts_match_in_order_and_unseen_ones_are_counted() {
        let (d, missing) = ghost_delays(&[1.0, 2.0, 5.0], &[0.5, 11.0, 12.5]);
        assert_eq!(d, vec![10.0, 10.5]);
        assert_eq!(missing, vec![5.0]);
    }

    #[test]
    fn eta_score_known_answer() {
        let s = |e: f64, r: f64| EtaSample {
            estimate_sec: e,
            real_sec: r,
            low_sec: None,
            high_sec: None,
        };
        // Errors 10 %, 50 %, 0 %, and a 0.5 s wait left out.
        let score = eta_score(
            &[s(11.0, 10.0), s(5.0, 10.0), s(20.0, 20.0), s(3.0, 0.5)],
            1.0,
        );
        assert_eq!(score.samples, 3);
        assert!((score.mape.unwrap() - 0.2).abs() < 1e-12);
        assert!((score.within_20pct.unwrap() - 2.0 / 3.0).abs() < 1e-12);
        assert!((score.bias.unwrap() - (0.1 - 0.5) / 3.0).abs() < 1e-12);
        assert_eq!(score.within_range, None);
        let r = |lo: f64, hi: f64, real: f64| EtaSample {
            estimate_sec: lo,
            real_sec: real,
            low_sec: Some(lo),
            high_sec: Some(hi),
        };
        let score = eta_score(&[r(5.0, 10.0, 7.0), r(5.0, 10.0, 12.0)], 1.0);
        assert_eq!(score.range_samples, 2);
        assert_eq!(score.within_range, Some(0.5));
        // Only the ranged samples count for the figures the page shows: a 10 % error
        // with a range, a 90 % one without.
        let score = eta_score(&[r(11.0, 12.0, 10.0), s(1.0, 10.0)], 1.0);
        assert!((score.mape.unwrap() - 0.5).abs() < 1e-12);
        assert!((score.ranged_mape.unwrap() - 0.1).abs() < 1e-12);
        assert!((score.ranged_bias.unwrap() - 0.1).abs() < 1e-12);
        assert_eq!(eta_score(&[s(1.0, 10.0)], 1.0).ranged_mape, None);
        assert_eq!(eta_score(&[], 1.0).mape, None);
    }

    #[test]
    fn arrivals_are_a_front_loaded_spike_then_a_tail() {
        let t = arrival_times(10_000, 10.0, 0.8, 30.0, 1);
        assert_eq!(t.len(), 10_000);
        assert!(t.windows(2).all(|w| w[0] <= w[1]));
        let in_spike = t.iter().filter(|&&x| x <= 10.0).count();
        assert!((7_900..=8_100).contains(&in_spike), "{in_spike}");
        // Front-loaded: the first half of the spike holds more than its second half.
        let first = t.iter().filter(|&&x| x < 5.0).count();
        let second = in_spike - first;
        // Density 1 − 0.08 t: the first half holds (5 − 1) / (10 − 4) = 2/3 of the spike.
        let share = first as f64 / in_spike as f64;
        assert!((share - 2.0 / 3.0).abs() < 0.03, "{share}");
        assert!(second > 0);
        assert!(t.last().copied().unwrap() <= 40.0);
        assert_eq!(t, arrival_times(10_000, 10.0, 0.8, 30.0, 1));
    }
}
