//! Gateway mode (`--upstream http://host:port`): waitroom in front of a site as a reverse
//! proxy. Waitroom's own routes ([`is_own_path`]) are served by the API router; every other
//! request goes to the origin, through the queue when an event gates its path.
//!
//! A gated request ([`crate::http::gate::admit`]) with an admitted session (its cookie) is
//! proxied with `X-Waitroom-User` and `X-Waitroom-Session`; without one it is admitted at
//! once while the event has room and nobody waits, and otherwise answered the waiting room
//! in place (the page, or the place as JSON, `503` with `Retry-After`). An origin answer
//! carrying `X-Waitroom-Complete: 1` ends the session: its slot goes to the next person.
//! A client connection's requests share the reading of its last session cookie
//! ([`Connection`]); whether the session is still live is asked at every request.
//!
//! The proxy keeps its own pool of HTTP/1.1 connections to the origin, each driven by the
//! task serving the request ([`pool`]: no task hand-off per request); each of the server's
//! serving threads has a `Gateway`, so a pool, of its own (`server::threads`). Request and response
//! bodies stream through, WebSocket (and any HTTP/1.1) upgrades are joined byte for byte
//! once both sides agreed ([`forward`] has the header rules: hop-by-hop headers,
//! `X-Forwarded-*`, `Forwarded`).
//! Proxied requests skip the API's limits (body size, request timeout): a site's uploads
//! and long responses are the site's to bound. An origin that does not answer (or answers
//! what cannot be passed on) is a `502`: for a browser a page in its language that reloads
//! itself, for any other client the API's JSON error.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, HttpBody as _};
use axum::extract::Request;
use axum::http::uri::PathAndQuery;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, Version};
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::app::AppState;
pub use crate::config::Upstream;
use crate::core::gate::is_valid_host;
use crate::http::body_timeout::DrainIncoming;
use crate::http::gate::{self, Admission, Session};
use crate::http::guard::Guard;
use crate::telemetry::budget::{log_within, LogBudget, PER_REQUEST_LINES};

mod connection;
pub mod forward;
mod observe;
mod pool;

pub use connection::Connection;

use observe::Outcome;

/// The origin's answer header that ends the session (the purchase is done). A name, not
/// text: removing it by its text parsed the name at every gated answer (~340 instructions).
pub const X_WAITROOM_COMPLETE: HeaderName = HeaderName::from_static("x-waitroom-complete");

/// The proxy: what every proxied request shares.
pub struct Gateway {
    state: AppState,
    guard: Arc<Guard>,
    origin: Arc<pool::Pool>,
    metrics: observe::Metrics,
    /// Tracing export is on: each proxied request gets its span (see [`observe`]).
    trace: bool,
    upstream: Upstream,
}

/// Whether `path` is one of waitroom's own routes, which the gateway never proxies. A site
/// behind the gateway cannot use these paths itself.
pub fn is_own_path(path: &str) -> bool {
    matches!(
        path,
        "/api/v1" | "/healthz" | "/readyz" | "/metrics" | "/admin" | "/.well-known/jwks.json"
    ) || path.starts_with("/api/v1/")
        || path.starts_with("/wait/")
        || path.starts_with("/branding/")
        || path
            .strip_prefix("/assets/")
            .is_some_and(crate::http::pages::is_asset)
}

impl Gateway {
    pub fn new(state: AppState, guard: Arc<Guard>, upstream: Upstream) -> Self {
        Self::with_pools(state, guard, upstream, 1)
    }

    /// As [`Gateway::new`], for one of `pools` gateways (one per serving thread), each with
    /// a pool of its own: each keeps its share of the process's idle origin connections.
    pub fn with_pools(
        state: AppState,
        guard: Arc<Guard>,
        upstream: Upstream,
        pools: usize,
    ) -> Self {
        Gateway {
            state,
            guard,
            origin: pool::Pool::new(&upstream.authority, pool::idle_cap(pools)),
            metrics: observe::Metrics::new(),
            trace: crate::telemetry::otel::enabled(),
            upstream,
        }
    }

