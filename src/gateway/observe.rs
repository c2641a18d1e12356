//! What the gateway tells about the requests it proxies. They do not pass through the API's
//! edge layer (their paths are the site's, not routes of ours), so the gateway keeps its own:
//!
//! - **metrics**: `waitroom_gateway_requests_total` and
//!   `waitroom_gateway_request_duration_seconds` (until the answer's head), labelled
//!   `outcome` ([`Outcome`]: a fixed set, so the series are few). Every handle is resolved
//!   once, when the gateway is built: a request costs a clock read, one counter and one
//!   histogram update.
//! - **tracing** (only when tracing export is on): the request runs in a span that continues
//!   the client's `traceparent`, and the request to the origin carries a `traceparent` whose
//!   parent is that span (see [`crate::telemetry::otel`]). Off, nothing is read or made per
//!   request and a client's `traceparent` reaches the origin as it came.

use std::time::Instant;

use metrics::{Counter, Histogram};

/// What became of a request bound for the origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A path no event gates, proxied.
    Pass,
    /// A gated path the event's bypass rules let through, proxied.
    Bypass,
    /// A gated path with an admitted session (or admitted at once), proxied.
    Admitted,
    /// Answered the waiting room (the page or the queue JSON).
    Waiting,
    /// The origin did not answer (`502`).
    Unavailable,
    /// Refused before the origin was asked (a malformed request, a store error), or the
    /// client's upload stopped or broke off.
    Refused,
}

impl Outcome {
    const ALL: [Outcome; 6] = [
        Outcome::Pass,
        Outcome::Bypass,
        Outcome::Admitted,
        Outcome::Waiting,
        Outcome::Unavailable,
        Outcome::Refused,
    ];

    fn label(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Bypass => "bypass",
            Outcome::Admitted => "admitted",
            Outcome::Waiting => "waiting",
            Outcome::Unavailable => "unavailable",
            Outcome::Refused => "refused",
        }
    }
}

/// The metric handles of every outcome, in the order of [`Outcome::ALL`].
pub struct Metrics {
    series: Vec<(Counter, Histogram)>,
}

/// The span name's route part for proxied requests: their paths are the site's, so the
/// span names none (a raw path would make every URL a span name of its own).
pub const SPAN_ROUTE: &str = "gateway";

impl Metrics {
    pub fn new() -> Self {
        let series = Outcome::ALL
            .iter()
            .map(|o| {
                let labels = [("outcome", o.label())];
                (
                    metrics::counter!("waitroom_gateway_requests_total", &labels),
                    metrics::histogram!("waitroom_gateway_request_duration_seconds", &labels),
                )
            })
            .collect();
        Metrics { series }
    }

    pub fn record(&self, outcome: Outcome, start: Instant) {
        // `ALL` lists the outcomes in declaration order: the discriminant is the index.
        if let Some((count, latency)) = self.series.get(outcome as usize) {
            latency.record(start.elapsed().as_secs_f64());
            count.increment(1);
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
