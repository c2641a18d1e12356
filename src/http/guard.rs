//! Per-client limits and the live-stream cap: who the client is, and whether it may go on.
//!
//! - **The client** is the peer address, or, when the peer is a trusted proxy
//!   (`--trusted-proxies`), the first untrusted address of the one header the proxies
//!   write (`--forwarded-header`: `X-Forwarded-For` or `Forwarded`; the other is ignored,
//!   as a client may send it), walking from the right: the rightmost entries were written
//!   by our own proxies, the leftmost by whoever sent the request, so only the first one a
//!   trusted proxy vouches for counts. IPv6 clients are keyed by their /64 (one subscriber's usual
//!   allocation), so cycling addresses inside it does not escape a limit. A request that
//!   carries no peer address (a router driven in-process, without a server) is not limited.
//! - **The limits** are keyed GCRA buckets (`governor`): joins per client per event, polls
//!   per place, wrong admin tokens per client. Each answers `429 RATE_LIMITED` with
//!   `Retry-After` and the `RateLimit` / `RateLimit-Policy` headers
//!   (draft-ietf-httpapi-ratelimit-headers). Events may override the first two; the
//!   override is read from [`EventCatalog`], this node's copy, never from the store.
//! - **Memory** is bounded: each limiter tracks at most `max_tracked` keys; past it, new
//!   keys share one overflow bucket until a sweep (at most once a second while full, and
//!   every [`SWEEP_EVERY`] checks anyway) drops the keys whose buckets are full again.
//!   Failing closed keeps memory bounded and lets no one escape a limit; to make filling
//!   the table costly, join keys are made only for events that exist (a made-up event id
//!   would otherwise be a free new key).
//! - **Live streams**: at most [`MAX_STREAMS_PER_PLACE`] WebSocket + SSE streams per place.
//!
//! Limits are per node: on Redis, a client spread over N nodes gets up to N times a limit
//! (exactly once with a load balancer that is sticky per client address).

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash};
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use axum::extract::{ConnectInfo, FromRef, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue};
use governor::clock::{Clock as _, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::{DashMapStateStore, ShrinkableKeyedStateStore};
use governor::state::StateStore;
use governor::{Quota, RateLimiter};
use parking_lot::Mutex;

use super::error::AppError;
use crate::catalog::EventCatalog;
use crate::config::guard::canonical;
use crate::config::{ForwardedHeader, RateLimitSettings};
use crate::core::{EventConfig, Millis, PlaceKey};

/// Most live streams (WebSocket and SSE together) open at once for one place: a few tabs
/// and devices of one person, not a bot's thousands.
pub const MAX_STREAMS_PER_PLACE: u32 = 16;
/// Checks between two sweeps of a limiter's idle keys.
pub const SWEEP_EVERY: u64 = 1 << 14;
/// The key every client past the cap shares.
const OVERFLOW: u64 = u64::MAX;

/// One limit as the `RateLimit-Policy` header names it: `q` units per `w` seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub name: &'static str,
    pub quota: u32,
    pub window_sec: u32,
}

/// A refused request: which policy, and when to come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub policy: Policy,
    pub retry_after_sec: u64,
}

impl Refusal {
    /// `RateLimit-Policy: "join";q=30;w=60` and `RateLimit: "join";r=0;t=2`.
    pub fn write_headers(&self, headers: &mut HeaderMap) {
        let p = self.policy;
        let policy = format!("\"{}\";q={};w={}", p.name, p.quota, p.window_sec);
        let now = format!("\"{}\";r=0;t={}", p.name, self.retry_after_sec);
        for (name, value) in [("ratelimit-policy", policy), ("ratelimit", now)] {
            if let Ok(v) = HeaderValue::from_str(&value) {
                headers.insert(name, v);
            }
        }
    }
}

/// The hasher of the limiters' maps: a key passes through as its own hash.
///
/// Every key is already the output of a keyed hash ([`Guard::check`] hashes the client or
/// place with SipHash under the process's random `RandomState` key), so hashing it a
/// second time with SipHash (the maps' default) only cost instructions on every check.
/// This stays safe against hash flooding: an attacker who cannot learn the process's
/// secret SipHash key cannot choose inputs whose keys share buckets, in the map's low bits
/// or in DashMap's shard bits, any better than by chance, and a uniformly spread key is
/// what the map would otherwise compute from it.
#[derive(Clone, Copy, Default)]
struct KeyedAlready(u64);

