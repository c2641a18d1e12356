//! The durable embedded store: the same conformance suite and property test as the memory
//! store, plus restart and damaged-journal recovery.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use support::conformance::{join, make_event, S, T0};
use waitroom::core::QueueError;
use waitroom::core::{Millis, PlaceState};
use waitroom::store::embedded::EmbeddedStore;
use waitroom::store::fault::FaultStore;
use waitroom::store::journal::Durability;
use waitroom::store::{Store, StoreError};

/// A durable store that owns its temporary directory (removed when the last handle to the
/// store is dropped, and not before, since the store keeps writing files into it), and
/// the directory's path.
fn in_temp_dir() -> (FaultStore, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let store = EmbeddedStore::open(dir.path(), Durability::Sync, T0).unwrap();
    (FaultStore::owning(Arc::new(store), dir), path)
}

/// The durable store in `dir`, opened at `now` (a first start or a restart).
fn opened(dir: &Path, now: Millis) -> Arc<dyn Store> {
    Arc::new(EmbeddedStore::open(dir, Durability::Sync, now).unwrap())
}

/// A durable store in a fresh directory that lives as long as the store.
fn durable() -> Arc<dyn Store> {
    Arc::new(in_temp_dir().0)
}

#[tokio::test]
async fn a_test_store_removes_its_directory() {
    let (store, path) = in_temp_dir();
    make_event(
        &(Arc::new(store) as Arc<dyn Store>),
        "ev",
        serde_json::json!({}),
    )
    .await;
    assert!(!path.exists(), "{} was left behind", path.display());
}

store_conformance!(async { durable() });

#[test]
fn queue_rules_match_the_reference_model() {
    support::model::check_backend(durable, 40, 80);
}

fn qerr<T: std::fmt::Debug>(r: Result<T, StoreError>) -> QueueError {
    match r {
        Err(StoreError::Queue(q)) => q,
        other => panic!("expected a queue error, got {other:?}"),
    }
}

#[tokio::test]
async fn restart_restores_places_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c, d, e, gone, ghost);
    {
        let store = opened(dir.path(), T0);
        make_event(
            &store,
            "ev",
            serde_json::json!({"max_active": 2, "waiting_idle_sec": 30, "name": "Show"}),
        )
        .await;
        make_event(&store, "doomed", serde_json::json!({})).await;
        join(&store, "doomed", None, T0).await;
        store.delete_event("doomed").await.unwrap();
        a = join(&store, "ev", Some("a"), T0).await; // admitted
        b = join(&store, "ev", Some("b"), T0).await; // admitted, then enters
        store.enter("ev", b.key, T0 + S).await.unwrap();
        ghost = join(&store, "ev", None, T0).await;
        c = join(&store, "ev", Some("c"), T0 + 10 * S).await;
        gone = join(&store, "ev", None, T0 + 10 * S).await;
        d = join(&store, "ev", None, T0 + 10 * S).await;
        e = join(&store, "ev", Some("e"), T0 + 10 * S).await;
        store.leave("ev", gone.key, T0 + 11 * S).await.unwrap();
        // The ghost stops polling and expires at 30 s; the others keep polling.
        for k in [c.key, d.key, e.key] {
            store.heartbeat("ev", k, T0 + 25 * S).await.unwrap();
        }
        store.tick("ev", T0 + 30 * S).await.unwrap();
        store.close().await.unwrap();
    }
    let t1 = T0 + 40 * S;
    let store = opened(dir.path(), t1);
    assert_eq!(
        qerr(store.get_event("doomed", t1).await),
        QueueError::EventNotFound
    );
    let snap = store.get_event("ev", t1).await.unwrap();
    assert_eq!(snap.config.name, "Show");
    let f = snap.figures;
    assert_eq!(
        (f.waiting, f.admitted, f.active, f.left, f.expired),
        (3, 1, 1, 1, 1)
    );
    assert_eq!(
        store.peek("ev", a.key, t1).await.unwrap().status,
        PlaceState::Admitted
    );
    let sb = store.session("ev", b.key, t1).await.unwrap();
    assert_eq!(
        sb.session_ends_at,
        Some(T0 + S + 600 * S),
        "the session keeps its deadline"
    );
    for (k, pos) in [(c.key, 1), (d.key, 2), (e.key, 3)] {
        assert_eq!(store.status("ev", k, t1).await.unwrap().position, Some(pos));
    }
    assert_eq!(
        qerr(store.status("ev", ghost.key, t1).await),
        QueueError::TokenExpired
    );
    assert_eq!(
        qerr(store.status("ev", gone.key, t1).await),
        QueueError::TokenNotFound
    );
    // One place per user survives the restart.
    assert_eq!(join(&store, "ev", Some("c"), t1).await.key, c.key);
    // New places line up behind the restored ones, with fresh sequence numbers.
    let f2 = join(&store, "ev", None, t1).await;
    assert_eq!(f2.position, Some(4));
    assert!(f2.key.seq > e.key.seq);
    // Every restored place got a fresh grace period from the restart: alive at t1 + 29 s.
    // (By then a's ready window, kept from before the restart, has lapsed and c has its slot.)
    assert_eq!(
        store
            .status("ev", d.key, t1 + 29 * S)
            .await
            .unwrap()
            .position,
        Some(1)
    );
    // The admitted place kept its ready deadline (admitted at T0, 60 s): gone by then.
    assert_eq!(
        qerr(store.enter("ev", a.key, T0 + 61 * S).await),
        QueueError::TokenExpired
    );
}

