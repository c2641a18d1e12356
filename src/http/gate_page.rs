//! The waiting room a gated URL answers in place (gateway mode, and the `/wait/{id}/queue`
//! page of nginx's flow): rendered on the server, with no script, and refreshed by the
//! browser itself (`<meta http-equiv="refresh">`) at the poll interval, so the same URL
//! serves the site as soon as the person is admitted. Gateway mode's page of a site that
//! does not answer shares its look.

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

/// The event's words for the page, in its language, already escaped: the title (else the
/// event's name), and the headline and note the script page shows too (empty when unset).
#[derive(Debug, Clone, Default)]
pub struct Words {
    /// `ko` or `en`: the page's language (`<html lang>` and its own texts).
    pub lang: &'static str,
    pub title: String,
    pub headline: String,
    pub note: String,
}

impl Words {
    /// Words with a title only (an unknown event, the store unreachable).
    pub fn titled(lang: &'static str, title: &str) -> Words {
        Words {
            lang,
            title: super::look::escape(title),
            ..Words::default()
        }
    }

    fn ko(&self) -> bool {
        self.lang == "ko"
    }
}

/// Both pages' start, up to their own `<meta>`s.
fn head(lang: &str) -> String {
    let lang = if lang == "ko" { "ko" } else { "en" };
    format!(
        r#"<!doctype html>
<html lang="{lang}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
"#
    )
}

