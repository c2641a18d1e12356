//! The report of a journey run: every promise as a number (JSON), and one self-contained
//! HTML page with SVG charts drawn here (no script, no CDN, no plotting crate: a few
//! polylines do not justify a dependency's compile time on a 2-core machine).

use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

use super::metrics::{self, EtaSample, EtaScore, OrderObs};
use super::seats;
use super::user::{Behaviour, Log, Outcome, Step, Transport};
use super::{Sample, Scenario};

pub struct Inputs {
    pub label: String,
    pub scenario: Scenario,
    /// The run used the event as configured (`--keep-settings`).
    pub settings_kept: bool,
    pub event: String,
    pub nodes: usize,
    pub started_unix: u64,
    pub duration_sec: f64,
    pub event_config: Value,
    /// The figures before the run (counters are taken relative to them).
    pub base: Sample,
    pub samples: Vec<Sample>,
    pub logs: Vec<Log>,
    /// With seats for sale: the inventory at the end, the operator's readings of it, and
    /// the end call if the sale sold out.
    pub seats: Option<(Value, Vec<seats::InvSample>, Option<seats::SoldOutCall>)>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    // The headline numbers (fractions: 0.15 = 15 %; seconds).
    pub kendall_tau: Option<f64>,
    pub fifo_inversions: u64,
    pub capacity_overshoot_max: u64,
    pub idle_slot_p50_sec: Option<f64>,
    pub idle_slot_p99_sec: Option<f64>,
    pub ghost_removal_p50_sec: Option<f64>,
    pub ghost_removal_p99_sec: Option<f64>,
    pub eta_mape: Option<f64>,
    pub eta_within_20pct: Option<f64>,
    /// With seats for sale: `seats_sold`, `seats_double_sold`, `sold_out_notice_p99_sec`, …
    /// (absent without seats, so earlier reports keep their shape).
    #[serde(flatten)]
    pub seat_numbers: Option<seats::Headline>,
    pub label: String,
    pub event: String,
    pub nodes: usize,
    pub started_unix: u64,
    pub duration_sec: f64,
    /// The scenario, with the event's settings as the server answered them
    /// (`event_config`): with `settings_kept` they are the event's own, not the file's.
    pub scenario: Scenario,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub settings_kept: bool,
    pub event_config: Value,
    pub users: Users,
    pub order: Order,
    pub capacity: Capacity,
    pub idle_slots: IdleSlots,
    pub ghosts: Ghosts,
    pub eta: Eta,
    pub client_cost: BTreeMap<Transport, TransportCost>,
    pub latency_ms: BTreeMap<Step, Latency>,
    pub errors: BTreeMap<String, u64>,
    pub series: Vec<Second>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seats: Option<seats::Seats>,
}

#[derive(Debug, Default, Serialize)]
pub struct Users {
    pub total: usize,
    pub joined: usize,
    pub admitted: usize,
    pub direct_entries: usize,
    pub completed: usize,
    pub abandoned: usize,
    pub expired: usize,
    pub gone: usize,
    /// With seats: entered and found none; waiting when the sale ended; came after it.
    pub no_seats: usize,
    pub sale_ended: usize,
    pub closed: usize,
    pub failed: usize,
    /// Cut off by `max_run_secs`, and of those the ones still waiting (never admitted).
    pub unfinished: usize,
    pub still_waiting: usize,
    /// Planned behaviours and how many struck while the person still waited.
    pub planned: BTreeMap<String, usize>,
    pub struck: BTreeMap<String, usize>,
    /// Reloads and outages whose stored token still held the place, and those that did not.
    pub resumed_kept: usize,
    pub resumed_lost: usize,
}

#[derive(Debug, Default, Serialize)]
pub struct Order {
    /// People compared (admitted ones).
    pub compared: usize,
    pub kendall_tau: Option<f64>,
    /// Certain inversions (see `metrics::fifo_inversions`).
    pub fifo_inversions: u64,
    /// Inversions of the observed instants taken at face value (observation noise included).
    pub observed_inversions: u64,
    pub slack_sec: f64,
    /// Times a person saw their position grow.
    pub position_rises: u64,
}