/// An opening reached before a restart stays reached when the clock after it is behind
/// (a step back of the system clock): even one seen only by a read (`/queue/info`, which
/// then published the seed) of a paused sale, which changed nothing else (defect: the sale
/// closed again: the seed withdrawn, its places back in the pre-queue, new joins put
/// ahead of those who joined after the opening).
#[tokio::test]
async fn an_opening_reached_stays_reached_across_a_restart_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let opens = T0 + 100 * S;
    let (early, after);
    {
        let store = opened(dir.path(), T0);
        let settings = serde_json::json!({
            "opens_at": waitroom::core::schedule::format_rfc3339(opens),
            "paused": true, "waiting_idle_sec": 100_000,
        });
        make_event(&store, "ev", settings).await;
        early = join(&store, "ev", None, T0 + S).await;
        assert_eq!(early.opens_in_sec, Some(99));
        let snap = store.get_event("ev", opens).await.unwrap();
        assert_eq!(
            snap.config.opening_ahead(opens),
            None,
            "the seed is published"
        );
        after = join(&store, "ev", None, opens + S).await;
        store.close().await.unwrap();
    }
    let back = opens - 2 * 3600 * S;
    let store = opened(dir.path(), back);
    let snap = store.get_event("ev", back).await.unwrap();
    assert_eq!(snap.config.opening_ahead(back), None, "still published");
    let v = store.status("ev", early.key, back).await.unwrap();
    assert_eq!(v.opens_in_sec, None, "not back in the pre-queue");
    assert_eq!((v.position, v.prequeue_rank), (Some(1), Some(1)));
    let late = join(&store, "ev", None, back).await;
    assert_eq!(late.prequeue_rank, None);
    assert_eq!(
        late.position,
        Some(3),
        "behind who joined after the opening"
    );
    assert_eq!(
        store.status("ev", after.key, back).await.unwrap().position,
        Some(2)
    );
}

/// A sale found over by `closes_at` stays over across a restart whose clock is behind the
/// end (a step back): joins refused, the ended places not back (defect: the restart read the
/// clock afresh, took new joins into the ended sale and lost the end's `reason`).
#[tokio::test]
async fn a_sale_found_over_stays_over_across_a_restart_behind_its_end() {
    use waitroom::store::JoinRequest;
    let dir = tempfile::tempdir().unwrap();
    let closes = T0 + 10 * S;
    let waiting;
    {
        let store = opened(dir.path(), T0);
        let settings = serde_json::json!({
            "closes_at": waitroom::core::schedule::format_rfc3339(closes),
            "max_active": 1, "waiting_idle_sec": 100_000,
        });
        make_event(&store, "ev", settings).await;
        join(&store, "ev", None, T0 + S).await;
        waiting = join(&store, "ev", None, T0 + S).await;
        assert_eq!(waiting.position, Some(1));
        let late = store.join("ev", &JoinRequest::default(), closes + S).await;
        assert_eq!(qerr(late), QueueError::EventClosed);
        store.close().await.unwrap();
    }
    let back = closes - 5 * S;
    let store = opened(dir.path(), back);
    let snap = store.get_event("ev", back).await.unwrap();
    assert!(snap.config.sale_ended(back).is_some(), "still over");
    let again = store.join("ev", &JoinRequest::default(), back).await;
    assert_eq!(qerr(again), QueueError::EventClosed);
    assert!(store.status("ev", waiting.key, back).await.is_err());
}

/// The pre-queue's latest join is not written down: a restart finds it again from the
/// places that wait, so an opening advanced to a time at or before one of their joins is
/// still refused after it, and one after them all is taken.
#[tokio::test]
async fn the_pre_queue_latest_join_is_known_again_after_a_restart() {
    use waitroom::core::schedule::format_rfc3339;
    let dir = tempfile::tempdir().unwrap();
    let at =
        |t: u64| support::conformance::patch(serde_json::json!({"opens_at": format_rfc3339(t)}));
    {
        let store = opened(dir.path(), T0);
        let settings = serde_json::json!({
            "opens_at": format_rfc3339(T0 + 100 * S), "waiting_idle_sec": 100_000,
        });
        make_event(&store, "ev", settings).await;
        join(&store, "ev", None, T0 + 40 * S).await;
        join(&store, "ev", None, T0 + 50 * S).await;
        store.close().await.unwrap();
    }
    // The clock after the restart is 10 s behind the last join.
    let back = T0 + 40 * S;
    let store = opened(dir.path(), back);
    assert!(matches!(
        qerr(store.put_event("ev", &at(T0 + 50 * S), back).await),
        QueueError::Invalid(_)
    ));
    let c = store.put_event("ev", &at(T0 + 51 * S), back).await.unwrap();
    assert_eq!(c.opens_at, Some(T0 + 51 * S));
    assert_eq!(
        store.get_event("ev", back).await.unwrap().figures.waiting,
        2
    );
}

