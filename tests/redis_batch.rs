//! The Redis store's group commit (`src/store/redis/batch.rs`) against real servers: many
//! tasks on two nodes joining, leaving and entering at once, checked against what their
//! acknowledgements imply; one bad operation in a batch beside good ones; a batch that fails.
//!
//! The conformance suite, the model test and the differential test (`store_redis.rs`) run
//! every operation through the same batches too, mostly one at a time; these tests make the
//! batches large and crowded.

mod support;

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use support::redis::{shared_cluster, unique_prefix, RedisServer};
use waitroom::core::{EventPatch, Millis, PlaceKey, PlaceState, QueueError};
use waitroom::store::redis::{RedisOptions, RedisStore};
use waitroom::store::{JoinRequest, Store, StoreError};
use waitroom::tokens::random_u128;

const T0: Millis = 1_700_000_000_000;

fn options(prefix: &str) -> RedisOptions {
    RedisOptions {
        key_prefix: prefix.to_string(),
        ..RedisOptions::default()
    }
}

fn node(url: &str, prefix: &str) -> Arc<dyn Store> {
    Arc::new(RedisStore::new(url, options(prefix)).unwrap())
}

async fn make_event(store: &Arc<dyn Store>, id: &str, json: serde_json::Value) {
    let patch: EventPatch = serde_json::from_value(json).unwrap();
    store.put_event(id, &patch, T0).await.unwrap();
}

/// A node of a fresh prefix with a paused event `id` of one slot: joins only wait.
async fn paused_event(server: &RedisServer, id: &str) -> Arc<dyn Store> {
    let store = node(&server.url(), &unique_prefix());
    make_event(
        &store,
        id,
        serde_json::json!({"max_active": 1, "paused": true}),
    )
    .await;
    store
}

fn anonymous() -> JoinRequest {
    JoinRequest {
        nonce: random_u128(),
        ..JoinRequest::default()
    }
}

fn user(id: &str, proven: bool) -> JoinRequest {
    JoinRequest {
        user_id: Some(id.into()),
        proven,
        ..anonymous()
    }
}

fn queue_error<T: std::fmt::Debug>(r: Result<T, StoreError>) -> QueueError {
    match r {
        Err(StoreError::Queue(q)) => q,
        other => panic!("expected a queue error, got {other:?}"),
    }
}

/// How many script calls the server ran since its statistics were reset.
fn script_calls(server: &RedisServer) -> u64 {
    let info = server.info("commandstats");
    [
        "cmdstat_fcall:calls=",
        "cmdstat_evalsha:calls=",
        "cmdstat_eval:calls=",
    ]
    .iter()
    .filter_map(|k| {
        let rest = &info[info.find(k)? + k.len()..];
        rest[..rest.find(',')?].parse::<u64>().ok()
    })
    .sum()
}

/// A join as one task saw it: tickets of a clock shared by every task, taken just before the
/// call and just after its answer, so "acknowledged before the other was sent" is exact.
struct Joined {
    node: usize,
    key: PlaceKey,
    sent: u64,
    acked: u64,
}

