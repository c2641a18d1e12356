//! The live endpoints: `GET /queue/ws` (WebSocket) and `GET /queue/events` (Server-Sent
//! Events). Both run one [`Follower`] (see [`crate::live`]) and differ only in framing and
//! in how the client shows it is still there.
//!
//! The token is checked and the place read *before* the upgrade or the stream starts, so a
//! forged token or an ended place gets the same JSON error as `GET /queue/status`, and a
//! stream once open always begins with a `queue-update`.
//!
//! - **WebSocket**: text frames with the JSON messages. The server pings once per heartbeat
//!   period; a pong, a `{"type": "heartbeat"}` or any other client message is the sign of
//!   life that lets the next period renew the place's heartbeat. A client that stops
//!   answering is not disconnected (its place lapses on its own if it never comes back);
//!   a closed socket ends nothing.
//! - **SSE**: `event: queue-update` / `data: {…}`; an open stream counts as a heartbeat,
//!   and a comment every [`SSE_KEEP_ALIVE`] keeps proxies from timing it out and reveals a
//!   vanished client through a failed write.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;

use super::error::{AppError, AppResult};
use super::extract::WaitingTokenNoBody;
use super::guard::{Caller, StreamPermit};
use crate::app::AppState;
use crate::core::PlaceKey;
use crate::live::{Follower, LiveMessage};

/// Read buffer of a live WebSocket. Clients send only tiny frames (heartbeats, pongs);
/// tungstenite's default (128 KiB per connection) would cost gigabytes at 20,000 clients.
pub const WS_READ_BUFFER: usize = 4 * 1024;
/// Largest accepted client frame or message: a heartbeat is 20 bytes.
pub const WS_MAX_MESSAGE: usize = 16 * 1024;
/// Most bytes a live WebSocket keeps waiting to be written. A client that sends pings and
/// never reads would otherwise grow it by a pong each (tungstenite's default has no
/// bound: a flood of pings held hundreds of megabytes); past it, only the latest pong is
/// kept, and a message that does not fit ends the connection.
pub const WS_MAX_WRITE_BUFFER: usize = 64 * 1024;
/// Interval of SSE keep-alive comments.
pub const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// WebSocket close codes (RFC 6455): normal closure after the final message; "going
/// away" when the server shuts down (a client should reconnect later).
const CLOSE_NORMAL: u16 = 1000;
const CLOSE_GOING_AWAY: u16 = 1001;
/// How long the server waits for the client's close frame after sending its own.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// `WebSocketUpgrade` with our rejection: a plain `GET` (no upgrade headers) gets
/// `400 INVALID_REQUEST` rather than axum's plain-text 426.
pub struct Upgrade(WebSocketUpgrade);

impl<S: Send + Sync> FromRequestParts<S> for Upgrade {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        WebSocketUpgrade::from_request_parts(parts, state)
            .await
            .map(Upgrade)
            .map_err(|r| AppError::invalid(format!("a WebSocket upgrade is required: {r}")))
    }
}

/// `GET /queue/ws?token=…`
pub async fn ws(
    State(state): State<AppState>,
    caller: Caller,
    // As `Result`s: their refusals are answers about one place (`no-store`, PlaceError).
    token: Result<WaitingTokenNoBody, AppError>,
    upgrade: Result<Upgrade, AppError>,
) -> super::PlaceResult<Response> {
    // The token first, as on every end-user endpoint; then whether this is an upgrade.
    let WaitingTokenNoBody(token) = token?;
    let place = parse(&state, &token)?;
    let permit = admit(&state, &caller, &place).await?;
    let Upgrade(upgrade) = upgrade?;
    let (follower, first) = follow(&state, place).await?;
    Ok(upgrade
        .read_buffer_size(WS_READ_BUFFER)
        // Each message is written at once; live messages are small and rare per client.
        .write_buffer_size(0)
        .max_write_buffer_size(WS_MAX_WRITE_BUFFER)
        .max_message_size(WS_MAX_MESSAGE)
        .max_frame_size(WS_MAX_MESSAGE)
        .on_upgrade(move |socket| async move {
            serve_ws(socket, follower, first).await;
            drop(permit);
        }))
}

/// A live connect counts as a poll of the place, and takes one of its stream slots.
async fn admit(
    state: &AppState,
    caller: &Caller,
    (event_id, key): &(String, PlaceKey),
) -> AppResult<StreamPermit> {
    (caller.guard)
        .check_poll(&state.events, state.clock.now(), event_id, *key)
        .await?;
    caller
        .guard
        .open_stream(*key)
        .ok_or(AppError::TooManyStreams)
}

/// The place a waiting token names; `401 TOKEN_INVALID` for a forged one (checked by its
/// MAC, as a status poll's: `WaitingTokens::verify`).
fn parse(state: &AppState, token: &str) -> AppResult<(String, PlaceKey)> {
    state
        .waiting
        .verify(token)
        .map_err(|_| AppError::TokenInvalid)
}

/// Starts following the place (store errors as `GET /queue/status` answers them).
async fn follow(
    state: &AppState,
    (event_id, key): (String, PlaceKey),
) -> AppResult<(Follower, Vec<LiveMessage>)> {
    match Follower::start(
        &state.live,
        state.store.clone(),
        state.events.clone(),
        state.clock.clone(),
        state.shutdown.subscribe(),
        &event_id,
        key,
    )
    .await
    {
        Ok(f) => Ok(f),
        Err(e) => Err(super::lifecycle::explain(state, &event_id, e.into()).await),
    }
}

