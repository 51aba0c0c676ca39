"""Shared test fixtures: the real CLI (in-process, or as a process of its own), and the NavRL
reference files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# The constants, the CLI runner and the fixtures every test uses, shared with benchmarks/.
from navrl_daemon.testing import SUBPROCESS_ENV, TINY  # noqa: F401
from navrl_daemon.testing.command_line import navrl_cli  # noqa: F401
from navrl_daemon.testing.fixtures import (  # noqa: F401 (autouse, for every test)
    _restore_logging_setup,
    _restore_signal_handlers,
)
from tests.small_disk import read_only, small_disk  # noqa: F401 (fixtures for every test)

REPO = Path(__file__).resolve().parents[1]
# NavRL's published policy (docs/navrl-task.md §6), shipped with the tests.
DATA = REPO / "tests" / "data"
NAVRL_CHECKPOINT = DATA / "navrl_checkpoint.pt"


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread, as the daemon's tests use: on a busy 2-core machine two
    OpenMP threads make small in-process steps up to 50x slower (measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def navrl_checkpoint() -> Path:
    assert NAVRL_CHECKPOINT.is_file(), f"{NAVRL_CHECKPOINT} is part of the repository"
    return NAVRL_CHECKPOINT


def trainer_for(
    training, compute, checkpoints=None, export_path=None, rollback=None, state=None, **extra
):  # type: ignore[no-untyped-def]
    """A Trainer stage around a `Training`'s learner, driven by calling its methods
    (`state`: the run's parts, the training's by default; `extra`: more TrainerContext
    fields, e.g. its CUDA stream)."""
    from navrl_daemon.pipeline.cadence import Cadence
    from navrl_daemon.rl.run_state import training_state
    from navrl_daemon.runtime.channels import Channel
    from navrl_daemon.runtime.supervisor import Shutdown
    from navrl_daemon.stages.trainer import Trainer, TrainerContext

    return Trainer(
        training.learner,
        Channel("rollouts", 1).receiver(),
        [],
        context=TrainerContext(
            cadence=Cadence(frames_per_iteration=64, total_frames=0, checkpoint_interval=1),
            shutdown=Shutdown(),
            compute=compute,
            state=state or training_state(training.learner, training.collector, None),
            export_path=export_path,
            rollback=rollback,
            **extra,
        ),
        checkpoints=checkpoints,
    )
