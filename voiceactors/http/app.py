"""The Quart-Trio application.

``create_app(settings)`` builds the app; the runtime (brain, tool executor,
call supervisor) lives in the app's serving lifespan (``@app.while_serving``):
it starts before the first request is served and, when serving stops, is
cancelled and joined within ``settings.shutdown_deadline_s``.

The runtime runs as a task of the lifespan's nursery (``app.nursery``), not in
a nursery held open across the generator's ``yield``: a nursery in a
suspended generator cannot deliver a crash or a cancellation to the right
task. The generator only starts that task and, at shutdown, tells it to stop
and waits for it.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401 - see below
import uuid
from typing import Any

import structlog
import trio
from quart import g, request
from quart.json.provider import DefaultJSONProvider
from quart_trio import QuartTrio

from voiceactors import voice_config, metrics, tracing
from voiceactors.http import auth, console_sessions, errors, guards, ratelimit, request_ids
from voiceactors.http import phone  # noqa: F401 - its route is on the voice blueprint
from voiceactors.http import live  # noqa: F401 - its route is on the voice blueprint
from voiceactors.http.asgi import ClosingHTTPConnection, PathSwitch, RateLimitRefusal
from voiceactors.http.console import console_bp
from voiceactors.http.connect import CONNECT_PATH, METHODS, ConnectHandler, FirstReadConnect
from voiceactors.http.forwarded import ForwardedScope, TrustedProxies
from voiceactors.http.routes import VoiceState, bp, metrics_bp
from voiceactors.logs import get_logger
from voiceactors.http.mcp import MCP_PATH, McpEndpoint
from voiceactors.runtime import open_runtime
from voiceactors.settings import Settings, shutdown_deadlines
from voiceactors.tools.registry import REGISTRY

# werkzeug encodes every request's Host with the idna codec. Loaded lazily, that
# codec is a file to open on the first request: a server out of file
# descriptors (EMFILE) would answer it with hypercorn's bare 500. Hence the
# import above, at start-up.

REQUEST_ID_HEADER = request_ids.HEADER

_log = get_logger(actor="http")


async def _host_runtime(voice: VoiceState, mcp: McpEndpoint, stop: trio.Event, done: trio.Event, *,
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Own the runtime for as long as the app serves. A runtime that fails to
    start or crashes is logged, leaves ``voice.runtime`` None (routes answer
    "voice runtime unavailable", ``/status`` 503) and sets
    ``voice.runtime_failed``: ``serve`` then stops and exits non-zero, so a
    supervisor (``serve --workers``' parent, systemd) starts it again.
    ``/mcp`` serves inside the runtime: it stops first, before the executor it feeds."""
    try:
        async with open_runtime(voice.settings, brain_backend=voice.brain_backend) as runtime, mcp.running():
            voice.runtime = runtime
            task_status.started()
            await stop.wait()
    except Exception as error:  # noqa: BLE001 - logged; the process is stopped by its server
        _log.error("http.runtime_failed", error_type=type(error).__name__, exc_info=error)
        if not stop.is_set():       # failed while serving, not on its way down
            voice.runtime_failed.set()
    finally:
        voice.runtime = None
        done.set()
    # started() was never called when the runtime failed to start
    # (nursery.start then raises RuntimeError in the caller, handled there).


def _install_lifespan(app: QuartTrio, voice: VoiceState, mcp: McpEndpoint) -> None:
    @app.while_serving
    async def _runtime_lifespan() -> Any:
        stop, done = trio.Event(), trio.Event()
        try:
            await app.nursery.start(_host_runtime, voice, mcp, stop, done)
        except RuntimeError:
            _log.error("http.runtime_not_started")
            voice.runtime_failed.set()
        yield
        # Streams (SSE) end first; then the actors, bounded.
        voice.stopping.set()
        stop.set()
        with trio.move_on_after(shutdown_deadlines(voice.settings).lifespan_s, shield=True):
            await done.wait()
        assert voice.openai_clients is not None   # VoiceState.__post_init__ sets it
        await voice.openai_clients.aclose()


def _install_request_hooks(app: QuartTrio) -> None:
    """Name and time every request Quart serves, and log and count its answer
    (the connect's handler does the same for its own, ``connect.py``)."""

    @app.before_request
    async def _begin() -> None:
        given = request.headers.get(REQUEST_ID_HEADER, "")
        g.request_id = request_ids.request_id_for(given)
        g.started = trio.current_time()
        structlog.contextvars.bind_contextvars(request_id=g.request_id)
        g.span = tracing.start("http.request", **{"http.request.method": request.method,
                                                  "http.route": _rule_of(request)})

    @app.after_request
    async def _finish(response: Any) -> Any:
        request_id = getattr(g, "request_id", None) or uuid.uuid4().hex
        response.headers[REQUEST_ID_HEADER] = request_id
        if request.path.startswith("/api/"):
            response.headers["Cache-Control"] = "no-store"
        rule = _rule_of(request)
        metrics.http_request(rule, response.status_code)
        tracing.finish(getattr(g, "span", None), outcome=str(response.status_code),
                       **{"http.response.status_code": response.status_code})
        started = getattr(g, "started", None)
        duration_ms = round((trio.current_time() - started) * 1000, 1) if started is not None else None
        _log.info("http.request", method=request.method, path=request.path, status=response.status_code,
                  duration_ms=duration_ms, request_id=request_id)
        return response


def _rule_of(request: Any) -> str:
    """The route's rule (bounded: never the raw path), or ``unmatched``."""
    return request.url_rule.rule if request.url_rule is not None else "unmatched"


