//! The waiting page of one event, rendered with its look and words (`core::look`), and what
//! that page links to: the event's colours (`/wait/{event_id}/theme.css`) and the files of
//! the data dir's `branding/` folder (`/branding/{file}`: logos, stylesheets).
//!
//! The page is the embedded `wait.html` with the event's title in `<title>` and in its
//! heading, its headline, notes and logo filled in on the server, so they show before any
//! script runs (and without one). Every text is HTML-escaped here; the page's script sets
//! them again with `textContent` when the language changes. The Content-Security-Policy
//! stays the pages' own (same origin, no inline script or style); the one addition is the
//! origin of an `https` logo in `img-src`, for that event's page only. Colours come as a
//! stylesheet from this server rather than inline, which that policy would refuse.
//!
//! An unknown event answers a `404` page with a way back to the start for a browser
//! (`Accept: text/html`), and the usual JSON `EVENT_NOT_FOUND` for any other client.

use std::path::Path;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::error::{AppError, AppResult};
use super::extract::AppPath;
use super::pages::CSP;
use crate::app::AppState;
use crate::core::look::{branding_file_ok, logo_origin, luminance, IMAGE_EXTENSIONS};
use crate::core::{validate_event_id, EventConfig, Texts};

const WAIT_HTML: &str = include_str!("assets/wait.html");
const MISSING_HTML: &str = include_str!("assets/missing.html");

/// Largest file served from `branding/`: logos and stylesheets, not downloads.
pub const MAX_BRANDING_FILE_BYTES: u64 = 2 * 1024 * 1024;

/// Escapes text for HTML element content and quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page's language: `?lang=ko|en`, else the one of ours the browser prefers
/// (`Accept-Language`, every line of it as one list, weighed by `q`; what the page's script
/// picks too when nothing is remembered).
pub(crate) fn language(uri: &Uri, headers: &HeaderMap) -> &'static str {
    let asked = uri
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| match kv {
            "lang=ko" => Some("ko"),
            "lang=en" => Some("en"),
            _ => None,
        });
    asked.unwrap_or_else(|| {
        preferred(
            headers
                .get_all(header::ACCEPT_LANGUAGE)
                .iter()
                .filter_map(|v| v.to_str().ok()),
        )
    })
}

/// Of our two languages, the one the lines of an `Accept-Language` rank highest (RFC 9110
/// 12.5.4; several lines are one list, §5.3): by `q` (1 when absent; 0 means "not this
/// one"), the earlier on a tie; a tag counts by its primary subtag (`ko-KR`), and `*` stands
/// for English. English when nothing of ours is acceptable.
fn preferred<'a>(lines: impl Iterator<Item = &'a str>) -> &'static str {
    let mut best: Option<(&'static str, u16)> = None;
    for item in lines.flat_map(|line| line.split(',')) {
        let mut parts = item.split(';');
        let tag = parts.next().unwrap_or("").trim();
        let primary = tag.split('-').next().unwrap_or("");
        let lang = if primary.eq_ignore_ascii_case("ko") {
            "ko"
        } else if primary.eq_ignore_ascii_case("en") || tag == "*" {
            "en"
        } else {
            continue;
        };
        // q in thousandths: "0.8" → 800; anything unreadable counts as 1.
        let q = parts
            .find_map(|p| p.trim().strip_prefix("q=").or(p.trim().strip_prefix("Q=")))
            .and_then(|q| q.trim().parse::<f32>().ok())
            .map_or(1000, |q| (q.clamp(0.0, 1.0) * 1000.0).round() as u16);
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((lang, q));
        }
    }
    best.map_or("en", |(l, _)| l)
}

fn wants_html(headers: &HeaderMap) -> bool {
    super::gate::asks_html(headers)
}

/// The `404` page of an unknown event, for a browser that followed a link to one.
pub fn missing_page(event_id: &str, uri: &Uri, headers: &HeaderMap) -> Response {
    let body = render_missing(event_id, language(uri, headers));
    html(StatusCode::NOT_FOUND, body, CSP, headers)
}

fn pick<'a>(t: &'a Option<Texts>, lang: &str) -> Option<&'a str> {
    t.as_ref().and_then(|t| t.pick(lang))
}