    /// One request bound for the origin from the client connection at `peer`, counted in
    /// the gateway's metrics and, when tracing export is on, run in a span of its own.
    ///
    /// The server calls this for every path not [`is_own_path`], straight from the
    /// connection (see `server::Dispatch`): a proxied request passes through no router and
    /// no layer of the API's, whose limits and edge metrics are the API's own.
    pub fn serve(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
    ) -> impl std::future::Future<Output = Response> + Send + '_ {
        self.serve_on(req, peer, None)
    }

    /// [`Gateway::serve`], with what the connection kept (its last session cookie, its
    /// forwarding values) when the request comes through a [`Connection`].
    async fn serve_on(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        conn: Option<&Connection>,
    ) -> Response {
        let start = std::time::Instant::now();
        let has_body = !req.body().is_end_stream();
        // A body of no declared length came with `Transfer-Encoding`; one coded otherwise
        // than by `chunked` alone (`gzip, chunked`, which hyper reads by its chunks) would
        // reach the origin still gzipped, its coding dropped with the hop-by-hop header:
        // `501`, as nginx answers it (RFC 9112 §6.1). A body of known length has no coding,
        // so most requests are spared the header's lookup.
        if has_body
            && req.body().size_hint().exact().is_none()
            && req.headers().contains_key(header::TRANSFER_ENCODING)
            && !forward::coded_by_chunks_alone(req.headers())
        {
            // In a span of its own when tracing export is on, as every other request: the
            // error then names its trace, as every error does.
            let (outcome, res) = if self.trace {
                use crate::telemetry::otel;
                let method = crate::http::edge::method_label(req.method());
                let span = otel::request_span(method, observe::SPAN_ROUTE, req.headers());
                let (outcome, res) = span.in_scope(unknown_coding);
                otel::record_status(&span, res.status().as_u16());
                (outcome, res)
            } else {
                unknown_coding()
            };
            self.metrics.record(outcome, start);
            return res;
        }
        // Boxed, though the origin could be sent the `Incoming` as it is: a request with an
        // `Incoming` body is larger and is moved several times (into the connection, back
        // out of a refused send); tried, its copies rose by ~650 instructions per request,
        // more than the box costs (~250).
        //
        // A body that may still arrive, over HTTP/1.1 without `Expect`, is read to its end
        // if dropped unread (the waiting room's page, a refusal), so the connection serves
        // the client's next request; see `DrainOnDrop` for the API's routes.
        let drain = req.version() == Version::HTTP_11
            && has_body
            && !req.headers().contains_key(header::EXPECT);
        let req = if drain {
            req.map(|b| Body::new(DrainIncoming::new(b)))
        } else {
            req.map(Body::new)
        };
        let peer = Some(peer.ip());
        let (outcome, res) = if self.trace {
            self.handle_traced(req, peer, conn).await
        } else {
            self.handle(req, peer, conn).await
        };
        self.metrics.record(outcome, start);
        res
    }

    /// `handle` in a span that continues the client's `traceparent`; the request to the
    /// origin carries the span on ([`Gateway::proxy`] injects it).
    async fn handle_traced(
        &self,
        req: Request,
        peer: Option<IpAddr>,
        conn: Option<&Connection>,
    ) -> (Outcome, Response) {
        use crate::telemetry::otel;
        use tracing::Instrument as _;
        let method = crate::http::edge::method_label(req.method());
        let span = otel::request_span(method, observe::SPAN_ROUTE, req.headers());
        let (outcome, res) = self.handle(req, peer, conn).instrument(span.clone()).await;
        otel::record_status(&span, res.status().as_u16());
        (outcome, res)
    }

    /// One request bound for the origin: what became of it, and the answer.
    async fn handle(
        &self,
        req: Request,
        peer: Option<IpAddr>,
        conn: Option<&Connection>,
    ) -> (Outcome, Response) {
        // Two `Host` headers: the gate would check one and the origin might serve the other
        // (RFC 9112 §3.2: such a request is answered 400). A `Host` that is not a host and
        // port cannot be matched against `hosts`, yet an origin may read a host name out of
        // it (nginx serves `shop.example:\xff` as `shop.example`, Node's `new URL()` reads
        // `other@shop.example` so): refused as well ([`is_valid_host`]). So is a request
        // that names no host, or an HTTP/1.1 one without `Host` (RFC 9112 §3.2): the gate
        // would match it against no host, and the origin serve it as its default site.
        let mut hosts = req.headers().get_all(header::HOST).iter();
        let first_host = hosts.next();
        let bad_host = match first_host {
            Some(h) => !is_valid_host(h.as_bytes()),
            None => req.version() == Version::HTTP_11,
        };
        if bad_host || hosts.next().is_some() {
            return refused(invalid_host(), &req);
        }
        // The `Host` just found, not looked up again.
        let Some(host_value) = forward::host_from(first_host, &req) else {
            return refused(invalid_host(), &req);
        };
        let client = self.guard.client_ip(peer, req.headers());
        // Read as text once, for the gates and the origin's headers alike.
        let host = host_value.to_str().ok();
        let gates = &self.state.gates;
        if !gates.is_loaded() {
            // Which requests are gated is not known yet: none is passed unasked.
            return refused(
                crate::http::AppError::Unavailable("the gate rules are not read yet".into()),
                &req,
            );
        }
        let found = if gates.is_empty() {
            Ok(None)
        } else {
            gates.find(host, req.uri().path())
        };
        let found = match found {
            Ok(found) => found,
            Err(crate::gates::Ambiguous) => return refused(gate::ambiguous_path(), &req),
        };
        let Some(gate) = found else {
            let (outcome, res) = self
                .proxy(req, host, (peer, client), conn, None, Outcome::Pass)
                .await;
            return (outcome, without_completion(res));
        };
        let secret = req
            .headers()
            .get(gate::X_WAITROOM_BYPASS)
            .map(HeaderValue::as_bytes);
        if gate.rules.bypasses(req.uri().path(), client, secret) {
            let (outcome, res) = self
                .proxy(req, host, (peer, client), conn, None, Outcome::Bypass)
                .await;
            return (outcome, without_completion(res));
        }
        let secure =
            self.state.gates.secure_cookies || gate::is_https(&self.guard, peer, req.headers());
        let place = connection::place_of(self, conn.map(|c| &c.last), &gate, req.headers());
        let headers = req.headers();
        let method = req.method().clone();
        let join = || gate::may_join(&method, headers);
        let admission = gate::admit(&self.state, &self.guard, &gate, place, client, join).await;
        // The gate page's language, as the waiting page's (`?lang=`, else the browser's):
        // read only for the answers made here, not for a request passed to the origin.
        let lang = |req: &Request| crate::http::look::language(req.uri(), req.headers());
        match admission {
            Err(e) => {
                let (json, lang) = (!gate::asks_html(req.headers()), lang(&req));
                let reload = method == axum::http::Method::GET;
                let state = &self.state;
                let res = gate::refusal(state, &gate.event_id, e, json, lang, reload).await;
                (Outcome::Refused, res)
            }
            Ok(Admission::Waiting { view, cookie }) => {
                let lang = lang(&req);
                let words =
                    crate::http::gate_page::words_of(&self.state, &gate.event_id, lang).await;
                let res = gate::waiting_response(
                    &words,
                    &gate.event_id,
                    &view,
                    gate::wants_json(req.headers()),
                    cookie.map(|c| gate::secure_cookie(c, secure)),
                );
                (Outcome::Waiting, res)
            }
            Ok(Admission::Active { session, cookie }) => {
                let session_of = Some((&*gate.event_id, &session));
                let (outcome, mut res) = self
                    .proxy(
                        req,
                        host,
                        (peer, client),
                        conn,
                        session_of,
                        Outcome::Admitted,
                    )
                    .await;
                if let Some(c) = cookie {
                    res.headers_mut()
                        .append(header::SET_COOKIE, gate::secure_cookie(c, secure));
                    // The origin's answer now carries this person's session: whatever the
                    // origin said of caching it, no shared cache may keep it (and hand the
                    // cookie to the next visitor).
                    never_stored(res.headers_mut());
                }
                // Looked for among the answer's few names before it is removed: a removal
                // hashes the name (~200 instructions) and most answers do not carry it.
                let done = res.headers().keys().any(|n| *n == X_WAITROOM_COMPLETE)
                    && res
                        .headers_mut()
                        .remove(X_WAITROOM_COMPLETE)
                        .is_some_and(|v| v.as_bytes().trim_ascii() == b"1");
                if done {
                    if let Err(e) = gate::complete(&self.state, &gate.event_id, session.key).await {
                        tracing::warn!(event = %gate.event_id, error = %e, "completing a session the origin ended failed");
                    }
                    res.headers_mut().append(
                        header::SET_COOKIE,
                        gate::set_cookie(&gate.event_id, None, secure),
                    );
                    never_stored(res.headers_mut());
                }
                (outcome, res)
            }
            // Not joined: a `HEAD`, or another site's page loading this URL.
            Ok(Admission::Absent) => {
                let lang = lang(&req);
                let headers = req.headers();
                let res = gate::no_place(&self.state, &gate.event_id, &method, headers, lang).await;
                (Outcome::Refused, res)
            }
        }
    }

    /// Sends `req` to the origin and streams its answer back; joins the two connections
    /// when the origin accepts an upgrade. The outcome is `proxied` when the origin
    /// answered. `(peer, client)`: the connection's address, and the client's as the guard
    /// read it (behind a trusted proxy, the one its chain names).
    async fn proxy(
        &self,
        mut req: Request,
        host: Option<&str>,
        (peer, client): (Option<IpAddr>, Option<IpAddr>),
        conn: Option<&Connection>,
        session: Option<(&str, &Session)>,
        proxied: Outcome,
    ) -> (Outcome, Response) {
        let trusted = peer.is_some_and(|p| self.guard.is_trusted_proxy(p));
        let upgrade = forward::upgrade_of(req.headers());
        let client_side = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
        // The origin gets the origin form (`/path?query`): the connection is to it already.
        let path = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        // What a `502` page (or a failed upload's) is chosen by, kept before the request
        // goes to the pool (which drops it when the origin fails); read before the headers
        // are rewritten. Nothing is worked out of it unless the origin fails.
        let asked = Asked {
            uri: std::mem::replace(req.uri_mut(), Uri::from(path)),
            reloadable: matches!(*req.method(), Method::GET | Method::HEAD),
            accept: all_lines(req.headers(), header::ACCEPT),
            language: all_lines(req.headers(), header::ACCEPT_LANGUAGE),
        };
        // The answer goes back in the client's version, whatever the origin's: an HTTP/1.0
        // origin's `HTTP/1.0` status line would tell an HTTP/1.1 client that the connection
        // closes after it, while this side keeps it open (RFC 9110 §6.2: the version is
        // the hop's own).
        let version = req.version();
        if version == Version::HTTP_2 {
            forward::join_cookies(req.headers_mut());
        }
        *req.version_mut() = Version::HTTP_11;
        forward::request_headers(
            req.headers_mut(),
            peer,
            trusted,
            client,
            host,
            upgrade.as_ref(),
            conn.map(|c| &c.forwarding),
        );
        if let Some((_, s)) = session {
            gate::session_headers(req.headers_mut(), s);
        }
        if self.trace {
            // The origin's spans are children of this request's.
            crate::telemetry::otel::inject(req.headers_mut());
        }
        let head = req.method() == axum::http::Method::HEAD;
        let Some(client_side) = client_side else {
            let mut res = match self.origin.send(req).await {
                Ok(r) => r,
                Err(pool::OriginError::Upload(e)) => {
                    return (Outcome::Refused, upload_failed(&e, asked))
                }
                Err(e) => return (Outcome::Unavailable, self.unanswered(e, asked)),
            };
            // A switch to a request that asked for none (RFC 9110 §15.2.2) cannot be
            // passed on: the client would be left a switched connection with nothing on it.
            if res.status() == StatusCode::SWITCHING_PROTOCOLS {
                return (
                    Outcome::Unavailable,
                    self.misframed(asked, "an unasked 101"),
                );
            }
            let bodiless = head || no_body(res.status());
            if !forward::response_headers(res.headers_mut(), None, bodiless) {
                return (Outcome::Unavailable, self.misframed(asked, OTHER_CODING));
            }
            *res.version_mut() = version;
            return (proxied, res);
        };
        // Boxed, as upgrades are rare: inline, its connect future would be copied with
        // every request's future.
        let mut res = match Box::pin(self.origin.send_upgrade(req)).await {
            Ok(r) => r,
            Err(e) => return (Outcome::Unavailable, self.unanswered(e, asked)),
        };
        let upgraded = res.status() == StatusCode::SWITCHING_PROTOCOLS;
        if upgraded {
            let origin_side = hyper::upgrade::on(&mut res);
            tokio::spawn(async move {
                match tokio::try_join!(client_side, origin_side) {
                    Ok((c, o)) => {
                        let (mut c, mut o) = (TokioIo::new(c), TokioIo::new(o));
                        let _ = tokio::io::copy_bidirectional(&mut c, &mut o).await;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "an upgrade through the gateway failed")
                    }
                }
            });
        }
        let bodiless = head || no_body(res.status());
        if !forward::response_headers(
            res.headers_mut(),
            upgrade.as_ref().filter(|_| upgraded),
            bodiless,
        ) {
            return (Outcome::Unavailable, self.misframed(asked, OTHER_CODING));
        }
        *res.version_mut() = version;
        (proxied, res.map(Body::new))
    }

    /// An origin answer that cannot be passed on (`what` it was): a `502`.
    #[cold]
    fn misframed(&self, asked: Asked, what: &'static str) -> Response {
        static MISFRAMED: LogBudget = LogBudget::new(PER_REQUEST_LINES, Duration::from_secs(1));
        log_within!(
            MISFRAMED,
            warn,
            upstream = %self.upstream,
            answer = what,
            "the origin answered what cannot be passed on"
        );
        bad_gateway(asked)
    }

    #[cold]
    fn unanswered(&self, e: pool::OriginError, asked: Asked) -> Response {
        // (Within a budget: an origin that is down fails every request alike.)
        static UNANSWERED: LogBudget = LogBudget::new(PER_REQUEST_LINES, Duration::from_secs(1));
        log_within!(UNANSWERED, warn, upstream = %self.upstream, error = %e, "the origin did not answer");
        bad_gateway(asked)
    }
}

