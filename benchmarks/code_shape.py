"""The shape of the package's wiring, as JSON: import graph, line counts, constructor sizes.

For this checkout and, with `--ref REV`, for a git revision of the same repository
(extracted into a temp dir), so a change is measured against its baseline in one run:

- `imports`: the module-level import graph of `navrl_daemon` (grimp, which import-linter
  uses; `if TYPE_CHECKING:` imports count, as import-linter counts them): modules,
  arrows (importer → imported pairs), the import cycles (strongly connected sets of
  modules), and the arrows between the package's top-level parts (`runtime → rl` ...).
- `lines`: line counts of the wiring and stage files that exist in that revision.
- `parameters`: parameters (without `self`) of every class constructor and module-level
  function in those files that takes more than 3.
- `parts`: files and lines of each top-level part of the package (`rl`, `offline` ...).
- `largest_functions`: the 12 longest functions and methods of the package, in lines.

Run: `.venv/bin/python benchmarks/code_shape.py [--ref main]`
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "navrl_daemon"
# The wiring and the stages it builds, wherever a revision keeps them.
WIRING = [
    "daemon.py",
    "offline_run.py",
    "pipeline/*.py",
    "stages/*.py",
    "offline/wiring.py",
    "offline/prefetcher.py",
    "offline/trainer.py",
    "runtime/distributed.py",
]
LARGEST = 12


def measure(root: Path) -> dict[str, Any]:
    """Everything for the checkout at `root` (in a subprocess, so its package is imported)."""
    code = f"import sys; sys.path.insert(0, {str(root)!r}); " + (
        "from benchmarks_code_shape import shape; import json; "
        f"print(json.dumps(shape({str(root)!r})))"
    )
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "benchmarks_code_shape.py").write_text(Path(__file__).read_text())
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONPATH": tmp},
            cwd=tmp,
        )
    return json.loads(out.stdout)


def shape(root: str) -> dict[str, Any]:
    return {
        "imports": imports(),
        "lines": lines(Path(root)),
        "parameters": parameters(Path(root)),
        "parts": part_sizes(Path(root)),
        "largest_functions": largest_functions(Path(root)),
    }


def _package_files(root: Path) -> list[Path]:
    return sorted((root / PACKAGE).rglob("*.py"))


def part_sizes(root: Path) -> dict[str, dict[str, int]]:
    """Files and lines per top-level part (a module directly in the package is its own)."""
    sizes: dict[str, dict[str, int]] = {}
    for path in _package_files(root):
        rel = path.relative_to(root / PACKAGE)
        part = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        size = sizes.setdefault(part, {"files": 0, "lines": 0})
        size["files"] += 1
        size["lines"] += len(path.read_text().splitlines())
    return dict(sorted(sizes.items()))


def largest_functions(root: Path) -> dict[str, int]:
    """The longest functions and methods (`file:Class.name`), first line to last."""
    found: list[tuple[int, str]] = []
    for path in _package_files(root):
        name = str(path.relative_to(root / PACKAGE))
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        size = (item.end_lineno or item.lineno) - item.lineno + 1
                        found.append((size, f"{name}:{node.name}.{item.name}"))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append((size, f"{name}:{node.name}"))
    return {where: size for size, where in sorted(found, reverse=True)[:LARGEST]}


def imports() -> dict[str, Any]:
    import grimp

    graph = grimp.build_graph(PACKAGE, cache_dir=None)
    modules = sorted(graph.modules)
    arrows = sorted(
        (importer, imported)
        for importer in modules
        for imported in graph.find_modules_directly_imported_by(importer)
    )
    cycles = [sorted(c) for c in _strongly_connected(modules, arrows) if len(c) > 1]
    parts = sorted(
        {(_part(a), _part(b)) for a, b in arrows if _part(a) != _part(b)},
    )
    return {
        "modules": len(modules),
        "arrows": len(arrows),
        "cycles": len(cycles),
        "cycle_members": cycles,
        "part_arrows": len(parts),
        "parts": [f"{a} -> {b}" for a, b in parts],
        "runtime_to_rl": [f"{a} -> {b}" for a, b in arrows if _is(a, "runtime") and _is(b, "rl")],
    }


def _part(module: str) -> str:
    """The top-level part of the package a module belongs to (`runtime`, `config` ...)."""
    names = module.split(".")
    return names[1] if len(names) > 1 else names[0]


def _is(module: str, part: str) -> bool:
    return _part(module) == part


def _strongly_connected(nodes: list[str], arrows: list[tuple[str, str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative)."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in arrows:
        out[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            recurse = False
            for j in range(i, len(out[node])):
                nxt = out[node][j]
                if nxt not in index:
                    work.append((node, j + 1))
                    work.append((nxt, 0))
                    recurse = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if recurse:
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return components


def _files(root: Path) -> list[Path]:
    found: list[Path] = []
    for pattern in WIRING:
        found += sorted(p for p in (root / PACKAGE).glob(pattern) if p.name != "__init__.py")
    return list(dict.fromkeys(found))


def lines(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root / PACKAGE)): len(p.read_text().splitlines()) for p in _files(root)
    }


def parameters(root: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in _files(root):
        tree = ast.parse(path.read_text())
        name = str(path.relative_to(root / PACKAGE))
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        counts[f"{name}:{node.name}"] = _count(item) - 1  # self
            elif isinstance(node, ast.FunctionDef):
                counts[f"{name}:{node.name}()"] = _count(node)
    return {k: v for k, v in counts.items() if v > 3}


def _count(fn: ast.FunctionDef) -> int:
    a = fn.args
    return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", help="a git revision to measure too, as the baseline")
    args = ap.parse_args()
    result: dict[str, Any] = {"this": measure(REPO)}
    if args.ref:
        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", args.ref, PACKAGE],
                capture_output=True,
                check=True,
            )
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            result[args.ref] = measure(Path(tmp))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