/// A place whose deadline passed long before anyone noticed keeps answering
/// `TOKEN_EXPIRED` for the retention counted from when it was noticed (as the memory store
/// does), and a restart does not move that moment.
#[tokio::test]
async fn expired_answers_keep_their_retention_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let retention = waitroom::core::EXPIRED_RETENTION_MS;
    let deadline = T0 + 30 * S;
    // Noticed 40 minutes after its deadline.
    let noticed = deadline + 40 * 60 * S;
    let ghost;
    {
        let store = opened(dir.path(), T0);
        let settings = serde_json::json!({"waiting_idle_sec": 30, "paused": true});
        make_event(&store, "ev", settings).await;
        ghost = join(&store, "ev", None, T0).await;
        store.tick("ev", noticed).await.unwrap();
        store.close().await.unwrap();
    }
    let store = opened(dir.path(), noticed + S);
    // Past an hour from the deadline, within an hour from the moment it was noticed.
    let later = deadline + retention + 10 * 60 * S;
    assert_eq!(
        qerr(store.status("ev", ghost.key, later).await),
        QueueError::TokenExpired
    );
    assert_eq!(
        qerr(store.status("ev", ghost.key, noticed + retention).await),
        QueueError::TokenNotFound
    );
}

#[tokio::test]
async fn relaxed_durability_survives_a_clean_close() {
    let dir = tempfile::tempdir().unwrap();
    let key;
    {
        let store: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open(dir.path(), Durability::Relaxed, T0).unwrap());
        make_event(&store, "r", serde_json::json!({"paused": true})).await;
        for _ in 0..100 {
            join(&store, "r", None, T0).await;
        }
        key = join(&store, "r", Some("last"), T0).await.key;
        store.close().await.unwrap();
    }
    let store = EmbeddedStore::open(dir.path(), Durability::Relaxed, T0).unwrap();
    assert_eq!(
        store.status("r", key, T0).await.unwrap().position,
        Some(101)
    );
}

/// A restart does not hand out a fresh burst of `admit_per_minute`: a process restarting
/// many times a second (a crash loop) admitted a second's worth at every start, nearly
/// twice the cap over a minute. `admitted_last_minute` keeps the admissions it restored.
#[tokio::test]
async fn a_restart_does_not_reset_the_admission_pace() {
    let dir = tempfile::tempdir().unwrap();
    let open = |now| opened(dir.path(), now);
    let admitted = |store: Arc<dyn Store>, now| async move {
        store.tick("ev", now).await.unwrap();
        let f = store.get_event("ev", now).await.unwrap().figures;
        (f.admissions, f.admitted_last_minute)
    };
    {
        let store = open(T0);
        make_event(
            &store,
            "ev",
            serde_json::json!({"max_active": 100, "admit_per_minute": 120}),
        )
        .await;
        for _ in 0..20 {
            join(&store, "ev", None, T0).await;
        }
        assert_eq!(admitted(store, T0).await, (2, 2), "a second's burst: 2");
    }
    // Restarts within the same second: nothing more is let in.
    for at in [T0, T0 + 100, T0 + 200] {
        assert_eq!(
            admitted(open(at), at).await,
            (2, 2),
            "restarted at +{}",
            at - T0
        );
    }
    // Later, the pace goes on from the last start: one every half second.
    assert_eq!(admitted(open(T0 + 300), T0 + 800).await.0, 3);
}

/// A store whose `version` file went missing is refused with a message that names it,
/// not fjall's "File exists" from trying to create a store over the old one.
#[tokio::test]
async fn a_store_without_its_version_file_is_refused_plainly() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = opened(dir.path(), T0);
        make_event(&store, "ev", serde_json::json!({})).await;
        join(&store, "ev", None, T0).await;
    }
    std::fs::remove_file(dir.path().join("version")).unwrap();
    let err = EmbeddedStore::open(dir.path(), Durability::Sync, T0)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("holds data") && err.contains("`version` file is missing"),
        "{err}"
    );
}

/// A store whose `lock` file was deleted by hand opens with what it held: the file holds
/// nothing (defect: the start was refused as if a file of data were missing, with the
/// advice to restore a backup).
#[tokio::test]
async fn a_store_without_its_lock_file_opens() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = opened(dir.path(), T0);
        make_event(&store, "ev", serde_json::json!({"max_active": 1})).await;
        join(&store, "ev", None, T0).await;
        join(&store, "ev", None, T0).await;
    }
    std::fs::remove_file(dir.path().join("lock")).unwrap();
    let store = opened(dir.path(), T0);
    let figures = store.get_event("ev", T0).await.unwrap().figures;
    assert_eq!(figures.waiting, 1);
    assert!(dir.path().join("lock").is_file());
}

