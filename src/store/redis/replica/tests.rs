use super::*;
use crate::store::redis::log_meta::{LOG_FIELDS, LV_AT};

fn rec(nonce: u128, state: u8, joined: u64, user: &str) -> Vec<u8> {
    let mut r = nonce.to_be_bytes().to_vec();
    r.push(state);
    r.extend_from_slice(format!("{joined},0,0,{user}").as_bytes());
    r
}

#[test]
fn records_read_back() {
    let p = parse_place(&rec(7, b'w', 123, "!alice")).unwrap();
    assert_eq!(p.nonce, 7);
    assert_eq!(p.state, PlaceState::Waiting);
    assert_eq!(p.joined, 123);
    assert_eq!(p.user.as_deref(), Some("alice"));
    assert!(parse_place(&rec(7, b'w', 123, "")).unwrap().user.is_none());
    assert!(parse_place(b"short").is_err());
}

fn bulk(s: &[u8]) -> Value {
    Value::BulkString(s.to_vec())
}

/// The meta's numbers `n` as a log entry writes them.
fn csv_of(n: &[i64]) -> String {
    let csv: Vec<String> = n.iter().map(|x| x.to_string()).collect();
    csv.join(",")
}

/// The numbers of a meta at version 1 (incarnation 77), and a replica of it.
fn at_version_1() -> (Vec<i64>, Replica) {
    let mut n = vec![0i64; LOG_FIELDS.len()];
    n[14] = -1;
    n[LV_AT] = 1;
    n[24] = 77; // inc
    let meta = Meta::parse(csv_of(&n).as_bytes()).unwrap();
    let r = Replica {
        meta,
        ..Replica::default()
    };
    (n, r)
}

#[test]
fn log_entries_of_all_or_of_the_changed_numbers_apply() {
    // From a snapshot at version 1: a join's entry, then a whole one.
    let (mut n, mut r) = at_version_1();
    let joined = [
        bulk(b"v"),
        bulk(b"2"),
        bulk(b"t"),
        bulk(b"6"),
        bulk(b"d"),
        bulk(b"10,1"),
        bulk(b"9"),
        bulk(&rec(3, b'w', 6, "")),
    ];
    assert!(r.apply(&joined).unwrap());
    assert_eq!((r.meta.lv, r.meta.nw, r.meta.inc), (2, 1, 77));
    assert!(r.places.contains_key(&9));
    n[LV_AT] = 3;
    n[10] = 5;
    let csv = csv_of(&n);
    let whole = [
        bulk(b"v"),
        bulk(b"3"),
        bulk(b"t"),
        bulk(b"7"),
        bulk(b"m"),
        bulk(csv.as_bytes()),
    ];
    assert!(r.apply(&whole).unwrap());
    assert_eq!((r.meta.lv, r.meta.nw), (3, 5));
    // The next version, but of another incarnation (the event deleted and made again,
    // its first entries missed): not patched onto this one's state.
    let other = [
        bulk(b"v"),
        bulk(b"4"),
        bulk(b"t"),
        bulk(b"8"),
        bulk(b"d"),
        bulk(b"10,1,24,88"),
    ];
    assert!(!r.apply(&other).unwrap());
    assert_eq!((r.meta.lv, r.meta.inc), (3, 77));
    // A gap, or a field of neither kind.
    let mut gap = joined.clone();
    gap[1] = bulk(b"5");
    assert!(!r.apply(&gap).unwrap());
    let mut other = joined.clone();
    other[1] = bulk(b"4");
    other[4] = bulk(b"x");
    assert!(r.apply(&other).is_err());
}

/// A step that carries no numbers (a join's after an entry's first step: `log_append`
/// in replica.lua) counts one more waiting and adds its place, with or without its
/// time; one that does not follow still stops the entry.
#[test]
fn a_step_without_numbers_adds_one_waiting() {
    let (_, mut r) = at_version_1();
    let entry = [
        bulk(b"v"),
        bulk(b"2"),
        bulk(b"t"),
        bulk(b"6"),
        bulk(b"d"),
        bulk(b"10,1,24,77"),
        bulk(b"9"),
        bulk(&rec(3, b'w', 6, "")),
        bulk(b"v"),
        bulk(b"3"),
        bulk(b"10"),
        bulk(&rec(4, b'w', 6, "")),
        bulk(b"v"),
        bulk(b"4"),
        bulk(b"t"),
        bulk(b"7"),
        bulk(b"11"),
        bulk(&rec(5, b'w', 7, "=bob")),
    ];
    assert!(r.apply(&entry).unwrap());
    assert_eq!((r.meta.lv, r.meta.nw, r.meta.inc), (4, 3, 77));
    assert_eq!(r.places[&11].user.as_deref(), Some("bob"));
    assert_eq!(r.places[&11].joined, 7);
    assert_eq!(r.rank.count_below(11), 2);
    // Not the next version: a resync, nothing applied.
    let gap = [
        bulk(b"v"),
        bulk(b"6"),
        bulk(b"12"),
        bulk(&rec(6, b'w', 7, "")),
    ];
    assert!(!r.apply(&gap).unwrap());
    assert_eq!((r.meta.lv, r.meta.nw), (4, 3));
    assert!(!r.places.contains_key(&12));
}

