//! Extractors that reject in our error format.
//!
//! axum's own `Json`, `Query` and `Path` answer bad input with plain text and statuses the
//! contract does not use (415, 422); the wrappers here run them and turn their rejections
//! into [`AppError`], so every client mistake gets `400 INVALID_REQUEST` (or 413) as JSON.
//! [`OptionalJson`] also reads bodies that `navigator.sendBeacon` sends as `text/plain`, and
//! bodies that are simply absent (the token came in the query or a header).

use std::borrow::Cow;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, OptionalFromRequestParts, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::RequestExt;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::error::{body_error, AppError};

/// `axum::Json` with our rejection, for a JSON object only: serde reads a struct from an
/// array too (`["concert-a","u1"]` as a join), which the contract does not allow.
pub struct AppJson<T>(pub T);

impl<S, T> FromRequest<S> for AppJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !plain_json(req.headers()) {
            // Boxed: inline, this rare path's future (two extractors and a copy of the
            // request's parts, ~1.4 KB) made every request's future that large, and the
            // handler's future is moved whole into its box at every request.
            return Box::pin(Self::checked_by_axum(req, state)).await;
        }
        // The usual request (`Content-Type: application/json`, which axum's check
        // accepts): the body read once, and parsed by serde_json alone. Only a body that
        // fails is parsed again by axum, for its answer (the same input fails both ways).
        let bytes = read_body(req).await?;
        let v = match serde_json::from_slice::<T>(&bytes) {
            Ok(v) => v,
            Err(_) => axum::Json::<T>::from_bytes(&bytes)?.0,
        };
        object_only(&bytes)?;
        Ok(AppJson(v))
    }
}

impl<T: DeserializeOwned> AppJson<T> {
    /// Any other content type: axum's own checks (content type, syntax) first, so their
    /// answers stay as they were.
    async fn checked_by_axum<S: Send + Sync>(req: Request, state: &S) -> Result<Self, AppError> {
        let (parts, body) = req.into_parts();
        let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), state).await?;
        let req = Request::from_parts(parts, axum::body::Body::from(bytes.clone()));
        let axum::Json(v) = axum::Json::<T>::from_request(req, state).await?;
        object_only(&bytes)?;
        Ok(AppJson(v))
    }
}

/// The body as `Bytes::from_request` reads it: within the router's body limit, with the
/// same answers when it fails, and the same bytes. The usual body is one frame, answered
/// as it came; axum's reader collects even that one into a queue of frames (about 3,000
/// instructions and three allocations of a join, callgrind).
async fn read_body(req: Request) -> Result<Bytes, AppError> {
    let mut frames = req.into_limited_body().into_data_stream();
    let Some(first) = frames.next().await else {
        return Ok(Bytes::new());
    };
    let first = first.map_err(body_failure)?;
    let Some(second) = frames.next().await else {
        return Ok(first);
    };
    let mut all = first.to_vec();
    all.extend_from_slice(&second.map_err(body_failure)?);
    while let Some(more) = frames.next().await {
        all.extend_from_slice(&more.map_err(body_failure)?);
    }
    Ok(Bytes::from(all))
}

/// A body that could not be read, answered as `Bytes::from_request`'s rejection is
/// (`FailedToBufferBody::from_err`): past the body limit 413, anything else 400 with the
/// reader's error.
fn body_failure(e: axum::Error) -> AppError {
    // The limit's error is boxed in the body's error, and a connection's in one more.
    let inner = e.into_inner();
    let inner = match inner.downcast::<axum::Error>() {
        Ok(e) => e.into_inner(),
        Err(e) => e,
    };
    if inner.is::<http_body_util::LengthLimitError>() {
        body_error(StatusCode::PAYLOAD_TOO_LARGE, String::new())
    } else {
        body_error(
            StatusCode::BAD_REQUEST,
            format!("Failed to buffer the request body: {inner}"),
        )
    }
}

/// Whether the content type is exactly `application/json` (any case), a value axum's
/// JSON check accepts; anything else goes through that check itself.
fn plain_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"application/json"))
}