/// An answer to an ungated or bypassed request, without the origin's completion signal:
/// no session was looked up for it, so there is none to complete, and the header is
/// waitroom's, not the visitor's. Looked for among the answer's few names first, as most
/// answers do not carry it.
fn without_completion(mut res: Response) -> Response {
    if res.headers().keys().any(|n| *n == X_WAITROOM_COMPLETE) {
        res.headers_mut().remove(X_WAITROOM_COMPLETE);
    }
    res
}

/// An answer status that has no body (RFC 9110 §6.4.1).
fn no_body(status: StatusCode) -> bool {
    status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
}

/// A proxied request body that stopped arriving (or broke off): `400`, as the API answers a
/// body cut off, and not counted against the origin. A browser (`Accept` naming
/// `text/html`, whatever the method: an upload is mostly a form's `POST`) gets a page in
/// its language saying so, as the `502`'s, without its reload; any other client the API's
/// error shape. `e`: the body's failure (hyper's, whose cause says what failed).
#[cold]
#[inline(never)]
fn upload_failed(e: &(dyn std::error::Error + 'static), asked: Asked) -> Response {
    let headers = asked.headers();
    if gate::asks_html(&headers) {
        let lang = crate::http::look::language(&asked.uri, &headers);
        let page = crate::http::gate_page::render_upload_failed(lang);
        return site_page(StatusCode::BAD_REQUEST, page);
    }
    let message = format!(
        "the request body did not arrive: {}",
        e.source()
            .map_or_else(|| e.to_string(), ToString::to_string)
    );
    own_error(
        StatusCode::BAD_REQUEST,
        crate::http::error::code::INVALID_REQUEST,
        message,
    )
}

/// An error the gateway answers itself, in the API's error shape with what
/// [`crate::http::AppError`]'s answers carry: the request's trace id when tracing export is
/// on (defect: these three answers, the `502` first, had none).
fn own_error(status: StatusCode, code: &'static str, message: String) -> Response {
    let body = crate::http::error::ErrorBody {
        error: crate::http::error::ErrorDetail {
            code,
            message,
            challenge: None,
            reason: None,
            trace_id: crate::telemetry::otel::current_trace_id(),
        },
    };
    // Never cached, as the page form of the same answer (`site_page`).
    let no_store = [(header::CACHE_CONTROL, crate::http::NO_STORE.clone())];
    (status, no_store, axum::Json(body)).into_response()
}

/// A page of the gateway's own about a request to the site: `status`, never cached, with
/// the gate pages' headers.
fn site_page(status: StatusCode, page: String) -> Response {
    let html = [(header::CONTENT_TYPE, "text/html; charset=utf-8")];
    let mut res = (status, html, page).into_response();
    let h = res.headers_mut();
    h.insert(header::CACHE_CONTROL, crate::http::NO_STORE.clone());
    crate::http::gate_page::page_headers(h);
    res
}

/// What the gateway's own answers to a proxied request (its `502`, a failed upload's `400`)
/// are chosen by, kept from the request as the client sent it: its URI (`?lang=`; the one
/// the request no longer needs once it is given the origin form, so kept rather than
/// copied), whether its method is one a page's reload repeats, and its `Accept` and
/// `Accept-Language`, each of all its lines ([`all_lines`]: two lookups and two shared
/// values a proxied request: the pool drops the request itself when the origin fails).
struct Asked {
    uri: Uri,
    reloadable: bool,
    accept: Option<HeaderValue>,
    language: Option<HeaderValue>,
}

/// Every line of header `name` as one value, so that these answers read all of them as
/// the gate's own answers do (several lines of a list are one list: RFC 9110 §5.3). The
/// line itself, shared rather than copied, when it is the only one, as it nearly always
/// is; several are joined with `, ` into a value of their own.
fn all_lines(headers: &HeaderMap, name: HeaderName) -> Option<HeaderValue> {
    let mut lines = headers.get_all(name).iter();
    let first = lines.next()?;
    let Some(second) = lines.next() else {
        return Some(first.clone());
    };
    Some(join_lines(first, second, lines))
}

/// The rare case of [`all_lines`]: two lines or more. Only the lines that read as text
/// are joined: the readers skip a line that does not (as the gate's own pages do, line by
/// line), and one such line must not spoil the others in the joined value.
#[cold]
#[inline(never)]
fn join_lines<'a>(
    first: &'a HeaderValue,
    second: &'a HeaderValue,
    more: impl Iterator<Item = &'a HeaderValue>,
) -> HeaderValue {
    let mut readable = [first, second]
        .into_iter()
        .chain(more)
        .filter(|line| line.to_str().is_ok());
    let Some(head) = readable.next() else {
        return first.clone();
    };
    let mut joined = head.as_bytes().to_vec();
    for line in readable {
        joined.extend_from_slice(b", ");
        joined.extend_from_slice(line.as_bytes());
    }
    // Lines that were values make one (no control character is added): the first alone
    // is only a fallback that is never reached.
    HeaderValue::from_bytes(&joined).unwrap_or_else(|_| head.clone())
}

