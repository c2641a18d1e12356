//! Unit tests of the journal scan and the watermark in `watermark.rs` (kept apart so that
//! file stays the rules).

use super::*;

/// A batch in fjall 3's journal format: `items` are (keyspace, key, value); `clear`
/// adds a cleared keyspace's entry.
fn batch(items: &[(u64, &[u8], &[u8])], clear: bool) -> Vec<u8> {
    let mut body = Vec::new();
    for (keyspace, key, value) in items {
        body.push(TAG_ITEM);
        body.extend_from_slice(&[0, 0]); // value type (insert), compression
        body.extend_from_slice(&keyspace.to_le_bytes());
        body.extend_from_slice(&(key.len() as u16).to_le_bytes());
        body.extend_from_slice(&(value.len() as u32).to_le_bytes());
        body.extend_from_slice(&(value.len() as u32).to_le_bytes());
        body.extend_from_slice(key);
        body.extend_from_slice(value);
    }
    if clear {
        body.push(TAG_CLEAR);
        body.extend_from_slice(&5u64.to_le_bytes());
    }
    let mut b = vec![TAG_START];
    b.extend_from_slice(&(items.len() as u32 + clear as u32).to_le_bytes());
    b.extend_from_slice(&42u64.to_le_bytes());
    b.extend_from_slice(&body);
    b.push(TAG_END);
    b.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&body).to_le_bytes());
    b.extend_from_slice(MAGIC);
    b
}

/// Scans `bytes` as a journal file twice: with a new buffer, and with one left full of
/// another scan's bytes (as the active journal's kept buffer is): the same answer.
fn scan_bytes(bytes: &[u8], chunk: usize) -> FileMark {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("1.jnl");
    std::fs::write(&path, bytes).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let fresh = scan_file(&f, 0, bytes.len() as u64, &mut Vec::new(), chunk);
    let mut stale = [bytes, bytes].concat();
    stale.resize(stale.len() + 70_000, TAG_START);
    let kept = scan_file(&f, 0, bytes.len() as u64, &mut stale, chunk);
    assert_eq!(fresh, kept);
    fresh
}

#[test]
fn batches_read_alike_whatever_the_reads_sizes() {
    let join_key = b"ev\x00\x00\x00\x00\x00\x00\x00\x00\x07\x00";
    let big = vec![7u8; 20_000];
    let one = batch(&[(3, join_key, b"v"), (3, b"ev\x00m", b"counters")], false);
    let two = batch(&[(0, b"names", b"x"), (4, b"k", &big)], true);
    let three = batch(&[(3, join_key, b"w")], false);
    let mut file = [one.clone(), two.clone(), three.clone()].concat();
    let intact = file.len() as u64;
    file.extend_from_slice(&[0; 3000]); // preallocated zeros
    let want = FileMark {
        len: intact,
        tally: Tally {
            batches: 3,
            records: 4,
            joins: 2,
        },
    };
    for chunk in [1, 7, 100, ACTIVE_READ, 64 * 1024] {
        assert_eq!(scan_bytes(&file, chunk), want, "chunk {chunk}");
    }
    // From a later boundary: only what follows it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("1.jnl");
    std::fs::write(&path, &file).unwrap();
    let from = one.len() as u64;
    assert_eq!(scan_from(&path, from).unwrap().len, intact);
    assert_eq!(scan_from(&path, from).unwrap().tally.batches, 2);
}

#[test]
fn a_batch_longer_than_a_read_is_parsed_in_linear_work() {
    // One batch of 1 MiB (a sync's batch after a slow sync at a high join rate), read 8
    // KiB at a time as the active journal is.
    let value = vec![7u8; 1000];
    let items: Vec<(u64, &[u8], &[u8])> = (0..1000).map(|_| (3, &b"k"[..], &value[..])).collect();
    let one = batch(&items, false);
    assert!(one.len() > 1_000_000);
    PARSED.with(|p| p.set(0));
    assert_eq!(scan_bytes(&one, ACTIVE_READ).len, one.len() as u64);
    // `scan_bytes` scans twice; each scan may parse the batch's bytes a few times over
    // (reads that double), never once per read.
    let parsed = PARSED.with(|p| p.get());
    assert!(
        parsed <= 2 * 4 * one.len(),
        "{parsed} bytes parsed for {}",
        one.len()
    );
}