/// Many tasks on two nodes race joins, leaves and enters of one event through batches; the
/// outcome must be what their acknowledgements imply: every acknowledged join holds exactly
/// one place of its own, every acknowledged leave removed its place and nothing else, the
/// waiting places stand at positions 1..=n in join order, admission went strictly by that
/// order, and a join acknowledged before another was sent stands ahead of it.
///
/// With `server` (a server of this test's own), also checks from its statistics that the
/// operations went in fewer script calls than there were operations.
async fn racing_operations_match_their_acknowledgements(url: String, server: Option<&RedisServer>) {
    let prefix = unique_prefix();
    let nodes = [node(&url, &prefix), node(&url, &prefix)];
    make_event(&nodes[0], "race", serde_json::json!({"max_active": 20})).await;
    let clock = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..48)
        .map(|t| {
            let nodes = nodes.clone();
            let clock = clock.clone();
            tokio::spawn(async move {
                let n = t % 2;
                let store = &nodes[n];
                let (mut joins, mut left, mut entered) = (Vec::new(), Vec::new(), Vec::new());
                for i in 0..25usize {
                    let sent = clock.fetch_add(1, Ordering::SeqCst);
                    let v = store.join("race", &anonymous(), T0).await.unwrap();
                    let acked = clock.fetch_add(1, Ordering::SeqCst);
                    assert!(
                        v.position.is_none_or(|p| p >= 1 && p <= v.queue_length),
                        "position within the queue"
                    );
                    joins.push(Joined {
                        node: n,
                        key: v.key,
                        sent,
                        acked,
                    });
                    // Every third place leaves at once; admitted places enter.
                    if (t + i) % 3 == 0 {
                        assert!(store.leave("race", v.key, T0).await.unwrap());
                        left.push(v.key);
                    } else if v.status == PlaceState::Admitted {
                        let e = store.enter("race", v.key, T0).await.unwrap();
                        assert_eq!(e.status, PlaceState::Active);
                        entered.push(v.key);
                    }
                }
                (joins, left, entered)
            })
        })
        .collect();
    let (mut joins, mut left, mut entered) = (Vec::new(), HashSet::new(), HashSet::new());
    for t in tasks {
        let (j, l, e) = t.await.unwrap();
        joins.extend(j);
        left.extend(l);
        entered.extend(e);
    }
    if let Some(server) = server {
        let ops = (joins.len() + left.len() + entered.len()) as u64;
        let calls = script_calls(server) - 1; // the event's creation
        assert!(
            calls < ops,
            "{calls} script calls for {ops} operations: nothing was batched"
        );
    }
    // No place given twice.
    let seqs: HashSet<u64> = joins.iter().map(|j| j.key.seq).collect();
    assert_eq!(seqs.len(), joins.len(), "every join has a place of its own");

    // Every place is where its acknowledgements put it; none is lost.
    for j in &joins {
        let r = nodes[1 - j.node].peek("race", j.key, T0).await;
        if left.contains(&j.key) {
            assert_eq!(
                queue_error(r),
                QueueError::TokenNotFound,
                "a left place is gone"
            );
            continue;
        }
        let v = r.expect("an acknowledged place is there");
        if entered.contains(&j.key) {
            assert_eq!(v.status, PlaceState::Active);
        }
    }
    let f = nodes[0].get_event("race", T0).await.unwrap().figures;
    assert_eq!(f.joins, joins.len() as u64);
    assert_eq!(f.left, left.len() as u64);
    let live = joins.len() - left.len();
    assert_eq!((f.waiting + f.admitted + f.active) as usize, live);
    assert_eq!((f.admitted + f.active) as usize, live.min(20));

    // Positions exact, in join order: re-read each waiting place's position.
    let mut waiting: Vec<&Joined> = joins.iter().filter(|j| !left.contains(&j.key)).collect();
    waiting.sort_by_key(|j| j.key.seq);
    let mut positions = Vec::new();
    let mut held = Vec::new();
    for j in &waiting {
        let v = nodes[j.node].peek("race", j.key, T0).await.unwrap();
        match v.status {
            PlaceState::Waiting => positions.push((j.key.seq, v.position.unwrap())),
            _ => held.push(j.key.seq),
        }
    }
    let expected: Vec<u64> = (1..=positions.len() as u64).collect();
    assert_eq!(
        positions.iter().map(|p| p.1).collect::<Vec<_>>(),
        expected,
        "waiting places stand at 1..=n in join order"
    );
    assert_eq!(positions.len() as u64, f.waiting);
    // Admission follows join order: every admitted or active place joined before every
    // waiting one.
    if let (Some(h), Some(w)) = (held.iter().max(), positions.first()) {
        assert!(
            *h < w.0,
            "place {h} was admitted ahead of the waiting {}",
            w.0
        );
    }

    // First acknowledged, first in line: on one node, and across nodes.
    let mut by_ack: Vec<&Joined> = joins.iter().collect();
    by_ack.sort_by_key(|j| j.acked);
    let mut by_sent: Vec<&Joined> = joins.iter().collect();
    by_sent.sort_by_key(|j| j.sent);
    // For every join y: every join acknowledged before y was sent has a smaller seq. Walk
    // the joins by their sending ticket, keeping the largest seq acknowledged so far.
    let (mut a, mut highest) = (0, 0u64);
    for y in by_sent {
        while a < by_ack.len() && by_ack[a].acked < y.sent {
            highest = highest.max(by_ack[a].key.seq);
            a += 1;
        }
        assert!(
            a == 0 || highest < y.key.seq,
            "a join acknowledged before place {} was sent stands behind it",
            y.key.seq
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_operations_match_their_acknowledgements_standalone() {
    // A server of its own, so its statistics count this test's calls only.
    let server = RedisServer::start();
    support::redis::raw_command(server.port, "CONFIG RESETSTAT").unwrap();
    racing_operations_match_their_acknowledgements(server.url(), Some(&server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_operations_match_their_acknowledgements_on_a_cluster() {
    racing_operations_match_their_acknowledgements(shared_cluster().url(), None).await;
}

/// Operations queued behind a call in flight go together in the next call; a refused one
/// (ALREADY_JOINED, QUEUE_FULL, TOKEN_NOT_FOUND) answers its own caller and changes nothing
/// for its neighbours, which see each other's changes in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_operation_does_not_fail_its_neighbours() {
    let server = RedisServer::start();
    let store = node(&server.url(), &unique_prefix());
    make_event(
        &store,
        "b",
        serde_json::json!({"max_active": 1, "max_queue_length": 3}),
    )
    .await;
    let first = store.join("b", &user("u1", true), T0).await.unwrap();
    assert_eq!(first.status, PlaceState::Admitted);
    support::redis::raw_command(server.port, "CONFIG RESETSTAT").unwrap();

    // A call in flight that Redis does not answer yet: the next ones queue behind it.
    server.pause();
    let in_flight = {
        let store = store.clone();
        tokio::spawn(async move { store.join("b", &anonymous(), T0).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let bogus = PlaceKey { seq: 999, nonce: 1 };
    let reqs = [
        user("u2", true),
        user("u1", false),
        anonymous(),
        anonymous(),
        anonymous(),
    ];
    // join! polls its futures in this order the first time, so they queue in this order.
    let (b, again, d, full, bad_enter, left, last, ()) = tokio::join!(
        store.join("b", &reqs[0], T0 + 1),
        store.join("b", &reqs[1], T0 + 2),
        store.join("b", &reqs[2], T0 + 3),
        store.join("b", &reqs[3], T0 + 4),
        store.enter("b", bogus, T0 + 5),
        store.leave("b", first.key, T0 + 6),
        store.join("b", &reqs[4], T0 + 7),
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            server.resume();
        },
    );
    let a = in_flight.await.unwrap().unwrap();
    assert_eq!((a.status, a.position), (PlaceState::Waiting, Some(1)));
    assert_eq!(b.unwrap().position, Some(2), "behind the call in flight");
    assert_eq!(queue_error(again), QueueError::AlreadyJoined);
    assert_eq!(
        d.unwrap().position,
        Some(3),
        "the refusal before it changed nothing"
    );
    assert_eq!(queue_error(full), QueueError::QueueFull);
    assert_eq!(queue_error(bad_enter), QueueError::TokenNotFound);
    assert!(left.unwrap(), "u1 left");
    // u1's slot went to the head (the call in flight's place); the last join stands third.
    let last = last.unwrap();
    assert_eq!((last.position, last.queue_length), (Some(3), 3));
    // The seven queued operations went in one call, after the one in flight.
    assert_eq!(script_calls(&server), 2);
    let a_now = store.peek("b", a.key, T0 + 8).await.unwrap();
    assert_eq!(a_now.status, PlaceState::Admitted);
    let f = store.get_event("b", T0 + 8).await.unwrap().figures;
    assert_eq!((f.joins, f.left, f.waiting, f.admitted), (5, 1, 3, 1));
}

/// An operation whose caller gave up while it was still queued is never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_abandoned_before_its_batch_left_is_never_sent() {
    let server = RedisServer::start();
    let store = node(&server.url(), &unique_prefix());
    make_event(&store, "g", serde_json::json!({"max_active": 1})).await;
    let p = store.join("g", &anonymous(), T0).await.unwrap();
    server.pause();
    let in_flight = {
        let store = store.clone();
        tokio::spawn(async move { store.join("g", &anonymous(), T0 + 1).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let gave_up =
        tokio::time::timeout(Duration::from_millis(50), store.leave("g", p.key, T0 + 2)).await;
    assert!(
        gave_up.is_err(),
        "the caller gave up while its leave was queued"
    );
    server.resume();
    in_flight.await.unwrap().unwrap();
    // Another operation drains the lane after the call in flight; the leave is not in it.
    store.join("g", &anonymous(), T0 + 3).await.unwrap();
    let v = store.peek("g", p.key, T0 + 4).await.unwrap();
    assert_eq!(v.status, PlaceState::Admitted, "the place was never left");
    let f = store.get_event("g", T0 + 4).await.unwrap().figures;
    assert_eq!((f.joins, f.left), (3, 0));
}

/// A batch that fails (Redis frozen past the operation timeout) fails its own callers only,
/// as `Unavailable`, and the event's lane works again as soon as Redis does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_fails_its_callers_and_the_lane_recovers() {
    let server = RedisServer::start();
    let store: Arc<dyn Store> = Arc::new(
        RedisStore::new(
            &server.url(),
            RedisOptions {
                op_timeout: Duration::from_millis(400),
                ..options(&unique_prefix())
            },
        )
        .unwrap(),
    );
    make_event(&store, "f", serde_json::json!({"max_active": 1})).await;
    server.pause();
    let in_flight = {
        let store = store.clone();
        tokio::spawn(async move { store.join("f", &anonymous(), T0).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let reqs: Vec<JoinRequest> = (0..5).map(|_| anonymous()).collect();
    let queued = join_all(
        reqs.iter()
            .zip(1..)
            .map(|(r, i)| store.join("f", r, T0 + i)),
    )
    .await;
    for r in queued {
        assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    }
    let r = in_flight.await.unwrap();
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    server.resume();
    // The lane serves again (a lane left stuck would time this out as Unavailable).
    let v = store.join("f", &anonymous(), T0 + 10).await.unwrap();
    assert!(store.leave("f", v.key, T0 + 11).await.unwrap());
}

/// Redis out of memory (`maxmemory` reached) refuses the writes of a batch of joins: their
/// callers get `Unavailable` and nothing is half-written (the next join after the limit is
/// lifted gets the next seq, the figures agree). Reads still answer, and so does a leave:
/// Redis lets deletions through, and the meta after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_for_memory_changes_nothing() {
    let server = RedisServer::start();
    let store = node(&server.url(), &unique_prefix());
    make_event(&store, "m", serde_json::json!({"max_active": 1})).await;
    let first = store.join("m", &anonymous(), T0).await.unwrap();
    let second = store.join("m", &anonymous(), T0).await.unwrap();
    support::redis::raw_command(server.port, "CONFIG SET maxmemory 1").unwrap();
    let reqs: Vec<JoinRequest> = (0..4).map(|_| anonymous()).collect();
    let joins = join_all(reqs.iter().map(|r| store.join("m", r, T0 + 1))).await;
    for r in joins {
        assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    }
    let v = store.peek("m", second.key, T0 + 1).await.unwrap();
    assert_eq!(v.position, Some(1));
    assert!(store.leave("m", second.key, T0 + 1).await.unwrap());
    support::redis::raw_command(server.port, "CONFIG SET maxmemory 0").unwrap();
    let third = store.join("m", &anonymous(), T0 + 2).await.unwrap();
    assert_eq!(
        third.key.seq,
        second.key.seq + 1,
        "no seq was used by a refused join"
    );
    assert_eq!(third.position, Some(1));
    let f = store.get_event("m", T0 + 2).await.unwrap().figures;
    assert_eq!((f.joins, f.left, f.waiting, f.admitted), (3, 1, 1, 1));
    assert!(store.leave("m", first.key, T0 + 3).await.unwrap());
}

/// With `wait_replicas`, a batch is answered after one `WAIT` (not one per operation), and
/// what it acknowledged is on the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_wait_per_batch_and_acknowledged_joins_are_on_the_replica() {
    let master = RedisServer::start();
    let dir = tempfile::tempdir().unwrap().keep();
    let replica = RedisServer::start_replica_of(master.port, &dir);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !replica
        .info("replication")
        .contains("master_link_status:up")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never synced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let prefix = unique_prefix();
    let store: Arc<dyn Store> = Arc::new(
        RedisStore::new(
            &master.url(),
            RedisOptions {
                wait_replicas: 1,
                ..options(&prefix)
            },
        )
        .unwrap(),
    );
    make_event(&store, "w", serde_json::json!({"max_active": 1})).await;
    support::redis::raw_command(master.port, "CONFIG RESETSTAT").unwrap();
    let reqs: Vec<JoinRequest> = (0..48).map(|_| anonymous()).collect();
    let views: Vec<_> = join_all(reqs.iter().map(|r| store.join("w", r, T0)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let stats = master.info("commandstats");
    let calls = |cmd: &str| {
        let k = format!("cmdstat_{cmd}:calls=");
        stats.find(&k).map_or(0, |i| {
            let rest = &stats[i + k.len()..];
            rest[..rest.find(',').unwrap()].parse::<u64>().unwrap()
        })
    };
    let scripts = script_calls(&master);
    assert!(scripts < 48, "{scripts} script calls for 48 joins");
    assert_eq!(calls("wait"), scripts, "one WAIT per script call");
    // Acknowledged means replicated: the replica holds every place (seqs 1 to 48 are in
    // the line's first two chunks of 32).
    let held: u64 = (0..2)
        .map(|c| {
            let n =
                support::redis::raw_command(replica.port, &format!("LLEN {prefix}:{{w}}:q:{c}"))
                    .unwrap();
            n.trim().trim_start_matches(':').parse::<u64>().unwrap()
        })
        .sum();
    assert_eq!(held, 47, "47 waiting places on the replica");
    let seqs: HashSet<u64> = views.iter().map(|v| v.key.seq).collect();
    assert_eq!(seqs.len(), 48);
}

/// `cargo test --test redis_batch memory_per_place -- --ignored --nocapture` (MEM_N places,
/// default 100,000; MEM_USER=1 gives each a 17-byte user id): Redis memory per waiting place
/// on a fresh server (`INFO memory` used_memory before and after), and what each of the
/// event's keys holds (`MEMORY USAGE … SAMPLES 0`, exact), for docs/PERFORMANCE.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn memory_per_place() {
    let n: u64 = std::env::var("MEM_N").map_or(100_000, |v| v.parse().unwrap());
    let with_user = std::env::var("MEM_USER").is_ok_and(|v| v == "1");
    let server = RedisServer::start();
    let port = server.port;
    let used = || {
        let info = server.info("memory");
        let line = info
            .lines()
            .find(|l| l.starts_with("used_memory:"))
            .unwrap();
        line["used_memory:".len()..].trim().parse::<u64>().unwrap()
    };
    let prefix = unique_prefix();
    let store = node(&server.url(), &prefix);
    make_event(
        &store,
        "mem",
        serde_json::json!({"max_active": 1, "paused": true, "waiting_idle_sec": 2_592_000}),
    )
    .await;
    let before = used();
    support::redis::raw_command(port, "CONFIG RESETSTAT").unwrap();
    let workers = 64;
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in (w..n).step_by(workers as usize) {
                    let req = if with_user {
                        user(&format!("user-{i:012}"), true)
                    } else {
                        anonymous()
                    };
                    store.join("mem", &req, T0).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let after = used();
    // The Redis side of the joins: script calls and the time Redis spent in them.
    let stats = server.info("commandstats");
    // (FCALL: a library of Redis Functions; EVALSHA on a server without them.)
    let evalsha = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_fcall:"))
        .or_else(|| stats.lines().find(|l| l.starts_with("cmdstat_evalsha:")))
        .unwrap_or_default()
        .to_string();
    let field = |name: &str| {
        let at = evalsha.find(name).map(|i| i + name.len());
        at.and_then(|i| evalsha[i..].split(',').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    println!(
        "{n} joins in {} script calls ({:.1} joins per call), {:.1} us of Redis time per join",
        field("calls="),
        n as f64 / field("calls="),
        field("usec=") / n as f64
    );
    // Every command Redis ran (the scripts' inner commands included), per join.
    let mut by_cmd: Vec<(String, u64)> = stats
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            let usec = rest.split("usec=").nth(1)?.split(',').next()?;
            Some((
                format!("{name} ({usec} us)"),
                rest.split(',').next()?.parse().ok()?,
            ))
        })
        .collect();
    by_cmd.sort_by_key(|(_, c)| std::cmp::Reverse(*c));
    let total: u64 = by_cmd.iter().map(|(_, c)| c).sum();
    let each: Vec<String> = by_cmd
        .iter()
        .map(|(name, c)| format!("{name} {:.2}", *c as f64 / n as f64))
        .collect();
    println!(
        "{:.2} Redis commands per join: {}",
        total as f64 / n as f64,
        each.join(", ")
    );
    let places = store.get_event("mem", T0).await.unwrap().figures.waiting;
    assert_eq!(places, n);
    println!(
        "{n} waiting places{}: {:.0} bytes each (used_memory {before} -> {after})",
        if with_user {
            " with a 17-byte user id"
        } else {
            ""
        },
        (after - before) as f64 / n as f64
    );
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8(out.stdout).unwrap()
    };
    let mut keys: Vec<String> = cli(&["--scan", "--pattern", &format!("{prefix}:*")])
        .lines()
        .map(str::to_string)
        .collect();
    keys.sort();
    // The per-place chunks (`p:<c>`, `q:<c>`, `ws:<c>`) summed by family, with their
    // encodings.
    let mut families: std::collections::BTreeMap<String, (u64, u64, BTreeSet<String>)> =
        Default::default();
    for key in keys {
        let bytes: u64 = cli(&["MEMORY", "USAGE", &key, "SAMPLES", "0"])
            .trim()
            .parse()
            .unwrap_or(0);
        let encoding = cli(&["OBJECT", "ENCODING", &key]);
        let family = match key.rsplit_once(':') {
            Some((head, c)) if c.chars().all(|d| d.is_ascii_digit()) => format!("{head}:<c>"),
            _ => key.clone(),
        };
        let f = families.entry(family).or_default();
        f.0 += bytes;
        f.1 += 1;
        f.2.insert(encoding.trim().to_string());
    }
    for (family, (bytes, count, encodings)) in families {
        println!(
            "  {family:<40} {count:>6} keys {bytes:>10} bytes  {:>7.1} per place  {}",
            bytes as f64 / n as f64,
            encodings.into_iter().collect::<Vec<_>>().join(",")
        );
    }
}

/// A batch of joins reads back nothing it wrote: not the place records (for the answers and
/// the change log), not the invite flag per join, and it lowers a chunk's heartbeat index
/// entry once per batch (docs/PERFORMANCE.md, "Fewer commands per join"). The answers are
/// those of places read from Redis: waiting, at positions 1..=48 in seq order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_joins_reads_back_nothing_it_wrote() {
    let server = RedisServer::start();
    let store = paused_event(&server, "r").await;
    support::redis::raw_command(server.port, "CONFIG RESETSTAT").unwrap();
    let reqs: Vec<JoinRequest> = (0..48).map(|_| anonymous()).collect();
    let mut views: Vec<_> = join_all(reqs.iter().map(|r| store.join("r", r, T0)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let stats = server.info("commandstats");
    let calls = |cmd: &str| {
        let k = format!("cmdstat_{cmd}:calls=");
        stats.find(&k).map_or(0, |i| {
            let rest = &stats[i + k.len()..];
            rest[..rest.find(',').unwrap()].parse::<u64>().unwrap()
        })
    };
    let scripts = script_calls(&server);
    assert!(
        scripts <= 24,
        "{scripts} scripts for 48 joins sent together"
    );
    // Per script: the meta and the invite flag; per join: nothing.
    assert!(
        calls("hget") <= 2 * scripts,
        "{} HGETs in {scripts} scripts for 48 joins",
        calls("hget")
    );
    // Per chunk a script's joins go to: one ZADD for the line, one for the heartbeats, one
    // for the index entry; per join: nothing. Seqs 1..=48 cross one chunk's end (chunks of
    // 32), so the scripts together go to at most `scripts + 1` chunks: the bound holds
    // however the joins fell into scripts. (A script's first join into a chunk, or its
    // passing the tail chunk, must not send that chunk's appends apart from the rest: one
    // script of 48 joins made 10 ZADDs, two of 1 and 47 made 13.)
    let chunks = scripts + 1;
    assert!(
        calls("zadd") <= 3 * chunks,
        "{} ZADDs in {scripts} scripts for 48 joins",
        calls("zadd")
    );
    // One HSET of the records per chunk, one of the meta per script; one change-log entry.
    assert!(
        calls("hset") <= chunks + scripts,
        "{} HSETs in {scripts} scripts for 48 joins",
        calls("hset")
    );
    assert!(
        calls("xadd") <= scripts,
        "{} XADDs in {scripts} scripts for 48 joins",
        calls("xadd")
    );
    views.sort_by_key(|v| v.key.seq);
    for (i, v) in views.iter().enumerate() {
        assert_eq!(v.status, PlaceState::Waiting);
        assert_eq!(v.position, Some(i as u64 + 1));
    }
}

/// An event made before the chunks shrank (layout 1: 128 seqs a chunk) keeps its chunk
/// size: its places are written and read where that layout puts them, positions stay
/// exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_of_the_earlier_chunk_size_keeps_it() {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let store = node(&server.url(), &prefix);
    make_event(
        &store,
        "old",
        serde_json::json!({"max_active": 1, "paused": true}),
    )
    .await;
    // Made a layout-1 event: `lay` is the eighth number from the end of the meta's
    // MessagePack array (a one-byte integer; the last seven are `opened`, `prelast`, `seen`,
    // `wfloor`, `rkb`, `rkept` and `rfloor`, 0 without an opening, an end or a lowered
    // timeout: one byte each too).
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = |suffix: &str| format!("{prefix}:{{old}}:{suffix}");
    let mut n: Vec<u8> = redis::cmd("HGET")
        .arg(key("m"))
        .arg("n")
        .query_async(&mut conn)
        .await
        .unwrap();
    let lay = n.len() - 8;
    assert_eq!(
        n[lay..],
        [3, 0, 0, 0, 0, 0, 0, 0],
        "the layout, then no opening reached, no pre-queue join, no end seen, no floors"
    );
    n[lay] = 1;
    redis::cmd("HSET")
        .arg(key("m"))
        .arg("n")
        .arg(n)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let reqs: Vec<JoinRequest> = (0..300).map(|_| anonymous()).collect();
    let mut views: Vec<_> = join_all(reqs.iter().map(|r| store.join("old", r, T0)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    views.sort_by_key(|v| v.key.seq);
    // Seqs 1..=300 in chunks of 128: 0, 1 and 2, for each of the records, the line and
    // the heartbeats.
    for suffix in ["p", "q", "ws"] {
        for c in 0..4 {
            let n: u64 = redis::cmd("EXISTS")
                .arg(key(&format!("{suffix}:{c}")))
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(n, u64::from(c < 3), "{suffix}:{c}");
        }
    }
    // Leaving the first 130 (across a chunk's end), the rest move up exactly.
    for v in &views[..130] {
        assert!(store.leave("old", v.key, T0 + 1).await.unwrap());
    }
    for (i, v) in views[130..].iter().enumerate().step_by(17) {
        let s = store.status("old", v.key, T0 + 2).await.unwrap();
        assert_eq!(s.position, Some(i as u64 + 1), "seq {}", v.key.seq);
        assert_eq!(s.queue_length, 170);
    }
}

/// Makes `id` an event of `layout` in the meta (its eighth number from the end, a one-byte
/// integer; the last seven are `opened`, `prelast`, `seen`, `wfloor`, `rkb`, `rkept` and
/// `rfloor`, 0 for an event without an opening, an end or a lowered timeout).
async fn set_layout(server: &RedisServer, prefix: &str, id: &str, layout: u8) {
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = format!("{prefix}:{{{id}}}:m");
    let mut n: Vec<u8> = redis::cmd("HGET")
        .arg(&key)
        .arg("n")
        .query_async(&mut conn)
        .await
        .unwrap();
    let lay = n.len() - 8;
    assert_eq!(
        n[lay + 1..],
        [0, 0, 0, 0, 0, 0, 0],
        "no opening reached, no pre-queue join, no end seen, no floors"
    );
    n[lay] = layout;
    redis::cmd("HSET")
        .arg(&key)
        .arg("n")
        .arg(n)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
}

/// A new event's line is a LIST of seqs per chunk (layout 3: a join appends), an event of
/// layout 2 keeps its ZSET chunks, and both answer the same through everything that reads
/// or changes the line: joins in batches, leaves across a chunk's end, positions, the
/// head, admissions, the end of the sale and `clear`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_is_a_list_per_chunk_and_layout_2_keeps_its_zsets() {
    use waitroom::core::schedule::format_rfc3339;
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let store = node(&server.url(), &prefix);
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut seen = Vec::new();
    for (ev, layout, kind) in [("new", 3, "list"), ("old", 2, "zset")] {
        make_event(
            &store,
            ev,
            serde_json::json!({"max_active": 5, "paused": true}),
        )
        .await;
        if layout != 3 {
            set_layout(&server, &prefix, ev, layout).await;
        }
        let reqs: Vec<JoinRequest> = (0..100).map(|_| anonymous()).collect();
        let mut views: Vec<_> = join_all(reqs.iter().map(|r| store.join(ev, r, T0)))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        views.sort_by_key(|v| v.key.seq);
        // Seqs 1..=100 in chunks of 32: 0 to 3.
        for c in 0..4 {
            let t: String = redis::cmd("TYPE")
                .arg(format!("{prefix}:{{{ev}}}:q:{c}"))
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(t, kind, "{ev}: q:{c}");
        }
        let mut out = Vec::new();
        // Leaving seqs 20..=45 (across chunk 0's end): the rest move up exactly.
        for v in &views[19..45] {
            assert!(store.leave(ev, v.key, T0 + 1).await.unwrap());
        }
        let left: Vec<_> = views[..19].iter().chain(&views[45..]).collect();
        for (i, v) in left.iter().enumerate() {
            let s = store.status(ev, v.key, T0 + 2).await.unwrap();
            assert_eq!(s.position, Some(i as u64 + 1), "{ev}: seq {}", v.key.seq);
            assert_eq!(s.queue_length, 74);
        }
        let head = store.queue_head(ev, 25, T0 + 2).await.unwrap();
        out.push(format!("{head:?}"));
        // Admissions take the first five in order.
        let patch: EventPatch =
            serde_json::from_value(serde_json::json!({"paused": false})).unwrap();
        store.put_event(ev, &patch, T0 + 3).await.unwrap();
        for (i, v) in left.iter().enumerate() {
            let s = store.status(ev, v.key, T0 + 4).await.unwrap();
            if i < 5 {
                assert_eq!(s.status, PlaceState::Admitted, "{ev}: seq {}", v.key.seq);
            } else {
                assert_eq!(s.position, Some(i as u64 - 4), "{ev}: seq {}", v.key.seq);
            }
            out.push(format!(
                "{:?} {:?} {}",
                s.status, s.position, s.queue_length
            ));
        }
        // The end of the sale drops the line from its head; then `clear` finds it empty.
        let patch: EventPatch =
            serde_json::from_value(serde_json::json!({"closes_at": format_rfc3339(T0 + 10)}))
                .unwrap();
        store.put_event(ev, &patch, T0 + 5).await.unwrap();
        store.tick(ev, T0 + 11).await.unwrap();
        for v in &left[5..] {
            let e = store.status(ev, v.key, T0 + 12).await.unwrap_err();
            out.push(format!("{e:?}"));
        }
        assert_eq!(store.clear(ev, T0 + 12).await.unwrap(), 0, "{ev}");
        for c in 0..4 {
            let n: u64 = redis::cmd("EXISTS")
                .arg(format!("{prefix}:{{{ev}}}:q:{c}"))
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(n, 0, "{ev}: q:{c} after the end of the sale");
        }
        seen.push(out);
    }
    assert_eq!(seen[0], seen[1]);
}

/// User joins sent together keep the one-command-per-chunk writes: the user index is read
/// from the batch's own waiting writes first and written with them (through separate
/// commands, each user join sent every chunk's appends: about two ZADDs per join). A user
/// who joins twice in one batch still gets one place: the second join sees the first's
/// waiting write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_user_joins_writes_each_chunk_once() {
    let server = RedisServer::start();
    let store = paused_event(&server, "u").await;
    support::redis::raw_command(server.port, "CONFIG RESETSTAT").unwrap();
    // 47 users, the 25th twice (in the middle of a batch whichever way they fall).
    let mut reqs: Vec<JoinRequest> = (0..47).map(|i| user(&format!("u{i}"), false)).collect();
    reqs.insert(30, user("u24", false));
    let answers = join_all(reqs.iter().map(|r| store.join("u", r, T0))).await;
    let stats = server.info("commandstats");
    let calls = |cmd: &str| {
        let k = format!("cmdstat_{cmd}:calls=");
        stats.find(&k).map_or(0, |i| {
            let rest = &stats[i + k.len()..];
            rest[..rest.find(',').unwrap()].parse::<u64>().unwrap()
        })
    };
    let scripts = script_calls(&server);
    let mut views = Vec::new();
    let mut twice = Vec::new();
    for (r, a) in reqs.iter().zip(answers) {
        if r.user_id.as_deref() == Some("u24") {
            twice.push(a);
        } else {
            views.push(a.unwrap());
        }
    }
    let (ok, refused): (Vec<_>, Vec<_>) = twice.into_iter().partition(Result::is_ok);
    assert_eq!((ok.len(), refused.len()), (1, 1), "one place for u24");
    assert_eq!(
        queue_error(refused.into_iter().next().unwrap()),
        QueueError::AlreadyJoined
    );
    views.push(ok.into_iter().next().unwrap().unwrap());
    views.sort_by_key(|v| v.key.seq);
    for (i, v) in views.iter().enumerate() {
        assert_eq!(v.position, Some(i as u64 + 1));
    }
    assert!(
        scripts <= 24,
        "{scripts} scripts for 48 joins sent together"
    );
    // As for anonymous joins: per chunk (seqs 1..=47, at most scripts + 1 of them) the
    // line, the heartbeats, the index entry.
    let chunks = scripts + 1;
    assert!(
        calls("zadd") <= 3 * chunks,
        "{} ZADDs in {scripts} scripts for 48 user joins",
        calls("zadd")
    );
    // The records per chunk; per script the meta and the user index.
    assert!(
        calls("hset") <= chunks + 2 * scripts,
        "{} HSETs in {scripts} scripts for 48 user joins",
        calls("hset")
    );
}

/// A fresh join's answer is short (batch.rs `expand`, rules.lua `finish_join`): Redis sends
/// its seq, the waiting count and the log version (and the context when it changed), and
/// the node rebuilds the rest of the view from the request. The views are whole and exact:
/// each join's own nonce and user, waiting, last of the line when it joined. (The whole
/// answer was some 210 bytes a join: the view's 14 values, the effect, the context.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_joins_answer_is_short_and_its_view_whole() {
    let server = RedisServer::start();
    let store = paused_event(&server, "s").await;
    let bytes_out = || {
        let info = server.info("stats");
        let line = info
            .lines()
            .find(|l| l.starts_with("total_net_output_bytes:"))
            .unwrap();
        line["total_net_output_bytes:".len()..]
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    let reqs: Vec<JoinRequest> = (0..64)
        .map(|i| match i % 4 {
            0 => user(&format!("u{i}"), true),
            1 => user(&format!("u{i}"), false),
            _ => anonymous(),
        })
        .collect();
    let before = bytes_out();
    let views: Vec<_> = join_all(reqs.iter().map(|r| store.join("s", r, T0 + 5)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let per_join = (bytes_out() - before) / 64;
    let scripts = script_calls(&server);
    assert!(
        per_join < 100,
        "{per_join} bytes of answer per join ({scripts} scripts)"
    );
    let mut seqs = BTreeSet::new();
    for (r, v) in reqs.iter().zip(&views) {
        assert_eq!(v.key.nonce, r.nonce);
        assert_eq!(v.user_id, r.user_id);
        assert_eq!(v.status, PlaceState::Waiting);
        assert_eq!(v.joined_at, T0 + 5);
        // The newest place is the last of the line: its position is the line's length.
        assert_eq!(v.position, Some(v.key.seq));
        assert_eq!(v.queue_length, v.key.seq);
        assert!(seqs.insert(v.key.seq));
        // The script's own view of it later says the same.
        let s = store.status("s", v.key, T0 + 6).await.unwrap();
        assert_eq!(
            (s.key, s.user_id.clone(), s.joined_at),
            (v.key, v.user_id.clone(), v.joined_at)
        );
        assert_eq!(s.position, v.position);
    }
    assert_eq!(seqs, (1..=64).collect());
}

/// Crowded batches against the reference: groups of joins (anonymous, users proven or not,
/// repeat users), enters and leaves, each at its own time, sent at once to Redis (one batch
/// per group, so fresh joins get short answers, flat ones when the context did not change
/// since the answer before: batch.rs `expand`) and one by one, in the same order at the same
/// times, to the embedded store. Sessions come and go, so the context (the slot-time held,
/// the live count) changes from one operation to the next within a batch; some groups are
/// paused, or joined before a pre-queue's opening, or right after a change of the settings.
/// Every answer must be the reference's, field for field.
#[tokio::test]
async fn crowded_batches_answer_like_the_embedded_store() {
    use waitroom::core::schedule::format_rfc3339;
    use waitroom::store::embedded::EmbeddedStore;
    let server = RedisServer::start();
    let red = node(&server.url(), &unique_prefix());
    let emb: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
    let ev = "crowd";
    let config = |group: u64, paused: bool, opens: Option<Millis>| {
        let mut c = serde_json::json!({
            "max_active": 2 + group % 3, "ready_ttl_sec": 2, "session_idle_sec": 3,
            "session_max_sec": 6, "waiting_idle_sec": 30, "paused": paused,
            "opens_at": opens.map(format_rfc3339),
        });
        if group % 4 == 1 {
            c["admit_per_minute"] = 120.into();
        }
        let mut p: EventPatch = serde_json::from_value(c).unwrap();
        p.fresh_secret = Some([0x5a; 32]);
        p
    };
    let mut now = T0;
    for s in [&emb, &red] {
        s.put_event(ev, &config(0, false, None), now).await.unwrap();
    }
    #[derive(Debug, Clone, Copy)]
    enum Op {
        Join(Option<u64>, bool),
        Enter(usize),
        Leave(usize),
    }
    let mut keys: Vec<PlaceKey> = Vec::new();
    let mut nonce = 0u128;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for group in 0..48u64 {
        // Now and then the settings change: paused, or a pre-queue whose opening is a
        // little ahead (the line cleared first: `opens_at` may not move a waiting place
        // into the pre-queue).
        if group % 3 == 2 {
            let opens = (group % 9 == 5).then_some(now + 2_000);
            if opens.is_some() {
                for s in [&emb, &red] {
                    s.clear(ev, now).await.unwrap();
                }
            }
            let patch = config(group, group % 5 == 2, opens);
            let a = emb
                .put_event(ev, &patch, now)
                .await
                .map_err(|e| e.to_string());
            let b = red
                .put_event(ev, &patch, now)
                .await
                .map_err(|e| e.to_string());
            assert_eq!(a, b, "group {group}: the settings");
        }
        let ops: Vec<(Op, Millis)> = (0..48)
            .map(|_| {
                now += next(3) * 40;
                let op = match next(10) {
                    0..=5 => Op::Join((next(3) == 0).then(|| next(24)), next(2) == 0),
                    6..=7 => Op::Enter(next(keys.len().max(1) as u64) as usize),
                    _ => Op::Leave(next(keys.len().max(1) as u64) as usize),
                };
                (op, now)
            })
            .collect();
        let reqs: Vec<JoinRequest> = ops
            .iter()
            .map(|(op, _)| {
                nonce += 1;
                let (user, proven) = match op {
                    Op::Join(u, p) => (*u, *p),
                    _ => (None, false),
                };
                JoinRequest {
                    user_id: user.map(|u| format!("user-{u}")),
                    proven,
                    nonce: nonce * 0x9E37_79B9_7F4A_7C15_F39C,
                    ..JoinRequest::default()
                }
            })
            .collect();
        let nobody = PlaceKey { seq: 0, nonce: 0 };
        // An operation's answer as comparable text, and the place a join holds.
        let run = |s: Arc<dyn Store>, i: usize| {
            let (op, at) = ops[i];
            let req = reqs[i].clone();
            let key = |j: usize| keys.get(j).copied().unwrap_or(nobody);
            async move {
                match op {
                    Op::Join(..) => {
                        let r = s.join(ev, &req, at).await;
                        let key = r.as_ref().ok().map(|v| v.key);
                        (format!("{r:?}"), key)
                    }
                    Op::Enter(j) => (format!("{:?}", s.enter(ev, key(j), at).await), None),
                    Op::Leave(j) => (format!("{:?}", s.leave(ev, key(j), at).await), None),
                }
            }
        };
        let mut want = Vec::new();
        for i in 0..ops.len() {
            want.push(run(emb.clone(), i).await);
        }
        let before = script_calls(&server);
        let got = join_all((0..ops.len()).map(|i| run(red.clone(), i))).await;
        let calls = script_calls(&server) - before;
        assert!(
            calls <= 3,
            "group {group}: {calls} script calls, not one batch"
        );
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            assert_eq!(a.0, b.0, "group {group}, operation {i}: {:?}", ops[i]);
        }
        for (_, key) in &got {
            if let Some(k) = key {
                if !keys.contains(k) {
                    keys.push(*k);
                }
            }
        }
        now += 300;
        for s in [&emb, &red] {
            s.tick(ev, now).await.unwrap();
        }
    }
}
