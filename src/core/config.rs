//! Event configuration: the stored settings of one sale and the validated patch that
//! creates or updates them (`PUT /admin/events/{id}`).

use serde::de::Unexpected;
use serde::{Deserialize, Deserializer, Serialize};

use super::gate::GateRules;
use super::lifecycle::{self, Announcement, Ended, SaleEnd};
use super::look::{Look, Texts};
use super::schedule::{opt_rfc3339, parse_rfc3339, EventSecret, QueueingMethod};
use super::{Millis, QueueError};

/// Longest accepted event id; ids are also used in Redis keys and URLs, so they stay short.
pub const MAX_EVENT_ID_LEN: usize = 64;
/// Upper bound on every `*_sec` setting (one year): larger values are almost certainly typos
/// and would overflow millisecond arithmetic in no useful way.
pub const MAX_SECONDS: u64 = 365 * 24 * 3600;
/// Least `waiting_idle_sec`: a polling client is told to come back after whole seconds,
/// at least 1 (`view::poll_after_sec`), and at most a third of the idle period, so that a
/// place that polls as told has three chances (room for the round trip) before it lapses.
/// With 1 or 2 s the one-second interval plus the round trip can outlast the period.
pub const MIN_WAITING_IDLE_SEC: u64 = 3;
/// Upper bound on `max_active`, `admit_per_minute` and `max_queue_length`.
pub const MAX_COUNT: u64 = 100_000_000;
/// Highest `pow_difficulty`: 2^28 hashes is minutes for a phone's browser already.
pub const MAX_POW_BITS: u64 = 28;

/// The settings of one event, as stored and as answered by the admin API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventConfig {
    pub name: String,
    pub max_active: u32,
    pub overbooking_ratio: f64,
    /// `None`: no rate cap, admission is bounded by capacity alone.
    pub admit_per_minute: Option<u32>,
    pub ready_ttl_sec: u32,
    pub session_idle_sec: u32,
    pub session_max_sec: u32,
    pub waiting_idle_sec: u32,
    pub max_queue_length: Option<u32>,
    /// Paused events keep accepting joins but admit nobody.
    pub paused: bool,
    /// When false, joins are refused with `409 EVENT_CLOSED` (the sale has not opened or is over).
    pub accept_joins: bool,
    pub target_url: Option<String>,
    /// HS256 secret the booking site signs user tokens with. Stored, never answered by any
    /// read (the HTTP bodies say `user_token_secret_set` instead).
    #[serde(default)]
    pub user_token_secret: Option<String>,
    /// Ed25519 public key (PEM) that verifies the booking site's user tokens.
    #[serde(default)]
    pub user_token_public_key: Option<String>,
    /// When true, a join must carry a valid user token (or the server key).
    #[serde(default)]
    pub require_user_token: bool,
    /// Who may join: anyone, or only holders of an invite code.
    #[serde(default)]
    pub access: Access,
    /// Leading zero bits of the proof of work each join must bring; 0: none. Defaulted so
    /// that settings stored before it existed still read.
    #[serde(default)]
    pub pow_difficulty: u32,
    /// Join attempts per second (on one node) above which new challenges ask one more bit
    /// per doubling, up to [`MAX_POW_BITS`]; `None`: the difficulty never rises by itself.
    #[serde(default)]
    pub pow_auto_above: Option<u32>,
    /// Per-client limits of this event over the server-wide ones; `None`: the server's.
    /// Boxed: rarely set, and configs travel inside journal records.
    #[serde(default)]
    pub rate_limits: Option<Box<RateLimits>>,
    /// When the sale opens (RFC 3339 in the JSON); joins before it wait in the pre-queue
    /// (`core::schedule`). `None`: open already.
    #[serde(default, with = "opt_rfc3339")]
    pub opens_at: Option<u64>,
    /// How waiting places are let in.
    #[serde(default)]
    pub queueing_method: QueueingMethod,
    /// The event's secret behind the shuffle seed and the lottery; made when `opens_at` or
    /// the `random` method first needs it, then kept. Stored, never answered by any read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_secret: Option<EventSecret>,
    /// The `opens_at` (ms) that a clock has reached: recorded by the first operation whose
    /// `now` is at or past it, so that the opening stays reached for every node and across
    /// restarts, even where the clock is behind it (a node whose clock lags, or this one's
    /// after a step back). Only of the current `opens_at`: a new one is ahead until reached
    /// in turn. Stored, never answered by any read; absent in settings stored before it
    /// existed, which read as before (reached by the clock alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opening_reached: Option<Millis>,
    /// When the sale ends by itself (ms; `core::lifecycle`): joins refused, waiting places
    /// ended. Set in RFC 3339 through the API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closes_at: Option<Millis>,
    /// When an operation first found the sale over by `closes_at` (ms; `None`: none did
    /// yet): the store's record that the sale ended by time, kept with the event's queue
    /// (`EventQueue::note_end`; on Redis the meta's `seen`) and answered by its reads. It
    /// counts as a clock at least that late in [`Self::sale_ended`], so that every node
    /// (whose clock may be behind the one that saw the end) and every rule agrees the sale
    /// is over once one operation found it so. A record of a `closes_at` since moved later
    /// is before it, and so ends nothing. Never answered by a read. The embedded store
    /// keeps it with the settings, so that the sale stays over across a restart whose clock
    /// is behind the end (as `opening_reached`); Redis keeps it in the meta's `seen`, which
    /// its reads put here whatever the stored settings say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_seen_at: Option<Millis>,
    /// The sale was ended by the admin's `end` call (never by a settings write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<SaleEnd>,
    /// The latest announcement to everyone waiting (its own admin call, not a setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announcement: Option<Announcement>,
    /// The waiting page's title, texts, colour, logo and stylesheet (`core::look`); flat
    /// in the JSON, beside the other settings.
    #[serde(flatten)]
    pub look: Look,
    /// The requests the event gates in front of a site (gateway mode, `GET /api/v1/gate`):
    /// `paths`, `hosts`, `bypass_paths`, `bypass_cidrs`, `bypass_secret` (`core::gate`);
    /// flat in the JSON.
    #[serde(flatten)]
    pub gate: GateRules,
    /// How long a seat hold lasts (`core::holds`).
    #[serde(default = "super::holds::default_hold_ttl_sec")]
    pub hold_ttl_sec: u32,
    /// Most items one session holds at once.
    #[serde(default = "super::holds::default_max_holds_per_session")]
    pub max_holds_per_session: u32,
    /// What one `session/extend` adds to a session's maximum.
    #[serde(default = "super::holds::default_session_extend_sec")]
    pub session_extend_sec: u32,
    /// How many times a session may be extended; 0: never.
    #[serde(default)]
    pub max_extensions: u32,
}

