//! The header rules of a proxy (RFC 9110 §7.6): hop-by-hop headers end at each hop, the
//! origin is told who the client is (`X-Forwarded-For`, `X-Forwarded-Proto`,
//! `X-Forwarded-Host`, RFC 7239 `Forwarded`, `X-Real-IP`), and the headers waitroom vouches
//! for (`X-Waitroom-User`, `X-Waitroom-Session`) or reads (`X-Waitroom-Bypass`) never come
//! from the client.
//!
//! A client's own forwarding headers are believed only from a trusted proxy
//! (`trusted_proxies`), whose chain is kept and extended; from anyone else they are
//! replaced, so a client cannot tell the origin it is someone else. So are the other
//! headers that origins read the client's address from (`True-Client-IP`, `Client-IP`,
//! `CF-Connecting-IP`, …): kept from a trusted proxy, dropped from anyone else.

use std::fmt::Write as _;
use std::net::IpAddr;

use axum::http::Request;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};

use crate::core::gate::is_valid_host;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const FORWARDED: HeaderName = HeaderName::from_static("forwarded");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// What a header is to the proxy: its name's text decides, matched once per header (by
/// its length first, then its bytes), rather than compared with each of its names in
/// turn (that cost ~130 instructions per header for sixteen names, twice over every
/// answer's headers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Concerns one connection only, never forwarded.
    HopByHop,
    /// A forwarding header, or another that names the client's address, believed only from
    /// a trusted proxy.
    Forwarding,
    /// One waitroom vouches for or reads, or one that names another path for the request:
    /// never from the client. IIS, and Symfony and Zend before 2018, serve the path in
    /// `X-Original-URL` or `X-Rewrite-URL` instead of the request's own, so `GET /` with
    /// `X-Original-URL: /checkout` would reach the gated page without a place.
    Own,
    Other,
}

fn kind(n: &HeaderName) -> Kind {
    let name = n.as_str();
    match named_kind(name) {
        // CGI, PHP, WSGI and Rack origins read `X_Waitroom_User` as `HTTP_X_WAITROOM_USER`,
        // the name of the header waitroom vouches for: a spelling with `_` of one of these
        // names never goes on, from anyone. Only the names with a `-` can be spelled so:
        // their first letters and lengths pass a name to the search for `_` (searching
        // every name cost ~570 instructions a proxied request).
        Kind::Other if could_be_ours_with_underscores(name) => {
            match named_kind(&name.replace('_', "-")) {
                Kind::Other => Kind::Other,
                _ => Kind::Own,
            }
        }
        k => k,
    }
}

/// Whether `name` may be one of [`named_kind`]'s names with a `-` spelled `_`, by its first
/// letter and length. Per letter, so that the usual `content-type`, `content-length` and
/// `cache-control` of nearly every answer are not searched.
#[inline]
fn could_be_ours_with_underscores(name: &str) -> bool {
    let len = name.len();
    let may = match name.as_bytes().first() {
        Some(b'c') => matches!(len, 9 | 16),
        Some(b'f') => matches!(len, 13 | 15 | 16),
        Some(b'k') => len == 10,
        Some(b'p') => matches!(len, 16..=19),
        Some(b't') => matches!(len, 14 | 17),
        Some(b'x') => matches!(len, 9..=19),
        _ => false,
    };
    may && name.contains('_')
}

#[inline(always)]
fn named_kind(name: &str) -> Kind {
    match name {
        "connection"
        | "keep-alive"
        | "proxy-connection"
        | "proxy-authenticate"
        | "proxy-authorization"
        | "te"
        | "trailer"
        | "transfer-encoding"
        | "upgrade" => Kind::HopByHop,
        // The client's address as frameworks and origins read it (Rails and PHP read
        // `Client-IP`, nginx setups `X-Real-IP`, CDNs' origins their own): from a client it
        // would be any address it likes, for the origin's rate limits and fraud checks.
        "x-forwarded-for"
        | "x-forwarded-proto"
        | "x-forwarded-host"
        | "forwarded"
        | "x-real-ip"
        | "true-client-ip"
        | "client-ip"
        | "x-client-ip"
        | "x-cluster-client-ip"
        | "cf-connecting-ip"
        | "fastly-client-ip"
        | "fly-client-ip"
        | "x-originating-ip"
        | "x-remote-ip"
        | "x-remote-addr"
        // The spellings PHP's widespread client-address snippet reads besides those
        // (`HTTP_X_FORWARDED`, `HTTP_FORWARDED_FOR`).
        | "x-forwarded"
        | "forwarded-for"
        // The scheme, port and prefix as frameworks read them besides `X-Forwarded-Proto`
        // (Rack reads `X-Forwarded-Ssl` and `X-Forwarded-Scheme` before it, ASP.NET-era
        // origins `Front-End-Https`, Symfony `X-Forwarded-Port` and `-Prefix`): from a client
        // a plain http request would pass as https, or name the site's redirects' port.
        | "x-forwarded-ssl"
        | "x-forwarded-scheme"
        | "front-end-https"
        | "x-url-scheme"
        | "x-forwarded-port"
        | "x-forwarded-prefix" => Kind::Forwarding,
        "x-waitroom-user" | "x-waitroom-session" | "x-waitroom-bypass" | "x-original-url"
        | "x-rewrite-url" | "x-original-uri" => Kind::Own,
        _ => Kind::Other,
    }
}

