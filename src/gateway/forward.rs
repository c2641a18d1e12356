//! The header rules of a proxy (RFC 9110 §7.6): hop-by-hop headers end at each hop, the
//! origin is told who the client is (`X-Forwarded-For`, `X-Forwarded-Proto`,
//! `X-Forwarded-Host`, RFC 7239 `Forwarded`), and the headers waitroom vouches for
//! (`X-Waitroom-User`, `X-Waitroom-Session`) or reads (`X-Waitroom-Bypass`) never come from
//! the client.
//!
//! A client's own forwarding headers are believed only from a trusted proxy
//! (`trusted_proxies`), whose chain is kept and extended; from anyone else they are
//! replaced, so a client cannot tell the origin it is someone else.

use std::net::IpAddr;

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};

use crate::http::gate::{X_WAITROOM_BYPASS, X_WAITROOM_SESSION, X_WAITROOM_USER};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const FORWARDED: HeaderName = HeaderName::from_static("forwarded");

/// Headers that concern one connection only, never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The host the client asked for: `Host`, or the authority of an HTTP/2 request.
pub fn host_of(req: &Request) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
}

/// The protocol a request asks to upgrade to (`Connection: upgrade` with `Upgrade`).
pub fn upgrade_of(h: &HeaderMap) -> Option<HeaderValue> {
    let asks = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| h.get(header::UPGRADE).cloned()).flatten()
}

/// Removes the hop-by-hop headers, those `Connection` names included.
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(*n);
    }
}

/// `for=` of RFC 7239: an IPv6 address is quoted and bracketed.
fn forwarded_for(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("for={v4}"),
        IpAddr::V6(v6) => format!("for=\"[{v6}]\""),
    }
}

/// The headers of a request bound for the origin. `peer` is the connection's address,
/// `trusted` whether it is a trusted proxy, `host` what the client asked for.
pub fn request_headers(
    h: &mut HeaderMap,
    peer: Option<IpAddr>,
    trusted: bool,
    host: Option<&str>,
    upgrade: Option<&HeaderValue>,
) {
    strip_hop_by_hop(h);
    for n in [X_WAITROOM_USER, X_WAITROOM_SESSION, X_WAITROOM_BYPASS] {
        h.remove(n);
    }
    if !trusted {
        for n in [
            X_FORWARDED_FOR,
            X_FORWARDED_PROTO,
            X_FORWARDED_HOST,
            FORWARDED,
        ] {
            h.remove(n);
        }
    }
    let peer = peer.map(crate::config::guard::canonical);
    if let Some(ip) = peer {
        let xff = match h.get(X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
            Some(chain) => format!("{chain}, {ip}"),
            None => ip.to_string(),
        };
        if let Ok(v) = HeaderValue::from_str(&xff) {
            h.insert(X_FORWARDED_FOR, v);
        }
    }
    if !h.contains_key(X_FORWARDED_PROTO) {
        h.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    let proto = h
        .get(X_FORWARDED_PROTO)
        .and_then(|v| v.to_str().ok())
        .map_or("http", |p| {
            if p.trim().eq_ignore_ascii_case("https") {
                "https"
            } else {
                "http"
            }
        });
    if let Some(host) = host {
        if !h.contains_key(X_FORWARDED_HOST) {
            if let Ok(v) = HeaderValue::from_str(host) {
                h.insert(X_FORWARDED_HOST, v);
            }
        }
        if !h.contains_key(header::HOST) {
            if let Ok(v) = HeaderValue::from_str(host) {
                h.insert(header::HOST, v);
            }
        }
    }
    if let Some(ip) = peer {
        let mut element = forwarded_for(ip);
        if let Some(host) = host.filter(|h| !h.contains(['"', '\\'])) {
            element.push_str(&format!(";host=\"{host}\""));
        }
        element.push_str(&format!(";proto={proto}"));
        let value = match h.get(FORWARDED).and_then(|v| v.to_str().ok()) {
            Some(chain) => format!("{chain}, {element}"),
            None => element,
        };
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(FORWARDED, v);
        }
    }
    if let Some(u) = upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, u.clone());
    }
}

/// The headers of the origin's answer: hop-by-hop ones removed, but an accepted upgrade's
/// `Connection: upgrade` and `Upgrade` kept.
pub fn response_headers(h: &mut HeaderMap, upgraded: Option<&HeaderValue>) {
    let answer = h.get(header::UPGRADE).cloned();
    strip_hop_by_hop(h);
    if upgraded.is_some() {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Some(u) = answer {
            h.insert(header::UPGRADE, u);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn an_untrusted_client_cannot_forge_who_it_is() {
        let mut h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-proto", "https"),
            ("forwarded", "for=6.6.6.6"),
            ("x-waitroom-user", "admin"),
            ("x-waitroom-session", "forged"),
            ("x-waitroom-bypass", "guess"),
            ("connection", "keep-alive, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("te", "trailers"),
        ]);
        request_headers(
            &mut h,
            Some("10.0.0.5".parse().unwrap()),
            false,
            Some("shop.example"),
            None,
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.5");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(
            h["forwarded"],
            "for=10.0.0.5;host=\"shop.example\";proto=http"
        );
        assert_eq!(h["x-forwarded-host"], "shop.example");
        for gone in [
            "x-waitroom-user",
            "x-waitroom-session",
            "x-waitroom-bypass",
            "connection",
            "x-secret-hop",
            "te",
        ] {
            assert!(!h.contains_key(gone), "{gone} forwarded");
        }
    }

    #[test]
    fn a_trusted_proxy_chain_is_extended() {
        let mut h = headers(&[
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-proto", "https"),
            ("forwarded", "for=203.0.113.9;proto=https"),
        ]);
        request_headers(
            &mut h,
            Some("::1".parse().unwrap()),
            true,
            Some("shop.example"),
            None,
        );
        assert_eq!(h["x-forwarded-for"], "203.0.113.9, ::1");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(
            h["forwarded"],
            "for=203.0.113.9;proto=https, for=\"[::1]\";host=\"shop.example\";proto=https"
        );
    }

    #[test]
    fn upgrades_keep_their_headers() {
        let mut h = headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
        ]);
        let u = upgrade_of(&h);
        assert_eq!(u.as_ref().unwrap(), "websocket");
        request_headers(&mut h, None, false, None, u.as_ref());
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["upgrade"], "websocket");
        let mut r = headers(&[
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
            ("keep-alive", "5"),
        ]);
        response_headers(&mut r, u.as_ref());
        assert_eq!(r["upgrade"], "websocket");
        assert!(!r.contains_key("keep-alive"));
        let mut plain = headers(&[("connection", "close"), ("upgrade", "h2c")]);
        response_headers(&mut plain, None);
        assert!(plain.is_empty());
    }
}
