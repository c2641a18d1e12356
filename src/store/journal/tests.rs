//! The journal's own tests: an event's two records, and the rewrite of older ones.

use super::*;

fn joined(seq: u64) -> Effect {
    Effect::Joined {
        seq,
        nonce: seq as u128,
        user_id: None,
        proven: false,
        metadata: None,
        at: 1,
    }
}

/// Bytes written to the store's journals so far (past their zeros ahead).
fn journal_bytes(dir: &Path) -> u64 {
    watermark::journals(dir)
        .values()
        .map(|p| written_end(p).unwrap())
        .sum()
}

/// Joins into an event with ~2 KB of settings, one change a batch as `relaxed` writes
/// them at a moderate rate: the settings are written once, not with every batch. Before
/// the counters had a record of their own, each batch wrote them all again (~4 MB here).
#[tokio::test]
async fn a_batch_writes_its_events_counters_not_its_settings() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(dir.path(), Durability::Sync, 0).unwrap();
    let id: Arc<str> = "concert".into();
    let config = EventConfig {
        name: "n".repeat(2000),
        ..EventConfig::default()
    };
    let t = journal
        .record(&id, Vec::new(), QueueMeta::default(), Some(config.clone()))
        .unwrap();
    journal.wait(t).await.unwrap();
    let before = journal_bytes(dir.path());
    let mut meta = QueueMeta::default();
    for seq in 1..=2000 {
        meta.next_seq = seq + 1;
        meta.joins = seq;
        let t = journal
            .record(&id, vec![joined(seq)], meta.clone(), None)
            .unwrap();
        journal.wait(t).await.unwrap();
    }
    let per_batch = (journal_bytes(dir.path()) - before) / 2000;
    assert!(
        per_batch < 200,
        "{per_batch} journal bytes per one-join batch"
    );
    drop(journal);
    let (_, recovered) = Journal::open(dir.path(), Durability::Sync, 0).unwrap();
    let (rid, q) = &recovered.events[0];
    assert_eq!(rid, "concert");
    assert_eq!(q.config(), &config, "the settings written once read back");
    assert_eq!(q.meta().joins, 2000, "the latest counters read back");
    assert_eq!(recovered.places, 2000);
}

/// A store whose event record holds its counters (as versions before wrote it) opens
/// with those counters, and is rewritten at open: afterwards the record is a settings
/// record (which an older version refuses to read) and the counters have their own.
/// Later changes then read back from the counters' record.
#[tokio::test]
async fn a_record_with_its_counters_is_rewritten_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let id: Arc<str> = "arena".into();
    let config = EventConfig {
        name: "Arena".into(),
        max_active: 7,
        ..EventConfig::default()
    };
    let meta = QueueMeta {
        next_seq: 11,
        joins: 10,
        ..QueueMeta::default()
    };
    {
        let (journal, _) = Journal::open(dir.path(), Durability::Sync, 0).unwrap();
        drop(journal);
        // The record as the version before wrote it, put there under the journal.
        let db = Database::builder(dir.path()).open().unwrap();
        let events = db
            .keyspace("events", KeyspaceCreateOptions::default)
            .unwrap();
        let old = super::super::journal_events::encode_settings_and_counters(
            &config_json(&config),
            &meta,
        );
        events.insert(id.as_bytes(), old).unwrap();
        db.persist(PersistMode::SyncAll).unwrap();
    }
    let (journal, recovered) = Journal::open(dir.path(), Durability::Sync, 0).unwrap();
    assert_eq!(recovered.events[0].1.meta(), meta);
    assert_eq!(recovered.events[0].1.config(), &config);
    let raw = journal
        .db
        .keyspace("events", KeyspaceCreateOptions::default)
        .unwrap();
    let rec = SettingsRec::decode(&raw.get(id.as_bytes()).unwrap().unwrap()).unwrap();
    assert!(
        rec.counters.is_none(),
        "the record was rewritten without its counters"
    );
    let counters = journal
        .db
        .keyspace("counters", KeyspaceCreateOptions::default)
        .unwrap();
    let stored = decode_counters(&counters.get(id.as_bytes()).unwrap().unwrap()).unwrap();
    assert_eq!(stored, meta);
    let later = QueueMeta {
        next_seq: 12,
        joins: 11,
        ..meta
    };
    let t = journal
        .record(&id, vec![joined(11)], later.clone(), None)
        .unwrap();
    journal.wait(t).await.unwrap();
    drop((journal, raw, counters));
    let (_, recovered) = Journal::open(dir.path(), Durability::Sync, 0).unwrap();
    assert_eq!(recovered.events[0].1.meta(), later);
}

