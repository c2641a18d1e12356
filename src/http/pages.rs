//! The pages people see, embedded in the binary: the waiting room (`/wait/{event_id}`), the
//! landing page (`/`), the demo event's booking page (`/demo/booking`) and the operator's
//! dashboard (`/admin`), plus one event's public figures (`/api/v1/events/{event_id}`; the
//! list of all is `public_list.rs`).
//!
//! Everything is plain HTML, CSS and JavaScript under `src/http/assets/`, compiled in with
//! `include_str!`: one binary serves the whole journey, and no page loads anything from
//! outside the server (no CDN, no web fonts). The pages are static but for the waiting
//! room, which the server fills with its event's look and words (`look.rs`); all other data
//! comes from the public API, so operators can restyle or replace them without touching the
//! server. A
//! strict Content-Security-Policy (same origin only, no inline script) makes an injected
//! string in an event name harmless even if a page forgot to escape it.
//!
//! Assets answer with an `ETag` (a hash of their bytes) and `no-cache`, so browsers revalidate
//! cheaply and never run a stale script after an upgrade.

use std::collections::HashMap;
use std::sync::LazyLock;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Json;
use sha2::{Digest, Sha256};

use super::body::PublicEvent;
use super::error::{AppError, AppResult};
use super::extract::AppPath;
use super::Shared;
use crate::app::AppState;
use crate::core::validate_event_id;

/// One embedded file.
struct Asset {
    content_type: &'static str,
    body: &'static str,
    etag: HeaderValue,
    /// The body gzipped, and its own tag (a strong tag names one representation), when
    /// that is smaller. Made once: a flash crowd loads every file at once, and the script
    /// and the stylesheet shrink to about a quarter.
    gzip: Option<(Vec<u8>, HeaderValue)>,
}

/// The body gzipped, if that saves anything.
fn gzipped(body: &str) -> Option<Vec<u8>> {
    use std::io::Write as _;
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    z.write_all(body.as_bytes()).ok()?;
    let out = z.finish().ok()?;
    (out.len() < body.len()).then_some(out)
}

/// Whether `Accept-Encoding` takes gzip: `gzip` (or `x-gzip`, or `*` when gzip is not
/// named) with a weight above zero (RFC 9110 §12.5.3).
pub(super) fn accepts_gzip(request: &HeaderMap) -> bool {
    let mut star = false;
    for line in request.get_all(header::ACCEPT_ENCODING) {
        let Ok(line) = line.to_str() else { continue };
        for item in line.split(',') {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            let weight = parts
                .filter_map(|p| p.trim().strip_prefix("q=").or(p.trim().strip_prefix("Q=")))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                return weight > 0.0;
            }
            if coding == "*" {
                star = weight > 0.0;
            }
        }
    }
    star
}

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// Pages by name, and the files under `/assets/`.
static ASSETS: LazyLock<HashMap<&'static str, Asset>> = LazyLock::new(|| {
    // `wait.html` is a template: `look.rs` renders it per event.
    let files: [(&str, &str, &str); 11] = [
        ("index.html", HTML, include_str!("assets/index.html")),
        ("booking.html", HTML, include_str!("assets/booking.html")),
        ("admin.html", HTML, include_str!("assets/admin.html")),
        ("style.css", CSS, include_str!("assets/style.css")),
        ("common.js", JS, include_str!("assets/common.js")),
        ("index.js", JS, include_str!("assets/index.js")),
        ("wait.js", JS, include_str!("assets/wait.js")),
        ("booking.js", JS, include_str!("assets/booking.js")),
        ("admin.js", JS, include_str!("assets/admin.js")),
        ("pow-worker.js", JS, include_str!("assets/pow-worker.js")),
        ("icon.svg", SVG, include_str!("assets/icon.svg")),
    ];
    files
        .into_iter()
        .map(|(name, content_type, body)| {
            let hash = Sha256::digest(body.as_bytes());
            let tag: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
            let etag = HeaderValue::from_str(&format!("\"{tag}\"")).expect("hex is a valid header");
            let gzip = gzipped(body).map(|z| {
                let tag =
                    HeaderValue::from_str(&format!("\"{tag}-gz\"")).expect("hex is a valid header");
                (z, tag)
            });
            (
                name,
                Asset {
                    content_type,
                    body,
                    etag,
                    gzip,
                },
            )
        })
        .collect()
});