/// Refuses a JSON body that is not an object.
fn object_only(bytes: &[u8]) -> Result<(), AppError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Ok(()),
        _ => Err(AppError::invalid("the JSON body must be an object")),
    }
}

/// `axum::extract::Query` with our rejection.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(AppError))]
pub struct AppQuery<T>(pub T);

/// `axum::extract::Path` with our rejection.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(AppError))]
pub struct AppPath<T>(pub T);

/// A JSON body that may be absent (`None` for an empty body), sent as `application/json`,
/// `text/plain` (what `sendBeacon` uses for a string) or with no content type at all.
/// Other content types are refused, so a form post is not misread as JSON.
pub struct OptionalJson<T>(pub Option<T>);

impl<S, T> FromRequest<S> for OptionalJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json_like = match req.headers().get(CONTENT_TYPE) {
            None => true,
            Some(v) => {
                let essence = v
                    .to_str()
                    .unwrap_or("")
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase();
                essence == "application/json"
                    || essence == "text/plain"
                    || (essence.starts_with("application/") && essence.ends_with("+json"))
            }
        };
        // Read first: the body limit applies whatever the content type.
        let bytes = Bytes::from_request(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(None));
        }
        if !json_like {
            return Err(AppError::invalid(
                "expected a JSON body (application/json or text/plain)",
            ));
        }
        let v = parse_naming_the_field(&bytes)?;
        object_only(&bytes)?;
        Ok(OptionalJson(Some(v)))
    }
}

/// The body of an action that takes none (pause, clear, delete, …): absent, or an empty
/// JSON object. Anything else is refused before the action runs: a client that sent a
/// malformed body, or an option the action does not have (`{"only_expired": true}`), meant
/// something else, and must not have the action done as if it had sent nothing.
pub struct NoBody;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Nothing {}

impl<S: Send + Sync> FromRequest<S> for NoBody {
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), state).await?;
        // `{}` under any content type: `curl -d '{}'` sends it as a form.
        if bytes.trim_ascii() == b"{}" {
            return Ok(NoBody);
        }
        let req = Request::from_parts(parts, axum::body::Body::from(bytes));
        OptionalJson::<Nothing>::from_request(req, state)
            .await
            .map(|_| NoBody)
            .map_err(|e| match e {
                AppError::InvalidRequest(m) => {
                    AppError::invalid(format!("this action takes no body (or {{}}): {m}"))
                }
                e => e,
            })
    }
}

/// `serde_json::from_slice`, with a refusal that starts with the field it is about
/// (`title: invalid type: …`, as the settings' own checks name theirs); one that is about
/// no field (the syntax, the body as a whole) says `invalid JSON body: …`.
fn parse_naming_the_field<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, AppError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let at_field = !path.is_empty() && path != ".";
        if at_field && !inner.is_syntax() && !inner.is_eof() {
            AppError::invalid(format!("{path}: {inner}"))
        } else if at_field && serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok() {
            // serde_json calls a value an enum cannot start with (`null`, a number) a
            // syntax error, "expected value", though the JSON is fine: it is the field's
            // type that is wrong, so say that, naming the field.
            AppError::invalid(format!("{path}: invalid type: expected a string"))
        } else {
            AppError::invalid(format!("invalid JSON body: {inner}"))
        }
    })?;
    // Trailing characters, as `from_slice` refuses them.
    de.end()
        .map_err(|e| AppError::invalid(format!("invalid JSON body: {e}")))?;
    Ok(v)
}