#[derive(Debug, Default, Serialize)]
pub struct Capacity {
    pub capacity: u64,
    /// Largest admitted + active in the admin figures, and its excess over capacity.
    pub server_max_used: u64,
    pub server_overshoot_max: u64,
    /// Largest number of sessions clients certainly held at once, and its excess.
    pub client_max_held: u64,
    pub client_overshoot_max: u64,
}

#[derive(Debug, Default, Serialize)]
pub struct IdleSlots {
    /// Slots freed (sessions completed) while someone was waiting; each is idle until the
    /// next person enters.
    pub frees: usize,
    pub p50_sec: Option<f64>,
    pub p90_sec: Option<f64>,
    pub p99_sec: Option<f64>,
    pub max_sec: Option<f64>,
    /// From the admin figures: slot-seconds free while places waited (ghosts included, and
    /// slots held back by `admit_per_minute` on purpose).
    pub server_idle_slot_seconds: f64,
}

#[derive(Debug, Default, Serialize)]
pub struct Ghosts {
    /// People who went silent for good (abandons, outages that cost the place). Each is
    /// matched, in order, with a removal the admin figures counted (`expired`): the place
    /// ended, no longer counting in positions nor holding a slot. A ghost whose turn came
    /// before its heartbeat lapsed ends when its ready window closes.
    pub silent: usize,
    pub removed: usize,
    pub unseen: usize,
    /// Unseen ghosts whose deadline (`waiting_idle_sec` + 5 s + `ready_ttl_sec` after going
    /// silent) passed while the run still watched (before the end of the sale, if it
    /// ended): places never removed, against the promise. The other unseen ones went with
    /// the end of the sale, or were not due yet when the run stopped.
    pub overdue: usize,
    pub p50_sec: Option<f64>,
    pub p99_sec: Option<f64>,
    pub max_sec: Option<f64>,
    pub waiting_idle_sec: u32,
}