/// ` lang="…"` when `t` is shown in the other language than the page's `lang` (it has none
/// of the page's own), so a screen reader's voice reads it in its language; else nothing.
pub(crate) fn lang_mark(t: &Option<Texts>, lang: &str) -> &'static str {
    let Some(t) = t else { return "" };
    match (lang == "ko", &t.ko, &t.en) {
        (true, None, Some(_)) => " lang=\"en\"",
        (false, Some(_), None) => " lang=\"ko\"",
        _ => "",
    }
}

/// The built-in page's title per language (as `wait.js` calls it).
fn default_title(lang: &str) -> &'static str {
    if lang == "ko" {
        "대기실"
    } else {
        "Waiting room"
    }
}

/// The waiting page's own words as the server writes them into its HTML, by slot: English,
/// Korean (as `wait.js` says them; the script sets them again on a language switch).
/// Without scripts the page then reads in its language throughout, not half in English.
const PAGE_TEXTS: &[(&str, &str, &str)] = &[
    ("t_brand", "Waiting room", "대기실"),
    ("t_announcement", "Announcement", "공지"),
    ("t_joining", "Joining the line…", "대기열에 들어가는 중…"),
    ("t_yourPosition", "Your place in line", "나의 대기 순서"),
    ("t_progress", "Progress through the line", "대기 진행률"),
    ("t_inLine", "People in line", "대기 인원"),
    ("t_eta", "Estimated wait", "예상 대기 시간"),
    ("t_continue", "Continue to the site", "사이트로 이동"),
    ("t_joinAgain", "Join the line again", "다시 줄 서기"),
    ("t_leave", "Leave the line", "대기열 나가기"),
    // The language button names the other language, in that language (common.js).
    ("other_lang", "ko", "en"),
    ("other_name", "한국어", "English"),
    ("switch_label", "한국어 보기", "Switch to English"),
];