/// Changes queued together (one batch, or as the writer takes them): settings set by a
/// change are written though a later change of the batch carries counters only, and an
/// event deleted and created again comes back with its new settings and counters.
#[tokio::test]
async fn changes_queued_together_keep_settings_and_counters() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(dir.path(), Durability::Sync, 0).unwrap();
    let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
    let named = |n: &str| EventConfig {
        name: n.into(),
        ..EventConfig::default()
    };
    let meta = |joins: u64| QueueMeta {
        next_seq: joins + 1,
        joins,
        ..QueueMeta::default()
    };
    // Queued without waiting in between, so that the writer takes several at once.
    journal
        .record(&a, vec![], meta(0), Some(named("A1")))
        .unwrap();
    journal.record(&a, vec![joined(1)], meta(1), None).unwrap();
    journal
        .record(&b, vec![], meta(0), Some(named("B1")))
        .unwrap();
    journal.delete(&b).unwrap();
    journal
        .record(&b, vec![], meta(0), Some(named("B2")))
        .unwrap();
    journal.record(&b, vec![joined(1)], meta(1), None).unwrap();
    let last = journal.record(&b, vec![joined(2)], meta(2), None).unwrap();
    journal.wait(last).await.unwrap();
    drop(journal);
    let (_, recovered) = Journal::open(dir.path(), Durability::Sync, 0).unwrap();
    let got: Vec<(&str, &str, u64)> = recovered
        .events
        .iter()
        .map(|(id, q)| (id.as_str(), q.config().name.as_str(), q.meta().joins))
        .collect();
    assert_eq!(got, [("a", "A1", 1), ("b", "B2", 2)]);
}

/// Settings whose counters are gone (as a repair's cut can leave them): the event opens
/// with its places, and a join after gets a seq past theirs.
#[tokio::test]
async fn settings_without_counters_open_from_the_places() {
    let dir = tempfile::tempdir().unwrap();
    let id: Arc<str> = "solo".into();
    {
        let (journal, _) = Journal::open(dir.path(), Durability::Sync, 0).unwrap();
        let meta = QueueMeta {
            next_seq: 4,
            joins: 3,
            ..QueueMeta::default()
        };
        let effects = (1..=3).map(joined).collect();
        let t = journal
            .record(&id, effects, meta, Some(EventConfig::default()))
            .unwrap();
        journal.wait(t).await.unwrap();
        let counters = journal
            .db
            .keyspace("counters", KeyspaceCreateOptions::default)
            .unwrap();
        counters.remove(id.as_bytes()).unwrap();
        journal.db.persist(PersistMode::SyncAll).unwrap();
    }
    let (_, recovered) = Journal::open(dir.path(), Durability::Sync, 0).unwrap();
    assert_eq!(recovered.places, 3);
    let q = &recovered.events[0].1;
    assert_eq!(q.meta().next_seq, 4, "the next seq follows the places");
    assert_eq!(q.meta().joins, 0, "the totals start again");
}

/// A deletion removes both records.
#[tokio::test]
async fn a_deletion_removes_the_settings_and_the_counters() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(dir.path(), Durability::Sync, 0).unwrap();
    let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
    let meta = QueueMeta {
        next_seq: 2,
        joins: 1,
        ..QueueMeta::default()
    };
    for id in [&a, &b] {
        let t = journal
            .record(
                id,
                vec![joined(1)],
                meta.clone(),
                Some(EventConfig::default()),
            )
            .unwrap();
        journal.wait(t).await.unwrap();
    }
    let t = journal.delete(&a).unwrap();
    journal.wait(t).await.unwrap();
    let counters = journal
        .db
        .keyspace("counters", KeyspaceCreateOptions::default)
        .unwrap();
    assert!(counters.get(a.as_bytes()).unwrap().is_none());
    assert!(counters.get(b.as_bytes()).unwrap().is_some());
    drop((journal, counters));
    let (_, recovered) = Journal::open(dir.path(), Durability::Sync, 0).unwrap();
    let ids: Vec<&str> = recovered.events.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["b"]);
}

/// A disk that stalls during a purge: the watchdog gives the step's wait up after 3 s, and
/// the purge waits for the step again (the bound between two asks) instead of asking its
/// twenty times at once and stopping half done; once the disk is back, it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_outlasts_a_stalled_sync() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(dir.path(), Durability::Sync, 0).unwrap();
    let journal = Arc::new(journal);
    let id: Arc<str> = "gone".into();
    let meta = QueueMeta {
        next_seq: 2,
        joins: 1,
        ..QueueMeta::default()
    };
    let t = journal
        .record(&id, vec![joined(1)], meta, Some(EventConfig::default()))
        .unwrap();
    journal.wait(t).await.unwrap();
    let t = journal.delete(&id).unwrap();
    journal.wait(t).await.unwrap();
    let stall = journal.syncer.lock().stall.clone();
    let stalling = stall.stall();
    let purge = {
        let (journal, id) = (journal.clone(), id.clone());
        tokio::spawn(async move { journal.purge(id).await })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !purge.is_finished(),
        "the purge stopped while the disk stalled"
    );
    assert!(journal.purging(&id));
    drop(stalling);
    tokio::time::timeout(Duration::from_secs(30), purge)
        .await
        .expect("the purge ends once the disk is back")
        .unwrap()
        .expect("the purge finished");
    assert!(!journal.purging(&id));
}
