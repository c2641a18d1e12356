//! Unit tests of the proxy's header rules in `forward.rs` (kept apart so that file stays the
//! rules).

use super::*;

#[test]
fn the_host_comes_from_the_authority_without_its_userinfo_or_host() {
    let req = |uri: &str| Request::builder().uri(uri).body(()).unwrap();
    let host = HeaderValue::from_static("shop.example");
    assert_eq!(host_from(Some(&host), &req("/x")).unwrap(), "shop.example");
    assert_eq!(host_from(None, &req("/x")), None);
    // An absolute-form target's authority wins over `Host`.
    let r = req("http://other.example/x");
    assert_eq!(host_from(Some(&host), &r).unwrap(), "other.example");
    assert_eq!(host_from(None, &r).unwrap(), "other.example");
    let r = req("http://user:s3cret@other.example:8080/x");
    assert_eq!(host_from(None, &r).unwrap(), "other.example:8080");
    // An authority that is no host and port names no host.
    for bad in ["http://shop.example;x/x", "http://shop..example:80/x"] {
        assert_eq!(host_from(Some(&host), &req(bad)), None, "{bad}");
    }
}

/// The origin's `Host` is the host asked for: the client's own line when it is that
/// host, else replaced (an absolute-form target naming another) or added.
#[test]
fn the_origin_is_sent_the_host_asked_for() {
    for (sent, asked) in [
        (Some("shop.example"), "shop.example"),
        (Some("other.example"), "shop.example"),
        (None, "shop.example"),
    ] {
        let mut h = headers(&sent.map(|s| ("host", s)).into_iter().collect::<Vec<_>>());
        request_headers(&mut h, None, false, None, Some(asked), None, None);
        let lines: Vec<_> = h.get_all(header::HOST).iter().collect();
        assert_eq!(lines, [asked], "{sent:?}");
        assert_eq!(h["x-forwarded-host"], asked);
    }
}

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

/// The headers other than the forwarding ones that origins read the client's address
/// from.
const CLIENT_IP: [&str; 12] = [
    "true-client-ip",
    "client-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "fly-client-ip",
    "x-originating-ip",
    "x-remote-ip",
    "x-remote-addr",
    "x-forwarded",
    "forwarded-for",
];

/// The scheme, port and prefix as frameworks read them besides `X-Forwarded-Proto`.
const SCHEME: [&str; 6] = [
    "x-forwarded-ssl",
    "x-forwarded-scheme",
    "front-end-https",
    "x-url-scheme",
    "x-forwarded-port",
    "x-forwarded-prefix",
];

/// Every name of the three lists gets its kind, by the constants the rest of the code
/// uses (a typo in `kind`'s texts would let a header through), and others none.
#[test]
fn header_kinds() {
    use crate::http::gate::{X_WAITROOM_BYPASS, X_WAITROOM_SESSION, X_WAITROOM_USER};
    let hop = [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ];
    for n in &hop {
        assert!(kind(n) == Kind::HopByHop, "{n}");
    }
    for n in [
        X_FORWARDED_FOR,
        X_FORWARDED_PROTO,
        X_FORWARDED_HOST,
        FORWARDED,
        X_REAL_IP,
    ] {
        assert!(kind(&n) == Kind::Forwarding, "{n}");
    }
    for n in CLIENT_IP.into_iter().chain(SCHEME) {
        assert!(kind(&HeaderName::from_static(n)) == Kind::Forwarding, "{n}");
    }
    for n in [X_WAITROOM_USER, X_WAITROOM_SESSION, X_WAITROOM_BYPASS] {
        assert!(kind(&n) == Kind::Own, "{n}");
    }
    for n in [
        "x-original-url",
        "x_original_url",
        "x-rewrite-url",
        "x_rewrite_url",
        "x-original-uri",
    ] {
        assert!(kind(&HeaderName::from_static(n)) == Kind::Own, "{n}");
    }
    for n in [
        "host",
        "user-agent",
        "content-type",
        "x-forward",
        "tee",
        "upgrades",
        "content-type",
        "cf-ray",
        "x-real-ips",
        "client_id",
    ] {
        let n = HeaderName::from_static(n);
        assert!(kind(&n) == Kind::Other, "{n}");
    }
}