/// Fills `template`'s `{{name}}` slots. Values must already be escaped. One pass over the
/// template: a value is never searched for slots itself, so a text that reads `{{head}}`
/// stays that text instead of pulling the page's markup into its place.
fn fill(template: &str, slots: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() + 1024);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let slot = after
            .find("}}")
            .and_then(|end| Some((slots.iter().find(|(n, _)| *n == &after[..end])?, end)));
        match slot {
            Some(((_, value), end)) => {
                out.push_str(value);
                rest = &after[end + 2..];
            }
            None => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The waiting page of `event_id` with `config`'s look (`None`: the store could not say;
/// the built-in look, and the page's script reports what it finds), and its policy.
pub fn render_wait(event_id: &str, config: Option<&EventConfig>, lang: &str) -> (String, String) {
    let look = config.map(|c| &c.look);
    let name = config.map_or(event_id, |c| c.name.as_str());
    let title = look.and_then(|l| pick(&l.title, lang)).unwrap_or(name);
    let mark = |t: Option<&Option<Texts>>| t.map_or("", |t| lang_mark(t, lang));
    let mut head = String::new();
    let mut csp = CSP.to_string();
    let mut logo = String::new();
    if let Some(l) = look {
        if let Some(color) = &l.theme_color {
            head.push_str(&format!(
                "<meta name=\"theme-color\" content=\"{}\">\n<link rel=\"stylesheet\" href=\"/wait/{}/theme.css\">\n",
                escape(color),
                escape(event_id)
            ));
        }
        if let Some(sheet) = &l.stylesheet {
            head.push_str(&format!(
                "<link rel=\"stylesheet\" href=\"/branding/{}\">\n",
                escape(sheet)
            ));
        }
        if let Some(url) = &l.logo_url {
            if let Some(origin) = logo_origin(url) {
                csp = csp.replacen(
                    "img-src 'self' data:",
                    &format!("img-src 'self' data: {origin}"),
                    1,
                );
            }
            logo = format!(
                "<img class=\"event-logo\" id=\"event-logo\" src=\"{}\" alt=\"\">",
                escape(url)
            );
        }
    }
    let text = |t: Option<&Option<Texts>>| {
        t.and_then(|t| pick(t, lang))
            .map(escape)
            .unwrap_or_default()
    };
    let hidden = |s: &str| if s.is_empty() { " hidden" } else { "" };
    let headline = text(look.map(|l| &l.headline));
    let note = text(look.map(|l| &l.note));
    let page_title = match config {
        Some(_) => format!("{} · {}", escape(title), default_title(lang)),
        None => default_title(lang).to_string(),
    };
    // Without scripts this page cannot join or follow: it says so. For an event that gates
    // a site's paths (its session is a cookie), it points to the waiting room that works
    // without them (a page that refreshes itself), which sends the person to the first
    // gated path once admitted. Not for other events: their turn is an access token the
    // script hands to `target_url`, or their join needs what only the script can send
    // (a user token, an invite, proof of work).
    let plain = config
        .filter(|c| {
            c.access == crate::core::Access::Public
                && !c.require_user_token
                && c.pow_difficulty == 0
                && c.pow_auto_above.is_none()
        })
        .and_then(|c| c.gate.paths.first())
        .map(|path| escape(&super::gate::waiting_room_url(event_id, path)));
    // An event that gates a site's paths and names no `target_url`: its turn is the gate's
    // session cookie, not an access token handed to a site. The script hands its place
    // over to the gate there (`POST` to this URL) instead of entering through the API,
    // which led nowhere and made the person take a second place at the gated path.
    let gate = config
        .filter(|c| c.target_url.is_none())
        .and_then(|c| c.gate.paths.first())
        .map(|path| {
            format!(
                " data-gate=\"{}\"",
                escape(&super::gate::waiting_room_url(event_id, path))
            )
        })
        .unwrap_or_default();
    let noscript = match (lang, plain) {
        ("ko", Some(plain)) => format!(
            "<noscript><p class=\"notice\">이 페이지는 자바스크립트가 있어야 줄을 설 수 있습니다. \
             <a href=\"{plain}\">자바스크립트 없이 쓰는 대기실</a>에서 기다려 주세요.</p></noscript>"
        ),
        ("ko", None) => "<noscript><p class=\"notice\">이 페이지는 자바스크립트가 있어야 줄을 설 수 \
                         있습니다. 자바스크립트를 켜 주세요.</p></noscript>"
            .to_string(),
        (_, Some(plain)) => format!(
            "<noscript><p class=\"notice\">This page needs JavaScript to keep your place in line. \
             Without it, wait in the <a href=\"{plain}\">waiting room that works without it</a>.</p></noscript>"
        ),
        (_, None) => "<noscript><p class=\"notice\">This page needs JavaScript to keep your place \
                      in line: please turn it on.</p></noscript>"
            .to_string(),
    };
    let title_html = escape(title);
    let mut slots: Vec<(&str, &str)> = PAGE_TEXTS
        .iter()
        .map(|&(slot, en, ko)| (slot, if lang == "ko" { ko } else { en }))
        .collect();
    slots.extend_from_slice(&[
        ("lang", lang),
        ("noscript", &noscript),
        ("page_title", &page_title),
        ("head", &head),
        ("logo", &logo),
        ("title", &title_html),
        ("headline", &headline),
        ("headline_hidden", hidden(&headline)),
        ("title_lang", mark(look.map(|l| &l.title))),
        ("headline_lang", mark(look.map(|l| &l.headline))),
        ("note_lang", mark(look.map(|l| &l.note))),
        ("note", &note),
        ("note_hidden", hidden(&note)),
        ("gate", &gate),
    ]);
    let html = fill(WAIT_HTML, &slots);
    (html, csp)
}

/// An HTML answer with the pages' headers, revalidated by a hash of its bytes.
fn html(status: StatusCode, body: String, csp: &str, request: &HeaderMap) -> Response {
    let hash = Sha256::digest(body.as_bytes());
    let tag: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    let etag = HeaderValue::from_str(&format!("\"{tag}\"")).expect("hex is a valid header");
    let fresh = status == StatusCode::OK && super::pages::none_match(request, &etag);
    let mut res = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            status,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            body,
        )
            .into_response()
    };
    let h = res.headers_mut();
    h.insert(header::ETAG, etag);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if let Ok(v) = HeaderValue::from_str(&super::pages::own_sockets(csp, request)) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    // No request of the page names its URL (where the person was going, a link's token
    // until the page drops it): not to other sites, nor in the `Referer` of its own
    // requests, which a proxy's access log keeps (`same-origin` was tried for the
    // hand-over's `Origin`, and a check found the link's token in those logs).
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    res
}

