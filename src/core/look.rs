//! An event's look and words: the title, texts (Korean and English), colour, logo and
//! stylesheet its waiting page shows, and their validation.
//!
//! Everything here ends up in an HTML page, so the rules are about what can reach a person
//! who never chose to trust the operator's input: texts are plain (no markup survives, the
//! pages escape them; control characters are refused), the colour is exactly `#rrggbb`, a
//! logo is an `https://` URL (its origin is named in the page's `img-src`, nothing else
//! is) or a file from the data dir's `branding/` folder, and a stylesheet is such a file
//! too: nothing from elsewhere runs or styles the page, and the Content-Security-Policy
//! stays same-origin.

use serde::{Deserialize, Serialize};

use super::config::EventPatch;
use super::QueueError;

/// Longest `title`, in characters (per language).
pub const MAX_TITLE_CHARS: usize = 120;
/// Longest `headline`.
pub const MAX_HEADLINE_CHARS: usize = 200;
/// Longest `note` and `turn_message`.
pub const MAX_NOTE_CHARS: usize = 1000;
/// Longest `logo_url`.
pub const MAX_LOGO_URL_BYTES: usize = 2048;
/// Where files of the data dir's `branding/` folder are served.
pub const BRANDING_PATH: &str = "/branding/";

/// One text in the page's two languages; either may be absent (the page then shows the
/// other one).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Texts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ko: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub en: Option<String>,
}

impl Texts {
    /// The text for `lang` (`"ko"` or anything else for English), else the other one.
    pub fn pick(&self, lang: &str) -> Option<&str> {
        let (first, second) = if lang == "ko" {
            (&self.ko, &self.en)
        } else {
            (&self.en, &self.ko)
        };
        first.as_deref().or(second.as_deref())
    }

    /// [`Texts::pick`], with the language of the text picked (`"ko"` or `"en"`): a page
    /// marks a stand-in in the other language, so a screen reader speaks it in its own.
    pub fn pick_lang(&self, lang: &str) -> Option<(&str, &'static str)> {
        let ko = self.ko.as_deref().map(|t| (t, "ko"));
        let en = self.en.as_deref().map(|t| (t, "en"));
        if lang == "ko" {
            ko.or(en)
        } else {
            en.or(ko)
        }
    }
}

/// The look and words of an event's waiting page. Every field is optional: an event without
/// them looks like the built-in page.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Look {
    /// The page's `<title>` and heading; the event's `name` when absent.
    #[serde(default)]
    pub title: Option<Texts>,
    /// A line under the heading.
    #[serde(default)]
    pub headline: Option<Texts>,
    /// Notes shown while waiting (line breaks kept).
    #[serde(default)]
    pub note: Option<Texts>,
    /// What happens next, shown once it is the person's turn (admitted, entered).
    #[serde(default)]
    pub turn_message: Option<Texts>,
    /// `#rrggbb` (lower case): buttons, the position and the progress bar.
    #[serde(default)]
    pub theme_color: Option<String>,
    /// `https://…`, or `/branding/<file>` from the data dir.
    #[serde(default)]
    pub logo_url: Option<String>,
    /// A `.css` file of the data dir's `branding/` folder, linked after the built-in one.
    #[serde(default)]
    pub stylesheet: Option<String>,
}

fn bad(msg: impl Into<String>) -> QueueError {
    QueueError::Invalid(msg.into())
}

