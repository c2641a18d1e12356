//! Shared by the live-update tests (`tests/live.rs`) and the browser tests
//! (`tests/browser.rs`): a real server started in-process through `waitroom::server::run`
//! on a port-0 listener, and small HTTP helpers for the admin and end-user API.

#![allow(dead_code)] // each test binary uses the part it needs

use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use waitroom::config::Settings;

pub const ADMIN: &str = "live-admin";

pub struct TestServer {
    pub base: String,
    pub http: Client,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub async fn start() -> TestServer {
        Self::start_with(false).await
    }

    /// `demo`: also create the demo event and its simulated crowd.
    pub async fn start_with(demo: bool) -> TestServer {
        Self::start_tweaked(demo, |_| {}).await
    }

    /// As [`start_with`](Self::start_with), with `tweak` applied to the settings (gateway
    /// mode's `upstream`, for one).
    pub async fn start_tweaked(demo: bool, tweak: impl FnOnce(&mut Settings)) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings {
            data_dir: dir.path().to_path_buf(),
            admin_token: Some(ADMIN.into()),
            demo,
            // Every test client shares one address: joins are not what these test.
            rate_limits: waitroom::config::RateLimitSettings {
                joins_per_minute: 100_000,
                ..Default::default()
            },
            ..Settings::default()
        };
        tweak(&mut settings);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let done = tokio::spawn(waitroom::server::run(settings, listener, async move {
            let _ = rx.await;
        }));
        let http = Client::builder()
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        let s = TestServer {
            base,
            http,
            stop: Some(tx),
            done: Some(done),
            _dir: dir,
        };
        // `run` opens the store before it serves; wait until it answers.
        for _ in 0..200 {
            if let Ok(r) = s.http.get(s.url("/healthz")).send().await {
                if r.status() == StatusCode::OK {
                    return s;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the test server did not come up");
    }

    /// The server's data dir (for files it serves from there, like `branding/`).
    pub fn data_dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn ws_url(&self, path: &str) -> String {
        format!("{}{path}", self.base.replacen("http://", "ws://", 1))
    }

    /// Asks the server to stop; answers how long it took to finish.
    pub async fn shutdown(&mut self) -> Duration {
        let started = std::time::Instant::now();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            tokio::time::timeout(Duration::from_secs(15), done)
                .await
                .expect("the server stops")
                .unwrap()
                .expect("clean shutdown");
        }
        started.elapsed()
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        bearer: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self.http.request(method, self.url(path));
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let st = resp.status();
        let text = resp.text().await.unwrap();
        (st, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Creates or updates an event; panics unless it worked.
    pub async fn put_event(&self, id: &str, config: Value) -> Value {
        let (st, v) = self
            .call(
                Method::PUT,
                &format!("/api/v1/admin/events/{id}"),
                Some(ADMIN),
                Some(config),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        v
    }

    pub async fn admin(&self, method: Method, path: &str) -> Value {
        let (st, v) = self
            .call(method, &format!("/api/v1/admin{path}"), Some(ADMIN), None)
            .await;
        assert_eq!(st, StatusCode::OK, "{path}: {v}");
        v
    }

    /// The admin figures of an event (renews nobody's heartbeat).
    pub async fn figures(&self, id: &str) -> Value {
        self.admin(Method::GET, &format!("/events/{id}")).await
    }

    /// Joins and answers the whole join response. With the server key (the site joining
    /// for its signed-in user), so a repeat join gets the user's place back.
    pub async fn join(&self, event: &str, user: &str) -> Value {
        let (st, v) = self
            .call(
                Method::POST,
                "/api/v1/queue/join",
                Some(ADMIN),
                Some(json!({"event_id": event, "user_id": user})),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        v
    }

    /// Joins and answers the waiting token.
    pub async fn join_token(&self, event: &str, user: &str) -> String {
        self.join(event, user).await["waiting_token"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub async fn status(&self, token: &str) -> (StatusCode, Value) {
        self.call(
            Method::GET,
            &format!("/api/v1/queue/status?token={token}"),
            None,
            None,
        )
        .await
    }

    pub async fn leave(&self, token: &str) -> Value {
        let (st, v) = self
            .call(
                Method::POST,
                "/api/v1/queue/leave",
                None,
                Some(json!({"token": token})),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        v
    }

    /// Enters an admitted place; answers the access token.
    pub async fn enter(&self, token: &str) -> String {
        let (st, v) = self
            .call(
                Method::POST,
                "/api/v1/queue/enter",
                None,
                Some(json!({"waiting_token": token})),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        v["access_token"].as_str().unwrap().to_string()
    }

    pub async fn complete(&self, access: &str) {
        let (st, v) = self
            .call(Method::POST, "/api/v1/session/complete", Some(access), None)
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