/// Same origin only; no inline script or style. `connect-src 'self'` covers the page's own
/// `ws://`/`wss://` origin in current browsers; for older ones (Safari before 15.4) the
/// page's own host is named too, in place of the `ws: wss:` here ([`own_sockets`]): those
/// scheme sources alone would let a socket reach any host. The proof-of-work solver runs
/// as a worker from our own origin (`worker-src 'self'`).
pub(super) const CSP: &str =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self' ws: wss:; worker-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
     form-action 'self'";

/// The dashboard's policy: the pages' own, except that images may come from any `https`
/// origin, so that the look editor's preview shows an event's logo before it is saved.
/// Still no script, style or connection beyond this server.
const ADMIN_CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data: https:; connect-src 'self' ws: wss:; worker-src 'self'; \
     frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// `csp` with its `ws: wss:` (sockets to any host) narrowed to the host the page was asked
/// of, `ws://HOST wss://HOST`, when the request's `Host` is a plain authority (letters,
/// digits, `.-:[]`); otherwise dropped, leaving `'self'`.
pub(super) fn own_sockets(csp: &str, request: &HeaderMap) -> String {
    let host = request
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 255
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        });
    let own = host.map_or_else(String::new, |h| format!(" ws://{h} wss://{h}"));
    csp.replacen(" ws: wss:", &own, 1)
}

/// Whether a request's `If-None-Match` names the answer's `etag` (RFC 9110 §13.1.2): `*`,
/// or any entity tag of its list, compared weakly (`W/"x"` names `"x"`: a proxy that
/// changed a file's encoding weakens its tag). A list that breaks off (no closing quote)
/// names nothing past the break. The fields of several `If-None-Match` lines are one list.
pub(super) fn none_match(request: &HeaderMap, etag: &HeaderValue) -> bool {
    let own = etag.as_bytes();
    let own = own.strip_prefix(b"W/").unwrap_or(own);
    request
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .any(|field| names_tag(field.as_bytes(), own))
}

/// Whether one `If-None-Match` field is `*` or lists `own` (quoted, without `W/`).
fn names_tag(field: &[u8], own: &[u8]) -> bool {
    let separator = |b: &u8| matches!(b, b' ' | b'\t' | b',');
    if field.trim_ascii() == b"*" {
        return true;
    }
    let mut rest = field;
    loop {
        let start = rest
            .iter()
            .position(|b| !separator(b))
            .unwrap_or(rest.len());
        rest = &rest[start..];
        if rest.is_empty() {
            return false;
        }
        rest = rest.strip_prefix(b"W/").unwrap_or(rest);
        let Some(end) = rest
            .strip_prefix(b"\"")
            .and_then(|inner| inner.iter().position(|&b| b == b'"'))
        else {
            return false;
        };
        let (tag, after) = rest.split_at(end + 2);
        if tag == own {
            return true;
        }
        rest = after;
    }
}

/// Whether `/assets/{name}` is one of the embedded files (in gateway mode every other
/// `/assets/…` path belongs to the site behind).
pub fn is_asset(name: &str) -> bool {
    !name.ends_with(".html") && ASSETS.contains_key(name)
}