/// Who may join an event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    #[default]
    Public,
    /// A join needs an invite code (`POST /admin/events/{id}/invites`); each seats one person.
    Invite,
}

/// Shortest accepted `user_token_secret`, in bytes: 256 bits, as HS256 wants.
pub const MIN_USER_TOKEN_SECRET_BYTES: usize = 32;

/// Per-event overrides of the per-client limits (API.md "Per-client limits"); an absent
/// field keeps the server-wide value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joins_per_minute: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub polls_per_second: Option<u32>,
}

/// Upper bound of each per-event limit.
pub const MAX_RATE: u32 = 100_000_000;

impl Default for EventConfig {
    fn default() -> Self {
        EventConfig {
            name: String::new(),
            max_active: 100,
            overbooking_ratio: 1.0,
            admit_per_minute: None,
            ready_ttl_sec: 60,
            session_idle_sec: 120,
            session_max_sec: 600,
            waiting_idle_sec: 300,
            max_queue_length: None,
            paused: false,
            accept_joins: true,
            target_url: None,
            user_token_secret: None,
            user_token_public_key: None,
            require_user_token: false,
            access: Access::Public,
            pow_difficulty: 0,
            pow_auto_above: None,
            rate_limits: None,
            opens_at: None,
            queueing_method: QueueingMethod::Fifo,
            event_secret: None,
            opening_reached: None,
            closes_at: None,
            end_seen_at: None,
            ended: None,
            announcement: None,
            look: Look::default(),
            gate: GateRules::default(),
            hold_ttl_sec: super::holds::DEFAULT_HOLD_TTL_SEC,
            max_holds_per_session: super::holds::DEFAULT_MAX_HOLDS_PER_SESSION,
            session_extend_sec: super::holds::DEFAULT_SESSION_EXTEND_SEC,
            max_extensions: super::holds::DEFAULT_MAX_EXTENSIONS,
        }
    }
}

/// The scale of the ratios [`EventConfig::capacity`] multiplies without formatting them:
/// those of at most 6 decimals.
const RATIO_SCALE: f64 = 1e6;