/// A very first start stopped while the store was being created (a full disk: the
/// `version` file left empty, an empty keyspace directory, a journal of zeros) is created
/// again at the next start. It was refused for good ("InvalidVersion(None)"), even once
/// the disk had room, and with `--repair` too.
#[tokio::test]
async fn a_first_start_cut_short_starts_again() {
    for version in [Some(&b""[..]), Some(b"FJ"), None] {
        let dir = tempfile::tempdir().unwrap();
        cut_short(dir.path(), version);
        started_again(dir.path()).await;
    }
}

/// What a first start stopped by a full disk leaves (`version`: its bytes, or missing).
fn cut_short(dir: &std::path::Path, version: Option<&[u8]>) {
    std::fs::create_dir_all(dir.join("keyspaces")).unwrap();
    if let Some(bytes) = version {
        std::fs::write(dir.join("version"), bytes).unwrap();
    }
    std::fs::write(dir.join("lock"), b"").unwrap();
    std::fs::write(dir.join("0.jnl"), vec![0u8; 1 << 20]).unwrap();
}

async fn started_again(dir: &std::path::Path) {
    {
        let store = opened(dir, T0);
        make_event(&store, "ev", serde_json::json!({"paused": true})).await;
        assert_eq!(join(&store, "ev", Some("u"), T0).await.position, Some(1));
    }
    // A store like any other from then on.
    let store = opened(dir, T0);
    assert_eq!(join(&store, "ev", Some("u"), T0).await.position, Some(1));
    assert_eq!(join(&store, "ev", Some("v"), T0).await.position, Some(2));
}

/// A store that holds data under a damaged `version` file is refused with a message that
/// names the file, not fjall's "InvalidVersion", and is left as it was.
#[tokio::test]
async fn a_store_with_data_and_a_damaged_version_file_is_refused_plainly() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = opened(dir.path(), T0);
        make_event(&store, "ev", serde_json::json!({})).await;
        join(&store, "ev", None, T0).await;
    }
    let store_dir = dir.path();
    for damaged in [&b""[..], b"FJ", b"garbage"] {
        std::fs::write(store_dir.join("version"), damaged).unwrap();
        let err = EmbeddedStore::open(dir.path(), Durability::Sync, T0)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("holds data") && err.contains("`version` file is damaged"),
            "{err}"
        );
        assert!(store_dir.join("0.jnl").exists(), "nothing was removed");
    }
}

/// What a first start cut short leaves, plus anything else: refused, naming it, and
/// nothing removed. A journal with a byte that is not zero (a damaged first batch before
/// intact ones reads as "no batch"), the watermark's slot, a keyspace, a link.
#[tokio::test]
async fn remains_of_a_first_start_with_anything_else_are_refused_and_kept() {
    type Extra = fn(&std::path::Path);
    let extras: [(&str, Extra); 4] = [
        ("0.jnl", |d| {
            let mut j = vec![0u8; 1 << 20];
            j[4096] = 1;
            std::fs::write(d.join("0.jnl"), j).unwrap();
        }),
        ("durable.mark", |d| {
            std::fs::write(d.join("durable.mark"), b"\x01").unwrap()
        }),
        ("keyspaces", |d| {
            std::fs::create_dir(d.join("keyspaces").join("0")).unwrap()
        }),
        ("elsewhere", |d| {
            std::os::unix::fs::symlink("/tmp", d.join("elsewhere")).unwrap()
        }),
    ];
    for (named, extra) in extras {
        let dir = tempfile::tempdir().unwrap();
        cut_short(dir.path(), Some(b""));
        extra(dir.path());
        let listed = || {
            let mut l: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            l.sort();
            l
        };
        let before = listed();
        let err = EmbeddedStore::open(dir.path(), Durability::Sync, T0)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("holds data") && err.contains(named),
            "{named}: {err}"
        );
        assert_eq!(listed(), before, "{named}: nothing removed");
        assert!(dir.path().join("keyspaces").exists());
    }
}

fn journal(dir: &std::path::Path) -> (std::path::PathBuf, u64) {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jnl"))
        .collect();
    files.sort();
    let last = files.pop().expect("a journal file");
    let end = waitroom::store::journal::written_end(&last).unwrap();
    assert!(end > 0);
    (last, end)
}

async fn fill(dir: &std::path::Path, n: usize) -> Vec<waitroom::core::PlaceKey> {
    let store = opened(dir, T0);
    make_event(&store, "t", serde_json::json!({"paused": true})).await;
    let mut keys = Vec::new();
    for _ in 0..n {
        keys.push(join(&store, "t", None, T0).await.key);
    }
    store.close().await.unwrap();
    keys
}

/// Checks that the store opens, and that what it restored is a prefix of what was written:
/// positions 1..k for the first k places, nothing after.
async fn check_prefix(dir: &std::path::Path, keys: &[waitroom::core::PlaceKey]) -> usize {
    let store = EmbeddedStore::open(dir, Durability::Sync, T0)
        .expect("a damaged tail must not stop the start");
    let mut k = 0;
    for (i, key) in keys.iter().enumerate() {
        match store.status("t", *key, T0).await {
            Ok(v) => {
                assert_eq!(i, k, "place {i} survived after a lost one: not a prefix");
                assert_eq!(v.position, Some(i as u64 + 1));
                k += 1;
            }
            Err(StoreError::Queue(QueueError::TokenNotFound | QueueError::EventNotFound)) => {}
            Err(e) => panic!("unexpected {e}"),
        }
    }
    k
}

