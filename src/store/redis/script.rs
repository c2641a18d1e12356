//! The one Lua script of the Redis store, and the facts it shares with the Rust side.
//!
//! The rules live in `lua/rules.lua`, `lua/places.lua` and `lua/ops.lua`. Everything both sides must agree
//! on is written once, here, and handed to the Lua as a generated prelude: the order of
//! an event's keys (the same table builds `KEYS`), the effect kinds (the same table
//! decodes them), the retention of expired tokens and the admission window (the core's
//! constants). The answer codes the script can send are checked against
//! [`QueueError::code`] by a test that reads the Lua sources.

use std::fmt::Write;
use std::sync::LazyLock;

use redis::Script;

#[cfg(doc)]
use crate::core::QueueError;
use crate::core::{holds, EndReason, Millis, END_BATCH, EXPIRED_RETENTION_MS, RATE_WINDOW_MS};

/// An event's keys, in the order the script receives them as `KEYS`: the suffix after
/// `prefix:{event}:` and the Lua name it is bound to (`lua/rules.lua` says what each holds).
pub(super) const KEYS: [(&str, &str); 23] = [
    ("m", "K_META"),
    ("p", "K_PLACES"),
    ("u", "K_USERS"),
    ("q", "K_RANK"),
    ("ws", "K_WSEEN"),
    ("ad", "K_ADM"),
    ("as", "K_ASEEN"),
    ("ae", "K_AENT"),
    ("t", "K_TOMB"),
    ("to", "K_TORDER"),
    ("w", "K_WINDOW"),
    ("md", "K_METADATA"),
    ("l", "K_LEASE"),
    ("iv", "K_INVITES"),
    ("it", "K_ITEMS"),
    ("hu", "K_HUNTIL"),
    ("hs", "K_HSESS"),
    ("ex", "K_EXT"),
    ("pq", "K_PRE"),
    ("ps", "K_PRESEQ"),
    ("lg", "K_LOG"),
    ("qf", "K_RANKF"),
    ("wi", "K_WINDEX"),
];

/// How many seqs share one chunk of the per-place keys (`p`, `q`, `ws`: `lua/rules.lua`,
/// "Chunks") in an event made by this version (layout 2; layout 1 had 128): at most
/// Redis's default `*-max-listpack-entries` (128), so that every chunk keeps the compact
/// encoding, and small, because each insert into a listpack scans it (docs/PERFORMANCE.md,
/// "Redis joins: one command per chunk and batch, smaller chunks").
pub(super) const CHUNK: u64 = 32;

/// What an effect triple of a script answer reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FxKind {
    Joined,
    Admitted,
    Entered,
    Ended(EndReason),
    Forgotten,
}

/// The effect kinds: the Lua name of each, bound to its position + 1 (the number the
/// script sends).
pub(super) const FX_KINDS: [(&str, FxKind); 9] = [
    ("FX_JOINED", FxKind::Joined),
    ("FX_ADMITTED", FxKind::Admitted),
    ("FX_ENTERED", FxKind::Entered),
    ("FX_LEFT", FxKind::Ended(EndReason::Left)),
    ("FX_COMPLETED", FxKind::Ended(EndReason::Completed)),
    ("FX_EXPIRED", FxKind::Ended(EndReason::Expired)),
    ("FX_CLEARED", FxKind::Ended(EndReason::Cleared)),
    ("FX_FORGOTTEN", FxKind::Forgotten),
    ("FX_CLOSED", FxKind::Ended(EndReason::Closed)),
];

impl FxKind {
    /// The number the script sends for this kind.
    pub(super) fn number(self) -> i64 {
        FX_KINDS
            .iter()
            .position(|(_, k)| *k == self)
            .map_or(0, |i| i as i64 + 1)
    }

    /// The kind a script sent as `n`.
    pub(super) fn from_number(n: i64) -> Option<FxKind> {
        let i = usize::try_from(n).ok()?.checked_sub(1)?;
        FX_KINDS.get(i).map(|(_, k)| *k)
    }
}