/// The token of the first `Authorization: Bearer …` line, if there is one. Other schemes
/// are passed over rather than refused: a site may sit behind a proxy that adds its own
/// (a staging site's `Basic`, sent before the bearer line), and `waitroom-guard` reads the
/// same line, so the two never disagree about a request.
///
/// A bearer line whose token is not text (bytes past ASCII: `Bearer café`, a key with a
/// stray byte) is a wrong token, not no token: passed over, it let a `join` through as an
/// anonymous one, where a wrong server key answers `401` and counts against the caller.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers.get_all(AUTHORIZATION).iter().find_map(|v| {
        let line = v.as_bytes().trim_ascii();
        let at = line.iter().position(|&b| b == b' ')?;
        let (scheme, token) = (&line[..at], line[at..].trim_ascii());
        if !scheme.eq_ignore_ascii_case(b"bearer") || token.is_empty() {
            return None;
        }
        // Visible ASCII (and spaces) only, as `HeaderValue::to_str` reads a line.
        let text = token
            .iter()
            .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b));
        Some(if text {
            std::str::from_utf8(token).ok()?
        } else {
            NOT_A_TOKEN
        })
    })
}

/// What [`bearer`] answers for a token that is not text: no token, key or session id has
/// this form, so every check refuses it.
const NOT_A_TOKEN: &str = "\u{fffd}";

/// The bearer token of a request, or `MISSING_TOKEN`.
pub struct BearerToken(pub String);

impl<S: Send + Sync> FromRequestParts<S> for BearerToken {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        bearer(&parts.headers)
            .map(|t| BearerToken(t.to_string()))
            .ok_or(AppError::MissingToken)
    }
}

/// The bearer token of a request if it has one: for a route where it is optional (`join`'s
/// server key), read from the head without copying the whole `HeaderMap` as axum's
/// `HeaderMap` extractor does (its entries and indexes, and their drop: ~500 instructions
/// of a join, callgrind).
impl<S: Send + Sync> OptionalFromRequestParts<S> for BearerToken {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(bearer(&parts.headers).map(|t| BearerToken(t.to_string())))
    }
}

/// `?token=` of the end-user endpoints. Unknown parameters (cache busters) are ignored.
#[derive(Debug, Default, Deserialize)]
pub struct TokenQuery {
    pub token: Option<String>,
}

impl TokenQuery {
    /// Reads `?token=` straight from the query string. Every status poll runs this, and
    /// the generic `Query` extractor (serde through a path-tracking wrapper) cost about as
    /// much as verifying the token's MAC. Answers as that extractor did: a repeated
    /// `token` is refused, other parameters are ignored.
    pub fn from_uri(uri: &axum::http::Uri) -> Result<TokenQuery, AppError> {
        Ok(TokenQuery {
            token: query_token(uri)?.map(Cow::into_owned),
        })
    }
}

/// `?token=` of `uri`, decoded as `application/x-www-form-urlencoded`. A query with no
/// `%` and no `+` (every token we issue is base64url) decodes to itself, so it is split
/// in place with no copy; any other goes through `form_urlencoded`. Both answer alike
/// (test below): pairs split at `&` (empty ones skipped), a name at its first `=`, a
/// repeated `token` refused.
fn query_token<'a>(uri: &'a axum::http::Uri) -> Result<Option<Cow<'a, str>>, AppError> {
    let query = uri.query().unwrap_or("");
    let mut token = None;
    let mut found = |v: Cow<'a, str>| -> Result<(), AppError> {
        if token.is_some() {
            return Err(AppError::invalid(
                "Failed to deserialize query string: duplicate field `token`",
            ));
        }
        token = Some(v);
        Ok(())
    };
    if query.bytes().any(|b| b == b'%' || b == b'+') {
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            if k == "token" {
                found(Cow::Owned(v.into_owned()))?;
            }
        }
    } else {
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if k == "token" {
                found(Cow::Borrowed(v))?;
            }
        }
    }
    Ok(token)
}

/// A body carrying a waiting token; both field names of the contract are accepted.
#[derive(Debug, Default, Deserialize)]
pub struct TokenBody {
    pub token: Option<String>,
    pub waiting_token: Option<String>,
}

/// The waiting token of a request, from the query, the JSON body or the bearer header (in
/// that order), or `MISSING_TOKEN`. Empty strings count as absent.
pub struct WaitingToken(pub String);

