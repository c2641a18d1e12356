//! An event's records: its settings, written when they change (keyspace `events`), and its
//! counters, written with every batch that changes the event (keyspace `counters`).
//!
//! Why two records: every batch changes its event's counters, and a record holding the
//! settings too (~1 KB of JSON) made the event's record most of the journal's bytes (in
//! `relaxed`, ~2 joins a batch at 10,000 joins/s: ~5 MB/s of records against ~1 MB/s of
//! places). That filled the `events` memtable every few seconds and the 64 MiB journal
//! every ~11 s, and each of their rotations holds fjall's locks over syncs for tens of
//! milliseconds while every write waits (docs/PERFORMANCE.md, "The event's counters apart
//! from its settings"). A counters record is ~30 bytes.
//!
//! Formats, by their first bytes:
//! - [`SETTINGS`] (`\xffWR3`): the settings' JSON alone; the counters are in `counters`,
//!   written in the same batch.
//! - [`SETTINGS_AND_COUNTERS`] (`\xffWR2`, read only): settings' JSON and counters.
//! - anything else (read only): the first records, settings in postcard field by field.
//!
//! A store opened with records of the two older kinds is rewritten to the new one in one
//! batch at open ([`super::journal::Journal::open`]), so an older version of waitroom,
//! which would read stale counters from them, never finds one it can read: it refuses to
//! start on the new marker ("unreadable record") instead of restoring wrong positions.

use serde::{Deserialize, Serialize};

use crate::core::{EventConfig, QueueMeta};

/// Starts a settings record whose counters are kept apart. Like [`SETTINGS_AND_COUNTERS`],
/// its second byte can never start an old record (see `a_record_round_trips_…` below).
const SETTINGS: &[u8] = b"\xffWR3";

/// Starts a record of settings as JSON with the counters, as written before the counters
/// had a record of their own. Records before it hold the settings in postcard, which reads
/// fields by position and so cannot read a record of another shape. Such a record starts
/// with the name's length (at most 800 bytes), whose varint is never `0xFF` then `W`.
const SETTINGS_AND_COUNTERS: &[u8] = b"\xffWR2";

/// A counters record's version, its first byte.
const COUNTERS_V1: u8 = 1;

/// An event's settings record as read back: the settings, and the counters when the record
/// is of an older kind that held them.
pub(super) struct SettingsRec {
    pub config: EventConfig,
    pub counters: Option<QueueMeta>,
}

#[derive(Serialize, Deserialize)]
struct EventRecJson {
    config: String,
    meta: QueueMeta,
}

/// The settings as records before [`SETTINGS_AND_COUNTERS`] held them, field by field.
#[derive(Deserialize)]
struct LegacyConfig {
    name: String,
    max_active: u32,
    overbooking_ratio: f64,
    admit_per_minute: Option<u32>,
    ready_ttl_sec: u32,
    session_idle_sec: u32,
    session_max_sec: u32,
    waiting_idle_sec: u32,
    max_queue_length: Option<u32>,
    paused: bool,
    accept_joins: bool,
    target_url: Option<String>,
}

#[derive(Deserialize)]
struct LegacyEventRec {
    config: LegacyConfig,
    meta: QueueMeta,
}

