//! Which requests an event gates, as its settings say (`paths`, `hosts`, `bypass_paths`,
//! `bypass_cidrs`, `bypass_secret`): the rules the gateway and `GET /api/v1/gate` apply,
//! pure, with their checks.
//!
//! Matching errs on the side of the queue. A gated prefix matches the path as sent, the
//! path as an origin would read it (percent-decoded, `.`/`..` and `//` resolved) and, when
//! it differs, as a Windows server or a C program would (IIS's `%uNNNN` decoded, each segment's trailing dots and
//! spaces dropped, cut at a NUL), ignoring ASCII case (some origins do); a bypass prefix matches only a path that has nothing to
//! resolve (no `%`, no dot segment, no empty segment), so `/static/../checkout` or
//! `/static/%2e%2e/checkout` never slip past the queue through a bypass.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use super::QueueError;

/// Most entries in each list of an event's gate rules.
pub const MAX_GATE_ENTRIES: usize = 64;
/// Longest path prefix or host name, in bytes.
pub const MAX_GATE_ENTRY_LEN: usize = 256;
/// Shortest `bypass_secret`, in bytes: long enough not to be guessed.
pub const MIN_BYPASS_SECRET_BYTES: usize = 16;

/// An event's gate rules, flat among its settings. Empty `paths`: the event gates nothing
/// (it is used through its waiting page and the API only).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRules {
    /// URL path prefixes the event gates, e.g. `["/checkout", "/seats"]`.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Host names the paths are gated on; empty: every host.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Path prefixes under `paths` that never queue (assets, health checks).
    #[serde(default)]
    pub bypass_paths: Vec<String>,
    /// Client address blocks that never queue (staff, monitoring).
    #[serde(default)]
    pub bypass_cidrs: Vec<String>,
    /// A request with `X-Waitroom-Bypass: <secret>` never queues. Stored, never answered by
    /// any read (`bypass_secret_set` instead).
    #[serde(default)]
    pub bypass_secret: Option<String>,
}

/// A prefix of the rules: `/checkout` matches `/checkout`, `/checkout/…` and
/// `/checkout?…` but not `/checkouts`; `/static/` matches what starts with it.
fn prefix_matches(prefix: &str, path: &str, fold_case: bool) -> bool {
    let (p, s) = (prefix.as_bytes(), path.as_bytes());
    if s.len() < p.len() {
        return false;
    }
    let head = &s[..p.len()];
    let same = if fold_case {
        head.eq_ignore_ascii_case(p)
    } else {
        head == p
    };
    // A `#` ends the path as `?` does: a reading decoded `%23` into one, and an origin
    // that decodes before it parses reads `/checkout%23x` as `/checkout`.
    same && (p.ends_with(b"/") || s.len() == p.len() || matches!(s[p.len()], b'/' | b'?' | b'#'))
}

/// The path as an origin would read it: percent-decoded (lossy), `//` collapsed, `;`
/// path parameters dropped, `.` and `..` resolved, the query dropped.
pub fn normalize_path(raw: &str) -> String {
    normalized(raw).into_owned()
}

/// [`normalize_path`], borrowing `raw` when it has nothing to resolve (the usual request:
/// matching a path against the gates then allocates nothing). Such a path normalizes to
/// itself: no `%`, `\`, `;`, `?` or `#`, no empty segment inside it and no dot segment.
fn normalized(raw: &str) -> std::borrow::Cow<'_, str> {
    if is_normal(raw) {
        std::borrow::Cow::Borrowed(raw)
    } else {
        std::borrow::Cow::Owned(normalize_slow(raw))
    }
}

