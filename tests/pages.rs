//! The embedded pages and the public event list over plain HTTP (what they look like and do
//! in a browser is `tests/browser.rs`): routes, content types, caching, the security
//! headers, the landing page's redirect, and `GET /api/v1/events`.

use reqwest::header;
use reqwest::redirect::Policy;
use reqwest::{Method, StatusCode};
use serde_json::json;

mod live_support;
use live_support::TestServer;

#[tokio::test]
async fn pages_and_assets_are_served_from_the_binary() {
    let s = TestServer::start().await;
    s.put_event("concert-a", json!({})).await;
    s.put_event("x", json!({})).await;
    let http = reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap();

    for (path, ct) in [
        ("/wait/concert-a", "text/html"),
        ("/admin", "text/html"),
        ("/demo/booking", "text/html"),
        ("/assets/style.css", "text/css"),
        ("/assets/wait.js", "text/javascript"),
        ("/assets/icon.svg", "image/svg+xml"),
    ] {
        let r = http.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        let h = r.headers().clone();
        assert!(
            h[header::CONTENT_TYPE].to_str().unwrap().starts_with(ct),
            "{path}"
        );
        assert_eq!(h[header::CACHE_CONTROL], "no-cache", "{path}");
        let etag = h[header::ETAG].clone();
        if ct == "text/html" {
            let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
            assert!(csp.contains("default-src 'self'"), "{csp}");
            assert!(csp.contains("script-src 'self'"), "{csp}");
            // Sockets to this host only: `ws:`/`wss:` alone would allow any host.
            let host = s
                .url("")
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string();
            assert!(
                csp.contains(&format!("connect-src 'self' ws://{host} wss://{host};")),
                "{path}: {csp}"
            );
            let body = r.text().await.unwrap();
            assert!(body.starts_with("<!doctype html>"), "{path}");
            assert!(!body.contains("<script>"), "no inline script in {path}");
        }
        // Revalidation is cheap, for every form of `If-None-Match` (RFC 9110 §13.1.2): the
        // tag, its weak form (a proxy that changed the encoding weakens it), a list with
        // it, and `*`. A list without it gets the page.
        let tag = etag.to_str().unwrap();
        for (sent, want) in [
            (tag.to_string(), StatusCode::NOT_MODIFIED),
            (format!("W/{tag}"), StatusCode::NOT_MODIFIED),
            (format!("\"x\", {tag}"), StatusCode::NOT_MODIFIED),
            (format!("W/\"x\",W/{tag}"), StatusCode::NOT_MODIFIED),
            ("*".to_string(), StatusCode::NOT_MODIFIED),
            ("\"x\", W/\"y\"".to_string(), StatusCode::OK),
        ] {
            let r = http
                .get(s.url(path))
                .header(header::IF_NONE_MATCH, &sent)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), want, "{path}: {sent}");
        }
    }

    // The waiting page carries the stable ids of the contract.
    let html = http
        .get(s.url("/wait/x"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for id in ["status", "position", "queue-length", "eta", "leave"] {
        assert!(html.contains(&format!("id=\"{id}\"")), "#{id} missing");
    }

    let (st, v) = s.call(Method::GET, "/wait/bad%20id", None, None).await;
    assert_eq!(
        (st, &v["error"]["code"]),
        (StatusCode::BAD_REQUEST, &json!("INVALID_REQUEST"))
    );
    let (st, v) = s.call(Method::GET, "/assets/nope.js", None, None).await;
    assert_eq!(
        (st, &v["error"]["code"]),
        (StatusCode::NOT_FOUND, &json!("NOT_FOUND"))
    );
    let (st, _) = s.call(Method::GET, "/assets/wait.html", None, None).await;
    assert_eq!(
        st,
        StatusCode::NOT_FOUND,
        "pages are served at their routes only"
    );
}

#[tokio::test]
async fn the_landing_page_goes_straight_to_a_lone_event_and_lists_several() {
    let s = TestServer::start().await;
    let http = reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap();

    // No event: the list (empty) page.
    let r = http.get(s.url("/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    s.put_event("solo", json!({"name": "Solo"})).await;
    let r = http.get(s.url("/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[header::LOCATION], "/wait/solo");

    s.put_event("duo", json!({"name": "Duo"})).await;
    let r = http.get(s.url("/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.text().await.unwrap().contains("id=\"events\""));
}

#[tokio::test]
async fn the_public_event_list_shows_figures_but_no_admin_settings() {
    let s = TestServer::start().await;
    s.put_event(
        "show",
        json!({"name": "Show", "max_active": 1, "target_url": "/demo/booking",
               "waiting_idle_sec": 90, "paused": true}),
    )
    .await;
    s.join_token("show", "a").await;
    s.join_token("show", "b").await;

    let (st, list) = s.call(Method::GET, "/api/v1/events", None, None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        list,
        json!([{
            "event_id": "show", "name": "Show", "queue_length": 2, "admitted": 0, "active": 0,
            "capacity": 1, "admitted_last_minute": 0, "paused": true, "accept_joins": true,
            "target_url": "/demo/booking", "waiting_idle_sec": 90, "title": null,
            "headline": null, "note": null, "turn_message": null, "theme_color": null,
            "logo_url": null,
        }])
    );
    let (st, one) = s.call(Method::GET, "/api/v1/events/show", None, None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(one, list[0]);

    let (st, v) = s.call(Method::GET, "/api/v1/events/nope", None, None).await;
    assert_eq!(
        (st, &v["error"]["code"]),
        (StatusCode::NOT_FOUND, &json!("EVENT_NOT_FOUND"))
    );
    let (st, v) = s
        .call(Method::GET, "/api/v1/events/bad%20id", None, None)
        .await;
    assert_eq!(
        (st, &v["error"]["code"]),
        (StatusCode::BAD_REQUEST, &json!("INVALID_REQUEST"))
    );
}

/// The demo booking page verifies access tokens for its own event (the demo event, or the
/// one its `?event=` names), never for any event: an empty or absent `event_id` would let a
/// token of another event through. How it behaves in a browser is `tests/browser.rs`.
#[tokio::test]
async fn the_booking_page_verifies_for_its_event() {
    let s = TestServer::start().await;
    let js = text_of(&s, "/assets/booking.js").await;
    assert!(
        js.contains("'/api/v1/queue/verify?event_id=' + encodeURIComponent(EVENT)"),
        "booking.js calls verify without its event"
    );
    assert!(
        js.contains(&format!(
            "params.get('event') || '{}'",
            waitroom::demo::DEMO_EVENT
        )),
        "booking.js does not default to the demo event"
    );
}

/// `GET /wait/{event_id}` with `Accept` as a browser sends it.
async fn page(s: &TestServer, path: &str, lang: &str) -> reqwest::Response {
    s.http
        .get(s.url(path))
        .header(header::ACCEPT, "text/html,application/xhtml+xml,*/*;q=0.8")
        .header(header::ACCEPT_LANGUAGE, lang)
        .send()
        .await
        .unwrap()
}

/// Without scripts the waiting page cannot join: it says so in the page's language; for
/// an event gating a site's paths it points to the waiting room that works without them
/// (back to the first gated path once admitted), for another event to nothing (its turn
/// is an access token only the script hands to `target_url`).
#[tokio::test]
async fn the_waiting_page_without_scripts_says_so_and_points_where_it_can() {
    let s = TestServer::start().await;
    s.put_event("shop", json!({"paths": ["/checkout"]})).await;
    s.put_event("fest", json!({"target_url": "/demo/booking"}))
        .await;
    s.put_event("vip", json!({"paths": ["/vip"], "access": "invite"}))
        .await;
    let notice = |html: String| {
        let start = html.find("<noscript>").expect("a notice without scripts");
        html[start..html.find("</noscript>").unwrap()].to_string()
    };
    for (lang, says) in [("en", "needs JavaScript"), ("ko-KR", "자바스크립트")] {
        let shop = notice(page(&s, "/wait/shop", lang).await.text().await.unwrap());
        assert!(shop.contains(says), "{shop}");
        assert!(
            shop.contains("href=\"/wait/shop/queue?return=%2Fcheckout\""),
            "{shop}"
        );
        for other in ["/wait/fest", "/wait/vip"] {
            let n = notice(page(&s, other, lang).await.text().await.unwrap());
            assert!(n.contains(says) && !n.contains("href"), "{other}: {n}");
        }
    }
}

/// The waiting page carries the event's title (in `<title>` and its heading), headline,
/// note, logo and colour in its HTML, rendered by the server in the browser's language, with
/// every text escaped and the policy widened only by the logo's origin, for images.
#[tokio::test]
async fn the_waiting_page_carries_the_events_look_in_its_html() {
    let s = TestServer::start().await;
    s.put_event(
        "fest",
        json!({"name": "Fest", "title": {"ko": "봄 축제", "en": "<img src=x onerror=alert(1)> Spring"},
               "headline": {"ko": "8시 입장"}, "note": {"en": "Bring ID\n4 per person"},
               "theme_color": "#FFD400", "logo_url": "https://cdn.example.com/logo.png"}),
    )
    .await;
    let r = page(&s, "/wait/fest", "ko-KR,ko;q=0.9").await;
    assert_eq!(r.status(), StatusCode::OK);
    let csp = r.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("img-src 'self' data: https://cdn.example.com;"),
        "{csp}"
    );
    assert!(csp.contains("script-src 'self';") && csp.contains("style-src 'self';"));
    let ko = r.text().await.unwrap();
    assert!(ko.contains("<html lang=\"ko\">"));
    assert!(ko.contains("<title>봄 축제 · 대기실</title>"), "{ko}");
    // Event texts set their own direction (an Arabic title in an English page), and one
    // shown in the other language says so, for a screen reader's voice (defect: no `dir`,
    // and the stand-in English note read by a Korean voice).
    assert!(ko.contains("id=\"event-name\" dir=\"auto\">봄 축제</h1>"));
    assert!(ko.contains("id=\"headline\" dir=\"auto\">8시 입장</p>"));
    // The note has no Korean: the English one stands in.
    assert!(
        ko.contains("id=\"note\" dir=\"auto\" lang=\"en\">Bring ID\n4 per person</p>"),
        "{ko}"
    );
    assert!(ko.contains("src=\"https://cdn.example.com/logo.png\""));
    assert!(ko.contains("<meta name=\"theme-color\" content=\"#ffd400\">"));
    assert!(ko.contains("href=\"/wait/fest/theme.css\""));
    // The stable ids of the contract are still there.
    for id in ["status", "position", "queue-length", "eta", "leave"] {
        assert!(ko.contains(&format!("id=\"{id}\"")), "#{id} missing");
    }

    let en = page(&s, "/wait/fest", "en-US").await.text().await.unwrap();
    assert!(!en.contains("<img src=x"), "markup in a title is escaped");
    assert!(en.contains("<title>&lt;img src=x onerror=alert(1)&gt; Spring · Waiting room</title>"));
    assert!(en.contains("id=\"headline\" dir=\"auto\" lang=\"ko\">8시 입장</p>"));
    assert!(en.contains("id=\"event-name\" dir=\"auto\">&lt;img"));
    // `?lang=` wins over the browser's language, as on the page.
    let asked = page(&s, "/wait/fest?lang=ko", "en-US")
        .await
        .text()
        .await
        .unwrap();
    assert!(asked.contains("<title>봄 축제 · 대기실</title>"));

    // The colour comes as a stylesheet of this origin, with dark text on yellow.
    let css = s
        .http
        .get(s.url("/wait/fest/theme.css"))
        .send()
        .await
        .unwrap();
    assert!(css.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/css"));
    let css = css.text().await.unwrap();
    assert!(
        css.contains("--accent: #ffd400") && css.contains("--accent-text: #111111"),
        "{css}"
    );

    // The public API carries the look for the page's script.
    let (_, info) = s.call(Method::GET, "/api/v1/events/fest", None, None).await;
    assert_eq!(info["title"]["ko"], "봄 축제");
    assert_eq!(info["theme_color"], "#ffd400");

    // An event without a look: the built-in page under the built-in policy; its name is
    // the title.
    s.put_event("plain", json!({"name": "Plain & Simple"}))
        .await;
    let r = page(&s, "/wait/plain", "en").await;
    let csp = r.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.contains("img-src 'self' data:;"), "{csp}");
    let plain = r.text().await.unwrap();
    assert!(plain.contains("<title>Plain &amp; Simple · Waiting room</title>"));
    assert!(!plain.contains("theme.css") && !plain.contains("event-logo"));
}

/// Bad looks are refused with a JSON error naming the field; nothing is stored.
#[tokio::test]
async fn bad_looks_are_refused_with_clear_json_errors() {
    let s = TestServer::start().await;
    s.put_event("fest", json!({"title": {"en": "Kept"}})).await;
    for (body, field) in [
        (json!({"theme_color": "red"}), "theme_color"),
        (json!({"theme_color": "#12345z"}), "theme_color"),
        (json!({"title": {"en": "x".repeat(121)}}), "title.en"),
        (json!({"note": {"ko": "a\u{0}b"}}), "note.ko"),
        (json!({"logo_url": "javascript:alert(1)"}), "logo_url"),
        (
            json!({"logo_url": "http://cdn.example.com/x.png"}),
            "logo_url",
        ),
        (json!({"logo_url": "https://a@b.example/x.png"}), "logo_url"),
        (json!({"logo_url": "/branding/../admin-token"}), "logo_url"),
        (json!({"stylesheet": "../x.css"}), "stylesheet"),
        (json!({"title": {"jp": "x"}}), "title"),
        (json!({"title": "just a string"}), "title"),
        // An array is not read as an object, field by field.
        (json!({"title": ["x"]}), "title"),
        (json!({"headline": ["x", "y"]}), "headline"),
        (json!({"note": []}), "note"),
        (json!({"turn_message": [null]}), "turn_message"),
        (json!({"theme_color": 5}), "theme_color"),
        (json!({"logo_url": []}), "logo_url"),
        (json!({"stylesheet": {"x": 1}}), "stylesheet"),
    ] {
        let (st, v) = s
            .call(
                Method::PUT,
                "/api/v1/admin/events/fest",
                Some(live_support::ADMIN),
                Some(body.clone()),
            )
            .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(v["error"]["code"], "INVALID_REQUEST", "{body}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.starts_with(field), "{body}: {m}");
    }
    let (_, e) = s.call(Method::GET, "/api/v1/events/fest", None, None).await;
    assert_eq!(e["title"], json!({"en": "Kept"}));
    assert_eq!(e["theme_color"], json!(null));
}

/// An unknown event: a browser gets a 404 page that leads back to the start; any other
/// client the JSON error of the API.
#[tokio::test]
async fn an_unknown_event_answers_a_404_page_to_browsers_and_json_to_others() {
    let s = TestServer::start().await;
    let r = page(&s, "/wait/nope", "en").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert!(r.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(r.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .contains("script-src 'self'"));
    let html = r.text().await.unwrap();
    assert!(html.contains("This event does not exist"), "{html}");
    assert!(html.contains("<a class=\"button primary\" id=\"back\" href=\"/\">"));
    let ko = page(&s, "/wait/nope", "ko").await.text().await.unwrap();
    assert!(ko.contains("존재하지 않는 이벤트입니다") && ko.contains("href=\"/\""));
    // The brand in the page's language, as on every other page (defect: "waitroom").
    assert!(ko.contains("<span>대기실</span>"), "{ko}");
    assert!(html.contains("<span>Waiting room</span>"), "{html}");

    let (st, v) = s.call(Method::GET, "/wait/nope", None, None).await;
    assert_eq!(
        (st, &v["error"]["code"]),
        (StatusCode::NOT_FOUND, &json!("EVENT_NOT_FOUND"))
    );
    // An address no event can have (a link broken on its way): the same page for a
    // browser, with the id escaped; the API's 400 for others.
    let r = page(&s, "/wait/a%20%3Cb%3E", "en").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let html = r.text().await.unwrap();
    assert!(html.contains("This event does not exist"), "{html}");
    assert!(!html.contains("<b>"), "{html}");
    let (st, v) = s.call(Method::GET, "/wait/a%20b", None, None).await;
    assert_eq!(
        (st, &v["error"]["code"]),
        (StatusCode::BAD_REQUEST, &json!("INVALID_REQUEST"))
    );
    let (st, _) = s
        .call(Method::GET, "/wait/nope/theme.css", None, None)
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // Once the event exists, the same address is its waiting room.
    s.put_event("nope", json!({})).await;
    assert_eq!(page(&s, "/wait/nope", "en").await.status(), StatusCode::OK);
}

/// Files of the data dir's `branding/` folder: served by name with their type and a policy
/// that runs nothing; no path, hidden file or other type gets out.
#[tokio::test]
async fn branding_files_come_from_the_data_dir_only() {
    let s = TestServer::start().await;
    let dir = s.data_dir().join("branding");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("fest.css"), "h1 { color: red }").unwrap();
    std::fs::write(
        dir.join("logo.svg"),
        "<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>",
    )
    .unwrap();
    std::fs::write(dir.join(".hidden.css"), "x").unwrap();
    std::fs::write(dir.join("notes.txt"), "x").unwrap();
    let r = s
        .http
        .get(s.url("/branding/fest.css"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()[header::CONTENT_TYPE], "text/css; charset=utf-8");
    assert_eq!(r.text().await.unwrap(), "h1 { color: red }");
    let r = s
        .http
        .get(s.url("/branding/logo.svg"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()[header::CONTENT_TYPE], "image/svg+xml");
    let csp = r.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("sandbox"),
        "{csp}"
    );
    assert_eq!(r.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    for path in [
        "/branding/.hidden.css",
        "/branding/notes.txt",
        "/branding/missing.png",
        "/branding/..%2fadmin-token",
        "/branding/..%2f..%2fetc%2fpasswd",
    ] {
        let (st, v) = s.call(Method::GET, path, None, None).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(v["error"]["code"], "NOT_FOUND", "{path}");
    }
    // The event's page links its stylesheet after the built-in one.
    s.put_event(
        "fest",
        json!({"stylesheet": "fest.css", "logo_url": "/branding/logo.svg"}),
    )
    .await;
    let r = page(&s, "/wait/fest", "en").await;
    let csp = r.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("img-src 'self' data:;"),
        "a data-dir logo needs no origin: {csp}"
    );
    let html = r.text().await.unwrap();
    let builtin = html.find("/assets/style.css").unwrap();
    let own = html.find("href=\"/branding/fest.css\"").unwrap();
    assert!(own > builtin);
    assert!(html.contains("src=\"/branding/logo.svg\""));
}

/// The dashboard's form shows the server's defaults, from `GET /admin/defaults`.
#[tokio::test]
async fn the_defaults_of_a_new_event_are_answered() {
    let s = TestServer::start().await;
    let (st, _) = s
        .call(Method::GET, "/api/v1/admin/defaults", None, None)
        .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let (st, d) = s
        .call(
            Method::GET,
            "/api/v1/admin/defaults",
            Some(live_support::ADMIN),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    s.put_event("fresh", json!({})).await;
    let made = s.admin(Method::GET, "/events/fresh").await;
    for k in [
        "max_active",
        "overbooking_ratio",
        "ready_ttl_sec",
        "session_idle_sec",
        "session_max_sec",
        "waiting_idle_sec",
        "admit_per_minute",
        "max_queue_length",
        "paused",
        "accept_joins",
        "pow_difficulty",
        "title",
        "theme_color",
    ] {
        assert_eq!(d[k], made[k], "{k}");
    }
    assert_eq!(d["max_active"], 100);
    assert_eq!(d["user_token_secret_set"], false);
    assert!(d.get("user_token_secret").is_none());
}

/// The files are sent gzipped to a browser that takes it, as they are to one that does
/// not, each with its own tag, and `Vary: Accept-Encoding` so a shared cache keeps them
/// apart (defect: 125 KB of files sent uncompressed to every visitor of a flash crowd).
#[tokio::test]
async fn files_are_sent_gzipped_to_who_takes_it() {
    use std::io::Read as _;
    let s = TestServer::start().await;
    let http = reqwest::Client::new();
    for path in ["/assets/wait.js", "/assets/style.css", "/admin"] {
        let plain = http.get(s.url(path)).send().await.unwrap();
        assert_eq!(plain.status(), StatusCode::OK, "{path}");
        assert!(
            plain.headers().get(header::CONTENT_ENCODING).is_none(),
            "{path}"
        );
        assert_eq!(plain.headers()[header::VARY], "accept-encoding", "{path}");
        let plain_tag = plain.headers()[header::ETAG].clone();
        let plain = plain.bytes().await.unwrap();

        let zipped = http
            .get(s.url(path))
            .header(header::ACCEPT_ENCODING, "gzip, deflate, br")
            .send()
            .await
            .unwrap();
        assert_eq!(zipped.headers()[header::CONTENT_ENCODING], "gzip", "{path}");
        assert_eq!(zipped.headers()[header::VARY], "accept-encoding", "{path}");
        let tag = zipped.headers()[header::ETAG].clone();
        assert_ne!(tag, plain_tag, "{path}");
        let body = zipped.bytes().await.unwrap();
        assert!(
            body.len() * 2 < plain.len(),
            "{path}: {} of {}",
            body.len(),
            plain.len()
        );
        let mut unzipped = Vec::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_end(&mut unzipped)
            .unwrap();
        assert_eq!(unzipped, plain, "{path}");

        // Each tag revalidates its own representation only.
        let again = |tag: reqwest::header::HeaderValue, gzip: bool| {
            let mut r = http.get(s.url(path)).header(header::IF_NONE_MATCH, tag);
            if gzip {
                r = r.header(header::ACCEPT_ENCODING, "gzip");
            }
            r.send()
        };
        assert_eq!(
            again(tag.clone(), true).await.unwrap().status(),
            StatusCode::NOT_MODIFIED
        );
        assert_eq!(again(tag, false).await.unwrap().status(), StatusCode::OK);
    }
}

/// The script-free waiting room of a gated event (`/wait/{id}/queue`, gateway mode's page)
/// speaks the browser's language as the waiting page does (`?lang=`, else `Accept-Language`
/// by `q`), with the event's title, headline and note in it, and so does its refusal once
/// the sale ended, with the operator's message (defect: always English, no headline or
/// note).
#[tokio::test]
async fn the_gate_page_speaks_the_browsers_language() {
    let s = TestServer::start().await;
    s.put_event(
        "shop",
        json!({"name": "Shop", "max_active": 1, "paths": ["/checkout"],
               "title": {"ko": "봄 세일", "en": "Spring sale"},
               "headline": {"ko": "10시 오픈", "en": "Opens at 10"},
               "note": {"en": "Two per person"}}),
    )
    .await;
    s.join_token("shop", "holder").await;
    let room = "/wait/shop/queue?return=%2Fcheckout";
    let gate = |path: String, lang: &'static str| {
        let http = s.http.clone();
        let url = s.url(&path);
        async move {
            let r = http
                .get(url)
                .header(header::ACCEPT, "text/html,application/xhtml+xml,*/*;q=0.8")
                .header(header::ACCEPT_LANGUAGE, lang)
                .send()
                .await
                .unwrap();
            (r.status(), r.text().await.unwrap())
        }
    };
    let (st, ko) = gate(room.to_string(), "fr;q=1, ko-KR;q=0.8, en;q=0.5").await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{ko}");
    assert!(ko.contains("<html lang=\"ko\">"), "{ko}");
    assert!(ko.contains("<title>봄 세일: 대기실</title>"), "{ko}");
    assert!(
        ko.contains("<h1 dir=\"auto\">봄 세일</h1>") && ko.contains("나의 대기 순서"),
        "{ko}"
    );
    assert!(ko.contains(" dir=\"auto\">10시 오픈</p>"), "{ko}");
    // No Korean note: the English one stands in, as on the waiting page, marked as English
    // so a screen reader speaks it so (defect: it was read with Korean rules).
    assert!(
        ko.contains(" dir=\"auto\" lang=\"en\">Two per person</p>"),
        "{ko}"
    );
    assert!(!ko.contains("Your place in line"), "{ko}");

    let (_, en) = gate(room.to_string(), "ko;q=0, en").await;
    assert!(en.contains("<html lang=\"en\">") && en.contains("<h1 dir=\"auto\">Spring sale</h1>"));
    assert!(en.contains("Your place in line") && en.contains(">Opens at 10</p>"));
    let (_, asked) = gate(format!("{room}&lang=ko"), "en-US").await;
    assert!(asked.contains("<html lang=\"ko\">"), "?lang= wins: {asked}");

    let (st, v) = s
        .call(
            Method::POST,
            "/api/v1/admin/events/shop/end",
            Some(live_support::ADMIN),
            Some(json!({"reason": "sold_out",
                        "message": {"ko": "환불 안내는 메일로", "en": "Refunds by mail"}})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, ko) = gate(room.to_string(), "ko-KR,ko;q=0.9").await;
    assert!(ko.contains("<html lang=\"ko\">"), "{ko}");
    assert!(
        ko.contains("매진되었습니다") && ko.contains("환불 안내는 메일로"),
        "{ko}"
    );
    assert!(ko.contains("<h1 dir=\"auto\">봄 세일</h1>"), "{ko}");
    // Reloading an ended sale changes nothing: its page does not reload itself.
    assert!(!ko.contains("http-equiv=\"refresh\""), "{ko}");
    assert!(
        ko.contains("id=\"waitroom-message\" dir=\"auto\">환불 안내는 메일로</p>"),
        "{ko}"
    );
    let (_, en) = gate(room.to_string(), "en").await;
    assert!(
        en.contains("Sold out") && en.contains("Refunds by mail"),
        "{en}"
    );
    // An operator's message in one language only stands in on the other's page, marked
    // with its own (defect: read with the page's language rules).
    s.put_event("mono", json!({"name": "Mono", "paths": ["/mono"]}))
        .await;
    let (st, v) = s
        .call(
            Method::POST,
            "/api/v1/admin/events/mono/end",
            Some(live_support::ADMIN),
            Some(json!({"reason": "closed", "message": {"en": "See you next year"}})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, ko) = gate("/wait/mono/queue".to_string(), "ko-KR").await;
    assert!(
        ko.contains("id=\"waitroom-message\" dir=\"auto\" lang=\"en\">See you next year</p>"),
        "{ko}"
    );
}

/// An event's colour is drawn as text, ring and bar in an "ink" that reads on each colour
/// scheme's page (defect: a light yellow was the position's colour on the light page,
/// 1.16:1), while its buttons keep the colour itself.
#[tokio::test]
async fn the_theme_gives_a_readable_ink_per_colour_scheme() {
    let s = TestServer::start().await;
    s.put_event("sun", json!({"theme_color": "#ffee00"})).await;
    s.put_event("navy", json!({"theme_color": "#1a237e"})).await;
    let css = |id: &'static str| {
        let http = s.http.clone();
        let url = s.url(&format!("/wait/{id}/theme.css"));
        async move { http.get(url).send().await.unwrap().text().await.unwrap() }
    };
    let ink = |css: &str, scheme: usize| {
        let part = css.split("@media").nth(scheme).unwrap().to_string();
        let at = part.find("--accent-ink: ").expect("an ink") + "--accent-ink: ".len();
        part[at..at + 7].to_string()
    };
    let sun = css("sun").await;
    assert!(sun.contains("--accent: #ffee00"), "{sun}");
    assert_ne!(ink(&sun, 0), "#ffee00", "darkened on the light page: {sun}");
    assert_eq!(ink(&sun, 1), "#ffee00", "readable on the dark page: {sun}");
    let navy = css("navy").await;
    assert_eq!(ink(&navy, 0), "#1a237e", "{navy}");
    assert_ne!(
        ink(&navy, 1),
        "#1a237e",
        "lightened on the dark page: {navy}"
    );
    // The stylesheet draws text, ring and bar in the ink, buttons in the colour.
    let style = s
        .http
        .get(s.url("/assets/style.css"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for rule in [
        // The label on the colour's tint, and a held seat (defects: the muted grey read at
        // 3.95:1 on a yellow's tint, white on the dark scheme's seat at 2.59:1).
        ".position-block .label { color: var(--accent-ink);",
        ".seat.mine, .seat-key.mine { background: var(--accent); border-color: var(--accent); color: var(--accent-text); }",
        "a { color: var(--accent-ink); }",
        ":focus-visible { outline: 3px solid var(--accent-ink);",
        "color: var(--accent-ink); font-variant-numeric: tabular-nums;",
        "border-radius: 999px; background: var(--accent-ink);",
        ".button.primary { background: var(--accent);",
    ] {
        assert!(style.contains(rule), "{rule}");
    }
}

/// With no basis for an estimate (`eta_low_sec`/`eta_high_sec` null: no session has ended
/// yet), the gate page says it does not know the wait, as the waiting page does (defect:
/// "Estimated wait: about a minute.", from `eta_sec` alone).
#[tokio::test]
async fn the_gate_page_says_when_it_does_not_know_the_wait() {
    let s = TestServer::start().await;
    s.put_event("shop", json!({"max_active": 1, "paths": ["/checkout"]}))
        .await;
    s.join_token("shop", "holder").await;
    let path = "/wait/shop/queue?return=%2Fcheckout";
    let room = s.url(path);
    let r = s
        .http
        .get(&room)
        .header(header::ACCEPT, "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let place: serde_json::Value = r.json().await.unwrap();
    assert!(
        place["eta_low_sec"].is_null() && place["eta_high_sec"].is_null(),
        "{place}"
    );
    for (lang, says) in [
        ("en", "Estimated wait: we don't know yet."),
        ("ko", "예상 대기 시간: 아직 알 수 없습니다."),
    ] {
        let html = page(&s, path, lang).await.text().await.unwrap();
        assert!(
            html.contains(&format!("<p id=\"waitroom-wait\">{says}</p>")),
            "{html}"
        );
    }
}

/// The operator's announcement, the pause and the end of the sale sit in polite live
/// regions that are never hidden themselves (a hidden region is not in the accessibility
/// tree, and its change would go unheard).
#[tokio::test]
async fn the_waiting_page_has_live_regions_for_the_operators_words() {
    let s = TestServer::start().await;
    s.put_event("fest", json!({})).await;
    let html = page(&s, "/wait/fest", "en").await.text().await.unwrap();
    for id in ["announcement", "end-note", "paused"] {
        // The element's parent: the last tag opened before the element's own.
        let at = html.find(&format!("id=\"{id}\"")).unwrap();
        let own = html[..at].rfind('<').unwrap();
        let parent = html[..own].rfind('<').unwrap();
        let slot = &html[parent..own];
        assert!(
            slot.starts_with("<div")
                && slot.contains("aria-live=\"polite\"")
                && !slot.contains("hidden"),
            "#{id} in {slot}"
        );
    }
}

/// The waiting page's own words are in its language in the HTML itself, so a page without
/// scripts is not half English, and the status line, which only the script keeps, is
/// hidden without it rather than claiming to join (defect: "Waiting room", "Joining the
/// line…" and the labels in English on the Korean page).
#[tokio::test]
async fn the_korean_page_reads_in_korean_without_scripts() {
    let s = TestServer::start().await;
    s.put_event("fest", json!({})).await;
    let ko = page(&s, "/wait/fest", "ko-KR,ko;q=0.9")
        .await
        .text()
        .await
        .unwrap();
    for said in [
        "data-i18n=\"brand\">대기실<",
        "data-i18n=\"yourPosition\">나의 대기 순서<",
        "data-i18n=\"inLine\">대기 인원<",
        "data-i18n=\"eta\">예상 대기 시간<",
        "aria-label=\"대기 진행률\"",
        "data-i18n=\"leave\">대기열 나가기<",
        "<div role=\"status\"><h2 class=\"status needs-js\" id=\"status\" tabindex=\"-1\">대기열에 들어가는 중…<",
        ">English</button>",
    ] {
        assert!(ko.contains(said), "{said}");
    }
    for english in [
        "Waiting room",
        "Joining the line",
        "Your place in line",
        "People in line",
    ] {
        assert!(!ko.contains(english), "{english}");
    }
    let en = page(&s, "/wait/fest", "en").await.text().await.unwrap();
    assert!(en.contains("data-i18n=\"yourPosition\">Your place in line<"));
    assert!(en.contains("class=\"lang needs-js\"") && en.contains(">한국어</button>"));
    let css = s
        .http
        .get(s.url("/assets/style.css"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(css.contains("html:not(.js) .needs-js { display: none !important; }"));
    let js = s
        .http
        .get(s.url("/assets/common.js"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(js.contains("document.documentElement.classList.add('js');"));
}

/// What assistive technology reads of the served pages' markup: no heading carries a role
/// (a role replaces the heading, and heading navigation no longer finds it: the waiting
/// page's status line and the booking page's title were `<h2 role="status">` and
/// `<h1 role="status">`), and the language button's accessible name holds its visible
/// word as a word of its own (a voice-control user says what the button shows; "한국어로
/// 보기" did not hold "한국어").
#[tokio::test]
async fn headings_stay_headings_and_the_language_button_says_what_it_shows() {
    let s = TestServer::start().await;
    s.put_event("fest", json!({})).await;
    for (path, lang) in [
        ("/wait/fest", "en"),
        ("/wait/fest", "ko"),
        ("/demo/booking?event=fest", "en"),
        ("/admin", "en"),
        ("/", "en"),
    ] {
        let r = page(&s, path, lang).await;
        let status = r.status();
        let body = r.text().await.unwrap();
        assert!(status.is_success(), "{path}: {status}");
        for level in 1..=6 {
            for tag in body.split(&format!("<h{level}")).skip(1) {
                let open = &tag[..tag.find('>').unwrap()];
                assert!(!open.contains("role="), "{path}: <h{level}{open}>");
            }
        }
        if let Some(at) = body.find("id=\"lang\"") {
            let button = &body[at..body[at..].find("</button>").unwrap() + at];
            let shown = &button[button.rfind('>').unwrap() + 1..];
            // Without a label of its own, the button is named by what it shows.
            let label = button.split("aria-label=\"").nth(1).unwrap_or(shown);
            let label = label.split('"').next().unwrap();
            assert!(
                label.split(' ').any(|w| w == shown),
                "{path} ({lang}): \"{shown}\" is not a word of \"{label}\""
            );
        }
    }
    // The script sets the same names after a switch.
    let common = text_of(&s, "/assets/common.js").await;
    assert!(
        common.contains("'Switch to English' : '한국어 보기'"),
        "common.js names the button as the page does"
    );
}

/// The body of `path`, fetched as a browser would, as text.
async fn text_of(s: &TestServer, path: &str) -> String {
    reqwest::get(s.url(path))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The script-free page in the pre-queue says when the line opens, as the JSON does
/// (`opens_in_sec`), rather than "we don't know yet" (defect).
#[tokio::test]
async fn the_gate_page_says_when_the_line_opens() {
    let s = TestServer::start().await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let opens = waitroom::core::schedule::format_rfc3339(now + 2 * 3600 * 1000 + 30_000);
    s.put_event("pre", json!({"paths": ["/pre"], "opens_at": opens}))
        .await;
    let path = "/wait/pre/queue?return=%2Fpre";
    for (lang, says) in [
        (
            "en",
            "<p id=\"waitroom-wait\">The line opens in 2 h 1 min.</p>",
        ),
        (
            "ko",
            "<p id=\"waitroom-wait\">2시간 1분 후에 대기열이 열립니다.</p>",
        ),
    ] {
        let html = page(&s, path, lang).await.text().await.unwrap();
        assert!(html.contains(says), "{html}");
        assert!(
            html.contains("The sale opens soon") || html.contains("곧 예매가 시작됩니다"),
            "{html}"
        );
    }
}

/// WCAG contrast of two `#rrggbb` colours.
fn contrast(a: &str, b: &str) -> f64 {
    let lum = |h: &str| {
        let c: Vec<f64> = [1, 3, 5]
            .iter()
            .map(|&i| {
                let v = f64::from(u8::from_str_radix(&h[i..i + 2], 16).unwrap()) / 255.0;
                if v <= 0.03928 {
                    v / 12.92
                } else {
                    ((v + 0.055) / 1.055).powf(2.4)
                }
            })
            .collect();
        0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]
    };
    let (x, y) = (lum(a), lum(b));
    (x.max(y) + 0.05) / (x.min(y) + 0.05)
}

/// The dashboard's status pills (small text on their tint) read at 4.5:1 in both colour
/// schemes (defect: "Admitting" was 4.39:1 in the light one).
#[tokio::test]
async fn the_status_pills_read_in_both_colour_schemes() {
    let s = TestServer::start().await;
    let style = text_of(&s, "/assets/style.css").await;
    for (scheme, part) in style
        .split("@media (prefers-color-scheme: dark)")
        .take(2)
        .enumerate()
    {
        let var = |name: &str| {
            let at = part.find(&format!("{name}: #")).expect(name) + name.len() + 2;
            part[at..at + 7].to_string()
        };
        for (fg, bg) in [
            ("--ok", "--ok-soft"),
            ("--warn", "--warn-soft"),
            ("--danger", "--danger-soft"),
            ("--muted", "--line"),
        ] {
            let c = contrast(&var(fg), &var(bg));
            assert!(c >= 4.5, "scheme {scheme}: {fg} on {bg} is {c:.2}:1");
        }
    }
}

/// Without scripts, the landing page, the booking page and the dashboard say they need
/// them, and hide the language button that only the script makes work, as the waiting page
/// does (defect: they showed an empty list, "Checking your access…" forever, or a bare
/// header, and an inert button).
#[tokio::test]
async fn the_other_pages_without_scripts_say_so() {
    let s = TestServer::start().await;
    for path in ["/", "/demo/booking", "/admin"] {
        let html = text_of(&s, path).await;
        assert!(
            html.contains("<noscript><p class=\"notice\">This page needs JavaScript"),
            "{path}"
        );
        assert!(
            html.contains("id=\"lang\" class=\"lang needs-js\""),
            "{path}"
        );
    }
}
