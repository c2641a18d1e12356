//! Unit tests of the state machine in `queue.rs` (kept apart so that file stays the rules).

use super::*;

const S: Millis = 1000;

fn queue(max_active: u32) -> EventQueue {
    EventQueue::new(EventConfig {
        max_active,
        ..EventConfig::default()
    })
}

fn join(q: &mut EventQueue, n: u128, user: Option<&str>, now: Millis) -> PlaceView {
    let proof = JoinProof {
        proven: true,
        invite: None,
    };
    q.join(n, user, None, proof, now, &mut Vec::new()).unwrap()
}

#[test]
fn direct_entry_then_fifo_positions() {
    let mut q = queue(1);
    let a = join(&mut q, 1, Some("a"), 0);
    assert_eq!(a.status, PlaceState::Admitted);
    let b = join(&mut q, 2, Some("b"), 0);
    let c = join(&mut q, 3, None, 0);
    assert_eq!((b.position, c.position), (Some(1), Some(2)));
    assert_eq!(c.queue_length, 2);
    // Same user again: the same place, not a second one.
    assert_eq!(join(&mut q, 9, Some("b"), 0).key, b.key);
    // a leaves: b is admitted at once, c moves to 1.
    let mut fx = Vec::new();
    assert!(q.leave(a.key, S, &mut fx).unwrap());
    assert!(fx.contains(&Effect::Admitted {
        seq: b.key.seq,
        at: S
    }));
    assert_eq!(q.status(c.key, S, &mut fx).unwrap().position, Some(1));
    assert_eq!(q.enter(c.key, S, &mut fx), Err(QueueError::NotReady));
    q.check_invariants().unwrap();
}

#[test]
fn ghosts_expire_without_polling_and_stop_counting() {
    // Paused, so nobody is admitted and only expiry moves the queue.
    let mut q = EventQueue::new(EventConfig {
        paused: true,
        ..EventConfig::default()
    });
    let ghost = join(&mut q, 2, None, 0);
    let me = join(&mut q, 3, None, 0);
    assert_eq!(me.position, Some(2));
    let mut fx = Vec::new();
    // I keep polling; the ghost never does.
    q.heartbeat(me.key, 200 * S, &mut fx).unwrap();
    let later = q.status(me.key, 300 * S, &mut fx).unwrap();
    assert_eq!(later.position, Some(1));
    assert_eq!(
        q.status(ghost.key, 300 * S, &mut fx),
        Err(QueueError::TokenExpired)
    );
    q.check_invariants().unwrap();
}

#[test]
fn lost_time_moves_idle_deadlines_but_not_ready_windows() {
    // Paused: only expiry moves the queue. Idle periods are 300 s.
    let mut q = EventQueue::new(EventConfig {
        paused: true,
        ..EventConfig::default()
    });
    let b = join(&mut q, 2, None, 0);
    let c = join(&mut q, 3, None, 0);
    let mut fx = Vec::new();
    q.heartbeat(b.key, 100 * S, &mut fx).unwrap();
    // The node lost 250 s: `b` polled at 100 s, so it lasts until 650 s, not 400 s;
    // `c` never polled: until 550 s.
    q.forgive_idle(250 * S);
    let waiting = |q: &mut EventQueue, key, at| q.peek(key, at, &mut Vec::new()).map(|v| v.status);
    assert_eq!(waiting(&mut q, c.key, 549 * S), Ok(PlaceState::Waiting));
    assert_eq!(
        waiting(&mut q, c.key, 550 * S),
        Err(QueueError::TokenExpired)
    );
    assert_eq!(waiting(&mut q, b.key, 649 * S), Ok(PlaceState::Waiting));
    assert_eq!(
        waiting(&mut q, b.key, 650 * S),
        Err(QueueError::TokenExpired)
    );
    q.check_invariants().unwrap();
    // A ready window keeps its deadline (60 s), as after a restart.
    let mut q = queue(1);
    let a = join(&mut q, 1, None, 0);
    assert_eq!(a.status, PlaceState::Admitted);
    q.forgive_idle(250 * S);
    assert_eq!(
        q.enter(a.key, 60 * S, &mut fx),
        Err(QueueError::TokenExpired)
    );
}