/// The `404` page of an unknown event, with a link back to the start.
pub fn render_missing(event_id: &str, lang: &str) -> String {
    let (title, lead, back) = if lang == "ko" {
        (
            "존재하지 않는 이벤트입니다",
            "이 주소의 대기실을 찾을 수 없습니다. 주소를 확인하거나 처음 페이지에서 이벤트를 고르세요.",
            "처음으로 돌아가기",
        )
    } else {
        (
            "This event does not exist",
            "There is no waiting room at this address. Check the link, or choose an event from the start page.",
            "Back to the start",
        )
    };
    fill(
        MISSING_HTML,
        &[
            ("lang", lang),
            ("brand", default_title(lang)),
            ("title", title),
            ("lead", lead),
            ("back", back),
            ("event_id", &escape(event_id)),
        ],
    )
}

/// `GET /wait/{event_id}`: the waiting room, with the event's look.
pub async fn wait(
    State(state): State<AppState>,
    AppPath(id): AppPath<String>,
    uri: Uri,
    headers: HeaderMap,
) -> AppResult<Response> {
    let lang = language(&uri, &headers);
    if let Err(e) = validate_event_id(&id) {
        // No event has such an id: a person who followed a broken link gets the page that
        // leads back to the start, as for an unknown event; an API client the 400.
        if wants_html(&headers) {
            return Ok(html(
                StatusCode::NOT_FOUND,
                render_missing(&id, lang),
                CSP,
                &headers,
            ));
        }
        return Err(e.into());
    }
    let config = match state.events.config(&id, state.clock.now()).await {
        Ok(c) => Some(c),
        Err(e) => match AppError::from(e) {
            AppError::EventNotFound if wants_html(&headers) => {
                return Ok(html(
                    StatusCode::NOT_FOUND,
                    render_missing(&id, lang),
                    CSP,
                    &headers,
                ));
            }
            AppError::EventNotFound => return Err(AppError::EventNotFound),
            // The store cannot say now: the built-in look; the page keeps trying.
            _ => None,
        },
    };
    let (body, csp) = render_wait(&id, config.as_deref(), lang);
    Ok(html(StatusCode::OK, body, &csp, &headers))
}

/// The stylesheet of an event's colour: the accent of buttons, a text colour that stays
/// readable on it, and per colour scheme an "ink": the colour darkened (light scheme) or
/// lightened (dark scheme) just enough to be read as text on that scheme's backgrounds.
/// The brand colour itself fills buttons and the soft tint behind the position; the ink
/// draws the position, links, the focus ring and the progress bar, which a light yellow
/// (light scheme) or a deep blue (dark scheme) left unreadable at 1.2:1.
pub fn theme_css(color: &str) -> String {
    let text = accent_text(color);
    let [light, dark] = [&LIGHT, &DARK].map(|scheme| {
        let soft = mix(rgb(color), rgb(scheme.card), scheme.soft_percent);
        let ink = ink(rgb(color), scheme, soft);
        (ink, scheme.soft_percent)
    });
    format!(
        ":root {{ --accent: {color}; --accent-text: {text}; --accent-ink: {}; \
         --accent-soft: color-mix(in srgb, {color} {}%, var(--card)); }}\n\
         @media (prefers-color-scheme: dark) {{ :root {{ --accent: {color}; --accent-text: {text}; \
         --accent-ink: {}; --accent-soft: color-mix(in srgb, {color} {}%, var(--card)); }} }}\n",
        hex(light.0),
        light.1,
        hex(dark.0),
        dark.1,
    )
}

/// A colour scheme of `style.css`: the backgrounds accent-coloured text is drawn on (its
/// `--bg` and `--card`, and the soft tint of the accent, `soft_percent` of it in the card
/// colour), and where the ink moves to gain contrast.
struct Scheme {
    bg: &'static str,
    card: &'static str,
    soft_percent: u8,
    toward: [f64; 3],
}

const LIGHT: Scheme = Scheme {
    bg: "#f3f5f9",
    card: "#ffffff",
    soft_percent: 14,
    toward: [0.0; 3],
};