/// The host the client asked for: the authority of the request's target when it has one
/// (an absolute-form target, RFC 9112 §3.2.2, where a proxy must ignore `Host`; an HTTP/2
/// request's `:authority`, which RFC 9113 §8.3.1 puts before `Host`), else `Host` (its
/// first value, which the caller has looked up and checked already: each lookup hashes
/// the name and probes the map, ~110 instructions). A header value, so that the usual
/// `Host` is shared rather than copied. An authority's `userinfo` (`user:secret@`,
/// deprecated by RFC 9110 §4.2.4 and forbidden in HTTP/2's `:authority`) is left out: it
/// names no host, an origin could read a host out of it, and a secret in it would reach the
/// origin's logs. `None`: no host, or an authority that is not a host and port
/// ([`is_valid_host`]).
///
/// The gate matches this host, and the origin is sent it as `Host` ([`request_headers`]):
/// the two never read different hosts.
pub fn host_from<B>(host: Option<&HeaderValue>, req: &Request<B>) -> Option<HeaderValue> {
    let Some(a) = req.uri().authority() else {
        return host.cloned();
    };
    let a = a.as_str();
    let host_port = a.rsplit_once('@').map_or(a, |(_, h)| h);
    if !is_valid_host(host_port.as_bytes()) {
        return None;
    }
    // The same text as `Host` (HTTP/2 clients may send both): shared, not copied.
    host.filter(|h| h.as_bytes() == host_port.as_bytes())
        .cloned()
        .or_else(|| HeaderValue::from_str(host_port).ok())
}

/// The protocol a request asks to upgrade to (`Connection: upgrade` with `Upgrade`), if it
/// is a WebSocket. Another (`h2c`) is not passed on: the request goes as a plain one, since
/// an origin that took it would carry the connection's later requests past the gate.
pub fn upgrade_of(h: &HeaderMap) -> Option<HeaderValue> {
    let asks = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| h.get(header::UPGRADE))
        .flatten()
        .filter(|u| u.as_bytes().eq_ignore_ascii_case(b"websocket"))
        .cloned()
}

/// Removes the hop-by-hop headers, those `Connection` names included, and every header
/// of a [`Kind`] `also` names. One pass over the names finds them: most requests and answers carry none,
/// and removing each of the sixteen by name would hash and probe sixteen times per request.
fn strip_hop_by_hop(h: &mut HeaderMap, also: impl Fn(Kind) -> bool) {
    let doomed = |n: &HeaderName| {
        let k = kind(n);
        k == Kind::HopByHop || also(k)
    };
    if !h.keys().any(doomed) {
        return;
    }
    // The usual case (an origin's `Connection: keep-alive`, and nothing else to strip) costs
    // no allocation: the single `Connection` value is moved out of the map, and the names it
    // lists are removed by their text, which is looked up without building a `HeaderName`.
    // Only then are the headers still doomed, if any, collected (two vectors and a name per
    // token cost about 1.5k instructions, on every proxied answer).
    if h.get_all(header::CONNECTION).iter().nth(1).is_none() {
        if let Some(connection) = h.remove(header::CONNECTION) {
            if let Ok(v) = connection.to_str() {
                for t in v.split(',') {
                    let t = t.trim();
                    // The usual token, by a name made once: removing by text parses the
                    // name first (~340 instructions, on every answer of an origin that
                    // says `Connection: keep-alive`).
                    if t.eq_ignore_ascii_case("keep-alive") {
                        h.remove(KEEP_ALIVE);
                    } else {
                        h.remove(t);
                    }
                }
            }
        }
        if !h.keys().any(doomed) {
            return;
        }
    }
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    let listed: Vec<HeaderName> = h.keys().filter(|n| doomed(n)).cloned().collect();
    for n in named.iter().chain(&listed) {
        h.remove(n);
    }
}