/// Whether `normalize_slow(path) == path`, checked in one pass over the bytes: an absolute
/// path of segments that are neither empty (but for the last, a trailing `/`) nor `.` or
/// `..`, without any byte that decoding, parameters or a query would change.
fn is_normal(path: &str) -> bool {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') {
        return false;
    }
    // One walk over the bytes, each segment judged at its end (a `split('/')` and a search
    // per forbidden byte cost ~250 instructions for `/checkout`, on every proxied request).
    let mut start = 1;
    for i in 1..=b.len() {
        let last = i == b.len();
        if !last {
            match b[i] {
                b'%' | b'\\' | b';' | b'?' | b'#' => return false,
                b'/' => {}
                _ => continue,
            }
        }
        // Segments between the slashes; the last may be empty (a trailing `/`, kept).
        let seg = &b[start..i];
        if (seg.is_empty() && !last) || seg == b"." || seg == b".." {
            return false;
        }
        start = i + 1;
    }
    true
}

fn normalize_slow(raw: &str) -> String {
    let path = raw.split(['?', '#']).next().unwrap_or("");
    resolve(&percent_decode(path), true, |seg| seg)
}

/// [`normalize_slow`] with each segment's `;` parameters kept, as origins other than Java
/// servlet containers read them (`/a/help;x/pay` is under `/a`, not `/a/help`).
fn normalize_keeping_params(raw: &str) -> String {
    let path = raw.split(['?', '#']).next().unwrap_or("");
    resolve(&percent_decode(path), false, |seg| seg)
}

