"""No constructor in a stage's file (stages/, and offline/'s two stages) takes more than 8
parameters (besides self): a stage takes its inputs, its outputs, and one typed context and
event sink, not a dozen loose settings and callbacks. A dataclass's fields are its
constructor's parameters."""

from __future__ import annotations

import ast
from pathlib import Path

import navrl_daemon

MAX_PARAMETERS = 8
PACKAGE = Path(navrl_daemon.__file__).parent
STAGE_FILES = [
    *sorted((PACKAGE / "stages").glob("*.py")),
    PACKAGE / "offline" / "prefetcher.py",
    PACKAGE / "offline" / "trainer.py",
]


def _is_dataclass(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name == "dataclass":
            return True
    return False


def _width(node: ast.ClassDef) -> int | None:
    """The parameters of the class's constructor (without self), None without one."""
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            args = item.args
            return len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) - 1
    if _is_dataclass(node):
        return sum(
            isinstance(item, ast.AnnAssign)
            and isinstance(item.target, ast.Name)
            and "ClassVar" not in ast.unparse(item.annotation)
            for item in node.body
        )
    return None


def widths() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in STAGE_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and (width := _width(node)) is not None:
                found[f"{path.relative_to(PACKAGE)}:{node.name}"] = width
    return found


def test_no_constructor_in_stages_takes_more_than_8_parameters() -> None:
    found = widths()
    for stage in (
        "stages/trainer.py:Trainer",
        "stages/producer.py:RolloutProducer",
        "offline/prefetcher.py:HDF5Prefetcher",
        "offline/trainer.py:OfflineTrainer",
    ):
        assert stage in found
    wide = {name: width for name, width in found.items() if width > MAX_PARAMETERS}
    assert not wide, f"constructors over {MAX_PARAMETERS} parameters: {wide}"


def test_the_check_counts_init_parameters_and_dataclass_fields() -> None:
    source = """
class Wide:
    def __init__(self, a, b=1, *, c, d=2) -> None: ...

@dataclass(frozen=True)
class Fields:
    a: int
    b: ClassVar[int] = 0
    c: str = ""
"""
    classes = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
    assert [_width(c) for c in classes] == [4, 2]
