"""Server settings: one frozen object, built from flags > env > defaults.

Each setting is declared once, as a field of ``Settings`` whose metadata is a
``Spec`` (environment variable, flag, help, unit, allowed values). From those
declarations come ``Settings.from_env``, the serve flags (``add_flags``,
``settings_from_args``), the startup check (``Settings.problems``) and the
tables of ``docs/configuration.md`` (``python -m voiceactors.settings
--write docs/configuration.md``; a test fails when the doc drifts).

The journal's ``voice`` block (OpenAI key, models, brain backend) is read at
request time by ``voiceactors.voice_config`` so a changed journal config takes effect
without a restart; everything here is fixed for the life of the process.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import ipaddress
import math
import os
import re
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from voiceactors.mcp.client import sources as mcp_sources

SPEC = "voiceactors.setting"


class InvalidSettings(ValueError):
    """Settings the server cannot run with; the message lists every problem."""


@dataclass(frozen=True)
class Spec:
    """What the operator sees of one setting. ``env`` names are tried in order
    (the first non-empty wins); ``minimum`` is inclusive, ``positive`` means
    strictly above zero (infinity counts)."""

    group: str
    help: str
    env: tuple[str, ...] = ()
    flag: str | None = None
    metavar: str | None = None
    repeatable: bool = False            # the flag may be given many times (a tuple setting)
    unit: str = ""
    choices: tuple[str, ...] = ()
    positive: bool = False
    minimum: float | None = None
    maximum: float | None = None
    normalize: Callable[[str], str] | None = None   # applied to a value read from the environment
    doc_default: str | None = None      # the default as the doc table shows it, when str() is not it
    short: str | None = None            # the flag's help, when the first clause of ``help`` is too long
    check: Callable[[Any], str | None] | None = None   # a value's problem beyond the checks above (None: fine)


def setting(default: Any, group: str, help: str, *, env: str | tuple[str, ...] = (),
            required: bool = False, **spec: Any) -> Any:
    """A ``Settings`` field with its declaration. ``required``: the dataclass
    has no default (callers must pass it) but ``from_env`` uses ``default``."""
    names = (env,) if isinstance(env, str) else tuple(env)
    metadata = {SPEC: Spec(group=group, help=help, env=names, **spec), "default": default}
    if required:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


def is_loopback_host(host: str) -> bool:
    """``host`` (a listen address) is loopback: an IP literal in 127.0.0.0/8 or
    ``::1`` (also IPv4-mapped), or the name ``localhost``. Any other name is
    not, whatever it resolves to today."""
    text = host.strip().strip("[]")
    if text.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


SERVER, TOOLS, CALLS, BRAIN, HTTP = ("Server", "Tools (ToolExecutor)", "Calls (CallSupervisor / CallActor)",
                                     "Brain", "HTTP")
USAGE = "Usage and budgets"
CLUSTER = "Scaling out (Redis)"
GROUPS = (SERVER, TOOLS, CALLS, BRAIN, HTTP, USAGE, CLUSTER)

#: gpt-realtime's prices (USD per million tokens: text in, text out, audio in,
#: audio out, cached in) as published on openai.com/api/pricing on 2025-08-28,
#: the model's general availability (cached text and cached audio input are
#: both $0.40).
DEFAULT_PRICES = ("gpt-realtime=4/16/32/64/0.4",)


def _redis_url_problem(value: Any) -> str | None:
    """The URL's scheme only: the rest may hold a password, never echoed."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://")):
        return "must be a redis://, rediss:// or unix:// URL"
    return None


def _trusted_proxies_problem(value: Any) -> str | None:
    """Each entry an address or CIDR network (http/forwarded.py reads them; names are not resolved)."""
    found = []
    for entry in value:
        try:
            ipaddress.ip_network(str(entry).strip(), strict=False)
        except ValueError:
            found.append(f"{entry!r} is not an IP address or CIDR network")
    return "; ".join(found) or None


def _price_table_problem(value: Any) -> str | None:
    from voiceactors.usage.cost import price_table_problem
    return price_table_problem(value)