/// Joins `n` more places to event `t` of the store in `dir` (made by [`fill`]).
async fn more(dir: &std::path::Path, n: usize) -> Vec<waitroom::core::PlaceKey> {
    let store = opened(dir, T0);
    let mut keys = Vec::new();
    for _ in 0..n {
        keys.push(join(&store, "t", None, T0).await.key);
    }
    store.close().await.unwrap();
    keys
}

/// Opening must refuse; answers the message, which must name the journal and an offset.
fn refused(dir: &std::path::Path, journal: &std::path::Path) -> String {
    let err = match EmbeddedStore::open(dir, Durability::Sync, T0) {
        Ok(_) => panic!("a damaged journal was opened as if intact"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains(&journal.display().to_string()) && err.contains("byte offset"),
        "{err}"
    );
    err
}

/// Repairs the store in `dir`, then checks that what it holds is a prefix of `keys`.
async fn repaired_prefix(dir: &std::path::Path, keys: &[waitroom::core::PlaceKey]) -> usize {
    drop(EmbeddedStore::open_with(dir, Durability::Sync, T0, true).expect("repair opens"));
    check_prefix(dir, keys).await
}

fn flip(path: &std::path::Path, at: usize, len: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    for b in &mut bytes[at..at + len] {
        *b ^= 0x5A;
    }
    std::fs::write(path, &bytes).unwrap();
}

fn truncate(path: &std::path::Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[tokio::test]
async fn a_flip_early_in_the_journal_refuses_to_start_and_repair_counts_the_loss() {
    let dir = tempfile::tempdir().unwrap();
    let keys = fill(dir.path(), 200).await;
    let (last, _) = journal(dir.path());
    flip(&last, 100, 16);
    let err = refused(dir.path(), &last);
    // Each join was its own batch: the message counts the joins after the damage.
    let k = repaired_prefix(dir.path(), &keys).await;
    assert!(k < 10, "{k} places survived a flip at byte 100");
    assert!(
        err.contains(&format!("{} place joins", 200 - k)),
        "the loss is not counted exactly: {err}"
    );
    // Repaired for good: the next start is a normal one.
    drop(EmbeddedStore::open(dir.path(), Durability::Sync, T0).expect("repaired store opens"));
}

#[tokio::test]
async fn a_truncated_journal_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let keys = fill(dir.path(), 200).await;
    let (last, end) = journal(dir.path());
    truncate(&last, end / 2);
    let err = refused(dir.path(), &last);
    assert!(err.contains("truncated"), "{err}");
    let k = repaired_prefix(dir.path(), &keys).await;
    assert!((50..150).contains(&k), "{k} of 200 survived a cut in half");
    assert!(err.contains(&format!("{} place joins", 200 - k)), "{err}");

    // Even the last acknowledged batch is known durable: cutting into it is damage too.
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 20).await;
    let (last, end) = journal(dir.path());
    truncate(&last, end - 37);
    refused(dir.path(), &last);
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 20).await;
    let (last, end) = journal(dir.path());
    flip(&last, end as usize - 40, 40);
    refused(dir.path(), &last);
}

/// The watermark's two slots.
const MARK_SLOTS: [&str; 2] = [
    waitroom::store::watermark::MARK_FILE,
    waitroom::store::watermark::MARK_FILE_B,
];

/// A machine crash can tear the watermark's write (it has no fsync of its own), and a disk
/// can damage it: either slot unreadable leaves the other, one sync older, and the check
/// still tells a journal cut in half from a torn tail.
#[tokio::test]
async fn one_torn_watermark_slot_keeps_the_check_strict() {
    for torn in MARK_SLOTS {
        let dir = tempfile::tempdir().unwrap();
        let keys = fill(dir.path(), 200).await;
        flip(&dir.path().join(torn), 2, 8);
        let (last, end) = journal(dir.path());
        truncate(&last, end / 2);
        let err = refused(dir.path(), &last);
        assert!(err.contains("truncated"), "{torn} torn: {err}");
        let k = repaired_prefix(dir.path(), &keys).await;
        assert!((50..150).contains(&k), "{k}");
    }
}

/// A repair cuts the journal below what the watermark names; the watermark goes with it
/// (made durable at once), so a crash before the next one cannot leave a slot that makes
/// the next start see the cut as damage.
#[tokio::test]
async fn a_repair_forgets_the_watermark_it_cut_below() {
    use waitroom::store::watermark;
    let dir = tempfile::tempdir().unwrap();
    let keys = fill(dir.path(), 100).await;
    let (last, end) = journal(dir.path());
    truncate(&last, end / 2);
    let damage = watermark::check(dir.path())
        .unwrap()
        .expect("a cut in half is damage");
    watermark::repair(dir.path(), &damage).unwrap();
    for slot in MARK_SLOTS {
        assert!(
            !dir.path().join(slot).exists(),
            "{slot} outlived the repair"
        );
    }
    let k = check_prefix(dir.path(), &keys).await;
    assert!((25..75).contains(&k), "{k}");
}

