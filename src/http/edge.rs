//! The one layer around every route: request metrics, the declared-size check, the request
//! and body-read timeouts and panic catching, in one service with one unboxed future per
//! request.
//!
//! They used to be five layers (two `from_fn` middlewares, a timeout with its error
//! handler, a panic catcher), each with its own boxed future and clone of the inner stack,
//! and the metrics resolved their series by hashing freshly allocated label strings on
//! every request: together they cost as much as the route itself (see PERFORMANCE.md,
//! "Middleware"). What each does is unchanged:
//!
//! - **metrics**: `waitroom_http_request_duration_seconds` (histogram) and
//!   `waitroom_http_requests_total` (counter), labelled `method`, `route` (the matched
//!   template, never the raw path, or `unmatched`) and `status`, for every answer including
//!   the ones this layer makes (413, 503, 500). The handles of each series are resolved once
//!   per worker thread and kept, so a request costs two atomic updates, not two registry
//!   look-ups.
//! - **declared size**: a `Content-Length` over the limit answers `413 PAYLOAD_TOO_LARGE`
//!   before any body is read.
//! - **timeout**: a request that takes longer than the limit answers `503 UNAVAILABLE`.
//! - **body-read timeout**: a request body that may still be arriving is read through
//!   [`BodyTimeout`] (a body trickled byte by byte is cut off; tower-http's `TimeoutBody`'s
//!   limit, with a timer only while the body is pending), and gets the body size limit
//!   (axum's `DefaultBodyLimit`, read by the body extractors); an empty one is passed as it
//!   is. Over HTTP/1, a body the answer was made without is read to its end afterwards
//!   ([`DrainOnDrop`]), so the connection serves the client's next request.
//! - **panics**: a panicking handler answers a JSON 500 instead of dropping the connection.
//! - **failures in the log**: a 5xx answer is logged at `ERROR` as `response failed`, as
//!   tower-http's trace layer did at the default log level (its per-request span and debug
//!   events are added around this layer only when debug logging is on); not one whose 5xx
//!   is the contract ([`NotAFailure`]: a waiting place's `503`, a full queue's).
//! - **tracing** (only when tracing export is on, see [`crate::telemetry::otel`]): the
//!   request runs in a span that continues its `traceparent`; off, there is no span and the
//!   `traceparent` header is not even read.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::hash::BuildHasherDefault;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, HttpBody as _};
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use metrics::{Counter, Histogram};
use pin_project_lite::pin_project;
use tower::Layer as _;

use super::body_timeout::{BodyTimeout, DrainOnDrop};
use super::error::AppError;
use crate::telemetry::budget::{log_within, LogBudget, PER_REQUEST_LINES};
use crate::telemetry::otel;

/// The layer; see the module documentation.
#[derive(Clone)]
pub struct EdgeLayer {
    limits: EdgeLimits,
}

/// Copied into every route's service rather than shared behind an `Arc`: axum clones a
/// route's whole service stack for every request, and a reference count bumped by every
/// worker per request is a cache line the cores pass back and forth.
#[derive(Clone, Copy)]
struct EdgeLimits {
    max_body_bytes: u64,
    request_timeout: Duration,
    /// Longest a request body may take to arrive ([`BodyTimeout`] around it).
    body_timeout: Duration,
    /// Log server errors here (when tower-http's trace layer, which logs them, is off).
    log_failures: bool,
    /// Tracing export is on: each request gets its span (see `Edge::call`).
    trace_requests: bool,
}

impl EdgeLayer {
    /// `log_failures`: log 5xx answers (leave it to tower-http's trace layer when that runs).
    pub fn new(
        max_body_bytes: usize,
        request_timeout: Duration,
        body_timeout: Duration,
        log_failures: bool,
    ) -> Self {
        EdgeLayer {
            limits: EdgeLimits {
                max_body_bytes: max_body_bytes as u64,
                request_timeout,
                body_timeout,
                log_failures,
                trace_requests: crate::telemetry::otel::enabled(),
            },
        }
    }
}