@dataclass(frozen=True)
class Settings:
    # --- server ---
    journal: Path = setting(
        Path("journal"), SERVER, "the solstone journal folder", required=True,
        env=("VOICEACTORS_JOURNAL", "SOLSTONE_JOURNAL"), flag="--journal", metavar="DIR")
    state_dir: Path = setting(
        Path(".state"), SERVER, "our own files (search index, call records, write log)", required=True,
        env="VOICEACTORS_STATE_DIR", flag="--state-dir", metavar="DIR")
    host: str = setting(
        "127.0.0.1", SERVER, "listen address; off loopback a token is required. Loopback is decided by the "
        "address (127.0.0.0/8, `::1`) or the name `localhost`; any other name (`127.evil.example`) is not "
        "loopback", env="VOICEACTORS_HOST", flag="--host")
    port: int = setting(
        8765, SERVER, "listen port (`0`: any free port)", env="VOICEACTORS_PORT", flag="--port",
        minimum=0, maximum=65535)
    allowed_hosts: tuple[str, ...] = setting(
        (), SERVER, "more `Host` names the server answers to, beside `localhost`, `127.0.0.1`, `[::1]`, a "
        "specific listen address and the address a connection arrived at (those must carry the bound port). "
        "`name` matches with any port (a reverse proxy's), `name:port` only that port. Any other `Host` "
        "answers 421 `host not allowed` (DNS rebinding); a malformed entry makes `serve` exit 2. The "
        "environment variable is comma-separated", env="VOICEACTORS_ALLOWED_HOSTS",
        flag="--allowed-host", metavar="NAME[:PORT]", repeatable=True, doc_default="none",
        short="another Host name this server answers to, beside loopback names and the listen address")
    api_token: str | None = setting(
        None, SERVER, "bearer token for `/api/voice/*`; required off loopback, enforced whenever set",
        env="VOICEACTORS_API_TOKEN")
    openai_api_key_env: str | None = setting(
        None, SERVER, "the OpenAI key when the journal has none", env="OPENAI_API_KEY")
    openai_webhook_secret_env: str | None = setting(
        None, SERVER, "the secret OpenAI signs phone-call webhooks with (`whsec_…`) when the journal has none "
        "(`voice.webhook_secret`); without either, `/api/voice/phone/incoming` answers 503 (docs/phone.md)",
        env="OPENAI_WEBHOOK_SECRET")
    openai_base_url: str = setting(
        "https://api.openai.com/v1", SERVER, "REST base; the sideband's `ws(s)://` URL is derived from it; the "
        "console's browser posts its WebRTC offer to `{base}/realtime/calls`, and its origin is the only other "
        "one in the console's CSP `connect-src`", env="OPENAI_BASE_URL", normalize=lambda url: url.rstrip("/"))
    log_format: str = setting(
        "json", SERVER, "log line format: one JSON object per line (`json`) or a human-readable form (`console`)",
        env="VOICEACTORS_LOG_FORMAT", flag="--log-format", choices=("json", "console"), short="log line format")
    log_level: str = setting(
        "info", SERVER, "the least severe level logged: `debug`, `info`, `warning`, `error` or `critical` "
        "(any case)", env="VOICEACTORS_LOG_LEVEL",
        choices=("debug", "info", "warning", "error", "critical"), normalize=str.lower)
    demo: bool = setting(
        False, SERVER, "run on a generated sample journal with the embedded Realtime simulator "
        "(`serve` only)", flag="--demo")
    gc_full_interval_s: float = setting(
        300.0, SERVER, "`serve` only: one full garbage collection this often instead of when Python's counters "
        "decide (see docs/operations.md § Garbage collection); `0` = Python's own policy",
        env="VOICEACTORS_GC_FULL_INTERVAL", unit="s", minimum=0)

    # --- tools (ToolExecutor) ---
    tool_name_style: str = setting(
        "dotted", TOOLS, "manifest spelling: `dotted` (`journal.get_day`) or `underscore` (`journal_get_day`); "
        "both are accepted at dispatch", env="VOICEACTORS_TOOL_NAMES", choices=("dotted", "underscore"))
    tool_concurrency: int = setting(
        64, TOOLS, "tool calls running at once, across all calls", env="VOICEACTORS_TOOL_CONCURRENCY",
        unit="tool calls", positive=True)
    tool_timeout_read_s: float = setting(
        10.0, TOOLS, "a read tool's time limit (`{\"error\": \"tool timed out\"}`)",
        env="VOICEACTORS_TOOL_TIMEOUT_READ", unit="s", positive=True)
    tool_timeout_write_s: float = setting(
        20.0, TOOLS, "a write tool's reporting limit (the write itself always finishes)",
        env="VOICEACTORS_TOOL_TIMEOUT_WRITE", unit="s", positive=True)
    tool_reuse_s: float = setting(
        2.0, TOOLS, "how long a reusable read's answer (`calendar.today`, `briefing.get`) serves other calls; "
        "`0` = never (see docs/tools.md)", env="VOICEACTORS_TOOL_REUSE", unit="s", minimum=0)
    tool_ack_after_s: float = setting(
        0.7, TOOLS, "a tool call that may run on while the conversation goes on (reads, MCP sources) and has not "
        "answered this long after its response ended is acknowledged: the assistant says, once, that it is on it, "
        "and speaks the answer when it comes (`0`: off; docs/calls.md § Slow tools). Not on a Live call, whose "
        "service acknowledges a delegation itself (docs/live.md)",
        env="VOICEACTORS_TOOL_ACK_AFTER", unit="s", minimum=0,
        short="acknowledge a slow tool call after this long (`0`: off)")
    tool_slow_max: int = setting(
        2, TOOLS, "acknowledged slow tool calls still unanswered at once in one call; a batch that would pass it "
        "is not acknowledged and waits in silence, as with `tool_ack_after_s` 0, until fewer are in flight",
        env="VOICEACTORS_TOOL_SLOW_MAX", unit="tool calls", minimum=0,
        short="acknowledged slow tool calls in flight per call")
    tool_progress_after_s: float = setting(
        5.0, TOOLS, "an acknowledged tool call whose source reports progress (MCP progress notifications) and has "
        "run this long gets one progress line spoken (`0`: never; the console's tool feed shows progress "
        "either way)", env="VOICEACTORS_TOOL_PROGRESS_AFTER", unit="s", minimum=0,
        short="speak one progress line of a slow tool call after this long (`0`: never)")
    tool_output_cap: int = setting(
        64_000, TOOLS, "characters of one tool output", env="VOICEACTORS_TOOL_OUTPUT_CAP", unit="chars",
        positive=True)
    turn_output_cap: int = setting(
        96_000, TOOLS, "characters of read outputs shared by one user turn", env="VOICEACTORS_TURN_OUTPUT_CAP",
        unit="chars", positive=True)
    tool_calls_per_turn: int = setting(
        6, TOOLS, "tool calls the model may make in one user turn", env="VOICEACTORS_TOOL_CALLS_PER_TURN",
        unit="tool calls", positive=True)
    search_refresh_interval_s: float = setting(
        300.0, TOOLS, "how stale our journal search index may get: a `journal.search` past it starts an "
        "incremental refresh in a child process and answers from the index as it is (not used when solstone's "
        "own index is there; docs/journal-format.md)", env="VOICEACTORS_SEARCH_REFRESH_INTERVAL", unit="s", minimum=0)
    journal_lock_timeout_s: float = setting(
        5.0, TOOLS, "how long a write waits for a journal day file's lock (held by solstone or another writer) "
        "before answering `journal busy: …`, nothing changed (docs/tools.md, docs/journal-format.md)",
        env="VOICEACTORS_JOURNAL_LOCK_TIMEOUT", unit="s", positive=True)
    mcp_sources: str | None = setting(
        None, TOOLS, "MCP tool sources as a JSON list, `[{\"name\": \"crm\", \"url\": \"http://host/mcp\", "
        "\"token_env\": \"CRM_TOKEN\"}]` (optional `timeout_s`); when unset, the journal's `voice.mcp_sources`. "
        "Names are slugs without `.` or `_`, not a journal tool family and not `handoff` (docs/mcp.md)",
        env="VOICEACTORS_MCP_SOURCES", doc_default="unset (the journal's)",
        short="MCP tool sources as a JSON list (docs/mcp.md)", check=mcp_sources.settings_problem)
    mcp_discovery_ttl_s: float = setting(
        300.0, TOOLS, "how often each MCP source's tools are listed again (a source down or refused is retried "
        "then)", env="VOICEACTORS_MCP_DISCOVERY_TTL", unit="s", positive=True)
    mcp_timeout_s: float = setting(
        10.0, TOOLS, "an MCP source's request time limit when its entry has no `timeout_s`",
        env="VOICEACTORS_MCP_TIMEOUT", unit="s", positive=True)

    # --- calls (CallSupervisor / CallActor) ---
    max_calls: int = setting(
        1000, CALLS, "live calls at once; beyond it `POST /api/voice/connect` answers 503 `voice at capacity` "
        "(`0`: every connect is refused)", env="VOICEACTORS_MAX_CALLS", unit="calls", minimum=0)
    call_idle_timeout_s: float = setting(
        600.0, CALLS, "a call with no event for this long is closed", env="VOICEACTORS_CALL_IDLE_TIMEOUT",
        unit="s", positive=True)
    call_max_duration_s: float = setting(
        3570.0, CALLS, "the longest a call lasts: it then ends cleanly (`max_duration`), just before the "
        "service's own 60-minute cap would cut it off", env="VOICEACTORS_CALL_MAX_DURATION", unit="s",
        positive=True)
    call_wrap_up_s: float = setting(
        120.0, CALLS, "this long before `call_max_duration_s` the assistant says that the call is about to end "
        "(`0`: no wrap-up); must be less than `call_max_duration_s`", env="VOICEACTORS_CALL_WRAP_UP", unit="s",
        minimum=0)
    connect_timeout_s: float = setting(
        10.0, CALLS, "joining the sideband websocket", env="VOICEACTORS_CONNECT_TIMEOUT", unit="s",
        positive=True)
    reconnect_base_s: float = setting(
        0.5, CALLS, "sideband reconnect backoff: the first wait (doubling, with jitter)",
        env="VOICEACTORS_RECONNECT_BASE", unit="s", positive=True)
    reconnect_max_s: float = setting(
        20.0, CALLS, "sideband reconnect backoff: the longest wait", env="VOICEACTORS_RECONNECT_MAX", unit="s",
        positive=True)
    reconnect_attempts: int = setting(
        8, CALLS, "sideband reconnects in a row before the call ends (`0`: none)",
        env="VOICEACTORS_RECONNECT_ATTEMPTS", unit="attempts", minimum=0)
    close_deadline_s: float = setting(
        5.0, CALLS, "a closing call's time to send its last outputs and flush its record; must be less than "
        "`shutdown_deadline_s`", env="VOICEACTORS_CLOSE_DEADLINE", unit="s", positive=True)
    shutdown_deadline_s: float = setting(
        12.0, CALLS, "the whole runtime's bounded join at shutdown (see § Shutdown deadlines)",
        env="VOICEACTORS_SHUTDOWN_DEADLINE", unit="s", positive=True)
    feed_retention_s: float = setting(
        60.0, CALLS, "client feed items (nav hints) kept after they were produced",
        env="VOICEACTORS_FEED_RETENTION", unit="s", positive=True)
    feed_max_items: int = setting(
        8, CALLS, "client feed items kept per call", env="VOICEACTORS_FEED_MAX_ITEMS", unit="items",
        positive=True)
    feed_max_subscribers_per_call: int = setting(
        16, CALLS, "`GET /api/voice/events` streams open on one call; one more answers 503 "
        "`{\"error\": \"too many event streams for this call\"}`",
        env="VOICEACTORS_FEED_MAX_SUBSCRIBERS_PER_CALL", unit="streams", positive=True)
    feed_max_subscribers: int = setting(
        1000, CALLS, "`GET /api/voice/events` streams open in all; one more answers 503 "
        "`{\"error\": \"too many event streams\"}`", env="VOICEACTORS_FEED_MAX_SUBSCRIBERS", unit="streams",
        positive=True)
    record_events: bool = setting(
        False, CALLS, "capture every call's server events as received, with their receive times, into "
        "`<state_dir>/captures/<call id>.jsonl` (secrets scrubbed, audio dropped, at most 8 MiB per run) for "
        "`voiceactors replay` (docs/operations.md § Capture and replay)", env="VOICEACTORS_RECORD_EVENTS",
        flag="--record-events", short="capture each call's server events for `voiceactors replay`")
    call_record_fsync_s: float = setting(
        1.0, CALLS, "a call record's lines are written (to the page cache: a kill -9 keeps them) as the call goes; "
        "each record file is fsynced at most this often, in the background (many files due at once: one `syncfs` "
        "of their filesystem), and always at the call's end and at shutdown, so a power loss can lose about this "
        "much of a live call's record (more while the disk is slow to flush); `0`: fsync every flush before it "
        "counts as written (docs/calls.md § The call record)",
        env="VOICEACTORS_CALL_RECORD_FSYNC", unit="s", minimum=0)
    rejoin_max_calls: int = setting(
        50, CALLS, "at start-up, calls that were live when the server died (a call record whose last block has "
        "no `end`, changed within `call_max_duration_s`) are rejoined, newest first, at most this many; `0`: "
        "none (docs/calls.md § Crash recovery)", env="VOICEACTORS_REJOIN_MAX_CALLS", unit="calls", minimum=0)
    redis_url: str | None = setting(
        None, CLUSTER, "a Redis server shared by several `voiceactors serve` processes: each call's actor runs "
        "on the one process holding its lease, tool writes are claimed there once (docs/operations.md "
        "§ Scaling out). Unset: one process, everything in memory. Never logged (it may hold a password)",
        env="VOICEACTORS_REDIS_URL", flag="--redis", metavar="URL", check=_redis_url_problem,
        short="a shared Redis (redis://host:port/db) coordinating several server processes")
    redis_lease_ttl_s: float = setting(
        10.0, CLUSTER, "a call's lease in Redis lives this long unless its holder renews it (every sixth of "
        "it); a holder that cannot renew stops the call before the lease can expire, and another process "
        "may take a dead holder's call over once it has", env="VOICEACTORS_REDIS_LEASE_TTL", unit="s",
        minimum=0.5)
    workers: int = setting(
        1, CLUSTER, "`serve` runs this many server processes on the one port (`SO_REUSEPORT`), each with its "
        "own state folder `<state_dir>/workers/<i>/`, supervised by a parent process that restarts one that "
        "dies; without `--redis` the parent starts a private `redis-server` for them (docs/operations.md "
        "§ Scaling out). `1`: one process, as before", env="VOICEACTORS_WORKERS", flag="--workers",
        metavar="N", minimum=1, maximum=64, short="server processes on the one port")
    worker_index: int | None = setting(
        None, CLUSTER, "set by `serve --workers N` for each worker process it starts (`0` … `N-1`); not for "
        "operators. Its logs carry `worker`, its call history shows every worker's calls",
        env="VOICEACTORS_WORKER_INDEX", minimum=0, doc_default="unset")
    feed_stream_max_len: int = setting(
        1000, CLUSTER, "with `--redis`, a call's feed events kept in its Redis stream (`XADD ... MAXLEN ~`): a "
        "client resuming with `Last-Event-ID` on any process gets what it missed within this many",
        env="VOICEACTORS_FEED_STREAM_MAX_LEN", unit="events", positive=True)
    context_timeout_s: float = setting(
        10.0, CALLS, "a linked `context` (`/session`, `/connect`) must be verified against the journal within "
        "this long in all; past it the call starts as a generic conversation (docs/api.md § Linked context)",
        env="VOICEACTORS_CONTEXT_TIMEOUT", unit="s", positive=True)

    # --- brain ---
    brain_ready_wait_s: float = setting(
        10.0, BRAIN, "`POST /api/voice/session` waits this long for the first instruction, then 503 "
        "`voice unavailable — brain not ready`", env="VOICEACTORS_BRAIN_READY_WAIT", unit="s", positive=True)
    brain_refresh_wait_s: float = setting(
        30.0, BRAIN, "`POST /api/voice/refresh-brain` waits this long, then 202 `refreshing`",
        env="VOICEACTORS_BRAIN_REFRESH_WAIT", unit="s", positive=True)
    brain_max_age_s: float = setting(
        6 * 3600.0, BRAIN, "an older instruction is still used, while a refresh runs in the background",
        env="VOICEACTORS_BRAIN_MAX_AGE", unit="s", positive=True, doc_default="21600 (6 h)")
    brain_timeout_s: float = setting(
        120.0, BRAIN, "one backend run's limit (the Claude CLI is killed past it)",
        env="VOICEACTORS_BRAIN_TIMEOUT", unit="s", positive=True)
    continue_summary_timeout_s: float = setting(
        8.0, BRAIN, "a continued call's summary (`continues` on `/session`, `/connect`) is asked of the brain "
        "once, within this long; without its answer the earlier call's last turns are used (docs/calls.md "
        "§ Continuing a call)", env="VOICEACTORS_CONTINUE_SUMMARY_TIMEOUT", unit="s", positive=True)
    claude_command: str = setting(
        "claude", BRAIN, "the Claude CLI executable (`claude` backend)", env="VOICEACTORS_CLAUDE_COMMAND")

    # --- http ---
    body_limit: int = setting(
        64 * 1024, HTTP, "request bodies larger than this answer 413 `request body too large` (declared or "
        "streamed)", env="VOICEACTORS_BODY_LIMIT", unit="bytes", positive=True)
    mint_timeout_s: float = setting(
        15.0, HTTP, "the OpenAI client-secret request's time limit (then 500 `voice session unavailable`)",
        env="VOICEACTORS_MINT_TIMEOUT", unit="s", positive=True)
    rate_limit_burst: int = setting(
        20, HTTP, "`POST /api/voice/session`, `/connect`, `/refresh-brain`, `/login`: requests one client address may "
        "send at once, per route", env="VOICEACTORS_RATE_LIMIT_BURST", unit="requests", positive=True)
    rate_limit_per_s: float = setting(
        0.5, HTTP, "the bucket's refill per second; an empty bucket answers 429 `too many requests` with "
        "`Retry-After`; `0` = no limit", env="VOICEACTORS_RATE_LIMIT_PER_S", unit="requests/s", minimum=0)
    mcp_rate_limit_burst: int = setting(
        60, HTTP, "`/mcp` (the journal's tools over MCP): requests one client address may send at once",
        env="VOICEACTORS_MCP_RATE_LIMIT_BURST", unit="requests", positive=True)
    mcp_rate_limit_per_s: float = setting(
        10.0, HTTP, "`/mcp`'s bucket refill per second (it stands in for the voice calls' per-turn bound); an "
        "empty bucket answers 429 `too many requests` with `Retry-After`; `0` = no limit",
        env="VOICEACTORS_MCP_RATE_LIMIT_PER_S", unit="requests/s", minimum=0)
    rate_limit_clients: int = setting(
        4096, HTTP, "client buckets kept (least recently used dropped first)", env="VOICEACTORS_RATE_LIMIT_CLIENTS",
        unit="clients", positive=True)
    trusted_proxies: tuple[str, ...] = setting(
        (), HTTP, "reverse proxies (IP addresses or CIDR networks) whose `X-Forwarded-For` and "
        "`X-Forwarded-Proto` are believed: a request from one is rate-limited by its client (the rightmost "
        "forwarded hop that is not a trusted proxy) and its console cookie is `Secure` when the forwarded "
        "scheme is https. From any other peer the headers are ignored. The environment variable is "
        "comma-separated; a malformed entry makes `serve` exit 2 (docs/operations.md, Behind a reverse proxy)",
        env="VOICEACTORS_TRUSTED_PROXIES", doc_default="none", check=_trusted_proxies_problem)
    keep_alive_timeout_s: float = setting(
        5.0, HTTP, "an idle keep-alive connection (or one that never finished its request head) is closed after "
        "this long", env="VOICEACTORS_KEEP_ALIVE_TIMEOUT", unit="s", positive=True)
    max_requests_in_flight: int = setting(
        512, HTTP, "requests (event streams included) served at once; more answer 503 `server busy` and are "
        "closed; `0` = no cap", env="VOICEACTORS_MAX_REQUESTS_IN_FLIGHT", unit="requests", minimum=0)
    max_connections: int = setting(
        1000, HTTP, "connections open at once (idle ones included); past it the server accepts no more: new "
        "clients wait in the listen backlog (holding none of the server's file descriptors) and are served as "
        "others close; `0` = no cap. Keep it below the process's descriptor limit (`ulimit -n`) minus about 64 "
        "(the server warns `server.connection_cap_above_fd_limit` at start otherwise)",
        env="VOICEACTORS_MAX_CONNECTIONS", unit="connections", minimum=0)
    openai_clients: int = setting(
        8, HTTP, "shared OpenAI SDK clients kept for minting, one per (key, base URL)",
        env="VOICEACTORS_OPENAI_CLIENTS", unit="clients", positive=True)
    console_session_ttl_s: float = setting(
        12 * 3600.0, HTTP, "how long a console sign-in (its cookie) lasts", env="VOICEACTORS_CONSOLE_SESSION_TTL",
        unit="s", positive=True, doc_default="43200 (12 h)")

    # --- usage and budgets ---
    prices: tuple[str, ...] = setting(
        DEFAULT_PRICES, USAGE, "the price table: entries `<model>=<text in>/<text out>/<audio in>/<audio out>/"
        "<cached in>`, US dollars per million tokens, or for a Live model `<model>=audio_min:<US dollars per "
        "minute>` (its sessions' seconds of audio, docs/live.md); the default is gpt-realtime's as published on "
        "openai.com/api/pricing on 2025-08-28. A model without an entry still counts tokens; its cost is "
        "unknown (and a budget cannot stop it). The environment variable is comma-separated and replaces the "
        "whole table (docs/operations.md § Usage and cost)", env="VOICEACTORS_PRICES",
        doc_default="gpt-realtime=4/16/32/64/0.4", check=_price_table_problem)
    call_budget_usd: float = setting(
        0.0, USAGE, "one call's budget: a call whose cost reaches it is asked to say goodbye in one sentence, "
        "then hung up (`budget_spent`); `0` = no budget", env="VOICEACTORS_CALL_BUDGET_USD",
        flag="--call-budget-usd", metavar="USD", unit="USD", minimum=0, short="one call's budget in US dollars")
    daily_budget_usd: float = setting(
        0.0, USAGE, "the whole server's budget for one day (the clock seam's day; with `--redis`, the cluster's: "
        "every process's calls count, docs/operations.md § Budgets): once the day's calls cost this much, `POST /api/voice/session` answers 503 `voice unavailable — budget spent` until the next "
        "day; `0` = no budget", env="VOICEACTORS_DAILY_BUDGET_USD", flag="--daily-budget-usd", metavar="USD",
        unit="USD", minimum=0, short="the server's budget for one day in US dollars")

    @property
    def loopback(self) -> bool:
        """True when the listen address is a loopback address. Decided by the
        address, never the spelling (``127.evil.example`` is a name, not
        loopback); of names only ``localhost`` counts."""
        return is_loopback_host(self.host)

    def replace(self, **changes: Any) -> "Settings":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Defaults, then ``VOICEACTORS_*`` / OpenAI env vars, then ``overrides``
        (the command-line flags; ``None`` values are ignored). Raises
        ValueError for a malformed environment value."""
        env = os.environ if env is None else env
        values = {item.name: _from_env(item, env) for item in declarations()}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def problems(self) -> list[str]:
        """What is wrong with these settings (empty: nothing)."""
        found = [problem for item in declarations() if (problem := _check(item, getattr(self, item.name)))]
        found.extend(shutdown_deadlines(self).problems())
        if self.call_wrap_up_s and not self.call_wrap_up_s < self.call_max_duration_s:
            found.append(f"call_wrap_up_s ({_number(self.call_wrap_up_s)} s) must be less than "
                         f"call_max_duration_s ({_number(self.call_max_duration_s)} s)")
        return found

    def validate(self) -> "Settings":
        """These settings, or InvalidSettings listing every problem."""
        found = self.problems()
        if found:
            raise InvalidSettings("invalid settings: " + "; ".join(found))
        return self


# --- the declarations -------------------------------------------------------------

@dataclass(frozen=True)
class Declared:
    name: str
    type: Any
    default: Any
    spec: Spec

    @property
    def label(self) -> str:
        """The name an operator knows it by, for messages."""
        return f"{self.name} ({self.spec.env[0]})" if self.spec.env else self.name

    @property
    def dest(self) -> str | None:
        """The argparse attribute of its flag."""
        return self.spec.flag.lstrip("-").replace("-", "_") if self.spec.flag else None


@functools.cache
def declarations() -> tuple[Declared, ...]:
    """Every setting, in declaration order."""
    hints = typing.get_type_hints(Settings)
    return tuple(Declared(item.name, hints[item.name], item.metadata["default"], item.metadata[SPEC])
                 for item in dataclasses.fields(Settings))


@functools.cache
def _defaults() -> dict[str, Any]:
    return {item.name: item.metadata["default"] for item in dataclasses.fields(Settings)}


def default(name: str) -> Any:
    """The declared default of the setting ``name``: code that needs it without a
    ``Settings`` at hand takes it from here, never from a second literal
    (``tests/test_defaults_once.py``)."""
    return _defaults()[name]


def _from_env(item: Declared, env: Mapping[str, str]) -> Any:
    raw, name = next(((env[name], name) for name in item.spec.env if env.get(name)), (None, ""))
    if raw is None:
        return item.default
    if item.spec.normalize is not None:
        raw = item.spec.normalize(raw)
    if item.type is int or item.type is float or item.type == int | None:
        text = raw.strip()
        if not text:
            return item.default
        try:
            return (float if item.type is float else int)(text)
        except ValueError:
            kind = "a whole number" if item.type is not float else "a number"
            raise ValueError(f"{name} must be {kind}, not {raw!r}") from None
    if item.type is bool:
        text = raw.strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"{name} must be 1 or 0 (true/false, yes/no, on/off), not {raw!r}")
    if item.type == tuple[str, ...]:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if item.type is Path:
        return Path(raw)
    return raw


def _check(item: Declared, value: Any) -> str | None:
    spec = item.spec
    if spec.check is not None and (problem := spec.check(value)):
        return f"{item.label}: {problem}"
    if spec.choices and value not in spec.choices:
        return f"{item.label} must be one of {', '.join(spec.choices)}, not {value!r}"
    if item.type not in (int, float, int | None) or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return f"{item.label} must be a number, not {value!r}"
    if spec.positive and not value > 0:
        return f"{item.label} must be more than 0, not {value!r}"
    if spec.minimum is not None and value < spec.minimum:
        return f"{item.label} must be at least {_number(spec.minimum)}, not {value!r}"
    if spec.maximum is not None and value > spec.maximum:
        return f"{item.label} must be at most {_number(spec.maximum)}, not {value!r}"
    return None


# --- the shutdown deadline chain ---------------------------------------------------

SHUTDOWN_SLACK_S = 2.0      # each bound beyond the one it contains: time to log, cancel and unwind
HYPERCORN_SLACK_S = 1.0     # hypercorn's own bound, last: it must never cut quart-trio's short


@dataclass(frozen=True)
class ShutdownDeadlines:
    """How long each layer of a shutdown may take, innermost first. Each
    bounds the one before it, so each must be strictly longer: a closing call
    (``close_deadline_s``) inside the runtime's join (``shutdown_deadline_s``)
    inside the app lifespan's wait (``lifespan_s``, ``http/app.py``) inside
    quart-trio's background-task bound (``background_tasks_s``) inside
    hypercorn's ``shutdown_timeout`` (``hypercorn_s``, ``server.py``)."""

    close_s: float
    runtime_s: float
    lifespan_s: float
    background_tasks_s: float
    hypercorn_s: float

    def chain(self) -> tuple[tuple[str, float], ...]:
        return (("close_deadline_s", self.close_s), ("shutdown_deadline_s", self.runtime_s),
                ("the app lifespan's bound", self.lifespan_s),
                ("quart-trio's background-task bound", self.background_tasks_s),
                ("hypercorn's shutdown_timeout", self.hypercorn_s))

    def problems(self) -> list[str]:
        links = self.chain()
        return [f"{inner} ({_number(inner_s)} s) must be less than {outer} ({_number(outer_s)} s)"
                for (inner, inner_s), (outer, outer_s) in zip(links, links[1:]) if not inner_s < outer_s]


