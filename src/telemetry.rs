//! Metrics and logs. Counters are bumped where state changes (from the effects a store
//! operation reports), per-event gauges are refreshed from the store when `/metrics` is
//! scraped and zeroed when the store says an event was deleted (on every node, see
//! [`crate::background`]), and HTTP latency is recorded by a middleware.
//!
//! It knows only the core's types, so the stores (which count their effects here) can use
//! it without a circle.

use metrics::counter;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::core::{Effect, EndReason, EventFigures};

pub mod budget;
pub mod otel;

/// Installs the Prometheus recorder once per process and answers its handle. Later calls
/// (several servers in one test process) share the first recorder.
pub fn prometheus() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets = [
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ];
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("waitroom_http_request_duration_seconds".into()),
                    &buckets,
                )
                .expect("bucket list is not empty")
                .set_buckets_for_metric(
                    Matcher::Full("waitroom_gateway_request_duration_seconds".into()),
                    &buckets,
                )
                .expect("bucket list is not empty")
                .build_recorder();
            let handle = recorder.handle();
            // Histogram samples pile up until drained; without a scrape they would grow
            // without bound, so drain them on a timer of our own.
            let upkeep = handle.clone();
            let _ = std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || loop {
                    std::thread::sleep(std::time::Duration::from_secs(5));
                    upkeep.run_upkeep();
                });
            // Another recorder may already be installed (e.g. by an embedding program); then
            // our metrics go there and the handle renders only what reaches ours.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Counts what a store operation changed.
pub fn record_effects(event_id: &str, fx: &[Effect]) {
    for kind in fx.iter().filter_map(effect_kind) {
        match EFFECT_KINDS[kind] {
            (name, Some(r)) => {
                counter!(name, "event" => event_id.to_string(), "reason" => r).increment(1)
            }
            (name, None) => counter!(name, "event" => event_id.to_string()).increment(1),
        }
    }
}

/// Which of [`EFFECT_KINDS`] an effect counts in, if any.
fn effect_kind(e: &Effect) -> Option<usize> {
    Some(match e {
        Effect::Joined { .. } => 0,
        Effect::Admitted { .. } => 1,
        Effect::Entered { .. } => 2,
        Effect::Ended { reason, .. } => match reason {
            EndReason::Expired => 3,
            EndReason::Left => 4,
            EndReason::Cleared => 5,
            EndReason::Closed => 6,
            EndReason::Completed => 7,
        },
        Effect::Forgotten { .. }
        | Effect::Invited { .. }
        | Effect::InviteBound { .. }
        | Effect::Item { .. }
        | Effect::Extended { .. } => return None,
    })
}

/// The counters [`record_effects`] bumps, resolved once per event and kind: the embedded
/// store keeps one of these beside each event and counts under the event's lock, where a
/// label `String` and a registry look-up per effect cost more than the queue rules (the
/// profile of issue 10). Names and labels are those of [`record_effects`]. Resolved on
/// first use, so a recorder installed after the event was loaded still gets the counts.
pub struct EffectCounters {
    event_id: std::sync::Arc<str>,
    handles: [Option<metrics::Counter>; EFFECT_KINDS.len()],
}

/// Every (counter, reason) pair [`record_effects`] can bump.
const EFFECT_KINDS: [(&str, Option<&str>); 8] = [
    ("waitroom_joins_total", None),
    ("waitroom_admissions_total", None),
    ("waitroom_entries_total", None),
    ("waitroom_expirations_total", None),
    ("waitroom_leaves_total", None),
    ("waitroom_leaves_total", Some("cleared")),
    ("waitroom_leaves_total", Some("closed")),
    ("waitroom_completions_total", None),
];

impl EffectCounters {
    pub fn new(event_id: std::sync::Arc<str>) -> Self {
        EffectCounters {
            event_id,
            handles: Default::default(),
        }
    }

    /// [`record_effects`] for this event.
    pub fn record(&mut self, fx: &[Effect]) {
        for kind in fx.iter().filter_map(effect_kind) {
            let id = &self.event_id;
            self.handles[kind]
                .get_or_insert_with(|| match EFFECT_KINDS[kind] {
                    (name, Some(r)) => counter!(name, "event" => id.to_string(), "reason" => r),
                    (name, None) => counter!(name, "event" => id.to_string()),
                })
                .increment(1);
        }
    }
}

/// The events a node's scrapes set gauges for.
#[derive(Default)]
pub struct Gauged(std::sync::Mutex<std::collections::HashSet<String>>);