/// "No deadline" in the script: 2^53, above any time and still exact as a Lua double.
const NEVER: Millis = 1 << 53;

/// The answer codes of the script that are not queue errors.
pub(super) const OK: &[u8] = b"OK";
/// `batch`: Redis refused one operation of a batch (a Lua error, such as a write refused
/// under `maxmemory`); the payload says why. Only that operation failed.
pub(super) const FAILED: &[u8] = b"FAILED";
/// `put`: the settings changed since they were read; read and apply the patch again.
pub(super) const CONFLICT: &[u8] = b"CONFLICT";
/// `tick`: another node holds the event's periodic-work lease.
pub(super) const LEASED: &[u8] = b"LEASED";
/// `put`: the change of `opens_at` would move waiting places into or out of the pre-queue
/// ([`crate::core::queue::SCHEDULE_LOCKED`]).
pub(super) const SCHEDULE_LOCKED: &[u8] = b"SCHEDULE_LOCKED";
/// `put`: the change would reopen a sale while places it ended are still waiting to be
/// removed ([`crate::core::lifecycle::REOPEN_LOCKED`]).
pub(super) const REOPEN_LOCKED: &[u8] = b"REOPEN_LOCKED";

/// The generated prelude: the shared facts as Lua locals.
fn prelude() -> String {
    let mut h = String::from("-- Generated from src/store/redis/script.rs; not a source file.\n");
    // The keys and arguments are bound per call (begin_call), not at the top level: a
    // library of Redis Functions runs its top level once, at load, without them.
    let names: Vec<&str> = KEYS.iter().map(|(_, name)| *name).collect();
    let slots: Vec<String> = (1..=KEYS.len()).map(|i| format!("keys[{i}]")).collect();
    writeln!(h, "local KEYS, ARGV\nlocal {}", names.join(", ")).expect("writing to a string");
    writeln!(
        h,
        "-- Per-call state: each hook registered by on_call runs at the start of every call, in\n\
         -- the order registered, once the keys and arguments are bound (rules.lua).\n\
         local ON_CALL = {{}}\n\
         local function on_call(f) ON_CALL[#ON_CALL + 1] = f end\n\
         local function begin_call(keys, argv)\n  \
           KEYS, ARGV = keys, argv\n  \
           {} = {}\n  \
           for i = 1, #ON_CALL do ON_CALL[i]() end\n\
         end",
        names.join(", "),
        slots.join(", ")
    )
    .expect("writing to a string");
    for (i, (name, _)) in FX_KINDS.iter().enumerate() {
        writeln!(h, "local {name} = {}", i + 1).expect("writing to a string");
    }
    writeln!(h, "local RETENTION = {EXPIRED_RETENTION_MS}").expect("writing to a string");
    writeln!(h, "local WINDOW = {RATE_WINDOW_MS}").expect("writing to a string");
    writeln!(h, "local NEVER = {NEVER}").expect("writing to a string");
    for (name, v) in [
        ("MAX_ITEMS", holds::MAX_ITEMS),
        ("DEFAULT_HOLD_TTL_SEC", holds::DEFAULT_HOLD_TTL_SEC.into()),
        (
            "DEFAULT_MAX_HOLDS_PER_SESSION",
            holds::DEFAULT_MAX_HOLDS_PER_SESSION.into(),
        ),
        (
            "DEFAULT_SESSION_EXTEND_SEC",
            holds::DEFAULT_SESSION_EXTEND_SEC.into(),
        ),
        (
            "DEFAULT_MAX_EXTENSIONS",
            holds::DEFAULT_MAX_EXTENSIONS.into(),
        ),
    ] {
        writeln!(h, "local {name} = {v}").expect("writing to a string");
    }
    writeln!(h, "local END_BATCH = {END_BATCH}").expect("writing to a string");
    writeln!(h, "local CHUNK = {CHUNK}").expect("writing to a string");
    super::replica::prelude(&mut h);
    h
}

