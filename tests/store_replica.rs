//! The Redis store's node-local replicas (`src/store/redis/replica.rs`) on real servers:
//! `status` answered without a script call, two nodes racing (every status of node B exact
//! within the staleness bound while node A changes the event), convergence after a forced
//! gap in the change log, and the batched renewals of polls (a polled place stays, a silent
//! one goes within `waiting_idle_sec` + 1 s).
//!
//! Each test starts its own `redis-server`, so that `INFO commandstats` counts only its own
//! calls.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::redis::{unique_prefix, RedisServer};
use waitroom::clock::system_now;
use waitroom::core::{EventPatch, PlaceKey, PlaceState, QueueError};
use waitroom::store::redis::{RedisOptions, RedisStore};
use waitroom::store::{JoinRequest, Store, StoreError};

/// The staleness a replica guarantees by construction: it answers only while its last
/// read that reached the end of the log began less than 500 ms ago; the rest is margin for
/// a loaded machine (this bounds correctness, it measures nothing).
const BOUND: Duration = Duration::from_millis(1500);

fn store(url: &str, prefix: &str, replica: bool) -> Arc<dyn Store> {
    let opts = RedisOptions {
        key_prefix: prefix.to_string(),
        replica,
        ..RedisOptions::default()
    };
    Arc::new(RedisStore::new(url, opts).unwrap())
}

/// Two nodes with replicas on one server under a fresh key prefix (answered too, for the
/// tests that read the keys themselves).
fn two_nodes(server: &RedisServer) -> (String, Arc<dyn Store>, Arc<dyn Store>) {
    let prefix = unique_prefix();
    let a = store(&server.url(), &prefix, true);
    let b = store(&server.url(), &prefix, true);
    (prefix, a, b)
}

async fn event(s: &Arc<dyn Store>, id: &str, json: serde_json::Value) {
    let patch: EventPatch = serde_json::from_value(json).unwrap();
    s.put_event(id, &patch, system_now()).await.unwrap();
}

async fn join(s: &Arc<dyn Store>, ev: &str) -> PlaceKey {
    let req = JoinRequest {
        user_id: None,
        metadata: None,
        nonce: waitroom::tokens::random_u128(),
        proven: false,
        invite: None,
    };
    s.join(ev, &req, system_now()).await.unwrap().key
}

/// How many script calls (`FCALL`, or `EVALSHA` on a server without Functions) the server
/// ran so far.
async fn script_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("cmdstat_fcall:calls=")
                .or_else(|| l.strip_prefix("cmdstat_evalsha:calls="))
        })
        .filter_map(|rest| rest.split(',').next())
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Polls `status` until `ok` holds of its answer, within `within`.
async fn until_status(
    s: &Arc<dyn Store>,
    ev: &str,
    key: PlaceKey,
    within: Duration,
    ok: impl Fn(&Result<waitroom::core::PlaceView, StoreError>) -> bool,
) {
    let start = Instant::now();
    loop {
        let r = s.status(ev, key, system_now()).await;
        if ok(&r) {
            return;
        }
        assert!(start.elapsed() < within, "status never became right: {r:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_from_the_replica_runs_no_script() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let prefix = unique_prefix();
    for replica in [true, false] {
        let s = store(&server.url(), &prefix, replica);
        let ev = if replica { "with" } else { "without" };
        event(&s, ev, serde_json::json!({"max_active": 1})).await;
        let mut keys = Vec::new();
        for _ in 0..20 {
            keys.push(join(&s, ev).await);
        }
        // The first poll starts the replica (and may ask the script while it syncs).
        let view = s.status(ev, keys[5], system_now()).await.unwrap();
        assert_eq!(view.position, Some(5));
        let before = script_calls(&mut conn).await;
        for _ in 0..5 {
            for (i, k) in keys.iter().enumerate().skip(1) {
                let v = s.status(ev, *k, system_now()).await.unwrap();
                assert_eq!(v.position, Some(i as u64), "exact position of place {i}");
                assert_eq!(v.queue_length, 19);
            }
        }
        let calls = script_calls(&mut conn).await - before;
        if replica {
            // 95 polls; at most a few renewal flushes (every 500 ms).
            assert!(
                calls <= 5,
                "{calls} script calls for 95 polls from the replica"
            );
        } else {
            assert_eq!(calls, 95, "without the replica each poll is one script");
        }
        s.close().await.unwrap();
    }
}

/// A snapshot of more places than one piece holds (4,096: replica.lua) is read in several
/// script calls; the replica then answers exact positions, also after changes that landed
/// between the pieces (node A leaves places while node B's replica loads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_read_in_pieces_answers_exact_positions() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let (_, a, b) = two_nodes(&server);
    let ev = "big";
    event(&a, ev, serde_json::json!({"max_active": 1})).await;
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                for _ in 0..300 {
                    mine.push(join(&a, ev).await);
                }
                mine
            })
        })
        .collect();
    let mut keys = Vec::new();
    for t in tasks {
        keys.extend(t.await.unwrap());
    }
    keys.sort_by_key(|k| k.seq);
    // B's first poll starts its replica; A's leaves race with the pieces of its snapshot.
    let first = b.status(ev, keys[9_000], system_now()).await.unwrap();
    assert_eq!(first.position, Some(9_000));
    let left: Vec<PlaceKey> = keys[1..].iter().step_by(3).copied().collect();
    for k in &left {
        assert!(a.leave(ev, *k, system_now()).await.unwrap());
    }
    let waiting: Vec<PlaceKey> = keys[1..]
        .iter()
        .filter(|k| !left.contains(k))
        .copied()
        .collect();
    let last = *waiting.last().unwrap();
    until_status(&b, ev, last, Duration::from_secs(5), |v| {
        v.as_ref()
            .is_ok_and(|v| v.position == Some(waiting.len() as u64))
    })
    .await;
    let before = script_calls(&mut conn).await;
    for (i, k) in waiting.iter().enumerate().step_by(97) {
        let v = b.status(ev, *k, system_now()).await.unwrap();
        assert_eq!(v.position, Some(i as u64 + 1), "seq {}", k.seq);
        assert_eq!(v.queue_length, waiting.len() as u64);
    }
    let calls = script_calls(&mut conn).await - before;
    assert!(
        calls <= 5,
        "{calls} script calls: the replica did not answer"
    );
}

