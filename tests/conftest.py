"""Shared test fixtures: the real CLI (in-process, or as a process of its own), and the NavRL
reference files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
import torch

from tests.small_disk import read_only, small_disk  # noqa: F401 (fixtures for every test)

REPO = Path(__file__).resolve().parents[1]
# NavRL's published policy (docs/navrl-task.md §6), shipped with the tests.
DATA = REPO / "tests" / "data"
NAVRL_CHECKPOINT = DATA / "navrl_checkpoint.pt"

# A tiny config every subprocess test can afford on 2 cores.
TINY = [
    "run.device=cpu",
    "env.num_envs=8",
    "env.field_size=10.0",
    "env.num_obstacles=4",
    "env.num_dynamic_obstacles=8",
    "env.max_episode_length=50",
    "env.spawn=local",
    "ppo.rollout_length=8",
    "ppo.minibatches=4",
    "ppo.epochs=1",
    "eval.num_envs=4",
    "eval.layout=train",
    "log.summary_interval=1",
    "metrics.port=0",
]


# One intra-op thread in every daemon a test starts: results are only bitwise repeatable
# between runs with the same thread count.
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def navrl_cli(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
    process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run `navrl-daemon ARGS` as a user would, capturing output and exit code.

    In this process by default: `cli.main` from argument parsing to exit code, the same
    path a subprocess takes after its imports, which cost ~5 s of CPU per start. With
    `process=True`, an `env` or a `cwd`, or where the promise is about a process (signals,
    a crash's exit status), a process of its own (tests/forked.py)."""
    if process or env is not None or cwd is not None:
        from tests import forked

        return forked.run(list(args), timeout=timeout, env=env, cwd=cwd)
    return _cli_in_process(list(args))


def _cli_in_process(args: list[str]) -> subprocess.CompletedProcess[str]:
    """`cli.main(args)` with stdout and stderr captured, one intra-op torch thread (as
    SUBPROCESS_ENV gives a subprocess), and what the call sets process-wide put back: the
    signal handlers, structlog, threading's excepthook, torch's thread count and RNG."""
    import io
    import threading
    import traceback

    from navrl_daemon.cli import main

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2)
    handlers = {sig: signal.getsignal(sig) for sig in handled}
    saved = (sys.stdout, sys.stderr, threading.excepthook, structlog.get_config())
    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    out, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = out, err
    torch.set_num_threads(1)
    try:
        code = main(args)
    except SystemExit as e:  # argparse's usage errors, a command's own exit
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            err.write(e.code + "\n")
    except Exception:  # what the interpreter prints for an uncaught exception, and exit 1
        err.write(traceback.format_exc())
        code = 1
    finally:
        sys.stdout, sys.stderr, threading.excepthook, config = saved
        structlog.configure(**config)
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess(
        ["navrl-daemon", *args], code, out.getvalue(), err.getvalue()
    )


@pytest.fixture(autouse=True)
def _restore_logging_setup() -> Iterator[None]:
    """Tests that call `cli.main` in-process reconfigure structlog; undo it after each."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture(autouse=True)
def _restore_signal_handlers() -> Iterator[None]:
    """`cli.main` handles the stop signals and leaves them ignored when it returns (the
    process is exiting); in-process callers get the test runner's handlers back."""
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    saved = {sig: signal.getsignal(sig) for sig in stop_signals}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


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