impl<S> tower::Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Edge<S> {
        Edge {
            inner,
            limits: self.limits,
        }
    }
}

/// The service of [`EdgeLayer`].
#[derive(Clone)]
pub struct Edge<S> {
    inner: S,
    limits: EdgeLimits,
}

impl<S> tower::Service<Request> for Edge<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = EdgeFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> EdgeFuture<S::Future> {
        let start = Instant::now();
        let route = req.extensions().get::<MatchedPath>().cloned();
        let method = method_label(req.method());
        // With tracing export on, the request runs in its span (which continues the
        // request's `traceparent`), so its log lines and error bodies carry the trace id.
        // Off, no span is made and no header parsed.
        let span = self.limits.trace_requests.then(|| {
            let name = route.as_ref().map_or("unmatched", MatchedPath::as_str);
            otel::request_span(method, name, req.headers())
        });
        let _entered = span.as_ref().map(tracing::Span::enter);
        let mut fut = EdgeFuture {
            state: State::Done,
            timer: None,
            start,
            route,
            method,
            request_timeout: self.limits.request_timeout,
            log_failures: self.limits.log_failures,
            span: None,
        };
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        fut.state = if declared.is_some_and(|n| n > self.limits.max_body_bytes) {
            State::Answered {
                res: Some(own_answer(AppError::PayloadTooLarge(
                    "the request body is too large".into(),
                ))),
            }
        } else {
            // A body that may still be arriving gets the body-read timeout (a body trickled
            // byte by byte is cut off) and the body size limit (axum's `DefaultBodyLimit`,
            // which the body extractors read). One that is known to be empty (a `GET`)
            // cannot trickle nor be too large: it is passed as it is, without wrapping and
            // boxing it again nor an extension inserted into the request.
            let empty = req.body().is_end_stream();
            let limits = self.limits;
            let inner = &mut self.inner;
            // The inner service was polled ready through `poll_ready` above, and its
            // future owns what it needs: no clone of the inner stack per request.
            let call = move || {
                if empty {
                    inner.call(req)
                } else {
                    let timeout = limits.body_timeout;
                    let max = limits.max_body_bytes as usize;
                    // Over HTTP/2 an unread body ends its own stream only (RST_STREAM,
                    // NO_ERROR): the connection goes on without reading it. HTTP/1.0 closes
                    // after the answer anyway. With `Expect: 100-continue` the client may
                    // never send the body once answered (hyper sends no `100` then), and
                    // what it sends next would be read as the body: closed, as before.
                    let req = if req.version() == axum::http::Version::HTTP_11
                        && !req.headers().contains_key(header::EXPECT)
                    {
                        req.map(|body| Body::new(DrainOnDrop::new(body, timeout, max)))
                    } else {
                        req.map(|body| Body::new(BodyTimeout::whole(timeout, body)))
                    };
                    DefaultBodyLimit::max(limits.max_body_bytes as usize)
                        .layer(inner)
                        .call(req)
                }
            };
            match std::panic::catch_unwind(AssertUnwindSafe(call)) {
                Ok(inner) => State::Running { inner },
                Err(panic) => State::Answered {
                    res: Some(panic_response(panic)),
                },
            }
        };
        drop(_entered);
        fut.span = span;
        fut
    }
}

