"""The package layering, checked from the source (every ``import`` and
``from ... import`` in every module, at module level or inside a function,
plus ``importlib.import_module("...")`` with a literal name):

- the product never imports the simulator, directly or through another
  module: only ``voiceactors.demo``, ``voiceactors.replay``, ``voiceactors.cli`` (lazily) and the
  simulator itself (and tests and benchmarks, not checked here) may;
- every module sits in one layer of ``LAYERS`` and imports nothing from a
  layer above its own, at module level or inside a function (a lazy import
  that hides a loop is still a loop), but for the few ``UPWARD`` imports
  named with their reason. A new module must be given its layer here;
- within a layer, no two of its entries (packages or modules) import each
  other, directly or through others: the entries of one layer form no loop.

A failure names the offending import (file and line) and the chain that
leads to it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import voiceactors

PACKAGE_DIR = Path(voiceactors.__file__).parent

SIMULATOR = "voiceactors.simulator"
#: May import the simulator: the demo, replay and fuzz plumbing, the testing kit, and the command line (lazily).
SIMULATOR_USERS = {"voiceactors.demo", "voiceactors.cli", "voiceactors.replay", "voiceactors.testing",
                   "voiceactors.fuzz"}
LAZY_ONLY = {"voiceactors.cli"}

#: The layers, bottom first: a module imports from its own layer and those below.
#: An entry is a package (all its modules) or a module; the longest entry that
#: holds a module decides (``voiceactors.call`` is the call's pure core, while its
#: actor, supervisor, feed and capture sit with the actors; ``voiceactors.mcp`` and
#: ``voiceactors.usage`` span layers the same way).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation: logging, time, files, settings and their plain data", (
        "voiceactors.logs", "voiceactors.clock", "voiceactors.storage", "voiceactors.settings", "voiceactors.safe_text",
        "voiceactors.mcp.client.sources", "voiceactors.usage", "voiceactors.metrics", "voiceactors.gc_policy",
        "voiceactors.linked_context", "voiceactors.openai_clients", "voiceactors.tool_effect",
        "voiceactors.realtime.session_settings", "voiceactors.phone_policy", "voiceactors.tracing",
        "voiceactors.agents")),
    ("the journal and its configuration", (
        "voiceactors.journal", "voiceactors.voice_config", "voiceactors.notices", "voiceactors.linked_context.resolve")),
    ("the tools", ("voiceactors.tools", "voiceactors.mcp.client.tool_specs")),
    ("the call's pure core and its transports, the Realtime client, the brain's backends, the actors' messages, "
     "the day's usage, the write log", (
        "voiceactors.realtime", "voiceactors.brain", "voiceactors.call",
        "voiceactors.messages", "voiceactors.usage.daily", "voiceactors.usage.brain_calls",
        "voiceactors.executor.write_log")),
    ("Live calls (the Live sideband as the call's protocol speaks it) and how each kind of call arrives",
     ("voiceactors.live", "voiceactors.call.arrival")),
    ("the call registry and the rest of scaling out", ("voiceactors.cluster", "voiceactors.usage.cluster_total")),
    ("the actors", (
        "voiceactors.call.actor", "voiceactors.call.supervisor", "voiceactors.call.feed", "voiceactors.call.event_capture",
        "voiceactors.executor", "voiceactors.brain.actor", "voiceactors.mcp")),
    ("the runtime, the HTTP app and its console, the journal's MCP server, the Realtime stand-in", (
        "voiceactors.runtime", "voiceactors.http", "voiceactors.console", "voiceactors.mcp.server", SIMULATOR)),
    ("the commands", (
        "voiceactors.commands", "voiceactors.server", "voiceactors.workers", "voiceactors.mcp.server.stdio",
        "voiceactors.calls_report", "voiceactors.logs_view",
        "voiceactors.cli", "voiceactors.demo", "voiceactors.mcp.demo_source", "voiceactors.replay",
        "voiceactors.fuzz")),
    ("the testing kit", ("voiceactors.testing",)),
)
#: Imports allowed to go up a layer: (importer, imported) -> why.
UPWARD: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    source: str         # the importing module
    target: str         # the imported module
    path: Path
    line: int
    lazy: bool          # inside a function: runs when the function does

    def where(self, root: Path) -> str:
        return f"{self.path.relative_to(root)}:{self.line}{' (inside a function)' if self.lazy else ''}"


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def modules_of(package_dir: Path) -> dict[str, Path]:
    """Every module under ``package_dir``, by dotted name."""
    root = package_dir.parent
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name> import ...`` in ``module``."""
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, path: Path) -> None:
        self.module, self.is_package, self.path = module, is_package, path
        self.depth = 0
        self.found: list[tuple[list[str], int, bool]] = []   # candidate names, line, lazy

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append(([alias.name], node.lineno, self.depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _resolve(self.module, self.is_package, node.level, node.module)
        # ``from a import b`` imports a, and a.b when b is a submodule
        names = [base] + [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
        self.found.append((names, node.lineno, self.depth > 0))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if called in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            self.found.append(([node.args[0].value], node.lineno, self.depth > 0))
        self.generic_visit(node)


def import_graph(package_dir: Path) -> dict[str, list[Import]]:
    """Each module's imports of modules of the same package (importing
    ``a.b.c`` imports the packages ``a`` and ``a.b`` too)."""
    modules = modules_of(package_dir)
    graph: dict[str, list[Import]] = {}
    for module, path in modules.items():
        collector = _Collector(module, path.name == "__init__.py", path)
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        edges = []
        for names, line, lazy in collector.found:
            for name in names:
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    target = ".".join(parts[:i])
                    if target in modules and target != module:
                        edges.append(Import(module, target, path, line, lazy))
        graph[module] = edges
    return graph


def path_to(graph: dict[str, list[Import]], start: str, forbidden: tuple[str, ...]) -> list[Import] | None:
    """The shortest chain of imports from ``start`` into a ``forbidden`` package, or None."""
    seen = {start}
    frontier: list[tuple[str, list[Import]]] = [(start, [])]
    while frontier:
        next_frontier = []
        for module, chain in frontier:
            for edge in graph.get(module, []):
                if any(within(edge.target, f) for f in forbidden):
                    return chain + [edge]
                if edge.target not in seen:
                    seen.add(edge.target)
                    next_frontier.append((edge.target, chain + [edge]))
        frontier = next_frontier
    return None


def is_product(module: str) -> bool:
    return not within(module, SIMULATOR) and not any(within(module, user) for user in SIMULATOR_USERS)


def violations(package_dir: Path) -> list[str]:
    """What breaks the layering in the package at ``package_dir`` (named
    ``voiceactors``): one line per offending import, naming it, the rule and
    the modules that reach it through it (with the shortest chain)."""
    graph = import_graph(package_dir)
    root = package_dir.parent
    found: dict[tuple[Import, str], list[list[Import]]] = {}
    problems = []
    for module in graph:
        if not is_product(module):
            if module in LAZY_ONLY:
                problems += [f"{edge.where(root)}: {module} imports {edge.target} at module level; "
                             "it may import the simulator only inside a function"
                             for edge in graph[module] if not edge.lazy and within(edge.target, SIMULATOR)]
            continue
        rules = [("the product must not import the simulator", (SIMULATOR,))]
        for rule, forbidden in rules:
            chain = path_to(graph, module, forbidden)
            if chain is not None:
                # into the simulator, the offence is where the chain leaves the product
                # (a product module importing the demo, say); otherwise its last step
                offender = next(e for e in chain if not is_product(e.target)) \
                    if forbidden == (SIMULATOR,) else chain[-1]
                found.setdefault((offender, rule), []).append(chain)
    for (edge, rule), chains in found.items():
        chains.sort(key=len)
        route = " → ".join([chains[0][0].source] + [e.target for e in chains[0]])
        others = sorted({c[0].source for c in chains[1:]})
        problems.append(f"{edge.where(root)}: {edge.source} imports {edge.target} ({rule}; "
                        f"reached by {route}" + (f", and from {', '.join(others)}" if others else "") + ")")
    return problems


def layer_of(module: str) -> int | None:
    """The index in ``LAYERS`` of ``module`` (None: not placed; the root package is below all)."""
    if module == "voiceactors":
        return 0
    best: tuple[int, int] | None = None     # (length of the entry, layer)
    for index, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if within(module, entry) and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    return None if best is None else best[1]


def _runs_nothing(path: Path) -> bool:
    """A package's ``__init__`` of a docstring alone: importing it for a submodule runs nothing."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def upward_imports(package_dir: Path) -> list[str]:
    """Every module not placed in ``LAYERS``, and every import of a module in
    a higher layer than the importer's (``UPWARD`` aside)."""
    graph = import_graph(package_dir)
    modules = modules_of(package_dir)
    root = package_dir.parent
    problems = [f"{module} has no layer in LAYERS" for module in graph if layer_of(module) is None]
    for module, edges in graph.items():
        own = layer_of(module)
        for edge in edges:
            theirs = layer_of(edge.target)
            if own is None or theirs is None or theirs <= own or (module, edge.target) in UPWARD:
                continue
            if modules[edge.target].name == "__init__.py" and _runs_nothing(modules[edge.target]):
                continue
            problems.append(f"{edge.where(root)}: {module} ({LAYERS[own][0]}) imports {edge.target}, "
                            f"a layer above ({LAYERS[theirs][0]})")
    return sorted(set(problems))


def entry_of(module: str) -> str:
    """The ``LAYERS`` entry that holds ``module`` (the longest), or the module itself."""
    held = [entry for _, entries in LAYERS for entry in entries if within(module, entry)]
    return max(held, key=len) if held else module


def loops_between_entries(package_dir: Path) -> list[str]:
    """Each loop of imports between different entries of ``LAYERS`` (lazy
    imports included), as the chain of entries and the import that closes it."""
    graph = import_graph(package_dir)
    modules = modules_of(package_dir)
    edges: dict[str, dict[str, Import]] = {}
    for module, imports in graph.items():
        for edge in imports:
            if modules[edge.target].name == "__init__.py" and _runs_nothing(modules[edge.target]):
                continue
            source, target = entry_of(module), entry_of(edge.target)
            if source != target:
                edges.setdefault(source, {}).setdefault(target, edge)
    root = package_dir.parent
    found = set()
    for start in sorted(edges):
        # the shortest way back to ``start`` from each entry it imports
        frontier: list[list[str]] = [[start, target] for target in sorted(edges[start])]
        seen = {start}
        while frontier:
            chain = frontier.pop(0)
            if chain[-1] == start:
                loop = chain[:-1]
                turn = loop.index(min(loop))
                loop = loop[turn:] + loop[:turn]
                closing = edges[loop[-1]][loop[0]]
                found.add(" → ".join(loop + [loop[0]]) + f" (closed by {closing.where(root)})")
                break
            if chain[-1] in seen:
                continue
            seen.add(chain[-1])
            frontier += [chain + [target] for target in sorted(edges.get(chain[-1], {}))]
    return sorted(found)


def test_no_loop_between_packages_and_modules():
    loops = loops_between_entries(PACKAGE_DIR)
    assert not loops, "import loops:\n" + "\n".join(loops)


def test_no_module_imports_from_a_layer_above_its_own():
    problems = upward_imports(PACKAGE_DIR)
    assert not problems, "imports going up:\n" + "\n".join(problems)


def test_the_package_keeps_its_layers():
    problems = violations(PACKAGE_DIR)
    assert not problems, "layering broken:\n" + "\n".join(problems)


def test_the_graph_sees_the_simulators_known_users():
    """The check looks where the imports are: demo imports the simulator."""
    graph = import_graph(PACKAGE_DIR)
    assert path_to(graph, "voiceactors.demo", (SIMULATOR,)) is not None
    assert "voiceactors.simulator.service" in {e.target for e in graph["voiceactors.simulator"]}


# -- the check itself fails on each kind of offence (a tree written here)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "voiceactors"
    for name, text in {"__init__.py": "", "simulator/__init__.py": "", "simulator/service.py": "",
                       **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_a_lazy_import_of_the_simulator_in_the_server_is_named(tmp_path):
    package = _tree(tmp_path, {"server.py": "import trio\n\ndef f():\n    from voiceactors.simulator import service\n"})
    [problem] = violations(package)
    assert problem.startswith("voiceactors/server.py:4 (inside a function): voiceactors.server imports "
                              "voiceactors.simulator (the product must not import the simulator"), problem


def test_a_relative_import_and_a_chain_through_another_module_are_named(tmp_path):
    package = _tree(tmp_path, {"http/__init__.py": "", "http/app.py": "from .. import helper\n",
                               "helper.py": "import importlib\nimportlib.import_module('voiceactors.simulator.service')\n"})
    [problem] = violations(package)
    assert problem.startswith("voiceactors/helper.py:2: voiceactors.helper imports voiceactors.simulator"), problem
    assert "and from voiceactors.http.app" in problem


def test_the_product_importing_the_demo_is_named_at_its_own_import(tmp_path):
    package = _tree(tmp_path, {"demo.py": "from voiceactors.simulator.service import x\n",
                               "runtime.py": "\n\nfrom voiceactors import demo\n"})
    [problem] = violations(package)
    assert problem.startswith("voiceactors/runtime.py:3: voiceactors.runtime imports voiceactors.demo "
                              "(the product must not import the simulator; reached by voiceactors.runtime → "
                              "voiceactors.demo → voiceactors.simulator"), problem


def test_the_journal_reaching_the_actors_is_named(tmp_path):
    package = _tree(tmp_path, {"journal/__init__.py": "", "journal/index.py": "from voiceactors.call import actor\n",
                               "call/__init__.py": "", "call/actor.py": ""})
    assert upward_imports(package) == [
        "voiceactors/journal/index.py:1: voiceactors.journal.index (the journal and its configuration) imports "
        "voiceactors.call.actor, a layer above (the actors)"]


def test_the_cli_may_import_the_simulator_only_lazily(tmp_path):
    lazy = _tree(tmp_path / "a", {"cli.py": "def main():\n    import voiceactors.simulator\n"})
    assert violations(lazy) == []
    eager = _tree(tmp_path / "b", {"cli.py": "import voiceactors.simulator\n"})
    [problem] = violations(eager)
    assert problem.startswith("voiceactors/cli.py:1: voiceactors.cli imports voiceactors.simulator at module level")


def test_an_import_from_a_layer_above_is_named_lazy_or_not(tmp_path):
    package = _tree(tmp_path, {"settings.py": "def check():\n    from voiceactors.tools import registry\n",
                               "tools/__init__.py": "", "tools/registry.py": "",
                               "cluster/__init__.py": "", "cluster/call_registry.py": "from voiceactors.call import feed\n",
                               "call/__init__.py": "", "call/feed.py": "",
                               "call/call_context.py": "", "cluster/leases.py": "import voiceactors.call.call_context\n"})
    assert upward_imports(package) == [
        "voiceactors/cluster/call_registry.py:1: voiceactors.cluster.call_registry (the call registry and the rest of scaling "
        "out) imports voiceactors.call.feed, a layer above (the actors)",
        "voiceactors/settings.py:2 (inside a function): voiceactors.settings (foundation: logging, time, files, "
        "settings and their plain data) imports voiceactors.tools.registry, a layer above (the tools)"]


def test_a_module_without_a_layer_is_named(tmp_path):
    package = _tree(tmp_path, {"newcomer.py": ""})
    assert upward_imports(package) == ["voiceactors.newcomer has no layer in LAYERS"]


def test_a_loop_inside_one_layer_is_named_even_through_a_lazy_import(tmp_path):
    package = _tree(tmp_path, {"server.py": "def serve():\n    from voiceactors import workers\n",
                               "workers.py": "from voiceactors.server import EXIT\n"})
    assert upward_imports(package) == []
    assert loops_between_entries(package) == [
        "voiceactors.server → voiceactors.workers → voiceactors.server (closed by voiceactors/workers.py:1)"]