#[derive(Debug, Default, Serialize)]
pub struct Eta {
    pub at_join: EtaScore,
    pub later: EtaScore,
    pub all: EtaScore,
    /// Answers that carried `poll_after_sec` / `eta_low_sec` and `eta_high_sec`.
    pub poll_after_answers: u64,
    pub range_answers: u64,
    /// A few estimates at join across the line: position, estimate, real wait.
    pub examples: Vec<EtaExample>,
    /// Estimates at join for the chart (at most 2,000, evenly drawn).
    #[serde(skip)]
    pub examples_all: Vec<EtaExample>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct EtaExample {
    pub position: Option<u64>,
    pub estimate_sec: f64,
    pub real_sec: f64,
}

#[derive(Debug, Default, Serialize)]
pub struct TransportCost {
    pub users: usize,
    pub admitted: usize,
    pub requests: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub ws_messages: u64,
    pub requests_per_admitted: Option<f64>,
    pub bytes_per_admitted: Option<f64>,
}

#[derive(Debug, Default, Serialize)]
pub struct Latency {
    pub count: usize,
    pub errors: usize,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Second {
    pub t: u64,
    /// The admin figures at the end of the second.
    pub waiting: u64,
    pub admitted: u64,
    pub active: u64,
    pub capacity: u64,
    /// What clients saw within the second.
    pub arrivals: u64,
    pub admissions: u64,
    pub completions: u64,
}

fn mid(a: f64, b: f64) -> f64 {
    (a + b) / 2.0
}

/// The best guess of when a person was admitted, for scoring estimates: the arrival of a
/// live push (sent at the admission; the order promise keeps the slack interval instead),
/// else the middle of the interval between the last "waiting" asked for and the first
/// "admitted" seen. Taking the middle of a push's slack interval would shorten every pushed
/// wait by half the slack, and make every estimate look that much too long.
fn admission_instant(l: &Log) -> f64 {
    let hi = l.admit_hi.unwrap_or(0.0);
    if l.admit_pushed {
        hi
    } else {
        mid(l.admit_lo.unwrap_or(0.0), hi)
    }
}

fn pct(v: &[f64], q: f64) -> Option<f64> {
    metrics::percentile(&mut v.to_vec(), q)
}

pub fn build(mut i: Inputs) -> Report {
    // Every figure and goal goes by the settings the server reported, which are the
    // event's own with --keep-settings (the scenario's ghost grace, say, is not).
    i.scenario = i.scenario.with_event_settings(&i.event_config);
    let sc = &i.scenario;
    let logs = &i.logs;
    let admitted: Vec<&Log> = logs
        .iter()
        .filter(|l| l.admit_hi.is_some() && l.join_ack.is_some())
        .collect();

    // ---- users
    let mut users = Users {
        total: logs.len(),
        ..Users::default()
    };
    for l in logs {
        users.joined += usize::from(l.join_ack.is_some());
        users.admitted += usize::from(l.admit_hi.is_some());
        users.direct_entries += usize::from(l.admit_hi.is_some() && l.admit_hi == l.join_ack);
        match &l.outcome {
            Outcome::Completed => users.completed += 1,
            Outcome::Abandoned => users.abandoned += 1,
            Outcome::Expired => users.expired += 1,
            Outcome::Gone => users.gone += 1,
            Outcome::NoSeats => users.no_seats += 1,
            Outcome::SaleEnded => users.sale_ended += 1,
            Outcome::Closed => users.closed += 1,
            Outcome::Unfinished => {
                users.unfinished += 1;
                users.still_waiting += usize::from(l.admit_hi.is_none());
            }
            Outcome::Failed(_) => users.failed += 1,
        }
        let b = behaviour_name(l.plan.behaviour).to_string();
        *users.planned.entry(b.clone()).or_default() += 1;
        if l.struck {
            *users.struck.entry(b).or_default() += 1;
        }
        match l.resumed_kept {
            Some(true) => users.resumed_kept += 1,
            Some(false) => users.resumed_lost += 1,
            None => {}
        }
    }

    // ---- order
    let obs: Vec<OrderObs> = admitted
        .iter()
        .map(|l| OrderObs {
            join_sent: l.join_sent.unwrap_or(0.0),
            join_ack: l.join_ack.unwrap_or(0.0),
            admit_lo: l.admit_lo.unwrap_or(0.0),
            admit_hi: l.admit_hi.unwrap_or(0.0),
        })
        .collect();
    let points: Vec<OrderObs> = obs
        .iter()
        .map(|o| {
            let j = mid(o.join_sent, o.join_ack);
            OrderObs {
                join_sent: j,
                join_ack: j,
                admit_lo: o.admit_hi,
                admit_hi: o.admit_hi,
            }
        })
        .collect();
    let xs: Vec<f64> = obs.iter().map(|o| mid(o.join_sent, o.join_ack)).collect();
    let ys: Vec<f64> = obs.iter().map(|o| mid(o.admit_lo, o.admit_hi)).collect();
    let order = Order {
        compared: obs.len(),
        kendall_tau: metrics::kendall_tau_b(&xs, &ys),
        fifo_inversions: metrics::fifo_inversions(&obs),
        observed_inversions: metrics::fifo_inversions(&points),
        slack_sec: sc.order_slack_sec,
        position_rises: logs.iter().map(|l| u64::from(l.position_rises)).sum(),
    };

    // ---- capacity
    let cap = i
        .samples
        .iter()
        .map(|s| s.capacity)
        .max()
        .unwrap_or(sc.max_active);
    let server_max_used = i
        .samples
        .iter()
        .map(|s| s.admitted + s.active)
        .max()
        .unwrap_or(0);
    let held: Vec<(f64, f64)> = logs
        .iter()
        .filter_map(|l| Some((l.admit_hi?, l.complete_sent?)))
        .collect();
    let client_max_held = metrics::max_overlap(&held);
    let capacity = Capacity {
        capacity: cap,
        server_max_used,
        server_overshoot_max: server_max_used.saturating_sub(cap),
        client_max_held,
        client_overshoot_max: client_max_held.saturating_sub(cap),
    };

    // ---- idle slots: frees while someone who was later admitted still waited
    let mut starts: Vec<f64> = admitted.iter().filter_map(|l| l.join_ack).collect();
    let mut ends: Vec<f64> = admitted.iter().filter_map(|l| l.admit_hi).collect();
    starts.sort_by(f64::total_cmp);
    ends.sort_by(f64::total_cmp);
    let waiting_at =
        |t: f64| starts.partition_point(|&s| s <= t) > ends.partition_point(|&e| e <= t);
    let frees: Vec<f64> = logs
        .iter()
        .filter_map(|l| l.complete_ack)
        .filter(|&t| waiting_at(t))
        .collect();
    // A slot is filled when someone enters it: an admitted person who has not noticed yet
    // (a poll to come) or never will (a ghost, until its ready window closes) leaves the
    // site's slot empty just the same.
    let entries: Vec<f64> = logs.iter().filter_map(|l| l.entered).collect();
    let gaps = metrics::idle_slot_gaps(&frees, &entries, i.duration_sec);
    let mut server_idle = 0.0;
    for w in i.samples.windows(2) {
        let s = w[0];
        let free = s.capacity.saturating_sub(s.admitted + s.active);
        server_idle += (w[1].t - s.t) * free.min(s.waiting) as f64;
    }
    let idle_slots = IdleSlots {
        frees: frees.len(),
        p50_sec: pct(&gaps, 0.5),
        p90_sec: pct(&gaps, 0.9),
        p99_sec: pct(&gaps, 0.99),
        max_sec: pct(&gaps, 1.0),
        server_idle_slot_seconds: server_idle,
    };

    // ---- ghosts
    let silent: Vec<f64> = logs.iter().filter_map(|l| l.silent_at).collect();
    let mut removed = Vec::new();
    let mut prev = i.base.expired;
    for s in &i.samples {
        for _ in prev..s.expired {
            removed.push(s.t);
        }
        prev = prev.max(s.expired);
    }
    let (delays, unseen) = metrics::ghost_delays(&silent, &removed);
    // The run watched the removals until its last reading, or until the end of the sale,
    // after which ghosts leave with everyone (`left`, not `expired`).
    let mut watched_until = i.samples.last().map_or(0.0, |s| s.t);
    if let Some((_, _, Some(call))) = &i.seats {
        watched_until = watched_until.min(call.sent_sec);
    }
    let (_, late) = ghost_goals(sc);
    let overdue = unseen
        .iter()
        .filter(|&&t| t + late <= watched_until)
        .count();
    let ghosts = Ghosts {
        silent: silent.len(),
        removed: delays.len(),
        unseen: unseen.len(),
        overdue,
        p50_sec: pct(&delays, 0.5),
        p99_sec: pct(&delays, 0.99),
        max_sec: pct(&delays, 1.0),
        waiting_idle_sec: sc.waiting_idle_sec,
    };

    // ---- estimates
    let mut at_join = Vec::new();
    let mut later = Vec::new();
    let mut examples = Vec::new();
    for l in &admitted {
        let admit = admission_instant(l);
        for (k, e) in l.estimates.iter().enumerate() {
            if e.at > admit {
                continue;
            }
            let s = EtaSample {
                estimate_sec: e.eta_sec,
                real_sec: admit - e.at,
                low_sec: e.eta_low_sec,
                high_sec: e.eta_high_sec,
            };
            if k == 0 {
                at_join.push(s);
                examples.push(EtaExample {
                    position: e.position,
                    estimate_sec: e.eta_sec,
                    real_sec: s.real_sec,
                });
            } else {
                later.push(s);
            }
        }
    }
    examples.sort_by_key(|e| e.position.unwrap_or(0));
    let step = (examples.len() / 12).max(1);
    let examples_all: Vec<EtaExample> = examples
        .iter()
        .step_by((examples.len() / 2000).max(1))
        .copied()
        .collect();
    let examples: Vec<EtaExample> = examples.iter().step_by(step).copied().collect();
    let all: Vec<EtaSample> = at_join.iter().chain(later.iter()).copied().collect();
    let eta = Eta {
        at_join: metrics::eta_score(&at_join, sc.eta_min_wait_sec),
        later: metrics::eta_score(&later, sc.eta_min_wait_sec),
        all: metrics::eta_score(&all, sc.eta_min_wait_sec),
        poll_after_answers: logs.iter().map(|l| u64::from(l.poll_after_seen)).sum(),
        range_answers: logs
            .iter()
            .flat_map(|l| &l.estimates)
            .filter(|e| e.eta_low_sec.is_some() && e.eta_high_sec.is_some())
            .count() as u64,
        examples,
        examples_all,
    };

    // ---- client cost
    let mut client_cost: BTreeMap<Transport, TransportCost> = BTreeMap::new();
    for l in logs.iter().filter(|l| l.join_ack.is_some()) {
        let c = client_cost.entry(l.plan.transport).or_default();
        c.users += 1;
        c.admitted += usize::from(l.entered.is_some());
        c.requests += l.cost.requests;
        c.bytes_in += l.cost.bytes_in;
        c.bytes_out += l.cost.bytes_out;
        c.ws_messages += l.cost.ws_messages;
    }
    for c in client_cost.values_mut() {
        if c.admitted > 0 {
            c.requests_per_admitted = Some(c.requests as f64 / c.admitted as f64);
            c.bytes_per_admitted = Some((c.bytes_in + c.bytes_out) as f64 / c.admitted as f64);
        }
    }

    // ---- latency and errors
    let mut latency_ms = BTreeMap::new();
    for step in Step::ALL {
        let v: Vec<f64> = logs
            .iter()
            .flat_map(|l| &l.latencies)
            .filter(|(s, _)| *s == step)
            .map(|(_, ms)| *ms)
            .collect();
        let errors = logs
            .iter()
            .flat_map(|l| &l.errors)
            .filter(|(s, _)| *s == step)
            .count();
        if v.is_empty() && errors == 0 {
            continue;
        }
        latency_ms.insert(
            step,
            Latency {
                count: v.len(),
                errors,
                p50: pct(&v, 0.5),
                p90: pct(&v, 0.9),
                p99: pct(&v, 0.99),
                max: pct(&v, 1.0),
            },
        );
    }
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    for l in logs {
        for (s, e) in &l.errors {
            *errors.entry(format!("{s:?}: {e}")).or_default() += 1;
        }
        if let Outcome::Failed(why) = &l.outcome {
            *errors.entry(format!("outcome: {why}")).or_default() += 1;
        }
    }

    // ---- per second
    let secs = i.duration_sec.ceil().max(1.0) as usize;
    let mut series = vec![Second::default(); secs];
    for (t, s) in series.iter_mut().enumerate() {
        s.t = t as u64;
    }
    let mut k = 0;
    for s in series.iter_mut() {
        while k < i.samples.len() && i.samples[k].t < (s.t + 1) as f64 {
            let x = i.samples[k];
            s.waiting = x.waiting;
            s.admitted = x.admitted;
            s.active = x.active;
            s.capacity = x.capacity;
            k += 1;
        }
    }
    let mut bump = |t: Option<f64>, f: fn(&mut Second)| {
        if let Some(t) = t.filter(|t| *t >= 0.0) {
            if let Some(s) = series.get_mut(t as usize) {
                f(s);
            }
        }
    };
    for l in logs {
        bump(l.join_ack, |s| s.arrivals += 1);
        bump(l.admit_hi, |s| s.admissions += 1);
        bump(l.complete_ack, |s| s.completions += 1);
    }

    let (seat_numbers, seats) = match &i.seats {
        Some((inv, inv_samples, call)) => {
            let (h, s) = seats::section(sc, logs, inv, inv_samples, *call);
            (Some(h), Some(s))
        }
        None => (None, None),
    };

    Report {
        kendall_tau: order.kendall_tau,
        fifo_inversions: order.fifo_inversions,
        capacity_overshoot_max: capacity
            .server_overshoot_max
            .max(capacity.client_overshoot_max),
        idle_slot_p50_sec: idle_slots.p50_sec,
        idle_slot_p99_sec: idle_slots.p99_sec,
        ghost_removal_p50_sec: ghosts.p50_sec,
        ghost_removal_p99_sec: ghosts.p99_sec,
        eta_mape: eta.all.mape,
        eta_within_20pct: eta.all.within_20pct,
        seat_numbers,
        label: i.label,
        event: i.event,
        nodes: i.nodes,
        started_unix: i.started_unix,
        duration_sec: i.duration_sec,
        scenario: i.scenario,
        settings_kept: i.settings_kept,
        event_config: i.event_config,
        users,
        order,
        capacity,
        idle_slots,
        ghosts,
        eta,
        client_cost,
        latency_ms,
        errors,
        series,
        seats,
    }
}

/// A ghost ends when its heartbeat lapses (`waiting_idle_sec`, plus 5 s for the sweep and
/// a loaded machine), or, if its turn came first, when its ready window closes as well:
/// the goal, and the latest a ghost may still go.
pub fn ghost_goals(sc: &Scenario) -> (f64, f64) {
    let goal = f64::from(sc.waiting_idle_sec) + 5.0;
    (goal, goal + f64::from(sc.ready_ttl_sec))
}

/// The ETA goal: MAPE within 15 %, under steady admission.
pub const ETA_GOAL: f64 = 0.15;

/// One promise judged: ✓ (`Some(true)`), ✗, or not judged (`None`), and why.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub ok: Option<bool>,
    pub why: String,
}

fn behaviour_name(b: Behaviour) -> &'static str {
    match b {
        Behaviour::Stay => "stay",
        Behaviour::Abandon => "abandon",
        Behaviour::Reload => "reload",
        Behaviour::Netloss => "netloss",
    }
}