#[test]
fn a_torn_or_damaged_batch_ends_the_intact_part() {
    let one = batch(&[(3, b"a", b"1")], false);
    let two = batch(&[(3, b"b", b"2")], false);
    let whole = [one.clone(), two.clone()].concat();
    for chunk in [1, 5, 64 * 1024] {
        // Torn anywhere inside the second batch: the first one stands.
        for cut in one.len()..whole.len() {
            assert_eq!(scan_bytes(&whole[..cut], chunk).len, one.len() as u64);
        }
        // A flipped byte in the second batch's items: its checksum fails.
        let mut flipped = whole.clone();
        let at = one.len() + HEAD_LEN + ITEM_LEN;
        flipped[at] ^= 1;
        assert_eq!(scan_bytes(&flipped, chunk).len, one.len() as u64);
        // A damaged length past the file's end: the end of the intact part.
        let mut long = whole.clone();
        let at = one.len() + HEAD_LEN + 17;
        long[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(scan_bytes(&long, chunk).len, one.len() as u64);
        assert_eq!(scan_bytes(&whole, chunk).tally.batches, 2);
    }
}

/// Intact batches are found wherever they start after an unreadable one; the unreadable
/// batch's own whole end entry is not one of them.
#[test]
fn intact_batches_after_the_damage_are_found_anywhere() {
    let one = batch(&[(3, b"a", b"1")], false);
    let two = batch(&[(3, b"b", b"2")], false);
    let mut torn = one.clone();
    torn[HEAD_LEN..HEAD_LEN + 5].fill(0); // its first item's entry lost, its end whole
    assert_eq!(intact_batches_after(&torn), 0);
    assert!(
        !fjall_refuses(&torn),
        "fjall cuts a batch whose entry does not decode"
    );
    let mut b = torn.clone();
    b.extend_from_slice(&[9; 5]);
    b.extend_from_slice(&two);
    b.extend_from_slice(&two);
    assert_eq!(intact_batches_after(&b), 2);
    assert_eq!(intact_batches_after(&b[..b.len() - 1]), 1);
    // Whole entries and a wrong checksum, or one item fewer than counted: fjall refuses.
    let mut flipped = one.clone();
    flipped[HEAD_LEN + ITEM_LEN] ^= 1;
    assert!(fjall_refuses(&flipped));
    let mut counted = one.clone();
    counted[1] = 2;
    assert!(fjall_refuses(&counted));
    assert!(!fjall_refuses(&flipped[..flipped.len() - 1]), "cut short");
}

/// fjall deletes a flushed journal whenever it likes, so one can vanish between the
/// listing and its reading: an older one counts as removed; the newest (the one being
/// appended to) missing is still an error.
#[test]
fn a_journal_removed_after_the_listing_counts_as_removed() {
    let dir = tempfile::tempdir().unwrap();
    for id in 1..=2 {
        std::fs::write(dir.path().join(format!("{id}.jnl")), [0u8; 64]).unwrap();
    }
    let mut m = Marker::new(dir.path()).unwrap();
    assert_eq!(m.marks.keys().copied().collect::<Vec<_>>(), [1, 2]);
    std::fs::write(dir.path().join("3.jnl"), [0u8; 64]).unwrap();
    let listed = journals(dir.path());
    std::fs::remove_file(dir.path().join("1.jnl")).unwrap();
    m.read_listed(listed).unwrap();
    assert_eq!(m.marks.keys().copied().collect::<Vec<_>>(), [2, 3]);
    assert_eq!(m.active_end(), Some((3, 0)));
    let listed = journals(dir.path());
    std::fs::remove_file(dir.path().join("3.jnl")).unwrap();
    let gone = m.read_listed(listed).unwrap_err();
    assert_eq!(gone.kind(), std::io::ErrorKind::NotFound);
}

/// Writes alternate between the slots; the check reads the one reaching furthest,
/// the other when that one is torn, and none when both are; a new writer's first
/// write spares the best slot.
#[test]
fn the_watermark_alternates_between_two_slots() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("1.jnl"), [0u8; 64]).unwrap();
    let mut m = Marker::new(dir.path()).unwrap();
    let at = |len| {
        Marks::from([(
            1,
            FileMark {
                len,
                tally: Tally::default(),
            },
        )])
    };
    m.record(&at(100)).unwrap();
    m.record(&at(200)).unwrap();
    let slot = |i: usize| match read_slot(&dir.path().join(SLOTS[i])) {
        Slot::Read(marks) => marks[&1].len,
        _ => panic!("slot {i} unreadable"),
    };
    let (newest, older) = if slot(0) == 200 { (0, 1) } else { (1, 0) };
    assert_eq!((slot(newest), slot(older)), (200, 100));
    assert_eq!(read_marks(dir.path()).unwrap()[&1].len, 200);

    // A new writer (a restart) writes first where the older watermark is.
    let mut again = Marker::new(dir.path()).unwrap();
    assert_eq!(slot(newest), 200);
    again.record(&at(300)).unwrap();
    assert_eq!(slot(newest), 300);

    let tear = |i: usize| std::fs::write(dir.path().join(SLOTS[i]), [7u8; 30]).unwrap();
    tear(newest);
    assert_eq!(read_marks(dir.path()).unwrap()[&1].len, 0);
    tear(older);
    assert!(read_marks(dir.path()).is_none());
}

/// Two rotations and both sealed journals deleted between two captures: the next
/// capture follows the journal being appended to, not the deleted one it held.
#[test]
fn a_capture_after_two_rotations_follows_the_newest_journal() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("1.jnl"), [0u8; 64]).unwrap();
    let mut m = Marker::new(dir.path()).unwrap();
    assert_eq!(m.active_end().map(|(id, _)| id), Some(1));
    for id in 2..=3 {
        std::fs::write(dir.path().join(format!("{id}.jnl")), [0u8; 64]).unwrap();
    }
    for id in 1..=2 {
        std::fs::remove_file(dir.path().join(format!("{id}.jnl"))).unwrap();
    }
    m.capture().unwrap();
    assert_eq!(m.active_end().map(|(id, _)| id), Some(3));
    assert_eq!(m.marks.keys().copied().collect::<Vec<_>>(), [3]);
}