/// A script call's entry holds one step per operation, each applied in turn; a step
/// that does not follow (here a gap inside the entry) stops it for a resync.
#[test]
fn an_entry_of_several_steps_applies_each() {
    let (_, start) = at_version_1();
    let step = |v: &[u8], nw: &[u8], seq: &[u8], nonce: u128| {
        let d = [&b"10,"[..], nw].concat();
        vec![
            bulk(b"v"),
            bulk(v),
            bulk(b"t"),
            bulk(b"6"),
            bulk(b"d"),
            bulk(&d),
            bulk(seq),
            bulk(&rec(nonce, b'w', 6, "")),
        ]
    };
    let entry = [
        step(b"2", b"1", b"9", 3),
        step(b"3", b"2", b"10", 4),
        // A step that changed no place, at the same time as the one before: no 't'.
        vec![bulk(b"v"), bulk(b"4"), bulk(b"d"), bulk(b"10,2")],
        step(b"5", b"3", b"11", 5),
    ]
    .concat();
    let mut r = Replica {
        meta: start.meta,
        ..Replica::default()
    };
    assert!(r.apply(&entry).unwrap());
    assert_eq!((r.meta.lv, r.meta.nw), (5, 3));
    assert_eq!(r.places.len(), 3);
    assert_eq!(r.places[&10].nonce, 4);
    assert_eq!(r.rank.count_below(11), 2);
    // Version 4 missing inside the entry: not applied past the gap.
    let gap = [
        step(b"2", b"1", b"9", 3),
        step(b"3", b"2", b"10", 4),
        step(b"5", b"3", b"11", 5),
    ]
    .concat();
    let mut r = Replica {
        meta: start.meta,
        ..Replica::default()
    };
    assert!(!r.apply(&gap).unwrap());
    assert!(!r.places.contains_key(&11));
    assert!(r.apply(&[]).is_err());
}

#[test]
fn positions_follow_the_rank_tree_across_rebuilds() {
    let mut r = Replica {
        synced: true,
        fresh_at: Some(Instant::now()),
        meta: Meta {
            nd: u64::MAX,
            ..Meta::default()
        },
        ..Replica::default()
    };
    // Far past the first window: the tree must move.
    let seqs: Vec<u64> = (1..=3000).step_by(7).collect();
    for &s in &seqs {
        r.add(s, parse_place(&rec(s as u128, b'w', 1, "")).unwrap());
    }
    r.meta.nw = seqs.len() as u64;
    for (i, &s) in seqs.iter().enumerate().step_by(37) {
        let key = PlaceKey {
            seq: s,
            nonce: s as u128,
        };
        assert_eq!(r.view(key, 5).unwrap().position, Some(i as u64 + 1));
    }
    r.remove(seqs[0]);
    let key = PlaceKey {
        seq: seqs[1],
        nonce: seqs[1] as u128,
    };
    assert_eq!(r.view(key, 5).unwrap().position, Some(1));
    // A forged nonce or a time at or past `nd` is the script's to answer.
    assert!(r.view(PlaceKey { nonce: 1, ..key }, 5).is_none());
    r.meta.nd = 5;
    assert!(r.view(key, 5).is_none());
}

/// A step's `P` field: records are bytes (a `,` or `:` in one, or a byte that is not
/// UTF-8, is only data); an empty record ends the place; anything cut short is refused,
/// never read as a shorter list.
#[test]
fn packed_places_read_back() {
    let a = rec(
        u128::from_be_bytes(*b",:\xff1234567890123"),
        b'w',
        5,
        "!a,b:c",
    );
    let mut blob = format!("12,{}:", a.len()).into_bytes();
    blob.extend_from_slice(&a);
    blob.extend_from_slice(b"13,0:");
    let mut rest = blob.as_slice();
    assert_eq!(next_packed(&mut rest).unwrap(), (12, a.as_slice()));
    assert_eq!(next_packed(&mut rest).unwrap(), (13, &b""[..]));
    assert!(rest.is_empty());
    for cut in 1..blob.len() - 5 {
        let mut rest = &blob[..cut];
        assert!(next_packed(&mut rest).is_err(), "cut at {cut}");
    }
    for bad in [
        &b"x,0:"[..],
        b"1,x:",
        b"1,99999999999999999999999:",
        b"1;0:",
    ] {
        assert!(next_packed(&mut &bad[..]).is_err(), "{bad:?}");
    }
}
