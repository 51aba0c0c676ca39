"""Deployment files of the actor (rl/deploy.py): ONNX for ONNX Runtime (C++, Python, ROS
nodes) and a `torch.export` program (`.pt2`, `torch.export.load`). Inputs are named after
NavRL's observation keys, the batch dim is dynamic, outputs are `action` (world-frame
velocity command) and `action_normalized`.

ONNX needs the `onnx` and `onnxscript` packages (`pip install 'navrl-daemon[export]'`,
which also brings `onnxruntime` to check the file): torch's exporter writes through them.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from navrl_daemon.errors import UsageError
from navrl_daemon.rl.deploy import OBSERVATION_SHAPES, OUTPUTS, DeployedActor, example_observation
from navrl_daemon.storage.atomic import write_atomic

FORMATS = {"onnx": ".onnx", "torch-export": ".pt2"}
ONNX_OPSET = 18


def export_actor(actor: DeployedActor, fmt: str, path: Path) -> None:
    """Write `actor` as `fmt` ("onnx" or "torch-export") to `path`, atomically."""
    actor = actor.eval()
    inputs = tuple(example_observation(batch=2).values())
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    dynamic = {name: {0: batch} for name in OBSERVATION_SHAPES}
    with tempfile.TemporaryDirectory(prefix="navrl-export-") as tmp:
        out = Path(tmp) / f"actor{FORMATS[fmt]}"
        if fmt == "onnx":
            _onnx(actor, inputs, dynamic, out)
        else:
            program = torch.export.export(actor, inputs, dynamic_shapes=dynamic, strict=False)
            torch.export.save(program, out)
        write_atomic(path, out.read_bytes())


def _onnx(actor: DeployedActor, inputs: tuple, dynamic: dict, out: Path) -> None:
    try:
        import onnx  # noqa: F401  (torch's exporter needs both)
        import onnxscript  # noqa: F401
    except ImportError as err:
        raise UsageError(
            f"--format onnx needs the {err.name!r} package: pip install 'navrl-daemon[export]'"
        ) from None
    with warnings.catch_warnings(), _quiet("torch.onnx"):
        # Every input shares the one batch dim on purpose; torch says so in a warning.
        warnings.filterwarnings("ignore", message=".*shares the same shape constraints")
        # torch's own deprecation inside its exporter: nothing the user can act on.
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*treespec")
        program = torch.onnx.export(
            actor,
            inputs,
            input_names=list(OBSERVATION_SHAPES),
            output_names=list(OUTPUTS),
            dynamic_shapes=dynamic,
            opset_version=ONNX_OPSET,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
        assert program is not None
        program.save(str(out))


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """`logger` (and those under it) at ERROR for the block: the ONNX exporter logs a
    warning for every torchvision op it cannot register when torchvision is not installed,
    which the actor never uses."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)
