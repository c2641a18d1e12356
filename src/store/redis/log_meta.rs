//! The numbers of an event's meta that its change log carries ([`LOG_FIELDS`]), as a
//! replica reads them: in full (a snapshot, an event's first entry `m`) or as a patch of
//! the numbers one transition set (`d`) over the entry before.

use std::fmt::Write;

use super::decode::{Ctx, Malformed};
use crate::core::{Millis, Pace, ReadyKept, Timeouts};

/// The meta's numbers each log entry carries, in this order (the prelude hands the list to
/// the Lua). `opened`, then `seen`, then the lowered ready window's `rkb`, `rkept` and
/// `rfloor` came last: an entry written before them carries fewer numbers and reads as no
/// opening recorded, no end seen, no window lowered.
pub(super) const LOG_FIELDS: [&str; 30] = [
    "cap", "rate", "ttl", "sidle", "smax", "widle", "paused", "ssum", "scnt", "wn", "nw", "nad",
    "nac", "nd", "fadm", "hbusy", "hsince", "hends", "opens", "method", "npre", "closes", "ended",
    "lv", "inc", "opened", "seen", "rkb", "rkept", "rfloor",
];
/// How many versions (steps) the log keeps at least, and at most about twice as many
/// (`log_flush` in replica.lua): at 20,000 changes a second, half a second of history for
/// a lagging node before it must resync.
pub(super) const LOG_MAXLEN: u64 = 10_000;
/// The generated prelude's part: the log's fields and length.
pub(super) fn prelude(h: &mut String) {
    let names: Vec<String> = LOG_FIELDS.iter().map(|f| format!("'{f}'")).collect();
    writeln!(h, "local LOG_FIELDS = {{{}}}", names.join(", ")).expect("writing to a string");
    writeln!(h, "local LOG_MAXLEN = {LOG_MAXLEN}").expect("writing to a string");
}

/// Where `lv` is in [`LOG_FIELDS`].
pub(super) const LV_AT: usize = 23;

/// Where `nw` (the waiting count) is in [`LOG_FIELDS`].
pub(super) const NW_AT: usize = 10;

/// Comma-separated integers; none in an empty string.
fn csv_numbers(csv: &[u8]) -> Result<Vec<i64>, Malformed> {
    if csv.is_empty() {
        return Ok(Vec::new());
    }
    let bad = || Malformed("the log's numbers");
    std::str::from_utf8(csv)
        .map_err(|_| bad())?
        .split(',')
        .map(|x| x.parse().map_err(|_| bad()))
        .collect()
}

/// The numbers of [`LOG_FIELDS`], by name.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Meta {
    pub(super) cap: u64,
    pub(super) rate: u64,
    pub(super) ttl: u64,
    pub(super) sidle: u64,
    pub(super) smax: u64,
    pub(super) widle: u64,
    pub(super) paused: bool,
    pub(super) ssum: u64,
    pub(super) scnt: u64,
    pub(super) wn: u64,
    pub(super) nw: u64,
    pub(super) nad: u64,
    pub(super) nac: u64,
    pub(super) nd: u64,
    pub(super) fadm: Option<u64>,
    pub(super) hbusy: u64,
    pub(super) hsince: u64,
    pub(super) hends: u64,
    pub(super) opens: u64,
    pub(super) method: u64,
    pub(super) npre: u64,
    pub(super) closes: u64,
    pub(super) ended: bool,
    pub(super) lv: u64,
    pub(super) inc: u64,
    /// The `opens` an operation reached (0: none): the opening stays reached whatever this
    /// node's clock says (config.rs `opening_reached`).
    pub(super) opened: u64,
    /// When an operation first found the sale over by `closes` (0: none did): it stays
    /// over for this node too, whatever its clock says (queue.rs `note_end`).
    pub(super) seen: u64,
    /// What a lowered ready window kept (rules.lua `rkb`, `rkept`, `rfloor`).
    pub(super) rkb: u64,
    pub(super) rkept: u64,
    pub(super) rfloor: u64,
}