/// floor(`m` × `r`), with `r` read as the shortest decimal that is this `f64` (what a JSON
/// `1.15` was written as, and what a stored `1.2100000000000002` is sent back as), in
/// integers. Its digits are those `{:e}` prints (up to 17 of them; the same form
/// [`names_its_double`] accepts), formatted on the stack: `capacity` runs on every
/// admission check (and comes here only for a ratio of more than 6 decimals whose product
/// lies next to an integer). `None` only for a ratio out of any sane range.
fn decimal_product_floor(m: u32, r: f64) -> Option<u64> {
    use std::fmt::Write;
    let mut text = StackText::default();
    write!(text, "{r:e}").ok()?;
    let (mantissa, exp) = text.as_str().split_once('e')?;
    let exp: i32 = exp.parse().ok()?;
    // r = digits × 10^(exp − fraction digits); digits < 10^17, times m < 2^32: in a u128.
    let (mut digits, mut fraction, mut point) = (0u128, 0i32, false);
    for b in mantissa.bytes() {
        match b {
            b'0'..=b'9' => {
                digits = digits * 10 + u128::from(b - b'0');
                fraction += i32::from(point);
            }
            b'.' => point = true,
            _ => return None,
        }
    }
    let product = u128::from(m) * digits;
    let shift = exp - fraction;
    let floor = if shift >= 0 {
        product.checked_mul(10u128.checked_pow(shift.unsigned_abs())?)?
    } else {
        product / 10u128.checked_pow(shift.unsigned_abs())?
    };
    u64::try_from(floor).ok()
}

/// A float's `{:e}` text without a heap allocation: the longest, `-1.2345678901234567e-308`,
/// is 24 bytes.
#[derive(Default)]
struct StackText {
    bytes: [u8; 32],
    len: usize,
}