const RULES: &str = include_str!("lua/rules.lua");
const PLACES: &str = include_str!("lua/places.lua");
const HOLDS: &str = include_str!("lua/holds.lua");
const SCHEDULE: &str = include_str!("lua/schedule.lua");
const REPLICA: &str = include_str!("lua/replica.lua");
const OPS: &str = include_str!("lua/ops.lua");

/// The Lua every operation runs: the prelude, the rules (the keys, the meta and the line,
/// then the places), the holds, the schedule, the change log of the replicas, then the
/// entry points; it defines `main(keys, argv)`. One chunk: each file uses the locals of
/// the files before it.
fn body() -> String {
    format!("{}{}", prelude(), lua_files())
}

/// Every Lua file, in the script's order (the tests scan the same text the script holds).
fn lua_files() -> String {
    format!("{RULES}{PLACES}{HOLDS}{SCHEDULE}{REPLICA}{OPS}")
}

/// The body as one script for EVALSHA: its top level (every function definition, about
/// 200 closures) runs on every call, then calls `main`. The path for a server without
/// Redis Functions (before 7.0), and for a call that a function's flags would refuse
/// (`call.rs`).
pub(super) static SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "local EVAL_KEYS, EVAL_ARGV = KEYS, ARGV\n{}return main(EVAL_KEYS, EVAL_ARGV)\n",
        body()
    ))
});

/// The body as a library of Redis Functions: `FUNCTION LOAD` runs its top level once, and
/// each `FCALL` then runs `main` alone.
pub(super) struct Library {
    /// The library's name and its one function's: `wr_` and the hash of the EVALSHA
    /// script, so nodes of different versions each call their own during an upgrade.
    pub(super) name: String,
    pub(super) code: String,
}

