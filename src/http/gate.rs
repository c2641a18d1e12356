//! Admission at a site's own URLs: the cookie session the gateway and nginx's
//! `auth_request` share, and the two routes that serve it.
//!
//! - [`admit`]: the one decision for a request to a gated path: the session its cookie
//!   names (renewed, throttled by [`crate::gates`], no poll), its place in line, or (when
//!   asked) a new place, admitted at once when there is room and nobody waits.
//! - `GET /api/v1/gate` ([`gate`]): nginx's `auth_request` endpoint: `204` for an admitted
//!   session (renewed), `401` with `X-Waitroom-Redirect` otherwise.
//! - `GET /wait/{event_id}/queue?return=/path` ([`queue_page`]): the waiting room that
//!   `X-Waitroom-Redirect` names: joins, shows the place (refreshing itself), and sends the
//!   person back to `return` once admitted.
//!
//! The cookie (`waitroom_{event_id}`, HttpOnly, SameSite=Lax, Secure when configured or
//! behind https) holds the place's waiting token: random and MAC'd, so a forged one is
//! refused before the store is asked anything, and a place that ended (idle, maximum,
//! completed) is refused by the store.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::body::Place;
use super::error::{AppError, AppResult};
use super::gate_page::{words, Words};
use super::guard::{Caller, Guard};
use crate::app::AppState;
use crate::core::gate::is_valid_host;
use crate::core::{Access, PlaceKey, PlaceState, PlaceView, QueueError};
pub use crate::gates::cookie_name;
use crate::gates::{Gate, Renewal, SessionIds};
use crate::store::{JoinRequest, StoreError};
use crate::tokens;

/// The response header of `GET /api/v1/gate`'s `401`: where to send the person.
pub const X_WAITROOM_REDIRECT: HeaderName = HeaderName::from_static("x-waitroom-redirect");
/// The user (or, for an anonymous place, the session) the origin is told of.
pub const X_WAITROOM_USER: HeaderName = HeaderName::from_static("x-waitroom-user");
/// The session id the origin is told of (the `sid` of access tokens).
pub const X_WAITROOM_SESSION: HeaderName = HeaderName::from_static("x-waitroom-session");
/// The request header whose value, equal to an event's `bypass_secret`, skips its queue.
pub const X_WAITROOM_BYPASS: HeaderName = HeaderName::from_static("x-waitroom-bypass");
/// The header nginx's `auth_request` names the original request URI in.
pub const X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");
/// Longest accepted return path, counted as it is carried in `return=` (percent-encoded):
/// `X-Waitroom-Redirect` and the waiting room's `Location` then stay within what proxies
/// read of an answer's headers (nginx: 4 KiB, else `502`, which `auth_request` makes the
/// visitor's `500`). A character outside ASCII is 3 to 12 bytes there, `/` 3.
const MAX_RETURN_LEN: usize = 2048;

/// An admitted person's session.
#[derive(Debug, Clone)]
pub struct Session {
    pub key: PlaceKey,
    /// The user (the user id, or the session id for an anonymous place) and the session id
    /// (`sid` of access tokens), as the origin is told of them.
    pub ids: SessionIds,
}

/// Where a request to a gated path stands.
pub enum Admission {
    /// Admitted: let it through. `cookie` is set when a new place was made.
    Active {
        session: Session,
        cookie: Option<HeaderValue>,
    },
    /// In line.
    Waiting {
        view: PlaceView,
        cookie: Option<HeaderValue>,
    },
    /// No live place, and none was asked for.
    Absent,
}

/// The value of cookie `name`, if the request carries it: the first `name=value` pair,
/// the pair's surrounding blanks and the value's quotes dropped, if that value is visible
/// ASCII. The other pairs may hold any bytes: a site's own cookie set with raw UTF-8 comes
/// back so from browsers (and nginx joins HTTP/2's cookie fields into one line), and
/// skipping such a header whole hid the person's place from every request, each one
/// taking a new place.
///
/// Read on every gated request (~1,000 instructions as string iterators over a ~100-byte
/// header), so it works on the bytes: each pair is compared with `name=` where it starts,
/// only the value's end being searched for (`;` and `=` are ASCII, and no byte of a
/// character outside ASCII is, so every cut falls between characters), and the value found
/// is checked eight bytes at a time.
pub fn read_cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    read_cookie_with(headers, name, Some)
}

