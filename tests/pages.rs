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
            let body = r.text().await.unwrap();
            assert!(body.starts_with("<!doctype html>"), "{path}");
            assert!(!body.contains("<script>"), "no inline script in {path}");
        }
        // Revalidation is cheap.
        let r = http
            .get(s.url(path))
            .header(header::IF_NONE_MATCH, etag)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_MODIFIED, "{path}");
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
            "target_url": "/demo/booking", "waiting_idle_sec": 90,
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
    let js = reqwest::get(s.url("/assets/booking.js"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
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