impl std::hash::Hasher for KeyedAlready {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here (through `write_u64`); the trait needs this for
        // any other input, which is folded in rather than dropped.
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
}

type PassThrough = BuildHasherDefault<KeyedAlready>;

/// A limiter's state: governor's DashMap store with a cap on the number of keys.
struct Capped {
    map: DashMapStateStore<u64, PassThrough>,
    cap: usize,
    /// Set when a new key was sent to the overflow bucket: the next check sweeps.
    full: Arc<AtomicBool>,
}

impl StateStore for Capped {
    type Key = u64;

    fn measure_and_replace<T, F, E>(&self, key: &u64, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        let key = if self.map.contains_key(key) || self.map.len() < self.cap {
            key
        } else {
            self.full.store(true, Ordering::Relaxed);
            &OVERFLOW
        };
        self.map.measure_and_replace(key, f)
    }
}

impl ShrinkableKeyedStateStore<u64> for Capped {
    fn retain_recent(&self, drop_below: Nanos) {
        self.map.retain_recent(drop_below)
    }
    fn shrink_to_fit(&self) {
        ShrinkableKeyedStateStore::shrink_to_fit(&self.map)
    }
    fn len(&self) -> usize {
        self.map.len()
    }
    fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// One keyed limiter with its policy and sweep bookkeeping.
struct Limiter {
    limiter: RateLimiter<
        u64,
        Capped,
        DefaultClock,
        NoOpMiddleware<<DefaultClock as governor::clock::Clock>::Instant>,
    >,
    policy: Policy,
    checks: AtomicU64,
    last_sweep: Mutex<Instant>,
    /// Shared with the store (governor does not lend it back).
    full: Arc<AtomicBool>,
}

impl Limiter {
    /// A burst of `burst` that refills completely in `window`.
    fn new(
        name: &'static str,
        burst: u32,
        window_sec: u32,
        cap: usize,
        clock: &DefaultClock,
    ) -> Self {
        let burst_nz = NonZeroU32::new(burst.max(1)).expect("not zero");
        let period = Duration::from_secs(u64::from(window_sec)) / burst.max(1);
        let quota = Quota::with_period(period.max(Duration::from_nanos(1)))
            .expect("a positive period")
            .allow_burst(burst_nz);
        let full = Arc::new(AtomicBool::new(false));
        let store = Capped {
            map: DashMapStateStore::with_hasher(PassThrough::default()),
            cap: cap.max(1),
            full: full.clone(),
        };
        Limiter {
            limiter: RateLimiter::new(quota, store, clock.clone()),
            policy: Policy {
                name,
                quota: burst,
                window_sec,
            },
            checks: AtomicU64::new(0),
            last_sweep: Mutex::new(Instant::now()),
            full,
        }
    }

    fn check(&self, key: u64, clock: &DefaultClock) -> Result<(), Refusal> {
        let n = self.checks.fetch_add(1, Ordering::Relaxed);
        let full = self.limiter_full();
        if n % SWEEP_EVERY == SWEEP_EVERY - 1 || full {
            self.sweep(full);
        }
        self.limiter.check_key(&key).map_err(|not_until| {
            metrics::counter!(RATE_LIMITED, "limit" => self.policy.name).increment(1);
            let wait = not_until.wait_time_from(clock.now());
            Refusal {
                policy: self.policy,
                // Rounded up: a client that waits this long is let through.
                retry_after_sec: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
            }
        })
    }

    fn limiter_full(&self) -> bool {
        self.full.load(Ordering::Relaxed)
    }

    /// Drops keys whose buckets are full again; when full, at most once a second.
    fn sweep(&self, full: bool) {
        let mut last = self.last_sweep.lock();
        if full && last.elapsed() < Duration::from_secs(1) {
            return;
        }
        *last = Instant::now();
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
        self.full.store(false, Ordering::Relaxed);
    }
}

/// What the limits of one kind are keyed by, and their burst and window.
#[derive(Clone, Copy)]
enum Kind {
    Join,
    Poll,
    Admin,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Join, Kind::Poll, Kind::Admin];

    /// The limit's name: the `limit` label of [`RATE_LIMITED`], and the policy's name.
    fn name(self) -> &'static str {
        match self {
            Kind::Join => "join",
            Kind::Poll => "poll",
            Kind::Admin => "admin",
        }
    }

    /// (name, burst, window) for a rate `n` of this kind.
    fn shape(self, n: u32) -> (&'static str, u32, u32) {
        let (burst, window) = match self {
            Kind::Join | Kind::Admin => (n, 60),
            Kind::Poll => (n.saturating_mul(5), 5),
        };
        (self.name(), burst, window)
    }
}

