//! The HTTP API (axum): end-user, admin and operations routes, all answering errors in the
//! `{"error": {"code", "message"}}` shape of the API contract.
//!
//! - [`queue`]: the end-user API under `/api/v1` (join, status, enter, leave, verify, …).
//! - [`admin`]: the admin API under `/api/v1/admin`, behind the admin bearer token.
//! - [`ops`]: `/healthz`, `/readyz`, `/metrics`.
//! - [`live`]: live updates of one place, `/queue/ws` (WebSocket) and `/queue/events` (SSE).
//! - [`records`]: the admin API's records: an event's figures over time, the audit list.
//! - [`pages`]: the embedded pages (`/`, `/wait/{event_id}`, `/demo/booking`, `/admin`) and
//!   one event's public figures (`/api/v1/events/{event_id}`).
//! - [`public_list`]: the public event list (`/api/v1/events`), read once for the requests
//!   of a second.
//! - [`look`]: the waiting page rendered with an event's look and words, its colours, the
//!   data dir's branding files, and the `404` page of an unknown event.
//! - [`gate`]: admission at a site's own URLs: the cookie session of gateway mode and of
//!   nginx's `auth_request` (`/api/v1/gate`), and the waiting room it redirects to
//!   (`/wait/{event_id}/queue`); [`gate_page`] renders that page.
//! - [`pow`]: the proof-of-work gate of `join`.
//! - [`openapi`]: `/api/v1/openapi.json`, the OpenAPI 3.1 document of every route.
//! - [`demo_site`]: the demo booking page's own route, behind the origin library
//!   (`waitroom-guard`).
//! - [`body`]: the typed JSON bodies of every successful answer: the contract in types.
//! - [`error`]: [`AppError`], the one mapping from failures to statuses and codes.
//! - [`extract`]: extractors whose rejections are `AppError`s, so that no malformed request
//!   ever gets axum's plain-text answer.
//! - [`guard`]: per-client limits (who the client is, 429s) and the live-stream cap.
//! - [`edge`]: the one layer around every route (metrics, size check, timeout, panics);
//!   [`body_timeout`] its body-read timeout.
//!
//! Around every route, from the outside in: tracing (tower-http's per-request span, only
//! when debug logging is on), then [`edge`] (metrics, a declared-size check: a
//! `Content-Length` over the limit answers `413 PAYLOAD_TOO_LARGE` before any body is read;
//! a request timeout: a stuck store answers `503 UNAVAILABLE` instead of hanging the client;
//! panic catching: a bug answers a JSON 500 instead of dropping the connection; around a
//! body that may still arrive, a body-read timeout: a body trickled byte by byte is cut off,
//! and a body size limit for bodies without a declared length). `edge` is put around each
//! handler as it is added ([`route!`]), the fallbacks included, rather than by a
//! `Router::layer` afterwards (one boxed route level per request fewer). The state of the
//! routes is [`Shared`]: one reference count per request, not a dozen.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRef;
use axum::handler::{Handler, HandlerService};
use axum::middleware;
use axum::routing::{any_service, MethodFilter, MethodRouter};
use axum::Router;
use tower::Layer as _;
use tower_http::trace::TraceLayer;

use crate::app::AppState;
use crate::config::RateLimitSettings;

pub mod admin;
pub mod body;
pub mod body_timeout;
pub mod demo_site;
pub mod edge;
pub mod error;
pub mod extract;
pub mod gate;
pub mod gate_page;
pub mod guard;
pub mod lifecycle;
pub mod live;
pub mod look;
pub mod openapi;
mod openapi_pages;
pub mod ops;
pub mod pages;
pub mod place_json;
pub mod pow;
pub mod public_list;
pub mod queue;
pub mod records;
pub mod sale;

pub use error::{AppError, AppResult, PlaceError, PlaceResult};

/// Limits applied to every request.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Longest a request may take before it is answered `503 UNAVAILABLE`. The contract
    /// promises never to hang past a few seconds when the store is gone.
    pub request_timeout: Duration,
    /// Largest accepted request body. Our largest legitimate body (a join with 4 KiB of
    /// metadata) is far below it; anything bigger is a mistake or an attack.
    pub max_body_bytes: usize,
    /// Longest a request body may take to arrive.
    pub body_timeout: Duration,
    /// The per-client limits.
    pub rate_limits: RateLimitSettings,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            request_timeout: Duration::from_secs(10),
            max_body_bytes: 64 * 1024,
            body_timeout: Duration::from_secs(10),
            rate_limits: RateLimitSettings::default(),
        }
    }
}

/// The whole API as one router, with the default [`Limits`].
pub fn router(state: AppState) -> Router {
    router_with_limits(state, Limits::default())
}

