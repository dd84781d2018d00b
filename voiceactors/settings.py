"""Server settings: one frozen object, built from flags > env > defaults.

The journal's ``voice`` block (OpenAI key, models, brain backend) is read at
request time by ``voiceactors.config`` so a changed journal config takes effect
without a restart; everything here is fixed for the life of the process.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    return float(raw) if raw else default


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    return int(raw) if raw else default


def _env_list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in env.get(name, "").split(",") if item.strip())


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


@dataclass(frozen=True)
class Settings:
    journal: Path
    state_dir: Path
    host: str = "127.0.0.1"
    port: int = 8765
    api_token: str | None = None            # VOICEACTORS_API_TOKEN; required off loopback
    openai_api_key_env: str | None = None   # OPENAI_API_KEY (journal voice.openai_api_key wins)
    openai_base_url: str = "https://api.openai.com/v1"  # OPENAI_BASE_URL
    log_format: str = "json"
    log_level: str = "info"
    demo: bool = False

    # tools (ToolExecutor)
    tool_name_style: str = "dotted"         # manifest spelling: dotted | underscore
    tool_concurrency: int = 64
    tool_timeout_read_s: float = 10.0
    tool_timeout_write_s: float = 20.0
    tool_reuse_s: float = 2.0               # a reusable read's answer serves other calls this long
    tool_output_cap: int = 64_000
    turn_output_cap: int = 96_000
    tool_calls_per_turn: int = 6

    # process (serve only)
    gc_full_interval_s: float = 300.0       # one full garbage collection this often; 0 = Python's policy

    # calls (CallSupervisor / CallActor)
    max_calls: int = 1000
    call_idle_timeout_s: float = 600.0
    call_max_duration_s: float = 3900.0     # OpenAI ends calls at 60 min; allow slack
    reconnect_base_s: float = 0.5
    reconnect_max_s: float = 20.0
    reconnect_attempts: int = 8
    connect_timeout_s: float = 10.0
    close_deadline_s: float = 5.0
    shutdown_deadline_s: float = 12.0

    # client feed
    feed_retention_s: float = 60.0
    feed_max_items: int = 8

    # brain
    brain_ready_wait_s: float = 10.0
    brain_refresh_wait_s: float = 30.0
    brain_max_age_s: float = 6 * 3600.0
    brain_timeout_s: float = 120.0
    claude_command: str = "claude"

    # http
    body_limit: int = 64 * 1024
    mint_timeout_s: float = 15.0

    # --- hardening (issue 11): who may call, how often, how long a connection lives ---
    allowed_hosts: tuple[str, ...] = ()     # VOICEACTORS_ALLOWED_HOSTS / --allowed-host: more names of ours
    rate_limit_burst: int = 20              # VOICEACTORS_RATE_LIMIT_BURST: POSTs a client may send at once
    rate_limit_per_s: float = 0.5           # VOICEACTORS_RATE_LIMIT_PER_S: refill; 0 = no limit
    rate_limit_clients: int = 4096          # buckets kept (least recently used dropped first)
    keep_alive_timeout_s: float = 5.0       # VOICEACTORS_KEEP_ALIVE_TIMEOUT: an idle connection is closed
    max_requests_in_flight: int = 512       # VOICEACTORS_MAX_REQUESTS_IN_FLIGHT: more answer 503
    openai_clients: int = 8                 # shared OpenAI clients kept, one per (key, base URL)
    # --- end hardening ---
    # --- journal writes (issue 11, items 4-7) ---
    journal_lock_timeout_s: float = 5.0     # a write waits this long for a day file's lock, then fails
    # --- end journal writes ---
    # --- calls hardening (issue 11; owned by the calls engineer) ---
    rejoin_max_calls: int = 50              # calls live at a crash rejoined at start-up, newest first
    feed_max_subscribers_per_call: int = 16  # /events streams of one call; beyond: 503
    feed_max_subscribers: int = 1000        # /events streams in all; beyond: 503
    # --- end calls hardening ---
    # --- connection cap (issue 11 item 8; owned by the rest engineer) ---
    max_connections: int = 1000             # VOICEACTORS_MAX_CONNECTIONS: open connections; more wait; 0 = no cap
    # --- end connection cap ---

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
        (the command-line flags; ``None`` values are ignored)."""
        env = os.environ if env is None else env
        journal = env.get("VOICEACTORS_JOURNAL") or env.get("SOLSTONE_JOURNAL") or "journal"
        values: dict[str, Any] = {
            "journal": Path(journal),
            "state_dir": Path(env.get("VOICEACTORS_STATE_DIR") or ".state"),
            "host": env.get("VOICEACTORS_HOST") or "127.0.0.1",
            "port": _env_int(env, "VOICEACTORS_PORT", 8765),
            "api_token": env.get("VOICEACTORS_API_TOKEN") or None,
            "openai_api_key_env": env.get("OPENAI_API_KEY") or None,
            "openai_base_url": (env.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip("/"),
            "log_format": env.get("VOICEACTORS_LOG_FORMAT") or "json",
            "log_level": env.get("VOICEACTORS_LOG_LEVEL") or "info",
            "tool_name_style": env.get("VOICEACTORS_TOOL_NAMES") or "dotted",
            "tool_concurrency": _env_int(env, "VOICEACTORS_TOOL_CONCURRENCY", 64),
            "tool_timeout_read_s": _env_float(env, "VOICEACTORS_TOOL_TIMEOUT_READ", 10.0),
            "tool_timeout_write_s": _env_float(env, "VOICEACTORS_TOOL_TIMEOUT_WRITE", 20.0),
            "tool_reuse_s": _env_float(env, "VOICEACTORS_TOOL_REUSE", 2.0),
            "gc_full_interval_s": _env_float(env, "VOICEACTORS_GC_FULL_INTERVAL", 300.0),
            "max_calls": _env_int(env, "VOICEACTORS_MAX_CALLS", 1000),
            "call_idle_timeout_s": _env_float(env, "VOICEACTORS_CALL_IDLE_TIMEOUT", 600.0),
            "call_max_duration_s": _env_float(env, "VOICEACTORS_CALL_MAX_DURATION", 3900.0),
            "claude_command": env.get("VOICEACTORS_CLAUDE_COMMAND") or "claude",
            # hardening (issue 11)
            "allowed_hosts": _env_list(env, "VOICEACTORS_ALLOWED_HOSTS"),
            "rate_limit_burst": _env_int(env, "VOICEACTORS_RATE_LIMIT_BURST", 20),
            "rate_limit_per_s": _env_float(env, "VOICEACTORS_RATE_LIMIT_PER_S", 0.5),
            "keep_alive_timeout_s": _env_float(env, "VOICEACTORS_KEEP_ALIVE_TIMEOUT", 5.0),
            "max_requests_in_flight": _env_int(env, "VOICEACTORS_MAX_REQUESTS_IN_FLIGHT", 512),
            # connection cap (issue 11 item 8)
            "max_connections": _env_int(env, "VOICEACTORS_MAX_CONNECTIONS", 1000),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