impl StackText {
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

impl std::fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        self.bytes
            .get_mut(self.len..end)
            .ok_or(std::fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

impl EventConfig {
    /// floor(`max_active` × `overbooking_ratio`): admitted + active never exceed it.
    pub fn capacity(&self) -> u64 {
        let m = self.max_active;
        let r = self.overbooking_ratio;
        if r == 1.0 {
            return u64::from(m.max(1));
        }
        // A ratio whose shortest decimal has at most 6 decimals (2, 1.15, 1.125: what an
        // operator writes) is multiplied as that decimal without writing it out. Its
        // decimal is d / 10^6 for the whole d nearest r × 10^6 (off by under 1e-8 there),
        // and a ratio is one of these exactly when d / 10^6 (one correctly rounded division
        // of two exact numbers) gives r back: distinct decimals of at most 15 digits are
        // distinct `f64`s, so none other of them is r. Then m × d < 2^56.
        if (1.0..=10.0).contains(&r) {
            let d = (r * RATIO_SCALE).round();
            if d / RATIO_SCALE == r {
                return (u64::from(m) * d as u64 / RATIO_SCALE as u64).max(1);
            }
        }
        let p = f64::from(m) * r;
        let f = p.floor();
        // The ratio is validated into [1, 10], so this is within u64 and ≥ max_active.
        // The product in floating point is off by under 1e-4 (m < 2^32, r ≤ 10: the
        // ratio's own rounding times m, plus the product's), so its floor is the floor of
        // the exact product unless it lies that close to an integer: 3 × 1.3333333333333333
        // (3.9999999999999999) is 4.0. Then the ratio is taken as the decimal it was
        // written as.
        if p - f < 1e-4 || f + 1.0 - p < 1e-4 {
            decimal_product_floor(m, r).unwrap_or(f as u64).max(1)
        } else {
            (f as u64).max(1)
        }
    }

    /// Whether the sale ended by `now` (`core::lifecycle`), counting an end by `closes_at`
    /// that an operation already found ([`Self::end_seen_at`]), whatever `now` says.
    pub fn sale_ended(&self, now: Millis) -> Option<Ended<'_>> {
        let now = now.max(self.end_seen_at.unwrap_or(0));
        lifecycle::sale_ended(self.ended.as_ref(), self.closes_at, now)
    }

    /// `opens_at` while the opening is still ahead at `now`: by this clock, and not
    /// recorded as reached by an earlier operation (on any node). `None` once the sale is
    /// open: then nobody joins the pre-queue, and its seed is published.
    pub fn opening_ahead(&self, now: Millis) -> Option<Millis> {
        self.opens_at
            .filter(|&t| now < t && self.opening_reached != Some(t))
    }

    /// The store's records kept with the settings: the opening reached and the end by
    /// `closes_at` found (`opening_reached`, `end_seen_at`). An operation that changed them
    /// has the settings written.
    pub fn records(&self) -> (Option<Millis>, Option<Millis>) {
        (self.opening_reached, self.end_seen_at)
    }

    /// Records the opening once `now` reaches it; answers whether this recorded it (the
    /// settings changed and must be stored).
    pub fn note_opening(&mut self, now: Millis) -> bool {
        match self.opens_at {
            Some(t) if now >= t && self.opening_reached != Some(t) => {
                self.opening_reached = Some(t);
                true
            }
            _ => false,
        }
    }
}

/// A partial update. Absent fields keep their value; for the nullable fields an explicit
/// `null` clears them, which is why they are `Option<Option<_>>`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EventPatch {
    /// Accepted so a body may name its event; must match the path when given.
    #[serde(default, deserialize_with = "present")]
    pub event_id: Option<String>,
    #[serde(default, deserialize_with = "present")]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "present")]
    pub max_active: Option<u64>,
    #[serde(default, deserialize_with = "written_ratio")]
    pub overbooking_ratio: Option<f64>,
    #[serde(default, deserialize_with = "nullable")]
    pub admit_per_minute: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    pub ready_ttl_sec: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    pub session_idle_sec: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    pub session_max_sec: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    pub waiting_idle_sec: Option<u64>,
    #[serde(default, deserialize_with = "nullable")]
    pub max_queue_length: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    pub paused: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    pub accept_joins: Option<bool>,
    #[serde(default, deserialize_with = "nullable")]
    pub target_url: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    pub user_token_secret: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    pub user_token_public_key: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    pub require_user_token: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    pub access: Option<Access>,
    #[serde(default, deserialize_with = "present")]
    pub pow_difficulty: Option<u64>,
    #[serde(default, deserialize_with = "nullable")]
    pub pow_auto_above: Option<Option<u64>>,
    #[serde(default, deserialize_with = "nullable_object")]
    pub rate_limits: Option<Option<RateLimits>>,
    /// RFC 3339; `null` clears it.
    #[serde(default, deserialize_with = "nullable")]
    pub opens_at: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    pub queueing_method: Option<QueueingMethod>,
    /// The event's secret if it needs one and has none yet; never read from a body. The
    /// admin API leaves it empty (a fresh random one is made); tests pass their own so that
    /// their shuffles are reproducible.
    #[serde(skip)]
    pub fresh_secret: Option<[u8; 32]>,
    // The look and words, checked in `core::look`.
    #[serde(default, deserialize_with = "nullable_object")]
    pub title: Option<Option<Texts>>,
    #[serde(default, deserialize_with = "nullable_object")]
    pub headline: Option<Option<Texts>>,
    #[serde(default, deserialize_with = "nullable_object")]
    pub note: Option<Option<Texts>>,
    #[serde(default, deserialize_with = "nullable_object")]
    pub turn_message: Option<Option<Texts>>,
    #[serde(default, deserialize_with = "nullable")]
    pub theme_color: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    pub logo_url: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    pub stylesheet: Option<Option<String>>,
    // The gate rules, checked in `core::gate`.
    #[serde(default, deserialize_with = "present")]
    pub paths: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    pub hosts: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    pub bypass_paths: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    pub bypass_cidrs: Option<Vec<String>>,
    #[serde(default, deserialize_with = "nullable")]
    pub bypass_secret: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    pub hold_ttl_sec: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    pub max_holds_per_session: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    pub session_extend_sec: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    pub max_extensions: Option<u64>,
    /// RFC 3339; `null` clears it.
    #[serde(default, deserialize_with = "nullable")]
    pub closes_at: Option<Option<String>>,
    /// Ends the sale (the admin's `end` call): never read from a settings body.
    #[serde(skip)]
    pub end: Option<SaleEnd>,
    /// Posts (`Some(Some)`) or clears (`Some(None)`) the announcement: never read from a
    /// settings body.
    #[serde(skip)]
    pub announcement: Option<Option<Announcement>>,
}

