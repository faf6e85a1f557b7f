"""The import layers hold: g4bench.{model,engine,server} ← harness ← the CLI, and no cycles.

Every import in every module counts, including those inside functions (the CLI's lazy imports),
so a layer cannot be crossed by hiding an import in a function body. The harness starts a server
through a function, so no string in it may name the CLI either.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("g4bench", "harness")
CORE = ("g4bench.model", "g4bench.engine", "g4bench.server")
CLI = ("g4bench.cli", "g4bench.commands")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(path: Path, name: str) -> set[str]:
    """Absolute names of every module imported anywhere in the file (first-party only)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in out if m.split(".")[0] in PACKAGES}


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {n: {m for m in imports_of(p, n) if m in mods and m != n} for n, p in mods.items()}


def test_core_packages_never_import_the_harness_or_the_cli():
    bad = [(n, m) for n, deps in graph().items() if within(n, CORE) for m in deps if within(m, ("harness", *CLI))]
    assert bad == []


def test_nothing_below_the_cli_imports_it():
    bad = [(n, m) for n, deps in graph().items() if not within(n, CLI) for m in deps if within(m, CLI)]
    assert bad == []


def test_the_harness_starts_a_server_through_a_function():
    for name, path in modules().items():
        if name.startswith("harness"):
            assert "g4bench.cli" not in path.read_text(), f"{name} starts the CLI by name"


def test_no_import_cycles():
    g = graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(n: str, stack: list[str]) -> None:
        state[n] = 1
        for m in sorted(g[n]):
            if state.get(m) == 1:
                cycles.append([*stack[stack.index(m) :], m] if m in stack else [n, m])
            elif m not in state:
                visit(m, [*stack, m])
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n, [n])
    # a package's __init__ importing its own submodules is not a cycle of concepts
    cycles = [c for c in cycles if not any(b.startswith(a + ".") for a, b in zip(c, c[1:], strict=False))]
    assert cycles == []


def test_the_harness_core_is_small_and_rooms_carry_no_family_prefix():
    """harness/ holds a small measurement core and one subpackage per capability (issue: rooms).

    A module named after a room at the top level (capacity_x.py beside capacity/) is the prefix
    family this layout replaced; it belongs inside the room.
    """
    top = sorted(p.stem for p in (ROOT / "harness").glob("*.py"))
    rooms = sorted(p.name for p in (ROOT / "harness").iterdir() if (p / "__init__.py").is_file())
    assert len(top) <= 13, top  # __init__ and the 12 core modules
    core_doc = (ROOT / "harness" / "__init__.py").read_text().split("One room per capability")[0]
    unnamed = [m for m in top if m != "__init__" and f"`{m}`" not in core_doc]
    assert unnamed == [], "a core module the package docstring does not name"
    assert {"revalidate", "capacity", "roofline", "calibrate", "load", "sim", "checks"} <= set(rooms)
    families = [m for m in top for r in rooms if m == r or m.startswith(r + "_")]
    assert families == []
    inside = [f"{r}/{p.stem}" for r in rooms for p in (ROOT / "harness" / r).glob("*.py") if p.stem.startswith(r + "_")]
    assert inside == []