/// The first value of the cookie `name` (as [`read_cookie`] reads each) that `accept`
/// takes: of several pairs of one name (a sibling subdomain's cookie of the same name,
/// with a longer `Path`, comes first), one that is not ours does not hide the one that is.
pub fn read_cookie_with<'h, T>(
    headers: &'h HeaderMap,
    name: &str,
    mut accept: impl FnMut(&'h str) -> Option<T>,
) -> Option<T> {
    let name = name.as_bytes();
    for v in headers.get_all(header::COOKIE) {
        let mut rest = v.as_bytes();
        loop {
            let start = rest
                .iter()
                .position(|b| !is_blank(*b))
                .unwrap_or(rest.len());
            rest = &rest[start..];
            let end = memchr::memchr(b';', rest).unwrap_or(rest.len());
            let pair = &rest[..end];
            // The pair's name is what comes before its first `=`: `name` followed by `=`,
            // as long as `name` has no `=` of its own.
            if pair.len() > name.len()
                && pair.starts_with(name)
                && pair[name.len()] == b'='
                && name.iter().all(|&b| b != b'=')
            {
                let value = trim_end_blanks(&pair[name.len() + 1..]);
                let value = value.strip_prefix(b"\"").unwrap_or(value);
                let value = value.strip_suffix(b"\"").unwrap_or(value);
                // Ours are visible ASCII; another value is not ours (forged or mangled),
                // and a later pair of the name may be.
                if visible_ascii(value) {
                    if let Some(t) = std::str::from_utf8(value).ok().and_then(&mut accept) {
                        return Some(t);
                    }
                }
            }
            if end == rest.len() {
                break;
            }
            rest = &rest[end + 1..];
        }
    }
    None
}

/// The blanks `str::trim` drops around a pair that can be in a visible-ASCII header.
fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn trim_end_blanks(mut b: &[u8]) -> &[u8] {
    while let [rest @ .., last] = b {
        if !is_blank(*last) {
            break;
        }
        b = rest;
    }
    b
}

/// What `HeaderValue::to_str` accepts (visible ASCII and tab), checked a word at a time
/// (a byte at a time, that check cost ~4 instructions per byte of every gated cookie).
fn visible_ascii(b: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let byte_ok = |c: u8| (0x20..0x7f).contains(&c) || c == b'\t';
    let mut words = b.chunks_exact(8);
    for w in &mut words {
        let x = u64::from_le_bytes(w.try_into().expect("eight bytes"));
        // A byte with its high bit set, under 0x20, or equal to 0x7f sets its high bit
        // here; only then is the word looked at byte by byte (a tab is allowed).
        let under_space = x.wrapping_sub(ONES * 0x20) & !x;
        let del = x ^ (ONES * 0x7f);
        let is_del = del.wrapping_sub(ONES) & !del;
        if (x | under_space | is_del) & HIGH != 0 && !w.iter().all(|&c| byte_ok(c)) {
            return false;
        }
    }
    words.remainder().iter().all(|&c| byte_ok(c))
}

/// `Set-Cookie` for the place's waiting token (`None` clears the cookie).
pub fn set_cookie(event_id: &str, token: Option<&str>, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    let v = match token {
        Some(t) => format!(
            "{}={t}; Path=/; HttpOnly; SameSite=Lax{secure}",
            cookie_name(event_id)
        ),
        None => format!(
            "{}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0{secure}",
            cookie_name(event_id)
        ),
    };
    HeaderValue::from_str(&v).expect("tokens and event ids are header-safe")
}

/// Whether the client reached us over https: cookies are then `Secure`. Only a trusted
/// proxy's `X-Forwarded-Proto` is believed (`trusted_proxies`), and of several lines its
/// own, the last (the client may have sent one before it); or, where the proxies write
/// `Forwarded`, its last element's `proto`.
pub fn is_https(guard: &Guard, peer: Option<IpAddr>, headers: &HeaderMap) -> bool {
    peer.is_some_and(|p| guard.is_trusted_proxy(p))
        && (last_line(headers, &HeaderName::from_static("x-forwarded-proto"))
            .is_some_and(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"https"))
            || guard.forwarded_says_https(headers))
}

/// The last line of header `name`: the one the nearest proxy added, where a proxy adds a
/// line of its own rather than extending the client's.
pub fn last_line<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a HeaderValue> {
    headers.get_all(name).iter().next_back()
}

/// Whether the client asked for JSON rather than a page: `Accept` names
/// `application/json` and not `text/html`, each as [`accepts_named`] reads it (every line,
/// and an entry whose `q` is 0 names nothing).
pub fn wants_json(headers: &HeaderMap) -> bool {
    accepts_named(headers, "application/json") && !asks_html(headers)
}

/// Whether the client asks for a page (`Accept` names `text/html`, as a browser's
/// navigation does): a refusal is then a page; anything else (`fetch`'s `*/*`, no
/// `Accept`, an API client, `text/html;q=0`) gets the JSON error.
pub fn asks_html(headers: &HeaderMap) -> bool {
    accepts_named(headers, "text/html")
}