/// Distinguishes "field absent" (outer `None`, via `#[serde(default)]`) from "field is null"
/// (`Some(None)`).
fn nullable<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// A field that may be left out but is never `null` (only the nullable fields clear with
/// `null`): `Option`'s own reader would take `null` as "left out" and answer `200` for a
/// value of the wrong type.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// Most significant digits of a written `overbooking_ratio`. Distinct decimals of 15
/// digits are distinct `f64`s, in the same order, so such a ratio is stored as the decimal
/// written: the range check and [`EventConfig::capacity`] are exact for it. serde_json reads
/// a longer one as the nearest `f64`, silently: `0.99999999999999999999` would be `1.0` and
/// pass the check, `1.9999999999999999999` would be `2.0` in the capacity.
pub const MAX_RATIO_DIGITS: usize = 15;

/// `overbooking_ratio`, refused past [`MAX_RATIO_DIGITS`] significant digits: the number's
/// text is read (serde_json's raw value), as its `f64` alone cannot tell. Formats that are
/// not human-readable are read as they are.
fn written_ratio<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    use serde::de::Error;
    use serde_json::Value;
    if !d.is_human_readable() {
        return f64::deserialize(d).map(Some);
    }
    let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
    let text = raw.get();
    let unexpected = match serde_json::from_str::<Value>(text).map_err(D::Error::custom)? {
        Value::Number(n) => {
            // Read by the standard library, which rounds correctly: serde_json's own reading
            // of a long decimal may land a unit off, and then a double's own shortest form
            // (`1.9999999999999998`) did not name the double read and was refused.
            let exact = text.trim().parse::<f64>().ok().or(n.as_f64());
            let names_a_double = exact.is_some_and(|f| names_its_double(text, f));
            if significant_digits(text) > MAX_RATIO_DIGITS && !names_a_double {
                let expected = format!("a number of at most {MAX_RATIO_DIGITS} significant digits");
                return Err(D::Error::invalid_value(
                    Unexpected::Other(text),
                    &expected.as_str(),
                ));
            }
            return exact
                .map(Some)
                .ok_or_else(|| D::Error::invalid_type(Unexpected::Other(text), &"a number"));
        }
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(b),
        Value::String(s) => return Err(D::Error::invalid_type(Unexpected::Str(&s), &"a number")),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    };
    Err(D::Error::invalid_type(unexpected, &"a number"))
}

/// Whether `text` is the shortest decimal that reads back as `f` (what JavaScript and Rust
/// print for a double): then the decimal written is exactly that double's, whatever its
/// digits. A ratio stored earlier (or computed, `1.1 * 1.1` = `1.2100000000000002`) comes
/// back from the admin form in that form, and must not be refused as rounded.
fn names_its_double(text: &str, f: f64) -> bool {
    decimal_parts(text) == decimal_parts(&format!("{f:e}"))
}

/// A decimal's significant digits (no leading or trailing zeros) and the power of ten of
/// the first: `0.0150e3` and `15` both `("15", 2)`.
fn decimal_parts(number: &str) -> (String, i64) {
    let (mantissa, exp) = match number.find(['e', 'E']) {
        Some(i) => (&number[..i], number[i + 1..].parse::<i64>().unwrap_or(0)),
        None => (number, 0),
    };
    let mantissa = mantissa.trim_start_matches('-');
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = format!("{int}{frac}");
    let lead = all.len() - all.trim_start_matches('0').len();
    let digits = all.trim_matches('0').to_string();
    (digits, int.len() as i64 - lead as i64 + exp)
}

/// The significant digits of a JSON number's text: its digits before any exponent, without
/// the leading and trailing zeros (`0.0150e3`: 2).
fn significant_digits(number: &str) -> usize {
    let mantissa = number.split(['e', 'E']).next().unwrap_or_default();
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    digits.trim_matches('0').len()
}

/// [`nullable`] for a nested object ([`optional_object`]).
fn nullable_object<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    optional_object(d).map(Some)
}

/// A nested struct read from a JSON object only. serde's derived reader of a struct takes
/// an array too, field by field in order: `"rate_limits": [7, 3]` would set both limits,
/// `"title": ["x"]` would be a Korean title, and `"note": []` (every field absent) would
/// clear the note. The contract takes objects. Formats that are not human-readable (the
/// stores' postcard) are read as they are.
pub fn object<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    if !d.is_human_readable() {
        return T::deserialize(d);
    }
    json_object(serde_json::Value::deserialize(d)?)?
        .ok_or_else(|| serde::de::Error::invalid_type(Unexpected::Unit, &OBJECT))
}

/// [`object`] for an optional field: `null` is `None`.
pub fn optional_object<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    if !d.is_human_readable() {
        return Option::<T>::deserialize(d);
    }
    json_object(serde_json::Value::deserialize(d)?)
}

