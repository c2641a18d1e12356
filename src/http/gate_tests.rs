//! Unit tests of the gate's rules in `gate.rs` (kept apart so that file stays the rules).

use super::*;

fn accept(lines: &[&str]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for l in lines {
        h.append(header::ACCEPT, HeaderValue::from_str(l).unwrap());
    }
    h
}

#[test]
fn a_page_is_asked_for_only_by_a_text_html_entry_above_q_0() {
    for yes in [
        &["text/html"][..],
        &["text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"],
        &["TEXT/HTML"],
        &["application/json;q=0.9, text/html;q=0.001"],
        &["text/html;level=1;q=0.5"],
        &["text/html;q=1"],
        // A malformed q refuses nothing.
        &["text/html;q=x"],
        &["text/html; Q = 0.01"],
        &["application/json", "text/html"],
    ] {
        assert!(asks_html(&accept(yes)), "{yes:?}");
    }
    for no in [
        &[][..],
        // `fetch`'s default, and anything naming no page: the JSON, as before.
        &["*/*"],
        &["text/*"],
        &["application/json"],
        &["text/html;q=0"],
        &["text/html; q=0.0, application/json"],
        &["text/html;level=1;Q=0.000"],
        &["text/html;q=0.", "*/*"],
        &["application/xhtml+xml, text/htmlx"],
    ] {
        assert!(!asks_html(&accept(no)), "{no:?}");
    }
    // JSON asked for beside a page refused: the JSON.
    assert!(wants_json(&accept(&["application/json, text/html;q=0"])));
    assert!(!wants_json(&accept(&["application/json, text/html"])));
    assert!(!wants_json(&accept(&["*/*"])));
}

/// JSON is asked for by an `application/json` entry above q 0 on any `Accept` line,
/// without a page asked for (API.md: "names `application/json` and not `text/html`").
#[test]
fn json_is_asked_for_only_by_an_application_json_entry_above_q_0() {
    for yes in [
        &["text/plain", "application/json"][..],
        &["application/json"],
        &["Application/JSON; charset=utf-8"],
        &["application/json;q=0.5, */*;q=0.1"],
        &["application/json", "text/html;q=0"],
    ] {
        assert!(wants_json(&accept(yes)), "{yes:?}");
    }
    for no in [
        &[][..],
        &["*/*"],
        &["application/json;q=0, text/plain"],
        &["application/json; q=0.000"],
        &["application/jsonx"],
        &["application/json-seq"],
        &["application/json", "text/html"],
        &["text/html", "application/json"],
    ] {
        assert!(!wants_json(&accept(no)), "{no:?}");
    }
}

#[test]
fn return_paths_stay_on_the_site() {
    for ok in ["/", "/checkout?x=1&y=%2F", "/a/b"] {
        assert_eq!(safe_return(ok), ok);
    }
    for bad in [
        "//evil.example/x",
        "/\\evil.example",
        "https://evil.example/",
        "evil",
        "/a\nLocation: x",
        "",
    ] {
        assert_eq!(safe_return(bad), "/", "{bad:?}");
    }
    assert_eq!(
        waiting_room_url("e", "//evil.example"),
        "/wait/e/queue?return=%2F"
    );
    // Counted as carried, encoded (defect: 1,400 `/` or 700 `é` were kept, and nginx
    // refused the 4 KiB header that carried them: the visitor's `500`).
    for (path, kept) in [
        (format!("/{}", "a".repeat(2045)), true),
        (format!("/{}", "a".repeat(2046)), false),
        (format!("/q?{}", "/".repeat(680)), true),
        (format!("/q?{}", "/".repeat(681)), false),
        (format!("/{}", "\u{e9}".repeat(340)), true),
        (format!("/{}", "\u{e9}".repeat(341)), false),
    ] {
        let url = waiting_room_url("e", &path);
        assert_eq!(safe_return(&path) == path, kept, "{}", path.len());
        assert!(url.len() <= "/wait/e/queue?return=".len() + MAX_RETURN_LEN);
        assert!(ascii_location(safe_return(&path)).len() <= MAX_RETURN_LEN);
    }
    // A `Location` is ASCII: other characters go percent-encoded, the rest unchanged.
    assert_eq!(
        ascii_location("/caf\u{e9}?q=%41&x=\u{fffd}"),
        "/caf%C3%A9?q=%41&x=%EF%BF%BD"
    );
    assert_eq!(ascii_location("/a/b?c=d"), "/a/b?c=d");
}

/// The word-at-a-time check answers as `HeaderValue::to_str` does, for every byte
/// value at every place of a header (in a whole word or in the remainder).
#[test]
fn visible_ascii_answers_as_to_str() {
    for len in [1, 8, 19] {
        for at in 0..len {
            for b in 0..=255u8 {
                let mut v = vec![b'a'; len];
                v[at] = b;
                let ok = (0x20..0x7f).contains(&b) || b == b'\t';
                assert_eq!(visible_ascii(&v), ok, "{b:#x} at {at} of {len}");
                if let Ok(h) = HeaderValue::from_bytes(&v) {
                    assert_eq!(h.to_str().is_ok(), ok, "{b:#x}");
                }
            }
        }
    }
}

#[test]
fn cookies_are_read_among_others() {
    let mut h = HeaderMap::new();
    h.append(
        header::COOKIE,
        HeaderValue::from_static("a=1; waitroom_e=tok; b=2"),
    );
    assert_eq!(read_cookie(&h, "waitroom_e"), Some("tok"));
    assert_eq!(read_cookie(&h, "waitroom_x"), None);
    let mut h = HeaderMap::new();
    for v in [
        "waitroom_e2=other; x=\"q\"",
        "\u{e9}bad=1; waitroom_e=hidden",
        "waitroom_f=caf\u{e9}; waitroom_f=ok",
        " waitroom_ = 1 ;  waitroom_e=\"tok=2\" ; waitroom_e=late",
    ] {
        h.append(
            header::COOKIE,
            HeaderValue::from_bytes(v.as_bytes()).unwrap(),
        );
    }
    // A longer name and a name sharing a prefix are not it; the first pair named so
    // is, unquoted, an `=` in its value kept, whatever bytes the pairs around it hold
    // (defect: a header with a byte outside ASCII was skipped whole).
    assert_eq!(read_cookie(&h, "waitroom_e"), Some("hidden"));
    assert_eq!(read_cookie(&h, "x"), Some("q"));
    assert_eq!(
        read_cookie(&h, "waitroom_f"),
        Some("ok"),
        "a value outside ASCII"
    );
    assert_eq!(read_cookie(&h, "waitroom_"), None);
    assert_eq!(read_cookie(&h, "waitroom"), None);
    assert_eq!(read_cookie(&h, ""), None);
    let c = set_cookie("e", Some("t"), true);
    let c = c.to_str().unwrap();
    assert!(c.contains("HttpOnly") && c.contains("SameSite=Lax") && c.contains("Secure"));
    assert!(!set_cookie("e", Some("t"), false)
        .to_str()
        .unwrap()
        .contains("Secure"));
}
