//! Tests of `journey::report`.

use super::*;
use crate::journey::user::Plan;

#[test]
fn a_pushed_admission_is_timed_by_its_arrival_a_polled_one_by_the_middle() {
    let mut l = Log::new(Plan {
        id: 0,
        arrival: 0.0,
        transport: Transport::Ws,
        behaviour: Behaviour::Stay,
        hold: 1.0,
        strike_after: 1.0,
        pause: 1.0,
        node: 0,
        seats_wanted: 0,
    });
    l.admit_lo = Some(9.0);
    l.admit_hi = Some(10.0);
    assert_eq!(admission_instant(&l), 9.5);
    l.admit_pushed = true;
    assert_eq!(admission_instant(&l), 10.0);
}

fn plan(id: usize, behaviour: Behaviour) -> Plan {
    Plan {
        id,
        arrival: 0.0,
        transport: Transport::Ws,
        behaviour,
        hold: 1.0,
        strike_after: 1.0,
        pause: 1.0,
        node: 0,
        seats_wanted: 0,
    }
}

/// Joined at `join`, admitted (by a push) at `admit`, completed a second later.
fn admitted(id: usize, join: f64, admit: f64) -> Log {
    let mut l = Log::new(plan(id, Behaviour::Stay));
    l.join_sent = Some(join - 0.01);
    l.join_ack = Some(join);
    l.admit_lo = Some(admit - 0.5);
    l.admit_hi = Some(admit);
    l.admit_pushed = true;
    l.entered = Some(admit + 0.1);
    l.complete_sent = Some(admit + 1.0);
    l.complete_ack = Some(admit + 1.01);
    l.outcome = Outcome::Completed;
    l
}

/// Joined at `join`, closed the tab at `silent`.
fn ghost(id: usize, join: f64, silent: f64) -> Log {
    let mut l = Log::new(plan(id, Behaviour::Abandon));
    l.join_sent = Some(join - 0.01);
    l.join_ack = Some(join);
    l.silent_at = Some(silent);
    l.struck = true;
    l.outcome = Outcome::Abandoned;
    l
}

/// Admin readings: (instant, places expired so far).
fn samples(v: &[(f64, u64)]) -> Vec<Sample> {
    v.iter()
        .map(|&(t, expired)| Sample {
            t,
            expired,
            capacity: 10,
            ..Sample::default()
        })
        .collect()
}

fn inputs(sc: Scenario, event_config: Value, samples: Vec<Sample>, logs: Vec<Log>) -> Inputs {
    Inputs {
        label: "test".into(),
        scenario: sc,
        settings_kept: false,
        event: "e".into(),
        nodes: 1,
        started_unix: 0,
        duration_sec: samples.last().map_or(1.0, |s| s.t),
        event_config,
        base: Sample::default(),
        samples,
        logs,
        seats: None,
    }
}