/// `T` from a JSON object; `None` from `null`; anything else refused.
fn json_object<'de, T: Deserialize<'de>, E: serde::de::Error>(
    v: serde_json::Value,
) -> Result<Option<T>, E> {
    use serde_json::Value;
    let unexpected = match v {
        Value::Null => return Ok(None),
        Value::Object(map) => {
            return T::deserialize(Value::Object(map))
                .map(Some)
                .map_err(E::custom)
        }
        Value::Array(_) => Unexpected::Seq,
        Value::Bool(b) => Unexpected::Bool(b),
        Value::Number(_) => Unexpected::Other("number"),
        Value::String(_) => Unexpected::Other("string"),
    };
    Err(E::invalid_type(unexpected, &OBJECT))
}

const OBJECT: &str = "a JSON object";

fn bad(msg: impl Into<String>) -> QueueError {
    QueueError::Invalid(msg.into())
}

fn count(field: &str, v: u64, min: u64) -> Result<u32, QueueError> {
    if v < min || v > MAX_COUNT {
        return Err(bad(format!(
            "{field} must be between {min} and {MAX_COUNT}"
        )));
    }
    Ok(v as u32)
}

fn seconds(field: &str, v: u64) -> Result<u32, QueueError> {
    if !(1..=MAX_SECONDS).contains(&v) {
        return Err(bad(format!("{field} must be between 1 and {MAX_SECONDS}")));
    }
    Ok(v as u32)
}

/// Refuses a sale that would end before it opens: `closes_at` at or before `opens_at`,
/// both set (pre-queue places would be ended `closed` before the opening ever came). Only
/// when this change moves one of them: a pair stored before the rule, sent back unchanged
/// (the admin form sends every field), keeps the event's other settings changeable.
fn schedule_in_order(base: &EventConfig, c: &EventConfig) -> Result<(), QueueError> {
    match (c.opens_at, c.closes_at) {
        (Some(opens), Some(closes))
            if closes <= opens && (base.opens_at, base.closes_at) != (c.opens_at, c.closes_at) =>
        {
            Err(bad(format!(
                "closes_at ({}) must be later than opens_at ({}): the sale would end before it opens",
                lifecycle::format_rfc3339(closes),
                lifecycle::format_rfc3339(opens)
            )))
        }
        _ => Ok(()),
    }
}

/// Checks an event id against `[A-Za-z0-9._-]{1,64}`, not only dots. Ids appear in URL
/// paths (`/wait/{id}`, `/api/v1/events/{id}`), where `.` and `..` are dot segments that
/// browsers and proxies resolve away, so such an event could not be reached (or would
/// reach another route); `...` and longer are refused alike. The other characters are
/// plain in paths, queries, store keys and Redis key names.
pub fn validate_event_id(id: &str) -> Result<(), QueueError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_EVENT_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !id.bytes().all(|b| b == b'.');
    if ok {
        Ok(())
    } else {
        Err(bad(
            "event_id must be 1-64 characters of [A-Za-z0-9._-], not only dots",
        ))
    }
}

/// Whether an `http(s)://` URL names a host right after the `//`, with a port of 1–65535
/// if it has one: everyone admitted is sent there. The URL parser reads `http:///x` as the
/// host `x`, which is not what was written; it refuses an empty host or port 99999, but
/// takes port 0.
fn names_a_host(u: &str) -> bool {
    let rest = u
        .strip_prefix("https://")
        .or_else(|| u.strip_prefix("http://"));
    // No user or password: the URL is shown to everyone (the public event read, the
    // pages).
    rest.is_some_and(|rest| !rest.starts_with('/'))
        && url::Url::parse(u).is_ok_and(|p| {
            p.host_str().is_some_and(|h| !h.is_empty())
                && p.port() != Some(0)
                && p.username().is_empty()
                && p.password().is_none()
        })
}