impl SettingsRec {
    pub(super) fn decode(bytes: &[u8]) -> Result<Self, String> {
        if let Some(rest) = bytes.strip_prefix(SETTINGS) {
            let json = std::str::from_utf8(rest).map_err(|e| e.to_string())?;
            let config = serde_json::from_str(json).map_err(|e| e.to_string())?;
            return Ok(SettingsRec {
                config,
                counters: None,
            });
        }
        if let Some(rest) = bytes.strip_prefix(SETTINGS_AND_COUNTERS) {
            let r: EventRecJson = postcard::from_bytes(rest).map_err(|e| e.to_string())?;
            let config = serde_json::from_str(&r.config).map_err(|e| e.to_string())?;
            return Ok(SettingsRec {
                config,
                counters: Some(r.meta),
            });
        }
        let (r, rest) =
            postcard::take_from_bytes::<LegacyEventRec>(bytes).map_err(|e| e.to_string())?;
        // A record of the first version ends with its counters. Bytes after them: a record
        // of a later development build (its settings in 19 fields, from 633e25b to
        // 1b12530) that read as this kind takes settings for counters and drops the rest
        // (an invite-only event came back public): refused, not misread.
        if !rest.is_empty() {
            return Err(format!(
                "a settings record of an unknown kind ({} bytes past its counters): written \
                 by a development build this version cannot read",
                rest.len()
            ));
        }
        let c = r.config;
        Ok(SettingsRec {
            config: EventConfig {
                name: c.name,
                max_active: c.max_active,
                overbooking_ratio: c.overbooking_ratio,
                admit_per_minute: c.admit_per_minute,
                ready_ttl_sec: c.ready_ttl_sec,
                session_idle_sec: c.session_idle_sec,
                session_max_sec: c.session_max_sec,
                waiting_idle_sec: c.waiting_idle_sec,
                max_queue_length: c.max_queue_length,
                paused: c.paused,
                accept_joins: c.accept_joins,
                target_url: c.target_url,
                ..EventConfig::default()
            },
            counters: Some(r.meta),
        })
    }
}

/// An event's settings as its record holds them.
pub(super) fn config_json(config: &EventConfig) -> String {
    serde_json::to_string(config).expect("settings serialise")
}

/// An event's settings record, from its settings already as JSON ([`config_json`]).
pub(super) fn encode_settings(config_json: &str) -> Vec<u8> {
    [SETTINGS, config_json.as_bytes()].concat()
}

/// An event's counters record.
pub(super) fn encode_counters(meta: &QueueMeta) -> Vec<u8> {
    // Nine varints: at most 90 bytes.
    let mut out = Vec::with_capacity(1 + 90);
    out.push(COUNTERS_V1);
    postcard::to_io(meta, &mut out).expect("serialising to memory does not fail");
    out
}

/// A record as versions before the counters' own records wrote it (tests of the rewrite).
#[cfg(test)]
pub(super) fn encode_settings_and_counters(config_json: &str, meta: &QueueMeta) -> Vec<u8> {
    let rec = EventRecJson {
        config: config_json.to_owned(),
        meta: meta.clone(),
    };
    let body = postcard::to_allocvec(&rec).expect("serialising to memory does not fail");
    [SETTINGS_AND_COUNTERS, &body].concat()
}