impl Asked {
    /// The request's two values back in a header map, as the gate pages' helpers read one.
    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            (header::ACCEPT, &self.accept),
            (header::ACCEPT_LANGUAGE, &self.language),
        ] {
            if let Some(v) = value {
                headers.insert(name, v.clone());
            }
        }
        headers
    }
}

/// How long the page of a site that does not answer waits before it reloads itself (and its
/// `Retry-After`), in whole seconds: long enough not to add much to the load of an origin
/// that is failing under it, short enough that a person waiting on it is served soon after
/// it is back. Drawn afresh for each answer within these bounds, so that the browsers that
/// were shown the page while the site was down do not all reload at the same instant when
/// it comes back (and, if it is back only just, bring it down again at once).
/// An origin answer with a transfer coding other than chunked, as [`Gateway::misframed`]
/// logs it.
const OTHER_CODING: &str = "a transfer coding other than chunked";

const UNANSWERED_RETRY_SEC: std::ops::RangeInclusive<u64> = 4..=8;

/// A wait drawn from [`UNANSWERED_RETRY_SEC`], uniformly.
fn unanswered_retry() -> u64 {
    let (low, high) = (*UNANSWERED_RETRY_SEC.start(), *UNANSWERED_RETRY_SEC.end());
    low + (crate::tokens::random_u128() % u128::from(high - low + 1)) as u64
}

