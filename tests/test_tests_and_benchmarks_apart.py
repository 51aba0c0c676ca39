"""tests/ and benchmarks/ import nothing of each other: what both need lives in
navrl_daemon/testing. Running a benchmark script as a user does (a process of its own,
`forked.run_script`) is not an import and is allowed; loading one into the test's own
interpreter (import, `spec_from_file_location`, `runpy`, a path put on `sys.path`) is not."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What loads a file into this interpreter when handed its path or its folder.
LOADERS = {"spec_from_file_location", "SourceFileLoader", "import_module", "run_path"}
LOADERS |= {"run_module", "syspath_prepend", "sys.path.insert", "sys.path.append"}


def imports_of(path: Path, folder: str, modules: set[str]) -> list[str]:
    """The lines of `path` that import one of `modules` or load a file of `folder`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            name = func if func.startswith("sys.") else func.rsplit(".", 1)[-1]
            arguments = " ".join(ast.unparse(a) for a in node.args)
            if name in LOADERS and folder in arguments.lower():
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
            continue
        else:
            continue
        found += [
            f"{path.relative_to(REPO)}:{node.lineno}: imports {name}"
            for name in names
            if name.split(".")[0] in modules
        ]
    return found


def test_no_test_imports_a_benchmark() -> None:
    scripts = {p.stem for p in (REPO / "benchmarks").rglob("*.py")} | {"benchmarks"}
    found = [
        line
        for path in sorted((REPO / "tests").rglob("*.py"))
        for line in imports_of(path, "benchmarks", scripts)
    ]
    assert not found, "\n".join(found)


def test_no_benchmark_imports_a_test() -> None:
    found = [
        line
        for path in sorted((REPO / "benchmarks").rglob("*.py"))
        for line in imports_of(path, "tests", {"tests"})
    ]
    assert not found, "\n".join(found)