/// A poll answered by the replica renews its place later; a settings change that shortens
/// `waiting_idle_sec` counts it from the change at the earliest (neither place goes at
/// once), then sweeps with the new timeout: the place polled through the replica stays,
/// the silent one goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_idle_time_keeps_the_places_polled_through_the_replica() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let prefix = unique_prefix();
    let a = store(&server.url(), &prefix, true);
    let ev = "shorter";
    let settings = |idle: u64| serde_json::json!({"max_active": 1, "ready_ttl_sec": 60, "waiting_idle_sec": idle});
    // 6 s, then 3: the old settings told pollers to come back within 2 s, so the lowered
    // idle time counts from the change (view.rs `lowered_idle_floor`).
    event(&a, ev, settings(6)).await;
    let _holder = join(&a, ev).await;
    let polled = join(&a, ev).await;
    let silent = join(&a, ev).await;
    // The replica synced: its polls cost no script.
    until_status(&a, ev, polled, Duration::from_secs(5), |v| v.is_ok()).await;
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    let before = script_calls(&mut conn).await;
    a.status(ev, polled, system_now()).await.unwrap();
    assert_eq!(
        script_calls(&mut conn).await,
        before,
        "answered by the replica"
    );
    // Three seconds of idleness (the least): both joined over three seconds ago (alive
    // under the old 6 s), only one was polled since.
    let patch: EventPatch = serde_json::from_value(settings(3)).unwrap();
    a.put_event(ev, &patch, system_now()).await.unwrap();
    let now = system_now();
    for k in [polled, silent] {
        assert_eq!(
            a.peek(ev, k, now).await.unwrap().status,
            PlaceState::Waiting,
            "not ended at the change"
        );
    }
    for _ in 0..7 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        a.status(ev, polled, system_now()).await.unwrap();
    }
    let now = system_now();
    assert_eq!(
        a.peek(ev, polled, now).await.unwrap().status,
        PlaceState::Waiting
    );
    assert!(
        a.peek(ev, silent, now).await.is_err(),
        "the silent place went"
    );
}

/// What node A saw after each of its changes: every tracked place's state, position and
/// the queue length, or `None` once the place ended.
type Seen = HashMap<u64, Option<(PlaceState, Option<u64>, u64)>>;

struct Step {
    /// When the change was sent (its state may exist from then on) …
    sent: Instant,
    /// … and what every place looked like after it.
    seen: Seen,
}

async fn look(s: &Arc<dyn Store>, ev: &str, keys: &[PlaceKey]) -> Seen {
    let mut seen = HashMap::new();
    for k in keys {
        let v = match s.peek(ev, *k, system_now()).await {
            Ok(v) => Some((v.status, v.position, v.queue_length)),
            Err(StoreError::Queue(_)) => None,
            Err(e) => panic!("peek: {e}"),
        };
        seen.insert(k.seq, v);
    }
    seen
}

/// A changes the event (joins, leaves, completions that admit), recording each state.
async fn churn(a: &Arc<dyn Store>, ev: &str, keys: &mut Vec<PlaceKey>, n: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    for i in 0..n {
        let sent = Instant::now();
        match i % 4 {
            0 | 1 => keys.push(join(a, ev).await),
            2 => {
                // A waiting place near the middle leaves.
                let k = keys[keys.len() / 2];
                a.leave(ev, k, system_now()).await.unwrap();
            }
            _ => {
                // The admitted place enters and completes: the next one is admitted.
                for k in keys.iter() {
                    if let Ok(v) = a.peek(ev, *k, system_now()).await {
                        if v.status == PlaceState::Admitted {
                            a.enter(ev, *k, system_now()).await.unwrap();
                            a.complete(ev, *k, system_now()).await.unwrap();
                            break;
                        }
                    }
                }
            }
        }
        steps.push(Step {
            sent,
            seen: look(a, ev, keys).await,
        });
    }
    steps
}