/// Whether `Accept` names the media type `name` as acceptable: an entry of that type
/// (whatever its other parameters) whose `q` is not 0, since `q=0` says "not this" (RFC
/// 9110 §12.5.1). Every `Accept` line counts, as one list. A wildcard (`*/*`, `text/*`)
/// names no type.
fn accepts_named(headers: &HeaderMap, name: &str) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|entry| {
            let mut parts = entry.split(';');
            let range = parts.next().unwrap_or_default().trim();
            range.eq_ignore_ascii_case(name) && !parts.any(zero_q)
        })
}

/// An `Accept` parameter `q=0` (`0`, `0.`, `0.0` to `0.000`: RFC 9110 §12.4.2). A malformed
/// `q` is no refusal: the entry counts as named.
fn zero_q(param: &str) -> bool {
    let Some((key, value)) = param.split_once('=') else {
        return false;
    };
    let zeros = |d: &str| d.len() <= 3 && d.bytes().all(|b| b == b'0');
    key.trim().eq_ignore_ascii_case("q")
        && value
            .trim()
            .strip_prefix('0')
            .is_some_and(|r| r.is_empty() || r.strip_prefix('.').is_some_and(zeros))
}

/// A return path that stays on this site: an absolute path (`/…`, not `//…` or `/\…`,
/// which browsers read as another host), without control characters or backslashes;
/// anything else becomes `/`. Guards `X-Waitroom-Redirect` and the waiting room's
/// redirect against sending people to another site.
pub fn safe_return(path: &str) -> &str {
    let ok = path.starts_with('/')
        && !path.starts_with("//")
        && encoded_len(path) <= MAX_RETURN_LEN
        && !path
            .chars()
            .any(|c| c == '\\' || c.is_control() || c.is_whitespace());
    if ok {
        path
    } else {
        "/"
    }
}

/// How long `path` is once encoded as a query value ([`waiting_room_url`]): the longest of
/// the forms it is carried in (a `Location` encodes only what is not ASCII).
fn encoded_len(path: &str) -> usize {
    path.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' | b' ' => 1,
            _ => 3,
        })
        .sum()
}

/// `path` as a `Location` may carry it: ASCII only (RFC 9110), so every other character's
/// UTF-8 bytes are percent-encoded; the rest is kept as it came.
pub fn ascii_location(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out
}

/// The waiting room of `event_id` that sends the person back to `ret` once admitted.
pub fn waiting_room_url(event_id: &str, ret: &str) -> String {
    let ret: String = form_urlencoded::byte_serialize(safe_return(ret).as_bytes()).collect();
    format!("/wait/{event_id}/queue?return={ret}")
}

/// Enters an admitted place, or renews an active session, in the store; notes the
/// renewal for the throttle.
async fn activate(
    state: &AppState,
    gate: &Gate,
    key: PlaceKey,
    status: PlaceState,
) -> Result<Session, StoreError> {
    let event_id = &*gate.event_id;
    let now = state.clock.now();
    let view = if status == PlaceState::Active {
        state.store.session_heartbeat(event_id, key, now).await?
    } else {
        state.store.enter(event_id, key, now).await?
    };
    // The user id only when the join proved it: a bare one is anyone's to type, and a site
    // reading `X-Waitroom-User` as its signed-in user would act for whoever typed it (the
    // access token says the same with `user_verified`). Otherwise the session id, as for an
    // anonymous place.
    let user = view.user_id.as_deref().filter(|_| view.user_proven);
    let ids = SessionIds::new(key, user);
    state.gates.note_renewal(
        event_id,
        key,
        Renewal {
            at: now,
            ends_at: view.session_ends_at.unwrap_or(now),
            ids: ids.clone(),
        },
    );
    Ok(Session { key, ids })
}

/// Whether a store error says the place is gone (rather than the store being away).
fn place_gone(e: &StoreError) -> bool {
    matches!(
        e.queue(),
        Some(
            QueueError::TokenExpired
                | QueueError::TokenNotFound
                | QueueError::NoSession
                | QueueError::NotReady
        )
    )
}

/// The place that the request's session cookie for `gate` names, if it carries one we
/// issued for that event (its MAC checked, or found in the cache of verified tokens).
pub fn cookie_place(state: &AppState, gate: &Gate, headers: &HeaderMap) -> Option<PlaceKey> {
    read_cookie_with(headers, &gate.cookie, |t| {
        state.waiting.place_for(t, &gate.event_id)
    })
}

