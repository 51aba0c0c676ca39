"""benchmarks/code_shape.py's own measurements: capture-with-fallback counted on crafted
sources (none, one, three) and on the package, and one traced iteration of this checkout
(the loss's chain from the trainer's loop, the files one iteration runs, start-up not
among them)."""

from __future__ import annotations

from pathlib import Path

import code_shape as bench

# Three ways to write it: a capture callable, a method named for it, torch's context.
ONE = """
import warnings
class Rollout:
    def _capture(self, step):
        try:
            self.replay = self.capture(step, warmup_runs=3)
        except Exception as err:
            if not self.fallback:
                raise
            self.capture_error = str(err)
"""
TWO = """
def prepare(update, cfg):
    try:
        update._capture(cfg)
    except RuntimeError:
        update.graphs = False
"""
THREE = """
import torch
def record(graph, step):
    try:
        with torch.cuda.graph(graph):
            step()
    except RuntimeError as err:
        return str(err)
"""
# None of these falls back: cleans up and goes on failing, re-raises, captures nothing.
NONE = """
import torch
def capture(graph, step):
    graph.capture_begin()
    try:
        step()
    finally:
        graph.capture_end()
def strict(capture, step):
    try:
        return capture(step)
    except RuntimeError as err:
        raise ValueError(str(err)) from err
def load(path):
    try:
        return torch.load(path)
    except OSError:
        return None
"""


def package(root: Path, **files: str) -> Path:
    for name, source in files.items():
        path = root / bench.PACKAGE / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


def test_captures_with_a_fallback_are_counted_once_each(tmp_path: Path) -> None:
    assert bench.capture_implementations(package(tmp_path / "none", none=NONE)) == []
    one = package(tmp_path / "one", graphs=ONE, none=NONE)
    assert bench.capture_implementations(one) == ["graphs.py:Rollout._capture"]
    three = package(tmp_path / "three", a=ONE, b=TWO, c=THREE, none=NONE)
    found = bench.capture_implementations(three)
    assert found == ["a.py:Rollout._capture", "b.py:prepare", "c.py:record"]


def test_the_package_captures_with_a_fallback_somewhere() -> None:
    assert len(bench.capture_implementations(bench.REPO)) >= 1


def test_one_traced_iteration_of_this_checkout() -> None:
    traced = bench.traced(bench.REPO)
    chain = traced["loss_calls"]["chain"]
    assert chain[0] == "trainer.Trainer.run"
    assert chain[-1] == "ppo.actor_loss"
    assert traced["loss_calls"]["count"] == len(chain) - 1
    files = traced["iteration_files"]["files"]
    assert traced["iteration_files"]["count"] == len(files)
    # Both halves of the iteration: the collect and the update.
    assert {"rl/collector.py", "rl/rollout.py", "stages/trainer.py", "rl/ppo.py"} <= set(files)
    # Start-up is not in it: the config's loading, the learner's building.
    assert not {"config/loader.py", "rl/training.py"} & set(files)


def test_change_sets_this_tree_beside_the_others() -> None:
    trees = {
        "this": {"loss_calls": 5, "iteration_files": 15, "capture_implementations": 1},
        "before": {"loss_calls": 10, "iteration_files": 20, "capture_implementations": 0},
    }
    result = {label: {k: {"count": v} for k, v in tree.items()} for label, tree in trees.items()}
    change = bench.change(result)
    assert change["loss_calls"] == {"this": 5, "before": 10, "this/before": 0.5}
    assert change["iteration_files"]["this/before"] == 0.75
    assert change["capture_implementations"]["this/before"] is None
