"""The house rules of issue 27, read from the code's own imports (``ast``, nothing is run).

- The folders of ``supervisor/`` are layers, bottom to top (``LAYERS``): a module imports only
  from its own layer or lower ones, type-only imports included.
- No import circle between modules of ``supervisor/`` or ``sidecars/sdk/``.
- No module takes another module's underscore names (``from x import _y``, ``x._y``).
- No file of ``supervisor/`` or ``sidecars/sdk/`` is over 700 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LAYERS = [
    "contracts",
    "policy",
    "protocols",
    "registry",
    "packages",
    "telemetry",
    "private_files",
    "processes",
    "calls",
    "workers",
    "pools",
    "host",
    "server",
    "client",
    "mcp_face",
    "cli",
    "__main__",
]
"""``supervisor/``'s top-level packages and modules, bottom first."""

KNOWN: set[tuple[str, str]] = set()
"""(importer module, imported module) still crossing upward; issue 27 empties this."""

KNOWN_CIRCLES: set[str] = set()
"""Modules still on an import circle (named by the circle's first module); issue 27 empties this."""
KNOWN_PRIVATE: set[str] = set()
"""Modules still taking other modules' underscore names; issue 27 empties this."""
KNOWN_LONG: set[str] = set()
"""Files still over ``MAX_LINES``; issue 27 empties this."""

MAX_LINES = 700


def _modules(*tops: str) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for top in tops:
        for p in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" in p.parts:
                continue
            parts = p.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = p
    return found


MODULES = _modules("supervisor", "sidecars/sdk")


def _imports(name: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names taken, line) for every import of ``path``, relative ones resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, list[str], int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in MODULES:
                    out.append((sub, [], node.lineno))
                else:
                    out.append((base, [a.name], node.lineno))
    return out


def _owner(module: str) -> str | None:
    """The module of this tree that ``module`` names (a package's ``__init__`` included)."""
    while module:
        if module in MODULES:
            return module
        module = module.rpartition(".")[0]
    return None


def _layer(module: str) -> int:
    return LAYERS.index(module.split(".")[1])


def test_every_top_level_part_of_supervisor_has_a_layer() -> None:
    tops = {m.split(".")[1] for m in MODULES if m.startswith("supervisor.") and m.count(".")}
    assert tops <= set(LAYERS), f"add {sorted(tops - set(LAYERS))} to LAYERS"


def test_no_import_runs_up_a_layer() -> None:
    up = set()
    for name, path in MODULES.items():
        if not name.startswith("supervisor.") or name.count(".") == 0:
            continue
        for target, _, _line in _imports(name, path):
            owner = _owner(target) or ""
            inside = owner.count(".") and owner.startswith("supervisor.")
            if inside and _layer(owner) > _layer(name):
                up.add((name, owner))
    assert up - KNOWN == set(), f"imports that run up a layer: {sorted(up - KNOWN)}"
    assert KNOWN - up == set(), "fixed: take these out of KNOWN"


def test_no_import_circle() -> None:
    graph = {
        name: {o for t, _, _ in _imports(name, path) if (o := _owner(t)) and o != name}
        for name, path in MODULES.items()
    }
    # a package's __init__ that only hands names on is no node of a circle
    done: set[str] = set()
    circles = []

    def visit(node: str, stack: list[str]) -> None:
        if node in stack:
            circles.append([*stack[stack.index(node) :], node])
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*stack, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    firsts = {c[0] for c in circles}
    assert firsts - KNOWN_CIRCLES == set(), "\n".join(" -> ".join(c) for c in circles)
    assert KNOWN_CIRCLES - firsts == set(), "fixed: take these out of KNOWN_CIRCLES"


FOREIGN_PRIVATE_OK = {
    "_exit",  # os._exit in a forked child
    "_run_module_as_main",  # runpy: the zygote's child runs a module as __main__
    "_SimpleCData",  # _ctypes: processes/cabi.py defines the C types the walls use, as ctypes does
    "_replace",  # NamedTuple
    "_preferred_temporality",  # OpenTelemetry's exporter settings, copied by the wrapper
    "_preferred_aggregation",
}


def _own_private_names(tree: ast.AST) -> set[str]:
    """Underscore names this module defines: functions, classes, attributes, slots."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            own.add(node.value)  # __slots__ entries
    return {n for n in own if n.startswith("_")}


def test_no_module_takes_another_modules_private_names() -> None:
    taken = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for target, names, line in _imports(name, path):
            owner = _owner(target)
            if owner is None or owner == name:
                continue
            taken += [
                f"{name}:{line} takes {owner}.{n}"
                for n in names
                if n.startswith("_") and not n.startswith("__")
            ]
        own = _own_private_names(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                and node.attr not in own
                and node.attr not in FOREIGN_PRIVATE_OK
            ):
                taken.append(f"{name}:{node.lineno} takes {ast.unparse(node)}")
    takers = {t.partition(":")[0] for t in taken}
    assert takers - KNOWN_PRIVATE == set(), "\n".join(taken)
    assert KNOWN_PRIVATE - takers == set(), "fixed: take these out of KNOWN_PRIVATE"


@pytest.mark.parametrize("top", ["supervisor", "sidecars/sdk"])
def test_no_file_over_700_lines(top: str) -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / top).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert set(long) - KNOWN_LONG == set(), long
    assert {k for k in KNOWN_LONG if k.startswith(top + "/")} - set(long) == set(), "fixed"