fn serve(name: &str, request: &HeaderMap) -> Response {
    let Some(asset) = ASSETS.get(name) else {
        return AppError::NotFound.into_response();
    };
    let gzip = asset.gzip.as_ref().filter(|_| accepts_gzip(request));
    let etag = gzip.map_or(&asset.etag, |(_, tag)| tag);
    let fresh = none_match(request, etag);
    let mut res = match gzip {
        _ if fresh => StatusCode::NOT_MODIFIED.into_response(),
        Some((body, _)) => (
            [
                (header::CONTENT_TYPE, asset.content_type),
                (header::CONTENT_ENCODING, "gzip"),
            ],
            &body[..],
        )
            .into_response(),
        None => ([(header::CONTENT_TYPE, asset.content_type)], asset.body).into_response(),
    };
    let h = res.headers_mut();
    h.insert(header::ETAG, etag.clone());
    // Whether the answer is gzipped depends on the request's `Accept-Encoding`: a shared
    // cache must not hand the gzipped file to a client that did not ask for it.
    h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if asset.content_type == HTML {
        let csp = if name == "admin.html" { ADMIN_CSP } else { CSP };
        if let Ok(v) = HeaderValue::from_str(&own_sockets(csp, request)) {
            h.insert(header::CONTENT_SECURITY_POLICY, v);
        }
        // The booking page's URL carries an access token; it must not leak to other sites.
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
    }
    res
}

/// `GET /`: the events a person can join; straight to the waiting room when there is just
/// one (typically the demo), so a newcomer lands in a queue at once. Which events there are
/// comes from the shared public list: a crowd at the landing page costs no store reads.
pub async fn index(State(shared): State<Shared>, headers: HeaderMap) -> Response {
    if let Ok(list) = shared.public_list().current(&shared.app().clock).await {
        if let [only] = list.ids() {
            return Redirect::to(&format!("/wait/{only}")).into_response();
        }
    }
    serve("index.html", &headers)
}

/// `GET /demo/booking`: the demo event's protected site.
pub async fn booking(headers: HeaderMap) -> Response {
    serve("booking.html", &headers)
}

/// `GET /admin`: the dashboard; it asks for the admin token itself and calls the admin API.
pub async fn admin(headers: HeaderMap) -> Response {
    serve("admin.html", &headers)
}

/// `GET /assets/{file}`
pub async fn asset(AppPath(name): AppPath<String>, headers: HeaderMap) -> Response {
    if name.ends_with(".html") {
        return AppError::NotFound.into_response();
    }
    serve(&name, &headers)
}