/// The quick filter lets through every `_` spelling of every name of ours that has a
/// `-` (each `-` or any of them replaced).
#[test]
fn every_underscore_spelling_passes_the_filter() {
    let ours = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
        "forwarded",
        "x-waitroom-user",
        "x-waitroom-session",
        "x-waitroom-bypass",
        "x-original-url",
        "x-rewrite-url",
        "x-original-uri",
    ];
    for name in ours.into_iter().chain(CLIENT_IP).chain(SCHEME) {
        assert_ne!(named_kind(name), Kind::Other, "{name}");
        let dashes: Vec<usize> = name.match_indices('-').map(|(i, _)| i).collect();
        for mask in 1..(1u32 << dashes.len()) {
            let mut b = name.as_bytes().to_vec();
            for (bit, &i) in dashes.iter().enumerate() {
                if mask & (1 << bit) != 0 {
                    b[i] = b'_';
                }
            }
            let spelled = String::from_utf8(b).unwrap();
            assert!(could_be_ours_with_underscores(&spelled), "{spelled}");
            assert_ne!(
                kind(&HeaderName::from_bytes(spelled.as_bytes()).unwrap()),
                Kind::Other
            );
        }
    }
}

/// A name that CGI-style origins read as one of ours (`_` for `-`) is dropped, whoever
/// sends it; other names with `_` are not.
#[test]
fn underscore_spellings_of_our_names_never_go_on() {
    for trusted in [false, true] {
        let mut h = headers(&[
            ("x_waitroom_user", "admin"),
            ("x-waitroom_session", "forged"),
            ("x_forwarded_for", "6.6.6.6"),
            ("x_real_ip", "6.6.6.6"),
            ("true_client-ip", "6.6.6.6"),
            ("cf_connecting_ip", "6.6.6.6"),
            ("transfer_encoding", "chunked"),
            ("x_custom_thing", "kept"),
            ("client_id", "kept"),
        ]);
        request_headers(
            &mut h,
            Some("10.0.0.5".parse().unwrap()),
            trusted,
            None,
            None,
            None,
            None,
        );
        for gone in [
            "x_waitroom_user",
            "x-waitroom_session",
            "x_forwarded_for",
            "x_real_ip",
            "true_client-ip",
            "cf_connecting_ip",
            "transfer_encoding",
        ] {
            assert!(
                !h.contains_key(gone),
                "{gone} forwarded (trusted: {trusted})"
            );
        }
        assert_eq!(h["x_custom_thing"], "kept");
        assert_eq!(h["client_id"], "kept");
    }
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
        ("x-real-ip", "6.6.6.6"),
    ]);
    for n in CLIENT_IP.into_iter().chain(SCHEME) {
        h.append(n, HeaderValue::from_static("6.6.6.6"));
    }
    request_headers(
        &mut h,
        Some("10.0.0.5".parse().unwrap()),
        false,
        Some("10.0.0.5".parse().unwrap()),
        Some("shop.example"),
        None,
        None,
    );
    assert_eq!(h["x-forwarded-for"], "10.0.0.5");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(
        h["forwarded"],
        "for=10.0.0.5;host=\"shop.example\";proto=http"
    );
    assert_eq!(h["x-forwarded-host"], "shop.example");
    let real: Vec<_> = h.get_all("x-real-ip").iter().collect();
    assert_eq!(real, ["10.0.0.5"]);
    for n in CLIENT_IP.into_iter().chain(SCHEME) {
        assert!(!h.contains_key(n), "{n} forwarded");
    }
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
        Some("203.0.113.9".parse().unwrap()),
        Some("shop.example"),
        None,
        None,
    );
    assert_eq!(h["x-forwarded-for"], "203.0.113.9, ::1");
    assert_eq!(h["x-forwarded-proto"], "https");
    assert_eq!(
        h["forwarded"],
        "for=203.0.113.9;proto=https, for=\"[::1]\";host=\"shop.example\";proto=https"
    );
    // The proxy said nothing of `X-Real-IP`: the client its chain names.
    assert_eq!(h["x-real-ip"], "203.0.113.9");
}

/// Of a trusted proxy's `Forwarded` chain only each element's `for=` and `proto=` go on:
/// a client's own element it passed on named, with a `host=` anywhere in it (a site may
/// read the first in the header), the host a site served; an unbalanced quote hid the hops
/// after it. What the guard reads of the chain (its `for=`s) is what goes on.
#[test]
fn a_forwarded_chain_names_only_the_host_the_gate_matched() {
    let mut h = headers(&[
        ("x-forwarded-for", "203.0.113.9"),
        (
            "forwarded",
            "for=6.6.6.6;Host=evil.example;proto=https, for=\"[2001:db8::1]:443\";xhost=evil",
        ),
        (
            "forwarded",
            "for=host=evil, by=x, for=\"7.7.7.7;host=evil\"",
        ),
        (
            "forwarded",
            "for=_hidden;by=\"host=evil\", for=\"6.6.6.6, for=203.0.113.9;proto=HTTPS",
        ),
    ]);
    request_headers(
        &mut h,
        Some("10.0.0.1".parse().unwrap()),
        true,
        Some("203.0.113.9".parse().unwrap()),
        Some("shop.example"),
        None,
        None,
    );
    let sent = h["forwarded"].to_str().unwrap();
    assert_eq!(
        sent,
        "for=6.6.6.6;proto=https, for=\"[2001:db8::1]:443\", for=unknown, for=unknown, \
         for=_hidden, for=unknown, for=203.0.113.9;proto=HTTPS, \
         for=10.0.0.1;host=\"shop.example\";proto=http"
    );
    assert_eq!(sent.to_ascii_lowercase().matches("host=").count(), 1);
}