/// B's answer for `seq` (asked over [asked, answered]) is one A's history held at some
/// time in [asked − BOUND, answered]; answers how stale it was (0: current).
fn check(
    steps: &[Step],
    seq: u64,
    got: &Option<(PlaceState, Option<u64>, u64)>,
    asked: Instant,
    answered: Instant,
) -> Duration {
    let from = asked.checked_sub(BOUND).unwrap_or(asked);
    let mut best: Option<Duration> = None;
    for (i, step) in steps.iter().enumerate() {
        let until = steps.get(i + 1).map(|n| n.sent);
        // The state of step i held from its sending until the next step was answered.
        let ends = steps.get(i + 2).map(|n| n.sent).or(until);
        if step.sent > answered || ends.is_some_and(|e| e < from) {
            continue;
        }
        if step.seen.get(&seq) == Some(got) {
            let stale = ends.map_or(Duration::ZERO, |e| asked.saturating_duration_since(e));
            best = Some(best.map_or(stale, |b| b.min(stale)));
        }
    }
    best.unwrap_or_else(|| panic!("place {seq}: B answered {got:?}, which A never had then"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_converge_across_nodes_and_after_a_gap() {
    let server = RedisServer::start();
    let (prefix, a, b) = two_nodes(&server);
    let ev = "race";
    event(&a, ev, serde_json::json!({"max_active": 2})).await;
    let mut keys = Vec::new();
    for _ in 0..12 {
        keys.push(join(&a, ev).await);
    }
    // B polls every place while A changes the event.
    let polls = {
        let (b, keys) = (b.clone(), keys.clone());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut out = Vec::new();
            let mut i = 0usize;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let k = keys[i % keys.len()];
                i += 1;
                let asked = Instant::now();
                let got = match b.status(ev, k, system_now()).await {
                    Ok(v) => Some((v.status, v.position, v.queue_length)),
                    Err(StoreError::Queue(_)) => None,
                    Err(e) => panic!("status on B: {e}"),
                };
                out.push((k.seq, got, asked, Instant::now()));
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            out
        });
        (task, stop)
    };
    let start = vec![Step {
        sent: Instant::now(),
        seen: look(&a, ev, &keys).await,
    }];
    let mut steps = start;
    steps.extend(churn(&a, ev, &mut keys, 160).await);
    polls.1.store(true, std::sync::atomic::Ordering::Relaxed);
    let answers = polls.0.await.unwrap();
    assert!(answers.len() > 100, "B polled only {} times", answers.len());
    let mut stale: Vec<Duration> = answers
        .iter()
        .map(|(seq, got, asked, answered)| check(&steps, *seq, got, *asked, *answered))
        .collect();
    stale.sort();
    let q = |p: f64| stale[((stale.len() - 1) as f64 * p) as usize];
    println!(
        "{} statuses on B during {} changes on A: staleness p50 {:?}, p99 {:?}, max {:?}",
        stale.len(),
        steps.len() - 1,
        q(0.5),
        q(0.99),
        q(1.0)
    );

    // A forced gap: the log is trimmed to nothing as fast as A writes, so B misses entries
    // and must resync from a snapshot.
    let mut trim = raw(&server).await;
    let log = format!("{prefix}:{{{ev}}}:lg");
    let trimmer = {
        let log = log.clone();
        tokio::spawn(async move {
            let mut removed = 0u64;
            let until = Instant::now() + Duration::from_millis(800);
            while Instant::now() < until {
                let n: u64 = redis::cmd("XTRIM")
                    .arg(&log)
                    .arg("MAXLEN")
                    .arg(0)
                    .query_async(&mut trim)
                    .await
                    .unwrap();
                removed += n;
            }
            removed
        })
    };
    churn(&a, ev, &mut keys, 60).await;
    let removed = trimmer.await.unwrap();
    assert!(removed > 0, "the trimmer removed nothing");
    // One more change after the gap, then B must hold exactly what A holds.
    keys.push(join(&a, ev).await);
    let truth = look(&a, ev, &keys).await;
    for k in &keys {
        let want = truth[&k.seq];
        until_status(&b, ev, *k, BOUND, |r| {
            let got = match r {
                Ok(v) => Some((v.status, v.position, v.queue_length)),
                Err(_) => None,
            };
            got == want
        })
        .await;
    }
    // … and answer it from its replica again, not from the script.
    let mut conn = raw(&server).await;
    let waiting: Vec<PlaceKey> = keys
        .iter()
        .filter(|k| matches!(truth[&k.seq], Some((PlaceState::Waiting, _, _))))
        .copied()
        .collect();
    let before = script_calls(&mut conn).await;
    for k in waiting.iter().cycle().take(60) {
        let v = b.status(ev, *k, system_now()).await.unwrap();
        assert_eq!(Some((v.status, v.position, v.queue_length)), truth[&k.seq]);
    }
    let calls = script_calls(&mut conn).await - before;
    assert!(
        calls <= 5,
        "{calls} script calls for 60 polls after the resync"
    );
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_renewals_keep_polled_places_and_silent_ones_go() {
    renewals_keep_polled_places_and_silent_ones_go(false).await;
}

/// The same with `POST /queue/heartbeat` (and WebSocket heartbeats): a heartbeat is a
/// status without the answer, so the replica renews it the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_heartbeats_keep_their_places_and_silent_ones_go() {
    renewals_keep_polled_places_and_silent_ones_go(true).await;
}

async fn renewals_keep_polled_places_and_silent_ones_go(by_heartbeat: bool) {
    let server = RedisServer::start();
    // A does the periodic work (the sweep); B answers the polls from its replica.
    let (prefix, a, b) = two_nodes(&server);
    let ev = "idle";
    event(
        &a,
        ev,
        serde_json::json!({"max_active": 1, "waiting_idle_sec": 3}),
    )
    .await;
    let _holder = join(&a, ev).await; // admitted: the others wait
    let polled = join(&a, ev).await;
    let silent = join(&a, ev).await;
    let silent_joined = Instant::now();
    let ticker = {
        let a = a.clone();
        tokio::spawn(async move {
            loop {
                let _ = a.tick(ev, system_now()).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut conn = raw(&server).await;
    // The heartbeat chunk of the polled place (32 seqs per chunk).
    let wseen = format!("{prefix}:{{{ev}}}:ws:{}", polled.seq / 32);
    let mut silent_gone_at = None;
    let mut deferred = 0;
    let started = Instant::now();
    // Three idle timeouts of polling every 600 ms.
    while started.elapsed() < Duration::from_secs(9) {
        let now = system_now();
        if by_heartbeat {
            b.heartbeat(ev, polled, now)
                .await
                .expect("the place that beats stays");
        } else {
            let v = b
                .status(ev, polled, now)
                .await
                .expect("the polled place stays");
            assert_eq!(v.status, PlaceState::Waiting);
        }
        // The renewal is queued, not written: the score is still older than this poll.
        let score: Option<u64> = redis::cmd("ZSCORE")
            .arg(&wseen)
            .arg(polled.seq)
            .query_async(&mut conn)
            .await
            .unwrap();
        if score.is_some_and(|s| s < now) {
            deferred += 1;
        }
        if silent_gone_at.is_none() && a.peek(ev, silent, system_now()).await.is_err() {
            silent_gone_at = Some(silent_joined.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
        // Sent within the flush interval.
        let score: Option<u64> = redis::cmd("ZSCORE")
            .arg(&wseen)
            .arg(polled.seq)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            score.is_some_and(|s| s >= now),
            "the poll at {now} was not renewed"
        );
    }
    ticker.abort();
    assert!(deferred > 0, "no poll was answered from the replica");
    let gone = silent_gone_at.expect("the silent place was never removed");
    // Its deadline is 3 s after its join; the sweep runs every 100 ms.
    assert!(
        gone <= Duration::from_millis(4000 + 600),
        "the silent place went only after {gone:?}"
    );
    assert!(
        gone >= Duration::from_millis(2900),
        "removed early: {gone:?}"
    );
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Joins and leaves that node A sends in batches (many in one script call) are each their
/// own entry of the change log: node B's replica then answers every place exactly as the
/// script does. (A batch logged as one entry, with only its last operation's places, left
/// B's replica without the others: wrong positions, left places still waiting.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_writes_reach_the_other_nodes_replica_exactly() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let (_, a, b) = two_nodes(&server);
    let ev = "batched";
    event(&a, ev, serde_json::json!({"max_active": 1})).await;
    let first = join(&a, ev).await;
    // B's replica starts with its first poll.
    until_status(&b, ev, first, BOUND, |r| r.is_ok()).await;

    let before = script_calls(&mut conn).await;
    let joins: Vec<_> = (0..80)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move { join(&a, ev).await })
        })
        .collect();
    let mut keys = vec![first];
    for j in joins {
        keys.push(j.await.unwrap());
    }
    let leaving: Vec<PlaceKey> = keys.iter().skip(3).step_by(4).copied().collect();
    let leaves: Vec<_> = leaving
        .iter()
        .map(|k| {
            let (a, k) = (a.clone(), *k);
            tokio::spawn(async move { a.leave(ev, k, system_now()).await.unwrap() })
        })
        .collect();
    for l in leaves {
        assert!(l.await.unwrap(), "every leave removed its place");
    }
    let writes = script_calls(&mut conn).await - before;
    assert!(
        writes < 100,
        "{writes} script calls for 100 operations: they were not batched"
    );

    // A's script answers are the truth; B must come to answer each one the same.
    let truth = look(&a, ev, &keys).await;
    let before = script_calls(&mut conn).await;
    for k in &keys {
        let want = truth[&k.seq];
        until_status(&b, ev, *k, BOUND, |r| match (r, want) {
            (Ok(v), Some(w)) => (v.status, v.position, v.queue_length) == w,
            (Err(StoreError::Queue(_)), None) => true,
            _ => false,
        })
        .await;
    }
    let reads = script_calls(&mut conn).await - before;
    assert!(
        reads < 40,
        "{reads} script calls for {} statuses on B: its replica did not answer them",
        keys.len()
    );
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// The steps of a change-log entry: one per version, each from its `v` up to the next.
fn log_steps(fields: &[Vec<u8>]) -> Vec<&[Vec<u8>]> {
    let mut steps: Vec<&[Vec<u8>]> = Vec::new();
    let mut start = 0;
    for i in (2..fields.len()).step_by(2) {
        if fields[i] == b"v" {
            steps.push(&fields[start..i]);
            start = i;
        }
    }
    steps.push(&fields[start..]);
    steps
}

/// Every entry of the change log names the event's incarnation in its first step: `m`
/// carries all the numbers, and a first `d` the incarnation among the numbers it changed.
/// A replica that missed an event's deletion and its new incarnation's first entries would
/// otherwise patch the new entries onto the old incarnation's state. Joins sent together
/// share one entry (a step each, of one script call): a later step names no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_log_entry_names_the_incarnation() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let (prefix, a, _) = two_nodes(&server);
    let ev = "incarnation";
    event(&a, ev, serde_json::json!({"max_active": 1})).await;
    for _ in 0..3 {
        join(&a, ev).await;
    }
    futures_util::future::join_all((0..40).map(|_| join(&a, ev))).await;
    let log = format!("{prefix}:{{{ev}}}:lg");
    // Place records are binary: the fields are read as bytes.
    let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(&log)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(entries.len() >= 4, "{entries:?}");
    let mut inc = None;
    let mut versions = Vec::new();
    let mut shared = false;
    let mut bare = 0;
    for (id, fields) in &entries {
        let steps = log_steps(fields);
        shared |= steps.len() > 1;
        for (i, step) in steps.into_iter().enumerate() {
            let field = |name: &str| {
                step.chunks(2)
                    .find(|p| p[0] == name.as_bytes())
                    .map(|p| String::from_utf8_lossy(&p[1]).into_owned())
            };
            versions.push(field("v").unwrap().parse::<u64>().unwrap());
            let seen = if let Some(m) = field("m") {
                m.split(',').nth(24).map(str::to_string)
            } else if let Some(d) = field("d") {
                let n: Vec<&str> = d.split(',').collect();
                n.chunks(2).find(|p| p[0] == "24").map(|p| p[1].to_string())
            } else {
                // No numbers: a join's step (one more waiting), never an entry's first.
                assert!(i > 0, "{id}: an entry's first step without numbers");
                bare += 1;
                None
            };
            let Some(seen) = seen else {
                assert!(i > 0, "{id}: no incarnation in the entry's first step");
                continue;
            };
            assert_ne!(seen, "0", "{id}");
            assert_eq!(inc.get_or_insert_with(|| seen.clone()), &seen, "{id}");
        }
    }
    assert!(shared, "no entry held the steps of several joins");
    // The joins after an entry's first step carry no numbers (each sets the waiting count
    // alone, one more: the replica counts it).
    let steps: usize = entries.iter().map(|(_, f)| log_steps(f).len()).sum();
    assert!(
        bare > 0 && bare >= steps.saturating_sub(2 * entries.len()),
        "{bare} of {steps} steps in {} entries without numbers",
        entries.len()
    );
    // One step per version, none missing.
    let want: Vec<u64> = (1..=versions.len() as u64).collect();
    assert_eq!(versions, want);
}

/// The log is trimmed by versions, not entries: with joins sent together (an entry holds a
/// step each), it still keeps about `LOG_MAXLEN` (10,000, src/store/redis/log_meta.rs) to
/// twice as many versions, no more, and never fewer than `LOG_MAXLEN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_trimmed_by_versions() {
    const LOG_MAXLEN: u64 = 10_000;
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let (prefix, a, _) = two_nodes(&server);
    let ev = "trim";
    event(&a, ev, serde_json::json!({"max_active": 1, "paused": true})).await;
    let workers = 64u64;
    let total = 2 * LOG_MAXLEN + LOG_MAXLEN / 2;
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let a = a.clone();
            tokio::spawn(async move {
                for _ in (w..total).step_by(workers as usize) {
                    join(&a, ev).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let log = format!("{prefix}:{{{ev}}}:lg");
    let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(&log)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let kept: u64 = entries.iter().map(|(_, f)| log_steps(f).len() as u64).sum();
    assert!(
        entries.len() as u64 * 4 < kept,
        "{} entries of {kept} versions: the joins were not sent together",
        entries.len()
    );
    // MINID ~ drops whole stream nodes only: a node's worth of slack.
    assert!(
        (LOG_MAXLEN..=2 * LOG_MAXLEN + 1_000).contains(&kept),
        "{kept} versions kept of {total}"
    );
}

/// The version of the change log's last step.
async fn last_version(conn: &mut redis::aio::MultiplexedConnection, log: &str) -> u64 {
    let last: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XREVRANGE")
        .arg(log)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(conn)
        .await
        .unwrap();
    let steps = log_steps(&last[0].1);
    let v = &steps.last().unwrap()[1];
    std::str::from_utf8(v).unwrap().parse().unwrap()
}

/// Counts the commands a script runs on one key, seen through `MONITOR` (whose lines name
/// the client `lua` for those), from [`ScriptCommands::watch`] to [`ScriptCommands::stop`].
struct ScriptCommands {
    task: tokio::task::JoinHandle<u64>,
    marker: String,
}

impl ScriptCommands {
    async fn watch(server: &RedisServer, cmd: &str, key: &str) -> Self {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
            .await
            .unwrap();
        tcp.write_all(b"MONITOR\r\n").await.unwrap();
        let mut lines = BufReader::new(tcp).lines();
        // Commands are reported from the `+OK` on.
        assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("+OK"));
        let needle = format!("lua] \"{cmd}\" \"{key}\"");
        let marker = format!("end-of-watch-{}", unique_prefix());
        let end = marker.clone();
        let task = tokio::spawn(async move {
            let mut seen = 0;
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains(&end) {
                    return seen;
                }
                seen += u64::from(line.contains(&needle));
            }
            panic!("the monitor's connection closed");
        });
        ScriptCommands { task, marker }
    }

    /// How many were seen: every command sent before the call is counted, as the monitor
    /// reports commands in the order the server ran them and the count ends at an `ECHO`
    /// sent here.
    async fn stop(self, conn: &mut redis::aio::MultiplexedConnection) -> u64 {
        let _: String = redis::cmd("ECHO")
            .arg(&self.marker)
            .query_async(conn)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the monitor reported the end")
            .unwrap()
    }
}

/// `n` anonymous joins sent together by node `s`, each at its own time from `clock` on (a
/// step of the log then always carries its time, so an entry holds a fixed number of
/// steps), in this order.
async fn joins_at(s: &Arc<dyn Store>, ev: &str, clock: &mut u64, n: usize) -> Vec<PlaceKey> {
    let reqs: Vec<(JoinRequest, u64)> = (0..n)
        .map(|_| {
            *clock += 1;
            (anonymous(), *clock)
        })
        .collect();
    futures_util::future::join_all(reqs.iter().map(|(r, t)| s.join(ev, r, *t)))
        .await
        .into_iter()
        .map(|r| r.unwrap().key)
        .collect()
}

fn anonymous() -> JoinRequest {
    JoinRequest {
        nonce: waitroom::tokens::random_u128(),
        ..JoinRequest::default()
    }
}

/// A node on a runtime of its own (one thread), which the test can stop for a while: its
/// replica then falls behind the log exactly as a node that stalled would.
struct Stalling {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Stalling {
    fn start() -> Stalling {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            rt.block_on(async {
                let _ = stopped.await;
            });
        });
        Stalling {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Blocks the runtime's one thread (every task of the node waits) until the sender is
    /// used or dropped; answers once it is blocked.
    async fn stall(&self) -> std::sync::mpsc::Sender<()> {
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (blocked, is_blocked) = tokio::sync::oneshot::channel::<()>();
        self.handle.spawn(async move {
            let _ = blocked.send(());
            let _ = wait.recv();
        });
        is_blocked.await.unwrap();
        go
    }
}

impl Drop for Stalling {
    fn drop(&mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        let _ = self.thread.take().map(std::thread::JoinHandle::join);
    }
}

/// A full batch (more joins in one script call than one change-log entry holds, so that
/// an entry is written before the call ends) whose early entry ends just before a multiple
/// of `LOG_MAXLEN`: the log still keeps at least `LOG_MAXLEN` versions (README, "the log is
/// trimmed to 10,000–20,000 versions"), and a replica that fell behind by a few hundred
/// reads on without a new snapshot. (The trimming marked the early entry by the version
/// that came next, so it and the entry after it both counted as passing the multiple: the
/// log shrank to those two entries, and every lagging replica reloaded.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_batch_across_the_trim_length_keeps_the_log() {
    const LOG_MAXLEN: u64 = 10_000;
    const FULL: usize = 256; // MAX_BATCH, src/store/redis/batch.rs
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let prefix = unique_prefix();
    let a = store(&server.url(), &prefix, true);
    let ev = "full";
    let log = format!("{prefix}:{{{ev}}}:lg");
    let idle = serde_json::json!({"max_active": 1, "paused": true, "waiting_idle_sec": 2_592_000});
    event(&a, ev, idle).await;
    // Times in the past, one per join, so nothing the test does depends on the clock.
    let mut clock = system_now() - 200_000;

    // One call of FULL joins: one in flight alone while the server is stopped, the rest
    // queue behind it and go together. How many steps an entry holds: the early one's.
    let batch = |a: Arc<dyn Store>, mut clock: u64| async move {
        server_paused_batch(a, ev, &mut clock).await;
        clock
    };
    server.pause();
    let run = tokio::spawn(batch(a.clone(), clock));
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.resume();
    clock = run.await.unwrap();
    let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(&log)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let per_entry = entries
        .iter()
        .map(|(_, f)| log_steps(f).len())
        .max()
        .unwrap();
    assert!(
        per_entry < FULL,
        "an entry held {per_entry} steps: a full batch writes no early entry"
    );
    let per_entry = per_entry as u64;
    // The full batch below starts at version `start`, its early entry ends at a multiple.
    let start = LOG_MAXLEN - per_entry;

    // Up close, many at once; the last few one by one.
    while last_version(&mut conn, &log).await + FULL as u64 + 50 < start {
        joins_at(&a, ev, &mut clock, FULL).await;
    }
    let first = join(&a, ev).await;
    // Node B follows the log, then stalls.
    let b_node = Stalling::start();
    let (url, p) = (server.url(), prefix.clone());
    let b = b_node
        .handle
        .spawn(async move { store(&url, &p, true) })
        .await
        .unwrap();
    let on_b = move |b: Arc<dyn Store>, key: PlaceKey| async move {
        b.status(ev, key, system_now()).await
    };
    let sb = b.clone();
    b_node
        .handle
        .spawn(async move { until_status(&sb, ev, first, BOUND, |r| r.is_ok()).await })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let go = b_node.stall().await;
    // B now lags: more versions than one entry, before the full batch.
    while last_version(&mut conn, &log).await + 2 < start {
        clock += 1;
        a.join(ev, &anonymous(), clock).await.unwrap();
    }
    assert_eq!(last_version(&mut conn, &log).await + 2, start);
    server.pause();
    let run = tokio::spawn(batch(a.clone(), clock));
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.resume();
    run.await.unwrap();

    let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(&log)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let versions: Vec<u64> = entries
        .iter()
        .flat_map(|(_, f)| log_steps(f))
        .map(|s| std::str::from_utf8(&s[1]).unwrap().parse().unwrap())
        .collect();
    let last = *versions.last().unwrap();
    assert!(last > LOG_MAXLEN, "the log passed {LOG_MAXLEN}: {last}");
    // The batch's early entry ends where the test put it.
    let ends_at_multiple = entries.iter().any(|(_, f)| {
        let steps = log_steps(f);
        let v = |s: &[Vec<u8>]| -> u64 { std::str::from_utf8(&s[1]).unwrap().parse().unwrap() };
        steps.len() as u64 == per_entry
            && v(steps[0]) == start
            && v(steps[steps.len() - 1]) == LOG_MAXLEN - 1
    });
    assert!(
        ends_at_multiple,
        "no entry of versions {start}..{LOG_MAXLEN}"
    );
    let kept = versions.len() as u64;
    assert!(
        kept >= LOG_MAXLEN,
        "{kept} versions kept of {last}: fewer than {LOG_MAXLEN}"
    );
    assert!(kept <= 2 * LOG_MAXLEN, "{kept} versions kept");
    let want: Vec<u64> = (last + 1 - kept..=last).collect();
    assert_eq!(versions, want, "the kept versions follow each other");

    // B reads on from where it stalled: no new snapshot. A snapshot's script reads the
    // log's last id; a replica also sends that `XREVRANGE` itself when an empty read comes
    // a second after its last check (`CHECK_EVERY`), which a stall longer than a second
    // brings about: only the script's are counted.
    let snapshots = ScriptCommands::watch(&server, "XREVRANGE", &log).await;
    drop(go);
    let key = *joins_at(&a, ev, &mut clock, 1).await.last().unwrap();
    b_node
        .handle
        .spawn(async move {
            let start = Instant::now();
            while on_b(b.clone(), key).await.is_err() {
                assert!(start.elapsed() < BOUND, "B never answered");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Time for B to have read the whole log.
            tokio::time::sleep(Duration::from_millis(300)).await;
            b.close().await.unwrap();
        })
        .await
        .unwrap();
    assert_eq!(
        snapshots.stop(&mut conn).await,
        0,
        "the lagging replica loaded a new snapshot"
    );
    a.close().await.unwrap();
}

/// One join sent alone, then (while it is in flight on a stopped server) `MAX_BATCH` more,
/// which queue behind it and go in one script call.
async fn server_paused_batch(a: Arc<dyn Store>, ev: &'static str, clock: &mut u64) {
    *clock += 1;
    let alone = {
        let (a, t) = (a.clone(), *clock);
        tokio::spawn(async move { a.join(ev, &anonymous(), t).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    joins_at(&a, ev, clock, 256).await;
    alone.await.unwrap();
}

/// A failover to a Redis replica that had not received the last writes sets an event back
/// in time (here: its keys restored from a dump taken before them). A node's replica that
/// applied those writes starts over from a snapshot, so the lost places answer
/// `TOKEN_NOT_FOUND` instead of waiting for ever on a quiet event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_ahead_of_a_log_set_back_starts_over() {
    use waitroom::core::QueueError;
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let prefix = unique_prefix();
    let s = store(&server.url(), &prefix, true);
    event(&s, "ev", serde_json::json!({"paused": true})).await;
    let mut kept = Vec::new();
    for _ in 0..5 {
        kept.push(join(&s, "ev").await);
    }
    assert_eq!(
        s.status("ev", kept[4], system_now())
            .await
            .unwrap()
            .position,
        Some(5)
    );
    let pattern = format!("{prefix}:{{ev}}:*");
    let names: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut dumps = Vec::new();
    for k in &names {
        let d: Vec<u8> = redis::cmd("DUMP")
            .arg(k)
            .query_async(&mut conn)
            .await
            .unwrap();
        dumps.push((k.clone(), d));
    }
    let mut lost = Vec::new();
    for _ in 0..5 {
        lost.push(join(&s, "ev").await);
    }
    until_status(&s, "ev", lost[4], BOUND, |r| {
        r.as_ref().is_ok_and(|v| v.position == Some(10))
    })
    .await;

    // The failover: the event as it was before the lost joins.
    let now: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&now)
        .query_async(&mut conn)
        .await
        .unwrap();
    for (k, d) in &dumps {
        let _: () = redis::cmd("RESTORE")
            .arg(k)
            .arg(0)
            .arg(d)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    for k in &lost {
        until_status(&s, "ev", *k, Duration::from_secs(10), |r| {
            matches!(r, Err(StoreError::Queue(QueueError::TokenNotFound)))
        })
        .await;
    }
    // Once settled (the polls of the lost places above went to the script, whose writes
    // the replica follows), answered from the replica again: this node's own writes that
    // the failover lost are not waited for (each poll would wait 50 ms, then ask Redis).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = script_calls(&mut conn).await;
    for _ in 0..4 {
        for (i, k) in kept.iter().enumerate() {
            let v = s.status("ev", *k, system_now()).await.unwrap();
            assert_eq!(v.position, Some(i as u64 + 1));
            assert_eq!(v.queue_length, 5);
        }
    }
    let calls = script_calls(&mut conn).await - before;
    assert!(calls <= 3, "{calls} script calls for 20 polls");
    s.close().await.unwrap();
}

/// One transition that changes thousands of places (here a `clear` of 4,500; a resume that
/// admits 4,500 does it in steps of `END_BATCH`, which the replicas follow too) is logged
/// as one step all the same: listed as seq/record pairs, its
/// XADD would pass the arguments Redis's Lua can give one call (about 8,000), and the failed
/// XADD, after the step's writes, left the event's numbers unwritten: the call answered
/// `UNAVAILABLE` and the event stayed broken (`clear` removed the places and still counted
/// them). Node B's replica applies those steps from the log, without a new snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_of_thousands_of_places_is_one_entry_the_replicas_apply() {
    const N: usize = 4_500;
    let server = RedisServer::start();
    let prefix = unique_prefix();
    // Such a step takes Redis about a second on a loaded machine (its scripts run alone):
    // an operation's usual 1.5 s bound would make this a test of the machine's speed.
    let node = || -> Arc<dyn Store> {
        let opts = RedisOptions {
            key_prefix: prefix.clone(),
            replica: true,
            op_timeout: Duration::from_secs(20),
            ..RedisOptions::default()
        };
        Arc::new(RedisStore::new(&server.url(), opts).unwrap())
    };
    let (a, b) = (node(), node());
    let mut conn = raw(&server).await;
    // Times in the past, one per join, and no place lapses: nothing depends on the clock.
    let mut clock = system_now() - 200_000;
    let idle = serde_json::json!({"max_active": 1, "paused": true, "waiting_idle_sec": 2_592_000});
    for ev in ["admit", "clear"] {
        event(&a, ev, idle.clone()).await;
    }
    let mut last = HashMap::new();
    for ev in ["admit", "clear"] {
        let mut keys = Vec::new();
        while keys.len() < N {
            keys.extend(joins_at(&a, ev, &mut clock, 250).await);
        }
        let key = *keys.last().unwrap();
        // B follows the event from here on.
        until_status(&b, ev, key, BOUND, |r| {
            r.as_ref().is_ok_and(|v| v.position == Some(N as u64))
        })
        .await;
        last.insert(ev, key);
    }
    let snapshots = [
        ScriptCommands::watch(&server, "XREVRANGE", &format!("{prefix}:{{admit}}:lg")).await,
        ScriptCommands::watch(&server, "XREVRANGE", &format!("{prefix}:{{clear}}:lg")).await,
    ];

    let resume: EventPatch =
        serde_json::from_value(serde_json::json!({"paused": false, "max_active": 5_000})).unwrap();
    a.put_event("admit", &resume, system_now()).await.unwrap();
    // (A script admits at most END_BATCH; the ticks admit the rest, each a step of its own.)
    for _ in 0..N / waitroom::core::END_BATCH + 1 {
        let now = system_now();
        if a.tick("admit", now).await.unwrap() != Some(now + 1) {
            break;
        }
    }
    assert_eq!(a.clear("clear", system_now()).await.unwrap(), N as u64);

    until_status(&b, "admit", last["admit"], BOUND, |r| {
        r.as_ref().is_ok_and(|v| v.status == PlaceState::Admitted)
    })
    .await;
    until_status(&b, "clear", last["clear"], BOUND, |r| {
        matches!(r, Err(StoreError::Queue(QueueError::TokenNotFound)))
    })
    .await;
    // The numbers were written with the step: the cleared line is empty, the admitted
    // places are counted.
    let view = a.join("clear", &anonymous(), system_now()).await.unwrap();
    assert_eq!((view.position, view.queue_length), (Some(1), 1));
    let view = a.join("admit", &anonymous(), system_now()).await.unwrap();
    assert_eq!(
        view.status,
        PlaceState::Admitted,
        "500 of 5,000 free: {view:?}"
    );
    // Time for B to have read the whole log.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for s in snapshots {
        assert_eq!(s.stop(&mut conn).await, 0, "B loaded a new snapshot");
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A poll the replica answers in the last half second before its place's deadline keeps
/// the place, as the same poll answered by the node that sweeps does (defect: its renewal
/// waited for the next flush, up to 0.4 s, and the sweep on the other node ended the place
/// first: polled 2.7–2.9 s after their joins with a 3 s idle limit, every place was lost
/// through one node and none through the other).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_near_the_deadline_keeps_its_place_through_either_node() {
    let server = RedisServer::start();
    let (_, a, b) = two_nodes(&server);
    let ev = "late";
    event(
        &a,
        ev,
        serde_json::json!({"max_active": 1, "waiting_idle_sec": 3}),
    )
    .await;
    let _holder = join(&a, ev).await;
    let ticker = {
        let a = a.clone();
        tokio::spawn(async move {
            loop {
                let _ = a.tick(ev, system_now()).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let mut places = Vec::new();
    for _ in 0..10 {
        places.push((join(&a, ev).await, Instant::now()));
    }
    // Spread over the last 0.3 s before the deadlines: a flush every 0.4 s comes too late
    // for most of them.
    for (i, (key, joined)) in places.iter().enumerate() {
        let at = *joined + Duration::from_millis(2700 + 25 * i as u64);
        tokio::time::sleep_until(at.into()).await;
        let v = b
            .status(ev, *key, system_now())
            .await
            .expect("alive at the poll");
        assert_eq!(v.status, PlaceState::Waiting);
    }
    // Past every place's old deadline, well before the new ones.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for (i, (key, _)) in places.iter().enumerate() {
        a.peek(ev, *key, system_now())
            .await
            .unwrap_or_else(|e| panic!("place {i}, polled in time, was ended: {e:?}"));
    }
    ticker.abort();
    a.close().await.unwrap();
    b.close().await.unwrap();
}