fn value_of(s: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(s).ok()
}

/// Writes `ip` as its `Display` does. An IPv4 address is written octet by octet: `Display`
/// for one goes through the formatting machinery and a padding buffer, several times the
/// cost of the rest of a request's header rewriting.
fn push_ip(buf: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf.push('.');
                }
                if octet >= 100 {
                    buf.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    buf.push(char::from(b'0' + octet / 10 % 10));
                }
                buf.push(char::from(b'0' + octet % 10));
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(buf, "{v6}");
        }
    }
}

/// The forwarding values (`X-Forwarded-For`, `Forwarded`) last written for one client
/// connection from a peer that is not a trusted proxy. Those depend on the peer's address
/// and the host asked for only (the client's own forwarding headers are dropped), both
/// the same for every request of a connection in practice: writing them cost ~700
/// instructions per request (a buffer, the address written twice, two values checked and
/// copied), sharing the last ones costs a comparison and two reference counts.
#[derive(Default)]
pub struct Forwarding(parking_lot::Mutex<Option<Written>>);

struct Written {
    peer: IpAddr,
    host: Option<Box<str>>,
    x_forwarded_for: Option<HeaderValue>,
    forwarded: Option<HeaderValue>,
}

impl Forwarding {
    /// The values for `peer` and `host`: the last ones when both are the same, else
    /// `write`'s (kept for the next request).
    fn values(
        &self,
        peer: IpAddr,
        host: Option<&str>,
        write: impl FnOnce() -> (Option<HeaderValue>, Option<HeaderValue>),
    ) -> (Option<HeaderValue>, Option<HeaderValue>) {
        let mut kept = self.0.lock();
        if let Some(w) = &*kept {
            if w.peer == peer && w.host.as_deref() == host {
                return (w.x_forwarded_for.clone(), w.forwarded.clone());
            }
        }
        let (x_forwarded_for, forwarded) = write();
        *kept = Some(Written {
            peer,
            host: host.map(Into::into),
            x_forwarded_for: x_forwarded_for.clone(),
            forwarded: forwarded.clone(),
        });
        (x_forwarded_for, forwarded)
    }
}

/// Appends every line of header `name` to `buf`, in order, as one comma-separated list
/// (RFC 9110 §5.3: lines of a list header are one list), each followed by `", "`. A proxy
/// may add its hop as a line of its own after the client's: reading only the first line
/// would drop that hop and leave the client's invention as the nearest one. A line that is
/// not visible ASCII is skipped, as `Guard::client_ip` skips it when it reads the chain.
fn push_lines(buf: &mut String, h: &HeaderMap, name: &HeaderName) {
    for line in h.get_all(name).iter().filter_map(|v| v.to_str().ok()) {
        buf.push_str(line);
        buf.push_str(", ");
    }
}

/// A trusted proxy's `Forwarded` chain, rebuilt from what the guard reads of it: each
/// element's `for=` (as `Guard::client_ip` finds it: the chain split at every `,`, an
/// element at every `;`) and its `proto=`, nothing else. A proxy may pass a client's own
/// elements on (many do, as they do `X-Forwarded-Host`), and a site may read the first
/// `host=` anywhere in the header (Spring's `ForwardedHeaderFilter` does): a client's
/// `host=`, even inside a quoted value or another pair's, named the host that site served,
/// another than the gate matched, and an unbalanced quote could hide the hops after it
/// from a site parsing quotes. So no `host=` but the gateway's own goes on, and a value
/// that is not an address, `unknown` or an obfuscated name is `unknown`.
fn push_forwarded_chain(buf: &mut String, h: &HeaderMap) {
    let lines = h.get_all(FORWARDED);
    for element in lines
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
    {
        let value = |name: &str| {
            element.split(';').find_map(|p| {
                let (k, v) = p.split_once('=')?;
                k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
            })
        };
        let Some(hop) = value("for") else {
            continue;
        };
        let bare = hop
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(hop);
        let plain = !bare.is_empty()
            && bare
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".:_-[]".contains(&b));
        buf.push_str("for=");
        match (plain, bare.contains([':', '['])) {
            (false, _) => buf.push_str("unknown"),
            (true, false) => buf.push_str(bare),
            (true, true) => {
                buf.push('"');
                buf.push_str(bare);
                buf.push('"');
            }
        }
        let proto = value("proto").map(|v| v.trim_matches('"'));
        if let Some(p) =
            proto.filter(|p| p.eq_ignore_ascii_case("http") || p.eq_ignore_ascii_case("https"))
        {
            buf.push_str(";proto=");
            buf.push_str(p);
        }
        buf.push_str(", ");
    }
}