/// Whether the request is another site's page loading this URL rather than a person
/// visiting it, as the browser says in its `Sec-Fetch-*` headers: a subresource (an image,
/// a script, a fetch), a frame (hidden or not), or a prefetch. It never makes a place, or
/// any site could fill a queue with its visitors' browsers (each joining under its own
/// address, past the per-client limits). Another site includes a sibling subdomain
/// (`same-site`), which may serve its users' content; the hand-over refuses it too. A
/// top-level navigation from another site (a link followed: `Sec-Fetch-Dest: document`)
/// is a visit and joins; clients that send none of these headers join as before.
pub fn cross_site_subresource(headers: &HeaderMap) -> bool {
    let get = |name: &str| headers.get(name).map(HeaderValue::as_bytes);
    if !matches!(
        get("sec-fetch-site"),
        Some(b"cross-site") | Some(b"same-site")
    ) {
        return false;
    }
    let prefetch = get("sec-purpose").is_some_and(|p| p.starts_with(b"prefetch"))
        || get("purpose") == Some(b"prefetch");
    let visit = match get("sec-fetch-dest") {
        Some(dest) => dest == b"document",
        None => get("sec-fetch-mode") == Some(b"navigate"),
    };
    prefetch || !visit
}

/// Whether a request at a gated URL without a live place may make one: a visit (not
/// [`cross_site_subresource`]) that is not a `HEAD` or an `OPTIONS`. Those are safe
/// methods that a link checker, an uptime monitor or a client asking what a URL allows
/// send: they must not fill the line with places nobody polls, each holding a position
/// until it lapses after `waiting_idle_sec`.
pub fn may_join(method: &Method, headers: &HeaderMap) -> bool {
    !asks_only(method) && !cross_site_subresource(headers)
}

/// `HEAD` or `OPTIONS`: no place is made for them ([`may_join`]).
fn asks_only(method: &Method) -> bool {
    *method == Method::HEAD || *method == Method::OPTIONS
}

/// What a gated URL answers a request that made no place ([`may_join`]): a `HEAD` or an
/// `OPTIONS`, the head of a waiting page (`503`, `Retry-After`, never cached) with no
/// cookie; another site's page loading it, the refusal of [`not_a_visit`].
pub async fn no_place(
    state: &AppState,
    event_id: &str,
    method: &Method,
    headers: &HeaderMap,
    lang: &'static str,
) -> Response {
    if asks_only(method) {
        let mut res = StatusCode::SERVICE_UNAVAILABLE.into_response();
        res.extensions_mut().insert(super::edge::NotAFailure);
        let h = res.headers_mut();
        h.insert(header::RETRY_AFTER, HeaderValue::from(1));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        return res;
    }
    let reload = method == Method::GET;
    refusal(
        state,
        event_id,
        not_a_visit(),
        !asks_html(headers),
        lang,
        reload,
    )
    .await
}

/// What a gated URL answers another site's page that loads it ([`cross_site_subresource`]).
pub fn not_a_visit() -> AppError {
    AppError::invalid(
        "a place in line is made by visiting this page, not by another site's page loading it",
    )
}

/// What a path answers whose readings two events gate ([`crate::gates::Ambiguous`]): no
/// browser sends one (it resolves `.` and `..` itself), and passing it under either event
/// could reach the other's pages.
pub fn ambiguous_path() -> AppError {
    AppError::invalid(
        "this path is gated by different events depending on how it is resolved \
         (percent-decoded, `.`/`..` resolved), or its escapes are not UTF-8 where paths \
         outside ASCII are gated; ask for it as the site links to it",
    )
}

