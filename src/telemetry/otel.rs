//! Tracing export (OpenTelemetry), off unless `otlp_endpoint` is set.
//!
//! When it is on, every request gets one span (made by [`crate::http::edge`]) that continues
//! the W3C `traceparent` of the request when there is one, and is exported in batches over
//! OTLP/HTTP (protobuf) to the collector. Its trace id is a field of the span, so it shows in
//! every log line written while the request runs, and error bodies carry it
//! (`error.trace_id`). [`inject`] writes the current trace context into outgoing headers:
//! what a proxy in front of an origin calls to pass the trace on.
//!
//! When it is off nothing here runs on the request path: no span, no header parsing, no
//! allocation per request (the edge layer checks [`enabled`] once, when the router is built).
//!
//! The exporter's HTTP client is opentelemetry-http's hyper client (hyper is here already;
//! no reqwest, no gRPC). The SDK's batch processor exports from a thread of its own, outside
//! the tokio runtime, so [`OnRuntime`] runs each export on the server's runtime.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::http::HeaderMap;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_http::{Bytes, HeaderExtractor, HeaderInjector, HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt as _};
use tracing_subscriber::registry::LookupSpan;

/// The target of the request spans. Logging keeps it at `INFO` whatever `RUST_LOG` says
/// while export is on, so a quieter log level does not switch off the traces.
pub const REQUEST_TARGET: &str = "waitroom::request";

/// How long one export may take before it is given up (the batch is dropped, the next one
/// tried): a stuck collector must not pile up spans in memory.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the exit waits for the last spans to go out: with the server's own 5 s of
/// shutdown grace it stays under the 10 s container runtimes wait before killing, even with
/// a collector that does not answer.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Failed exports are logged at most this often: a collector that stays unreachable fails
/// every batch (one every few seconds), and a warning each time would flood the log.
const FAILURE_WARNING_EVERY: Duration = Duration::from_secs(60);

/// The process's tracer provider, once export is switched on.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Whether tracing export is on in this process.
pub fn enabled() -> bool {
    PROVIDER.get().is_some()
}

/// Where the spans go: the collector's base URL (as `OTEL_EXPORTER_OTLP_ENDPOINT` means
/// it) plus the traces path of OTLP/HTTP.
pub fn traces_url(endpoint: &str) -> String {
    format!("{}/v1/traces", endpoint.trim_end_matches('/'))
}

/// Export is on: flush and stop it with [`Export::shutdown`] before the process ends.
#[must_use = "spans still in the batch are lost unless `shutdown` is called"]
pub struct Export {
    provider: SdkTracerProvider,
}

impl Export {
    /// Sends what is still batched and stops the exporter thread, waiting at most
    /// [`FLUSH_TIMEOUT`]. The SDK blocks while it waits, and the export it waits for runs on
    /// the runtime: so off the runtime's threads.
    pub async fn shutdown(self) {
        let provider = self.provider;
        let done =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(FLUSH_TIMEOUT))
                .await;
        if let Ok(Err(e)) = done {
            // Through the log, so that `--log-format json` keeps one JSON object a line.
            tracing::warn!(error = %e, "flushing the trace export failed");
        }
    }
}

/// Switches tracing export on, to the OTLP/HTTP collector at `endpoint` (`http://host:port`).
/// Call once, inside the tokio runtime, before [`super::init_logging`] (which adds the
/// layer that turns request spans into OpenTelemetry spans).
pub fn install(endpoint: &str) -> Result<Export, String> {
    let client = OnRuntime {
        client: opentelemetry_http::hyper::HyperClient::with_default_connector(
            EXPORT_TIMEOUT,
            None,
        ),
        runtime: tokio::runtime::Handle::try_current()
            .map_err(|_| "tracing export must be started inside the runtime".to_string())?,
        url: traces_url(endpoint),
        health: Default::default(),
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(traces_url(endpoint))
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot set up the OTLP exporter: {e}"))?;
    // `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` are read by the SDK; without a
    // service name the spans are ours.
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("waitroom");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    PROVIDER
        .set(provider.clone())
        .map_err(|_| "tracing export is already on".to_string())?;
    Ok(Export { provider })
}

/// The layer that turns `tracing` spans into OpenTelemetry spans, when export is on.
pub fn layer<S>() -> Option<OpenTelemetryLayer<S, SdkTracer>>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let provider = PROVIDER.get()?;
    Some(tracing_opentelemetry::layer().with_tracer(provider.tracer("waitroom")))
}

