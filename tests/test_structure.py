"""The package's shape: no import cycles, rooms small enough to read in one sitting,
and a function-local import only where a comment says why (deferring torch, a
worker's own imports, cffi's compiler).

A file over MAX_FILE_LINES lines, or a function over MAX_FUNCTION_LINES, is allowed
only with a `# why long: <reason>` comment (a file's within its first 40 lines, a
function's on its `def` line, the line above it or its first three lines)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sdpa_probe"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
WHY_LONG = "# why long:"


def _modules(root: Path) -> dict[str, Path]:
    mods = {}
    for p in (root / "sdpa_probe").rglob("*.py"):
        if "_native" in p.parts:
            continue
        rel = p.relative_to(root).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        mods[".".join(parts)] = p
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Every module of the package this one imports, function-local imports included (a
    local import still couples the two rooms); a module importing its own package is
    not an edge."""
    deps: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")
                if path.name != "__init__.py":
                    parts = parts[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            found = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        deps.update(d for d in found if d in mods and d != name
                    and not name.startswith(d + "."))
    return deps


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    mods = _modules(root)
    graph = {n: _imports(n, p, mods) for n, p in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles():
    assert import_cycles() == []


def test_the_cycle_finder_finds_a_cycle(tmp_path):
    pkg = tmp_path / "sdpa_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import g  # deferred\n")
    assert import_cycles(tmp_path) == [["sdpa_probe.a", "sdpa_probe.b"]]


def _python_files() -> list[Path]:
    files = [p for p in PACKAGE.rglob("*.py") if "_native" not in p.parts]
    for extra in ("tests", "benchmarks", "docs"):
        files += (ROOT / extra).rglob("*.py")
    return sorted(files)


def _says_why(lines: list[str], first: int, last: int) -> bool:
    return any(WHY_LONG in lines[i] for i in range(max(first, 0), min(last, len(lines))))


@pytest.mark.parametrize("path", _python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_files_and_functions_are_small(path: Path):
    text = path.read_text()
    lines = text.splitlines()
    problems = []
    if len(lines) > MAX_FILE_LINES and not _says_why(lines, 0, 40):
        problems.append(f"{len(lines)} lines (over {MAX_FILE_LINES})")
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        n = node.end_lineno - start + 1
        if n > MAX_FUNCTION_LINES and not _says_why(lines, start - 2, node.lineno + 3):
            problems.append(f"{node.name} (line {node.lineno}) is {n} lines "
                            f"(over {MAX_FUNCTION_LINES})")
    assert not problems, "; ".join(problems)


def _local_imports_without_a_reason(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    bad = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                here = lines[node.lineno - 1]
                above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
                if "#" not in here and not above.startswith("#"):
                    bad.append(f"line {node.lineno}: {here.strip()}")
    return sorted(set(bad))


@pytest.mark.parametrize("path", sorted(p for p in PACKAGE.rglob("*.py")
                                        if "_native" not in p.parts),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_a_local_import_says_why(path: Path):
    assert _local_imports_without_a_reason(path) == []


# Words about how the tool was made, not about the tool (built in pieces, so that this
# file does not match itself)
_MAKING = re.compile("|".join([r"\bst" + r"op [0-9]", r"st" + r"op[0-9]{2}",
                               r"se" + r"ed ?00[034]", r"previous se" + r"ssion"]), re.I)
_SKIP_DIRS = {".git", ".venv", ".ci-cache", "__pycache__", ".pytest_cache", ".ruff_cache",
              "build", "dist"}
_DATA_DIRS = {"golden"}  # (at the top: reference data, not words)


def _product_files() -> list[Path]:
    out = []
    for p in ROOT.rglob("*"):
        rel = p.relative_to(ROOT)
        if rel.parts[0] in _DATA_DIRS or any(part in _SKIP_DIRS or part.endswith(".egg-info")
                                             for part in rel.parts):
            continue
        if p.is_file() and not p.is_symlink():
            out.append(p)
    return sorted(out)


def test_the_product_speaks_of_the_product():
    said = []
    for p in _product_files():
        rel = str(p.relative_to(ROOT))
        if _MAKING.search(rel):
            said.append(f"{rel} (its name)")
        try:
            text = p.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        said += [f"{rel}:{i}: {ln.strip()[:80]}" for i, ln in enumerate(text.splitlines(), 1)
                 if _MAKING.search(ln)]
    assert not said, f"{len(said)} lines:\n" + "\n".join(said[:40])


def test_every_module_imports_first():
    """Each module imported first, in a process of its own packages' (a package's
    __init__ importing a room that imports the package back fails only when that room
    is the first one imported: the graph test above does not see package inits)."""
    code = ("import importlib, sys\n"
            "for name in sys.argv[1:]:\n"
            "    for m in [m for m in sys.modules if m.split('.')[0] == 'sdpa_probe']:\n"
            "        del sys.modules[m]\n"
            "    importlib.import_module(name)\n")
    names = sorted(_modules(ROOT))
    res = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