/// The counter of the requests a limit refused (label `limit`: [`Kind::name`]).
const RATE_LIMITED: &str = "waitroom_rate_limited_total";
/// That counter's label for a live stream past [`MAX_STREAMS_PER_PLACE`].
const STREAMS: &str = "streams";

/// The limiters of one kind: one per distinct rate (the server's, and each event override).
struct Limiters {
    kind: Kind,
    /// Read by every request of every event, written once per new rate: an `ArcSwap`, so
    /// a check takes no lock shared by all events (a `Mutex` here was one).
    by_rate: ArcSwap<HashMap<u32, Arc<Limiter>>>,
    /// Serialises additions to `by_rate`.
    adding: Mutex<()>,
}

/// The per-client limits and the live-stream counts of one node.
pub struct Guard {
    settings: RateLimitSettings,
    clock: DefaultClock,
    hasher: std::hash::RandomState,
    joins: Limiters,
    polls: Limiters,
    admin: Limiters,
    streams: Mutex<HashMap<PlaceKey, u32>>,
}

impl Guard {
    pub fn new(settings: RateLimitSettings) -> Self {
        // Every limit's counter at zero from the start: a series that appears only at its
        // first refusal reads "no data" in `rate()` and in alerts until then.
        for kind in Kind::ALL {
            metrics::counter!(RATE_LIMITED, "limit" => kind.name()).increment(0);
        }
        metrics::counter!(RATE_LIMITED, "limit" => STREAMS).increment(0);
        let limiters = |kind| Limiters {
            kind,
            by_rate: ArcSwap::default(),
            adding: Mutex::new(()),
        };
        Guard {
            settings,
            clock: DefaultClock::default(),
            hasher: std::hash::RandomState::new(),
            joins: limiters(Kind::Join),
            polls: limiters(Kind::Poll),
            admin: limiters(Kind::Admin),
            streams: Mutex::new(HashMap::new()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.settings.enabled
    }

    /// Keys tracked by every limiter together (bounded by `max_tracked` per limiter).
    pub fn tracked(&self) -> usize {
        [&self.joins, &self.polls, &self.admin]
            .iter()
            .flat_map(|l| {
                l.by_rate
                    .load()
                    .values()
                    .map(|l| l.limiter.len())
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    fn check(&self, limiters: &Limiters, rate: u32, key: impl Hash) -> Result<(), Refusal> {
        let mut key = self.hasher.hash_one(key);
        if key == OVERFLOW {
            key = 0;
        }
        if let Some(limiter) = limiters.by_rate.load().get(&rate) {
            return limiter.check(key, &self.clock);
        }
        let limiter = {
            let _adding = limiters.adding.lock();
            let mut map = HashMap::clone(&limiters.by_rate.load());
            let limiter = map
                .entry(rate)
                .or_insert_with(|| {
                    let (name, burst, window) = limiters.kind.shape(rate);
                    Arc::new(Limiter::new(
                        name,
                        burst,
                        window,
                        self.settings.max_tracked,
                        &self.clock,
                    ))
                })
                .clone();
            limiters.by_rate.store(Arc::new(map));
            limiter
        };
        limiter.check(key, &self.clock)
    }

    /// A join by `client` to `event_id`. Only events that exist are keyed: made-up ids
    /// would otherwise fill the limiter (and push every newcomer into the overflow
    /// bucket); a join to an unknown event is answered `404` by the store anyway.
    pub async fn check_join(
        &self,
        events: &EventCatalog,
        now: Millis,
        client: Option<IpAddr>,
        event_id: &str,
    ) -> Result<(), AppError> {
        if client.filter(|_| self.enabled()).is_none() {
            return Ok(());
        }
        let Some(config) = events.config_if_reachable(event_id, now).await? else {
            return Ok(());
        };
        self.check_join_in(&config, client, event_id)
    }

    /// [`check_join`](Self::check_join) with the event's settings already read, for the
    /// join handler, which reads them anyway (one catalog lookup per join, not three).
    pub fn check_join_in(
        &self,
        config: &EventConfig,
        client: Option<IpAddr>,
        event_id: &str,
    ) -> Result<(), AppError> {
        let Some(ip) = client.filter(|_| self.enabled()) else {
            return Ok(());
        };
        let rate = config
            .rate_limits
            .as_deref()
            .and_then(|r| r.joins_per_minute)
            .unwrap_or(self.settings.joins_per_minute);
        Ok(self.check(&self.joins, rate, (event_id, client_key(ip)))?)
    }

    /// A poll of the place `key` (status, heartbeat, enter, live connect), whoever asks.
    pub async fn check_poll(
        &self,
        events: &EventCatalog,
        now: Millis,
        event_id: &str,
        key: PlaceKey,
    ) -> Result<(), AppError> {
        if !self.enabled() {
            return Ok(());
        }
        let config = events.config_if_reachable(event_id, now).await?;
        self.check_poll_in(config.as_deref(), event_id, key)
    }

    /// [`check_poll`](Self::check_poll) with the event's settings already read (`None`:
    /// unknown or unreadable, so the server's limit), for a handler that needs them too.
    pub fn check_poll_in(
        &self,
        config: Option<&EventConfig>,
        event_id: &str,
        key: PlaceKey,
    ) -> Result<(), AppError> {
        if !self.enabled() {
            return Ok(());
        }
        // The event's override; the server's limit when it has none or cannot be read.
        let rate = config
            .and_then(|c| c.rate_limits.as_deref())
            .and_then(|r| r.polls_per_second)
            .unwrap_or(self.settings.polls_per_second);
        Ok(self.check(&self.polls, rate, (event_id, key))?)
    }

    /// A wrong admin token from `client`; `Err` once it has tried too often.
    pub fn check_admin_failure(&self, client: Option<IpAddr>) -> Result<(), AppError> {
        let Some(ip) = client.filter(|_| self.enabled()) else {
            return Ok(());
        };
        let rate = self.settings.admin_failures_per_minute;
        Ok(self.check(&self.admin, rate, client_key(ip))?)
    }

    /// A slot for one more live stream of `key`, or `None` past [`MAX_STREAMS_PER_PLACE`].
    pub fn open_stream(self: &Arc<Self>, key: PlaceKey) -> Option<StreamPermit> {
        let mut streams = self.streams.lock();
        let n = streams.entry(key).or_insert(0);
        if *n >= MAX_STREAMS_PER_PLACE {
            // Counted with the other limits' refusals: it answers the same `429
            // RATE_LIMITED`, and a dashboard or alert on the counter must see it too.
            metrics::counter!(RATE_LIMITED, "limit" => STREAMS).increment(1);
            return None;
        }
        *n += 1;
        Some(StreamPermit {
            guard: self.clone(),
            key,
        })
    }

    /// The client of a request: see the module documentation.
    pub fn client_ip(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> Option<IpAddr> {
        let peer = canonical(peer?);
        if !self.trusted(peer) {
            return Some(peer);
        }
        let values = |name| {
            headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
        };
        let hops: Vec<&str> = match self.settings.forwarded_header {
            ForwardedHeader::XForwardedFor => values("x-forwarded-for").collect(),
            ForwardedHeader::Forwarded => values("forwarded")
                .filter_map(|e| {
                    e.split(';').find_map(|p| {
                        let (k, v) = p.split_once('=')?;
                        k.trim().eq_ignore_ascii_case("for").then_some(v)
                    })
                })
                .collect(),
        };
        let mut last = peer;
        for hop in hops.iter().rev() {
            match parse_hop(hop) {
                Some(ip) if self.trusted(ip) => last = ip,
                Some(ip) => return Some(ip),
                // Garbage (or `unknown`) where an address should be: the last hop we trust
                // is the best we know.
                None => break,
            }
        }
        Some(last)
    }

    /// Whether the nearest proxy's `Forwarded` element (the last: the client may have sent
    /// some before it) says `proto=https`, when the trusted proxies write `Forwarded`
    /// (`--forwarded-header forwarded`); a proxy that writes only that header would
    /// otherwise never have its clients' cookies marked `Secure`. The caller checks that
    /// the peer is trusted.
    pub fn forwarded_says_https(&self, headers: &HeaderMap) -> bool {
        if self.settings.forwarded_header != ForwardedHeader::Forwarded {
            return false;
        }
        let Some(last) = headers
            .get_all("forwarded")
            .iter()
            .next_back()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit(',').next())
        else {
            return false;
        };
        last.split(';').any(|p| {
            p.split_once('=').is_some_and(|(k, v)| {
                k.trim().eq_ignore_ascii_case("proto")
                    && v.trim().trim_matches('"').eq_ignore_ascii_case("https")
            })
        })
    }

    /// Whether `ip` is one of the trusted proxies, whose forwarding headers are believed
    /// (the gateway keeps their `X-Forwarded-*` and appends to them).
    pub fn is_trusted_proxy(&self, ip: IpAddr) -> bool {
        self.trusted(canonical(ip))
    }

    fn trusted(&self, ip: IpAddr) -> bool {
        self.settings.trusted_proxies.iter().any(|c| c.contains(ip))
    }
}

/// One open live stream; its slot is freed when dropped.
pub struct StreamPermit {
    guard: Arc<Guard>,
    key: PlaceKey,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut streams = self.guard.streams.lock();
        if let Some(n) = streams.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                streams.remove(&self.key);
            }
        }
    }
}

/// An address as a limit key: IPv6 by its /64.
fn client_key(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => (u128::from(v6) >> 64 << 64) | 1,
    }
}

/// One hop of `X-Forwarded-For` or the `for=` of `Forwarded`: `1.2.3.4`, `1.2.3.4:5`,
/// `2001:db8::1`, `"[2001:db8::1]:5"`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let h = hop.trim().trim_matches('"');
    if let Ok(ip) = h.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok().map(canonical);
    }
    h.parse::<SocketAddr>().ok().map(|s| canonical(s.ip()))
}

