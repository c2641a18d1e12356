//! The pages in a real browser: Debian's `chromium`, headless, driven through `chromedriver`
//! with the WebDriver client `fantoccini`, against a real server started in-process.
//!
//! Covered: joining from the waiting page and seeing the position; a reload keeping the
//! place; the Leave button; an admitted person entering, landing on the demo booking page
//! and completing; the dashboard showing events with live figures, and pausing one; the
//! Korean page (browser language) and the language switch. The tests also take the
//! screenshots shown in the README, into `target/screenshots/` (tests never change tracked
//! files; copy them to `docs/` by hand to refresh the README's pictures).
//!
//! `./scripts/test.sh` installs `chromium` and `chromium-driver` when missing. If they are
//! missing or cannot start, these tests **fail** (they never pass silently without a browser).
//! Browser sessions run one at a time (a lock), each with a fresh profile directory: two
//! chromiums on a 2-core machine would only make each other slow.

use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use reqwest::Method;
use serde_json::{json, Map, Value};

mod live_support;
use live_support::{TestServer, ADMIN};

const CHROMIUM: &str = "/usr/bin/chromium";
/// Long enough for a debug-build server on a busy 2-core machine; every wait polls.
const WAIT: Duration = Duration::from_secs(20);

/// One browser at a time, across the tests of this binary.
static BROWSER_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A chromedriver process and one browser session; both end on drop.
struct Browser {
    client: Option<Client>,
    _driver: Driver,
    _profile: tempfile::TempDir,
}

/// The chromedriver child, killed and reaped on drop (also when a test panics), with the
/// browser it started: a panicking test never closes its session, and chromium would
/// outlive a killed chromedriver. The browser is found by its own profile directory and
/// ended by process id.
struct Driver {
    child: Child,
    profile: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let marker = format!("--user-data-dir={}", self.profile);
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return;
        };
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
            if cmdline
                .split(|b| *b == 0)
                .any(|arg| arg == marker.as_bytes())
            {
                let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            }
        }
    }
}

/// Browser settings per test.
struct Opts {
    /// `Accept-Language` / `navigator.language`.
    lang: &'static str,
    width: u32,
    height: u32,
    scale: f32,
}

const PHONE: Opts = Opts {
    lang: "en-US",
    width: 390,
    height: 844,
    scale: 2.0,
};

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(cmd))
            .find(|p| p.is_file())
    })
}

