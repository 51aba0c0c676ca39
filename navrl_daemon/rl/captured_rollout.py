"""Rollouts whose steps are replays of one captured step (a CUDA graph). No I/O.

rollout.collect launches a few thousand small kernels per env step from Python; on a GPU
the step is then bound by the launches, not by the GPU (9.6 ms per step at
NavRL's scale, the GPU busy 12 % of it). `CapturedRollout` runs the same loop body as one
graph replay per step. The captured step is exactly collect's loop body:

1. the policy acts on the running td (actions drawn from the collector's generator);
2. the env steps and auto-resets with its masked reset (no host read);
3. the step's record is written into slot `slot` of a staging buffer, `slot` being a
   device counter the step advances, and the td to go on from is copied into the running td.

Everything it reads and writes stays at fixed addresses: the env's state
(`CapturableEnv.state_tensors` of env/contract.py, updated in place), the policy's
weights (loaded in place), the running td, the staging buffer and the slot. Random draws
come from the env's generator and the actions' one, registered with the graph, so a replay
draws what the eager step would have drawn: on the CPU, through `graphs.traced_capture`, a
captured rollout is the eager one bit for bit (tests/rl/test_captured_rollout.py).

The first `warmup_runs` steps of the first rollout run eagerly on the capture's stream, the
next ones are replays; each rollout ends with one copy of the staging buffer into the
caller's buffer. A new capture is made when anything the graph holds changes: another env
object (a curriculum stage), its LiDAR boxes (`set_pillars`), the policy, the buffer's
layout, the generator, or a state tensor's storage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

from navrl_daemon.env.contract import CapturableEnv
from navrl_daemon.rl.graphs import (
    WARMUP_RUNS,
    Capture,
    Replay,
    SameObjects,
    StepCapture,
    cuda_capture,
)
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.rl.rollout import Rollout, collect


class CapturedRollout:
    """`rollout.collect`'s signature and results, each step after the warm-up a replay.

    `capture` makes the replays (`graphs.cuda_capture(device)` on a GPU); with `fallback`,
    a capture that fails is remembered in `capture_error` and the rollouts go on eagerly
    (what `env.collect_path = "auto"` asks for), else it raises. The env must reset with
    masks (`CapturableEnv.masked_reset`, which `env.collect_path` turns on).
    """

    def __init__(
        self, capture: Capture, *, warmup_runs: int = WARMUP_RUNS, fallback: bool = False
    ) -> None:
        self.capture = StepCapture(
            capture,
            fallback=fallback,
            failure="rollout step capture failed, collecting op by op",
            warmup_runs=warmup_runs,
        )
        self._replay: Replay | None = None
        self._key: tuple[Any, ...] | None = None
        self._step: Callable[[], None] | None = None
        self._td: TensorDictBase | None = None
        self._staging: TensorDictBase | None = None
        self._slot: torch.Tensor | None = None

    @property
    def capture_error(self) -> str | None:
        """Why the step's capture failed, where `fallback` went on eagerly."""
        return self.capture.capture_error

    @property
    def captures(self) -> int:
        return self.capture.captures

    @torch.no_grad()
    def __call__(
        self,
        env: EnvBase,
        policy: NavRLPolicy,
        td: TensorDictBase,
        buffer: TensorDictBase,
        generator: torch.Generator | None = None,
    ) -> TensorDictBase:
        if self.capture.capture_error is not None:
            return collect(env, policy, td, buffer, generator)
        key = _graph_key(env, policy, buffer, generator)
        if key != self._key:
            self._prepare(env, policy, buffer, generator)
            self._key = key
        assert self._td is not None and self._staging is not None and self._slot is not None
        if td is not self._td:  # a td from a reset, a resume or a new env
            self._td.update_(td)
        self._slot.zero_()
        steps = buffer.batch_size[1]
        done = 0
        if self._replay is None and steps > self.capture.warmup_runs:
            assert self._step is not None
            self._replay = self.capture(self._step, _generators(env, generator))
            done = self.capture.warmup_runs
        for _ in range(done, steps):
            if self._replay is not None:
                self._replay()
            else:
                assert self._step is not None
                self._step()
        buffer.update_(self._staging)
        return self._td

    def _prepare(
        self,
        env: EnvBase,
        policy: NavRLPolicy,
        buffer: TensorDictBase,
        generator: torch.Generator | None,
    ) -> None:
        """Fixed tensors for a new capture: the running td (the layout of a record's root,
        which is the td the policy acted on), the staging buffer and the slot counter."""
        self._replay = None
        running = buffer[:, 0].exclude("next").clone()
        staging = buffer.clone()
        slot = torch.zeros(1, dtype=torch.long, device=buffer.device)
        leaves = [(k, staging.get(k)) for k in buffer.keys(include_nested=True, leaves_only=True)]

        def step() -> None:
            acting = policy.act(running.copy(), False, generator)
            record, following = env.step_and_maybe_reset(acting)
            for key, rows in leaves:
                rows.index_copy_(1, slot, record.get(key).unsqueeze(1))
            running.update_(following)
            slot.add_(1)

        self._td, self._staging, self._slot, self._step = running, staging, slot, step


def _generators(env: EnvBase, generator: torch.Generator | None) -> list[torch.Generator]:
    """The generators a captured step draws from: the env's own and the actions' one."""
    own = env.generator if isinstance(env, CapturableEnv) else None
    return [g for g in (own, generator) if g is not None]


def _graph_key(
    env: EnvBase, policy: NavRLPolicy, buffer: TensorDictBase, generator: torch.Generator | None
) -> tuple[Any, ...]:
    """What a captured step holds besides its own tensors: the objects it calls, and the
    storage of every tensor it reads or writes in place."""
    if not isinstance(env, CapturableEnv):
        raise TypeError(f"{type(env).__name__} is no CapturableEnv: no capture of its step")
    layout = tuple(
        (k, tuple(v.shape), v.dtype) for k, v in buffer.items(include_nested=True, leaves_only=True)
    )
    weights = tuple(t.data_ptr() for t in (*policy.parameters(), *policy.buffers()))
    tensors = tuple(t.data_ptr() for t in env.state_tensors().values())
    # The objects themselves, compared by identity: held here, none can be freed for
    # another to take its id.
    held = SameObjects(env, *env.graph_objects(), policy, generator)
    return (held, layout, weights, tensors)


def rollout_for(env: EnvBase) -> Rollout:
    """How `env`'s rollouts fill a buffer: a CapturedRollout where its steps are captured
    (a `CapturableEnv`'s `collect_path`, resolved for its device as the execution plan
    resolves it; `Evaluation.for_env` reads the same), else `rollout.collect`."""
    if isinstance(env, CapturableEnv) and env.collect_path == "cuda_graph":
        return CapturedRollout(cuda_capture(env.device), fallback=env.collect_fallback)
    return collect