impl Meta {
    /// All the numbers, comma-separated (a snapshot, a log entry's `m`).
    pub(super) fn parse(csv: &[u8]) -> Result<Meta, Malformed> {
        let mut n = csv_numbers(csv)?;
        // Written before `opened`, `seen` or the ready window's numbers were logged: none
        // recorded.
        if n.len() + 5 >= LOG_FIELDS.len() {
            n.resize(n.len().max(LOG_FIELDS.len()), 0);
        }
        let n: [i64; LOG_FIELDS.len()] =
            n.try_into().map_err(|_| Malformed("the log's numbers"))?;
        Ok(Meta::from_numbers(&n))
    }

    /// The numbers after a log entry whose `d` is `pairs`: the place in [`LOG_FIELDS`] and
    /// the new value of each number the transition set, comma-separated; the others are as
    /// in `self` (the entry before), `lv` is the entry's version `v`.
    pub(super) fn patch(&self, pairs: &[u8], lv: u64) -> Result<Meta, Malformed> {
        let mut n = self.numbers();
        for pair in csv_numbers(pairs)?.chunks(2) {
            let [at, value] = *pair else {
                return Err(Malformed("the log's changed numbers"));
            };
            let slot = usize::try_from(at)
                .ok()
                .and_then(|i| n.get_mut(i))
                .ok_or(Malformed("the log's changed numbers"))?;
            *slot = value;
        }
        n[LV_AT] = lv as i64;
        Ok(Meta::from_numbers(&n))
    }

    /// The numbers after a step that carries none (a join's, `log_append` in replica.lua):
    /// one more waiting, version `lv`, the rest as before.
    pub(super) fn one_more_waiting(&self, lv: u64) -> Meta {
        let mut n = self.numbers();
        n[NW_AT] += 1;
        n[LV_AT] = lv as i64;
        Meta::from_numbers(&n)
    }

    /// The numbers in [`LOG_FIELDS`]' order, as `from_numbers` reads them.
    pub(super) fn numbers(&self) -> [i64; LOG_FIELDS.len()] {
        let u = |v: u64| v as i64;
        [
            u(self.cap),
            u(self.rate),
            u(self.ttl),
            u(self.sidle),
            u(self.smax),
            u(self.widle),
            self.paused.into(),
            u(self.ssum),
            u(self.scnt),
            u(self.wn),
            u(self.nw),
            u(self.nad),
            u(self.nac),
            u(self.nd),
            self.fadm.map_or(-1, u),
            u(self.hbusy),
            u(self.hsince),
            u(self.hends),
            u(self.opens),
            u(self.method),
            u(self.npre),
            u(self.closes),
            self.ended.into(),
            u(self.lv),
            u(self.inc),
            u(self.opened),
            u(self.seen),
            u(self.rkb),
            u(self.rkept),
            u(self.rfloor),
        ]
    }

    pub(super) fn from_numbers(n: &[i64; LOG_FIELDS.len()]) -> Meta {
        let u = |i: usize| n[i].max(0) as u64;
        Meta {
            cap: u(0),
            rate: u(1),
            ttl: u(2),
            sidle: u(3),
            smax: u(4),
            widle: u(5),
            paused: n[6] != 0,
            ssum: u(7),
            scnt: u(8),
            wn: u(9),
            nw: u(10),
            nad: u(11),
            nac: u(12),
            nd: u(13),
            fadm: u64::try_from(n[14]).ok(),
            hbusy: u(15),
            hsince: u(16),
            hends: u(17),
            opens: u(18),
            method: u(19),
            npre: u(20),
            closes: u(21),
            ended: n[22] != 0,
            lv: u(23),
            inc: u(24),
            opened: u(25),
            seen: u(26),
            rkb: u(27),
            rkept: u(28),
            rfloor: u(29),
        }
    }

    pub(super) fn in_prequeue(&self, joined: Millis) -> bool {
        self.opens > 0 && joined < self.opens
    }