/// The origin could not be reached, or answered what cannot be passed on: `502`. A browser
/// (`Accept` naming `text/html`, on a `GET` or `HEAD`) gets a page in its language, as the gate's pages choose
/// it, that reloads itself after a wait drawn from [`UNANSWERED_RETRY_SEC`] (its
/// `Retry-After` says the same wait), never cached; any other client the API's error
/// shape, as the contract's error table has it.
#[cold]
#[inline(never)]
fn bad_gateway(asked: Asked) -> Response {
    let headers = asked.headers();
    // Only a request its reload repeats gets the page that reloads itself: a form's POST
    // would come back as a GET, its data lost. Others get the JSON.
    if !(asked.reloadable && gate::asks_html(&headers)) {
        return own_error(
            StatusCode::BAD_GATEWAY,
            crate::http::error::code::UPSTREAM_UNAVAILABLE,
            "the site behind the waiting room did not answer".into(),
        );
    }
    let lang = crate::http::look::language(&asked.uri, &headers);
    let retry = unanswered_retry();
    let page = crate::http::gate_page::render_unanswered(lang, retry);
    let mut res = site_page(StatusCode::BAD_GATEWAY, page);
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry));
    res
}

/// A request body in a transfer coding other than `chunked` alone: `501`, and the
/// connection closed after it, as nginx closes it: the body is left unread, not drained as
/// one the gateway understands.
#[cold]
#[inline(never)]
fn unknown_coding() -> (Outcome, Response) {
    let mut res = own_error(
        StatusCode::NOT_IMPLEMENTED,
        crate::http::error::code::NOT_IMPLEMENTED,
        "a request body may be sent with Transfer-Encoding: chunked only".into(),
    );
    res.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    (Outcome::Refused, res)
}