fn card_of<'a>(html: &'a str, name: &str) -> &'a str {
    let at = html
        .find(&format!(r#"<div class="name">{name}"#))
        .unwrap_or_else(|| panic!("no card {name}"));
    let start = html[..at].rfind("<div class=\"card").unwrap();
    &html[start..at]
}

/// `--keep-settings`: an event with a grace of 30 s (the scenario says 6). A ghost
/// removed 20 s after it went silent kept the event's promise; judged against the
/// scenario's 6 + 5 s it was a false ✗, and the page showed settings the run never had.
#[test]
fn the_report_shows_and_judges_the_events_own_settings() {
    let sc = Scenario {
        max_active: 50,
        admit_per_minute: None,
        waiting_idle_sec: 6,
        ready_ttl_sec: 5,
        ..Scenario::default()
    };
    let event = serde_json::json!({
        "max_active": 10, "admit_per_minute": 120, "waiting_idle_sec": 30, "ready_ttl_sec": 8,
    });
    let logs = vec![admitted(0, 0.1, 0.2), ghost(1, 0.5, 1.0)];
    let mut i = inputs(
        sc,
        event,
        samples(&[(0.0, 0), (10.0, 0), (21.0, 1), (25.0, 1)]),
        logs,
    );
    i.settings_kept = true;
    let r = build(i);
    assert_eq!(r.ghosts.waiting_idle_sec, 30);
    assert_eq!(
        (r.scenario.max_active, r.scenario.admit_per_minute),
        (10, Some(120))
    );
    let g = r.ghost_check();
    assert_eq!(g.ok, Some(true), "{g:?}");
    let page = html(&r);
    assert!(page.contains("waiting_idle_sec + 5 = 35 s"), "{page}");
    assert!(page.contains("120 admissions/min") && page.contains("--keep-settings"));
    assert!(card_of(&page, "Ghost removal").contains("card ok"));
    let summary = r.summary();
    assert!(
        summary.contains("waiting_idle_sec 30 (the event's own settings)"),
        "{summary}"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["scenario"]["waiting_idle_sec"], 30);
    assert_eq!(json["settings_kept"], true);
}

/// One ghost removed in time, one never removed although the run watched well past its
/// deadline: the card is ✗ (it was ✓ on the removed one's p99 alone).
#[test]
fn a_ghost_never_removed_fails_the_ghost_card() {
    let sc = Scenario {
        waiting_idle_sec: 5,
        ready_ttl_sec: 3,
        ..Scenario::default()
    };
    let logs = || {
        vec![
            admitted(0, 0.1, 0.2),
            ghost(1, 0.5, 1.0),
            ghost(2, 0.5, 2.0),
        ]
    };
    // Deadline of the second: 2 + 5 + 5 + 3 = 15 s; the run watched until 30 s.
    let r = build(inputs(
        sc.clone(),
        Value::Null,
        samples(&[(0.0, 0), (7.0, 1), (30.0, 1)]),
        logs(),
    ));
    assert_eq!((r.ghosts.unseen, r.ghosts.overdue), (1, 1));
    assert_eq!(r.ghost_removal_p99_sec, Some(6.0));
    let g = r.ghost_check();
    assert_eq!(g.ok, Some(false), "{g:?}");
    assert!(card_of(&html(&r), "Ghost removal").contains("card bad"));
    assert!(r.summary().contains("✗ ghost removal"), "{}", r.summary());
    // The run stopped watching before the second was due: not judged, and not ✓.
    let r = build(inputs(
        sc,
        Value::Null,
        samples(&[(0.0, 0), (7.0, 1), (14.0, 1)]),
        logs(),
    ));
    assert_eq!((r.ghosts.unseen, r.ghosts.overdue), (1, 0));
    assert_eq!(r.ghost_check().ok, None);
    assert!(card_of(&html(&r), "Ghost removal").contains("card info"));
}

/// A paused event: everyone joined, nobody was admitted, all still waited when the run
/// was cut off. The report must not be all green.
#[test]
fn an_event_that_admits_nobody_is_not_all_green() {
    let logs: Vec<Log> = (0..5)
        .map(|id| {
            let mut l = Log::new(plan(id, Behaviour::Stay));
            l.join_sent = Some(0.1);
            l.join_ack = Some(0.2);
            l.outcome = Outcome::Unfinished;
            l
        })
        .collect();
    let r = build(inputs(
        Scenario::default(),
        Value::Null,
        samples(&[(0.0, 0), (25.0, 0)]),
        logs,
    ));
    assert_eq!(
        (r.users.joined, r.users.admitted, r.users.still_waiting),
        (5, 0, 5)
    );
    let p = r.people_check();
    assert_eq!(p.ok, Some(false), "{p:?}");
    assert!(p.why.contains("nobody admitted") && p.why.contains("5 still waiting"));
    // Nothing to compare is no ✓ for the order either.
    assert_eq!(r.fifo_check().ok, None);
    assert!(!r.failed_checks().is_empty());
    let summary = r.summary();
    assert!(
        summary.contains("checks: ✗ people (nobody admitted"),
        "{summary}"
    );
    let page = html(&r);
    assert!(card_of(&page, "People admitted").contains("card bad"));
    assert!(card_of(&page, "FIFO inversions").contains("card info"));
}

/// The ETA goal holds "under steady admission". Ten people wait 10 s each; four were
/// told 2 s (80 % off), six 10 s: MAPE 32 %.
#[test]
fn the_eta_goal_is_applied_only_under_steady_admission() {
    let logs: Vec<Log> = (0..10)
        .map(|id| {
            let join = 0.1 * id as f64;
            let mut l = admitted(id, join, join + 10.0);
            l.estimates.push(crate::journey::user::Estimate {
                at: join,
                eta_sec: if id < 4 { 2.0 } else { 10.0 },
                eta_low_sec: None,
                eta_high_sec: None,
                position: Some(id as u64 + 1),
            });
            l
        })
        .collect();
    // Readings of admitted + active: `used` of the 10 slots at most.
    let report = |pace: Option<u32>, used: u64| {
        let event = serde_json::json!({ "admit_per_minute": pace });
        let mut samples = samples(&[(0.0, 0), (20.0, 0)]);
        samples[0].admitted = used;
        build(inputs(Scenario::default(), event, samples, logs.clone()))
    };
    // Capacity-bound (the standard scenario): no goal there, and no ✗ for it.
    let r = report(None, 10);
    assert!((r.eta_mape.unwrap() - 0.32).abs() < 1e-9);
    let c = r.eta_check();
    assert_eq!(c.ok, None, "{c:?}");
    assert!(c.why.contains("capacity-bound"), "{c:?}");
    assert!(card_of(&html(&r), "ETA mean abs").contains("card info"));
    // A configured pace with slots to spare: steady admission, every estimate judged,
    // and the error shows.
    let r = report(Some(600), 4);
    let c = r.eta_check();
    assert_eq!(c.ok, Some(false), "{c:?}");
    assert!(c.why.contains("all 10 estimates"), "{c:?}");
    assert!(card_of(&html(&r), "ETA mean abs").contains("card bad"));
    // A pace that the capacity overrode: not steady either.
    assert_eq!(report(Some(600), 10).eta_check().ok, None);
}