/// The whole API as one router.
pub fn router_with_limits(state: AppState, limits: Limits) -> Router {
    let guard = Arc::new(guard::Guard::new(limits.rate_limits.clone()));
    router_with_guard(state, limits, guard)
}

/// A path of the end-user API (`/api/v1…`), made at compile time.
macro_rules! api {
    ($path:literal) => {
        concat!("/api/v1", $path)
    };
}

/// A path of the admin API (`/api/v1/admin…`), made at compile time.
macro_rules! admin {
    ($path:literal) => {
        concat!("/api/v1/admin", $path)
    };
}

/// A router that records the method and path of every route it is given, so that the
/// OpenAPI test compares the document with the routes actually served (`route_list`).
///
/// Every handler added through [`route!`] is wrapped at once in what goes around every route
/// ([`Around`]: `edge`, then this group's own `inner` layer, e.g. the admin check), as one
/// typed service, instead of by `Router::layer` afterwards: that boxed the layered stack into
/// a second `Route` around each route's own, and axum clones a route's box and calls through
/// it per request, so every request paid two boxed clones, two boxed futures and a second
/// `Oneshot` (see PERFORMANCE.md).
pub struct Routes<L = tower::layer::util::Identity> {
    router: Router<Shared>,
    list: Vec<(&'static str, &'static str)>,
    around: Around,
    inner: L,
}

/// What goes around every route, the fallbacks included: the state the handlers are given
/// and [`edge`] (metrics, limits, timeouts, panics; the body size limit).
#[derive(Clone)]
pub struct Around {
    shared: Shared,
    edge: edge::EdgeLayer,
}

impl Around {
    fn new(shared: Shared, limits: &Limits, log_failures: bool) -> Around {
        Around {
            shared,
            edge: edge::EdgeLayer::new(
                limits.max_body_bytes,
                limits.request_timeout,
                limits.body_timeout,
                log_failures,
            ),
        }
    }

    /// A handler with the state and `edge` around it, and nothing else.
    fn wrap<H, T>(&self, handler: H) -> edge::Edge<HandlerService<H, T, Shared>>
    where
        H: Handler<T, Shared>,
        T: 'static,
    {
        self.edge.layer(handler.with_state(self.shared.clone()))
    }
}

/// The routes' state: the [`AppState`] and the per-client [`guard::Guard`] behind one
/// reference count. axum clones the router's state into every route and clones a route
/// (with its state) on every request, twice with the layer around it: an `AppState` is a
/// dozen `Arc`s, each of whose counts every worker thread would bump and drop per request
/// (atomics on cache lines shared by all cores, see PERFORMANCE.md), and the guard was an
/// extension inserted into every request. Handlers still take `State<AppState>` and
/// [`guard::Caller`]; each clones its part out of this (through [`FromRef`]) only when it
/// asks for it.
#[derive(Clone)]
pub struct Shared(Arc<SharedParts>);

struct SharedParts {
    app: AppState,
    guard: Arc<guard::Guard>,
    public_list: public_list::PublicList,
}

impl Shared {
    fn new(app: AppState, guard: Arc<guard::Guard>) -> Shared {
        let public_list = public_list::PublicList::new(app.store.clone());
        Shared(Arc::new(SharedParts {
            app,
            guard,
            public_list,
        }))
    }

    /// The state, borrowed: for the hottest handlers (`status`), which take
    /// `State<Shared>` rather than clone an `AppState` per request.
    pub fn app(&self) -> &AppState {
        &self.0.app
    }

    /// The per-client limits, borrowed.
    pub fn guard(&self) -> &guard::Guard {
        &self.0.guard
    }

    /// The public event list the requests of a second share.
    pub fn public_list(&self) -> &public_list::PublicList {
        &self.0.public_list
    }
}

impl FromRef<Shared> for AppState {
    fn from_ref(shared: &Shared) -> AppState {
        shared.0.app.clone()
    }
}

impl FromRef<Shared> for Arc<guard::Guard> {
    fn from_ref(shared: &Shared) -> Arc<guard::Guard> {
        shared.0.guard.clone()
    }
}

/// Adds a route to a [`Routes`] and records it: `route!(r, PATH, get(h).post(h2))`. Each
/// handler is wrapped in what goes around every route ([`Routes::wrap`]), and a method the
/// path does not serve answers `405 METHOD_NOT_ALLOWED` through the same wrapping (without
/// the group's own `inner` layer, as before: a wrong method is not an admin request).
macro_rules! route {
    ($routes:ident, $path:expr, $($method:ident($handler:expr)).+) => {{
        let path: &'static str = $path;
        let methods = $routes.methods()
            $(.on_service($crate::http::method_filter(stringify!($method)), $routes.wrap($handler)))+;
        $routes.router = std::mem::take(&mut $routes.router).route(path, methods);
        $( $routes.list.push((stringify!($method), path)); )+
    }};
}
pub(crate) use route;