pub fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn pct_str(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{:.1} %", x * 100.0))
}

impl Report {
    /// Certain FIFO inversions: none is a pass only if admissions were compared at all.
    pub fn fifo_check(&self) -> Check {
        let compared = self.order.compared;
        Check {
            name: "FIFO",
            ok: (compared >= 2).then_some(self.fifo_inversions == 0),
            why: if compared >= 2 {
                format!("{} certain inversions", self.fifo_inversions)
            } else {
                format!("nothing to compare ({compared} admitted)")
            },
        }
    }

    pub fn capacity_check(&self) -> Check {
        Check {
            name: "capacity",
            ok: Some(self.capacity_overshoot_max == 0),
            why: format!("overshoot {}", self.capacity_overshoot_max),
        }
    }

    /// Ghosts: ✗ if one was never removed although its deadline passed while the run
    /// watched, or if the removals seen were late; never ✓ while some were not seen
    /// removed (a p99 of the removed ones alone says nothing of those).
    pub fn ghost_check(&self) -> Check {
        let g = &self.ghosts;
        let (goal, late) = ghost_goals(&self.scenario);
        // Between the goal and the late bound a ghost may have been admitted meanwhile
        // (its ready window then runs too): not judged.
        let removed = g
            .p99_sec
            .and_then(|p| (p <= goal || p > late).then_some(p <= goal));
        let ok = if g.overdue > 0 || removed == Some(false) {
            Some(false)
        } else if g.unseen > 0 {
            None
        } else {
            removed
        };
        let mut why = format!(
            "{} silent, {} removed (p99 {} s, goal {goal} s)",
            g.silent,
            g.removed,
            opt(g.p99_sec, 1)
        );
        if g.unseen > 0 {
            why.push_str(&format!(
                "; {} never seen removed, {} of them past waiting_idle_sec + 5 + ready_ttl_sec = {late} s",
                g.unseen, g.overdue
            ));
        }
        Check {
            name: "ghost removal",
            ok,
            why,
        }
    }

