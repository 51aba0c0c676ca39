"""The loss stays close to the loop: from the trainer's loop (`Trainer.run`) to the actor
loss is at most MAX_CALLS calls, counted on a real update of a real learner: the trainer's
coroutines down to the compute thread's hop, then the frames on the compute thread down
to `ppo.actor_loss`. Pass-through hops (a class that only stores arguments, a function
that only forwards) each add one."""

from __future__ import annotations

import inspect
import threading
from pathlib import Path
from types import FrameType

import anyio
import pytest
import torch

from navrl_daemon.config import load_config
from navrl_daemon.pipeline.messages import Rollout
from navrl_daemon.rl import ppo
from navrl_daemon.rl.training import Training
from navrl_daemon.runtime.channels import Channel
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.runtime.leases import LeasePool
from tests.conftest import TINY, trainer_for

PACKAGE = str(Path(ppo.__file__).resolve().parents[1])
COMPUTE_HOP = str(Path(PACKAGE, "runtime", "compute.py"))
# The compute thread's hop, the trainer's update (its weights' lock, stream and rollback),
# the learner's (schedules, the update path), ppo.update, its losses, the actor loss.
MAX_CALLS = 6


def ours(path: str) -> bool:
    return str(Path(path).resolve()).startswith(PACKAGE)


def awaited_chain(coro: object) -> list[str]:
    """The functions a suspended coroutine is awaiting, outermost first (ours only)."""
    chain = []
    while coro is not None and hasattr(coro, "cr_frame"):
        frame = coro.cr_frame  # type: ignore[attr-defined]
        if frame is not None and ours(frame.f_code.co_filename):
            chain.append(frame.f_code.co_qualname)
        coro = coro.cr_await  # type: ignore[attr-defined]
    return chain


def thread_chain(frame: FrameType | None) -> list[str]:
    """Our frames on this thread's stack, outermost first; the compute thread's own
    runner is the hop already counted on the trainer's side."""
    chain = []
    while frame is not None:
        path = frame.f_code.co_filename
        if ours(path) and str(Path(path).resolve()) != COMPUTE_HOP:
            chain.append(frame.f_code.co_qualname)
        frame = frame.f_back
    return chain[::-1]


@pytest.mark.usefixtures("one_torch_thread")
def test_the_actor_loss_is_six_calls_from_the_trainer_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = load_config(None, [*TINY, "ppo.update_path=eager"], environ={})
    training = Training.build(cfg, "cpu")
    training.collector.collect(training.buffer)
    compute = ComputeThread("test")
    trainer = trainer_for(training, compute)
    channel: Channel[Rollout] = Channel("rollouts", 1)
    trainer.rollouts = channel.receiver()
    loop: list[object] = []
    seen: list[list[str]] = []
    actor_loss = ppo.actor_loss

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not seen:
            assert threading.current_thread() is not threading.main_thread()
            seen.append(awaited_chain(loop[0]) + thread_chain(inspect.currentframe()))
        return actor_loss(*args, **kwargs)

    monkeypatch.setattr(ppo, "actor_loss", counted)

    async def main() -> None:
        run = trainer.run()
        loop.append(run)
        pool = LeasePool([training.buffer])
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run)
            async with channel.sender() as rollouts:
                lease = await pool.acquire()
                episodes = (torch.zeros(3), torch.zeros(()))
                await rollouts.send(Rollout(lease, 0, 0, 0.01, episodes))

    try:
        anyio.run(main)
    finally:
        compute.close()
    (chain,) = seen
    assert chain[0] == "Trainer.run"
    calls = [*chain[1:], "actor_loss"]  # from the loop down to the actor loss
    assert len(calls) <= MAX_CALLS, " → ".join(calls)
    assert training.learner.version == 1
