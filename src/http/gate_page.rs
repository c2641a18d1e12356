//! The waiting room a gated URL answers in place (gateway mode, and the `/wait/{id}/queue`
//! page of nginx's flow): rendered on the server, with no script, and refreshed by the
//! browser itself (`<meta http-equiv="refresh">`) at the poll interval, so the same URL
//! serves the site as soon as the person is admitted.

use crate::core::PlaceView;

/// The page's Content-Security-Policy: its one inline style, nothing else.
pub const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The headers every gate page carries, as the script pages do: its policy, no sniffing,
/// and no referrer (the page's URL names where the person was going).
pub fn page_headers(h: &mut axum::http::HeaderMap) {
    use axum::http::{header, HeaderValue};
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

/// Both pages' start, up to their own `<meta>`s.
const HEAD: &str = r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
"#;

/// Both pages' look: a card in the middle.
const BOX: &str = "body { font-family: system-ui, sans-serif; margin: 0; min-height: 100vh; display: grid; place-items: center; background: #f6f7f9; color: #1d2330; }
main { background: #fff; padding: 2rem 2.5rem; border-radius: 12px; box-shadow: 0 2px 12px rgba(0,0,0,.08); max-width: 28rem; text-align: center; }";

/// The page, for `title` (already escaped), refreshing after `retry` seconds.
pub fn render(title: &str, view: &PlaceView, retry: u64) -> String {
    let position = view
        .position
        .map_or_else(|| "…".to_string(), |p| p.to_string());
    let wait = match (view.paused, view.eta_range, view.eta_sec) {
        (true, _, _) => "Admission is paused for a moment.".to_string(),
        (_, Some((lo, hi)), _) => format!("Estimated wait: {} to {}.", minutes(lo), minutes(hi)),
        (_, None, Some(s)) => format!("Estimated wait: {}.", minutes(s)),
        _ => "Estimating your wait…".to_string(),
    };
    format!(
        r#"{HEAD}<meta http-equiv="refresh" content="{retry}">
<meta name="robots" content="noindex">
<title>{title}: waiting room</title>
<style>
{BOX}
.pos {{ font-size: 3rem; font-weight: 700; margin: .5rem 0; }}
.fine {{ color: #5b6475; font-size: .9rem; }}
</style>
</head>
<body>
<main>
<h1>{title}</h1>
<p>You are in line. Keep this page open: it refreshes by itself and lets you in when it is your turn.</p>
<p>Your place in line</p>
<p class="pos" id="waitroom-position">{position}</p>
<p id="waitroom-wait">{wait}</p>
<p class="fine">In line now: {queue}. This page refreshes every {retry} s.</p>
</main>
</body>
</html>
"#,
        queue = view.queue_length,
        HEAD = HEAD,
        BOX = BOX,
    )
}

/// The page of a refusal at a gated URL (the sale ended, the event is closed, a limit):
/// `title`, `heading` and `text` already escaped. No refresh: reloading changes nothing
/// soon.
pub fn render_refused(title: &str, heading: &str, text: &str) -> String {
    format!(
        r#"{HEAD}<meta name="robots" content="noindex">
<title>{title}: {heading}</title>
<style>
{BOX}
main {{ white-space: pre-line; }}
</style>
</head>
<body>
<main>
<h1>{title}</h1>
<h2 id="waitroom-refused">{heading}</h2>
<p id="waitroom-message">{text}</p>
</main>
</body>
</html>
"#,
        HEAD = HEAD,
        BOX = BOX,
    )
}

fn minutes(sec: u64) -> String {
    if sec < 90 {
        "about a minute".to_string()
    } else {
        format!("{} minutes", sec.div_ceil(60))
    }
}