#[tokio::test]
async fn without_a_watermark_intact_batches_after_the_damage_still_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let keys = fill(dir.path(), 200).await;
    for slot in MARK_SLOTS {
        std::fs::remove_file(dir.path().join(slot)).unwrap();
    }
    let (last, end) = journal(dir.path());
    flip(&last, end as usize / 2, 16);
    let err = refused(dir.path(), &last);
    assert!(err.contains("at least"), "{err}");
    let k = repaired_prefix(dir.path(), &keys).await;
    assert!((50..150).contains(&k), "{k}");
}

#[tokio::test]
async fn a_torn_tail_after_the_watermark_starts_normally() {
    // The watermark as it was after 150 places; 50 more were written but their sync was
    // never recorded (the crash came first): the end of the journal is a torn tail.
    let dir = tempfile::tempdir().unwrap();
    let mut keys = fill(dir.path(), 150).await;
    let old_marks = MARK_SLOTS.map(|slot| std::fs::read(dir.path().join(slot)).unwrap());
    keys.extend(more(dir.path(), 50).await);
    for (slot, old) in MARK_SLOTS.iter().zip(&old_marks) {
        std::fs::write(dir.path().join(slot), old).unwrap();
    }
    let (last, end) = journal(dir.path());
    truncate(&last, end - 37);
    let k = check_prefix(dir.path(), &keys).await;
    assert!((150..200).contains(&k), "{k} of 200 survived a torn tail");

    // Random garbage after the intact data is a torn write as well.
    let dir2 = tempfile::tempdir().unwrap();
    let keys2 = fill(dir2.path(), 50).await;
    let (last, end) = journal(dir2.path());
    let mut bytes = std::fs::read(&last).unwrap();
    bytes.truncate(end as usize);
    bytes.extend_from_slice(&[0xA7; 100]);
    std::fs::write(&last, &bytes).unwrap();
    assert_eq!(check_prefix(dir2.path(), &keys2).await, 50);
}

/// Invite codes and whom they seat survive a restart; a deleted event's codes do not come
/// back with a new event of the same id.
#[tokio::test]
async fn restart_keeps_invites_and_their_bindings() {
    use waitroom::store::JoinRequest;
    let dir = tempfile::tempdir().unwrap();
    let open = |t| opened(dir.path(), t);
    let with = |user: &str, code: &str| JoinRequest {
        user_id: Some(user.into()),
        invite: Some(code.into()),
        nonce: waitroom::tokens::random_u128(),
        ..JoinRequest::default()
    };
    let codes: Vec<String> = ["c1", "c2", "c3"].map(String::from).to_vec();
    {
        let store = open(T0);
        make_event(&store, "gone", serde_json::json!({"access": "invite"})).await;
        store.add_invites("gone", &codes, T0).await.unwrap();
        store.delete_event("gone").await.unwrap();
        make_event(&store, "ev", serde_json::json!({"access": "invite"})).await;
        store.add_invites("ev", &codes, T0).await.unwrap();
        store.join("ev", &with("a", "c1"), T0).await.unwrap();
        store.close().await.unwrap();
    }
    let store = open(T0 + S);
    let refused = |r: Result<_, StoreError>| qerr(r);
    assert_eq!(
        refused(store.join("ev", &with("b", "c1"), T0 + S).await),
        QueueError::InviteInvalid
    );
    store.join("ev", &with("b", "c2"), T0 + S).await.unwrap();
    assert_eq!(
        refused(store.join("ev", &with("z", "c9"), T0 + S).await),
        QueueError::InviteInvalid
    );
    make_event(&store, "gone", serde_json::json!({"access": "invite"})).await;
    assert_eq!(
        refused(store.join("gone", &with("a", "c3"), T0 + S).await),
        QueueError::InviteInvalid
    );
}

/// Whether a place's user was proven survives a restart: after it, a proven place is still
/// handed back to its proven user, and an unproven one is still replaced, not adopted.
#[tokio::test]
async fn restart_keeps_whether_a_place_was_proven() {
    use waitroom::store::JoinRequest;
    let dir = tempfile::tempdir().unwrap();
    let open = |t| opened(dir.path(), t);
    let as_user = |user: &str, proven: bool| JoinRequest {
        user_id: Some(user.into()),
        proven,
        nonce: waitroom::tokens::random_u128(),
        ..JoinRequest::default()
    };
    let (mine, squat) = {
        let store = open(T0);
        make_event(&store, "ev", serde_json::json!({"max_active": 1})).await;
        let first = store.join("ev", &as_user("first", true), T0).await.unwrap();
        assert_eq!(first.status, PlaceState::Admitted);
        let mine = store.join("ev", &as_user("alice", true), T0).await.unwrap();
        let squat = store.join("ev", &as_user("bob", false), T0).await.unwrap();
        store.close().await.unwrap();
        (mine, squat)
    };
    let store = open(T0 + S);
    let again = store.join("ev", &as_user("alice", true), T0 + S).await;
    assert_eq!(again.unwrap().key, mine.key);
    let bob = store.join("ev", &as_user("bob", true), T0 + S).await;
    assert_ne!(bob.unwrap().key, squat.key, "an unproven place was adopted");
}