/// Checks one text: at most `max` characters per language, no control characters (but line
/// breaks where `lines`). Empty strings count as absent; with neither language, `None`.
///
/// A line break is stored as `\n` however it was written: text pasted from Windows or typed
/// in a browser's `<textarea>` (whose form value is `\r\n`) has `\r\n`, an old Mac's a lone
/// `\r`. One form keeps the count of characters, the pages and every reader of the JSON
/// alike.
fn texts(field: &str, t: &Texts, max: usize, lines: bool) -> Result<Option<Texts>, QueueError> {
    let mut out = Texts::default();
    for (lang, v, slot) in [("ko", &t.ko, &mut out.ko), ("en", &t.en, &mut out.en)] {
        let newlines = v
            .as_deref()
            .filter(|s| lines && s.contains('\r'))
            .map(|s| s.replace("\r\n", "\n").replace('\r', "\n"));
        let Some(s) = newlines
            .as_deref()
            .or(v.as_deref())
            .map(str::trim)
            .filter(|s| !s.is_empty())
        else {
            continue;
        };
        if s.chars().count() > max {
            return Err(bad(format!(
                "{field}.{lang} must be at most {max} characters"
            )));
        }
        if s.chars().any(|c| c.is_control() && !(lines && c == '\n')) {
            return Err(bad(format!(
                "{field}.{lang} must not contain control characters"
            )));
        }
        *slot = Some(s.to_string());
    }
    Ok((out != Texts::default()).then_some(out))
}

/// The same check for the other texts of an event (`core::lifecycle`'s messages).
pub(super) fn check_texts(
    field: &str,
    t: &Texts,
    max: usize,
    lines: bool,
) -> Result<Option<Texts>, QueueError> {
    texts(field, t, max, lines)
}

/// A file name of the data dir's `branding/` folder: 1–64 of `[A-Za-z0-9._-]`, not starting
/// with a dot (no hidden files, no `..`), with one of `extensions`.
pub fn branding_file_ok(name: &str, extensions: &[&str]) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && !name.contains("..")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name
            .rsplit_once('.')
            .is_some_and(|(_, ext)| extensions.contains(&ext.to_ascii_lowercase().as_str()))
}

/// Image types a logo from the data dir may have.
pub const IMAGE_EXTENSIONS: &[&str] = &["png", "jpg", "jpeg", "gif", "webp", "svg"];

/// The `https` origin of a logo URL (what the page's `img-src` must allow), or `None` for a
/// logo served from the data dir. Only for URLs [`EventPatch::apply`] accepted.
pub fn logo_origin(logo_url: &str) -> Option<String> {
    let u = url::Url::parse(logo_url).ok()?;
    // A logo stored before hosts were checked is still never written into the policy.
    (u.scheme() == "https" && plain_host(&u)).then(|| u.origin().ascii_serialization())
}

/// A host that names one origin in a Content-Security-Policy source list: an IPv4 address
/// or a DNS name of letters, digits and hyphens (IDNs arrive here as punycode). The URL
/// parser lets through hosts such as `*` or `*.example.com`, which `img-src` would read as
/// wildcards, and other CSP syntax (`'`, `,`); IPv6 literals have no CSP host syntax.
fn plain_host(u: &url::Url) -> bool {
    match u.host() {
        Some(url::Host::Ipv4(_)) => true,
        Some(url::Host::Domain(d)) => d.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        }),
        _ => false,
    }
}

/// Whether `u` starts with `https://` and a host right after it. The parser is lenient
/// with special schemes: it reads `https:///x.png`, `https:x.png` or `https:\\x.png` as
/// the host `x.png`, which is not what was written.
fn authority_follows(u: &str) -> bool {
    u.strip_prefix("https://")
        .is_some_and(|rest| !rest.starts_with(['/', '\\']))
}

fn logo(u: &str) -> Result<String, QueueError> {
    let refused = || {
        bad(format!(
            "logo_url must be an https:// URL or {BRANDING_PATH}<file> (png, jpg, gif, webp, svg), \
             at most {MAX_LOGO_URL_BYTES} characters"
        ))
    };
    if u.len() > MAX_LOGO_URL_BYTES {
        return Err(refused());
    }
    if let Some(file) = u.strip_prefix(BRANDING_PATH) {
        return if branding_file_ok(file, IMAGE_EXTENSIONS) {
            Ok(u.to_string())
        } else {
            Err(refused())
        };
    }
    // Parsed, not prefix-matched: the stored form is the parser's (percent-encoded, no
    // quotes or spaces), and a URL with a password in it is a trick, not a logo.
    let parsed = url::Url::parse(u).map_err(|_| refused())?;
    if parsed.scheme() != "https"
        || !plain_host(&parsed)
        || !parsed.username().is_empty()
        || parsed.password().is_some()
        || !authority_follows(u)
    {
        return Err(refused());
    }
    let normal = parsed.to_string();
    if normal.len() > MAX_LOGO_URL_BYTES {
        return Err(refused());
    }
    Ok(normal)
}