/// `X-Forwarded-For` and `Forwarded` for a request from `ip` (canonical), each extending
/// the chain the request carries when `trusted`; `proto` is the protocol the request came
/// by. One buffer for both, each part written into it in place (the value copies it
/// once), rather than a string per part.
fn forwarding_values(
    h: &HeaderMap,
    ip: IpAddr,
    trusted: bool,
    host: Option<&str>,
    proto: &str,
) -> (Option<HeaderValue>, Option<HeaderValue>) {
    let mut buf = String::with_capacity(96);
    if trusted {
        push_lines(&mut buf, h, &X_FORWARDED_FOR);
    }
    push_ip(&mut buf, ip);
    let x_forwarded_for = value_of(&buf);
    buf.clear();
    if trusted {
        push_forwarded_chain(&mut buf, h);
    }
    buf.push_str(if ip.is_ipv4() { "for=" } else { "for=\"[" });
    push_ip(&mut buf, ip);
    if ip.is_ipv6() {
        buf.push_str("]\"");
    }
    if let Some(host) = host.filter(|h| !h.contains(['"', '\\'])) {
        buf.push_str(";host=\"");
        buf.push_str(host);
        buf.push('"');
    }
    buf.push_str(";proto=");
    buf.push_str(proto);
    (x_forwarded_for, value_of(&buf))
}

/// Joins the `cookie` fields of an HTTP/2 request into one, `"; "` between them, as a
/// request passed on over HTTP/1.1 must have them (RFC 9113 8.2.3: HTTP/2 clients may
/// split the cookies over many fields; an HTTP/1.1 origin may read only one line, or join
/// lines with `,`, which is not a cookie separator).
pub fn join_cookies(h: &mut HeaderMap) {
    let mut lines = h.get_all(header::COOKIE).iter();
    if lines.next().is_none() || lines.next().is_none() {
        return;
    }
    let joined: Vec<u8> = h
        .get_all(header::COOKIE)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect::<Vec<_>>()
        .join(&b"; "[..]);
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        h.insert(header::COOKIE, v);
    }
}

/// The headers of a request bound for the origin. `peer` is the connection's address,
/// `trusted` whether it is a trusted proxy, `client` the client's address as the guard
/// reads it (the peer, or behind a trusted proxy the address its chain names), `host` what
/// the client asked for; `kept`, the connection's last forwarding values, when the request
/// comes through a connection.
pub fn request_headers(
    h: &mut HeaderMap,
    peer: Option<IpAddr>,
    trusted: bool,
    client: Option<IpAddr>,
    host: Option<&str>,
    upgrade: Option<&HeaderValue>,
    kept: Option<&Forwarding>,
) {
    strip_hop_by_hop(h, |k| k == Kind::Own || (!trusted && k == Kind::Forwarding));
    let peer = peer.map(crate::config::guard::canonical);
    // From anyone but a trusted proxy the forwarding headers are gone now: not looked up
    // (each lookup of a name of our own hashes it, ~150 instructions).
    // Of several lines, the last is the nearest proxy's (as with the chains), and only it
    // goes on: the origin must not read a line the client wrote before it.
    let sent_proto = if trusted {
        crate::http::gate::last_line(h, &X_FORWARDED_PROTO).cloned()
    } else {
        None
    };
    let (proto, add_proto) = match &sent_proto {
        None => ("http", true),
        Some(p) if p.as_bytes().trim_ascii().eq_ignore_ascii_case(b"https") => ("https", false),
        Some(_) => ("http", false),
    };
    if let Some(p) = sent_proto.filter(|_| h.get_all(X_FORWARDED_PROTO).iter().nth(1).is_some()) {
        h.insert(X_FORWARDED_PROTO, p);
    }
    // `X-Forwarded-Host` is the host the gate matched (below), whoever sent one: a trusted
    // proxy may pass a client's own on untouched (AWS's load balancers do), and a site that
    // reads it (Express with `trust proxy`, Django's `USE_X_FORWARDED_HOST`, Rails) would
    // serve a page of a host the gate did not match.
    if host.is_none() {
        h.remove(X_FORWARDED_HOST);
    }
    let (x_forwarded_for, forwarded) = match (peer, kept) {
        (None, _) => (None, None),
        // Only from an untrusted peer: a trusted proxy's chains differ per request.
        (Some(ip), Some(kept)) if !trusted => {
            kept.values(ip, host, || forwarding_values(h, ip, trusted, host, proto))
        }
        (Some(ip), _) => forwarding_values(h, ip, trusted, host, proto),
    };
    // `X-Real-IP` is written, not only dropped: origins set up behind nginx read the client
    // from it (`proxy_set_header X-Real-IP $remote_addr`, Rails' and PHP's
    // `HTTP_X_REAL_IP`), and one that finds none falls back to its TCP peer, the gateway,
    // and counts every visitor as one address (one rate limit for all). It is one address,
    // never a chain, and none a client chooses: from an untrusted peer the address
    // `X-Forwarded-For` names (the very value, shared), behind a trusted proxy the client
    // the guard reads from its chain.
    if let Some(v) = x_forwarded_for {
        if !trusted {
            h.insert(X_REAL_IP, v.clone());
        }
        h.insert(X_FORWARDED_FOR, v);
    }
    if trusted {
        real_ip_behind_a_trusted_proxy(h, client);
    }
    if add_proto {
        h.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    if let Some(host) = host {
        // The client's own `Host` value when it is the host asked for: shared, not copied.
        // Otherwise (none, or an absolute-form target naming another host) `Host` becomes
        // the host asked for, the one the gate matched (RFC 9112 §3.2.2).
        let client_host = h.get(header::HOST);
        let same = client_host.is_some_and(|v| v.as_bytes() == host.as_bytes());
        let value = match client_host {
            Some(v) if same => Some(v.clone()),
            _ => value_of(host),
        };
        if let Some(v) = value {
            h.insert(X_FORWARDED_HOST, v.clone());
            if !same {
                h.insert(header::HOST, v);
            }
        }
    }
    if let Some(v) = forwarded {
        h.insert(FORWARDED, v);
    }
    if let Some(u) = upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, u.clone());
    }
}