#[cfg(unix)]
#[tokio::test]
async fn the_store_directory_and_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    std::fs::create_dir(&store_dir).unwrap();
    std::fs::set_permissions(&store_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    fill(&store_dir, 10).await;
    // Opened again: whatever fjall created with the default umask is narrowed on open.
    drop(EmbeddedStore::open(&store_dir, Durability::Sync, T0).unwrap());
    let seen = support::private::assert_private_tree(&store_dir);
    assert!(seen >= 3, "only {seen} files checked");
}

/// An event's look (stored in the journal's JSON settings) is read back after a restart.
#[tokio::test]
async fn restart_keeps_the_event_look() {
    let dir = tempfile::tempdir().unwrap();
    let open = |t| opened(dir.path(), t);
    let before = {
        let store = open(T0);
        make_event(
            &store,
            "ev",
            serde_json::json!({"title": {"ko": "봄", "en": "Spring"}, "theme_color": "#123abc",
                               "logo_url": "/branding/logo.svg", "note": {"en": "a\nb"}}),
        )
        .await;
        let c = store.get_event("ev", T0).await.unwrap().config;
        store.close().await.unwrap();
        c
    };
    let store = open(T0 + S);
    let after = store.get_event("ev", T0 + S).await.unwrap().config;
    assert_eq!(after, before);
    assert_eq!(after.look.title.unwrap().ko.as_deref(), Some("봄"));
    assert_eq!(after.look.theme_color.as_deref(), Some("#123abc"));
}

/// Holds, sales and extensions are state like places: a restart finds each as it was
/// acknowledged, and a deleted event's inventory does not come back.
#[tokio::test]
async fn holds_sales_and_extensions_survive_a_restart() {
    use waitroom::core::ItemState;
    let dir = tempfile::tempdir().unwrap();
    let seats: Vec<String> = (1..=4).map(|i| format!("A-{i}")).collect();
    let (a, b);
    {
        let store = opened(dir.path(), T0);
        let settings = serde_json::json!({"max_active": 3, "session_max_sec": 100,
            "session_idle_sec": 1000, "session_extend_sec": 50, "max_extensions": 1});
        make_event(&store, "ev", settings.clone()).await;
        make_event(&store, "gone", settings).await;
        store.put_inventory("ev", &seats, T0).await.unwrap();
        store.put_inventory("gone", &seats, T0).await.unwrap();
        a = join(&store, "ev", None, T0).await;
        b = join(&store, "ev", None, T0).await;
        for k in [a.key, b.key] {
            store.enter("ev", k, T0).await.unwrap();
        }
        store.hold("ev", a.key, &seats[..2], T0 + S).await.unwrap();
        store.hold("ev", b.key, &seats[2..3], T0 + S).await.unwrap();
        store.complete("ev", b.key, T0 + 2 * S).await.unwrap();
        store.extend("ev", a.key, T0 + 3 * S).await.unwrap();
        store.delete_event("gone").await.unwrap();
        store.close().await.unwrap();
    }
    let store = opened(dir.path(), T0 + 4 * S);
    let view = store.inventory("ev", T0 + 4 * S).await.unwrap();
    let held = ItemState::Held {
        seq: a.key.seq,
        until: T0 + S + 300 * S,
    };
    let states: Vec<ItemState> = view.items.iter().map(|(_, s)| *s).collect();
    assert_eq!(
        states,
        [
            held,
            held,
            ItemState::Sold { seq: b.key.seq },
            ItemState::Available
        ]
    );
    assert_eq!((view.counts.held, view.counts.sold), (2, 1));
    // The extension holds: the session ends at 100 + 50 s, and cannot be extended again.
    let v = store.session("ev", a.key, T0 + 120 * S).await.unwrap();
    assert_eq!(v.session_ends_at, Some(T0 + 150 * S));
    assert_eq!(
        qerr(store.extend("ev", a.key, T0 + 120 * S).await),
        QueueError::ExtensionLimit
    );
    make_event(&store, "gone", serde_json::json!({})).await;
    assert_eq!(store.inventory("gone", T0).await.unwrap().counts.total, 0);
}

