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
    /// The `lang` attribute of the title, headline and note (` lang="ko"`), for a text that
    /// stands in from the other language; empty otherwise.
    pub title_lang: &'static str,
    pub headline_lang: &'static str,
    pub note_lang: &'static str,
}

/// The ` lang="…"` attribute of a text in `text_lang` on a page in `page_lang`: empty when
/// they agree.
pub fn lang_attr(page_lang: &str, text_lang: &'static str) -> &'static str {
    match text_lang {
        l if l == page_lang => "",
        "ko" => " lang=\"ko\"",
        _ => " lang=\"en\"",
    }
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
            "<p class=\"headline\" id=\"waitroom-headline\" dir=\"auto\"{}>{}</p>\n",
            words.headline_lang, words.headline
        ));
    }
    if !words.note.is_empty() {
        out.push_str(&format!(
            "<p class=\"note\" id=\"waitroom-note\" dir=\"auto\"{}>{}</p>\n",
            words.note_lang, words.note
        ));
    }
    out
}

/// The page, with the event's `words`, refreshing after `retry` seconds.
pub fn render(words: &Words, view: &PlaceView, retry: u64) -> String {
    let ko = words.ko();
    let position = view.position.map_or_else(|| "…".to_string(), grouped);
    let wait = match (view.opens_in_sec, view.paused, view.eta_range, ko) {
        // The pre-queue: when the line opens, as the script page's countdown says.
        (Some(sec), _, _, false) => format!("The line opens in {}.", span(sec, ko)),
        (Some(sec), _, _, true) => format!("{} 후에 대기열이 열립니다.", span(sec, ko)),
        (_, true, _, false) => "Admission is paused for a moment.".to_string(),
        (_, true, _, true) => "입장이 잠시 멈췄습니다.".to_string(),
        (_, _, Some((lo, hi)), false) => format!("Estimated wait: {}.", range(lo, hi, ko)),
        (_, _, Some((lo, hi)), true) => format!("예상 대기 시간: {}.", range(lo, hi, ko)),
        // No range: the API says there is no basis for an estimate (`eta_low_sec` and
        // `eta_high_sec` null), and so does the page, as the script page does; `eta_sec`
        // alone is then a guess it must not pass off as one.
        (_, _, None, false) => "Estimated wait: we don't know yet.".to_string(),
        (_, _, None, true) => "예상 대기 시간: 아직 알 수 없습니다.".to_string(),
    };
    let pre = view.opens_in_sec.is_some();
    let in_line = grouped(view.queue_length);
    let (room, lead, place, fine) = if ko {
        (
            "대기실",
            if pre {
                "곧 예매가 시작됩니다. 사전 대기열에 들어와 있으며, 오픈 시각이 되면 이곳의 모든 분에게 무작위 순서가 정해집니다. 이 페이지를 열어 두세요. 스스로 새로고침됩니다."
            } else {
                "대기 중입니다. 이 페이지를 열어 두세요. 스스로 새로고침되며, 차례가 되면 입장합니다."
            },
            "나의 대기 순서",
            format!("지금 대기 인원: {in_line}명. 이 페이지는 {retry}초마다 새로고침됩니다."),
        )
    } else {
        (
            "waiting room",
            if pre {
                "The sale opens soon. You are in the pre-queue: at the opening everyone here gets a place in a random order. Keep this page open: it refreshes by itself."
            } else {
                "You are in line. Keep this page open: it refreshes by itself and lets you in when it is your turn."
            },
            "Your place in line",
            format!("In line now: {in_line}. This page refreshes every {retry} s."),
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
<h1 dir="auto"{title_lang}>{title}</h1>
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
        title_lang = words.title_lang,
        extras = extras(words),
        BOX = BOX,
    )
}

/// The page of a refusal at a gated URL (the sale ended, the event is closed, a limit):
/// `heading` and `text` already escaped. A refusal that passes (a rate limit, a full line,
/// the store unreachable: `retry`, its `Retry-After`) reloads itself after it, as the
/// waiting page does: a person told to keep the tab open must not lose the place by
/// leaving a refused reload on screen. The end of a sale does not: reloading changes
/// nothing.
/// `attrs`: the message paragraph's own attributes (its `dir` and `lang`), or empty.
pub fn render_refused(
    words: &Words,
    heading: &str,
    text: &str,
    attrs: &str,
    retry: Option<u64>,
) -> String {
    let (refresh, again) = match retry {
        Some(sec) => {
            let sec = sec.max(1);
            let again = if words.ko() {
                format!("이 페이지는 {sec}초 후 저절로 다시 시도합니다.")
            } else if sec == 1 {
                "This page tries again by itself in a second.".to_string()
            } else {
                format!("This page tries again by itself in {sec} seconds.")
            };
            (
                format!("<meta http-equiv=\"refresh\" content=\"{sec}\">\n"),
                format!("<p class=\"fine\" id=\"waitroom-again\">{again}</p>\n"),
            )
        }
        None => (String::new(), String::new()),
    };
    format!(
        r#"{head}<meta name="robots" content="noindex">
{refresh}<title>{title}: {heading}</title>
<style>
{BOX}
main {{ white-space: pre-line; }}
.fine {{ color: #5b6475; font-size: .9rem; }}
</style>
</head>
<body>
<main>
<h1 dir="auto"{title_lang}>{title}</h1>
<h2 id="waitroom-refused">{heading}</h2>
<p id="waitroom-message"{attrs}>{text}</p>
{again}</main>
</body>
</html>
"#,
        head = head(words.lang),
        title = words.title,
        title_lang = words.title_lang,
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

/// `n` with its thousands grouped, as the script page shows figures ("1,198"; so in Korean).
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A time to wait, rounded up to minutes, in hours and minutes past an hour.
fn span(sec: u64, ko: bool) -> String {
    let m = sec.div_ceil(60).max(1);
    match (m < 60, ko) {
        (true, false) => format!("{m} min"),
        (true, true) => format!("{m}분"),
        (false, false) => format!("{} h {} min", m / 60, m % 60),
        (false, true) => format!("{}시간 {}분", m / 60, m % 60),
    }
}

/// The estimate's range as the script page says it (`etaText` in `wait.js`): one figure when
/// both ends round alike, hours past two hours ("270 minutes to 330 minutes" said little).
fn range(lo: u64, hi: u64, ko: bool) -> String {
    let (a, b) = (lo.div_ceil(60), hi.div_ceil(60));
    let (a, b, hours) = if b > 120 {
        ((a / 60).max(1), b.div_ceil(60), true)
    } else {
        (a, b, false)
    };
    match (b <= 1, a == b, hours, ko) {
        (true, _, _, false) => "about a minute".to_string(),
        (true, _, _, true) => "약 1분".to_string(),
        // It may come within the minute (`durUpTo`).
        (_, false, false, false) if lo < 60 => format!("up to {b} minutes"),
        (_, false, false, true) if lo < 60 => format!("최대 {b}분"),
        (_, true, false, false) => format!("about {b} minutes"),
        (_, true, false, true) => format!("약 {b}분"),
        (_, true, true, false) => format!("about {b} hours"),
        (_, true, true, true) => format!("약 {b}시간"),
        (_, false, false, false) => format!("{a} to {b} minutes"),
        (_, false, false, true) => format!("약 {a}~{b}분"),
        (_, false, true, false) => format!("about {a} to {b} hours"),
        (_, false, true, true) => format!("약 {a}~{b}시간"),
    }
}

/// The event's words for the gate page in `lang`: its `title` text (else its name), its
/// headline and note, escaped.
pub fn words(c: &crate::core::EventConfig, lang: &'static str) -> Words {
    let text = |t: &Option<crate::core::Texts>| match t.as_ref().and_then(|t| t.pick_lang(lang)) {
        Some((t, l)) => (super::look::escape(t), lang_attr(lang, l)),
        None => (String::new(), ""),
    };
    // The event's name has no language of its own: it stands unmarked.
    let (title, title_lang) = match c.look.title.as_ref().and_then(|t| t.pick_lang(lang)) {
        Some((t, l)) => (super::look::escape(t), lang_attr(lang, l)),
        None => (super::look::escape(&c.name), ""),
    };
    let (headline, headline_lang) = text(&c.look.headline);
    let (note, note_lang) = text(&c.look.note);
    Words {
        lang,
        title,
        headline,
        note,
        title_lang,
        headline_lang,
        note_lang,
    }
}

/// The event's words for the gate page in `lang` ([`words`]); its id as the title when
/// its settings cannot be read.
pub async fn words_of(state: &crate::app::AppState, event_id: &str, lang: &'static str) -> Words {
    match state.events.config(event_id, state.clock.now()).await {
        Ok(c) => words(&c, lang),
        Err(_) => Words::titled(lang, event_id),
    }
}

/// The heading of a refusal that is not the end of a sale, in English.
const NOT_NOW: &str = "The waiting room cannot let you in right now";

/// A refusal at a gated URL as the API's JSON error, with the page's headers
/// (`no-store`): an answer about one place (or one visit).
pub fn refusal_json(e: super::AppError) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let mut res = e.into_response();
    res.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    res
}

/// A gated URL's refusal: the API's JSON error for a client that asks for JSON; for a
/// browser, a page that says it (with the operator's message once the sale ended), under
/// the same status and headers (`Retry-After`, …), never cached.
pub async fn refusal(
    state: &crate::app::AppState,
    event_id: &str,
    e: super::AppError,
    json: bool,
    lang: &'static str,
    reload: bool,
) -> axum::response::Response {
    use super::look::escape;
    use super::AppError;
    use axum::response::IntoResponse as _;
    if json {
        return refusal_json(e);
    }
    let reason = match &e {
        AppError::SaleEnded(_, r) => Some(*r),
        _ => None,
    };
    // The store unreachable: its settings would wait out the timeout a second time.
    let reachable = !matches!(e, AppError::Unavailable(_));
    let message = e.to_string();
    let (parts, _) = e.into_response().into_parts();
    let now = state.clock.now();
    let config = match reachable {
        true => state.events.config(event_id, now).await.ok(),
        false => None,
    };
    let words = config
        .as_deref()
        .map_or_else(|| Words::titled(lang, event_id), |c| words(c, lang));
    let ko = lang == "ko";
    // `attrs`: the message's. The operator's words marked as the title is (`dir`, and `lang`
    // when they stand in from the other language); the API's message is English.
    let (heading, text, attrs) = match reason {
        Some(r) => {
            let said = config
                .as_ref()
                .and_then(|c| c.sale_ended(now))
                .and_then(|end| end.message)
                .and_then(|m| m.pick_lang(lang).map(|(t, l)| (t.to_string(), l)));
            // As the script page says them (wait.js `soldOut`, …).
            let (heading, default) = match (r, ko) {
                ("sold_out", false) => ("Sold out", "Everything has been sold."),
                ("sold_out", true) => ("매진되었습니다", "모두 판매되었습니다."),
                ("cancelled", false) => ("Sale cancelled", "This sale has been called off."),
                ("cancelled", true) => {
                    ("판매가 취소되었습니다", "주최 측이 이 판매를 취소했습니다.")
                }
                (_, false) => ("This sale has ended", "The sale is over."),
                (_, true) => ("판매가 종료되었습니다", "이 판매는 끝났습니다."),
            };
            match said {
                Some((text, l)) => {
                    let attrs = format!(" dir=\"auto\"{}", lang_attr(lang, l));
                    (heading, text, attrs)
                }
                None => (heading, default.to_string(), String::new()),
            }
        }
        // The API's message stays as it is (English): it names what went wrong.
        None => {
            let attrs = if ko { " lang=\"en\"" } else { "" }.to_string();
            let heading = if ko {
                "지금은 대기실에 들어갈 수 없습니다"
            } else {
                NOT_NOW
            };
            (heading, message, attrs)
        }
    };
    // The end of a sale never passes: no reload.
    let reload = reload && reason.is_none();
    refusal_page(parts, &words, heading, &escape(&text), &attrs, reload)
}

/// A refusal before any event is chosen (gateway mode: a `Host` that is no host, a path
/// whose readings choose different events, the rules not read yet): to a browser, a page
/// as [`refusal`]'s, without an event's words; to any other client the API's JSON.
pub fn refusal_of_no_event(
    e: super::AppError,
    json: bool,
    lang: &'static str,
    reload: bool,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    if json {
        return refusal_json(e);
    }
    let ko = lang == "ko";
    let (title, heading, attrs) = match ko {
        true => (
            "대기실",
            "지금은 대기실에 들어갈 수 없습니다",
            " lang=\"en\"",
        ),
        false => ("Waiting room", NOT_NOW, ""),
    };
    let message = super::look::escape(&e.to_string());
    let (parts, _) = e.into_response().into_parts();
    let words = Words::titled(lang, title);
    refusal_page(parts, &words, heading, &message, attrs, reload)
}

/// A refusal's page under the error's status and headers, never cached. One that passes
/// says when to try again (its `Retry-After`); only a request its reload repeats (`reload`:
/// a `GET`) reloads itself: a form's `POST` would come back as a `GET`, its data lost.
fn refusal_page(
    parts: axum::http::response::Parts,
    words: &Words,
    heading: &str,
    text: &str,
    attrs: &str,
    reload: bool,
) -> axum::response::Response {
    use axum::http::{header, HeaderValue};
    use axum::response::Response;
    let retry = parts
        .headers
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .filter(|_| reload);
    let page = render_refused(words, heading, text, attrs, retry);
    let mut res = Response::from_parts(parts, axum::body::Body::from(page));
    let h = res.headers_mut();
    h.remove(header::CONTENT_LENGTH);
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    page_headers(h);
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_and_durations_read_as_on_the_script_page() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1198), "1,198");
        assert_eq!(grouped(12_345_678), "12,345,678");
        // Defects: "about a minute to about a minute", "270 minutes to 330 minutes".
        assert_eq!(range(10, 50, false), "about a minute");
        assert_eq!(range(10, 50, true), "약 1분");
        assert_eq!(range(240, 300, false), "4 to 5 minutes");
        assert_eq!(range(290, 300, true), "약 5분");
        assert_eq!(range(270 * 60, 330 * 60, false), "about 4 to 6 hours");
        assert_eq!(range(270 * 60, 330 * 60, true), "약 4~6시간");
        assert_eq!(range(0, 30, false), "about a minute");
        // A low end within the minute, as the script says it (a review's find: "0 to 5").
        assert_eq!(range(0, 300, false), "up to 5 minutes");
        assert_eq!(range(30, 300, true), "최대 5분");
        assert_eq!(range(240, 400, true), "약 4~7분");
        assert_eq!(span(30, false), "1 min");
        assert_eq!(span(6928, false), "1 h 56 min");
        assert_eq!(span(6928, true), "1시간 56분");
    }
}