/// Behind a trusted proxy, `X-Real-IP` is the client its chain names, whatever the proxy
/// sent: many load balancers set only `X-Forwarded-For` and pass a client's `X-Real-IP` on
/// untouched, and the chain is what waitroom itself reads the client from (the per-client
/// limits, the gate's bypass ranges), so the origin and waitroom never disagree on it.
/// Without a client (no peer address), none.
fn real_ip_behind_a_trusted_proxy(h: &mut HeaderMap, client: Option<IpAddr>) {
    let value = client.and_then(|ip| {
        let mut buf = String::with_capacity(39);
        push_ip(&mut buf, crate::config::guard::canonical(ip));
        value_of(&buf)
    });
    match value {
        Some(v) => {
            h.insert(X_REAL_IP, v);
        }
        None => {
            h.remove(X_REAL_IP);
        }
    }
}

/// Whether a message's `Transfer-Encoding` (`h` has one) is `chunked` alone, the only
/// coding the gateway passes on: it decodes the chunks and frames the message afresh for
/// the next hop, where any other coding (`gzip, chunked`) would arrive still applied with
/// nothing saying so. One line only, as nginx asks.
pub fn coded_by_chunks_alone(h: &HeaderMap) -> bool {
    let mut lines = h.get_all(header::TRANSFER_ENCODING).iter();
    match (lines.next(), lines.next()) {
        (Some(te), None) => te.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked"),
        _ => false,
    }
}

/// The headers of the origin's answer: hop-by-hop ones removed, but an accepted upgrade's
/// `Connection: upgrade` and `Upgrade` kept. Answers `false` for an answer whose framing
/// cannot be passed on faithfully (`502`, as nginx answers it): a transfer coding other
/// than `chunked` alone, which the client would get still encoded, with nothing saying so.
/// A `Content-Length` beside `Transfer-Encoding` goes (RFC 9112 §6.3): the body was read by
/// its chunks, and an answer framed by a stale length would reach the client cut short, or
/// not at all.
/// `bodiless`: an answer that has no body whatever its headers say (to `HEAD`, a `204`, a
/// `304`), whose `Transfer-Encoding` only says what a body would have had.
#[must_use]
pub fn response_headers(h: &mut HeaderMap, upgraded: Option<&HeaderValue>, bodiless: bool) -> bool {
    if !bodiless && h.contains_key(header::TRANSFER_ENCODING) {
        if !coded_by_chunks_alone(h) {
            return false;
        }
        h.remove(header::CONTENT_LENGTH);
    }
    // Read before it is stripped, and only for an upgrade: a lookup costs ~80 instructions
    // on every answer, and only an accepted upgrade keeps it.
    let answer = upgraded.and_then(|_| h.get(header::UPGRADE).cloned());
    strip_hop_by_hop(h, |_| false);
    if upgraded.is_some() {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Some(u) = answer {
            h.insert(header::UPGRADE, u);
        }
    }
    true
}

#[cfg(test)]
#[path = "forward_tests.rs"]
mod tests;