/// The path as sent with the escapes of characters that carry no structure decoded
/// (`%C3%A9` is `é`, `%63` is `c`): every origin reads those alike, and browsers send
/// every character outside ASCII so. Escapes of `/`, `\`, `.`, `;`, `?`, `#`, `%` and NUL
/// stay: whether an origin decodes those before it routes is what the other readings
/// tell apart. Borrowed when there is no `%`.
fn as_sent(raw: &str) -> std::borrow::Cow<'_, str> {
    if !raw.contains('%') {
        return std::borrow::Cow::Borrowed(raw);
    }
    let b = raw.as_bytes();
    let hex = |c: Option<&u8>| c.and_then(|&c| (c as char).to_digit(16)).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if let (Some(h), Some(l)) = (hex(b.get(i + 1)), hex(b.get(i + 2))) {
                let c = h << 4 | l;
                if !matches!(c, b'/' | b'\\' | b'.' | b';' | b'?' | b'#' | b'%' | 0) {
                    out.push(c);
                    i += 3;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    std::borrow::Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// A decoded path's segments resolved (`.`, `..` and empty ones), each read through `read`
/// first. A backslash is a separator to some origins; Java servlet containers drop a
/// segment's `;` parameters (`/checkout;jsessionid=1` is `/checkout`, `..;` is `..`).
fn resolve<'a>(decoded: &'a str, strip_params: bool, read: impl Fn(&'a str) -> &'a str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let params = |seg: &'a str| {
        if strip_params {
            without_params(seg)
        } else {
            seg
        }
    };
    for seg in decoded.split(['/', '\\']).map(params).map(read) {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    let mut s = String::with_capacity(decoded.len() + 1);
    for seg in &out {
        s.push('/');
        s.push_str(seg);
    }
    if s.is_empty() || (decoded.ends_with('/') && !out.is_empty()) {
        s.push('/');
    }
    s
}

/// The path as a Windows server or a program written in C reads it, when that differs
/// from [`normalize_path`]: percent-decoded and cut at the first NUL (`/checkout%00.png`),
/// each segment without its trailing dots and spaces (`/checkout.`, `/checkout%20`; a
/// segment that is then `.`, `..` or empty resolves as those), then resolved as in
/// [`normalize_slow`]. `None` for a path with none of these (no `%`, space or NUL, no
/// segment ending in `.` other than `.` and `..`): the usual path costs one walk.
fn windows_form(raw: &str) -> Option<String> {
    differs_on_windows(raw).map(|end| windows_reading(&raw[..end]))
}

/// [`windows_form`] of a path without its query, whether or not it differs.
fn windows_reading(path: &str) -> String {
    let decoded = percent_u_decode(path);
    let decoded = decoded.split('\0').next().unwrap_or("");
    resolve(decoded, true, |seg| {
        // An NTFS stream name (`checkout::$DATA`, `checkout:$INDEX_ALLOCATION`): IIS serves
        // the file itself.
        let seg = seg.split(':').next().unwrap_or(seg);
        let seg = seg.trim_end_matches(' ');
        if seg == "." || seg == ".." {
            seg
        } else {
            seg.trim_end_matches(['.', ' '])
        }
    })
}

/// Where the path of `raw` ends (its query or fragment cut off), if [`windows_form`] may
/// read it differently from RFC 3986: it has a `%` (what it decodes to is not known yet),
/// a space, a NUL or a `;`, or a segment ending in `.` that is not `.` or `..`. One walk
/// over the bytes: it runs on every gated request (`split`s cost ~1,500 instructions for
/// `/checkout`).
fn differs_on_windows(raw: &str) -> Option<usize> {
    let b = raw.as_bytes();
    let mut start = 0;
    let mut differs = false;
    for i in 0..=b.len() {
        match b.get(i) {
            Some(b'%' | b' ' | 0 | b';' | b':') => differs = true,
            Some(b'/' | b'\\' | b'?' | b'#') | None => {
                let seg = &b[start..i];
                differs |= seg.last() == Some(&b'.') && seg != b"." && seg != b"..";
                if matches!(b.get(i), Some(b'?' | b'#') | None) {
                    return differs.then_some(i);
                }
                start = i + 1;
            }
            Some(_) => {}
        }
    }
    None
}

/// [`percent_decode`] that also reads IIS's `%uNNNN` (a UTF-16 code unit, `%u0063` is `c`),
/// as Windows' HTTP.sys does by default: an IIS origin serves `/%u0063heckout` as
/// `/checkout`. A surrogate pair (`%uD83D%uDE00`) is one character, as UTF-16 has it; a
/// lone surrogate reads as U+FFFD.
fn percent_u_decode(s: &str) -> String {
    if !s.contains("%u") && !s.contains("%U") {
        return percent_decode(s);
    }
    let b = s.as_bytes();
    // The UTF-16 code unit of a `%uNNNN` at `i`.
    let unit = |i: usize| {
        (b.get(i) == Some(&b'%') && matches!(b.get(i + 1), Some(b'u' | b'U')))
            .then(|| s.get(i + 2..i + 6))
            .flatten()
            .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))
            .and_then(|h| u16::from_str_radix(h, 16).ok())
    };
    let mut plain = String::with_capacity(s.len());
    let mut i = 0;
    let mut from = 0;
    while i < b.len() {
        let Some(u) = unit(i) else {
            i += 1;
            continue;
        };
        plain.push_str(&percent_decode(&s[from..i]));
        let mut units = vec![u];
        if (0xD800..0xDC00).contains(&u) {
            if let Some(low) = unit(i + 6).filter(|l| (0xDC00..0xE000).contains(l)) {
                units.push(low);
                i += 6;
            }
        }
        plain.extend(char::decode_utf16(units).map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER)));
        i += 6;
        from = i;
    }
    plain.push_str(&percent_decode(&s[from..]));
    plain
}

/// Whether `path`'s percent-decoding is not UTF-8, or it holds U+FFFD (bytes that were
/// not UTF-8 when it was read). Paths without `%` or anything outside ASCII (nearly all)
/// are answered by one look at their bytes.
pub fn undecodable(path: &str) -> bool {
    let path = path.split(['?', '#']).next().unwrap_or("");
    if path.is_ascii() && !path.contains('%') {
        return false;
    }
    if path.contains(char::REPLACEMENT_CHARACTER) {
        return true;
    }
    std::str::from_utf8(&percent_decode_bytes(path)).is_err()
}

fn percent_decode(s: &str) -> String {
    String::from_utf8_lossy(&percent_decode_bytes(s)).into_owned()
}