def shutdown_deadlines(settings: Settings) -> ShutdownDeadlines:
    lifespan = settings.shutdown_deadline_s + SHUTDOWN_SLACK_S
    background = lifespan + SHUTDOWN_SLACK_S
    return ShutdownDeadlines(close_s=settings.close_deadline_s, runtime_s=settings.shutdown_deadline_s,
                             lifespan_s=lifespan, background_tasks_s=background,
                             hypercorn_s=background + HYPERCORN_SLACK_S)


# --- command-line flags ------------------------------------------------------------

def _default_text(item: Declared) -> str:
    if item.spec.doc_default is not None:
        return item.spec.doc_default
    value = item.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return _number(value)
    return str(value)


_ZERO_MEANS = re.compile(r"`0` = ([^;.(]+)")


def _zero_meaning(item: Declared) -> str:
    """" = no limit" where the default is 0 and the declaration says what 0 means
    (a bare "default 0" reads as a limit of nothing)."""
    found = _ZERO_MEANS.search(item.spec.help)
    if found is None or item.default != 0 or isinstance(item.default, bool):
        return ""
    return f" = {found.group(1).strip()}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def add_flags(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    """The flags of the settings ``names``, help derived from their declarations."""
    by_name = {item.name: item for item in declarations()}
    for name in names:
        item = by_name[name]
        spec = item.spec
        assert spec.flag, f"{name} has no flag"
        sources = ", then ".join(f"${env}" for env in spec.env)
        default = f"default {_default_text(item)}{_zero_meaning(item)}" + (f"; {sources}" if sources else "")
        text = (spec.short or spec.help.split(";")[0]).replace("`", "").replace("%", "%%")
        kwargs: dict[str, Any] = {"help": f"{text} ({default})" if not isinstance(item.default, bool) else text}
        if isinstance(item.default, bool):
            kwargs["action"] = "store_true"
        elif spec.repeatable:
            kwargs.update(action="append", help=f"{text} (repeatable; {default})")
        elif item.type is int or item.type is float:
            kwargs["type"] = item.type
        if spec.choices:
            kwargs["choices"] = list(spec.choices)
        if spec.metavar:
            kwargs["metavar"] = spec.metavar
        parser.add_argument(spec.flag, **kwargs)


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags in ``args`` (absent ones are None)."""
    values: dict[str, Any] = {}
    for item in declarations():
        raw = getattr(args, item.dest, None) if item.dest else None
        if raw is None or raw is False or raw == []:     # not given: the env or the default decides
            continue
        if item.type is Path:
            raw = Path(raw)
        elif item.type == tuple[str, ...]:
            raw = tuple(raw)
        values[item.name] = raw
    return values


