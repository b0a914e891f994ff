"""The package's floors (issue 39): no import circle between gputop's modules, and no module importing one on a
floor above its own.  A change that adds either fails here with the edge that did it.

The graph is read from the source with `ast`, not from `sys.modules`, and it counts every import statement
wherever it stands: at module level, inside a function (the lazy imports that keep Textual, py-spy and the
simulator off a path that does not need them), and under `if TYPE_CHECKING:`.  A lazy import is still a
dependence, only a later one: two modules that import each other inside functions are a circle that merely
has not bitten yet, and a type-only import ties one module to the shape of another as much as a call does.

Run it as a script (`python tests/test_layers.py`) to print the circles and the upward edges.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path
from typing import Optional

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gputop"

# The floors, lowest first, read from what the code is.  A module's floor is its longest prefix in this table;
# a module may import its own floor (without a circle) and any floor below, never one above.
FLOORS: list[tuple[str, list[str]]] = [
    # the data every part passes around, the errors, the units; the simulator's package names only its default
    # profile (the command line offers it without loading the simulator)
    (
        "model",
        [
            "gputop",
            "gputop.errors",
            "gputop.units",
            "gputop.model",
            "gputop.history",
            "gputop.heap",
            "gputop.signals",
            "gputop.clock",
            "gputop.sim",
        ],
    ),
    # pure functions of the model: the checks, the GPU-health rules, the field table that shows them
    ("analysis", ["gputop.analysis", "gputop.gpu_fields"]),
    # reading the machine and the job: NVML, /proc, /sys, py-spy, the injected agents, other nodes' exporters;
    # a reader classifies what it reads with the analysis's rules (GPU health, stack classes)
    ("collect", ["gputop.collect", "gputop.inject", "gputop.fleet"]),
    # the simulated machine and job: fakes of what collect reads (a fake /sys parses as the real one does)
    ("sim", ["gputop.sim."]),
    # the machine read, real or simulated (backend); a source of snapshots built from its readers, and the
    # measuring sessions over them
    (
        "pipeline",
        [
            "gputop.backend",
            "gputop.pipeline",
            "gputop.source",
            "gputop.bench",
            "gputop.tracing",
            "gputop.recording",
            "gputop.check_window",
        ],
    ),
    # what gputop writes down: reports, the Prometheus exporter, the advice already given
    ("report", ["gputop.report", "gputop.exporter", "gputop.advice_memory"]),
    # the live monitor without its screen: collection, history, the diagnosis' schedule, the actions' results
    ("monitor", ["gputop.monitor"]),
    # the terminal UI, the view and the keys over the monitor
    ("tui", ["gputop.tui"]),
    # the commands, each of which may open the UI
    ("commands", ["gputop.commands"]),
    # the command line and `python -m gputop`
    ("cli", ["gputop.cli", "gputop.__main__"]),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(module: str, node: ast.Import | ast.ImportFrom, is_package: bool, modules: dict[str, Path]) -> set[str]:
    """The gputop modules one import statement loads (`from gputop.a import b` names gputop.a.b when b is a
    module, else gputop.a)."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix for alias in node.names]
    found = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


@functools.lru_cache(maxsize=1)  # one parse of the package for the module's tests (each ~1.3 CPU-s alone)
def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name] |= imported(name, node, path.name == "__init__.py", modules)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def floor_of(module: str) -> Optional[int]:
    """The floor of the longest prefix naming the module: "gputop.sim" is that package alone, "gputop.sim." every
    module under it."""
    best: tuple[int, Optional[int]] = (-1, None)
    for level, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            under = prefix if prefix.endswith(".") else prefix + "."
            if (module == prefix or module.startswith(under)) and len(prefix) > best[0]:
                best = (len(prefix), level)
    return best[1]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            here, there = floor_of(module), floor_of(target)
            if here is not None and there is not None and there > here:
                found.append(f"{module} ({FLOORS[here][0]}) -> {target} ({FLOORS[there][0]})")
    return found


def test_every_module_has_a_floor():
    homeless = [m for m in all_modules() if floor_of(m) is None]
    assert not homeless, f"give {homeless} a floor in FLOORS"


@pytest.mark.integration  # parses the whole package, as ruff and mypy read it (~1.4 s of CPU, near the unit budget)
def test_the_graph_sees_lazy_and_type_only_imports():
    # the pipeline loads the job collector only inside functions and names it under TYPE_CHECKING: both count
    graph = import_graph()
    assert "gputop.collect.job_tree" in graph["gputop.pipeline"]
    assert "gputop.tui.app" in graph["gputop.commands.tui"]  # imported inside run()


def test_the_checks_catch_a_circle_and_an_upward_edge():
    # a hand-made graph: the model importing the TUI is both a circle (with the TUI's import of it) and upward
    graph = {"gputop.model": {"gputop.tui.app"}, "gputop.tui.app": {"gputop.model"}, "gputop.units": set()}
    assert circles(graph) == [["gputop.model", "gputop.tui.app"]]
    assert upward_imports(graph) == ["gputop.model (model) -> gputop.tui.app (tui)"]


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles (move the shared thing down a floor):\n" + "\n".join(map(str, found))


def test_no_import_up_a_floor():
    found = upward_imports(import_graph())
    assert not found, "imports up a floor (move the imported thing down):\n" + "\n".join(found)


if __name__ == "__main__":
    graph = import_graph()
    found_circles = circles(graph)
    found_upward = upward_imports(graph)
    for circle in found_circles:
        print("circle:", " <-> ".join(circle))
    for edge in found_upward:
        print("upward:", edge)
    print(f"{len(found_circles)} circles, {len(found_upward)} upward imports")
    sys.exit(1 if found_circles or found_upward else 0)