/// The span of one request: `otel.name` is the method and route template (never the raw
/// path), it continues the trace of the request's `traceparent` when that is valid, and
/// its `trace_id` field (in hex) is what log lines and error bodies show. The status is
/// recorded by [`record_status`].
pub fn request_span(method: &'static str, route: &str, headers: &HeaderMap) -> tracing::Span {
    let span = tracing::info_span!(
        target: REQUEST_TARGET,
        "request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = method,
        http.route = route,
        http.response.status_code = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    if parent.span().span_context().is_valid() {
        // Fails only for a span that is disabled (no subscriber takes it): nothing to join.
        let _ = span.set_parent(parent);
    }
    if let Some(id) = trace_id_of(&span) {
        span.record("trace_id", tracing::field::display(id));
    }
    span
}

/// Records the answer's status on a request span; a server error marks the span failed.
pub fn record_status(span: &tracing::Span, status: u16) {
    // As an i64: the OpenTelemetry layer records unsigned values as text.
    span.record("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
}

fn trace_id_of(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// The trace id of the request being served, in hex, when export is on.
pub fn current_trace_id() -> Option<String> {
    if !enabled() {
        return None;
    }
    trace_id_of(&tracing::Span::current())
}

/// Writes the current trace context as `traceparent` (and `tracestate`) into `headers`:
/// what a proxy calls on the request it sends to the origin, so the origin's spans join the
/// same trace. Writes nothing outside a traced request.
pub fn inject(headers: &mut HeaderMap) {
    let cx = tracing::Span::current().context();
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
    }
}

/// Runs each export on the server's runtime: the batch processor calls the client from a
/// plain thread, where hyper's client (which needs tokio's reactor and timers) cannot run.
/// It also tells the operator when exports fail (see [`ExportHealth`]).
#[derive(Debug)]
struct OnRuntime {
    client: opentelemetry_http::hyper::HyperClient,
    runtime: tokio::runtime::Handle,
    /// The collector's traces URL, for the warnings.
    url: String,
    health: parking_lot::Mutex<ExportHealth>,
}

#[async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: axum::http::Request<Bytes>,
    ) -> Result<axum::http::Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let sent = self
            .runtime
            .spawn(async move { client.send_bytes(request).await })
            .await
            .map_err(HttpError::from)
            .and_then(|r| r);
        // The exporter takes any answer but a 2xx as a failure too.
        let failure = match &sent {
            Ok(r) if r.status().is_success() => None,
            Ok(r) => Some(format!("the collector answered {}", r.status())),
            Err(e) => Some(error_chain(e.as_ref())),
        };
        let now = Instant::now();
        match failure {
            Some(error) => {
                if let Some(failed_exports) = self.health.lock().failed(now) {
                    tracing::warn!(
                        url = %self.url,
                        %error,
                        failed_exports,
                        "exporting traces to the OTLP collector failed: the spans of each failed \
                         export are lost (said at most once a minute while it lasts)"
                    );
                }
            }
            None => {
                if let Some(failed_exports) = self.health.lock().succeeded() {
                    tracing::info!(
                        url = %self.url,
                        failed_exports,
                        "exporting traces to the OTLP collector works again"
                    );
                }
            }
        }
        sent
    }
}

/// An error and its sources, `: `-separated: hyper's client error alone reads "client error
/// (Connect)", its source says "Connection refused".
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// Failed exports, so they are told to the operator: the SDK reports nothing itself (its
/// internal logs are a feature left off), and a mistyped collector address lost every span
/// without a word. The first failure is told at once, then at most once every
/// [`FAILURE_WARNING_EVERY`] with the count since; the first success after is told too.
#[derive(Debug, Default)]
struct ExportHealth {
    /// Failed exports not yet counted in a warning.
    untold: u64,
    /// Failed exports since the last success.
    since_success: u64,
    /// When the last warning was written, during the current run of failures.
    warned_at: Option<Instant>,
}

impl ExportHealth {
    /// One failed export at `now`: the number of failures to report when a warning is due.
    fn failed(&mut self, now: Instant) -> Option<u64> {
        self.untold += 1;
        self.since_success += 1;
        let due = self
            .warned_at
            .is_none_or(|at| now.duration_since(at) >= FAILURE_WARNING_EVERY);
        if !due {
            return None;
        }
        self.warned_at = Some(now);
        Some(std::mem::take(&mut self.untold))
    }