# --- the doc tables -----------------------------------------------------------------

DOC_BEGIN = "<!-- settings tables: generated by `python -m voiceactors.settings --write docs/configuration.md` -->"
DOC_END = "<!-- end of generated settings tables -->"


def markdown() -> str:
    """The settings tables of docs/configuration.md, one per group."""
    items = list(declarations())
    lines: list[str] = []
    for group in GROUPS:
        lines += [f"### {group}", "", "| setting | environment | flag | default | unit | meaning |",
                  "|---|---|---|---|---|---|"]
        for item in (i for i in items if i.spec.group == group):
            spec = item.spec
            env = ", then ".join(f"`{name}`" for name in spec.env) or "—"
            flag = "—"
            if spec.flag:
                flag = spec.flag + (f" {spec.metavar}" if spec.metavar else "")
                flag += (" " + "\\|".join(spec.choices)) if spec.choices else ""
                flag = f"`{flag}`" + (" (repeatable)" if spec.repeatable else "")
            default = _default_text(item)
            default = default if default in ("unset", "none", "off") else f"`{default}`"
            if spec.doc_default and "(" in spec.doc_default:
                number, rest = spec.doc_default.split(" ", 1)
                default = f"`{number}` {rest}"
            lines.append(f"| `{item.name}` | {env} | {flag} | {default} | {spec.unit or '—'} | {spec.help} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def doc_with_tables(text: str) -> str:
    """``text`` (docs/configuration.md) with its generated block replaced."""
    start, end = text.index(DOC_BEGIN) + len(DOC_BEGIN), text.index(DOC_END)
    return text[:start] + "\n\n" + markdown() + "\n" + text[end:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m voiceactors.settings",
                                     description="print or write the settings tables of docs/configuration.md")
    parser.add_argument("--markdown", action="store_true", help="print the tables")
    parser.add_argument("--write", metavar="DOC", help="replace the generated block of DOC in place")
    args = parser.parse_args(argv)
    if args.write:
        path = Path(args.write)
        path.write_text(doc_with_tables(path.read_text(encoding="utf-8")), encoding="utf-8")
    else:
        sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