#[test]
fn admitted_places_lapse_and_hand_on_their_slot() {
    let mut q = queue(1);
    let a = join(&mut q, 1, None, 0);
    let b = join(&mut q, 2, None, 0);
    let mut fx = Vec::new();
    // ready_ttl is 60 s: a never enters.
    assert_eq!(q.tick(59 * S, &mut fx), Some(60 * S));
    q.tick(60 * S, &mut fx);
    assert_eq!(
        q.peek(b.key, 60 * S, &mut fx).unwrap().status,
        PlaceState::Admitted
    );
    assert_eq!(
        q.enter(a.key, 60 * S, &mut fx),
        Err(QueueError::TokenExpired)
    );
    let s = q.enter(b.key, 61 * S, &mut fx).unwrap();
    assert_eq!(s.session_ends_at, Some(61 * S + 600 * S));
    // Session idle 120 s unless heartbeats come; max 600 s regardless.
    q.session_heartbeat(b.key, 150 * S, &mut fx).unwrap();
    assert!(q.session_view(b.key, 250 * S, &mut fx).is_ok());
    assert_eq!(
        q.session_view(b.key, 271 * S, &mut fx),
        Err(QueueError::NoSession)
    );
}

#[test]
fn rate_budget_paces_admissions() {
    let mut q = EventQueue::new(EventConfig {
        max_active: 100,
        admit_per_minute: Some(60),
        ..EventConfig::default()
    });
    let views: Vec<_> = (0..5).map(|i| join(&mut q, i, None, 0)).collect();
    assert_eq!(
        views
            .iter()
            .filter(|v| v.status == PlaceState::Admitted)
            .count(),
        1
    );
    let mut fx = Vec::new();
    let next = q.tick(0, &mut fx).unwrap();
    assert_eq!(next, S);
    q.tick(S, &mut fx);
    q.tick(2 * S, &mut fx);
    assert_eq!(q.figures(2 * S, &mut fx).admitted, 3);
}

#[test]
fn paused_admits_nobody_until_resumed() {
    let mut q = EventQueue::new(EventConfig {
        paused: true,
        ..EventConfig::default()
    });
    let a = join(&mut q, 1, None, 0);
    assert_eq!(a.status, PlaceState::Waiting);
    let mut fx = Vec::new();
    let mut c = q.config().clone();
    c.paused = false;
    q.set_config(c, S, &mut fx);
    assert_eq!(
        fx,
        vec![Effect::Admitted {
            seq: a.key.seq,
            at: S
        }]
    );
}

#[test]
fn queue_full_and_closed() {
    let mut q = EventQueue::new(EventConfig {
        max_active: 1,
        max_queue_length: Some(1),
        ..EventConfig::default()
    });
    join(&mut q, 1, None, 0);
    join(&mut q, 2, None, 0);
    assert_eq!(
        q.join(3, None, None, JoinProof::default(), 0, &mut Vec::new()),
        Err(QueueError::QueueFull)
    );
    let mut c = q.config().clone();
    c.accept_joins = false;
    q.set_config(c, 0, &mut Vec::new());
    assert_eq!(
        q.join(4, None, None, JoinProof::default(), 0, &mut Vec::new()),
        Err(QueueError::EventClosed)
    );
}

#[test]
fn long_sale_keeps_rank_window_bounded() {
    let mut q = queue(1);
    let mut fx = Vec::new();
    let mut prev = join(&mut q, 0, None, 0);
    for i in 1..20_000u128 {
        let v = join(&mut q, i, None, 0);
        q.leave(prev.key, 0, &mut fx).unwrap();
        prev = v;
    }
    assert!(
        q.rank.base() > 15_000,
        "window never slid: base {}",
        q.rank.base()
    );
    q.check_invariants().unwrap();
}