    /// One successful export: the failures it ends, when there were any.
    fn succeeded(&mut self) -> Option<u64> {
        let ended = std::mem::take(&mut self.since_success);
        self.untold = 0;
        self.warned_at = None;
        (ended > 0).then_some(ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt as _;

    /// A subscriber with the OpenTelemetry layer over a provider that exports nowhere:
    /// spans get real ids, without the process-wide export.
    fn with_tracing<R>(f: impl FnOnce() -> R) -> R {
        let provider = SdkTracerProvider::builder().build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, f)
    }

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    #[test]
    fn a_request_span_continues_the_incoming_trace_and_passes_it_on() {
        with_tracing(|| {
            let mut headers = HeaderMap::new();
            headers.insert(
                "traceparent",
                format!("00-{TRACE}-00f067aa0ba902b7-01").parse().unwrap(),
            );
            let span = request_span("GET", "/x", &headers);
            assert_eq!(trace_id_of(&span).as_deref(), Some(TRACE));
            let mut out = HeaderMap::new();
            span.in_scope(|| inject(&mut out));
            let tp = out["traceparent"].to_str().unwrap();
            assert!(tp.starts_with(&format!("00-{TRACE}-")), "{tp}");
            assert!(
                !tp.contains("00f067aa0ba902b7"),
                "the next hop's parent is our span, not the caller's: {tp}"
            );
        });
    }

    #[test]
    fn without_a_valid_traceparent_a_request_starts_a_trace_of_its_own() {
        with_tracing(|| {
            for bad in [None, Some("garbage"), Some("00-0000-zz-01")] {
                let mut headers = HeaderMap::new();
                if let Some(v) = bad {
                    headers.insert("traceparent", v.parse().unwrap());
                }
                let a = trace_id_of(&request_span("GET", "/x", &headers)).unwrap();
                let b = trace_id_of(&request_span("GET", "/x", &headers)).unwrap();
                assert_eq!(a.len(), 32);
                assert_ne!(a, b, "each request is a trace of its own");
            }
        });
    }

    /// Hostile `traceparent`s: ids of zeros (invalid by the spec), a forbidden version, a
    /// huge header, a huge `tracestate`, bytes that are not text. None is joined or
    /// reflected; each request is a trace of its own with a real id.
    #[test]
    fn a_hostile_traceparent_is_never_joined() {
        let zeros = "0".repeat(32);
        let huge = format!("00-{TRACE}-00f067aa0ba902b7-01{}", "-ff".repeat(20_000));
        let cases: Vec<Vec<u8>> = vec![
            format!("00-{zeros}-00f067aa0ba902b7-01").into_bytes(),
            format!("00-{TRACE}-0000000000000000-01").into_bytes(),
            format!("ff-{TRACE}-00f067aa0ba902b7-01").into_bytes(),
            format!("00-{}-00f067aa0ba902b7-01", TRACE.to_uppercase()).into_bytes(),
            huge.into_bytes(),
            b"00-\xff\xfe-\x80-01".to_vec(),
            "0".repeat(100_000).into_bytes(),
        ];
        with_tracing(|| {
            for bad in cases {
                let mut headers = HeaderMap::new();
                headers.insert(
                    "traceparent",
                    axum::http::HeaderValue::from_bytes(&bad).unwrap(),
                );
                headers.insert("tracestate", "k=v,".repeat(10_000).parse().unwrap());
                let id = trace_id_of(&request_span("GET", "/x", &headers)).unwrap();
                assert_eq!(id.len(), 32);
                assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
                assert_ne!(id, zeros);
                assert_ne!(
                    id,
                    TRACE,
                    "{}",
                    String::from_utf8_lossy(&bad[..bad.len().min(40)])
                );
            }
        });
    }

    #[test]
    fn nothing_is_injected_outside_a_request() {
        let mut out = HeaderMap::new();
        inject(&mut out);
        assert!(out.is_empty());
    }

    /// Failed exports are told at once, then at most once a minute with the count since;
    /// a success ends the run of failures (told once), and the next failure is told at once.
    #[test]
    fn failed_exports_are_told_at_most_once_a_minute() {
        let mut h = ExportHealth::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(h.succeeded(), None, "nothing to tell without failures");
        assert_eq!(
            h.failed(at(0)),
            Some(1),
            "the first failure is told at once"
        );
        for s in [5, 10, 30, 59] {
            assert_eq!(h.failed(at(s)), None, "at {s} s");
        }
        assert_eq!(
            h.failed(at(60)),
            Some(5),
            "a minute on, with the count since"
        );
        assert_eq!(h.failed(at(70)), None);
        assert_eq!(h.succeeded(), Some(7), "the end of the failures is told");
        assert_eq!(h.succeeded(), None);
        assert_eq!(
            h.failed(at(75)),
            Some(1),
            "a new run of failures is told at once"
        );
    }

    #[test]
    fn an_error_is_shown_with_its_causes() {
        let inner = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let outer = std::io::Error::other(inner);
        // `other` displays as its source: said once.
        assert_eq!(error_chain(&outer), "refused");
        #[derive(Debug)]
        struct Wrap(std::io::Error);
        impl std::fmt::Display for Wrap {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("client error (Connect)")
            }
        }
        impl std::error::Error for Wrap {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Wrap(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused",
        ));
        assert_eq!(
            error_chain(&e),
            "client error (Connect): Connection refused"
        );
    }

    #[test]
    fn the_traces_path_is_added_to_the_collector_url() {
        assert_eq!(
            traces_url("http://c:4318"),
            "http://c:4318/v1/traces".to_string()
        );
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
    }
}
