"""Every setting's default is declared once, in ``voiceactors/settings.py``.

A second declaration is a literal equal to a setting's default, given to a
name that names the same thing, anywhere else in the package: a parameter's
or a field's default (``retention_s: float = 60.0``), a constant
(``SESSION_TTL_S = 12 * 3600.0``), a ``default=`` keyword of a call
(``add_argument("--state-dir", default=...)``) or the fallback of an ``or``
(``args.state_dir or ".state"``). A name names the same thing when its words
(``_``-separated, without ``default`` and the unit ``s``) are all words of the
setting's name: ``retention_s`` and ``max_items`` name ``feed_retention_s``
and ``feed_max_items``. Code that needs a default takes it from
``settings.default(name)`` or from the ``Settings`` it is given.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
from pathlib import Path
from typing import Any, Iterator

import voiceactors
from voiceactors import settings

PACKAGE_DIR = Path(voiceactors.__file__).parent
IGNORED_WORDS = {"default", "s"}
#: Names that only look like a setting: (file, name) -> what they are instead.
NOT_SETTINGS = {
    ("voiceactors/cli.py", "host"): "`simulate --host`: the simulator's listen address, not the server's",
    ("voiceactors/simulator/service.py", "host"): "the simulator's listen address, not the server's",
    ("voiceactors/cli.py", "timeout"): "`replay --timeout`: how long a replay's gate waits",
    ("voiceactors/replay/__init__.py", "timeout_s"): "how long a replay's gate waits",
    ("voiceactors/simulator/capture_player.py", "timeout_s"): "how long a replay's gate waits",
    ("voiceactors/realtime/events.py", "burst"): "a log line rate's burst, not the HTTP rate limit's",
}
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def constant(node: ast.AST | None) -> Any:
    """The value of a literal (numbers, strings, ``Path("x")`` as its string,
    arithmetic of literals), or ``NotImplemented`` for anything else."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = constant(node.left), constant(node.right)
        if isinstance(left, (int, float)) and isinstance(right, (int, float)):
            return _OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Path" \
            and len(node.args) == 1:
        return constant(node.args[0])
    return NotImplemented


def _name_of(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def named_literals(tree: ast.AST) -> Iterator[tuple[str, Any, int]]:
    """(name, literal value, line) for every place ``tree`` gives a name a literal default."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            positional = node.args.posonlyargs + node.args.args
            pairs = list(zip(positional[len(positional) - len(node.args.defaults):], node.args.defaults))
            pairs += [(arg, d) for arg, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None]
            for arg, value in pairs:
                yield arg.arg, constant(value), value.lineno
        elif isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
            yield node.target.id, constant(node.value), node.lineno
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield target.id, constant(node.value), node.lineno
        elif isinstance(node, ast.Call):
            flag = constant(node.args[0]) if node.args else NotImplemented
            for keyword in node.keywords:
                if keyword.arg == "default" and isinstance(flag, str) and flag.startswith("--"):
                    value = keyword.value
                    if isinstance(value, ast.BoolOp):
                        value = value.values[-1]
                    yield flag.lstrip("-").replace("-", "_"), constant(value), keyword.value.lineno
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and len(node.values) == 2:
            name = _name_of(node.values[0])
            if name is not None:
                yield name, constant(node.values[1]), node.lineno


def _words(name: str) -> list[str]:
    return [word for word in name.lower().split("_") if word not in IGNORED_WORDS]


def names_the_setting(name: str, setting: str) -> bool:
    """Every word of ``name`` is a word of ``setting``; one word alone only
    when it is the setting's last (``level`` of ``log_level``, not
    ``limit`` of ``rate_limit_burst``)."""
    words, of_setting = _words(name), _words(setting)
    if not words or not set(words) <= set(of_setting):
        return False
    return len(words) > 1 or words[0] == of_setting[-1]


def _same(value: Any, declared: Any) -> bool:
    if isinstance(declared, Path):
        declared = str(declared)
    if isinstance(value, bool) or isinstance(declared, bool):
        return False
    if isinstance(declared, (int, float)) and isinstance(value, (int, float)):
        return float(value) == float(declared)
    return type(value) is type(declared) and value == declared


def _nontrivial(value: Any) -> bool:
    return not (value is None or isinstance(value, bool) or value in (0, 1, "", ()))


def second_declarations(package_dir: Path) -> list[str]:
    declared = {item.name: item.metadata["default"] for item in dataclasses.fields(settings.Settings)
                if _nontrivial(item.metadata["default"])}
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        where = path.relative_to(package_dir.parent).as_posix()
        if path == package_dir / "settings.py":
            continue
        for name, value, line in named_literals(ast.parse(path.read_text(encoding="utf-8"))):
            if (where, name) in NOT_SETTINGS:
                continue
            for setting, default in declared.items():
                if names_the_setting(name, setting) and _same(value, default):
                    found.append(f"{where}:{line}: {name} = {value!r} "
                                 f"declares the default of the setting {setting} a second time")
    return found


def test_every_settings_default_is_declared_once():
    found = second_declarations(PACKAGE_DIR)
    assert not found, "\n".join(found)


def test_the_check_finds_each_kind_of_second_declaration(tmp_path):
    package = tmp_path / "voiceactors"
    package.mkdir()
    (package / "settings.py").write_text("")
    (package / "feed.py").write_text(
        "class Hub:\n    def __init__(self, retention_s: float = 60.0, *, max_items=8) -> None: ...\n")
    (package / "sessions.py").write_text("SESSION_TTL_S = 12 * 3600.0\n")
    (package / "cli.py").write_text("p.add_argument('--state-dir', default=env.get('X') or '.state')\n"
                                    "state = Path(args.state_dir or '.state')\n")
    found = "\n".join(second_declarations(package))
    for where, setting in [("feed.py:2: retention_s", "feed_retention_s"), ("feed.py:2: max_items", "feed_max_items"),
                           ("sessions.py:1: SESSION_TTL_S", "console_session_ttl_s"),
                           ("cli.py:1: state_dir", "state_dir"), ("cli.py:2: state_dir", "state_dir")]:
        assert f"voiceactors/{where}" in found and setting in found, (where, found)


def test_the_helper_answers_the_declaration():
    assert settings.default("feed_retention_s") == settings.Settings.__dataclass_fields__["feed_retention_s"].default
    assert settings.default("state_dir") == Path(".state")