/// The pre-queue, its secret and its shuffle survive a restart: after it the opening
/// admits in the order the seed decided before it, and the seed is the same one.
#[tokio::test]
async fn restart_keeps_the_prequeue_and_its_order() {
    use waitroom::core::schedule::{format_rfc3339, prequeue_key};
    let dir = tempfile::tempdir().unwrap();
    let opens = T0 + 100 * S;
    let (seqs, secret);
    {
        let store = opened(dir.path(), T0);
        make_event(
            &store,
            "ev",
            serde_json::json!({"max_active": 8, "waiting_idle_sec": 1000,
                "opens_at": format_rfc3339(opens)}),
        )
        .await;
        let mut s = Vec::new();
        for i in 0..8 {
            s.push(join(&store, "ev", None, T0 + i * S).await.key.seq);
        }
        seqs = s;
        secret = store.get_event("ev", T0).await.unwrap().config.event_secret;
        store.close().await.unwrap();
    }
    let t1 = T0 + 50 * S;
    let store = opened(dir.path(), t1);
    let snap = store.get_event("ev", t1).await.unwrap();
    assert_eq!(snap.config.event_secret, secret, "the same secret");
    assert_eq!(store.prequeue("ev", 0, 100, t1).await.unwrap(), seqs);
    let mut notices = store.subscribe();
    store.tick("ev", opens).await.unwrap();
    let mut admitted = Vec::new();
    while let Ok(n) = notices.try_recv() {
        if let waitroom::store::Notice::Admitted { seq, .. } = n {
            admitted.push(seq);
        }
    }
    let seed = secret.expect("a secret").shuffle_seed();
    let mut order = seqs.clone();
    order.sort_by_key(|&s| prequeue_key(&seed, s));
    assert_eq!(admitted, order);
}

/// The end of a sale and the announcement are kept with the event's settings, so a restart
/// keeps them: joins stay refused, places ended with the sale stay gone, the announcement
/// is still there.
#[tokio::test]
async fn restart_keeps_the_end_of_the_sale_and_the_announcement() {
    use waitroom::core::{Announcement, EndCause, EventPatch, Texts};
    let dir = tempfile::tempdir().unwrap();
    let open = |t| opened(dir.path(), t);
    let (admitted, waiting) = {
        let store = open(T0);
        make_event(&store, "ev", serde_json::json!({"max_active": 1})).await;
        let a = join(&store, "ev", None, T0).await;
        let w = join(&store, "ev", None, T0).await;
        let post = EventPatch {
            announcement: Some(Some(Announcement {
                message: Texts {
                    ko: Some("안내".into()),
                    en: Some("Notice".into()),
                },
                at: T0,
            })),
            ..EventPatch::default()
        };
        store.update_event("ev", &post, T0).await.unwrap();
        support::conformance::end_sale(&store, "ev", EndCause::Cancelled, T0 + S).await;
        store.close().await.unwrap();
        (a, w)
    };
    let store = open(T0 + 2 * S);
    let c = store.get_event("ev", T0 + 2 * S).await.unwrap().config;
    assert_eq!(
        c.ended.map(|e| (e.reason, e.at)),
        Some((EndCause::Cancelled, T0 + S))
    );
    assert_eq!(c.announcement.map(|a| a.at), Some(T0));
    assert_eq!(
        qerr(store.join("ev", &Default::default(), T0 + 2 * S).await),
        QueueError::EventClosed
    );
    assert_eq!(
        qerr(store.status("ev", waiting.key, T0 + 2 * S).await),
        QueueError::TokenNotFound
    );
    assert_eq!(
        store
            .enter("ev", admitted.key, T0 + 2 * S)
            .await
            .unwrap()
            .status,
        PlaceState::Active
    );
}

/// The active journal's blocks ahead of its appends are allocated (written zeros, not
/// fjall's sparse preallocation), so a sync overwrites allocated blocks and needs no
/// file-system metadata commit; and what was written still reads back whole.
#[cfg(unix)]
#[tokio::test]
async fn the_journal_is_allocated_ahead_of_its_appends() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let keys = fill(dir.path(), 40).await;
    let (path, end) = journal(dir.path());
    let allocated = std::fs::metadata(&path).unwrap().blocks() * 512;
    assert!(
        allocated >= end + 4 * 1024 * 1024,
        "{allocated} bytes allocated for {end} bytes written"
    );
    assert_eq!(check_prefix(dir.path(), &keys).await, keys.len());
}

/// The nice value of every thread of this process named `name`.
fn nice_of_threads(name: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // ended meanwhile
        };
        let close = stat.rfind(')').unwrap();
        if &stat[stat.find('(').unwrap() + 1..close] != name {
            continue;
        }
        // Fields after the name start at stat(5)'s third, the state; nice is the 19th.
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        out.push(fields[16].parse().unwrap());
    }
    out
}

/// fjall's flushes and compactions run below the requests' priority, so that on two cores
/// a flush does not take the CPU from requests (docs/PERFORMANCE.md, "What stalls joins at
/// 10,000/s"); the threads that open the store and serve keep theirs. Every store of this
/// test binary is opened through `EmbeddedStore::open`, so every fjall worker must be lowered.
#[test]
fn the_stores_background_threads_run_at_a_lower_priority() {
    let (_store, _dir) = in_temp_dir();
    // fjall's workers name themselves once they run: wait for them.
    let mut workers = Vec::new();
    for _ in 0..2000 {
        workers = nice_of_threads("fjall:worker");
        if !workers.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(!workers.is_empty(), "no fjall worker thread found");
    assert!(
        workers.iter().all(|&n| n == 10),
        "fjall's workers run at nice {workers:?}, expected 10"
    );
    // SAFETY: a plain system call. (-1 is a valid answer: errno is not needed here.)
    let own = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    assert_eq!(own, 0, "the thread that opened the store was lowered");
}