const DARK: Scheme = Scheme {
    bg: "#0e131b",
    card: "#161d29",
    soft_percent: 22,
    toward: [255.0; 3],
};

/// Contrast the ink reaches on every background of its scheme: WCAG's 4.5:1 for text of
/// normal size (links), so also the 3:1 of large text (the position) and of a focus ring.
const INK_CONTRAST: f64 = 4.5;

fn rgb(color: &str) -> [f64; 3] {
    let c = |i: usize| {
        color
            .get(i..i + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .map_or(0.0, f64::from)
    };
    [c(1), c(3), c(5)]
}

fn hex(c: [f64; 3]) -> String {
    let b = |v: f64| v.round().clamp(0.0, 255.0) as u8;
    format!("#{:02x}{:02x}{:02x}", b(c[0]), b(c[1]), b(c[2]))
}

/// `percent` of `a` in `b`, as CSS `color-mix(in srgb, …)` mixes them.
fn mix(a: [f64; 3], b: [f64; 3], percent: u8) -> [f64; 3] {
    let p = f64::from(percent) / 100.0;
    [0, 1, 2].map(|i| a[i] * p + b[i] * (1.0 - p))
}

/// The text colour of buttons filled with `color`: near-black or white, whichever
/// contrasts more with it. (A fixed luminance cut at 0.4 gave common brand colours, an
/// orange `#ff8800` or a sky blue `#33aaff`, white text at 2.4:1 where near-black reads at
/// 7.9:1; the two contrasts cross at a luminance of about 0.19.)
fn accent_text(color: &str) -> &'static str {
    let c = rgb(color);
    if contrast(c, rgb("#111111")) >= contrast(c, rgb("#ffffff")) {
        "#111111"
    } else {
        "#ffffff"
    }
}

/// WCAG's contrast ratio of two colours (1 to 21).
fn contrast(a: [f64; 3], b: [f64; 3]) -> f64 {
    let (la, lb) = (luminance(&hex(a)), luminance(&hex(b)));
    (la.max(lb) + 0.05) / (la.min(lb) + 0.05)
}

/// `color` itself when it reads on every background of `scheme` (`soft`: the tint behind
/// the position), else the least darkened (or lightened) step of it that does: the brand
/// stays recognisable, and black or white is the last step, which always reads there.
fn ink(color: [f64; 3], scheme: &Scheme, soft: [f64; 3]) -> [f64; 3] {
    let grounds = [rgb(scheme.bg), rgb(scheme.card), soft];
    (0..=100u8)
        .map(|step| mix(scheme.toward, color, step))
        .map(|c| c.map(f64::round))
        .find(|c| grounds.iter().all(|g| contrast(*c, *g) >= INK_CONTRAST))
        .unwrap_or(scheme.toward)
}

/// `GET /wait/{event_id}/theme.css`: the event's colours (empty without `theme_color`).
pub async fn theme(
    State(state): State<AppState>,
    AppPath(id): AppPath<String>,
) -> AppResult<Response> {
    validate_event_id(&id)?;
    let config = state.events.config(&id, state.clock.now()).await?;
    let css = config
        .look
        .theme_color
        .as_deref()
        .map(theme_css)
        .unwrap_or_default();
    Ok((
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        css,
    )
        .into_response())
}

fn branding_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()) {
        Some(e) if e == "css" => "text/css; charset=utf-8",
        Some(e) if e == "png" => "image/png",
        Some(e) if e == "jpg" || e == "jpeg" => "image/jpeg",
        Some(e) if e == "gif" => "image/gif",
        Some(e) if e == "webp" => "image/webp",
        Some(e) if e == "svg" => "image/svg+xml",
        _ => "application/octet-stream",
    }
}

