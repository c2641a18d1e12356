//! The one layer around every route: request metrics, the declared-size check, the request
//! timeout and panic catching, in one service with one future per request.
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
//! - **panics**: a panicking handler answers a JSON 500 instead of dropping the connection.
//! - **failures in the log**: a 5xx answer is logged at `ERROR` as `response failed`, as
//!   tower-http's trace layer did at the default log level (its per-request span and debug
//!   events are added around this layer only when debug logging is on).
//! - **tracing** (only when tracing export is on, see [`crate::telemetry::otel`]): the
//!   request runs in a span that continues its `traceparent`; off, there is no span and the
//!   `traceparent` header is not even read.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt as _;
use metrics::{Counter, Histogram};

use super::error::AppError;
use crate::telemetry::otel;

/// The layer; see the module documentation.
#[derive(Clone)]
pub struct EdgeLayer {
    limits: Arc<EdgeLimits>,
}

struct EdgeLimits {
    max_body_bytes: u64,
    request_timeout: Duration,
    /// Log server errors here (when tower-http's trace layer, which logs them, is off).
    log_failures: bool,
    /// Tracing export is on: each request gets its span (see `Edge::call_traced`).
    trace_requests: bool,
}

impl EdgeLayer {
    /// `log_failures`: log 5xx answers (leave it to tower-http's trace layer when that runs).
    pub fn new(max_body_bytes: usize, request_timeout: Duration, log_failures: bool) -> Self {
        EdgeLayer {
            limits: Arc::new(EdgeLimits {
                max_body_bytes: max_body_bytes as u64,
                request_timeout,
                log_failures,
                trace_requests: crate::telemetry::otel::enabled(),
            }),
        }
    }
}

impl<S> tower::Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Edge<S> {
        Edge {
            inner,
            limits: self.limits.clone(),
        }
    }
}

/// The service of [`EdgeLayer`].
#[derive(Clone)]
pub struct Edge<S> {
    inner: S,
    limits: Arc<EdgeLimits>,
}

type EdgeFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl<S> tower::Service<Request> for Edge<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = EdgeFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> EdgeFuture {
        if self.limits.trace_requests {
            return self.call_traced(req);
        }
        self.serve(req)
    }
}

impl<S> Edge<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible>,
    S::Future: Send + 'static,
{
    /// With tracing export on: the request runs in its span (which continues the request's
    /// `traceparent`), so its log lines and error bodies carry the trace id. Off, `call`
    /// goes straight to `serve`: no span, no header parsing, nothing allocated.
    fn call_traced(&mut self, req: Request) -> EdgeFuture {
        use tracing::Instrument as _;
        let route = req
            .extensions()
            .get::<MatchedPath>()
            .map_or("unmatched", MatchedPath::as_str);
        let span = otel::request_span(method_label(req.method()), route, req.headers());
        let served = span.in_scope(|| self.serve(req));
        let recorded = span.clone();
        Box::pin(
            async move {
                let res = served.await;
                if let Ok(r) = &res {
                    otel::record_status(&recorded, r.status().as_u16());
                }
                res
            }
            .instrument(span),
        )
    }

    fn serve(&mut self, req: Request) -> EdgeFuture {
        let start = Instant::now();
        let route = req.extensions().get::<MatchedPath>().cloned();
        let method = method_label(req.method());
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.limits.max_body_bytes) {
            let res =
                AppError::PayloadTooLarge("the request body is too large".into()).into_response();
            finish(route, method, &res, start, self.limits.log_failures);
            return Box::pin(std::future::ready(Ok(res)));
        }
        // The inner service was polled ready through `poll_ready` above, and its future
        // owns what it needs: no clone of the inner stack per request.
        let called = std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(req)));
        let timeout = self.limits.request_timeout;
        let log_failures = self.limits.log_failures;
        Box::pin(async move {
            let res = match called {
                Err(panic) => panic_response(panic),
                Ok(fut) => {
                    match tokio::time::timeout(timeout, AssertUnwindSafe(fut).catch_unwind()).await
                    {
                        Ok(Ok(Ok(res))) => res,
                        Ok(Ok(Err(never))) => match never {},
                        Ok(Err(panic)) => panic_response(panic),
                        Err(_elapsed) => {
                            AppError::Unavailable("request timed out".into()).into_response()
                        }
                    }
                }
            };
            finish(route, method, &res, start, log_failures);
            Ok(res)
        })
    }
}

fn panic_response(err: Box<dyn Any + Send + 'static>) -> Response {
    let detail = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    AppError::Internal(format!("handler panicked: {detail}")).into_response()
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
    /// Per worker thread, so that finding a series takes no lock: route template → the
    /// series seen for it. The routes are the router's templates (and `unmatched`), the
    /// methods a fixed set: this stays as small as the set of series itself.
    static SERIES: RefCell<HashMap<Box<str>, Vec<Series>>> = RefCell::new(HashMap::new());
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
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    SERIES.with(|cell| {
        let mut map = cell.borrow_mut();
        if !map.contains_key(route) {
            map.insert(route.into(), Vec::new());
        }
        let Some(list) = map.get_mut(route) else {
            return;
        };
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
    if log_failures && status.is_server_error() {
        log_failure(status, elapsed);
    }
}

/// What tower-http's trace layer logged for a server error at the default log level.
#[cold]
fn log_failure(status: StatusCode, latency: Duration) {
    tracing::error!(
        target: "tower_http::trace::on_failure",
        classification = %format_args!("Status code: {status}"),
        latency = %format_args!("{} ms", latency.as_millis()),
        "response failed"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::{get, post};
    use axum::Router;
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
        let req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_LENGTH, body.len())
            .body(Body::from(body))
            .unwrap();
        app.clone().oneshot(req).await.unwrap().status()
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
        let app = route
            .clone()
            .layer(EdgeLayer::new(16, Duration::from_secs(5), true));
        let res = app.oneshot(request()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(spans.load(std::sync::atomic::Ordering::Relaxed), 0);

        let mut traced = EdgeLayer::new(16, Duration::from_secs(5), true);
        Arc::get_mut(&mut traced.limits).unwrap().trace_requests = true;
        let res = route.layer(traced).oneshot(request()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(spans.load(std::sync::atomic::Ordering::Relaxed), 1);
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
            .layer(EdgeLayer::new(16, Duration::from_millis(50), false));

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
        let big = "this body is longer than 16 bytes";
        assert_eq!(
            send(&app, "POST", "/edge-test/c", big).await,
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(
            send(&app, "GET", "/edge-test-panic", "").await,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            send(&app, "GET", "/edge-test-slow", "").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
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