pub(super) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let name = format!("wr_{}", SCRIPT.get_hash());
    // No flags: the function may write and is refused up front under `maxmemory` (as a
    // write command is), which call.rs turns into an EVALSHA of the same call.
    let code = format!(
        "#!lua name={name}\n{}redis.register_function('{name}', main)\n",
        body()
    );
    Library { name, code }
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::QueueError;

    /// Every answer code the Lua sources can send: the string literal a `finish(` call,
    /// a returned table (`return {'OK', …}`) or an error return (`return nil, '…'`)
    /// starts with.
    fn lua_codes() -> Vec<String> {
        let src = lua_files();
        let mut out = Vec::new();
        for lead in ["finish(", "return {", "return nil, "] {
            for (i, _) in src.match_indices(lead) {
                let rest = &src[i + lead.len()..];
                let Some(q) = rest.chars().next().filter(|c| *c == '\'' || *c == '"') else {
                    continue; // a variable: checked where its value is a literal
                };
                let end = rest[1..].find(q).expect("a closed string literal");
                out.push(rest[1..1 + end].to_string());
            }
        }
        out.sort();
        out.dedup();
        out
    }

    #[test]
    fn every_lua_answer_code_is_known_to_rust() {
        let codes = lua_codes();
        // The scan must see the codes at all, or it checks nothing.
        for expected in ["OK", "TOKEN_EXPIRED", "EVENT_NOT_FOUND", "NO_SESSION"] {
            assert!(
                codes.iter().any(|c| c == expected),
                "scan missed {expected}"
            );
        }
        for code in &codes {
            let internal = [OK, CONFLICT, LEASED, SCHEDULE_LOCKED, REOPEN_LOCKED, FAILED]
                .contains(&code.as_bytes());
            assert!(
                internal || QueueError::from_code(code).is_some(),
                "the Lua scripts can answer {code:?}, which the Rust side does not know"
            );
        }
    }

    #[test]
    fn every_shared_name_in_the_lua_comes_from_the_prelude() {
        let prelude = prelude();
        let src = lua_files();
        let defined = |name: &str| {
            prelude.contains(&format!("local {name} = ")) || KEYS.iter().any(|(_, k)| *k == name)
        };
        let names = src
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| {
                ["K_", "FX_"]
                    .iter()
                    .any(|p| w.len() > p.len() && w.starts_with(p))
            });
        for name in names {
            assert!(defined(name), "{name} is used by the Lua but not generated");
        }
        for hand in ["local RETENTION", "local WINDOW", "local NEVER", "= KEYS["] {
            assert!(!src.contains(hand), "the Lua defines {hand:?} by hand");
        }
    }

    /// ops.lua writes out the bounds of the floor of a lowered idle time (view.rs
    /// `lowered_idle_floor`), as the EVAL's main chunk has no room for more locals.
    #[test]
    fn the_lowered_idle_floor_uses_view_rs_bounds() {
        let ops = include_str!("lua/ops.lua");
        assert_eq!(crate::core::POLL_MAX_SEC, 60);
        assert_eq!(crate::core::view::POLL_SLACK_MS, 1000);
        assert!(ops.contains("math.floor(math.min(old_widle, old_ttl) / 3000), 1), 60)"));
        assert!(ops.contains("NOW + told + 1000"));
    }

    /// A library of Redis Functions keeps its top level's variables from one call to the
    /// next: each one must be set afresh by an `on_call` hook, or be set once at load and
    /// never changed by a call (listed here), or one call's state would leak into the next.
    #[test]
    fn every_top_level_variable_is_set_per_call_or_constant() {
        const AT_LOAD: &[&str] = &[
            // Functions defined later than they are declared.
            "num",
            "fmt",
            "in_prequeue",
            "before_opening",
            "line_insert",
            "line_remove",
            "line_position",
            "line_range",
            "line_next",
            "limits",
            "check_reject",
            "write_secrets",
            "secret",
            "log_append",
            "log_flush",
            "finish_join",
            "set",
            "release_holds",
            // Constants. (SHORT: finish_join fills it before each answer that hands it out.)
            "LAYOUT",
            "CHUNK_OF",
            "OLD_LAYOUT_ERROR",
            "FIELDS",
            "FADM_AT",
            "CTX_F",
            "LOG_AT",
            "SHORT",
            "SHA_K",
            "LOG_HEAD",
            "LOG_ENTRY_ARGS",
            "SNAPSHOT_CHUNKS",
            "SNAPSHOT_PLACES",
        ];
        let src = lua_files();
        let mut hooks = String::new();
        let mut lines = src.lines();
        while let Some(line) = lines.next() {
            if let Some(rest) = line.strip_prefix("on_call(function()") {
                hooks.push_str(rest);
                if !rest.ends_with("end)") {
                    for l in lines.by_ref() {
                        hooks.push_str(l);
                        hooks.push('\n');
                        if l == "end)" {
                            break;
                        }
                    }
                }
                hooks.push('\n');
            }
        }
        let set_by_hook = |name: &str| {
            hooks
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .any(|w| w == name)
        };
        let mut seen = 0;
        for line in src.lines() {
            let Some(decl) = line.strip_prefix("local ") else {
                continue;
            };
            if decl.starts_with("function ") {
                continue;
            }
            let names = decl.split('=').next().unwrap();
            for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                seen += 1;
                assert!(
                    AT_LOAD.contains(&name) || set_by_hook(name),
                    "the top-level variable {name} is neither set per call (on_call) nor \
                     listed as set at load"
                );
            }
        }
        assert!(seen > 40, "the scan found {seen} top-level variables");
        // The scan must see hooks at all.
        assert!(set_by_hook("NOW") && set_by_hook("WROTE") && set_by_hook("INV"));
    }

    #[test]
    fn effect_kinds_read_back_from_their_numbers() {
        for (i, (_, kind)) in FX_KINDS.iter().enumerate() {
            assert_eq!(FxKind::from_number(i as i64 + 1), Some(*kind));
        }
        assert_eq!(FxKind::from_number(0), None);
        assert_eq!(FxKind::from_number(FX_KINDS.len() as i64 + 1), None);
    }
}