pub(super) fn decode_counters(bytes: &[u8]) -> Result<QueueMeta, String> {
    match bytes.split_first() {
        Some((&COUNTERS_V1, rest)) => postcard::from_bytes(rest).map_err(|e| e.to_string()),
        Some((v, _)) => Err(format!("a counters record of unknown version {v}")),
        None => Err("an empty counters record".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc<T: Serialize>(v: &T) -> Vec<u8> {
        postcard::to_allocvec(v).expect("serialising to memory does not fail")
    }

    /// The shape event records had before their settings became JSON, written field by
    /// field as that version wrote them.
    #[derive(Serialize)]
    struct OldRec {
        config: OldConfig,
        meta: QueueMeta,
    }

    #[derive(Serialize)]
    struct OldConfig(
        String,
        u32,
        f64,
        Option<u32>,
        u32,
        u32,
        u32,
        u32,
        Option<u32>,
        bool,
        bool,
        Option<String>,
    );

    #[test]
    fn a_record_of_the_first_version_still_reads() {
        let meta = QueueMeta {
            next_seq: 42,
            joins: 41,
            ..QueueMeta::default()
        };
        let old = OldRec {
            config: OldConfig(
                "Concert".into(),
                7,
                1.5,
                Some(60),
                30,
                90,
                600,
                45,
                Some(1000),
                true,
                false,
                Some("https://example.com/book".into()),
            ),
            meta: meta.clone(),
        };
        let rec = SettingsRec::decode(&enc(&old)).unwrap();
        let c = &rec.config;
        assert_eq!((c.name.as_str(), c.max_active), ("Concert", 7));
        assert_eq!(c.overbooking_ratio, 1.5);
        assert_eq!(c.admit_per_minute, Some(60));
        assert_eq!(
            (c.ready_ttl_sec, c.session_idle_sec, c.session_max_sec),
            (30, 90, 600)
        );
        assert_eq!((c.waiting_idle_sec, c.max_queue_length), (45, Some(1000)));
        assert!(c.paused && !c.accept_joins);
        assert_eq!(c.target_url.as_deref(), Some("https://example.com/book"));
        assert_eq!(c.pow_difficulty, 0, "a later setting reads as its default");
        assert_eq!(rec.counters, Some(meta));
    }

    /// A record of a development build between the first version and the counters'
    /// marker (the settings in 19 fields, then the counters) is refused: read as a record
    /// of the first version, its extra settings were taken for counters and the rest was
    /// dropped (an invite-only event with a user-token secret came back public).
    #[test]
    fn a_record_with_more_settings_than_the_first_version_is_refused() {
        #[derive(Serialize)]
        struct Between(
            OldConfig,
            Option<String>,
            Option<String>,
            bool,
            u32,
            u32,
            Option<u32>,
            Option<u64>,
            QueueMeta,
        );
        let rec = Between(
            OldConfig(
                "VIP".into(),
                7,
                1.0,
                None,
                60,
                120,
                600,
                300,
                None,
                false,
                true,
                None,
            ),
            Some("s".repeat(40)),
            None,
            true,
            1,
            0,
            None,
            None,
            QueueMeta {
                next_seq: 11,
                joins: 10,
                ..QueueMeta::default()
            },
        );
        let err = SettingsRec::decode(&enc(&rec)).err().expect("refused");
        assert!(err.contains("unknown kind"), "{err}");
    }

    /// A record as the version before the counters' own records wrote it.
    #[test]
    fn a_record_with_its_counters_still_reads() {
        let config = EventConfig {
            name: "Arena".into(),
            pow_difficulty: 9,
            ..EventConfig::default()
        };
        let meta = QueueMeta {
            next_seq: 7,
            admissions: 3,
            ..QueueMeta::default()
        };
        let old = [
            SETTINGS_AND_COUNTERS,
            &enc(&EventRecJson {
                config: config_json(&config),
                meta: meta.clone(),
            }),
        ]
        .concat();
        let rec = SettingsRec::decode(&old).unwrap();
        assert_eq!(rec.config, config);
        assert_eq!(rec.counters, Some(meta));
    }

    #[test]
    fn a_record_round_trips_and_its_marker_cannot_start_an_old_one() {
        let config = EventConfig {
            name: "x".repeat(200),
            pow_difficulty: 12,
            ..EventConfig::default()
        };
        let back = SettingsRec::decode(&encode_settings(&config_json(&config))).unwrap();
        assert_eq!(back.config, config);
        assert!(back.counters.is_none());
        // The longest name an old record can hold (200 characters of 4 bytes) has a length
        // varint whose second byte is at most 6; the markers' is `W`.
        let longest = enc(&"\u{10FFFF}".repeat(200));
        assert!(longest[1] <= 6 && SETTINGS[1] > 6 && SETTINGS_AND_COUNTERS[1] > 6);
        // And a new record does not read as a record of the first version (what an older
        // waitroom would try on it): it is refused, not read with other counters.
        assert!(
            postcard::from_bytes::<LegacyEventRec>(&encode_settings(&config_json(&config)))
                .is_err()
        );
    }

    #[test]
    fn counters_round_trip_and_are_small() {
        let meta = QueueMeta {
            next_seq: 1_000_001,
            completed: 400_000,
            left: 12_345,
            expired: 3,
            joins: 1_000_000,
            admissions: 600_000,
            wait_sum_ms: 9_000_000_000,
            session_sum_ms: 7_000_000_000,
            session_count: 400_000,
        };
        let rec = encode_counters(&meta);
        assert!(rec.len() <= 48, "{} bytes", rec.len());
        assert_eq!(decode_counters(&rec).unwrap(), meta);
        assert!(decode_counters(&[9, 1, 2]).is_err());
        assert!(decode_counters(&[]).is_err());
    }
}