impl WaitingToken {
    pub fn find(
        query: &TokenQuery,
        body: Option<&TokenBody>,
        headers: &HeaderMap,
    ) -> Result<Self, AppError> {
        non_empty(&query.token)
            .or_else(|| body.and_then(|b| non_empty(&b.token).or(non_empty(&b.waiting_token))))
            .or_else(|| bearer(headers))
            .map(|t| WaitingToken(t.trim().to_string()))
            .ok_or(AppError::MissingToken)
    }
}

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|t| !t.trim().is_empty())
}

/// A waiting token for endpoints with a body: query, then body, then header.
impl<S: Send + Sync> FromRequest<S> for WaitingToken {
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let query = TokenQuery::from_uri(&parts.uri)?;
        let headers = parts.headers.clone();
        let req = Request::from_parts(parts, body);
        let OptionalJson(body) = OptionalJson::<TokenBody>::from_request(req, state).await?;
        WaitingToken::find(&query, body.as_ref(), &headers)
    }
}

/// A waiting token for body-less endpoints (`GET`, `DELETE`): query, then header.
pub struct WaitingTokenNoBody(pub String);

impl<S: Send + Sync> FromRequestParts<S> for WaitingTokenNoBody {
    type Rejection = AppError;

    /// As [`WaitingToken::find`] without a body, with one copy of the token (the answer)
    /// rather than two.
    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = query_token(&parts.uri)?;
        query
            .as_deref()
            .filter(|t| !t.trim().is_empty())
            .or_else(|| bearer(&parts.headers))
            .map(|t| WaitingTokenNoBody(t.trim().to_string()))
            .ok_or(AppError::MissingToken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A staging site's `Basic` line before the bearer one: the bearer is read, as
    /// `waitroom-guard` reads it (reading only the first line answered `MISSING_TOKEN`).
    #[test]
    fn the_first_bearer_line_is_read_past_other_schemes() {
        let mut h = HeaderMap::new();
        h.append(AUTHORIZATION, "Basic dXNlcjpwYXNz".parse().unwrap());
        h.append(AUTHORIZATION, "Bearer one".parse().unwrap());
        h.append(AUTHORIZATION, "bearer two".parse().unwrap());
        assert_eq!(bearer(&h), Some("one"));
        let mut h = HeaderMap::new();
        h.append(AUTHORIZATION, "Basic dXNlcjpwYXNz".parse().unwrap());
        h.append(AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer(&h), None);
        // A bearer that is not text is a wrong one, not none.
        let mut h = HeaderMap::new();
        use axum::http::HeaderValue;
        h.append(
            AUTHORIZATION,
            HeaderValue::from_bytes(b"Bearer caf\xc3\xa9").unwrap(),
        );
        assert_eq!(bearer(&h), Some(NOT_A_TOKEN));
        let mut h = HeaderMap::new();
        h.append(
            AUTHORIZATION,
            HeaderValue::from_bytes(b"Basic \xff").unwrap(),
        );
        assert_eq!(bearer(&h), None);
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct Sample {
        event_id: String,
        #[allow(dead_code)]
        n: Option<u32>,
    }

    /// The answer of `AppJson` to a body, as a client sees it (status and body).
    async fn answer(content_type: &str, body: &str, fast: bool) -> String {
        let req = Request::builder()
            .header(CONTENT_TYPE, content_type)
            .body(axum::body::Body::from(body.to_string()))
            .unwrap();
        let r = if fast {
            AppJson::<Sample>::from_request(req, &()).await
        } else {
            AppJson::<Sample>::checked_by_axum(req, &()).await
        };
        match r {
            Ok(AppJson(v)) => format!("ok {v:?}"),
            Err(e) => {
                let r = axum::response::IntoResponse::into_response(e);
                let status = r.status();
                let body = axum::body::to_bytes(r.into_body(), usize::MAX)
                    .await
                    .unwrap();
                format!("{status} {}", String::from_utf8_lossy(&body))
            }
        }
    }

    /// The short path for `application/json` answers every body as axum's checks did.
    #[tokio::test]
    async fn plain_json_bodies_are_answered_as_axum_answered_them() {
        let bodies = [
            r#"{"event_id":"a"}"#,
            r#" {"event_id":"a","n":3} "#,
            r#"{"event_id":"a","n":-1}"#,
            r#"{"event_id":"a","n":"x"}"#,
            r#"{"n":1}"#,
            r#"{"event_id":"a"} x"#,
            r#"{"event_id":"a""#,
            r#"["a",1]"#,
            "",
            "\u{ff}",
        ];
        for content_type in ["application/json", "Application/JSON"] {
            assert!(plain_json(
                &Request::builder()
                    .header(CONTENT_TYPE, content_type)
                    .body(())
                    .unwrap()
                    .headers()
                    .clone()
            ));
            for body in bodies {
                assert_eq!(
                    answer(content_type, body, true).await,
                    answer(content_type, body, false).await,
                    "{content_type} {body:?}"
                );
            }
        }
        assert_eq!(
            answer("application/json", r#"{"event_id":"a"}"#, true).await,
            r#"ok Sample { event_id: "a", n: None }"#
        );
        assert!(answer("application/json", r#"["a",1]"#, true)
            .await
            .contains("must be an object"));
        // Other content types take axum's path itself.
        for other in [
            "application/json; charset=utf-8",
            "text/plain",
            "application/x+json",
        ] {
            assert!(!plain_json(
                &Request::builder()
                    .header(CONTENT_TYPE, other)
                    .body(())
                    .unwrap()
                    .headers()
                    .clone()
            ));
        }
    }

    fn token(uri: &str) -> Result<Option<String>, AppError> {
        TokenQuery::from_uri(&uri.parse().unwrap()).map(|q| q.token)
    }

    /// The query as `form_urlencoded` reads it (what `from_uri` did for every query).
    fn token_by_form_urlencoded(uri: &str) -> Result<Option<String>, ()> {
        let uri: axum::http::Uri = uri.parse().unwrap();
        let mut token = None;
        for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
            if k == "token" {
                if token.is_some() {
                    return Err(());
                }
                token = Some(v.into_owned());
            }
        }
        Ok(token)
    }

    /// The in-place split answers as `form_urlencoded` for every combination of the
    /// pieces a query can hold (empty pairs, bare names, `=` in values, look-alike names,
    /// encoded names and values, repeats).
    #[test]
    fn the_query_split_in_place_answers_as_form_urlencoded() {
        let pieces = [
            "",
            "token=abc",
            "token=",
            "token",
            "token==x",
            "tokens=1",
            "xtoken=2",
            "TOKEN=3",
            "token=a=b",
            "_=123",
            "&",
            "tok%65n=enc",
            "token=a%2Bb",
            "token=a+b",
            "a=%zz",
            "token=AbC-_9",
            "=v",
            "x",
        ];
        let mut cases = 0;
        for a in pieces {
            for b in pieces {
                for c in ["", "token=again", "&&", "y=1"] {
                    for q in [
                        format!("{a}&{b}&{c}"),
                        format!("{a}{b}"),
                        format!("{c}&{a}"),
                    ] {
                        let uri = format!("/s?{q}");
                        if uri.parse::<axum::http::Uri>().is_err() {
                            continue;
                        }
                        let ours = token(&uri).map_err(|_| ());
                        assert_eq!(ours, token_by_form_urlencoded(&uri), "{uri}");
                        cases += 1;
                    }
                }
            }
        }
        assert!(cases > 3000, "{cases}");
    }

    /// The body-less extractor answers as `WaitingToken::find` does: query, then bearer
    /// header, blanks trimmed, empty counting as absent.
    #[tokio::test]
    async fn the_body_less_waiting_token_is_found_as_before() {
        let queries = [
            "/s",
            "/s?token=",
            "/s?token=%20",
            "/s?token=q1",
            "/s?token=+q2+",
            "/s?token=a&token=b",
        ];
        let headers = [None, Some("Bearer h1"), Some("Bearer  "), Some("Basic h2")];
        for uri in queries {
            for auth in headers {
                let mut req = Request::builder().uri(uri);
                if let Some(a) = auth {
                    req = req.header(AUTHORIZATION, a);
                }
                let (mut parts, ()) = req.body(()).unwrap().into_parts();
                let ours = WaitingTokenNoBody::from_request_parts(&mut parts, &())
                    .await
                    .map(|t| t.0)
                    .map_err(|e| e.to_string());
                let before = TokenQuery::from_uri(&parts.uri)
                    .and_then(|q| WaitingToken::find(&q, None, &parts.headers))
                    .map(|t| t.0)
                    .map_err(|e| e.to_string());
                assert_eq!(ours, before, "{uri} {auth:?}");
            }
        }
    }

    #[test]
    fn token_query_reads_as_the_query_extractor_did() {
        assert_eq!(token("/s").unwrap(), None);
        assert_eq!(token("/s?x=1").unwrap(), None);
        assert_eq!(token("/s?token=abc&_=123").unwrap().as_deref(), Some("abc"));
        // Percent- and plus-decoding, as `application/x-www-form-urlencoded`.
        assert_eq!(token("/s?token=a%2Bb+c").unwrap().as_deref(), Some("a+b c"));
        assert_eq!(token("/s?token=").unwrap().as_deref(), Some(""));
        assert!(matches!(
            token("/s?token=a&token=b"),
            Err(AppError::InvalidRequest(_))
        ));
    }

    /// `read_body` reads what `Bytes::from_request` reads and fails as it fails: bodies of
    /// one frame, of several, empty, past the router's limit (declared and not), and a
    /// connection failing half-way.
    #[tokio::test]
    async fn a_body_is_read_as_axum_reads_it() {
        use axum::body::Body;
        use axum::extract::DefaultBodyLimit;
        use axum::response::IntoResponse;

        fn chunks(parts: &[&'static str], fail: bool) -> Body {
            let mut items: Vec<Result<Bytes, std::io::Error>> = parts
                .iter()
                .map(|p| Ok(Bytes::from_static(p.as_bytes())))
                .collect();
            if fail {
                items.push(Err(std::io::Error::other("connection reset")));
            }
            Body::from_stream(futures_util::stream::iter(items))
        }
        let bodies = || -> Vec<(Body, Option<usize>)> {
            vec![
                (Body::from(r#"{"event_id":"a"}"#), None),
                (Body::empty(), None),
                (chunks(&[r#"{"event_"#, "", r#"id":"a"}"#], false), None),
                (chunks(&[r#"{"a":1}"#], true), None),
                (chunks(&[], true), None),
                (Body::from("x".repeat(64)), Some(10)),
                (chunks(&["12345", "67890", "x"], false), Some(10)),
                (chunks(&["1234567890"], false), Some(10)),
                (Body::from(vec![b'x'; 3 << 20]), None), // axum's default limit, 2 MiB
            ]
        };
        async fn shown(r: Result<Bytes, AppError>) -> String {
            match r {
                Ok(b) => format!("ok {b:?}"),
                Err(e) => {
                    let r = e.into_response();
                    let status = r.status();
                    let body = axum::body::to_bytes(r.into_body(), usize::MAX)
                        .await
                        .unwrap();
                    format!("{status} {}", String::from_utf8_lossy(&body))
                }
            }
        }
        let mut answers = Vec::new();
        for ((ours, limit), (theirs, _)) in bodies().into_iter().zip(bodies()) {
            let request = |body| {
                let mut r = Request::new(body);
                if let Some(n) = limit {
                    DefaultBodyLimit::max(n).apply(&mut r);
                }
                r
            };
            let a = shown(read_body(request(ours)).await).await;
            let b = shown(
                Bytes::from_request(request(theirs), &())
                    .await
                    .map_err(AppError::from),
            )
            .await;
            assert_eq!(a, b);
            answers.push(a);
        }
        let count = |status: &str| answers.iter().filter(|a| a.starts_with(status)).count();
        assert_eq!((count("ok"), count("413"), count("400")), (4, 3, 2));
    }
}