/// `s` with every `%XX` escape decoded, as bytes (a `%` without two hex digits stays).
fn percent_decode_bytes(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        if b[i] == b'%' {
            if let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            ) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// A path segment without its `;` parameters.
fn without_params(seg: &str) -> &str {
    seg.split(';').next().unwrap_or(seg)
}

/// Whether a path has nothing an origin would resolve differently.
fn is_plain(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or("");
    !path.contains('%')
        && !path.contains('\\')
        && !path.contains("//")
        && !path
            .split('/')
            .map(without_params)
            .any(|s| s == "." || s == "..")
}

/// Whether a segment of `path` is a dot segment, or empty, as a Windows server reads it
/// ([`windows_reading`]: `..::$DATA`, `.. `, `...`), though not as written: a bypass path
/// followed by one would climb out of the bypass on such a server.
fn windows_dot_segment(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or("");
    path.split('/').any(|seg| {
        let seg = without_params(seg);
        seg.contains(':')
            || (seg.ends_with(['.', ' ']) && seg.trim_end_matches(['.', ' ']).is_empty())
    })
}

/// The readings of a request's path that gating considers, each one some origin may use:
/// as sent ([`as_sent`]: only escapes that carry no structure decoded); as an origin
/// resolves it ([`normalize_path`]), when that differs; so with `;` parameters kept, when
/// there are any; and as a Windows server or a C program reads it ([`windows_form`]), when
/// that differs. The usual path has only the first, and costs one walk and no allocation.
pub struct Readings<'a> {
    sent: std::borrow::Cow<'a, str>,
    resolved: Option<String>,
    params_kept: Option<String>,
    windows: Option<String>,
    /// The readings of the path after a leading `//host` or `/\host` ([`after_authority`]).
    relative: Vec<String>,
}

/// What follows the authority of a path that starts with two or more slashes or
/// backslashes (`//shop.example/checkout` → `/checkout`), `None` for any other path. A
/// WHATWG URL parser (Node's `new URL(req.url, base)`, which its docs recommend for
/// routing) reads such a request target as a scheme-relative URL whose first segment is a
/// host, as PHP's `parse_url` and Python's `urlsplit` read `//`: the page an origin built
/// on them serves is the rest's.
fn after_authority(raw: &str) -> Option<&str> {
    let slashes = raw
        .bytes()
        .take_while(|b| matches!(b, b'/' | b'\\'))
        .count();
    if slashes < 2 {
        return None;
    }
    let rest = &raw[slashes..];
    let end = rest.find(['/', '\\', '?', '#']).unwrap_or(rest.len());
    match rest.as_bytes().get(end) {
        Some(b'/' | b'\\') => Some(&rest[end..]),
        // No path after the host: its root.
        _ => Some("/"),
    }
}

/// The readings of what follows a leading authority ([`after_authority`]): of the rest
/// after the first one, and after every leading one (`//a//b/checkout`: `//b/checkout`,
/// then `/checkout`), each without going a level further, so that the work stays linear in
/// the path (a reading per level recursed once a level and copied every level below it: a
/// path of thousands of `//a` took gigabytes, or the stack). Of the percent-decoded path
/// too, when it has an escape (`/%2fx/checkout`, for an origin behind a proxy that decodes
/// first).
fn relative_readings(raw: &str) -> Vec<String> {
    fn add(path: &str, out: &mut Vec<String>) {
        let Some(first) = after_authority(path) else {
            return;
        };
        let mut last = first;
        while let Some(next) = after_authority(last) {
            last = next;
        }
        out.extend(Readings::plain(first).iter().map(str::to_owned));
        if last.len() < first.len() {
            out.extend(Readings::plain(last).iter().map(str::to_owned));
        }
    }
    let mut out = Vec::new();
    add(raw, &mut out);
    // Decoded, it starts with two separators only if one of its first two is an escape (a
    // `%` among the first four bytes) or it starts with two already, and then an escape
    // may end its authority (`//shop%2fcheckout`). The usual path is not walked again.
    let escaped_authority = || after_authority(raw).is_some() && raw.contains('%');
    if raw.bytes().take(4).any(|b| b == b'%') || escaped_authority() {
        let path = raw.split(['?', '#']).next().unwrap_or("");
        add(&percent_decode(path), &mut out);
    }
    out
}