/// A trusted proxy's own client headers are kept as they came, but `X-Real-IP`, which
/// is the client its chain names whatever the proxy passed on.
#[test]
fn a_trusted_proxys_client_headers_are_kept() {
    let mut h = headers(&[
        ("x-forwarded-for", "203.0.113.9"),
        ("x-real-ip", "6.6.6.6"),
        ("x-real-ip", "198.51.100.4"),
    ]);
    for n in CLIENT_IP.into_iter().chain(SCHEME) {
        h.append(n, HeaderValue::from_static("198.51.100.4"));
    }
    request_headers(
        &mut h,
        Some("10.0.0.1".parse().unwrap()),
        true,
        Some("203.0.113.9".parse().unwrap()),
        None,
        None,
        None,
    );
    let real: Vec<_> = h.get_all("x-real-ip").iter().collect();
    assert_eq!(real, ["203.0.113.9"]);
    for n in CLIENT_IP.into_iter().chain(SCHEME) {
        assert_eq!(h[n], "198.51.100.4", "{n}");
    }
    assert_eq!(h["x-forwarded-for"], "203.0.113.9, 10.0.0.1");
}

#[test]
fn hop_by_hop_headers_go_and_the_rest_stay() {
    let mut h = headers(&[
        ("host", "shop.example"),
        ("accept", "*/*"),
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("proxy-authorization", "Basic eA=="),
        ("transfer-encoding", "chunked"),
        ("trailer", "x-sum"),
        ("x-custom", "kept"),
    ]);
    request_headers(&mut h, None, false, None, Some("shop.example"), None, None);
    for gone in [
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "transfer-encoding",
        "trailer",
    ] {
        assert!(!h.contains_key(gone), "{gone} forwarded");
    }
    assert_eq!(h["host"], "shop.example");
    assert_eq!(h["x-forwarded-host"], "shop.example");
    assert_eq!(h["accept"], "*/*");
    assert_eq!(h["x-custom"], "kept");
    // Nothing to strip: the client's headers are left as they came.
    let mut plain = headers(&[("host", "a.example"), ("accept", "*/*")]);
    request_headers(
        &mut plain,
        Some("192.0.2.1".parse().unwrap()),
        false,
        Some("192.0.2.1".parse().unwrap()),
        None,
        None,
        None,
    );
    assert_eq!(plain["host"], "a.example");
    assert_eq!(plain["accept"], "*/*");
    assert_eq!(plain["x-forwarded-for"], "192.0.2.1");
    assert_eq!(plain["forwarded"], "for=192.0.2.1;proto=http");
    assert_eq!(plain["x-real-ip"], "192.0.2.1");
    assert_eq!(plain.len(), 6);
}

#[test]
fn addresses_are_written_as_display_writes_them() {
    for ip in [
        "0.0.0.0",
        "9.10.99.100",
        "127.0.0.1",
        "255.255.255.255",
        "203.0.113.9",
        "::1",
        "2001:db8::8a2e:370:7334",
    ] {
        let ip: IpAddr = ip.parse().unwrap();
        let mut buf = String::new();
        push_ip(&mut buf, ip);
        assert_eq!(buf, ip.to_string());
    }
}

#[test]
fn split_cookies_are_joined_into_one_line() {
    let mut h = HeaderMap::new();
    h.append(header::COOKIE, HeaderValue::from_static("a=1"));
    h.append(header::COOKIE, HeaderValue::from_static("b=2; c=3"));
    join_cookies(&mut h);
    let lines: Vec<_> = h.get_all(header::COOKIE).iter().collect();
    assert_eq!(lines, ["a=1; b=2; c=3"]);
    let mut one = HeaderMap::new();
    one.insert(header::COOKIE, HeaderValue::from_static("a=1"));
    join_cookies(&mut one);
    assert_eq!(one[header::COOKIE], "a=1");
}