/// The one decision for a request to a gated path (see the module documentation), for the
/// place its cookie names ([`cookie_place`]). A person without a live place gets a new one
/// if `join` says so (asked only then: most requests carry a live session).
pub async fn admit(
    state: &AppState,
    guard: &Guard,
    gate: &Gate,
    place: Option<PlaceKey>,
    client: Option<IpAddr>,
    join: impl FnOnce() -> bool,
) -> AppResult<Admission> {
    let event_id = &*gate.event_id;
    let now = state.clock.now();
    if let Some(key) = place {
        let renewed = |now| {
            let ids = state
                .gates
                .renewed(event_id, key, gate.session_idle_ms, now)?;
            Some(Admission::Active {
                session: Session { key, ids },
                cookie: None,
            })
        };
        if let Some(passed) = renewed(now) {
            return Ok(passed);
        }
        // One store call at a time per place: the requests that waited meanwhile find the
        // renewal it noted.
        let _turn = state.gates.one_at_a_time(key).await;
        let now = state.clock.now();
        if let Some(passed) = renewed(now) {
            return Ok(passed);
        }
        if !state.gates.renewal_due(event_id, key, now) {
            guard.check_poll(&state.events, now, event_id, key).await?;
        }
        match state.store.status(event_id, key, now).await {
            Ok(view) if view.status == PlaceState::Waiting => {
                return Ok(Admission::Waiting { view, cookie: None })
            }
            Ok(view) => match activate(state, gate, key, view.status).await {
                Ok(session) => {
                    return Ok(Admission::Active {
                        session,
                        cookie: None,
                    })
                }
                Err(e) if place_gone(&e) => {}
                Err(e) => return Err(e.into()),
            },
            Err(e) if place_gone(&e) => state.gates.forget(event_id, key, now),
            Err(e) => return Err(e.into()),
        }
    }
    if !join() {
        return Ok(Admission::Absent);
    }
    let config = state.events.config(event_id, now).await?;
    // After the end, closed as the API's join is, whatever the event asks of a join.
    if let Some(end) = config.sale_ended(now) {
        return Err(AppError::SaleEnded(
            Box::new(AppError::EventClosed),
            end.reason.as_str(),
        ));
    }
    if config.require_user_token || config.access == Access::Invite || config.pow_difficulty > 0 {
        // A person at a gated URL has no user token, invite or solved challenge to bring.
        return Err(AppError::InvalidRequest(format!(
            "this event asks a user token, an invite or a proof of work: people join it at /wait/{event_id}, not at a gated path",
        )));
    }
    guard
        .check_join(&state.events, now, client, event_id)
        .await?;
    // The automatic difficulty: a gated join counts toward the join rate as an API join
    // does, and while that rate asks work of every join, a gated one (which brings none)
    // is refused as for a fixed difficulty. Letting it through made the gated URL a way
    // around the surge defence.
    if config.accept_joins && config.pow_auto_above.is_some() {
        let rate = state.join_rates.hit(event_id, now);
        if crate::pow::difficulty(config.pow_difficulty, rate, config.pow_auto_above) > 0 {
            return Err(AppError::InvalidRequest(format!(
                "this event asks a proof of work of every join now (joins come faster than pow_auto_above): people join it at /wait/{event_id}, not at a gated path",
            )));
        }
    }
    let req = JoinRequest {
        nonce: tokens::random_u128(),
        ..JoinRequest::default()
    };
    let view = match state.store.join(event_id, &req, now).await {
        Ok(v) => v,
        // After the sale's end: the same refusal as the API's, with its reason.
        Err(e) => return Err(super::lifecycle::explain(state, event_id, e.into()).await),
    };
    let token = state.waiting.issue(event_id, view.key);
    let cookie = Some(set_cookie(
        event_id,
        Some(&token),
        state.gates.secure_cookies,
    ));
    if view.status == PlaceState::Waiting {
        return Ok(Admission::Waiting { view, cookie });
    }
    let session = activate(state, gate, view.key, view.status).await?;
    Ok(Admission::Active { session, cookie })
}