/// The guard and the client of a request, for handlers that limit.
pub struct Caller {
    pub guard: Arc<Guard>,
    pub ip: Option<IpAddr>,
}

/// The guard comes from the router's state (`http::Shared`), not from an extension
/// inserted into every request.
impl<S> FromRequestParts<S> for Caller
where
    S: Send + Sync,
    Arc<Guard>: FromRef<S>,
{
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let guard = Arc::<Guard>::from_ref(state);
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        let ip = guard.client_ip(peer, &parts.headers);
        Ok(Caller { guard, ip })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Cidr;

    fn guard(proxies: &str) -> Guard {
        guard_reading(proxies, ForwardedHeader::XForwardedFor)
    }

    fn guard_reading(proxies: &str, header: ForwardedHeader) -> Guard {
        Guard::new(RateLimitSettings {
            trusted_proxies: Cidr::parse_list(proxies).unwrap(),
            forwarded_header: header,
            ..RateLimitSettings::default()
        })
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn client(g: &Guard, peer: &str, headers: &[(&'static str, &str)]) -> IpAddr {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        g.client_ip(Some(ip(peer)), &h).unwrap()
    }

    /// Where the proxies write `Forwarded`, its last element's `proto=https` marks the
    /// session cookie `Secure` (it never did: only `X-Forwarded-Proto` was read), and a
    /// `proto=https` the client put before the proxy's element does not.
    #[test]
    fn forwarded_proto_https_of_the_nearest_proxy_means_https() {
        let is_https = |g: &Guard, peer: &str, lines: &[(&'static str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in lines {
                h.append(*k, HeaderValue::from_str(v).unwrap());
            }
            crate::http::gate::is_https(g, Some(ip(peer)), &h)
        };
        let rfc = guard_reading("10.0.0.0/8", ForwardedHeader::Forwarded);
        let proxy_https = [("forwarded", r#"for=1.2.3.4;proto="HTTPS";by=10.0.0.1"#)];
        assert!(is_https(&rfc, "10.0.0.1", &proxy_https));
        assert!(is_https(
            &rfc,
            "10.0.0.1",
            &[(
                "forwarded",
                "for=6.6.6.6;proto=http, for=1.2.3.4;proto=https"
            )]
        ));
        assert!(
            !is_https(
                &rfc,
                "10.0.0.1",
                &[("forwarded", "proto=https, for=1.2.3.4;proto=http")]
            ),
            "the client's element before the proxy's"
        );
        assert!(
            !is_https(
                &rfc,
                "10.0.0.1",
                &[
                    ("forwarded", "for=6.6.6.6;proto=https"),
                    ("forwarded", "for=1.2.3.4")
                ]
            ),
            "the proxy's own line says nothing of https"
        );
        assert!(!is_https(&rfc, "9.9.9.9", &proxy_https), "untrusted peer");
        let xff = guard("10.0.0.0/8");
        assert!(
            !is_https(&xff, "10.0.0.1", &proxy_https),
            "`Forwarded` is not the header these proxies write"
        );
        assert!(is_https(
            &xff,
            "10.0.0.1",
            &[("x-forwarded-proto", "https")]
        ));
    }

    #[test]
    fn the_client_is_the_first_untrusted_hop_from_the_right() {
        let g = guard("10.0.0.0/8");
        let xff = [("x-forwarded-for", "6.6.6.6, 1.2.3.4, 10.0.0.2")];
        assert_eq!(
            client(&g, "10.0.0.1", &xff),
            ip("1.2.3.4"),
            "spoofed left entry ignored"
        );
        assert_eq!(
            client(&g, "9.9.9.9", &xff),
            ip("9.9.9.9"),
            "untrusted peer: headers ignored"
        );
        assert_eq!(client(&g, "10.0.0.1", &[]), ip("10.0.0.1"));
        let fwd = [(
            "forwarded",
            r#"for=6.6.6.6, for="[2001:db8::1]:443";proto=https"#,
        )];
        let rfc = guard_reading("10.0.0.0/8", ForwardedHeader::Forwarded);
        assert_eq!(client(&rfc, "10.0.0.1", &fwd), ip("2001:db8::1"));
        let garbage = [("x-forwarded-for", "nonsense, 10.0.0.3")];
        assert_eq!(client(&g, "10.0.0.1", &garbage), ip("10.0.0.3"));
        assert_eq!(
            client(&g, "::ffff:10.0.0.1", &xff),
            ip("1.2.3.4"),
            "v4-mapped peer"
        );
        assert_eq!(
            client_key(ip("2001:db8::1")),
            client_key(ip("2001:db8::ffff:1")),
            "one /64, one client"
        );
    }

    /// Only the configured header counts: a proxy passes the other through as the client
    /// wrote it.
    #[test]
    fn only_the_configured_forwarding_header_is_read() {
        let both = [
            ("x-forwarded-for", "192.0.2.9"),
            ("forwarded", "for=203.0.113.7"),
        ];
        let rfc = guard_reading("10.0.0.0/8", ForwardedHeader::Forwarded);
        assert_eq!(client(&rfc, "10.0.0.1", &both), ip("203.0.113.7"));
        assert_eq!(
            client(&rfc, "10.0.0.1", &both[..1]),
            ip("10.0.0.1"),
            "an X-Forwarded-For alone is the client's word: the proxy is the client"
        );
        let xff = guard("10.0.0.0/8");
        assert_eq!(client(&xff, "10.0.0.1", &both), ip("192.0.2.9"));
        assert_eq!(client(&xff, "10.0.0.1", &both[1..]), ip("10.0.0.1"));
    }

    /// The limiters' maps use a key as its own hash, and only because the key is a keyed
    /// hash already: two guards (two processes) key the same place differently, so no one
    /// can pick places whose keys collide without the process's secret.
    #[test]
    fn limiter_keys_are_secret_keyed_and_pass_through_the_maps() {
        let place = ("e", PlaceKey { seq: 7, nonce: 9 });
        let (a, b) = (guard(""), guard(""));
        let key = a.hasher.hash_one(place);
        assert_ne!(key, b.hasher.hash_one(place), "a per-process secret key");
        assert_eq!(PassThrough::default().hash_one(key), key);
        assert_eq!(PassThrough::default().hash_one(u64::MAX), u64::MAX);
    }

    /// Keys that differ in one bit only (the map's shard bits, its bucket bits) are still
    /// limited apart, and each one's limit still holds.
    #[test]
    fn nearby_keys_are_limited_apart() {
        let clock = DefaultClock::default();
        let limiter = Limiter::new("poll", 2, 60, 1024, &clock);
        let keys = [0u64, 1, 1 << 32, 1 << 57, 1 << 63];
        for key in keys {
            assert!(limiter.check(key, &clock).is_ok());
            assert!(limiter.check(key, &clock).is_ok());
        }
        for key in keys {
            assert!(
                limiter.check(key, &clock).is_err(),
                "key {key:#x} over its burst"
            );
        }
        assert_eq!(limiter.limiter.len(), keys.len());
    }

    #[test]
    fn streams_per_place_are_capped_and_freed() {
        let g = Arc::new(guard(""));
        let key = PlaceKey { seq: 1, nonce: 2 };
        let permits: Vec<_> = (0..MAX_STREAMS_PER_PLACE)
            .map(|_| g.open_stream(key).unwrap())
            .collect();
        assert!(g.open_stream(key).is_none());
        drop(permits);
        assert!(g.open_stream(key).is_some());
    }
}