    /// The opening while it is still ahead at `now` (schedule.lua `before_opening`): by
    /// this clock, and not recorded as reached.
    pub(super) fn opening_ahead(&self, now: Millis) -> Option<Millis> {
        (self.opens > 0 && now < self.opens && self.opened != self.opens).then_some(self.opens)
    }

    /// Whether the sale is over at `now` (places.lua `sale_ended`): ended by the call, or
    /// `closes` reached by this clock or seen reached by an operation.
    pub(super) fn sale_ended(&self, now: Millis) -> bool {
        self.ended || (self.closes > 0 && now.max(self.seen) >= self.closes)
    }

    /// The script's `ctx()` at `now` (rules.lua): what ETAs and deadlines come from.
    pub(super) fn ctx(&self, now: Millis) -> Ctx {
        let live = self.nad + self.nac;
        let hold_ms = if self.hsince == 0 || now <= self.hsince {
            self.hbusy
        } else {
            self.hbusy + live * (now - self.hsince)
        };
        Ctx {
            pace: Pace {
                recent_admissions: self.wn,
                first_admission_at: self.fadm,
                admit_per_minute: (self.rate > 0).then_some(self.rate as u32),
                capacity: self.cap,
                session_sum_ms: self.ssum,
                session_count: self.scnt,
                session_max_sec: (self.smax / 1000) as u32,
                paused: self.paused,
                hold_ms,
                hold_ends: self.hends,
                live,
            },
            timeouts: Timeouts {
                ready_ttl_ms: self.ttl,
                session_idle_ms: self.sidle,
                session_max_ms: self.smax,
                waiting_idle_ms: self.widle,
                ready_kept: ReadyKept {
                    before: self.rkb,
                    window_ms: self.rkept,
                    floor: self.rfloor,
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_numbers_read_back_and_take_a_patch() {
        assert_eq!(LOG_FIELDS[LV_AT], "lv");
        assert_eq!(LOG_FIELDS[NW_AT], "nw");
        let n: Vec<i64> = (0..LOG_FIELDS.len() as i64)
            .map(|i| match i {
                14 => -1,    // fadm: none yet
                6 | 22 => 1, // paused, ended: flags
                _ => 1_000 + i,
            })
            .collect();
        let csv: Vec<String> = n.iter().map(|x| x.to_string()).collect();
        let meta = Meta::parse(csv.join(",").as_bytes()).unwrap();
        assert_eq!(meta.numbers().to_vec(), n);
        assert_eq!(meta.fadm, None);
        assert!(Meta::parse(b"1,2,3").is_err());
        // Entries from before the ready window's numbers, `seen`, and `opened`, were
        // logged: none recorded.
        let unkept = Meta {
            rkb: 0,
            rkept: 0,
            rfloor: 0,
            ..meta
        };
        let older = Meta::parse(csv[..LOG_FIELDS.len() - 3].join(",").as_bytes()).unwrap();
        assert_eq!(older, unkept);
        let older = Meta::parse(csv[..LOG_FIELDS.len() - 4].join(",").as_bytes()).unwrap();
        assert_eq!(older, Meta { seen: 0, ..unkept });
        let oldest = Meta::parse(csv[..LOG_FIELDS.len() - 5].join(",").as_bytes()).unwrap();
        assert_eq!(
            oldest,
            Meta {
                opened: 0,
                seen: 0,
                ..unkept
            }
        );
        assert!(Meta::parse(csv[..LOG_FIELDS.len() - 6].join(",").as_bytes()).is_err());
        // Only what the entry names changes; lv is the entry's version.
        let next = meta.patch(b"10,7,14,55", 2_000).unwrap();
        assert_eq!((next.nw, next.fadm, next.lv), (7, Some(55), 2_000));
        assert_eq!(
            Meta {
                nw: 1_010,
                fadm: None,
                lv: 1_023,
                ..next
            },
            meta
        );
        assert_eq!(meta.patch(b"", 9).unwrap().lv, 9);
        for bad in [&b"10"[..], b"30,1", b"-1,1", b"x,1"] {
            assert!(meta.patch(bad, 9).is_err(), "{:?}", bad);
        }
    }
}
