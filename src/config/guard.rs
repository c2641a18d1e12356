//! The settings that guard the server against a dishonest crowd: per-client rate limits
//! ([`RateLimitSettings`]) and connection hygiene ([`ConnectionSettings`]), with the
//! syntax of `--trusted-proxies` ([`Cidr`]).

use std::net::IpAddr;
use std::time::Duration;

use clap::ValueEnum;

/// Server-wide per-client limits; events may override the first two (event setting
/// `rate_limits`). Each limit is a GCRA bucket: its whole burst refills in one window.
#[derive(Clone, Debug, PartialEq)]
pub struct RateLimitSettings {
    /// `--rate-limits off` turns every limit off (for load tests).
    pub enabled: bool,
    /// Joins per client per event: a burst of this many, refilled over a minute. People
    /// behind one NAT or corporate proxy share an address, so this is not tight.
    pub joins_per_minute: u32,
    /// Polls per place (status, heartbeat, enter, live connects): this many per second,
    /// with a burst of five seconds' worth.
    pub polls_per_second: u32,
    /// Wrong admin tokens per client: a burst of this many, refilled over a minute. A
    /// correct token is never limited.
    pub admin_failures_per_minute: u32,
    /// Addresses whose forwarding header is believed.
    pub trusted_proxies: Vec<Cidr>,
    /// The one header a trusted proxy writes; the other is ignored (a client could send it).
    pub forwarded_header: ForwardedHeader,
    /// Most clients tracked per limiter; past it, new clients share one overflow bucket.
    pub max_tracked: usize,
}

impl Default for RateLimitSettings {
    fn default() -> Self {
        RateLimitSettings {
            enabled: true,
            joins_per_minute: 30,
            polls_per_second: 2,
            admin_failures_per_minute: 10,
            trusted_proxies: Vec::new(),
            forwarded_header: ForwardedHeader::default(),
            max_tracked: 100_000,
        }
    }
}

/// The header that names the client behind a trusted proxy. Only one is read: a proxy
/// appends to the header it writes and passes the other through untouched, so reading
/// both (or preferring one when present) would let a client pick its own address.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, ValueEnum,
)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, ...` (nginx, HAProxy, most load balancers).
    #[default]
    #[serde(rename = "x-forwarded-for")]
    #[value(name = "x-forwarded-for")]
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239).
    #[serde(rename = "forwarded")]
    #[value(name = "forwarded")]
    Forwarded,
}

/// Timeouts and caps of the connections themselves.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnectionSettings {
    /// Longest wait for a complete request head, counted from the moment the server is
    /// ready to read one: on a new connection, and between keep-alive requests (so it is
    /// also the idle keep-alive timeout).
    pub header_timeout: Duration,
    /// Longest time a request body may take to arrive.
    pub body_timeout: Duration,
    /// Most open connections in total; `None`: three quarters of the descriptor limit.
    pub max_connections: Option<usize>,
    /// Most open connections from one client address (not applied to trusted proxies).
    pub max_connections_per_client: usize,
    /// How long every answer in flight on a connection may go without its body moving on
    /// (the client not reading it) before the connection is dropped; looked at once a
    /// header timeout. Not a setting of its own: a minute, as nginx's `send_timeout`, and
    /// well past the live streams' pings (15 s). Shorter in tests.
    pub stall_timeout: Duration,
}

impl Default for ConnectionSettings {
    fn default() -> Self {
        ConnectionSettings {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            max_connections: None,
            max_connections_per_client: 256,
            stall_timeout: Duration::from_secs(60),
        }
    }
}

/// An address block, `10.0.0.0/8` or `2001:db8::/32`; a bare address is a block of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (a, p) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("`{s}` is not an address or CIDR block"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{s}`: the prefix length must be 0-{max}"))?,
        };
        Ok(Cidr { addr, prefix })
    }

    /// Parses a comma-separated list.
    pub fn parse_list(s: &str) -> Result<Vec<Self>, String> {
        s.split(',')
            .filter(|p| !p.trim().is_empty())
            .map(Cidr::parse)
            .collect()
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                prefix_eq(u32::from(n).into(), u32::from(a).into(), self.prefix, 32)
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                prefix_eq(u128::from(n), u128::from(a), self.prefix, 128)
            }
            _ => false,
        }
    }
}

/// An IPv4 address in IPv6 clothing (`::ffff:1.2.3.4`, as a dual-stack socket reports
/// it) is the IPv4 address.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

fn prefix_eq(a: u128, b: u128, prefix: u8, bits: u8) -> bool {
    let shift = u32::from(bits - prefix);
    a.checked_shr(shift).unwrap_or(0) == b.checked_shr(shift).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_blocks() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let b = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(b.contains(ip("10.9.8.7")) && !b.contains(ip("11.0.0.1")));
        assert!(b.contains(ip("::ffff:10.1.2.3")), "v4-mapped");
        let one = Cidr::parse("192.168.1.5").unwrap();
        assert!(one.contains(ip("192.168.1.5")) && !one.contains(ip("192.168.1.6")));
        let v6 = Cidr::parse("2001:db8::/32").unwrap();
        assert!(v6.contains(ip("2001:db8:1::1")) && !v6.contains(ip("2001:db9::1")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        for bad in ["10.0.0.0/33", "nonsense", "10.0.0.0/x", "::/129"] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Cidr::parse_list(" 10.0.0.0/8, ::1 ,").unwrap().len(), 2);
    }
}