/// Reads one file of the branding folder, if it is there, a plain file, small, and really
/// in the folder: a symlink may point within it (or the folder itself be a link), never out
/// of it, since the rest of the data dir holds the signing key and the admin token. The
/// resolved path is opened without following a link, so one swapped in after the check is
/// refused rather than followed.
async fn read_branding(dir: &Path, name: &str) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt as _;
    let root = tokio::fs::canonicalize(dir).await.ok()?;
    let path = tokio::fs::canonicalize(dir.join(name)).await.ok()?;
    if path.parent() != Some(root.as_path()) {
        return None;
    }
    let mut open = tokio::fs::OpenOptions::new();
    open.read(true);
    #[cfg(unix)]
    open.custom_flags(libc::O_NOFOLLOW);
    let mut file = open.open(&path).await.ok()?;
    let meta = file.metadata().await.ok()?;
    if !meta.is_file() || meta.len() > MAX_BRANDING_FILE_BYTES {
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // At most the limit, even if the file grows after its size was read.
    (&mut file)
        .take(MAX_BRANDING_FILE_BYTES)
        .read_to_end(&mut bytes)
        .await
        .ok()?;
    Some(bytes)
}

/// `GET /branding/{file}`: a logo or stylesheet from the data dir's `branding/` folder.
/// Names are checked (no path, no hidden file, a known type) before the disk is touched.
/// Served with a policy that runs nothing, so an SVG opened on its own cannot run script
/// on this origin.
pub async fn branding(
    State(state): State<AppState>,
    AppPath(name): AppPath<String>,
    headers: HeaderMap,
) -> Response {
    let mut types = IMAGE_EXTENSIONS.to_vec();
    types.push("css");
    let found = match &state.branding_dir {
        Some(dir) if branding_file_ok(&name, &types) => read_branding(dir, &name).await,
        _ => None,
    };
    let Some(bytes) = found else {
        return AppError::NotFound.into_response();
    };
    let hash = Sha256::digest(&bytes);
    let tag: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    let etag = HeaderValue::from_str(&format!("\"{tag}\"")).expect("hex is a valid header");
    let fresh = super::pages::none_match(&headers, &etag);
    let mut res = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, branding_type(&name))], bytes).into_response()
    };
    let h = res.headers_mut();
    h.insert(header::ETAG, etag);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'; sandbox"),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::EventPatch;

    #[test]
    fn the_language_follows_the_browsers_weights() {
        for (accept, want) in [
            ("ko-KR,ko;q=0.9,en;q=0.8", "ko"),
            ("fr-FR,fr;q=0.9,ko;q=0.8", "ko"),
            ("en;q=0.1, ko", "ko"),
            ("ko;q=0, en", "en"),
            ("ko;q=0", "en"),
            ("fr, de", "en"),
            ("*, ko;q=0.5", "en"),
            ("en-GB, ko", "en"),
            ("KO", "ko"),
            ("", "en"),
        ] {
            assert_eq!(preferred([accept].into_iter()), want, "{accept:?}");
        }
        // Several lines are one list: the best of them all, the earlier line on a tie.
        for (lines, want) in [
            (&["fr", "ko"][..], "ko"),
            (&["en;q=0.5", "ko;q=0.9"][..], "ko"),
            (&["ko;q=0.5", "en"][..], "en"),
            (&["ko", "en"][..], "ko"),
        ] {
            let mut headers = HeaderMap::new();
            for l in lines {
                headers.append(header::ACCEPT_LANGUAGE, l.parse().unwrap());
            }
            assert_eq!(
                language(&Uri::from_static("/"), &headers),
                want,
                "{lines:?}"
            );
        }
    }

    fn event(json: &str) -> EventConfig {
        serde_json::from_str::<EventPatch>(json)
            .unwrap()
            .apply("fest", &EventConfig::default(), 0)
            .unwrap()
    }

    #[test]
    fn the_page_carries_the_look_escaped() {
        let c = event(
            r##"{"name": "Fest", "title": {"en": "<script>alert(1)</script> & \"Co\"", "ko": "봄 축제"},
                 "headline": {"en": "Doors at 8"}, "theme_color": "#aa3300",
                 "logo_url": "https://cdn.example.com/l.png?a=1&b=\"x\"", "stylesheet": "fest.css"}"##,
        );
        let (html, csp) = render_wait("fest", Some(&c), "en");
        assert!(!html.contains("{{"), "every slot is filled");
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;Co&quot;"));
        assert!(html.contains(
            "<title>&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;Co&quot; · Waiting room</title>"
        ));
        assert!(html.contains(">Doors at 8</p>"));
        assert!(html.contains("href=\"/wait/fest/theme.css\""));
        assert!(html.contains("href=\"/branding/fest.css\""));
        assert!(html.contains("content=\"#aa3300\""));
        assert!(
            html.contains("src=\"https://cdn.example.com/l.png?a=1&amp;b=%22x%22\""),
            "{html}"
        );
        assert!(
            csp.contains("img-src 'self' data: https://cdn.example.com;"),
            "{csp}"
        );
        assert!(csp.contains("script-src 'self';"));
        let (ko, _) = render_wait("fest", Some(&c), "ko");
        assert!(ko.contains("<html lang=\"ko\">"));
        assert!(ko.contains("<title>봄 축제 · 대기실</title>"));
        // Without a look: the built-in page, its policy unchanged.
        let (plain, csp) = render_wait("fest", Some(&event("{}")), "en");
        assert!(!plain.contains("{{") && !plain.contains("theme.css"));
        assert!(plain.contains("id=\"headline\" dir=\"auto\" hidden"));
        assert_eq!(csp, CSP);
        let (unknown, _) = render_wait("fest", None, "en");
        assert!(unknown.contains("<title>Waiting room</title>"));
    }

    /// The words the server writes into the page are the script's, so a language switch
    /// or the first render changes nothing a person reads.
    #[test]
    fn the_server_writes_the_scripts_words() {
        let script = include_str!("assets/wait.js");
        for (slot, en, ko) in PAGE_TEXTS {
            let Some(key) = slot.strip_prefix("t_") else {
                continue;
            };
            for said in [en, ko] {
                assert!(
                    script.contains(&format!("{key}: '{said}'")),
                    "{key}: {said}"
                );
            }
        }
        let (ko, _) = render_wait("fest", Some(&event("{}")), "ko");
        assert!(!ko.contains("Your place in line") && ko.contains("나의 대기 순서"));
        assert!(ko.contains(">English</button>"), "{ko}");
    }

    #[test]
    fn the_templates_load_nothing_from_outside() {
        for t in [WAIT_HTML, MISSING_HTML] {
            assert!(!t.contains("http://") && !t.contains("https://"));
            assert!(!t.contains("<script>") && !t.contains("style="));
        }
        let page = render_missing("a<b", "en");
        assert!(page.contains("href=\"/\"") && page.contains("a&lt;b"));
    }

    /// The page's slots are filled from the template only: a text that looks like a slot
    /// stays that text, and never pulls the page's markup (the stylesheet links, the logo)
    /// into its own place.
    #[test]
    fn a_text_that_names_a_slot_stays_text() {
        let c = event(
            r##"{"name": "Fest", "title": {"en": "{{logo}} {{head}}"},
                 "headline": {"en": "{{note}}"}, "note": {"en": "the note"},
                 "theme_color": "#aa3300", "logo_url": "/branding/l.png"}"##,
        );
        let (html, _) = render_wait("fest", Some(&c), "en");
        assert!(
            html.contains("<title>{{logo}} {{head}} · Waiting room</title>"),
            "{html}"
        );
        assert!(html.contains(">{{logo}} {{head}}</h1>"), "{html}");
        assert!(html.contains(">{{note}}</p>"), "{html}");
        assert_eq!(
            html.matches("<img class=\"event-logo\"").count(),
            1,
            "{html}"
        );
        assert_eq!(html.matches("theme.css").count(), 1, "{html}");
        assert_eq!(html.matches("the note").count(), 1, "{html}");
    }

    /// Whoever may drop logos into `branding/` must not be able to publish the rest of the
    /// data dir (the signing key, the admin token) through a symlink pointing out of it.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_branding_symlink_out_of_the_folder_is_not_served() {
        let data = tempfile::tempdir().unwrap();
        let dir = data.path().join("branding");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(data.path().join("signing-key.pem"), "SECRET").unwrap();
        std::fs::write(dir.join("real.css"), "body{}").unwrap();
        std::os::unix::fs::symlink("../signing-key.pem", dir.join("key.css")).unwrap();
        std::os::unix::fs::symlink(data.path().join("signing-key.pem"), dir.join("abs.png"))
            .unwrap();
        std::os::unix::fs::symlink("real.css", dir.join("alias.css")).unwrap();
        assert_eq!(read_branding(&dir, "key.css").await, None);
        assert_eq!(read_branding(&dir, "abs.png").await, None);
        assert_eq!(
            read_branding(&dir, "real.css").await.as_deref(),
            Some(&b"body{}"[..])
        );
        assert_eq!(
            read_branding(&dir, "alias.css").await.as_deref(),
            Some(&b"body{}"[..]),
            "a link within the folder is fine"
        );
        // The folder itself may be a link (a mounted or shared assets folder).
        let linked = data.path().join("linked");
        std::os::unix::fs::symlink(&dir, &linked).unwrap();
        assert!(read_branding(&linked, "real.css").await.is_some());
        assert_eq!(read_branding(&linked, "key.css").await, None);
    }

    #[test]
    fn theme_text_is_readable() {
        assert!(theme_css("#ffd400").contains("--accent-text: #111111"));
        assert!(theme_css("#3454d1").contains("--accent-text: #ffffff"));
        // Whichever reads better: these got white at 2.4–2.9:1.
        for c in ["#ff8800", "#33aaff", "#ff6699", "#00b000"] {
            assert!(theme_css(c).contains("--accent-text: #111111"), "{c}");
        }
        for c in [
            "#000000", "#3454d1", "#cc0000", "#6a1b9a", "#ffffff", "#ffd400",
        ] {
            let text = accent_text(c);
            let other = if text == "#111111" {
                "#ffffff"
            } else {
                "#111111"
            };
            assert!(
                contrast(rgb(c), rgb(text)) >= contrast(rgb(c), rgb(other)),
                "{c}"
            );
        }
    }

    /// The ink (position, links, focus ring, progress) reads at 4.5:1 on every background
    /// of its scheme, whatever the brand colour (defect: the colour itself was used, 1.16:1
    /// for `#ffee00` on the light page, 1.23:1 for `#1a237e` and 2.67:1 for the README's
    /// `#0a7f3f` on the dark one); a colour that reads already is kept as it is.
    #[test]
    fn the_accent_ink_reads_on_every_background() {
        let mut colors: Vec<String> = [
            "#ffee00", "#ff9900", "#1a237e", "#0a7f3f", "#3454d1", "#ffffff", "#000000", "#7f7f7f",
            "#ff0000", "#00ffff",
        ]
        .map(str::to_string)
        .to_vec();
        // And a spread of the whole cube.
        for r in (0..=255).step_by(51) {
            for g in (0..=255).step_by(51) {
                for b in (0..=255).step_by(51) {
                    colors.push(format!("#{r:02x}{g:02x}{b:02x}"));
                }
            }
        }
        let declared = |css: &str, scheme: usize, name: &str| -> String {
            let part = css.split("@media").nth(scheme).unwrap();
            let at = part.find(&format!("{name}: ")).unwrap() + name.len() + 2;
            part[at..at + 7].to_string()
        };
        for color in &colors {
            let css = theme_css(color);
            for (i, scheme) in [&LIGHT, &DARK].into_iter().enumerate() {
                let ink = rgb(&declared(&css, i, "--accent-ink"));
                let soft = mix(rgb(color), rgb(scheme.card), scheme.soft_percent);
                for ground in [rgb(scheme.bg), rgb(scheme.card), soft] {
                    let c = contrast(ink, ground);
                    assert!(c >= 4.5, "{color} scheme {i}: {c:.2} on {}", hex(ground));
                }
                assert_eq!(declared(&css, i, "--accent"), *color, "the brand is kept");
            }
        }
        // Readable already: unchanged. Unreadable: moved toward black (light) or white (dark).
        let css = theme_css("#3454d1");
        assert_eq!(declared(&css, 0, "--accent-ink"), "#3454d1");
        let css = theme_css("#ffee00");
        assert!(luminance(&declared(&css, 0, "--accent-ink")) < luminance("#ffee00"));
        assert_eq!(declared(&css, 1, "--accent-ink"), "#ffee00");
        let css = theme_css("#1a237e");
        assert!(luminance(&declared(&css, 1, "--accent-ink")) > luminance("#1a237e"));
        assert_ne!(
            declared(&theme_css("#0a7f3f"), 1, "--accent-ink"),
            "#0a7f3f"
        );
    }
}
