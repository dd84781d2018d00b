"""One log-event convention and one logger attribute, checked over the source.

Events are dotted lowercase ``<area>.<event>`` with snake_case parts; every
logger is bound once, with ``actor=`` only (docs/operations.md § Logs).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import voiceactors

EVENT = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*\.[a-z][a-z0-9]*(_[a-z0-9]+)*$")
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
PACKAGE = Path(voiceactors.__file__).parent
NOT_YET: tuple[str, ...] = ()


def _sources() -> list[tuple[str, ast.AST]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name == "logs.py" or name.startswith(NOT_YET):
            continue
        out.append((name, ast.parse(path.read_text(encoding="utf-8"))))
    return out


def _calls(tree: ast.AST):
    return (node for node in ast.walk(tree) if isinstance(node, ast.Call))


def test_every_literal_event_name_is_area_dot_event():
    bad = []
    for name, tree in _sources():
        for call in _calls(tree):
            if (isinstance(call.func, ast.Attribute) and call.func.attr in LEVELS and call.args
                    and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)
                    and not EVENT.match(call.args[0].value)):
                bad.append(f"{name}:{call.lineno} {call.args[0].value!r}")
    assert bad == []


def test_every_logger_is_bound_with_actor_only():
    bad = []
    for name, tree in _sources():
        for call in _calls(tree):
            func = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
            # ``actor=`` names the component; an actor owning one live call
            # binds that call's id too (context, not a second naming attribute)
            keywords = [k.arg for k in call.keywords]
            if func in ("get_logger", "_get_logger") and keywords not in (["actor"], ["actor", "call_id"]):
                bad.append(f"{name}:{call.lineno}")
    assert bad == []


def test_the_check_sees_the_log_calls():
    # the scan must find the calls it checks, or the two tests above prove nothing
    events = {call.args[0].value for _name, tree in _sources() for call in _calls(tree)
              if isinstance(call.func, ast.Attribute) and call.func.attr in LEVELS and call.args
              and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)}
    assert {"tool.run", "http.request", "journal.ledger_close", "server.serving"} <= events