impl<'a> Readings<'a> {
    pub fn of(raw: &'a str) -> Readings<'a> {
        Readings {
            relative: relative_readings(raw),
            ..Self::plain(raw)
        }
    }

    /// The readings of `raw` but those after a leading authority.
    fn plain(raw: &'a str) -> Readings<'a> {
        let resolved = match normalized(raw) {
            std::borrow::Cow::Owned(s) => Some(s),
            std::borrow::Cow::Borrowed(_) => None,
        };
        // A normal path (no `%`, no `;`: `resolved` is `None`) has no parameters.
        let params_kept = resolved
            .is_some()
            .then(|| raw.split(['?', '#']).next().unwrap_or(""))
            .filter(|p| p.contains(';') || p.contains("%3b") || p.contains("%3B"))
            .map(|_| normalize_keeping_params(raw));
        Readings {
            sent: as_sent(raw),
            resolved,
            params_kept,
            windows: windows_form(raw),
            relative: Vec::new(),
        }
    }

    /// Each reading, the path as sent first.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        std::iter::once(&*self.sent)
            .chain(self.resolved.as_deref())
            .chain(self.params_kept.as_deref())
            .chain(self.windows.as_deref())
            .chain(self.relative.iter().map(String::as_str))
    }
}

impl GateRules {
    /// How long the longest gated prefix matching `host` and any reading of `path` is;
    /// `None`: not gated.
    pub fn gates(&self, host: Option<&str>, path: &str) -> Option<usize> {
        if !self.gates_host(host) {
            return None;
        }
        Readings::of(path)
            .iter()
            .filter_map(|r| self.longest_prefix(r))
            .max()
    }

    /// Whether the rules gate anything on `host` (their `hosts`, or any host).
    pub fn gates_host(&self, host: Option<&str>) -> bool {
        if self.paths.is_empty() {
            return false;
        }
        if self.hosts.is_empty() {
            return true;
        }
        // `shop.example.` (fully qualified) is the same host to DNS and to origins such as
        // nginx.
        let h = host.map(strip_port).unwrap_or("").trim_end_matches('.');
        // An IPv6 address has many spellings (`[2001:db8::1]`, `[2001:0db8:0::1]`): it is
        // compared as an address, or another spelling would pass the queue.
        let v6 = |s: &str| {
            s.strip_prefix('[')
                .and_then(|s| s.strip_suffix(']'))
                .and_then(|a| a.parse::<Ipv6Addr>().ok())
        };
        let address = if h.starts_with('[') { v6(h) } else { None };
        self.hosts.iter().any(|x| {
            x.strip_suffix('.').unwrap_or(x).eq_ignore_ascii_case(h)
                || address.is_some_and(|a| v6(x) == Some(a))
        })
    }

    /// How long the longest gated prefix matching one reading of a path is (the host aside:
    /// [`GateRules::gates_host`]).
    pub fn longest_prefix(&self, reading: &str) -> Option<usize> {
        self.paths
            .iter()
            .filter(|p| prefix_matches(p, reading, true))
            .map(String::len)
            .max()
    }

    /// Whether a request on a gated path skips the queue: a plain path under a bypass
    /// prefix, a client in a bypass block, or the secret header.
    pub fn bypasses(&self, path: &str, client: Option<IpAddr>, secret: Option<&[u8]>) -> bool {
        // The prefixes first: most gated requests match none, and `is_plain` walks the path.
        if self
            .bypass_paths
            .iter()
            .any(|p| prefix_matches(p, path, false))
            && is_plain(path)
            && !windows_dot_segment(path)
        {
            return true;
        }
        if let Some(ip) = client {
            if self
                .bypass_cidrs
                .iter()
                .any(|c| cidr_contains(c, ip).unwrap_or(false))
            {
                return true;
            }
        }
        match (&self.bypass_secret, secret) {
            (Some(want), Some(got)) => constant_time_eq(want.as_bytes(), got),
            _ => false,
        }
    }