/// Both pages' look: a card in the middle. A long word (a URL in the operator's message, a
/// title without spaces) breaks anywhere rather than widening the page past a phone's
/// screen; Korean breaks between words, as on the script page.
const BOX: &str = "body { font-family: system-ui, sans-serif; margin: 0; min-height: 100vh; display: grid; place-items: center; background: #f6f7f9; color: #1d2330; word-break: keep-all; overflow-wrap: anywhere; }
main { background: #fff; padding: 2rem 2.5rem; border-radius: 12px; box-shadow: 0 2px 12px rgba(0,0,0,.08); max-width: 28rem; min-width: 0; text-align: center; }
@media (max-width: 480px) { main { padding: 1.5rem 1.25rem; margin: 0 .75rem; } }";

/// The headline and note, as the script page shows them, when the event has them.
fn extras(words: &Words) -> String {
    let mut out = String::new();
    if !words.headline.is_empty() {
        out.push_str(&format!(
            "<p class=\"headline\" id=\"waitroom-headline\">{}</p>\n",
            words.headline
        ));
    }
    if !words.note.is_empty() {
        out.push_str(&format!(
            "<p class=\"note\" id=\"waitroom-note\">{}</p>\n",
            words.note
        ));
    }
    out
}

/// The page, with the event's `words`, refreshing after `retry` seconds.
pub fn render(words: &Words, view: &PlaceView, retry: u64) -> String {
    let ko = words.ko();
    let position = view
        .position
        .map_or_else(|| "…".to_string(), |p| p.to_string());
    let wait = match (view.paused, view.eta_range, ko) {
        (true, _, false) => "Admission is paused for a moment.".to_string(),
        (true, _, true) => "입장이 잠시 멈췄습니다.".to_string(),
        (_, Some((lo, hi)), false) => format!(
            "Estimated wait: {} to {}.",
            minutes(lo, ko),
            minutes(hi, ko)
        ),
        (_, Some((lo, hi)), true) => {
            format!("예상 대기 시간: {}~{}.", minutes(lo, ko), minutes(hi, ko))
        }
        // No range: the API says there is no basis for an estimate (`eta_low_sec` and
        // `eta_high_sec` null), and so does the page, as the script page does; `eta_sec`
        // alone is then a guess it must not pass off as one.
        (_, None, false) => "Estimated wait: we don't know yet.".to_string(),
        (_, None, true) => "예상 대기 시간: 아직 알 수 없습니다.".to_string(),
    };
    let (room, lead, place, fine) = if ko {
        (
            "대기실",
            "대기 중입니다. 이 페이지를 열어 두세요. 스스로 새로고침되며, 차례가 되면 입장합니다.",
            "나의 대기 순서",
            format!(
                "지금 대기 인원: {}명. 이 페이지는 {retry}초마다 새로고침됩니다.",
                view.queue_length
            ),
        )
    } else {
        (
            "waiting room",
            "You are in line. Keep this page open: it refreshes by itself and lets you in when it is your turn.",
            "Your place in line",
            format!(
                "In line now: {}. This page refreshes every {retry} s.",
                view.queue_length
            ),
        )
    };
    format!(
        r#"{head}<meta http-equiv="refresh" content="{retry}">
<meta name="robots" content="noindex">
<title>{title}: {room}</title>
<style>
{BOX}
.pos {{ font-size: clamp(2rem, 12vw, 3rem); font-weight: 700; margin: .5rem 0; white-space: nowrap; }}
.fine {{ color: #5b6475; font-size: .9rem; }}
.headline {{ font-weight: 600; }}
.note {{ white-space: pre-line; }}
</style>
</head>
<body>
<main>
<h1>{title}</h1>
{extras}<p>{lead}</p>
<p>{place}</p>
<p class="pos" id="waitroom-position">{position}</p>
<p id="waitroom-wait">{wait}</p>
<p class="fine">{fine}</p>
</main>
</body>
</html>
"#,
        head = head(words.lang),
        title = words.title,
        extras = extras(words),
        BOX = BOX,
    )
}

/// The page of a refusal at a gated URL (the sale ended, the event is closed, a limit):
/// `heading` and `text` already escaped. No refresh: reloading changes nothing soon.
pub fn render_refused(words: &Words, heading: &str, text: &str) -> String {
    format!(
        r#"{head}<meta name="robots" content="noindex">
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
        head = head(words.lang),
        title = words.title,
        BOX = BOX,
    )
}

/// The page of a site that does not answer (gateway mode's `502`, for a browser), in
/// `lang`, reloading the same URL after `retry` seconds. Nothing of an event's: the request
/// may be to any page of the site.
pub fn render_unanswered(lang: &str, retry: u64) -> String {
    let (heading, text) = if lang == "ko" {
        (
            "사이트가 응답하지 않습니다",
            format!(
                "지금 이 사이트가 응답하지 않습니다. 방문자가 많아서일 수 있습니다. 이 페이지는 {retry}초 후에 스스로 다시 시도합니다. 페이지를 열어 두세요."
            ),
        )
    } else {
        (
            "The site is not answering",
            format!(
                "The site is not answering right now, perhaps because many people are visiting at once. This page tries again by itself in {retry} s: keep it open."
            ),
        )
    };
    site_page(lang, Some(retry), "waitroom-unanswered", heading, &text)
}

/// The page of a request whose body stopped arriving on its way to the site (gateway
/// mode's `400`, for a browser), in `lang`. No refresh: a reload would not send the body
/// again (a form's `POST` would come back as a `GET`); the person sends it again.
pub fn render_upload_failed(lang: &str) -> String {
    let (heading, text) = if lang == "ko" {
        (
            "요청이 끝까지 도착하지 않았습니다",
            "보내신 내용이 사이트에 다 도착하기 전에 전송이 멈췄습니다. 이전 페이지로 돌아가 다시 보내 주세요.",
        )
    } else {
        (
            "Your request did not arrive whole",
            "What you sent stopped arriving before the site had all of it. Go back and send it again.",
        )
    };
    site_page(lang, None, "waitroom-upload-failed", heading, text)
}

/// A page of the gateway's own about a request to the site (any page of it: nothing of an
/// event's), in `lang`, reloading itself after `refresh` seconds if given. `heading` and
/// `text` are the page's own words, not escaped.
fn site_page(lang: &str, refresh: Option<u64>, id: &str, heading: &str, text: &str) -> String {
    let refresh = refresh
        .map(|s| format!("<meta http-equiv=\"refresh\" content=\"{s}\">\n"))
        .unwrap_or_default();
    format!(
        r#"{head}{refresh}<meta name="robots" content="noindex">
<title>{heading}</title>
<style>
{BOX}
</style>
</head>
<body>
<main>
<h1 id="{id}">{heading}</h1>
<p>{text}</p>
</main>
</body>
</html>
"#,
        head = head(lang),
        BOX = BOX,
    )
}

fn minutes(sec: u64, ko: bool) -> String {
    match (sec < 90, ko) {
        (true, false) => "about a minute".to_string(),
        (true, true) => "약 1분".to_string(),
        (false, false) => format!("{} minutes", sec.div_ceil(60)),
        (false, true) => format!("{}분", sec.div_ceil(60)),
    }
}