class VoiceApp(QuartTrio):
    """QuartTrio whose connections let hypercorn close them and that answers
    503 past ``max_requests_in_flight`` (``asgi.py``)."""

    asgi_http_class = ClosingHTTPConnection
    requests_in_flight = 0
    max_requests_in_flight = 0          # 0: no cap (set from the settings)
    trusted_proxies = TrustedProxies(())   # whose forwarded headers are believed (set from the settings)
    connect: ConnectHandler | None = None    # every request to /api/voice/connect (connect.py; set by create_app)
    guards: tuple[guards.Guard, ...] = ()     # every request's, in order (guards.py; set by create_app)

    def accept_refusal(self) -> RateLimitRefusal | None:
        """What ``serving.serve`` asks at accept: the early 429 from a
        connection's first read (None when the rate limits are off)."""
        limiter = self.extensions.get("voiceactors_rate_limiter")
        if limiter is None or not limiter.enabled:
            return None
        return RateLimitRefusal(self, limiter, self.trusted_proxies)

    def first_read_answer(self, server_headers: Any) -> FirstReadConnect:
        """What ``serving.serve`` asks of a connection's first read: a
        connect given to this app below hypercorn (``connect.py``).
        ``server_headers`` gives hypercorn's own response headers."""
        return FirstReadConnect(self, server_headers)


def check_journal_settings(settings: Settings) -> None:
    """InvalidSettings naming what of the journal's ``voice`` block (or the
    ``mcp_sources`` setting) the server cannot start with: bad MCP sources,
    bad session settings. ``create_app`` checks, and ``serve`` before it
    starts (a usage error there, not a crash inside the serving loop)."""
    from voiceactors.mcp.client.hub import check_sources   # the MCP SDK, only when an app is made
    check_sources(settings)
    voice_config.check_session_settings(settings)
    voice_config.check_phone_settings(settings)
    voice_config.check_agents(settings, REGISTRY)


def create_app(settings: Settings, *, brain_backend: Any | None = None) -> QuartTrio:
    """The app for ``settings``. Serve it once (hypercorn or ``app.test_app()``).

    Raises ``settings.InvalidSettings`` for values the server cannot run with
    (``Settings.problems``: a bad enum value, a non-positive size, a broken
    shutdown deadline chain; the journal's bad MCP sources or session
    settings) and ``auth.InsecureSettings`` for settings that
    would expose the API off loopback without a token. ``brain_backend`` replaces the BrainActor's
    backend (None: chosen from the journal's ``voice.brain``).
    """
    settings.validate()
    check_journal_settings(settings)
    reason = auth.refusal(settings)
    if reason:
        raise auth.InsecureSettings(reason)
    app = VoiceApp(__name__)
    app.max_requests_in_flight = settings.max_requests_in_flight
    app.config.update(
        MAX_CONTENT_LENGTH=settings.body_limit,
        # The lifespan's shutdown runs under this deadline (quart-trio puts
        # it on the lifespan nursery): it must outlast the lifespan's own wait.
        BACKGROUND_TASK_SHUTDOWN_TIMEOUT=shutdown_deadlines(settings).background_tasks_s,
        PROVIDE_AUTOMATIC_OPTIONS=False,
        JSON_SORT_KEYS=False,
    )
    # quart types app.json as the base JSONProvider; it is the DefaultJSONProvider
    provider = app.json
    assert isinstance(provider, DefaultJSONProvider), provider
    provider.ensure_ascii = False
    provider.sort_keys = False
    voice = VoiceState(settings=settings, brain_backend=brain_backend)
    app.extensions["voiceactors"] = voice
    _install_request_hooks(app)
    failures = ratelimit.TokenFailures(settings)   # every refused credential's bucket, any route
    auth.keep_failures(app, failures)
    limiter = ratelimit.install(app, settings)
    app.guards = guards.declared(settings, failures, limiter, lambda: console_sessions.store_of(app))
    guards.install(app, app.guards)       # Quart's requests; the connect's handler applies the same list
    errors.install(app)
    app.register_blueprint(bp)
    app.register_blueprint(metrics_bp)
    app.register_blueprint(console_bp)
    mcp = McpEndpoint(settings, lambda: voice.runtime.tools if voice.runtime is not None else None, failures)
    app.asgi_app = PathSwitch(app, app.asgi_app, MCP_PATH, mcp)  # type: ignore[method-assign]
    app.trusted_proxies = TrustedProxies(settings.trusted_proxies)
    app.connect = ConnectHandler(voice, app.guards, float(app.config["BODY_TIMEOUT"]))
    if app.trusted_proxies:               # outermost: everything after it sees the forwarded client
        app.asgi_app = ForwardedScope(app.asgi_app, app.trusted_proxies)  # type: ignore[method-assign]
    _install_lifespan(app, voice, mcp)
    return app


def routes_served(app: QuartTrio) -> set[tuple[str, str]]:
    """Every ``(rule, method)`` the app answers but static files and
    ``/mcp``: Quart's routes (``HEAD`` and ``OPTIONS`` aside) and the
    connect's handler (``connect.py``) — what the OpenAPI document lists."""
    routes = {(rule.rule, method) for rule in app.url_map.iter_rules() if rule.endpoint != "static"
              for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}}
    return routes | {(CONNECT_PATH, method) for method in METHODS}


def voice_state(app: QuartTrio) -> VoiceState:
    """The app's shared state (settings, live runtime) — for tests and the server."""
    voice: VoiceState = app.extensions["voiceactors"]
    return voice