    /// Checks the rules as a whole.
    pub fn validate(&self) -> Result<(), QueueError> {
        self.validate_keeping(&[])
    }

    /// [`Self::validate`], letting through the `hosts` entries of `stored` (an event saved
    /// before their check: the admin form sends every field back, and a pause must still
    /// save).
    pub fn validate_keeping(&self, stored: &[String]) -> Result<(), QueueError> {
        let bad = |m: String| Err(QueueError::Invalid(m));
        for (field, list) in [
            ("paths", &self.paths),
            ("hosts", &self.hosts),
            ("bypass_paths", &self.bypass_paths),
            ("bypass_cidrs", &self.bypass_cidrs),
        ] {
            if list.len() > MAX_GATE_ENTRIES {
                return bad(format!(
                    "{field} must have at most {MAX_GATE_ENTRIES} entries"
                ));
            }
            for v in list {
                if v.is_empty()
                    || v.len() > MAX_GATE_ENTRY_LEN
                    || v.chars().any(|c| c.is_whitespace() || c.is_control())
                {
                    return bad(format!(
                        "each of {field} must be 1-{MAX_GATE_ENTRY_LEN} characters without spaces"
                    ));
                }
            }
        }
        for p in self.paths.iter().chain(&self.bypass_paths) {
            if !p.starts_with('/') || p.contains(['?', '#', '%', '\\']) || !is_plain(p) {
                return bad(format!(
                    "`{p}`: paths and bypass_paths must be plain absolute paths (no ?, #, %, \\, dot segments)"
                ));
            }
        }
        // Only what a request's `Host` can be (`is_valid_host`, without the port): an entry
        // no request can carry (`.shop.example`, `shop..example`, `0x7f.1`) would leave
        // the event's paths open on every host.
        for h in &self.hosts {
            let a_host = is_valid_host(h.as_bytes()) && strip_port(h) == h;
            if !a_host && !stored.contains(h) {
                return bad(format!(
                    "`{h}`: hosts must be host names without a port (letters, digits, - and _ between single dots; an IPv4 address in dotted decimal, an IPv6 one in brackets)"
                ));
            }
        }
        for c in &self.bypass_cidrs {
            if cidr_contains(c, IpAddr::from([0, 0, 0, 0])).is_none() {
                return bad(format!(
                    "`{c}`: bypass_cidrs must be addresses or CIDR blocks"
                ));
            }
        }
        if let Some(s) = &self.bypass_secret {
            if s.len() < MIN_BYPASS_SECRET_BYTES
                || s.len() > MAX_GATE_ENTRY_LEN
                || !s.bytes().all(|b| b.is_ascii_graphic())
            {
                return bad(format!(
                    "bypass_secret must be {MIN_BYPASS_SECRET_BYTES}-{MAX_GATE_ENTRY_LEN} printable characters without spaces"
                ));
            }
        }
        Ok(())
    }
}

/// Whether `host` is a `Host` value this server reads as a host (RFC 9112 §3.2: `uri-host
/// [":" port]`): a host name or IPv4 address ([`is_host_name`]) or a bracketed IPv6
/// address, then optionally `:` and digits. Any other value is refused before the gate
/// rules are asked: `hosts` compare the value's text, and an origin may read another host
/// out of it. Node's `new URL()`, for one, reads `other@shop.example`, `shop.example/`,
/// `shop.example?`, `shop.example#` and `shop.ex%61mple` all as `shop.example`, so any of
/// them would reach the pages of an event limited to `shop.example` without its queue.
/// RFC 3986's `reg-name` also allows `%` escapes and the sub-delimiters (`!$&'()*+,;=`):
/// no host name is written with them, and parsers disagree on them (WHATWG URL decodes
/// the escapes, Node's legacy `url.parse` ends the host at `;` or `'`), so they are
/// refused too, as are the future address forms (`[v1.x]`) and zone ids. A scan of the
/// bytes, without allocation: every proxied request is checked.
pub fn is_valid_host(host: &[u8]) -> bool {
    let (address, rest) = match host.strip_prefix(b"[") {
        Some(literal) => {
            let Some(end) = literal.iter().position(|&b| b == b']') else {
                return false;
            };
            let v6 =
                std::str::from_utf8(&literal[..end]).is_ok_and(|a| a.parse::<Ipv6Addr>().is_ok());
            (v6, &literal[end + 1..])
        }
        None => {
            let end = host.iter().position(|&b| b == b':').unwrap_or(host.len());
            (is_host_name(&host[..end]), &host[end..])
        }
    };
    address
        && match rest {
            [] => true,
            [b':', port @ ..] => port.iter().all(u8::is_ascii_digit),
            _ => false,
        }
}

/// Whether `name` is a host name or an IPv4 address: labels of ASCII letters, digits, `-`
/// and `_` between single dots, with one trailing dot allowed (`shop.example.`, fully
/// qualified). A name whose last label is a number (digits, or `0x` and hex digits) is
/// read as an IPv4 address by WHATWG URL parsers and `inet_aton` (`0x7f.1`, `2130706433`
/// and `127.1` are all `127.0.0.1`): it must be one written in dotted decimal, the only
/// way `hosts` can name one.
fn is_host_name(name: &[u8]) -> bool {
    let name = name.strip_suffix(b".").unwrap_or(name);
    let mut label = 0;
    for (i, &b) in name.iter().enumerate() {
        match b {
            b'.' if i == label => return false,
            b'.' => label = i + 1,
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => {}
            _ => return false,
        }
    }
    let last = &name[label..];
    let number = match last {
        [] => return false,
        [b'0', b'x' | b'X', hex @ ..] => hex.iter().all(u8::is_ascii_hexdigit),
        digits => digits.iter().all(u8::is_ascii_digit),
    };
    !number || std::str::from_utf8(name).is_ok_and(|n| n.parse::<Ipv4Addr>().is_ok())
}

/// The host of a `Host` value: up to the first `:` (a host name has none), as nginx reads
/// it, so `shop.example:80:x` is `shop.example` here too.
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    host.split(':').next().unwrap_or(host)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `block` (`10.0.0.0/8`, `2001:db8::/32`, or one address) holds `ip`; `None`:
/// `block` is malformed. IPv4-mapped IPv6 addresses count as IPv4. (The server-wide
/// `trusted_proxies` parse the same syntax in `config::guard`; the rules of core import
/// nothing from the crate.)
pub fn cidr_contains(block: &str, ip: IpAddr) -> Option<bool> {
    let (addr, len) = match block.split_once('/') {
        Some((a, l)) => (a, Some(l.parse::<u8>().ok()?)),
        None => (block, None),
    };
    let net = canonical(addr.parse::<IpAddr>().ok()?);
    let (n, i, bits) = match (net, canonical(ip)) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            (u128::from(u32::from(n)), Some(u128::from(u32::from(i))), 32)
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => (u128::from(n), Some(u128::from(i)), 128),
        // Different families: the block is still checked, and holds nothing of the other.
        (IpAddr::V4(n), _) => (u128::from(u32::from(n)), None, 32),
        (IpAddr::V6(n), _) => (u128::from(n), None, 128),
    };
    let len = u32::from(len.unwrap_or(bits as u8));
    if len > bits {
        return None;
    }
    let shift = bits - len;
    Some(i.is_some_and(|i| len == 0 || n >> shift == i >> shift))
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