    /// The ETA goal holds "under steady admission" (docs/PERFORMANCE.md), so it is applied
    /// only there: a configured pace (`admit_per_minute`) with slots to spare, so that the
    /// pace alone sets every wait. There every estimate is judged, those without a range
    /// too, so a pause or a wrong pace still shows. When the capacity binds, admission
    /// follows the sessions' ends and the goal says nothing: judging it there marked every
    /// capacity-bound run ✗. The figures stay on the card and in the report.
    pub fn eta_check(&self) -> Check {
        let all = &self.eta.all;
        let c = &self.capacity;
        let paced = self.scenario.admit_per_minute.is_some();
        let slots_to_spare = c.server_max_used < c.capacity;
        let (ok, why) = if paced && slots_to_spare {
            (
                self.eta_mape.map(|m| m <= ETA_GOAL),
                format!(
                    "judged on all {} estimates: steady admission (a configured pace, at most \
                     {} of {} slots used)",
                    all.samples, c.server_max_used, c.capacity
                ),
            )
        } else {
            let bound = if paced {
                format!(
                    "the capacity bound as well as the pace ({} of {} slots used)",
                    c.server_max_used, c.capacity
                )
            } else {
                "capacity-bound, no configured pace".to_string()
            };
            (
                None,
                format!(
                    "not judged: {bound}, so no steady admission; {} estimates, {} with a \
                     range (MAPE {})",
                    all.samples,
                    all.range_samples,
                    pct_str(all.ranged_mape)
                ),
            )
        };
        Check {
            name: "ETA",
            ok,
            why,
        }
    }