/// A store with one small batch known durable, then a batch of many pages written but not
/// recorded as durable (the machine died during its sync); answers the journal's path,
/// where that batch starts and where it ends.
fn store_with_an_unrecorded_batch(dir: &Path) -> (PathBuf, u64, u64) {
    let db = fjall::Database::builder(dir)
        .manual_journal_persist(true)
        .open()
        .unwrap();
    let ks = db
        .keyspace("places", fjall::KeyspaceCreateOptions::default)
        .unwrap();
    ks.insert("a", "1").unwrap();
    db.persist(fjall::PersistMode::SyncAll).unwrap();
    let marker = Marker::new(dir).unwrap();
    let (id, start) = marker.active_end().unwrap();
    let mut b = db.batch();
    for i in 0..60u32 {
        b.insert(&ks, format!("big{i}"), vec![b'v'; 300]);
    }
    b.commit().unwrap();
    db.persist(fjall::PersistMode::SyncAll).unwrap();
    let path = marker.journal_path(id);
    drop(marker);
    drop(ks);
    drop(db);
    let end = crate::store::journal::written_end(&path).unwrap();
    (path, start, end)
}

/// A machine crash during the sync of a batch longer than a page can leave its last page
/// on disk (its end entry) and an earlier one not (zeros: the journal is preallocated).
/// That is one unfinished batch, a torn tail that fjall cuts: the store starts, with
/// everything known durable. Its own end entry is no intact batch after the cut.
#[test]
fn a_torn_batch_whose_end_reached_the_disk_is_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (path, start, end) = store_with_an_unrecorded_batch(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    let page = ((end - 1) / 4096 - 1) * 4096;
    assert!(page > start && page + 4096 < end, "a page inside the batch");
    bytes[page as usize..page as usize + 4096].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    let found = check(dir.path()).unwrap();
    assert!(found.is_none(), "a torn tail refused: {}", found.unwrap());
    // fjall cuts it and opens with what was known durable.
    let db = fjall::Database::builder(dir.path()).open().unwrap();
    let ks = db
        .keyspace("places", fjall::KeyspaceCreateOptions::default)
        .unwrap();
    assert!(ks.get("a").unwrap().is_some());
    assert!(ks.get("big0").unwrap().is_none());
}

/// The same batch with its entries whole and a value's byte wrong: fjall refuses to open a
/// journal whose batch fails its checksum (it cuts only where an entry does not read), so
/// the check calls it damage, which a repair cuts.
#[test]
fn an_unrecorded_batch_that_reads_whole_but_fails_its_checksum_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let (path, start, end) = store_with_an_unrecorded_batch(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    // A byte of the last item's value, just before the end entry.
    bytes[end as usize - TAIL_LEN - 1] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    assert!(
        fjall::Database::builder(dir.path()).open().is_err(),
        "fjall opens it"
    );
    let damage = check(dir.path()).unwrap().expect("damage");
    assert_eq!(damage.offset, start);
    repair(dir.path(), &damage).unwrap();
    assert!(check(dir.path()).unwrap().is_none());
    let db = fjall::Database::builder(dir.path()).open().unwrap();
    let ks = db
        .keyspace("places", fjall::KeyspaceCreateOptions::default)
        .unwrap();
    assert!(ks.get("a").unwrap().is_some());
}

/// Damage inside what the watermark covers, with batches after it that the watermark does
/// not cover yet (written after its last update): those are counted apart, exactly.
#[test]
fn batches_after_the_watermark_are_counted_apart_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let batches: Vec<Vec<u8>> = (0..10u8)
        .map(|i| batch(&[(3, &[b'k', i], b"v")], false))
        .collect();
    let path = dir.path().join("1.jnl");
    std::fs::write(&path, batches[..6].concat()).unwrap();
    let m = Marker::new(dir.path()).unwrap();
    assert_eq!(m.marks[&1].tally.batches, 6);
    let mut file = batches.concat();
    // A flipped byte in the third batch's item.
    let at = batches[0].len() + batches[1].len() + HEAD_LEN + ITEM_LEN;
    file[at] ^= 1;
    std::fs::write(&path, &file).unwrap();
    let d = check(dir.path()).unwrap().expect("damage");
    assert_eq!(d.offset, (batches[0].len() + batches[1].len()) as u64);
    assert_eq!(
        d.lost.batches, 4,
        "the watermark's batches from the damaged one on"
    );
    assert_eq!(d.uncounted_batches, 4, "batches 7 to 10");
    // Without a watermark: the batches after the damaged one, not it too.
    forget_marks(dir.path()).unwrap();
    let d = check(dir.path()).unwrap().expect("damage");
    assert_eq!(d.uncounted_batches, 7, "batches 4 to 10");
    assert!(d.why.starts_with("7 intact-looking batches"), "{}", d.why);
}