impl Browser {
    async fn start(opts: &Opts) -> Browser {
        let driver_bin = which("chromedriver").unwrap_or_else(|| {
            panic!(
                "chromedriver is not installed: the browser tests need Debian's `chromium` and \
                 `chromium-driver` (./scripts/test.sh installs them)"
            )
        });
        assert!(
            std::path::Path::new(CHROMIUM).is_file(),
            "{CHROMIUM} is not installed: the browser tests need Debian's `chromium` \
             (./scripts/test.sh installs it)"
        );
        let port = free_port();
        let profile = tempfile::tempdir().unwrap();
        let driver = Driver {
            child: Command::new(driver_bin)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chromedriver starts"),
            profile: profile.path().display().to_string(),
        };
        let args = vec![
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            "--hide-scrollbars".into(),
            format!("--user-data-dir={}", profile.path().display()),
            format!("--window-size={},{}", opts.width, opts.height),
            format!("--force-device-scale-factor={}", opts.scale),
            format!("--lang={}", opts.lang),
        ];
        let mut caps = Map::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": args,
                "prefs": {"intl": {"accept_languages": opts.lang}},
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let mut last_err = String::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut builder =
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new());
        builder.capabilities(caps);
        while Instant::now() < deadline {
            match builder.connect(&url).await {
                Ok(client) => {
                    // `--window-size` is not always honoured in headless mode; this is.
                    client
                        .set_window_size(opts.width, opts.height)
                        .await
                        .expect("the window can be sized");
                    return Browser {
                        client: Some(client),
                        _driver: driver,
                        _profile: profile,
                    };
                }
                Err(e) => last_err = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("chromium could not be started through chromedriver: {last_err}");
    }

    fn c(&self) -> &Client {
        self.client.as_ref().unwrap()
    }

    async fn goto(&self, url: &str) {
        self.c().goto(url).await.unwrap();
    }

    /// The element's text once `pred` holds for it; panics with the last text after [`WAIT`].
    async fn text_until(&self, css: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        let mut last = String::from("(no element)");
        while Instant::now() < deadline {
            if let Ok(e) = self.c().find(Locator::Css(css)).await {
                if let Ok(t) = e.text().await {
                    if pred(&t) {
                        return t;
                    }
                    last = t;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{css}: condition not met within {WAIT:?}; last text {last:?}");
    }

    async fn visible(&self, css: &str) -> bool {
        match self.c().find(Locator::Css(css)).await {
            Ok(e) => e.is_displayed().await.unwrap_or(false),
            Err(_) => false,
        }
    }

    async fn until_visible(&self, css: &str) {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if self.visible(css).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{css} did not become visible within {WAIT:?}");
    }

    async fn click(&self, css: &str) {
        self.c()
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .click()
            .await
            .unwrap();
    }

    async fn js(&self, script: &str) -> Value {
        self.c().execute(script, vec![]).await.unwrap()
    }

    async fn url(&self) -> String {
        self.c().current_url().await.unwrap().to_string()
    }

    /// Saves a screenshot into `target/screenshots/`.
    async fn screenshot(&self, name: &str) {
        let png = self.c().screenshot().await.unwrap();
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), png).unwrap();
    }

    async fn close(mut self) {
        if let Some(c) = self.client.take() {
            let _ = c.close().await;
        }
    }
}

/// Polls the server until `pred` holds for the event's admin figures.
async fn figures_until(s: &TestServer, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let f = s.figures(id).await;
        if pred(&f) {
            return f;
        }
        assert!(
            Instant::now() < deadline,
            "figures of {id} never matched: {f}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An event whose one slot is held by `holder` (admitted, not entering), so that people
/// joining from the page wait at position 1, 2, …
async fn one_slot_event(s: &TestServer, id: &str, extra: Value) -> String {
    let mut config = json!({"name": "Summer Festival", "max_active": 1, "ready_ttl_sec": 120});
    config
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    s.put_event(id, config).await;
    let h = s.join(id, "holder").await;
    assert_eq!(h["status"], "admitted");
    h["waiting_token"].as_str().unwrap().to_string()
}

async fn stored_token(b: &Browser, event: &str) -> Option<String> {
    let v = b
        .js(&format!(
            "const p = localStorage.getItem('waitroom:place:{event}'); \
             return p ? JSON.parse(p).token : null;"
        ))
        .await;
    v.as_str().map(str::to_string)
}

#[tokio::test]
async fn join_from_the_page_reload_keeps_the_place_then_leave() {
    let _one = BROWSER_LOCK.lock().await;
    let s = TestServer::start().await;
    one_slot_event(&s, "fest", json!({})).await;
    s.join_token("fest", "ahead").await;
    let b = Browser::start(&PHONE).await;

    b.goto(&s.url("/wait/fest")).await;
    b.text_until("#position", |t| t == "2").await;
    assert_eq!(b.text_until("#queue-length", |t| t == "2").await, "2");
    assert_eq!(
        b.text_until("#status", |t| !t.is_empty()).await,
        "You are in line"
    );
    assert!(!b.text_until("#eta", |t| t != "–").await.is_empty());
    assert!(b.visible("#leave").await);
    // Live over the WebSocket, not polling.
    b.text_until("#live-text", |t| t == "Live updates").await;
    let token = stored_token(&b, "fest")
        .await
        .expect("the place is kept in localStorage");
    assert_eq!(s.figures("fest").await["waiting"], 2);

    // Pushed: the person ahead leaves, the page moves up without a reload.
    let ahead = s.join_token("fest", "ahead").await; // idempotent: the same place
    s.leave(&ahead).await;
    b.text_until("#position", |t| t == "1").await;

    // A reload resumes the same place, never a second one.
    b.c().refresh().await.unwrap();
    b.text_until("#position", |t| t == "1").await;
    assert_eq!(
        stored_token(&b, "fest").await.as_deref(),
        Some(token.as_str())
    );
    assert_eq!(s.figures("fest").await["waiting"], 1, "one place, not two");

    // Leave gives the place up at once (by beacon) and offers to join again.
    b.click("#leave").await;
    b.text_until("#status", |t| t == "You left the line").await;
    assert!(b.visible("#join").await);
    assert!(!b.visible("#leave").await);
    figures_until(&s, "fest", |f| f["waiting"] == 0 && f["left"] == 2).await;
    assert_eq!(stored_token(&b, "fest").await, None);
    let (st, _) = s.status(&token).await;
    assert_eq!(st, 404);

    // And joining again puts the person at the back of the line.
    b.click("#join").await;
    b.text_until("#position", |t| t == "1").await;
    b.close().await;
}

#[tokio::test]
async fn admitted_person_enters_books_on_the_demo_page_and_completes() {
    let _one = BROWSER_LOCK.lock().await;
    let s = TestServer::start().await;
    let holder = one_slot_event(
        &s,
        "fest",
        json!({"target_url": "/demo/booking?event=fest"}),
    )
    .await;
    let b = Browser::start(&PHONE).await;

    b.goto(&s.url("/wait/fest")).await;
    b.text_until("#position", |t| t == "1").await;
    b.text_until("#live-text", |t| t == "Live updates").await;

    // The slot frees: the page is told, enters, and forwards with the access token.
    s.leave(&holder).await;
    b.text_until("#booking-status", |t| t == "Choose your seats")
        .await;
    let url = b.url().await;
    assert!(url.contains("/demo/booking"), "{url}");
    assert!(
        !url.contains("waitroom_token"),
        "the token is taken out of the address: {url}"
    );
    assert!(b.visible("#verified").await);
    figures_until(&s, "fest", |f| f["active"] == 1).await;

    b.click("#complete").await;
    b.text_until("#booking-status", |t| t == "Booking complete")
        .await;
    assert!(b.visible("#done").await);
    figures_until(&s, "fest", |f| f["active"] == 0 && f["completed"] == 1).await;

    // The way back leads to the event's waiting room, where the finished place is forgotten.
    let back = b
        .js("return document.getElementById('back').getAttribute('href')")
        .await;
    assert_eq!(back, "/wait/fest");
    assert_eq!(stored_token(&b, "fest").await, None);
    b.close().await;
}

#[tokio::test]
async fn the_korean_page_and_the_language_switch() {
    let _one = BROWSER_LOCK.lock().await;
    let s = TestServer::start().await;
    // A busy line for the screenshots, moving at 30 admissions a minute (so positions and
    // the estimated wait are those of a real sale: they change while the test runs).
    s.put_event(
        "concert",
        json!({"name": "Seoul Spring Concert 2026", "max_active": 500, "admit_per_minute": 30,
               "ready_ttl_sec": 120, "target_url": "/demo/booking"}),
    )
    .await;
    let mut ahead = Vec::new();
    for i in 0..140 {
        ahead.push(s.join_token("concert", &format!("ahead-{i}")).await);
    }

    let ko = Opts {
        lang: "ko-KR",
        ..PHONE
    };
    let b = Browser::start(&ko).await;
    b.goto(&s.url("/wait/concert")).await;
    let number = |t: &str| t.replace(',', "").parse::<u64>().unwrap_or(0);
    let start = number(&b.text_until("#position", |t| number(t) > 100).await);
    assert_eq!(
        b.text_until("#status", |t| !t.is_empty()).await,
        "대기 중입니다"
    );
    assert_eq!(b.js("return document.documentElement.lang").await, "ko");
    assert_eq!(b.js("return navigator.language").await, "ko-KR");
    let eta = b.text_until("#eta", |t| t != "–").await;
    assert!(eta.contains('분'), "{eta}");
    assert_eq!(b.text_until("#lang", |t| !t.is_empty()).await, "English");

    // People behind join and some ahead leave: the page follows, and the progress moves.
    for i in 0..260 {
        s.join_token("concert", &format!("behind-{i}")).await;
    }
    for t in ahead.iter().rev().take(31) {
        s.leave(t).await;
    }
    b.text_until("#position", |t| number(t) <= start - 31).await;
    b.text_until("#queue-length", |t| number(t) > 300).await;
    b.text_until("#live-text", |t| t == "실시간 업데이트 중")
        .await;
    tokio::time::sleep(Duration::from_millis(900)).await; // the progress bar's transition
    b.screenshot("screenshot-wait-ko.png").await;

    // Switching to English is remembered across a reload.
    b.click("#lang").await;
    b.text_until("#status", |t| t == "You are in line").await;
    assert_eq!(b.js("return document.documentElement.lang").await, "en");
    b.c().refresh().await.unwrap();
    b.text_until("#status", |t| t == "You are in line").await;
    b.text_until("#position", |t| number(t) <= start - 31).await;
    b.text_until("#live-text", |t| t == "Live updates").await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    b.screenshot("screenshot-wait-en.png").await;
    b.close().await;
}

#[tokio::test]
async fn dashboard_shows_events_with_live_figures_and_pause_works() {
    let _one = BROWSER_LOCK.lock().await;
    // The demo event's simulated crowd gives the charts something to draw.
    let s = TestServer::start_with(true).await;
    s.put_event(
        "concert",
        json!({"name": "Seoul Spring Concert 2026", "max_active": 20}),
    )
    .await;
    for i in 0..20 {
        s.join_token("concert", &format!("inside-{i}")).await;
    }
    for i in 0..48 {
        s.join_token("concert", &format!("wait-{i}")).await;
    }
    let desktop = Opts {
        lang: "en-US",
        width: 1280,
        height: 1500,
        scale: 1.0,
    };
    let b = Browser::start(&desktop).await;

    // Sign-in: a wrong token is refused, the right one opens the dashboard.
    b.goto(&s.url("/admin")).await;
    b.until_visible("#admin-token").await;
    let input = b.c().find(Locator::Css("#admin-token")).await.unwrap();
    input.send_keys("wrong").await.unwrap();
    b.click("#login-button").await;
    b.text_until("#login-error", |t| t == "This token was refused.")
        .await;
    input.clear().await.unwrap();
    input.send_keys(ADMIN).await.unwrap();
    b.click("#login-button").await;
    b.until_visible("#dash").await;

    let concert = "[data-event=\"concert\"]";
    b.text_until(&format!("{concert} h2"), |t| {
        t.starts_with("Seoul Spring Concert 2026")
    })
    .await;
    b.text_until(&format!("{concert} .fig-waiting"), |t| t == "48")
        .await;
    b.text_until(&format!("{concert} .fig-active"), |t| t == "0")
        .await;
    b.text_until("[data-event=\"demo\"] h2", |t| {
        t.starts_with("Demo concert")
    })
    .await;

    // Figures are live: a change on the server shows within a poll or two.
    s.join_token("concert", "late").await;
    b.text_until(&format!("{concert} .fig-waiting"), |t| t == "49")
        .await;

    // Pause the demo: the server stops admitting and the card says so.
    let demo = "[data-event=\"demo\"]";
    b.text_until(&format!("{demo} .pause"), |t| t == "Pause")
        .await;
    b.click(&format!("{demo} .pause")).await;
    b.text_until(&format!("{demo} .pill"), |t| t == "Paused")
        .await;
    b.text_until(&format!("{demo} .pause"), |t| t == "Resume")
        .await;
    let (_, info) = s
        .call(Method::GET, "/api/v1/queue/info?event_id=demo", None, None)
        .await;
    assert_eq!(info["paused"], true, "{info}");

    // Let the charts collect a few samples of the crowd, then take the picture.
    b.click(&format!("{demo} .pause")).await;
    b.text_until(&format!("{demo} .pill"), |t| t == "Admitting")
        .await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let points = b
        .js("return document.querySelectorAll('[data-event=\"demo\"] svg path.line').length")
        .await;
    assert_eq!(points, 2, "both charts of the demo event are drawn");
    b.js("window.scrollTo(0, 0)").await;
    b.screenshot("screenshot-admin.png").await;

    // Clear needs two clicks; then the line is empty.
    b.click(&format!("{concert} .clear")).await;
    b.text_until(&format!("{concert} .clear"), |t| t.starts_with("Confirm"))
        .await;
    b.click(&format!("{concert} .clear")).await;
    figures_until(&s, "concert", |f| f["waiting"] == 0).await;
    b.text_until(&format!("{concert} .fig-waiting"), |t| t == "0")
        .await;

    // Create an event from the form.
    b.click("#editor summary").await;
    b.c()
        .find(Locator::Css("#f-event_id"))
        .await
        .unwrap()
        .send_keys("made-in-ui")
        .await
        .unwrap();
    b.c()
        .find(Locator::Css("#f-max_active"))
        .await
        .unwrap()
        .send_keys("7")
        .await
        .unwrap();
    b.click("#save").await;
    b.text_until("[data-event=\"made-in-ui\"] .fig-capacity", |t| t == "7")
        .await;
    b.close().await;
}

/// A booking site links a signed-in person to the queue with a user token and an invite
/// code in the URL: the page joins as that user with that code. A used code, linked again
/// for someone else, is refused with a clear message.
#[tokio::test]
async fn the_page_joins_with_a_user_token_and_an_invite_from_its_link() {
    let _one = BROWSER_LOCK.lock().await;
    let s = TestServer::start().await;
    let secret = "the-booking-site-secret-of-32-bytes-at-least";
    s.put_event(
        "vip",
        json!({"max_active": 1, "access": "invite", "user_token_secret": secret}),
    )
    .await;
    let (st, made) = s
        .call(
            Method::POST,
            "/api/v1/admin/events/vip/invites",
            Some(ADMIN),
            Some(json!({"count": 1})),
        )
        .await;
    assert_eq!(st, reqwest::StatusCode::OK, "{made}");
    let code = made["codes"][0].as_str().unwrap().to_string();
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({"sub": "member-7", "aud": "vip", "exp": exp}),
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap();
    let b = Browser::start(&PHONE).await;
    b.goto(&s.url(&format!("/wait/vip?user_token={token}&invite={code}")))
        .await;
    b.text_until("#status", |t| t == "It is your turn!" || t == "You are in")
        .await;
    let head = s.admin(Method::GET, "/events/vip").await;
    assert_eq!(
        head["admitted"].as_u64().unwrap() + head["active"].as_u64().unwrap(),
        1
    );
    b.close().await;
    // The same code in another person's browser (a fresh profile) is refused.
    let other = Browser::start(&PHONE).await;
    other
        .goto(&s.url(&format!("/wait/vip?invite={code}")))
        .await;
    other
        .text_until("#status", |t| t == "This link does not let you in")
        .await;
    assert!(!other.visible("#join").await);
    other.close().await;
}

#[tokio::test]
async fn the_page_does_the_proof_of_work_and_gets_a_place() {
    let _one = BROWSER_LOCK.lock().await;
    let s = TestServer::start().await;
    // The slot is taken before the event asks for work, so the page's person waits at 1.
    one_slot_event(&s, "fest", json!({})).await;
    s.put_event("fest", json!({"pow_difficulty": 10})).await;
    s.put_event("hard", json!({"name": "Hard", "pow_difficulty": 28}))
        .await;
    let b = Browser::start(&PHONE).await;

    // At the highest difficulty the work takes long: the page says what it is doing and
    // counts the hashes (from its worker: the strict CSP allows our own worker script).
    b.goto(&s.url("/wait/hard")).await;
    b.text_until("#status", |t| t == "Checking your browser…")
        .await;
    b.text_until("#message", |t| {
        t.contains("hashes so far") && !t.contains("(0 ")
    })
    .await;
    assert_eq!(s.figures("hard").await["waiting"], 0);

    // At a small difficulty the person is in line after a moment.
    b.goto(&s.url("/wait/fest")).await;
    b.text_until("#position", |t| t == "1").await;
    b.text_until("#status", |t| t == "You are in line").await;
    assert_eq!(s.figures("fest").await["waiting"], 1);
    b.close().await;
}

/// An operator who opens (or reloads) the dashboard mid-sale sees the past at once: the
/// charts start from the server's history, not from the page's own first poll, and the
/// recent admin changes are listed.
#[tokio::test]
async fn the_charts_show_the_server_history_right_after_a_reload() {
    let _one = BROWSER_LOCK.lock().await;
    let s = TestServer::start().await;
    s.put_event("sale", json!({"name": "Morning sale", "max_active": 1}))
        .await;
    for i in 0..6 {
        s.join_token("sale", &format!("u{i}")).await;
    }
    s.admin(Method::POST, "/events/sale/pause").await;
    // The server samples every 10 s: wait for its first sample of the event.
    let started = Instant::now();
    let first_at = loop {
        let h = s.admin(Method::GET, "/events/sale/history").await;
        if let Some(at) = h["samples"][0]["at"].as_u64() {
            break at;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no sample: {h}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let desktop = Opts {
        lang: "en-US",
        width: 1280,
        height: 1400,
        scale: 1.0,
    };
    let b = Browser::start(&desktop).await;
    b.goto(&s.url("/admin")).await;
    b.until_visible("#admin-token").await;
    b.c()
        .find(Locator::Css("#admin-token"))
        .await
        .unwrap()
        .send_keys(ADMIN)
        .await
        .unwrap();
    b.click("#login-button").await;
    b.until_visible("#dash").await;
    let card = "[data-event=\"sale\"]";
    b.text_until(&format!("{card} .fig-waiting"), |t| t == "5")
        .await;

    // The audit list shows the changes made through the API, newest first.
    b.text_until("#audit-list li:first-child", |t| {
        t.contains("sale") && t.contains("paused") && t.contains("127.0.0.1")
    })
    .await;
    b.text_until("#audit-list li:nth-child(2)", |t| t.contains("created"))
        .await;
    assert!(b.visible(&format!("{card} .csv")).await, "the CSV export");

    // Reload: the page signs in again from this tab's storage, and its charts start at the
    // server's first sample, from before the reload.
    let reloaded_at = b.js("return Date.now()").await.as_u64().unwrap();
    b.c().refresh().await.unwrap();
    b.until_visible("#dash").await;
    let from_script = format!(
        "const s = document.querySelector('{card} .chart svg'); \
         return s && s.querySelector('path.line') ? Number(s.dataset.from) : null"
    );
    let until = Instant::now() + WAIT;
    // Without the server's history the oldest point would be the page's first poll, after
    // the reload: this waits (bounded) for a chart that starts before it.
    let from = loop {
        if let Some(f) = b.js(&from_script).await.as_u64() {
            if f < reloaded_at {
                break f;
            }
        }
        assert!(
            Instant::now() < until,
            "the chart never showed anything from before the reload"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        from, first_at,
        "the chart starts at the server's first sample"
    );
    assert!(from < reloaded_at, "the past, not this page's own polls");
    b.close().await;
}
