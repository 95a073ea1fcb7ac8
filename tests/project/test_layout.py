"""The layout holds: no import cycle between the service's or the tooling's
modules, nor between the service's packages, the tooling stays out of what
the service's own commands load, and the tests share their harness through
the tooling's test kit, never through the benchmarks' scripts."""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "dataservice": ROOT / "dataservice",
    "dataservice_tools": ROOT / "tools" / "dataservice_tools",
}


def _modules() -> dict[str, Path]:
    found = {}
    for name, path in PACKAGES.items():
        for source in path.rglob("*.py"):
            if source.name.endswith("_pb2.py"):
                continue
            parts = [name, *source.relative_to(path).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = source
    return found


def _imports(name: str, source: Path, modules: dict[str, Path]) -> Iterator[str]:
    """Every module of ours that ``name`` imports anywhere: at the top, in a
    function, or for type checking alone (a cycle there is a cycle in the design)."""
    package = name if source.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in modules:
                    yield target
                elif base in modules:
                    yield base


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_another_that_imports_it_back() -> None:
    modules = _modules()
    graph = {
        name: set(_imports(name, source, modules)) - {name} for name, source in modules.items()
    }
    assert len(graph) > 150
    assert _cycles(graph) == []


def _package(module: str) -> str:
    """The top-level package (or module) of the service that ``module`` belongs to."""
    return ".".join(module.split(".")[:2])


def _package_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], str]]:
    """The service's top-level packages and modules, each with those it imports
    (anywhere, as for modules), and one module import behind each edge."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    because: dict[tuple[str, str], str] = {}
    for name, source in sorted(modules.items()):
        if name.partition(".")[0] != "dataservice":
            continue
        here = _package(name)
        edges = graph.setdefault(here, set())
        for target in _imports(name, source, modules):
            there = _package(target)
            if target.partition(".")[0] == "dataservice" and there != here:
                edges.add(there)
                because.setdefault((here, there), f"{name} imports {target}")
    return graph, because


def _loop(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One path round a strongly connected ``component``, back to where it starts."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node] & members):
            if nxt == start:
                return [*paths[node], start]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                queue.append(nxt)
    raise AssertionError(f"no loop through {component}")


def test_no_package_of_the_service_imports_another_that_imports_it_back() -> None:
    graph, because = _package_graph()
    assert {"dataservice.config", "dataservice.observe", "dataservice.handler"} <= graph.keys()
    loops = []
    for component in _cycles(graph):
        loop = _loop(graph, component)
        steps = [f"  {because[edge]}" for edge in itertools.pairwise(loop)]
        head = f"{', '.join(component)} import each other; one loop: " + " -> ".join(loop)
        loops.append("\n".join([head, *steps]))
    assert not loops, "\n".join(loops)


# The bottom layers, and the service's packages each may import besides (any
# may import the top-level modules: errors, enums, identifiers, ...). What they
# need of a higher package is passed in, or named by a Protocol of their own.
BOTTOM = {
    "dataservice.config": {"dataservice.redis"},
    "dataservice.observe": {"dataservice.config", "dataservice.redis"},
}


def test_observe_and_config_import_no_package_above_them() -> None:
    graph, because = _package_graph()
    offences = sorted(
        because[(package, target)]
        for package, allowed in BOTTOM.items()
        for target in graph[package] - allowed
        if (ROOT / Path(*target.split("."))).is_dir()
    )
    assert offences == []


# What says which broker is in use: only the broker package asks it, and only
# it names a broker's own module (the settings parse the URL's scheme).
BROKER_BRANCHES = ("broker_is_amqp", "AMQP_SCHEMES", "REDIS_SCHEMES")
BROKER_MODULES = {"dataservice.broker.redis", "dataservice.broker.rabbitmq"}
BROKER_FREE_OF_BRANCHES_EXCEPT = {ROOT / "dataservice" / "config" / "settings.py"}


def _names_and_strings(source: Path) -> Iterator[tuple[int, str]]:
    """Every name, attribute and string constant of ``source`` (docstrings
    and comments aside), with its line."""
    tree = ast.parse(source.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, ast.alias):
            yield node.lineno, node.name
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            yield node.lineno, node.value


def test_no_module_outside_the_broker_package_asks_which_broker_is_in_use() -> None:
    modules = _modules()
    broker = ROOT / "dataservice" / "broker"
    offences = []
    for name, source in modules.items():
        if not name.startswith("dataservice.") or source.is_relative_to(broker):
            continue
        for target in set(_imports(name, source, modules)) & BROKER_MODULES:
            offences.append(f"{name} imports {target}")
        if source in BROKER_FREE_OF_BRANCHES_EXCEPT:
            continue
        for line, text in _names_and_strings(source):
            if text in BROKER_BRANCHES:
                offences.append(f"{source.relative_to(ROOT)}:{line} {text!r}")
    assert offences == []


def test_kombus_message_layout_is_built_only_in_compat() -> None:
    """A message as kombu stores it (its delivery info, body encoding and
    delivery tag among its properties) is made by the compat modules alone:
    no other module writes those keys in a dict."""
    layout = {"delivery_info", "body_encoding", "delivery_tag"}
    compat = ROOT / "dataservice" / "compat"
    offences = [
        f"{source.relative_to(ROOT)}:{key.lineno} {key.value!r}"
        for name, source in _modules().items()
        if name.startswith("dataservice.") and not source.is_relative_to(compat)
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.Dict)
        for key in node.keys
        if isinstance(key, ast.Constant) and key.value in layout
    ]
    assert offences == []


def test_the_service_does_not_import_the_tooling() -> None:
    modules = _modules()
    offences = sorted(
        f"{name} imports {target}"
        for name, source in modules.items()
        if name.startswith("dataservice.")
        for target in _imports(name, source, modules)
        if target.startswith("dataservice_tools")
    )
    assert offences == []


def _imports_bench(source: Path) -> list[str]:
    """The ``bench`` imports of ``source``: ``import bench...`` and ``from bench... import``."""
    found = []
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [f"line {node.lineno}: {n}" for n in names if n.partition(".")[0] == "bench"]
    return found


def test_neither_the_tests_nor_the_tooling_import_the_benchmarks() -> None:
    sources = [*(ROOT / "tests").rglob("*.py"), *PACKAGES["dataservice_tools"].rglob("*.py")]
    assert len(sources) > 100
    offences = {
        str(source.relative_to(ROOT)): found
        for source in sources
        if (found := _imports_bench(source))
    }
    assert offences == {}


def test_starting_a_worker_loads_none_of_the_tooling() -> None:
    probe = (
        "import sys; sys.argv = ['dataservice', 'worker', '--help']\n"
        "from dataservice.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('dataservice_tools')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert "--lane" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"