/// `GET /api/v1/events/{event_id}`: one event's public figures and its `target_url`.
pub async fn get_event(
    State(state): State<AppState>,
    AppPath(id): AppPath<String>,
) -> AppResult<Json<PublicEvent>> {
    validate_event_id(&id)?;
    let snap = state.store.get_event(&id, state.clock.now()).await?;
    Ok(Json(PublicEvent::new(snap, state.clock.now())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `If-None-Match` in each form RFC 9110 §13.1.2 allows, compared weakly.
    #[test]
    fn if_none_match_takes_weak_tags_lists_and_any() {
        let etag = HeaderValue::from_static("\"abc\"");
        let sent = |fields: &[&str]| {
            let mut h = HeaderMap::new();
            for f in fields {
                h.append(header::IF_NONE_MATCH, HeaderValue::from_str(f).unwrap());
            }
            none_match(&h, &etag)
        };
        for fields in [
            &["\"abc\""][..],
            &["W/\"abc\""],
            &["\"x\", \"abc\""],
            &["\"x\",W/\"abc\""],
            &[" ,\t\"x\" ,, \"abc\" "],
            &["\"a,b\", \"abc\""],
            &["*"],
            &[" * "],
            &["\"x\"", "\"abc\""],
        ] {
            assert!(sent(fields), "{fields:?}");
        }
        for fields in [
            &[][..],
            &[""],
            &["abc"],
            &["\"ab\""],
            &["\"abcd\""],
            &["\"ABC\""],
            &["w/\"abc\""],
            &["\"x\", W/\"y\""],
            &["\"abc"],
            &["\"x, \"abc\""],
            &["\"x\" junk, \"abc\""],
            &["\"x\", *"],
        ] {
            assert!(!sent(fields), "{fields:?}");
        }
        // A weak tag of the answer's own is named by its strong form too.
        let mut h = HeaderMap::new();
        h.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"abc\""));
        assert!(none_match(&h, &HeaderValue::from_static("W/\"abc\"")));
    }

    #[test]
    fn every_asset_is_embedded_and_small() {
        let total: usize = ASSETS.values().map(|a| a.body.len()).sum();
        assert_eq!(ASSETS.len(), 11);
        // Small enough to load instantly on a phone on a poor network. (124 KiB since the
        // theme's readable ink, which the dashboard's preview computes as the page does;
        // 126 KiB since the pages keep the keyboard focus and a place through a poll limit,
        // and the dashboard asks who waits before it clears; 130 KiB since the dashboard
        // draws only the cards in view and writes only the cards that changed; 131 KiB
        // since the waiting page gives up a silent socket and narrows its countdown; 132 KiB
        // since the landing page and the seat map update in place, keeping the focus; 133
        // KiB since a tab forgets only its own place and the buy button waits for a seat;
        // 135 KiB since each person's place in a shared browser has its own slot, and a
        // tab remembers whose place it shows; 136 KiB since the dashboard refuses a number
        // the browser cannot read; 137 KiB since the seat map ends with its session and
        // hands the focus on; 138 KiB since the landing page hands on the focus of a link
        // that went; 139 KiB since the pages without scripts say they need them and the
        // seats keep a size to tap, wrapping a long row.)
        assert!(total < 139 * 1024, "assets grew to {total} bytes");
        for (name, a) in ASSETS.iter() {
            // The SVG namespace is a name, not a download; any other absolute URL would be.
            let outside = a.body.replace("http://www.w3.org/2000/svg", "");
            assert!(
                !outside.contains("http://") && !outside.contains("https://"),
                "{name} must not load anything from outside the server"
            );
        }
    }

    #[test]
    fn gzip_is_taken_when_accept_encoding_weighs_it_above_zero() {
        let asks = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
            accepts_gzip(&m)
        };
        assert!(!accepts_gzip(&HeaderMap::new()));
        for yes in [
            "gzip",
            "gzip, deflate, br, zstd",
            "br;q=1.0, GZIP;q=0.5",
            "*",
            "x-gzip",
        ] {
            assert!(asks(yes), "{yes}");
        }
        for no in [
            "identity",
            "br",
            "gzip;q=0",
            "gzip;q=0.0, *",
            "*;q=0",
            "deflate",
        ] {
            assert!(!asks(no), "{no}");
        }
    }

    /// Every file of any size is kept gzipped too, and unzips to itself.
    #[test]
    fn the_gzipped_files_unzip_to_the_files() {
        use std::io::Read as _;
        for (name, a) in ASSETS.iter() {
            let Some((z, tag)) = &a.gzip else {
                assert!(a.body.len() < 1024, "{name} is not gzipped");
                continue;
            };
            let mut out = String::new();
            flate2::read::GzDecoder::new(&z[..])
                .read_to_string(&mut out)
                .unwrap();
            assert_eq!(out, a.body, "{name}");
            assert_ne!(tag, &a.etag, "{name}");
        }
    }

    /// The socket sources name the page's own host, and a `Host` that is not a plain
    /// authority adds nothing (it could otherwise write into the policy).
    #[test]
    fn sockets_reach_the_pages_own_host_only() {
        let with_host = |h: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::HOST, HeaderValue::from_str(h).unwrap());
            own_sockets(CSP, &m)
        };
        let csp = with_host("shop.example:8080");
        assert!(
            csp.contains("connect-src 'self' ws://shop.example:8080 wss://shop.example:8080;"),
            "{csp}"
        );
        for bad in ["evil.example; connect-src *", "a b", ""] {
            let csp = with_host(bad);
            assert!(csp.contains("connect-src 'self'; "), "{bad}: {csp}");
            assert!(
                !csp.contains("ws:") && !csp.contains("evil"),
                "{bad}: {csp}"
            );
        }
        assert!(own_sockets(ADMIN_CSP, &HeaderMap::new()).contains("connect-src 'self'; "));
    }
}
