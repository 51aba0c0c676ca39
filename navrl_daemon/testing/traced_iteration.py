"""One traced iteration of a real learner through the trainer stage: how many calls the
actor loss is from the trainer's loop, and which of the package's files one iteration runs.

The iteration: the producer's part (acquire the rollout buffer's lease, `collect` into it,
send the rollout) and the trainer's (`Trainer.run` receives it, updates on the compute
thread, releases the lease, publishes the weights), up to the weights' arrival. A first
iteration warms up (lazy state, the optimiser's first step); the second is traced.

- `loss_chain`: the functions from `Trainer.run` down to the first call of `actor_loss`,
  outermost first: the trainer's awaited coroutines down to the compute thread's hop,
  then the package's frames on the compute thread (the compute thread's own runner is the
  hop already counted). Each is one call, pass-through hops included.
- `files`: the package's files in which some function ran during the traced iteration, on
  any thread: what a reader opens to follow it. Start-up (config, build) is not in it.

Both trees a benchmark compares must be measurable, the older too: benchmarks/code_shape.py
runs this file as a script (`python -P traced_iteration.py OVERRIDE...`, JSON out) with
another checkout first on PYTHONPATH, so it imports nothing else from `navrl_daemon.testing`
and adapts to the older `TrainerContext` (no `state`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
import torch

import navrl_daemon
from navrl_daemon.config import load_config
from navrl_daemon.pipeline.cadence import Cadence
from navrl_daemon.pipeline.messages import PolicyWeights, Rollout
from navrl_daemon.rl.training import Training
from navrl_daemon.runtime.channels import Channel, Receiver, Sender
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.runtime.leases import LeasePool
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.stages.trainer import Trainer, TrainerContext

PACKAGE = Path(navrl_daemon.__file__).resolve().parent
COMPUTE_HOP = PACKAGE / "runtime" / "compute.py"
# What drives the iteration is no part of what a reader follows.
HARNESS = Path(__file__).resolve().parent
LOSS = "actor_loss"


@dataclass
class TracedIteration:
    loss_chain: list[str]  # "trainer.Trainer.run" first, the actor loss last
    files: list[str]  # relative to the package

    @property
    def loss_calls(self) -> int:
        """Calls from the trainer's loop to the actor loss (the loop itself not counted)."""
        return len(self.loss_chain) - 1


def _ours(path: str) -> bool:
    resolved = Path(path).resolve()
    return resolved.is_relative_to(PACKAGE) and not resolved.is_relative_to(HARNESS)


def _name(frame: FrameType) -> str:
    """`module.qualname`, e.g. `ppo.update`, `trainer.Trainer.run`."""
    return f"{Path(frame.f_code.co_filename).stem}.{frame.f_code.co_qualname}"


def awaited_chain(coro: Any) -> list[str]:
    """The package's functions a suspended coroutine is awaiting, outermost first."""
    chain = []
    while coro is not None and hasattr(coro, "cr_frame"):
        frame = coro.cr_frame
        if frame is not None and _ours(frame.f_code.co_filename):
            chain.append(_name(frame))
        coro = coro.cr_await
    return chain


def thread_chain(frame: FrameType | None) -> list[str]:
    """The package's frames on this thread's stack, outermost first, but the compute
    thread's own runner (the hop the awaited chain ends with)."""
    chain = []
    while frame is not None:
        path = frame.f_code.co_filename
        if _ours(path) and Path(path).resolve() != COMPUTE_HOP:
            chain.append(_name(frame))
        frame = frame.f_back
    return chain[::-1]


class _Tracer:
    """A profile function for every thread: the files of the calls while `recording`, and
    the chain to the first actor loss."""

    def __init__(self) -> None:
        self.recording = False
        self.files: set[str] = set()
        self.loop: Any = None  # the trainer's `run` coroutine
        self.loss_chain: list[str] = []

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        code = frame.f_code
        if self.recording:
            self.files.add(code.co_filename)
        if code.co_name == LOSS and not self.loss_chain and _ours(code.co_filename):
            self.loss_chain = awaited_chain(self.loop) + thread_chain(frame)


def _trainer(training: Training, compute: ComputeThread, rollouts: Any, weights: Any) -> Trainer:
    context: dict[str, Any] = {
        "cadence": Cadence(frames_per_iteration=64, total_frames=0, checkpoint_interval=1),
        "shutdown": Shutdown(),
        "compute": compute,
        "export_path": None,
    }
    if "state" in {f.name for f in dataclasses.fields(TrainerContext)}:
        from navrl_daemon.rl.run_state import training_state

        context["state"] = training_state(training.learner, training.collector, None)
    return Trainer(training.learner, rollouts, [weights], context=TrainerContext(**context))


async def _iterations(
    training: Training,
    trainer: Trainer,
    tracer: _Tracer,
    rollouts: Sender[Rollout],
    published: Receiver[PolicyWeights],
) -> None:
    """Two iterations, the second traced: the producer's part (lease, collect, send) here,
    the trainer's in its own task, up to the published weights."""
    tracer.loop = trainer.run()
    pool = LeasePool([training.buffer])
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: tracer.loop)
        async with rollouts:
            for iteration in range(2):
                tracer.recording = iteration == 1
                lease = await pool.acquire()
                await trainer.compute.run(training.collector.collect, lease.buffer)
                episodes = (torch.zeros(3), torch.zeros(()))
                rollout = Rollout(
                    lease=lease,
                    iteration=iteration,
                    policy_version=iteration,
                    collect_s=0.01,
                    episodes=episodes,
                )
                await rollouts.send(rollout)
                await published.receive()
                tracer.recording = False


def trace_iteration(overrides: Sequence[str]) -> TracedIteration:
    """Build a learner from `overrides` (eager update path), run a warm-up iteration and
    a traced one through a real Trainer."""
    cfg = load_config(None, [*overrides, "ppo.update_path=eager"], environ={})
    training = Training.build(cfg, "cpu")
    tracer = _Tracer()
    rollouts: Channel[Rollout] = Channel("rollouts", 1)
    weights: Channel[PolicyWeights] = Channel("weights", 1)
    # Every thread started from here on (the compute thread's) runs with the tracer.
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    compute = ComputeThread("traced")
    try:
        trainer = _trainer(training, compute, rollouts.receiver(), weights.sender())
        sides = rollouts.sender(), weights.receiver()
        anyio.run(_iterations, training, trainer, tracer, *sides)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        compute.close()
    if training.learner.version != 2 or not tracer.loss_chain:
        raise RuntimeError(f"{training.learner.version} updates, not 2, or no {LOSS} called")
    files = sorted(str(Path(f).resolve().relative_to(PACKAGE)) for f in tracer.files if _ours(f))
    return TracedIteration(loss_chain=tracer.loss_chain, files=files)


def main() -> None:
    torch.set_num_threads(1)
    traced = trace_iteration(sys.argv[1:])
    out = {
        "package": str(PACKAGE),
        "loss_calls": traced.loss_calls,
        "loss_chain": traced.loss_chain,
        "iteration_files": len(traced.files),
        "files": traced.files,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