/// The method filter of `route!`'s method names.
pub(crate) fn method_filter(name: &str) -> MethodFilter {
    match name {
        "get" => MethodFilter::GET,
        "post" => MethodFilter::POST,
        "put" => MethodFilter::PUT,
        "delete" => MethodFilter::DELETE,
        "patch" => MethodFilter::PATCH,
        "head" => MethodFilter::HEAD,
        "options" => MethodFilter::OPTIONS,
        other => panic!("route!: unknown method {other}"),
    }
}

impl Routes {
    /// No routes yet, wrapped in `around` only.
    pub fn new(around: &Around) -> Routes {
        Routes {
            router: Router::new(),
            list: Vec::new(),
            around: around.clone(),
            inner: tower::layer::util::Identity::new(),
        }
    }
}

impl<L> Routes<L> {
    /// The routes added from now on get `inner` between `edge` and the handler (axum's
    /// `route_layer`, e.g. the admin check): the routes' own answers are measured, limited
    /// and timed by `edge` as every other.
    pub fn inner<L2>(self, inner: L2) -> Routes<L2> {
        assert!(
            self.list.is_empty(),
            "set the inner layer before adding routes"
        );
        Routes {
            router: self.router,
            list: self.list,
            around: self.around,
            inner,
        }
    }

    /// A handler wrapped: `edge`, then `inner`, then the handler with the state.
    pub fn wrap<H, T>(&self, handler: H) -> edge::Edge<L::Service>
    where
        H: Handler<T, Shared>,
        T: 'static,
        L: tower::Layer<HandlerService<H, T, Shared>>,
    {
        self.around.edge.layer(
            self.inner
                .layer(handler.with_state(self.around.shared.clone())),
        )
    }

    /// A path's methods before any is added: what answers a method it does not serve.
    pub fn methods(&self) -> MethodRouter<Shared> {
        MethodRouter::new().fallback_service(self.around.wrap(method_not_allowed))
    }

    /// Both sets of routes. Merged, not nested: `nest` rewrites the URI of every request
    /// under its prefix (a `format!` and an allocation per request, measured in
    /// PERFORMANCE.md).
    pub fn merge<L2>(mut self, other: Routes<L2>) -> Self {
        self.router = self.router.merge(other.router);
        self.list.extend(other.list);
        self
    }
}

/// `Cache-Control: no-store`: answers that carry a credential (an access token) or admin
/// data, which no shared cache may keep.
pub(crate) static NO_STORE: axum::http::HeaderValue =
    axum::http::HeaderValue::from_static("no-store");

/// `Cache-Control: no-store` on an answer (the session routes' `inner` layer).
async fn no_store(mut res: axum::response::Response) -> axum::response::Response {
    res.headers_mut()
        .insert(axum::http::header::CACHE_CONTROL, NO_STORE.clone());
    res
}

/// Every route the server answers, as (method in lower case, path), in axum's path syntax
/// (`/api/v1/events/{event_id}`).
pub fn route_list(state: &AppState) -> Vec<(&'static str, &'static str)> {
    let guard = Arc::new(guard::Guard::new(RateLimitSettings::default()));
    let shared = Shared::new(state.clone(), guard);
    routes(&Around::new(shared, &Limits::default(), true)).list
}