    /// The people: everyone who joined and stayed is admitted (or told the sale ended).
    /// An event that admits nobody, people who failed, lost their place for no reason of
    /// their own, or still waited when the run was cut off, is a ✗: the other promises
    /// can all hold vacuously then.
    pub fn people_check(&self) -> Check {
        let u = &self.users;
        let mut bad = Vec::new();
        if u.admitted == 0 {
            bad.push("nobody admitted".to_string());
        }
        if u.still_waiting > 0 {
            bad.push(format!("{} still waiting at max_run_secs", u.still_waiting));
        }
        if u.failed > 0 {
            bad.push(format!("{} failed", u.failed));
        }
        if u.gone > 0 {
            bad.push(format!("{} places ended without a reason", u.gone));
        }
        let ok = (u.total > 0).then_some(bad.is_empty());
        // Admitted people whose session outlasted the run are noted, not failed: the
        // room kept its promise to them.
        let on_site = u.unfinished - u.still_waiting;
        if on_site > 0 {
            bad.push(format!("{on_site} still on the site at max_run_secs"));
        }
        Check {
            name: "people",
            ok,
            why: if bad.is_empty() {
                format!("{} of {} joined admitted", u.admitted, u.joined)
            } else {
                bad.join(", ")
            },
        }
    }

    /// Every promise judged, in the order of the page's cards.
    pub fn checks(&self) -> Vec<Check> {
        let mut v = vec![
            self.people_check(),
            self.fifo_check(),
            self.capacity_check(),
            self.ghost_check(),
            self.eta_check(),
        ];
        if let (Some(h), Some(x)) = (&self.seat_numbers, &self.seats) {
            v.push(Check {
                name: "seats double sold",
                ok: Some(h.seats_double_sold == 0),
                why: h.seats_double_sold.to_string(),
            });
            v.push(Check {
                name: "sold vs bought",
                ok: Some(h.seats_sold_mismatch == 0),
                why: format!("{} mismatched", h.seats_sold_mismatch),
            });
            v.push(Check {
                name: "sold-out notice",
                ok: x.sold_out.map(|_| x.untold == 0),
                why: format!("{} waiting people never told", x.untold),
            });
        }
        v
    }