pin_project! {
    /// The future of one request through [`Edge`]: the inner service's future, run under
    /// panic catching and the request timeout, then counted in its series.
    ///
    /// Hand-written rather than an `async` block in a box: one allocation fewer per request,
    /// and the timeout's timer is made only if the inner future is not ready at its first
    /// poll. A `tokio::time::timeout` made for every request costs a look-up of the runtime
    /// handle (a reference count shared by every worker) and, when dropped, the timer
    /// driver's lock, even when it never fired; most answers (`/healthz`, a status poll)
    /// are ready at once and never need it. The deadline is the same: `start` + the timeout.
    pub struct EdgeFuture<F> {
        #[pin]
        state: State<F>,
        #[pin]
        timer: Option<tokio::time::Sleep>,
        start: Instant,
        route: Option<MatchedPath>,
        method: &'static str,
        request_timeout: Duration,
        log_failures: bool,
        // With tracing export on: the request's span, entered at every poll.
        span: Option<tracing::Span>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // The inner service's future.
        Running { #[pin] inner: F },
        // Answered by the layer itself (413, a panic in `call`); taken when polled.
        Answered { res: Option<Response> },
        // Done (the answer was handed out).
        Done,
    }
}

impl<F> Future for EdgeFuture<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let _entered = this.span.as_ref().map(tracing::Span::enter);
        let res = match this.state.as_mut().project() {
            StateProj::Answered { res } => res.take().expect("polled after completion"),
            StateProj::Done => panic!("polled after completion"),
            StateProj::Running { inner } => {
                match std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
                    Ok(Poll::Ready(Ok(res))) => res,
                    Ok(Poll::Ready(Err(never))) => match never {},
                    Err(panic) => panic_response(panic),
                    Ok(Poll::Pending) => {
                        if this.timer.is_none() {
                            // The deadline counts from `start` (the time already spent
                            // counts); read on tokio's clock, which tests may pause.
                            let left = this.request_timeout.saturating_sub(this.start.elapsed());
                            this.timer.set(Some(tokio::time::sleep(left)));
                        }
                        let timer = this.timer.as_mut().as_pin_mut();
                        match timer.map(|t| t.poll(cx)) {
                            Some(Poll::Ready(())) => {
                                own_answer(AppError::Unavailable("request timed out".into()))
                            }
                            _ => return Poll::Pending,
                        }
                    }
                }
            }
        };
        // Drops the inner future (and what it holds) before the answer is counted.
        this.state.set(State::Done);
        this.timer.set(None);
        finish(
            this.route.take(),
            this.method,
            &res,
            *this.start,
            *this.log_failures,
        );
        if let Some(span) = this.span.as_ref() {
            otel::record_status(span, res.status().as_u16());
        }
        Poll::Ready(Ok(res))
    }
}

fn panic_response(err: Box<dyn Any + Send + 'static>) -> Response {
    let detail = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    own_answer(AppError::Internal(format!("handler panicked: {detail}")))
}

/// An answer this layer makes itself, before or instead of the route's (413, 503, 500):
/// `no-store`, since it stands in for an answer that may have been one no cache may keep
/// (every admin answer says so, API.md), and a refusal is worth keeping by none.
fn own_answer(e: AppError) -> Response {
    let mut res = e.into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, super::NO_STORE.clone());
    res
}

/// Label of a method; anything unusual is lumped together so a client inventing methods
/// cannot grow the number of time series.
pub(crate) fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        _ => "OTHER",
    }
}

/// The handles of one series (method, route, status).
struct Series {
    method: &'static str,
    status: u16,
    count: Counter,
    latency: Histogram,
}

thread_local! {
    /// Per worker thread, so that finding a series takes no lock: route → the series seen
    /// for it. The routes are the router's templates (and `unmatched`), the methods a fixed
    /// set: this stays as small as the set of series itself.
    ///
    /// Keyed by the address of the template's text rather than by the text: axum hands
    /// every request of a route a clone of the same `Arc<str>` (`MatchedPath`), so its
    /// address names the route without hashing the string (SipHash over the whole path, per
    /// request). The entry keeps that `MatchedPath`, so the text cannot be freed and its
    /// address given to another route while the entry lives.
    static SERIES: RefCell<HashMap<usize, RouteSeries, BuildHasherDefault<AddressHasher>>> =
        RefCell::new(HashMap::default());
}

/// The series of one route (`None`: `unmatched`), and the route's text kept alive.
struct RouteSeries {
    _route: Option<MatchedPath>,
    series: Vec<Series>,
}