impl EventPatch {
    /// The look and words (see the module's rules).
    pub(super) fn apply_look(&self, look: &mut Look) -> Result<(), QueueError> {
        for (field, patch, slot, max, lines) in [
            (
                "title",
                &self.title,
                &mut look.title,
                MAX_TITLE_CHARS,
                false,
            ),
            (
                "headline",
                &self.headline,
                &mut look.headline,
                MAX_HEADLINE_CHARS,
                false,
            ),
            ("note", &self.note, &mut look.note, MAX_NOTE_CHARS, true),
            (
                "turn_message",
                &self.turn_message,
                &mut look.turn_message,
                MAX_NOTE_CHARS,
                true,
            ),
        ] {
            if let Some(t) = patch {
                *slot = match t {
                    Some(t) => texts(field, t, max, lines)?,
                    None => None,
                };
            }
        }
        if let Some(c) = &self.theme_color {
            look.theme_color = match c {
                Some(c) => {
                    let ok = c.len() == 7
                        && c.starts_with('#')
                        && c[1..].bytes().all(|b| b.is_ascii_hexdigit());
                    if !ok {
                        return Err(bad("theme_color must be a colour as #rrggbb"));
                    }
                    Some(c.to_ascii_lowercase())
                }
                None => None,
            };
        }
        if let Some(u) = &self.logo_url {
            look.logo_url = u.as_deref().map(logo).transpose()?;
        }
        if let Some(s) = &self.stylesheet {
            if let Some(s) = s {
                if !branding_file_ok(s, &["css"]) {
                    return Err(bad(
                        "stylesheet must be the name of a .css file in the data dir's branding \
                         folder (1-64 of A-Z a-z 0-9 . _ -)",
                    ));
                }
            }
            look.stylesheet = s.clone();
        }
        Ok(())
    }
}