/// Every route, each wrapped in `around`.
fn routes(around: &Around) -> Routes {
    let shared = &around.shared;
    let mut admin = Routes::new(around).inner(middleware::from_fn_with_state(
        shared.clone(),
        admin::require_admin,
    ));
    route!(admin, admin!("/events"), get(admin::list_events));
    route!(
        admin,
        admin!("/events/{event_id}"),
        put(admin::put_event)
            .get(admin::get_event)
            .delete(admin::delete_event)
    );
    route!(
        admin,
        admin!("/events/{event_id}/pause"),
        post(admin::pause)
    );
    route!(
        admin,
        admin!("/events/{event_id}/resume"),
        post(admin::resume)
    );
    route!(
        admin,
        admin!("/events/{event_id}/clear"),
        post(admin::clear)
    );
    route!(
        admin,
        admin!("/events/{event_id}/invites"),
        post(admin::create_invites).get(admin::list_invites)
    );
    route!(
        admin,
        admin!("/events/{event_id}/queue"),
        get(admin::queue_head)
    );
    route!(admin, admin!("/stats"), get(admin::stats));
    route!(admin, admin!("/defaults"), get(admin::defaults));
    route!(
        admin,
        admin!("/events/{event_id}/history"),
        get(records::history)
    );
    route!(
        admin,
        admin!("/events/{event_id}/history.csv"),
        get(records::history_csv)
    );
    route!(
        admin,
        admin!("/events/{event_id}/prequeue"),
        get(admin::prequeue)
    );
    route!(
        admin,
        admin!("/events/{event_id}/announcement"),
        post(lifecycle::announce).delete(lifecycle::clear_announcement)
    );
    route!(
        admin,
        admin!("/events/{event_id}/end"),
        post(lifecycle::end)
    );
    route!(admin, admin!("/audit"), get(records::audit_list));
    route!(
        admin,
        admin!("/events/{event_id}/inventory"),
        put(sale::put_inventory).get(sale::get_inventory)
    );

    let mut api = Routes::new(around);
    route!(api, api!("/queue/join"), post(queue::join));
    route!(api, api!("/queue/status"), get(queue::status));
    route!(api, api!("/queue/heartbeat"), post(queue::heartbeat));
    route!(api, api!("/queue/enter"), post(queue::enter));
    route!(
        api,
        api!("/queue/leave"),
        post(queue::leave).delete(queue::leave)
    );
    route!(api, api!("/queue/info"), get(queue::info));
    route!(api, api!("/queue/ws"), get(live::ws));
    route!(api, api!("/queue/events"), get(live::events));
    route!(api, api!("/events"), get(public_list::list_events));
    route!(api, api!("/events/{event_id}"), get(pages::get_event));
    route!(api, api!("/openapi.json"), get(openapi::serve));
    route!(api, api!("/gate"), get(gate::gate));

    // The admitted person's routes: each answer, errors included, is about one session and
    // answers a request carrying its access token, so no shared cache may keep it (a kept
    // seat map or `verify` would hand one person's session to the next one asking).
    let mut session = Routes::new(around).inner(middleware::map_response(no_store));
    route!(session, api!("/queue/verify"), post(queue::verify));
    route!(
        session,
        api!("/session/heartbeat"),
        post(queue::session_heartbeat)
    );
    route!(
        session,
        api!("/session/complete"),
        post(queue::session_complete)
    );
    route!(
        session,
        api!("/session/holds"),
        get(sale::seat_map).post(sale::hold).delete(sale::release)
    );
    route!(session, api!("/session/extend"), post(sale::extend));

    let mut site = Routes::new(around);
    route!(site, "/.well-known/jwks.json", get(queue::jwks));
    route!(site, "/healthz", get(ops::healthz));
    route!(site, "/readyz", get(ops::readyz));
    route!(site, "/metrics", get(ops::metrics));
    route!(site, "/", get(pages::index));
    route!(site, "/wait/{event_id}", get(look::wait));
    route!(site, "/wait/{event_id}/theme.css", get(look::theme));
    route!(
        site,
        "/wait/{event_id}/queue",
        get(gate::queue_page).post(gate::hand_over)
    );
    route!(site, "/branding/{file}", get(look::branding));
    route!(site, "/demo/booking", get(pages::booking));
    route!(site, "/admin", get(pages::admin));
    route!(site, "/assets/{file}", get(pages::asset));

    api.merge(session)
        .merge(admin)
        .merge(site)
        .merge(demo_site::routes(&shared.0.app, around))
}

/// The whole API as one router, limiting through `guard` (which a test may inspect).
pub fn router_with_guard(state: AppState, limits: Limits, guard: Arc<guard::Guard>) -> Router {
    // A span and two debug events per request: worth their cost only when someone reads
    // them. Without them `edge` logs the server errors the trace layer would have.
    let traced = tracing::enabled!(target: "tower_http::trace", tracing::Level::DEBUG);
    let shared = Shared::new(state, guard);
    // `edge` (which also puts the body-read timeout and the body size limit around a body
    // that may still arrive) goes around each handler as it is added, the fallbacks
    // included, so that they are measured and guarded too.
    let around = Around::new(shared.clone(), &limits, !traced);
    let router = routes(&around)
        .router
        .fallback_service(any_service(around.wrap(not_found)));
    let router = if traced {
        // The path, not the URI: a query may carry a waiting token (`?token=`), which a
        // debug log must not keep.
        router.layer(
            TraceLayer::new_for_http().make_span_with(|req: &axum::http::Request<_>| {
                tracing::debug_span!(
                    "request",
                    method = %req.method(),
                    path = req.uri().path(),
                    version = ?req.version(),
                )
            }),
        )
    } else {
        router
    };
    router.with_state(shared)
}

/// `no-store` as the 405 below: an unknown admin path is answered here, before the admin
/// check.
async fn not_found() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CACHE_CONTROL, NO_STORE.clone())],
        AppError::NotFound,
    )
}

/// Also `no-store`: API.md says so of every admin answer, and this one is answered before
/// the admin check (a wrong method is not an admin request). It holds nothing private, so
/// every path's gets the same (as does an unknown path's `404`).
async fn method_not_allowed() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CACHE_CONTROL, NO_STORE.clone())],
        AppError::MethodNotAllowed,
    )
}