/// Most routers a worker thread keeps series handles for; a process serves one router,
/// but a test process builds many, whose routes would otherwise stay in the map.
const MAX_ROUTES_KEPT: usize = 4096;

/// A hasher for addresses: they are unique already, so mixing their bits is enough.
#[derive(Default)]
struct AddressHasher(u64);

impl std::hash::Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        // Fibonacci hashing folded down: hashbrown reads both the low bits (the bucket)
        // and the high ones (the tag), and aligned addresses end in zero bits.
        let h = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
}

/// Records one answer in its series, and logs it when it is a server error.
fn finish(
    route: Option<MatchedPath>,
    method: &'static str,
    res: &Response,
    start: Instant,
    log_failures: bool,
) {
    let elapsed = start.elapsed();
    let status = res.status();
    let key = route.as_ref().map_or(0, |r| r.as_str().as_ptr() as usize);
    SERIES.with(|cell| {
        let mut map = cell.borrow_mut();
        if !map.contains_key(&key) && map.len() >= MAX_ROUTES_KEPT {
            map.clear();
        }
        let entry = map.entry(key).or_insert_with(|| RouteSeries {
            _route: route.clone(),
            series: Vec::new(),
        });
        let list = &mut entry.series;
        let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
        let code = status.as_u16();
        let i = match list
            .iter()
            .position(|s| s.status == code && s.method == method)
        {
            Some(i) => i,
            None => {
                let labels = [
                    ("method", method.to_string()),
                    ("route", route.to_string()),
                    ("status", code.to_string()),
                ];
                list.push(Series {
                    method,
                    status: code,
                    count: metrics::counter!("waitroom_http_requests_total", &labels),
                    latency: metrics::histogram!("waitroom_http_request_duration_seconds", &labels),
                });
                list.len() - 1
            }
        };
        let s = &list[i];
        s.latency.record(elapsed.as_secs_f64());
        s.count.increment(1);
    });
    if log_failures && is_failure(res) {
        log_failure(status, elapsed);
    }
}

/// Whether an answer is logged as a failure: a `5xx` that is not the contract's.
fn is_failure(res: &Response) -> bool {
    res.status().is_server_error() && res.extensions().get::<NotAFailure>().is_none()
}

/// On an answer whose `5xx` is the contract, not a failure: a waiting place's `503` (each
/// person refreshing the waiting room made an `ERROR` line, burying real ones in a flash
/// crowd), a full queue's or event's. Such answers are still counted by status.
#[derive(Clone, Copy, Debug)]
pub struct NotAFailure;