impl EventPatch {
    /// Applies the patch on top of `base` (the stored config, or the defaults for a new
    /// event) at `now` and validates the result as a whole.
    pub fn apply(
        &self,
        event_id: &str,
        base: &EventConfig,
        now: Millis,
    ) -> Result<EventConfig, QueueError> {
        validate_event_id(event_id)?;
        if let Some(id) = &self.event_id {
            if id != event_id {
                return Err(bad("event_id in the body does not match the path"));
            }
        }
        let mut c = base.clone();
        if let Some(n) = &self.name {
            if n.chars().count() > 200 {
                return Err(bad("name must be at most 200 characters"));
            }
            // Shown on the waiting pages and in the admin's lists, as every other text.
            // A name stored before this check is let through unchanged: the admin form
            // sends every field back, and must still save the event's other settings.
            if *n != base.name && n.chars().any(char::is_control) {
                return Err(bad("name must not contain control characters"));
            }
            c.name = n.clone();
        }
        if let Some(v) = self.max_active {
            c.max_active = count("max_active", v, 1)?;
        }
        if let Some(r) = self.overbooking_ratio {
            if !(1.0..=10.0).contains(&r) {
                return Err(bad("overbooking_ratio must be between 1 and 10"));
            }
            c.overbooking_ratio = r;
        }
        if let Some(v) = self.admit_per_minute {
            c.admit_per_minute = v.map(|v| count("admit_per_minute", v, 1)).transpose()?;
        }
        if let Some(v) = self.ready_ttl_sec {
            c.ready_ttl_sec = seconds("ready_ttl_sec", v)?;
        }
        if let Some(v) = self.session_idle_sec {
            c.session_idle_sec = seconds("session_idle_sec", v)?;
        }
        if let Some(v) = self.session_max_sec {
            c.session_max_sec = seconds("session_max_sec", v)?;
        }
        if let Some(v) = self.waiting_idle_sec {
            // A shorter period stored before this bound is let through when sent back
            // unchanged (the admin form sends every field), as a stored name is.
            if v < MIN_WAITING_IDLE_SEC && v != u64::from(base.waiting_idle_sec) {
                return Err(bad(format!(
                    "waiting_idle_sec must be between {MIN_WAITING_IDLE_SEC} and {MAX_SECONDS} \
                     (a waiting place is told to poll every third of it, and 1 s apart at least)"
                )));
            }
            c.waiting_idle_sec = seconds("waiting_idle_sec", v)?;
        }
        if let Some(v) = self.max_queue_length {
            c.max_queue_length = v.map(|v| count("max_queue_length", v, 1)).transpose()?;
        }
        if let Some(p) = self.paused {
            c.paused = p;
        }
        if let Some(a) = self.accept_joins {
            c.accept_joins = a;
        }
        if let Some(u) = &self.target_url {
            // One stored before a rule it breaks (a user and password in it) is let through
            // unchanged, as a stored name is: the admin form sends every field back.
            let stored = *u == base.target_url;
            if let Some(u) = u.as_ref().filter(|_| !stored) {
                // A path must stay on this host: `//host` and `/\host` are read by browsers
                // as another host, which would hand the access token to a stranger.
                let path_ok = u.starts_with('/') && !u.starts_with("//") && !u.starts_with("/\\");
                let scheme_ok = u.starts_with("https://") || u.starts_with("http://") || path_ok;
                let clean = !u
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || c == '\\');
                if !scheme_ok || u.len() > 2048 || !clean || !(path_ok || names_a_host(u)) {
                    return Err(bad(
                        "target_url must be an http(s) URL with a host (and a port of 1-65535, if any; no user or password) or an absolute path, at most 2048 characters",
                    ));
                }
            }
            c.target_url = u.clone();
        }
        self.apply_trust(&mut c)?;
        self.apply_look(&mut c.look)?;
        self.apply_gate(&mut c.gate)?;
        self.apply_sale(&mut c)?;
        if let Some(b) = self.pow_difficulty {
            if b > MAX_POW_BITS {
                return Err(bad(format!(
                    "pow_difficulty must be between 0 and {MAX_POW_BITS}"
                )));
            }
            c.pow_difficulty = b as u32;
        }
        if let Some(v) = self.pow_auto_above {
            c.pow_auto_above = v.map(|v| count("pow_auto_above", v, 1)).transpose()?;
        }
        if let Some(r) = self.rate_limits {
            for (field, v) in [
                ("joins_per_minute", r.and_then(|r| r.joins_per_minute)),
                ("polls_per_second", r.and_then(|r| r.polls_per_second)),
            ] {
                if v.is_some_and(|v| !(1..=MAX_RATE).contains(&v)) {
                    return Err(bad(format!(
                        "rate_limits.{field} must be between 1 and {MAX_RATE}"
                    )));
                }
            }
            c.rate_limits = r.filter(|r| *r != RateLimits::default()).map(Box::new);
        }
        self.apply_schedule(&mut c, now)?;
        if let Some(t) = &self.closes_at {
            c.closes_at = t
                .as_deref()
                .map(|t| lifecycle::parse_rfc3339("closes_at", t))
                .transpose()?;
        }
        schedule_in_order(base, &c)?;
        if let Some(e) = &self.end {
            // A second end keeps the moment of the first: the places already ended then. So
            // does an end after `closes_at` was reached (by the settings before this patch:
            // by this clock, or as an operation found it, on any node).
            let at = base.sale_ended(now).map_or(e.at, |before| before.at);
            c.ended = Some(SaleEnd { at, ..e.clone() });
        }
        if let Some(a) = &self.announcement {
            c.announcement = a.clone();
        }
        if c.name.is_empty() {
            c.name = event_id.to_string();
        }
        Ok(c)
    }

    /// The gate rules, checked as a whole.
    fn apply_gate(&self, g: &mut GateRules) -> Result<(), QueueError> {
        let stored = g.hosts.clone();
        for (to, from) in [
            (&mut g.paths, &self.paths),
            (&mut g.hosts, &self.hosts),
            (&mut g.bypass_paths, &self.bypass_paths),
            (&mut g.bypass_cidrs, &self.bypass_cidrs),
        ] {
            if let Some(v) = from {
                v.clone_into(to);
            }
        }
        if let Some(s) = &self.bypass_secret {
            g.bypass_secret = s.clone();
        }
        g.validate_keeping(&stored)
    }

    /// `opens_at` and `queueing_method`, and the secret they need.
    fn apply_schedule(&self, c: &mut EventConfig, now: Millis) -> Result<(), QueueError> {
        // Ahead by this clock and not recorded as reached: an opening another node (or this
        // one, before its clock stepped back) reached is no longer ahead.
        let was_ahead = c.opening_ahead(now).is_some();
        if let Some(t) = &self.opens_at {
            c.opens_at = match t {
                None => None,
                Some(s) => Some(parse_rfc3339(s).ok_or_else(
                    || {
                        bad("opens_at must be an RFC 3339 date-time (e.g. 2026-12-01T10:00:00+09:00) between 1970 and 9999")
                    },
                )?),
            };
        }
        if let Some(m) = self.queueing_method {
            c.queueing_method = m;
        }
        let needs = c.opens_at.is_some() || c.queueing_method == QueueingMethod::Random;
        // The record is of one opening: a new `opens_at` is reached only by a clock (this
        // change's, if it is already past) or a record of its own.
        if c.opening_reached != c.opens_at {
            c.opening_reached = None;
        }
        c.note_opening(now);
        // A new pre-queue (an opening ahead where none was, or where the old one was
        // reached, if only by another node's clock) gets a new secret: the old one's seed
        // may be published already, and with it every key of the new pre-queue could be
        // computed before joining, so a bot could keep the place that will come first.
        // Only with nobody waiting: otherwise such a change is refused
        // (`schedule_change_allowed`), and a postponed opening keeps its commitment.
        let new_prequeue = c.opening_ahead(now).is_some() && !was_ahead;
        if (needs && c.event_secret.is_none()) || (new_prequeue && c.event_secret.is_some()) {
            c.event_secret = Some(
                self.fresh_secret
                    .map_or_else(EventSecret::random, EventSecret),
            );
        }
        Ok(())
    }

    /// The identity and access settings.
    fn apply_trust(&self, c: &mut EventConfig) -> Result<(), QueueError> {
        if let Some(s) = &self.user_token_secret {
            if s.as_ref()
                .is_some_and(|s| s.len() < MIN_USER_TOKEN_SECRET_BYTES)
            {
                return Err(bad(format!(
                    "user_token_secret must be at least {MIN_USER_TOKEN_SECRET_BYTES} bytes"
                )));
            }
            c.user_token_secret = s.clone();
        }
        if let Some(k) = &self.user_token_public_key {
            if let Some(pem) = k {
                use ed25519_dalek::pkcs8::DecodePublicKey;
                if ed25519_dalek::VerifyingKey::from_public_key_pem(pem.trim()).is_err() {
                    return Err(bad(
                        "user_token_public_key must be an Ed25519 public key in PEM (SPKI)",
                    ));
                }
            }
            c.user_token_public_key = k.clone();
        }
        if let Some(r) = self.require_user_token {
            c.require_user_token = r;
        }
        if let Some(a) = self.access {
            c.access = a;
        }
        if c.require_user_token
            && c.user_token_secret.is_none()
            && c.user_token_public_key.is_none()
        {
            return Err(bad(
                "require_user_token needs user_token_secret or user_token_public_key",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
