"""The shape of the package's wiring, as JSON: import graph, line counts, constructor sizes,
how far the loss is from the loop, what one iteration runs, captures with a fallback.

For this checkout and, with `--before PATH` / `--tree PATH` (another checkout, e.g. a git
worktree of the baseline) or `--ref REV` (a git revision of this repository, extracted
into a temp dir), for others too, each measured in a process of its own with that tree on
PYTHONPATH, so a change is measured against its baseline in one run:

- `imports`: the module-level import graph of `navrl_daemon` (grimp, which import-linter
  uses; `if TYPE_CHECKING:` imports count, as import-linter counts them): modules,
  arrows (importer → imported pairs), the import cycles (strongly connected sets of
  modules), and the arrows between the package's top-level parts (`runtime → rl` ...).
- `lines`: line counts of the wiring and stage files that exist in that revision.
- `parameters`: parameters (without `self`) of every class constructor and module-level
  function in those files that takes more than 3.
- `parts`: files and lines of each top-level part of the package (`rl`, `offline` ...).
- `largest_functions`: the 12 longest functions and methods of the package, in lines.
- `loss_calls`: calls from the trainer's loop (`Trainer.run`) to the actor loss on a real
  update of a tiny learner (eager update path), and their chain;
  navrl_daemon/testing/traced_iteration.py, which tests/stages/test_loss_depth.py uses too.
- `iteration_files`: the package's files in which a function runs during one iteration
  after a warm-up one: the producer's part (lease, collect, send) and the trainer's, from
  the rollout's arrival to the published weights (same script). The script plays the
  producer stage, so stages/producer.py and the daemon's wiring are not among them.
- `capture_implementations`: the functions that capture a step (a call named `*capture*`,
  `torch.cuda.graph`, `CUDAGraph`) inside a `try` whose `except` goes on without it (does
  not only re-raise): each is one implementation of capture-with-fallback.

`change` puts each tree's three last numbers side by side, with this one's ratio to each.

Run: `.venv/bin/python benchmarks/code_shape.py [--before ../old-checkout] [--ref main]`
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "navrl_daemon"
# Run as a script against any checkout (it imports the package found on PYTHONPATH).
TRACED = REPO / PACKAGE / "testing" / "traced_iteration.py"
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
# What records a step as a graph: a callee named like these.
GRAPH_CALLS = ("torch.cuda.graph", "CUDAGraph")
COMPARED = ("loss_calls", "iteration_files", "capture_implementations")


def measure(root: Path) -> dict[str, Any]:
    """Everything for the checkout at `root`, each part in a subprocess with `root` on
    PYTHONPATH, so its package is the one imported."""
    code = (
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
            env={**os.environ, "PYTHONPATH": f"{tmp}{os.pathsep}{root}"},
            cwd=tmp,
        )
    return {**json.loads(out.stdout), **traced(root)}


def traced(root: Path) -> dict[str, Any]:
    """`loss_calls` and `iteration_files` of the package at `root`: one traced iteration
    of a tiny learner, by the shared script run against that package."""
    from navrl_daemon.testing import TINY

    overrides = TINY
    if "[env.navigation]" not in (root / "config" / "default.toml").read_text():
        # A tree from before the embedded backend's keys had their own section.
        overrides = [x.replace("env.navigation.", "env.", 1) for x in TINY]
    out = subprocess.run(
        [sys.executable, "-P", str(TRACED), *overrides],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"},
        cwd=root,
    )
    found = json.loads(out.stdout.splitlines()[-1])  # the log comes first
    if Path(found["package"]) != (root / PACKAGE).resolve():
        raise RuntimeError(f"measured {found['package']}, not {root / PACKAGE}")
    return {
        "loss_calls": {"count": found["loss_calls"], "chain": found["loss_chain"]},
        "iteration_files": {"count": found["iteration_files"], "files": found["files"]},
    }


def shape(root: str) -> dict[str, Any]:
    captures = capture_implementations(Path(root))
    return {
        "imports": imports(),
        "lines": lines(Path(root)),
        "parameters": parameters(Path(root)),
        "parts": part_sizes(Path(root)),
        "largest_functions": largest_functions(Path(root)),
        "capture_implementations": {"count": len(captures), "where": captures},
    }


def capture_implementations(root: Path) -> list[str]:
    """`file:function` of each function with a `try` that captures a step and an
    `except` that goes on without the capture (a fallback), in the package at `root`."""
    found: list[str] = []
    for path in _package_files(root):
        name = str(path.relative_to(root / PACKAGE))
        for where, node in _functions(ast.parse(path.read_text()), ""):
            tries = [n for n in _own_nodes(node) if isinstance(n, ast.Try | ast.TryStar)]
            if any(_captures(t.body) and any(map(_falls_back, t.handlers)) for t in tries):
                found.append(f"{name}:{where}")
    return found


def _functions(node: ast.AST, prefix: str) -> list[tuple[str, ast.AST]]:
    """Every function and method under `node`, with its qualified name."""
    found = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append((prefix + child.name, child))
            found += _functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            found += _functions(child, f"{prefix}{child.name}.")
        else:
            found += _functions(child, prefix)
    return found


def _own_nodes(function: ast.AST) -> list[ast.AST]:
    """The nodes of a function's body, not those of the functions it defines."""
    nodes, work = [], list(ast.iter_child_nodes(function))
    while work:
        node = work.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        nodes.append(node)
        work += ast.iter_child_nodes(node)
    return nodes


def _captures(body: list[ast.stmt]) -> bool:
    for node in (n for stmt in body for n in ast.walk(stmt)):
        if isinstance(node, ast.Call):
            callee = ast.unparse(node.func)
            last = callee.rsplit(".", 1)[-1]
            if "capture" in last.lower() or callee.endswith(GRAPH_CALLS):
                return True
    return False


def _falls_back(handler: ast.ExceptHandler) -> bool:
    """The handler goes on (warns, records, returns), rather than only re-raising."""
    return not isinstance(handler.body[-1], ast.Raise)


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


def change(result: dict[str, Any]) -> dict[str, Any]:
    """The compared numbers of every tree, and this tree's ratio to each other's."""
    out: dict[str, Any] = {}
    for key in COMPARED:
        counts = {label: tree[key]["count"] for label, tree in result.items()}
        this = counts["this"]
        for label, count in list(counts.items()):
            if label != "this":
                counts[f"this/{label}"] = round(this / count, 3) if count else None
        out[key] = counts
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", help="a git revision to measure too, as the baseline")
    ap.add_argument("--before", type=Path, help="another checkout, the baseline: 'before'")
    ap.add_argument("--tree", type=Path, action="append", default=[], help="another checkout")
    args = ap.parse_args()
    result: dict[str, Any] = {"this": measure(REPO)}
    if args.before:
        result["before"] = measure(args.before.resolve())
    for tree in args.tree:
        result[str(tree)] = measure(tree.resolve())
    if args.ref:
        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", args.ref, PACKAGE],
                capture_output=True,
                check=True,
            )
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            result[args.ref] = measure(Path(tmp))
    result["change"] = change(result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