/// What tower-http's trace layer logged for a server error at the default log level.
/// (Within a budget: in an outage every answer is a failure.)
#[cold]
fn log_failure(status: StatusCode, latency: Duration) {
    static FAILURES: LogBudget = LogBudget::new(PER_REQUEST_LINES, Duration::from_secs(1));
    log_within!(
        FAILURES,
        error,
        target: "tower_http::trace::on_failure",
        classification = %format_args!("Status code: {status}"),
        latency = %format_args!("{} ms", latency.as_millis()),
        "response failed"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiting place's `503` and a full queue's are the contract, not failures (defect:
    /// every refresh of the waiting room logged an `ERROR`); a store that is down, a panic,
    /// an internal error are.
    #[test]
    fn only_real_server_errors_are_failures() {
        use crate::http::AppError;
        let view = crate::http::body::sample_view(crate::core::PlaceState::Waiting);
        let waiting = crate::http::gate::waiting_response(
            &crate::http::gate_page::Words::titled("en", "t"),
            "e",
            &view,
            true,
            None,
        );
        assert_eq!(waiting.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(!is_failure(&waiting));
        for e in [AppError::QueueFull, AppError::EventFull] {
            assert!(!is_failure(&e.into_response()));
        }
        for e in [
            AppError::Unavailable("down".into()),
            AppError::Internal("bug".into()),
        ] {
            assert!(is_failure(&e.into_response()));
        }
        assert!(!is_failure(&AppError::NotFound.into_response()));
    }
    use axum::routing::{get, post};
    use axum::Router;
    use std::sync::Arc;
    use tower::ServiceExt as _;

    /// The sum of `waitroom_http_requests_total` over the series of `method`, `route`,
    /// `status` in Prometheus text.
    fn requests(text: &str, method: &str, route: &str, status: u16) -> f64 {
        text.lines()
            .filter(|l| l.starts_with("waitroom_http_requests_total{"))
            .filter(|l| {
                l.contains(&format!("method=\"{method}\""))
                    && l.contains(&format!("route=\"{route}\""))
                    && l.contains(&format!("status=\"{status}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    async fn send(app: &Router, method: &str, path: &str, body: &'static str) -> StatusCode {
        answer(app, method, path, body).await.status()
    }

    async fn answer(app: &Router, method: &str, path: &str, body: &'static str) -> Response {
        let req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_LENGTH, body.len())
            .body(Body::from(body))
            .unwrap();
        app.clone().oneshot(req).await.unwrap()
    }

    /// Counts the spans made while it is the thread's subscriber.
    struct CountSpans(Arc<std::sync::atomic::AtomicUsize>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountSpans {
        fn on_new_span(
            &self,
            _: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The request path of the default setting (no tracing export) makes no span, even for
    /// a request that brings a `traceparent`: the per-request span stays gone (see
    /// PERFORMANCE.md, "Middleware"). With export on, the same request makes one.
    #[tokio::test]
    async fn without_tracing_export_a_request_makes_no_span() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let spans = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let subscriber = tracing_subscriber::registry().with(CountSpans(spans.clone()));
        let _default = tracing::subscriber::set_default(subscriber);
        let request = || {
            axum::http::Request::builder()
                .uri("/edge-span")
                .header(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                )
                .body(Body::empty())
                .unwrap()
        };
        let route = Router::new().route("/edge-span", get(|| async { "ok" }));
        assert!(!otel::enabled(), "no export in the unit tests");
        let app = route.clone().layer(EdgeLayer::new(
            16,
            Duration::from_secs(5),
            Duration::from_secs(5),
            true,
        ));
        let res = app.oneshot(request()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(spans.load(std::sync::atomic::Ordering::Relaxed), 0);

        let mut traced = EdgeLayer::new(16, Duration::from_secs(5), Duration::from_secs(5), true);
        traced.limits.trace_requests = true;
        let res = route.layer(traced).oneshot(request()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(spans.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    /// The request timeout's timer is made only when the handler is not ready at once
    /// (`EdgeFuture`): a handler that waits less than the timeout is answered, one that
    /// waits longer gets the 503, and one ready at once needs no timer at all.
    #[tokio::test]
    async fn the_lazy_request_timer_answers_in_time_and_times_out_late() {
        let app = Router::new()
            .route("/now", get(|| async { "now" }))
            .route(
                "/soon",
                get(|| async {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    "soon"
                }),
            )
            .route(
                "/late",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    "late"
                }),
            )
            .layer(EdgeLayer::new(
                16,
                Duration::from_millis(300),
                Duration::from_secs(5),
                false,
            ));
        assert_eq!(send(&app, "GET", "/now", "").await, StatusCode::OK);
        assert_eq!(send(&app, "GET", "/soon", "").await, StatusCode::OK);
        let late = tokio::time::timeout(Duration::from_secs(10), send(&app, "GET", "/late", ""));
        assert_eq!(
            late.await.expect("the request timeout answered"),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    /// A body that keeps arriving gets the body-read timeout from `edge` (which took over
    /// tower-http's layer): a body that stalls is cut off and the handler's read fails,
    /// while an empty one, passed through unwrapped, and a complete one are read as usual.
    #[tokio::test]
    async fn a_stalled_body_is_cut_off_by_the_body_timeout() {
        let app = Router::new()
            .route(
                "/read",
                post(|body: axum::body::Bytes| async move { format!("{}", body.len()) }),
            )
            .route(
                "/empty",
                get(|req: Request| async move {
                    assert!(req.body().is_end_stream());
                    "empty"
                }),
            )
            .layer(EdgeLayer::new(
                1024,
                Duration::from_secs(30),
                Duration::from_millis(100),
                false,
            ));
        // A chunked body (no declared length) whose first chunk comes and then nothing.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<axum::body::Bytes, Infallible>>(1);
        tx.send(Ok(axum::body::Bytes::from_static(b"{\"a\"")))
            .await
            .unwrap();
        let stalled = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|chunk| (chunk, rx))
        }));
        let req = axum::http::Request::builder()
            .method("POST")
            .uri("/read")
            .body(stalled)
            .unwrap();
        let res = tokio::time::timeout(Duration::from_secs(10), app.clone().oneshot(req))
            .await
            .expect("the stalled body was cut off")
            .unwrap();
        assert!(res.status().is_client_error(), "{}", res.status());
        drop(tx);

        assert_eq!(send(&app, "POST", "/read", "{}").await, StatusCode::OK);
        assert_eq!(send(&app, "GET", "/empty", "").await, StatusCode::OK);
    }

    #[tokio::test]
    async fn every_answer_counts_in_its_own_series() {
        let metrics = crate::telemetry::prometheus();
        let app = Router::new()
            .route("/edge-test/{id}", post(|| async { "ok" }))
            .route(
                "/edge-test-panic",
                get(|| async {
                    if true {
                        panic!("boom");
                    }
                    "unreachable"
                }),
            )
            .route(
                "/edge-test-slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    "late"
                }),
            )
            .layer(EdgeLayer::new(
                16,
                Duration::from_millis(50),
                Duration::from_secs(5),
                false,
            ));

        // The same series twice (the second time from the handles kept), then the answers
        // the layer makes itself: each in the series of its own status.
        assert_eq!(
            send(&app, "POST", "/edge-test/a", "{}").await,
            StatusCode::OK
        );
        assert_eq!(
            send(&app, "POST", "/edge-test/b", "{}").await,
            StatusCode::OK
        );
        // Each of the layer's own answers stands in for one a cache must not keep.
        let big = "this body is longer than 16 bytes";
        for (method, path, body, status) in [
            ("POST", "/edge-test/c", big, StatusCode::PAYLOAD_TOO_LARGE),
            (
                "GET",
                "/edge-test-panic",
                "",
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            (
                "GET",
                "/edge-test-slow",
                "",
                StatusCode::SERVICE_UNAVAILABLE,
            ),
        ] {
            let res = answer(&app, method, path, body).await;
            assert_eq!(res.status(), status);
            assert_eq!(res.headers()[header::CACHE_CONTROL], "no-store", "{path}");
        }
        assert_eq!(
            send(&app, "BREW", "/edge-test-nowhere", "").await,
            StatusCode::NOT_FOUND
        );

        let text = metrics.render();
        let t = "/edge-test/{id}";
        assert_eq!(requests(&text, "POST", t, 200), 2.0, "{text}");
        assert_eq!(requests(&text, "POST", t, 413), 1.0, "{text}");
        assert_eq!(requests(&text, "GET", "/edge-test-panic", 500), 1.0);
        assert_eq!(requests(&text, "GET", "/edge-test-slow", 503), 1.0);
        assert!(requests(&text, "OTHER", "unmatched", 404) >= 1.0, "{text}");
        assert!(
            !text.contains("route=\"/edge-test/a\""),
            "raw paths leak into route labels"
        );
        assert!(text.contains("waitroom_http_request_duration_seconds_bucket{method=\"POST\",route=\"/edge-test/{id}\",status=\"413\""));
    }
}