async fn send(socket: &mut WebSocket, m: &LiveMessage) -> bool {
    socket.send(Message::text(m.to_json())).await.is_ok()
}

/// Sends the close frame and waits (briefly) for the client's, as the closing handshake
/// asks: dropping the connection at once could reset it before the client has read the
/// final message.
async fn close(socket: &mut WebSocket, code: u16, reason: &'static str) {
    let frame = CloseFrame {
        code,
        reason: reason.into(),
    };
    if socket.send(Message::Close(Some(frame))).await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Some(Ok(m)) = socket.recv().await {
            if matches!(m, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}

async fn serve_ws(mut socket: WebSocket, mut follower: Follower, first: Vec<LiveMessage>) {
    for m in &first {
        if !send(&mut socket, m).await {
            return;
        }
    }
    if follower.is_done() {
        close(&mut socket, CLOSE_NORMAL, "place ended").await;
        return;
    }
    // The connection itself was the first sign of life.
    let mut alive = true;
    loop {
        tokio::select! {
            wake = follower.wait() => {
                let step = follower.step(wake, alive).await;
                if step.liveness_used {
                    alive = false;
                    follower.set_alive(false);
                }
                for m in &step.messages {
                    if !send(&mut socket, m).await {
                        return;
                    }
                }
                if follower.is_done() {
                    let ended = step.messages.last().is_some_and(LiveMessage::is_final);
                    if ended {
                        close(&mut socket, CLOSE_NORMAL, "place ended").await;
                    } else {
                        close(&mut socket, CLOSE_GOING_AWAY, "server shutting down").await;
                    }
                    return;
                }
                if step.ping && socket.send(Message::Ping(Bytes::new())).await.is_err() {
                    return;
                }
            }
            msg = socket.recv() => match msg {
                // Gone or closed by the client: the place stays until its heartbeat lapses.
                None => return,
                // The client broke the protocol (a message over the limit, text that is not
                // UTF-8, a bad frame): said with the close code RFC 6455 names, rather than
                // a dropped connection, which the client takes for a network failure (1006)
                // and a page answers by reconnecting, again and again.
                Some(Err(e)) => {
                    if let Some((code, reason)) = violation(e) {
                        close(&mut socket, code, reason).await;
                    }
                    return;
                }
                // The WebSocket layer queued the reply a close frame must get (RFC 6455
                // 5.5.1); reading on sends it, then ends. Returning at once dropped it and
                // the client saw an unclean close.
                Some(Ok(Message::Close(_))) => {
                    let _ = tokio::time::timeout(CLOSE_WAIT, socket.recv()).await;
                    return;
                }
                // Pongs, `{"type": "heartbeat"}`, anything: the client is there. (Pings are
                // answered by the WebSocket layer itself.)
                Some(Ok(_)) => {
                    alive = true;
                    follower.set_alive(true);
                }
            }
        }
    }
}

/// The close code and reason of a read error that is the client's breach of the protocol
/// (RFC 6455 7.4.1); `None` for the connection's own end or failure, which leaves nobody to
/// tell.
fn violation(e: axum::Error) -> Option<(u16, &'static str)> {
    use tokio_tungstenite::tungstenite::Error as WsError;
    match *e.into_inner().downcast::<WsError>().ok()? {
        WsError::Capacity(_) => Some((1009, "message too big")),
        WsError::Utf8(_) => Some((1007, "text that is not UTF-8")),
        WsError::Protocol(_) => Some((1002, "protocol error")),
        _ => None,
    }
}

/// `GET /queue/events?token=…`
pub async fn events(
    State(state): State<AppState>,
    caller: Caller,
    // A `Result`: its refusal is an answer about one place (`no-store`, PlaceError).
    token: Result<WaitingTokenNoBody, AppError>,
) -> super::PlaceResult<impl IntoResponse> {
    let WaitingTokenNoBody(token) = token?;
    let place = parse(&state, &token)?;
    let permit = admit(&state, &caller, &place).await?;
    let (follower, first) = follow(&state, place).await?;
    // nginx buffers a proxied answer by default, which holds a stream's events back until
    // a buffer fills: this header turns that off for the stream (a site's own nginx in
    // front of waitroom need not know to).
    // One person's messages: `no-store` rather than the `no-cache` of axum's `Sse`, as
    // for a status poll.
    let unbuffered = [
        (
            axum::http::HeaderName::from_static("x-accel-buffering"),
            axum::http::HeaderValue::from_static("no"),
        ),
        (axum::http::header::CACHE_CONTROL, super::NO_STORE.clone()),
    ];
    Ok((
        unbuffered,
        Sse::new(sse_stream(follower, first, permit))
            .keep_alive(KeepAlive::new().interval(SSE_KEEP_ALIVE)),
    ))
}

fn sse_event(m: &LiveMessage) -> Result<Event, Infallible> {
    Ok(Event::default().event(m.kind()).data(m.to_json()))
}

/// The follower's messages as a stream that ends after the final one (or at shutdown).
/// The stream holds `permit` until it ends or is dropped.
fn sse_stream(
    follower: Follower,
    first: Vec<LiveMessage>,
    permit: StreamPermit,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let pending: std::collections::VecDeque<LiveMessage> = first.into();
    futures_util::stream::unfold(
        (follower, pending, permit),
        |(mut follower, mut pending, permit)| async move {
            loop {
                if let Some(m) = pending.pop_front() {
                    return Some((sse_event(&m), (follower, pending, permit)));
                }
                if follower.is_done() {
                    return None;
                }
                let wake = follower.wait().await;
                // An open stream is the sign of life.
                pending.extend(follower.step(wake, true).await.messages);
            }
        },
    )
}