    /// The checks that failed, for the terminal.
    pub fn failed_checks(&self) -> Vec<Check> {
        self.checks()
            .into_iter()
            .filter(|c| c.ok == Some(false))
            .collect()
    }

    /// One line: what failed (with why), what passed, what was not judged.
    pub fn checks_line(&self) -> String {
        let checks = self.checks();
        let pick =
            |ok: Option<bool>| -> Vec<&Check> { checks.iter().filter(|c| c.ok == ok).collect() };
        let mut parts = Vec::new();
        let failed = pick(Some(false));
        if !failed.is_empty() {
            parts.push(format!(
                "✗ {}",
                failed
                    .iter()
                    .map(|c| format!("{} ({})", c.name, c.why))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for (mark, ok) in [("✓", Some(true)), ("not judged:", None)] {
            let v = pick(ok);
            if !v.is_empty() {
                parts.push(format!(
                    "{mark} {}",
                    v.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
                ));
            }
        }
        format!("checks: {}", parts.join("; "))
    }

    /// The headline numbers, for the terminal.
    pub fn summary(&self) -> String {
        let mut s = self.queue_summary();
        if let (Some(h), Some(x)) = (&self.seat_numbers, &self.seats) {
            s.push_str(&format!(
                "\nseats: {} sold of {} (bought by clients {}, by {} people); double sold {}, \
                 sold/bought mismatch {}; hold conflicts {} in {} holds; {} without a seat; \
                 sold out at {} s, {} waiting told: p50 {} s, p99 {} s, max {} s ({} untold); \
                 {} turned away at join",
                h.seats_sold,
                x.seats,
                h.seats_bought_by_clients,
                x.buyers,
                h.seats_double_sold,
                h.seats_sold_mismatch,
                h.hold_conflicts,
                x.hold_attempts,
                h.people_without_seats,
                opt(h.sold_out_at_sec, 1),
                x.notices.told,
                opt(h.sold_out_notice_p50_sec, 2),
                opt(h.sold_out_notice_p99_sec, 2),
                opt(x.notices.max_sec, 2),
                x.untold,
                x.closed_at_join,
            ));
        }
        s.push('\n');
        s.push_str(&self.checks_line());
        s
    }

    fn queue_summary(&self) -> String {
        let u = &self.users;
        let unfinished = if u.unfinished > 0 {
            format!(
                ", {} cut off at max_run_secs ({} still waiting)",
                u.unfinished, u.still_waiting
            )
        } else {
            String::new()
        };
        let settings = if self.settings_kept {
            " (the event's own settings)"
        } else {
            ""
        };
        format!(
            "{}: {} users, {} admitted ({} direct), {} completed, {} abandoned, {} expired, {} failed{unfinished}; {:.0} s\n\
             order: kendall tau {}, FIFO inversions {} (observed at face value {}), position rises {}\n\
             capacity {}: overshoot {} (server max used {}, clients held at most {})\n\
             idle slots: p50 {} s, p99 {} s over {} freed slots\n\
             ghosts: {} silent, removal p50 {} s, p99 {} s ({} unseen, {} overdue; waiting_idle_sec {}{settings})\n\
             ETA: MAPE {}, within ±20 % {} ({} samples; at join MAPE {}, bias {}); \
             with a range: {} of {} estimates, MAPE {}, range held {}",
            self.label,
            u.total,
            u.admitted,
            u.direct_entries,
            u.completed,
            u.abandoned,
            u.expired,
            u.failed,
            self.duration_sec,
            opt(self.kendall_tau, 4),
            self.fifo_inversions,
            self.order.observed_inversions,
            self.order.position_rises,
            self.capacity.capacity,
            self.capacity_overshoot_max,
            self.capacity.server_max_used,
            self.capacity.client_max_held,
            opt(self.idle_slot_p50_sec, 2),
            opt(self.idle_slot_p99_sec, 2),
            self.idle_slots.frees,
            self.ghosts.silent,
            opt(self.ghost_removal_p50_sec, 1),
            opt(self.ghost_removal_p99_sec, 1),
            self.ghosts.unseen,
            self.ghosts.overdue,
            self.ghosts.waiting_idle_sec,
            pct_str(self.eta_mape),
            pct_str(self.eta_within_20pct),
            self.eta.all.samples,
            pct_str(self.eta.at_join.mape),
            pct_str(self.eta.at_join.bias),
            self.eta.all.range_samples,
            self.eta.all.samples,
            pct_str(self.eta.all.ranged_mape),
            pct_str(self.eta.all.within_range),
        )
    }
}

pub use super::html::html;

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