/// An origin's answer that now sets or clears a session cookie: `no-store` whatever the
/// origin said, and without the other words a cache reads instead of `Cache-Control`
/// (`CDN-Cache-Control`, RFC 9213; `Surrogate-Control`, Fastly's and Akamai's) or beside it
/// (`Expires`), so that no CDN in front keeps the cookie for the next visitor.
fn never_stored(h: &mut HeaderMap) {
    h.insert(header::CACHE_CONTROL, crate::http::NO_STORE.clone());
    // (Cloudflare's and Akamai's own spellings, and nginx's `X-Accel-Expires`, too.)
    for name in [
        "cdn-cache-control",
        "cloudflare-cdn-cache-control",
        "surrogate-control",
        "edge-control",
        "akamai-cache-control",
        "x-accel-expires",
    ] {
        h.remove(name);
    }
    h.remove(header::EXPIRES);
}

/// The refusal of a request whose host is missing, doubled or not a host.
fn invalid_host() -> crate::http::AppError {
    crate::http::AppError::invalid(
        "a request must name its host in one Host header: a host name or address, and \
         optionally a port",
    )
}

/// A request refused before any gate is chosen (two `Host`s, the gate rules not read yet,
/// a path two events gate): rare, so built out of line.
#[cold]
#[inline(never)]
fn refused(e: crate::http::AppError, req: &Request) -> (Outcome, Response) {
    // `no-store` as every refusal at a gated URL: a `503` while the rules are read, or a
    // path refused under these rules, must not be kept past them. A browser is told on a
    // page, as at a gated URL (defect: it was shown the JSON).
    let h = req.headers();
    let lang = crate::http::look::language(req.uri(), h);
    let reload = matches!(*req.method(), Method::GET | Method::HEAD);
    let json = !gate::asks_html(h);
    let res = crate::http::gate_page::refusal_of_no_event(e, json, lang, reload);
    (Outcome::Refused, res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_that_is_not_text_does_not_spoil_the_others() {
        let mut h = HeaderMap::new();
        h.append(header::ACCEPT, HeaderValue::from_static("text/html"));
        h.append(
            header::ACCEPT,
            HeaderValue::from_bytes(b"text/plain;x=\"\xe9\"").unwrap(),
        );
        h.append(header::ACCEPT, HeaderValue::from_static("application/json"));
        let joined = all_lines(&h, header::ACCEPT).unwrap();
        assert_eq!(joined.to_str().unwrap(), "text/html, application/json");
        let mut h = HeaderMap::new();
        h.append(
            header::ACCEPT_LANGUAGE,
            HeaderValue::from_bytes(b"\xe9").unwrap(),
        );
        h.append(header::ACCEPT_LANGUAGE, HeaderValue::from_static("ko"));
        let joined = all_lines(&h, header::ACCEPT_LANGUAGE).unwrap();
        assert_eq!(joined.to_str().unwrap(), "ko");
        // No line reads as text: the first, as one line alone would be kept.
        let mut h = HeaderMap::new();
        h.append(header::ACCEPT, HeaderValue::from_bytes(b"\xe9").unwrap());
        h.append(header::ACCEPT, HeaderValue::from_bytes(b"\xea").unwrap());
        assert_eq!(all_lines(&h, header::ACCEPT).unwrap().as_bytes(), b"\xe9");
    }

    fn asked(uri: &str, accept: Option<&str>, language: Option<&str>) -> Asked {
        Asked {
            uri: uri.parse().unwrap(),
            reloadable: true,
            accept: accept.map(|v| HeaderValue::from_str(v).unwrap()),
            language: language.map(|v| HeaderValue::from_str(v).unwrap()),
        }
    }

    /// A form's `POST`, as [`asked`] has it.
    fn posted(uri: &str, accept: Option<&str>, language: Option<&str>) -> Asked {
        Asked {
            reloadable: false,
            ..asked(uri, accept, language)
        }
    }

    async fn text(res: Response) -> String {
        let body = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_browser_gets_a_page_that_tries_again_and_others_the_json() {
        let page = bad_gateway(asked("/checkout", Some("text/html,*/*"), None));
        assert_eq!(page.status(), StatusCode::BAD_GATEWAY);
        let h = page.headers();
        assert_eq!(h[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(h[header::CACHE_CONTROL], "no-store");
        assert!(h.contains_key(header::CONTENT_SECURITY_POLICY));
        let retry = h[header::RETRY_AFTER].to_str().unwrap().to_string();
        let html = text(page).await;
        assert!(html.contains("<html lang=\"en\">"), "{html}");
        // The page reloads after the wait its Retry-After says.
        let refresh = format!("<meta http-equiv=\"refresh\" content=\"{retry}\">");
        assert!(html.contains(&refresh), "{retry}: {html}");
        assert!(html.contains(&format!("in {retry} s")), "{html}");
        assert!(html.contains("The site is not answering"), "{html}");

        // The language as the gate's pages choose it: `?lang=`, else `Accept-Language`.
        let ko = bad_gateway(asked(
            "/",
            Some("text/html"),
            Some("ko-KR,ko;q=0.9,en;q=0.5"),
        ));
        assert!(text(ko).await.contains("<html lang=\"ko\">"));
        let en = bad_gateway(asked("/?lang=en", Some("text/html"), Some("ko")));
        assert!(text(en).await.contains("<html lang=\"en\">"));

        for accept in [
            None,
            Some("*/*"),
            Some("application/json"),
            // A page refused.
            Some("text/html;q=0,*/*;q=0.8"),
        ] {
            let res = bad_gateway(asked("/", accept, Some("ko")));
            assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
            assert!(
                !res.headers().contains_key(header::RETRY_AFTER),
                "{accept:?}"
            );
            let body: serde_json::Value = serde_json::from_str(&text(res).await).unwrap();
            assert_eq!(body["error"]["code"], "UPSTREAM_UNAVAILABLE", "{accept:?}");
        }
    }

    /// A form whose upload stopped arriving: a browser gets a page saying so in its language
    /// (no reload: that would not send the form again), others the JSON error as before.
    #[tokio::test]
    async fn a_failed_upload_is_a_page_for_a_browser_and_json_for_others() {
        let cut = std::io::Error::other("the client went away");
        let browser = "text/html,application/xhtml+xml,*/*;q=0.8";
        for (uri, language, lang, words) in [
            (
                "/orders",
                Some("en-US,en;q=0.9"),
                "en",
                "did not arrive whole",
            ),
            (
                "/orders",
                Some("ko-KR,ko;q=0.9"),
                "ko",
                "끝까지 도착하지 않았습니다",
            ),
            ("/orders?lang=ko", None, "ko", "다시 보내 주세요"),
        ] {
            let res = upload_failed(&cut, posted(uri, Some(browser), language));
            assert_eq!(res.status(), StatusCode::BAD_REQUEST);
            let h = res.headers();
            assert_eq!(h[header::CONTENT_TYPE], "text/html; charset=utf-8");
            assert_eq!(h[header::CACHE_CONTROL], "no-store");
            assert!(h.contains_key(header::CONTENT_SECURITY_POLICY));
            assert!(!h.contains_key(header::RETRY_AFTER));
            let html = text(res).await;
            assert!(html.contains(&format!("<html lang=\"{lang}\">")), "{html}");
            assert!(html.contains("id=\"waitroom-upload-failed\""), "{html}");
            assert!(html.contains(words), "{html}");
            assert!(!html.contains("http-equiv=\"refresh\""), "{html}");
        }
        for accept in [
            None,
            Some("*/*"),
            Some("application/json"),
            Some("text/html;q=0"),
        ] {
            let res = upload_failed(&cut, posted("/orders", accept, Some("ko")));
            assert_eq!(res.status(), StatusCode::BAD_REQUEST);
            let body: serde_json::Value = serde_json::from_str(&text(res).await).unwrap();
            assert_eq!(body["error"]["code"], "INVALID_REQUEST", "{accept:?}");
            assert_eq!(
                body["error"]["message"],
                "the request body did not arrive: the client went away"
            );
        }
        // The 502 of a POST stays the JSON: its page's reload would lose the form.
        let res = bad_gateway(posted("/orders", Some(browser), None));
        let body: serde_json::Value = serde_json::from_str(&text(res).await).unwrap();
        assert_eq!(body["error"]["code"], "UPSTREAM_UNAVAILABLE");
    }

    /// Browsers shown the page while the site was down do not all come back at once: each
    /// answer's wait is drawn within the bounds, and the page and `Retry-After` agree on it.
    #[tokio::test]
    async fn the_pages_reload_after_waits_spread_over_four_to_eight_seconds() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let page = bad_gateway(asked("/", Some("text/html"), Some("ko")));
            let retry: u64 = page.headers()[header::RETRY_AFTER]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((4..=8).contains(&retry), "{retry}");
            let html = text(page).await;
            let refresh = format!("<meta http-equiv=\"refresh\" content=\"{retry}\">");
            assert!(html.contains(&refresh), "{retry}: {html}");
            assert!(html.contains(&format!("{retry}초 후에")), "{html}");
            seen.insert(retry);
        }
        // 200 draws of 5 values: all of them come up (one is missed with odds of 2e-19).
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), [4, 5, 6, 7, 8]);
    }

    #[test]
    fn own_paths() {
        for own in [
            "/api/v1/gate",
            "/healthz",
            "/wait/e",
            "/wait/e/queue",
            "/admin",
        ] {
            assert!(is_own_path(own), "{own}");
        }
        for site in [
            "/",
            "/checkout",
            "/api/v2/x",
            "/assets/site.css",
            "/admin/x",
            "/waiting",
        ] {
            assert!(!is_own_path(site), "{site}");
        }
    }
}