#[test]
fn place_table_reclaims_chunks_behind_the_oldest_live_place() {
    use crate::core::places::PlaceTable;
    const C: u64 = PlaceTable::CHUNK as u64;
    let mut q = queue(1);
    let keys: Vec<_> = (0..3 * C + 5)
        .map(|i| join(&mut q, u128::from(i), None, 0).key)
        .collect();
    let base = keys[0].seq - keys[0].seq % C;
    // The chunk of each key, counted from the first.
    let chunk = |k: &PlaceKey| (k.seq - base) / C;
    let mut fx = Vec::new();
    let last_of_first = keys.iter().rposition(|k| chunk(k) == 0).unwrap();
    for k in &keys[..last_of_first] {
        q.leave(*k, 0, &mut fx).unwrap();
    }
    assert_eq!(
        q.places.window(),
        (base, 4),
        "one live place keeps its chunk"
    );
    // Empty the third chunk first: a hole behind a live chunk stays.
    for k in keys.iter().filter(|k| chunk(k) == 2) {
        q.leave(*k, 0, &mut fx).unwrap();
    }
    assert_eq!(q.places.window(), (base, 4));
    q.leave(keys[last_of_first], 0, &mut fx).unwrap();
    assert_eq!(q.places.window(), (base + C, 3));
    for k in keys.iter().filter(|k| chunk(k) == 1) {
        q.leave(*k, 0, &mut fx).unwrap();
    }
    // Reclaims through the hole.
    assert_eq!(q.places.window(), (base + 3 * C, 1));
    assert_eq!(
        q.places.len(),
        keys.iter().filter(|k| chunk(k) == 3).count()
    );
    assert!(q.places.get(&keys[0].seq).is_none());
    q.check_invariants().unwrap();
}

#[test]
fn eta_uses_configured_pace_before_any_admission() {
    let mut q = EventQueue::new(EventConfig {
        max_active: 1,
        admit_per_minute: Some(30),
        paused: true,
        ..EventConfig::default()
    });
    join(&mut q, 1, None, 0);
    let v = join(&mut q, 2, None, 0);
    assert_eq!(v.eta_sec, Some(4)); // position 2 at 0.5/s
}

#[test]
fn an_operation_stamped_before_the_end_does_not_reopen_a_sale_seen_over() {
    let closes = 100 * S;
    let mut q = EventQueue::new(EventConfig {
        max_active: 10,
        admit_per_minute: Some(60),
        closes_at: Some(closes),
        ready_ttl_sec: 600,
        ..EventConfig::default()
    });
    let mut fx = Vec::new();
    let a = join(&mut q, 1, None, 0);
    let b = join(&mut q, 2, None, 0);
    assert_eq!(a.status, PlaceState::Admitted);
    assert_eq!(b.status, PlaceState::Waiting);
    // The waiting place is told the sale is over...
    assert_eq!(
        q.status(b.key, closes + 10, &mut fx),
        Err(QueueError::TokenNotFound)
    );
    // ...and so it stays for a status stamped before the end, reaching the event after...
    assert_eq!(
        q.status(b.key, closes - 100, &mut fx),
        Err(QueueError::TokenNotFound)
    );
    // ...then a scheduler pass stamped before the end reaches the event (the clock is read
    // once per pass), with a rate token due: nobody is admitted, the place is swept.
    fx.clear();
    q.tick(closes - 150, &mut fx);
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Admitted { .. })),
        "{fx:?}"
    );
    assert!(fx.iter().any(|e| matches!(
        e,
        Effect::Ended { seq, reason: EndReason::Closed, .. } if *seq == b.key.seq
    )));
    assert_eq!(
        q.enter(b.key, closes + 200, &mut fx),
        Err(QueueError::TokenNotFound)
    );
    // A join that read the clock before the end, and reached the event after: closed too.
    assert_eq!(
        q.join(3, None, None, JoinProof::default(), closes - 50, &mut fx),
        Err(QueueError::EventClosed)
    );
    // The admitted place is untouched by the end.
    assert_eq!(
        q.enter(a.key, closes - 40, &mut fx).unwrap().status,
        PlaceState::Active
    );
    // Moved later, `closes_at` reopens the sale (its places are gone) for any `now` before it.
    let mut c = q.config().clone();
    c.closes_at = Some(200 * S);
    q.check_config(&c, closes + 300).unwrap();
    q.set_config(c, closes + 300, &mut fx);
    let v = q
        .join(4, None, None, JoinProof::default(), closes + 250, &mut fx)
        .unwrap();
    assert_eq!(v.status, PlaceState::Admitted);
    q.check_invariants().unwrap();
}