impl Gauged {
    /// Sets the per-event gauges from fresh figures of every event that exists, given as
    /// (event id, figures), and zeroes those of an event gauged before that no longer
    /// exists. A deletion notice zeroes them at once ([`forget_event`]); this catches one
    /// the node missed (on Redis, notices sent while its relay was reconnecting are lost),
    /// and a scrape that read the event just before its deletion and set it after.
    ///
    /// An event gauged for the first time also gets every counter of [`record_effects`] at
    /// zero: a counter that appears only at its first increment reads "no data" in
    /// `rate()` and in alerts until then, instead of 0.
    pub fn record<'a>(&self, events: impl IntoIterator<Item = (&'a str, &'a EventFigures)>) {
        let mut before = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut now = std::collections::HashSet::new();
        for (id, f) in events {
            let id = id.to_string();
            metrics::gauge!("waitroom_waiting", "event" => id.clone()).set(f.waiting as f64);
            metrics::gauge!("waitroom_admitted", "event" => id.clone()).set(f.admitted as f64);
            metrics::gauge!("waitroom_active", "event" => id.clone()).set(f.active as f64);
            metrics::gauge!("waitroom_capacity", "event" => id.clone()).set(f.capacity as f64);
            if !before.contains(&id) {
                for (name, reason) in EFFECT_KINDS {
                    match reason {
                        Some(r) => counter!(name, "event" => id.clone(), "reason" => r),
                        None => counter!(name, "event" => id.clone()),
                    }
                    .increment(0);
                }
            }
            now.insert(id);
        }
        for gone in before.difference(&now) {
            forget_event(gone);
        }
        *before = now;
    }
}

/// Writes `line` and a newline to stdout, or drops it if stdout cannot take it. `println!`
/// panics then: Rust ignores SIGPIPE, so on a pipe whose reader went away (a log shipper
/// that restarts, `| grep -m1`) the write fails with EPIPE, and a server must go on serving
/// and exit as documented whatever became of its output streams.
pub fn stdout_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// [`stdout_line`] for stderr, in place of `eprintln!`.
pub fn stderr_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Sets up `tracing` output: human-readable by default, JSON lines with `json`.
pub fn init_logging(format: &str) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::EnvFilter;
    // An empty `RUST_LOG` (what an env file or a compose file writes for "unset") is the
    // default: read as a filter it turned every line off, the error that stops the server
    // included.
    let mut filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    if otel::enabled() {
        // Request spans are what tracing export sends: a quieter log level keeps them.
        filter = filter.add_directive(
            format!("{}=info", otel::REQUEST_TARGET)
                .parse()
                .expect("a valid directive"),
        );
    }
    // Colour codes only for a person at a terminal: in a file or a log collector they are
    // noise around every field.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        // A line stderr cannot take is dropped. By default the failure is reported with
        // `eprintln!`, which panics on the same stderr: a pipe whose reader went away (a
        // log shipper that restarts) then broke every request that logs, and the shutdown.
        .log_internal_errors(false);
    // With export on, the OpenTelemetry layer turns request spans into exported spans (and
    // the log lines within them into their events).
    let _ = if format == "json" {
        builder
            .json()
            .flatten_event(true)
            .finish()
            .with(otel::layer())
            .try_init()
    } else {
        builder.finish().with(otel::layer()).try_init()
    };
}

/// Sets the gauge of the bytes the store spends on one event (Redis only; see
/// [`crate::background::sample_store_memory`]).
pub fn record_store_memory(event_id: &str, bytes: u64) {
    STORE_MEMORY_REPORTED.store(true, std::sync::atomic::Ordering::Relaxed);
    metrics::gauge!(STORE_MEMORY, "event" => event_id.to_string()).set(bytes as f64);
}

/// Whether this process reports [`STORE_MEMORY`] at all (a Redis store): only then does a
/// deleted event's series need zeroing; otherwise zeroing would create it.
static STORE_MEMORY_REPORTED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// The gauge of [`record_store_memory`].
pub const STORE_MEMORY: &str = "waitroom_store_memory_bytes";

/// Zeroes the gauges of a deleted event, so a scrape does not keep reporting its last
/// figures. A scrape only refreshes the events that exist, so nothing else would: every
/// node calls this when it hears the store's deletion notice.
pub fn forget_event(event_id: &str) {
    let memory = STORE_MEMORY_REPORTED.load(std::sync::atomic::Ordering::Relaxed);
    for name in [
        "waitroom_waiting",
        "waitroom_admitted",
        "waitroom_active",
        "waitroom_capacity",
    ]
    .into_iter()
    .chain(memory.then_some(STORE_MEMORY))
    {
        metrics::gauge!(name, "event" => event_id.to_string()).set(0.0);
    }
}
