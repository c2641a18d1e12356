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

#[test]
fn batch_ends_are_found_anywhere() {
    let mut b = vec![9u8; 5];
    b.push(TAG_END);
    b.extend_from_slice(&[7; 8]);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&[0; 3]);
    assert_eq!(batch_ends(&b), 1);
    assert_eq!(batch_ends(&b[..10]), 0);
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