/// Ends a session that the origin said is complete (`X-Waitroom-Complete: 1`): its slot
/// goes to the next person at once.
pub async fn complete(state: &AppState, event_id: &str, key: PlaceKey) -> AppResult<()> {
    state.gates.forget(event_id, key, state.clock.now());
    match state.store.complete(event_id, key, state.clock.now()).await {
        Ok(()) => Ok(()),
        Err(e) if place_gone(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The waiting room's answer: the page (refreshing itself in place) or, for a client that
/// asks for JSON, the place; `503` with `Retry-After` either way, never cached.
pub fn waiting_response(
    words: &Words,
    event_id: &str,
    view: &PlaceView,
    json: bool,
    cookie: Option<HeaderValue>,
) -> Response {
    let retry = view.poll_after_sec.max(1);
    let mut res = if json {
        Json(Place::new(event_id.to_string(), view)).into_response()
    } else {
        (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            super::gate_page::render(words, view, retry),
        )
            .into_response()
    };
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    res.extensions_mut().insert(super::edge::NotAFailure);
    let h = res.headers_mut();
    h.insert(header::RETRY_AFTER, HeaderValue::from(retry));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if !json {
        super::gate_page::page_headers(h);
    }
    if let Some(c) = cookie {
        h.append(header::SET_COOKIE, c);
    }
    res
}

pub use super::gate_page::{refusal, refusal_json};

/// The session headers the origin (or nginx, through `auth_request_set`) is given.
pub fn session_headers(h: &mut HeaderMap, s: &Session) {
    if let Some(user) = &s.ids.user {
        h.insert(X_WAITROOM_USER, user.clone());
    }
    h.insert(X_WAITROOM_SESSION, s.ids.session.clone());
}

/// Other parameters are ignored, not refused: a proxy whose auth request keeps the
/// visitor's query string (Caddy's `forward_auth` rewrites only the path) would have every
/// URL with a query refused. API.md says a misspelt `event_id` is ignored too.
#[derive(Debug, serde::Deserialize)]
pub struct GateQuery {
    pub event_id: Option<String>,
}

/// The host and path that `X-Original-URI` names: a path as it is (nginx's
/// `$request_uri`); an absolute URL (a proxy that passes the request's full URL, as
/// forward-auth recipes do) read as the gateway reads an absolute-form target, its
/// authority for the host and its path (matched as it was, an absolute URL passed every
/// gated path); anything else (`*`, `checkout/x`) refused, as a missing header is, since
/// what the site will serve for it is not known.
fn original_target<'a>(
    host: Option<&'a str>,
    uri: &'a str,
) -> AppResult<(Option<&'a str>, std::borrow::Cow<'a, str>)> {
    use std::borrow::Cow;
    if uri.starts_with('/') {
        return Ok((host, Cow::Borrowed(uri)));
    }
    let refused = || {
        AppError::invalid(
            "X-Original-URI must be the request's path (nginx: $request_uri) or its absolute URL",
        )
    };
    let (scheme, rest) = uri.split_once("://").ok_or_else(refused)?;
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
    if !scheme_ok {
        return Err(refused());
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    // A `userinfo` names no host (as in the gateway's `host_from`).
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if !is_valid_host(authority.as_bytes()) {
        return Err(refused());
    }
    let path = if path.starts_with('/') {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(format!("/{path}"))
    };
    Ok((Some(authority), path))
}

/// `GET /api/v1/gate`: nginx's `auth_request` (see the module documentation).
pub async fn gate(
    State(state): State<AppState>,
    caller: Caller,
    super::extract::AppQuery(q): super::extract::AppQuery<GateQuery>,
    headers: HeaderMap,
) -> AppResult<Response> {
    // Without the URI the gate cannot tell what is asked for. Reading it as `/` passed
    // every gated URL of an nginx that forgot the header; a 400 makes nginx answer 500
    // instead, so the mistake shows at once. (A client can still send its own header
    // through such an nginx: only `proxy_set_header` makes the gate safe.) Bytes that are
    // not ASCII are read leniently, as nginx passes a raw request line on.
    let mut uris = headers.get_all(X_ORIGINAL_URI).iter();
    let uri = uris.next().ok_or_else(|| {
        AppError::InvalidRequest(
            "X-Original-URI is missing: nginx must pass the request's URI \
             (proxy_set_header X-Original-URI $request_uri)"
                .into(),
        )
    })?;
    // Two lines are a front proxy that appended its own after the client's (rather than
    // set it): which one the site serves is not known, so neither is taken (as two
    // `Host` lines below).
    if uris.next().is_some() {
        return Err(AppError::invalid(
            "X-Original-URI must be sent once (proxy_set_header, not add_header)",
        ));
    }
    let uri = String::from_utf8_lossy(uri.as_bytes());
    let uri: &str = &uri;
    // nginx passes its `$host`, which keeps `other@shop.example` or `shop.example?` as
    // they came: the gateway's rule applies (see `core::gate::is_valid_host`), as the site
    // may read `shop.example` out of either. Refused (nginx answers the visitor `500`)
    // rather than matched as another host, which would pass the site's gated pages.
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() || host.is_some_and(|h| !is_valid_host(h.as_bytes())) {
        return Err(AppError::invalid(
            "the Host header must be one host name or address, and optionally a port",
        ));
    }
    let host = host.and_then(|v| v.to_str().ok());
    let (host, uri) = original_target(host, uri)?;
    let uri: &str = &uri;
    if !state.gates.is_loaded() {
        // Which URIs are gated is not known yet: none is passed unasked (nginx answers the
        // visitor `500`, as when waitroom is down).
        return Err(AppError::Unavailable(
            "the gate rules are not read yet".into(),
        ));
    }
    let gate = match q.event_id.as_deref() {
        Some(e) => {
            crate::core::validate_event_id(e)?;
            state
                .gates
                .get(e)
                .ok_or(AppError::from(QueueError::EventNotFound))?
        }
        None => match state.gates.find(host, uri) {
            Ok(Some(g)) => g,
            // Nothing gates this URL: it passes.
            Ok(None) => return Ok(StatusCode::NO_CONTENT.into_response()),
            Err(crate::gates::Ambiguous) => return Err(ambiguous_path()),
        },
    };
    let secret = headers.get(X_WAITROOM_BYPASS).map(HeaderValue::as_bytes);
    if gate.rules.bypasses(uri, caller.ip, secret) {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    // A Bearer token that is not this event's access token (the site's own API auth, say)
    // hides neither the cookie nor, when both fail, the way to the waiting room.
    let mut session = match super::extract::bearer(&headers) {
        Some(jwt) => match bearer_session(&state, &gate, jwt).await {
            Ok(s) => Some(s),
            Err(AppError::AccessDenied) => None,
            Err(e) => return Err(e),
        },
        None => None,
    };
    if session.is_none() {
        let place = cookie_place(&state, &gate, &headers);
        session = match admit(&state, &caller.guard, &gate, place, caller.ip, || false).await {
            Ok(Admission::Active { session, .. }) => Some(session),
            Ok(Admission::Waiting { .. } | Admission::Absent) => None,
            // A waiting place polling too fast: not let in, sent to the waiting room as any
            // place without a session (which keeps its own limit). nginx's `auth_request`
            // knows only 2xx, 401 and 403: a 429 would be the visitor's 500.
            Err(AppError::RateLimited(_)) => None,
            Err(e) => return Err(e),
        };
    }
    match session {
        Some(s) => {
            let mut res = StatusCode::NO_CONTENT.into_response();
            session_headers(res.headers_mut(), &s);
            Ok(res)
        }
        None => {
            let mut res = AppError::AccessDenied.into_response();
            let url = waiting_room_url(&gate.event_id, uri);
            res.headers_mut().insert(
                X_WAITROOM_REDIRECT,
                HeaderValue::from_str(&url).expect("the return path is URL-encoded"),
            );
            Ok(res)
        }
    }
}

/// The session of a valid access token for the gate's event, renewed (throttled).
async fn bearer_session(state: &AppState, gate: &Gate, jwt: &str) -> AppResult<Session> {
    let claims = state
        .access
        .verify(jwt)
        .map_err(|_| AppError::AccessDenied)?;
    let key = tokens::parse_session_id(&claims.sid).ok_or(AppError::AccessDenied)?;
    if *claims.aud != *gate.event_id {
        return Err(AppError::AccessDenied);
    }
    let now = state.clock.now();
    if let Some(ids) = state
        .gates
        .renewed(&gate.event_id, key, gate.session_idle_ms, now)
    {
        return Ok(Session { key, ids });
    }
    activate(state, gate, key, PlaceState::Active)
        .await
        .map_err(AppError::from_session_error)
}

#[derive(Debug, serde::Deserialize)]
pub struct QueueQuery {
    #[serde(rename = "return")]
    pub ret: Option<String>,
}

/// `GET /wait/{event_id}/queue?return=/path`: the waiting room `X-Waitroom-Redirect`
/// names (see the module documentation).
pub async fn queue_page(
    State(state): State<AppState>,
    super::extract::AppPath(event_id): super::extract::AppPath<String>,
    caller: Caller,
    super::extract::AppQuery(q): super::extract::AppQuery<QueueQuery>,
    parts: axum::http::request::Parts,
) -> AppResult<Response> {
    let axum::http::request::Parts {
        method,
        uri,
        headers,
        extensions,
        ..
    } = parts;
    let peer = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    // An unknown event (deleted while a browser waited, or a broken link): a browser gets
    // the page that leads back to the start, as at `/wait/{event_id}`.
    let missing = |e: AppError| match e {
        AppError::EventNotFound | AppError::InvalidRequest(_) if asks_html(&headers) => {
            Ok(super::look::missing_page(&event_id, &uri, &headers))
        }
        // With the headers of every refusal here (`no-store`), as its page has them.
        e => Ok(refusal_json(e)),
    };
    if let Err(e) = crate::core::validate_event_id(&event_id) {
        return missing(e.into());
    }
    // An event without gate rules is served too: `event_id` names it explicitly.
    let now = state.clock.now();
    let config = match state.events.config(&event_id, now).await {
        Ok(c) => c,
        Err(e) => return missing(e.into()),
    };
    let gate = state.gates.get(&event_id).unwrap_or_else(|| {
        std::sync::Arc::new(Gate::new(
            event_id.as_str().into(),
            config.gate.clone(),
            u64::from(config.session_idle_sec) * 1000,
        ))
    });
    let secure = state.gates.secure_cookies || is_https(&caller.guard, peer, &headers);
    let ret = ascii_location(safe_return(q.ret.as_deref().unwrap_or("/")));
    let place = cookie_place(&state, &gate, &headers);
    let join = || may_join(&method, &headers);
    let lang = super::look::language(&uri, &headers);
    let admission = match admit(&state, &caller.guard, &gate, place, caller.ip, join).await {
        Ok(a) => a,
        Err(e) => {
            let json = !asks_html(&headers);
            return Ok(refusal(&state, &event_id, e, json, lang, true).await);
        }
    };
    match admission {
        Admission::Active { cookie, .. } => {
            let mut res = (StatusCode::SEE_OTHER, [(header::LOCATION, ret)]).into_response();
            res.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            if let Some(c) = cookie {
                res.headers_mut()
                    .append(header::SET_COOKIE, secure_cookie(c, secure));
            }
            Ok(res)
        }
        Admission::Waiting { view, cookie } => Ok(waiting_response(
            &words(&config, lang),
            &event_id,
            &view,
            wants_json(&headers),
            cookie.map(|c| secure_cookie(c, secure)),
        )),
        // Not joined: a `HEAD`, or another site's page loading this URL.
        Admission::Absent => Ok(no_place(&state, &event_id, &method, &headers, lang).await),
    }
}

/// `POST /wait/{event_id}/queue?return=/path` with the form field `waiting_token`: the
/// script page (`/wait/{event_id}`) of an event that gates a site's paths and has no
/// `target_url` hands the place it holds over to the gate when the turn comes. Entering
/// through the API there led nowhere, and the person then took a second place (and a
/// second slot) at the gated path: here the place becomes the session cookie instead, and
/// the person goes on to the waiting room URL, which lets them in (`303` to `return`)
/// through that one place. A token that is not one of this event's places is refused.
/// Another site cannot hand its place to a visitor: a cross-site post is refused.
pub async fn hand_over(
    State(state): State<AppState>,
    super::extract::AppPath(event_id): super::extract::AppPath<String>,
    caller: Caller,
    super::extract::AppQuery(q): super::extract::AppQuery<QueueQuery>,
    head: axum::http::request::Parts,
    body: axum::body::Bytes,
) -> Response {
    let (headers, extensions) = (&head.headers, &head.extensions);
    let handed = hand_over_place(&state, &event_id, caller, q, extensions, headers, body);
    match handed.await {
        Ok(res) => res,
        // A browser (the waiting page's own form) is told on a page, as at the gated URL;
        // a form's `POST` is not sent again, so the page does not reload.
        Err(e) => {
            let lang = super::look::language(&head.uri, headers);
            refusal(&state, &event_id, e, !asks_html(headers), lang, false).await
        }
    }
}

async fn hand_over_place(
    state: &AppState,
    event_id: &str,
    caller: Caller,
    q: QueueQuery,
    extensions: &axum::http::Extensions,
    headers: &HeaderMap,
    body: axum::body::Bytes,
) -> AppResult<Response> {
    crate::core::validate_event_id(event_id)?;
    let site = headers.get("sec-fetch-site").map(HeaderValue::as_bytes);
    if matches!(site, Some(b"cross-site" | b"same-site")) || (site.is_none() && foreign(headers)) {
        return Err(AppError::invalid(
            "a place is handed over by the waiting room's own page only",
        ));
    }
    let not_a_place =
        || AppError::invalid("waiting_token is missing or is not a place in this event's line");
    let key = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "waiting_token")
        .and_then(|(_, v)| state.waiting.place_for(&v, event_id))
        .ok_or_else(not_a_place)?;
    // The cookie gets the token as we issue it, not as it was posted: the check reads past
    // surrounding spaces, which a cookie cannot carry (a line break made the header
    // invalid, a no-break space a cookie the gate could not read).
    let token = state.waiting.issue(event_id, key);
    // A place that ended (left, cleared, expired) is no place either: its cookie would be
    // read as none at the gate, which would make a new place without telling the person
    // that theirs ended. Looked at without renewing it.
    match state.store.peek(event_id, key, state.clock.now()).await {
        Ok(_) => {}
        Err(e) if place_gone(&e) => return Err(not_a_place()),
        Err(e) => return Err(e.into()),
    }
    let peer = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let secure = state.gates.secure_cookies || is_https(&caller.guard, peer, headers);
    let room = waiting_room_url(event_id, q.ret.as_deref().unwrap_or("/"));
    let mut res = (StatusCode::SEE_OTHER, [(header::LOCATION, room)]).into_response();
    let h = res.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.append(
        header::SET_COOKIE,
        set_cookie(event_id, Some(token.as_str()), secure),
    );
    Ok(res)
}

/// A post whose `Origin` names another host than the one it was sent to. Read only when
/// the browser sends no `Sec-Fetch-Site` (Safari before 16.4): `Origin` is then the only
/// word on where a form came from. `null` passes: the waiting page sends no referrer, so
/// such a browser says `null` for its own form too (and so can another site's form: the
/// gap API.md names).
fn foreign(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).map(HeaderValue::as_bytes) else {
        return false;
    };
    if origin == b"null" {
        return false;
    }
    let Some(authority) = origin
        .strip_prefix(b"https://")
        .or_else(|| origin.strip_prefix(b"http://"))
    else {
        return true;
    };
    // Host names only: a proxy in front may pass its `$host` (nginx's has no port) while
    // the browser's origin names one.
    let name = |a: &'_ [u8]| -> Vec<u8> {
        let end = match a.first() {
            Some(b'[') => a.iter().position(|&b| b == b']').map_or(a.len(), |i| i + 1),
            _ => a.iter().position(|&b| b == b':').unwrap_or(a.len()),
        };
        let n = &a[..end];
        n.strip_suffix(b".").unwrap_or(n).to_ascii_lowercase()
    };
    // No `Host` (HTTP/2 names it in the URI, and only a proxy in front speaks it to an
    // old browser): nothing to compare, so as before.
    let host = headers.get(header::HOST).map(HeaderValue::as_bytes);
    host.is_some_and(|h| name(h) != name(authority))
}

/// Adds `Secure` to a cookie made without it, when the request came over https.
pub fn secure_cookie(c: HeaderValue, secure: bool) -> HeaderValue {
    match c.to_str() {
        Ok(s) if secure && !s.contains("; Secure") => {
            HeaderValue::from_str(&format!("{s}; Secure")).unwrap_or(c)
        }
        _ => c,
    }
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
