//! Helpers of the tests that follow live updates across real nodes (`tests/live_multinode.rs`,
//! `tests/live_sale.rs`): JSON calls that must answer 200, joins, and WebSocket reading.

use std::time::Duration;

use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::binary::{call, Server};

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub async fn ok(method: Method, url: String, bearer: Option<&str>, body: Option<Value>) -> Value {
    let (st, v) = call(method, &url, bearer, body).await;
    assert_eq!(st, StatusCode::OK, "{url}: {v}");
    v
}

pub async fn join(node: &Server, event: &str, user: &str) -> Value {
    ok(
        Method::POST,
        node.url("/api/v1/queue/join"),
        None,
        Some(json!({"event_id": event, "user_id": user})),
    )
    .await
}

pub fn token(v: &Value) -> String {
    v["waiting_token"].as_str().unwrap().to_string()
}

pub async fn ws_connect(node: &Server, token: &str) -> Ws {
    let url = format!(
        "{}/api/v1/queue/ws?token={token}",
        node.base.replacen("http://", "ws://", 1)
    );
    tokio_tungstenite::connect_async(url).await.unwrap().0
}

/// The next JSON message (`None` once the socket closed); panics after `within`.
pub async fn next(ws: &mut Ws, within: Duration) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let item = tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| panic!("nothing from the socket within {within:?}"));
        match item {
            Some(Ok(Message::Text(t))) => return Some(serde_json::from_str(&t).unwrap()),
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return None,
            Some(Ok(_)) => {}
        }
    }
}