/// The relative luminance of `#rrggbb` (WCAG), to pick readable text on the colour.
pub fn luminance(color: &str) -> f64 {
    let channel = |i: usize| {
        let v = f64::from(u8::from_str_radix(&color[i..i + 2], 16).unwrap_or(0)) / 255.0;
        if v <= 0.03928 {
            v / 12.92
        } else {
            ((v + 0.055) / 1.055).powf(2.4)
        }
    };
    if color.len() != 7 {
        return 0.0;
    }
    0.2126 * channel(1) + 0.7152 * channel(3) + 0.0722 * channel(5)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::EventConfig;

    fn apply(json: &str) -> Result<EventConfig, QueueError> {
        serde_json::from_str::<EventPatch>(json)
            .map_err(|e| bad(e.to_string()))?
            .apply("e", &EventConfig::default(), 0)
    }

    #[test]
    fn look_is_kept_normalised_and_cleared_by_null() {
        let c = apply(
            r##"{"title": {"ko": " 봄 콘서트 ", "en": "Spring concert"}, "theme_color": "#AA3300",
                "note": {"en": "Two lines\nof notes"}, "headline": {"ko": "", "en": ""},
                "logo_url": "https://cdn.example.com/a logo.png", "stylesheet": "fest.css"}"##,
        )
        .unwrap();
        let l = &c.look;
        assert_eq!(l.title.as_ref().unwrap().pick("ko"), Some("봄 콘서트"));
        assert_eq!(l.title.as_ref().unwrap().pick("en"), Some("Spring concert"));
        assert_eq!(
            l.note.as_ref().unwrap().pick("ko"),
            Some("Two lines\nof notes")
        );
        assert_eq!(l.headline, None, "empty texts are no text");
        assert_eq!(l.theme_color.as_deref(), Some("#aa3300"));
        assert_eq!(
            l.logo_url.as_deref(),
            Some("https://cdn.example.com/a%20logo.png")
        );
        assert_eq!(
            logo_origin(l.logo_url.as_ref().unwrap()).as_deref(),
            Some("https://cdn.example.com")
        );
        let back: EventConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c, "the look round-trips through the stored JSON");
        let cleared = serde_json::from_str::<EventPatch>(r#"{"title": null, "logo_url": null}"#)
            .unwrap()
            .apply("e", &c, 0)
            .unwrap();
        assert_eq!(cleared.look.title, None);
        assert_eq!(cleared.look.logo_url, None);
        assert_eq!(cleared.look.theme_color.as_deref(), Some("#aa3300"));
        assert_eq!(
            apply(r#"{"logo_url": "/branding/logo.svg"}"#)
                .unwrap()
                .look
                .logo_url
                .as_deref(),
            Some("/branding/logo.svg")
        );
        assert_eq!(logo_origin("/branding/logo.svg"), None);
    }

    #[test]
    fn bad_looks_are_refused_with_the_field_named() {
        let long = "x".repeat(MAX_TITLE_CHARS + 1);
        for (json, field) in [
            (r#"{"theme_color": "red"}"#.to_string(), "theme_color"),
            (r##"{"theme_color": "#12345"}"##.into(), "theme_color"),
            (r##"{"theme_color": "#12345g"}"##.into(), "theme_color"),
            (r##"{"theme_color": "#123456;x"}"##.into(), "theme_color"),
            (format!(r#"{{"title": {{"en": "{long}"}}}}"#), "title.en"),
            (r#"{"title": {"ko": "a\u0007b"}}"#.into(), "title.ko"),
            (r#"{"title": {"en": "two\nlines"}}"#.into(), "title.en"),
            (
                format!(r#"{{"note": {{"ko": "{}"}}}}"#, "가".repeat(1001)),
                "note.ko",
            ),
            (
                r#"{"logo_url": "http://example.com/x.png"}"#.into(),
                "logo_url",
            ),
            (r#"{"logo_url": "javascript:alert(1)"}"#.into(), "logo_url"),
            (
                r#"{"logo_url": "data:image/svg+xml,<svg/>"}"#.into(),
                "logo_url",
            ),
            (r#"{"logo_url": "//evil.example/x.png"}"#.into(), "logo_url"),
            (
                r#"{"logo_url": "https://user:pw@evil.example/x.png"}"#.into(),
                "logo_url",
            ),
            (
                r#"{"logo_url": "HTTPS://evil.example/x.png"}"#.into(),
                "logo_url",
            ),
            (
                r#"{"logo_url": "/branding/../store/x.png"}"#.into(),
                "logo_url",
            ),
            (r#"{"logo_url": "/branding/logo.html"}"#.into(), "logo_url"),
            (r#"{"logo_url": "/assets/icon.svg"}"#.into(), "logo_url"),
            (r#"{"stylesheet": "../x.css"}"#.into(), "stylesheet"),
            (r#"{"stylesheet": ".hidden.css"}"#.into(), "stylesheet"),
            (r#"{"stylesheet": "x.js"}"#.into(), "stylesheet"),
        ] {
            match apply(&json) {
                Err(QueueError::Invalid(m)) => assert!(m.starts_with(field), "{json}: {m}"),
                other => panic!("{json} answered {other:?}"),
            }
        }
        // Unknown languages are named by the JSON reader.
        assert!(serde_json::from_str::<EventPatch>(r#"{"title": {"jp": "x"}}"#).is_err());
    }

    /// The logo's origin is written into the page's `img-src`: a host that is a CSP
    /// wildcard (`*`) or carries CSP syntax would widen that policy to every image host
    /// (the URL parser accepts such hosts), so only plain host names and IPv4 addresses go.
    #[test]
    fn a_logo_host_cannot_widen_the_image_policy() {
        for url in [
            "https://*/l.png",
            "https://*.example.com/l.png",
            "https://cdn.example.com;img-src/l.png",
            "https://a'none'/l.png",
            "https://a,b/l.png",
            "https://a!b/l.png",
        ] {
            let json = format!(r#"{{"logo_url": "{url}"}}"#);
            match apply(&json) {
                Err(QueueError::Invalid(m)) => assert!(m.starts_with("logo_url"), "{url}: {m}"),
                Ok(c) => panic!(
                    "{url} accepted, img-src gets {:?}",
                    logo_origin(c.look.logo_url.as_deref().unwrap())
                ),
                Err(e) => panic!("{url}: {e:?}"),
            }
        }
        for ok in [
            "https://cdn.example.com/l.png",
            "https://xn--9n2bp8q.example:8443/l.png",
            "https://192.0.2.7/l.png",
        ] {
            let c = apply(&format!(r#"{{"logo_url": "{ok}"}}"#)).unwrap();
            assert!(logo_origin(c.look.logo_url.as_deref().unwrap()).is_some());
        }
    }

    /// The URL parser reads a missing or doubled `//` as if the host followed; such a URL
    /// is refused rather than stored as another one.
    #[test]
    fn a_logo_url_is_stored_as_written() {
        for bad in [
            "https:///x.png",
            "https:////cdn.example.com/x.png",
            "https:cdn.example.com/x.png",
            r"https:\\cdn.example.com/x.png",
            r"https:/\\cdn.example.com/x.png",
            "https://",
        ] {
            let json = serde_json::json!({ "logo_url": bad }).to_string();
            match apply(&json) {
                Err(QueueError::Invalid(m)) => assert!(m.starts_with("logo_url"), "{bad}: {m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        let c = apply(r#"{"logo_url": "https://CDN.Example.COM/Logo.png"}"#).unwrap();
        assert_eq!(
            c.look.logo_url.as_deref(),
            Some("https://cdn.example.com/Logo.png")
        );
    }

    /// `\r\n` (a `<textarea>`'s, Windows') and a lone `\r` are line breaks where `\n` is one,
    /// stored as `\n`; where no line break is allowed, they are refused as before.
    #[test]
    fn every_line_break_is_stored_as_a_newline() {
        let c = apply(
            r#"{"note": {"en": "line1\r\nline2\rline3\n"}, "turn_message": {"ko": "a\r\n\r\nb"}}"#,
        )
        .unwrap();
        assert_eq!(
            c.look.note.unwrap().en.as_deref(),
            Some("line1\nline2\nline3")
        );
        assert_eq!(c.look.turn_message.unwrap().ko.as_deref(), Some("a\n\nb"));
        let message = Texts {
            ko: None,
            en: Some("Gate 3\r\nfrom 10:00".into()),
        };
        let checked = super::super::lifecycle::check_message("message", &message).unwrap();
        assert_eq!(checked.unwrap().en.as_deref(), Some("Gate 3\nfrom 10:00"));
        // A break counts as one character.
        let long = "x\r\n".repeat(MAX_NOTE_CHARS / 2);
        assert!(apply(&serde_json::json!({ "note": { "en": long } }).to_string()).is_ok());
        for json in [
            r#"{"title": {"en": "two\r\nlines"}}"#,
            r#"{"headline": {"en": "two\rlines"}}"#,
        ] {
            match apply(json) {
                Err(QueueError::Invalid(m)) => assert!(m.contains("control characters"), "{m}"),
                other => panic!("{json} answered {other:?}"),
            }
        }
    }

    #[test]
    fn text_on_the_colour_is_readable() {
        assert!(luminance("#ffffff") > 0.99);
        assert!(luminance("#000000") < 0.01);
        assert!(luminance("#ffd400") > 0.5, "yellow wants dark text");
        assert!(luminance("#3454d1") < 0.2, "our blue wants white text");
    }
}