#[test]
fn upgrades_keep_their_headers() {
    let mut h = headers(&[
        ("connection", "keep-alive, Upgrade"),
        ("upgrade", "websocket"),
    ]);
    let u = upgrade_of(&h);
    assert_eq!(u.as_ref().unwrap(), "websocket");
    request_headers(&mut h, None, false, None, None, u.as_ref(), None);
    assert_eq!(h["connection"], "upgrade");
    assert_eq!(h["upgrade"], "websocket");
    let mut r = headers(&[
        ("connection", "upgrade"),
        ("upgrade", "websocket"),
        ("keep-alive", "5"),
    ]);
    assert!(response_headers(&mut r, u.as_ref(), false));
    assert_eq!(r["upgrade"], "websocket");
    assert!(!r.contains_key("keep-alive"));
    let mut plain = headers(&[("connection", "close"), ("upgrade", "h2c")]);
    assert!(response_headers(&mut plain, None, false));
    assert!(plain.is_empty());
}

/// The origin's `Connection: keep-alive` (the answer of nearly every origin) goes, with
/// the headers it names whatever their case, and nothing else does. Several `Connection`
/// values are all honoured.
#[test]
fn an_answers_connection_goes_with_what_it_names() {
    let mut r = headers(&[
        ("content-type", "text/plain"),
        ("connection", "keep-alive"),
        ("content-length", "2"),
    ]);
    assert!(response_headers(&mut r, None, false));
    assert_eq!(
        r,
        headers(&[("content-type", "text/plain"), ("content-length", "2")])
    );
    let mut named = headers(&[
        ("connection", "Keep-Alive, X-Secret-Hop, , not a name"),
        ("keep-alive", "timeout=5"),
        ("x-secret-hop", "1"),
        ("x-kept", "yes"),
    ]);
    assert!(response_headers(&mut named, None, false));
    assert_eq!(named, headers(&[("x-kept", "yes")]));
    let mut several = headers(&[
        ("connection", "keep-alive"),
        ("connection", "x-secret-hop"),
        ("x-secret-hop", "1"),
        ("te", "trailers"),
        ("x-kept", "yes"),
    ]);
    assert!(response_headers(&mut several, None, false));
    assert_eq!(several, headers(&[("x-kept", "yes")]));
}

/// A connection's kept forwarding values are exactly what writing them in full gives,
/// for the same peer and host only: another host or peer is written afresh, a client's
/// own forwarding headers never reach them, and a trusted proxy's chains (which differ
/// per request) are never taken from them.
#[test]
fn kept_forwarding_values_stand_for_the_same_peer_and_host_only() {
    let kept = Forwarding::default();
    let send = |pairs: &[(&str, &str)], peer: &str, trusted: bool, host: Option<&str>| {
        let peer: IpAddr = peer.parse().unwrap();
        let (mut with, mut without) = (headers(pairs), headers(pairs));
        let client = Some(peer);
        request_headers(
            &mut with,
            Some(peer),
            trusted,
            client,
            host,
            None,
            Some(&kept),
        );
        request_headers(&mut without, Some(peer), trusted, client, host, None, None);
        assert_eq!(with, without, "{pairs:?} {peer} {trusted} {host:?}");
        with
    };
    let h = send(
        &[("host", "a.example")],
        "192.0.2.1",
        false,
        Some("a.example"),
    );
    assert_eq!(
        h["forwarded"],
        "for=192.0.2.1;host=\"a.example\";proto=http"
    );
    // A forged chain from the same untrusted client: still replaced.
    let forged = [
        ("host", "a.example"),
        ("x-forwarded-for", "6.6.6.6"),
        ("forwarded", "for=6.6.6.6"),
        ("x-forwarded-proto", "https"),
    ];
    let h = send(&forged, "192.0.2.1", false, Some("a.example"));
    assert_eq!(h["x-forwarded-for"], "192.0.2.1");
    // Another host on the same connection, then none, then another peer.
    let h = send(
        &[("host", "b.example")],
        "192.0.2.1",
        false,
        Some("b.example"),
    );
    assert_eq!(
        h["forwarded"],
        "for=192.0.2.1;host=\"b.example\";proto=http"
    );
    let h = send(&[], "192.0.2.1", false, None);
    assert_eq!(h["forwarded"], "for=192.0.2.1;proto=http");
    let h = send(&[], "::ffff:198.51.100.7", false, None);
    assert_eq!(h["x-forwarded-for"], "198.51.100.7");
    // A trusted proxy: its chains are extended, request by request.
    for chain in ["203.0.113.9", "203.0.113.10"] {
        let h = send(
            &[("x-forwarded-for", chain), ("forwarded", "for=x")],
            "10.0.0.1",
            true,
            Some("a.example"),
        );
        assert_eq!(h["x-forwarded-for"], format!("{chain}, 10.0.0.1").as_str());
    }
    let h = send(&[], "10.0.0.1", false, Some("a.example"));
    assert_eq!(h["forwarded"], "for=10.0.0.1;host=\"a.example\";proto=http");
}
