"""NavRL's evaluation (navrl-task §4): Beta-mean actions, each env's first episode. No I/O.

`Evaluation` is the evaluation of one env, built once and called with each policy to
evaluate. Where the env's steps are captured (`env.collect_path`, the embedded env on CUDA)
its step (policy, env step, masked reset, first-episode bookkeeping) is captured once as a
CUDA graph and replayed, and on CUDA it runs on a stream of its own: evaluating beside
training then costs the trainer and producer little host time (one replay per step, no
Python per op) and its small kernels fill the GPU beside theirs instead of queueing
behind them on the default stream. `evaluate` is the same, op by op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import Tensor
from torchrl.envs import EnvBase
from torchrl.envs.utils import step_mdp

from navrl_daemon.env.contract import CapturableEnv, RecordableEnv
from navrl_daemon.env.navigation import Z_MAX, Z_MIN
from navrl_daemon.rl.graphs import (
    WARMUP_RUNS,
    Capture,
    Replay,
    SameObjects,
    StepCapture,
    cuda_capture,
)
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.rl.rollout import STAT_KEYS, out_of_bounds

# How an evaluation episode ends, as `Trajectories.outcomes` names it; `outcome_codes`
# writes one character per drone, the first letters of these ("RCOT").
OUTCOMES = ("reached", "collided", "out of bounds", "timed out")


@dataclass(frozen=True)
class Trajectories:
    """Each drone's first episode of an evaluation on the embedded env, on the CPU.

    positions [T+1,N,3] m (row 0: the start; row t: after step t); drone i's episode is
    rows 0..steps[i]. stats [N,len(STAT_KEYS)]: its first-episode stats (as `evaluate`
    averages them). map_id [N]: the map each drone flew on. Of map 0 only (a plot shows one
    map; recording all of NavRL's up to 1024 maps would cost gigabytes): dynamic [T+1,D,3]
    the moving obstacles, dynamic_size [D,3] their (width, width, height), pillars [B,5]
    the boxes (x0, y0, x1, y1, height).
    """

    positions: Tensor
    steps: Tensor
    goal: Tensor
    map_id: Tensor
    stats: Tensor
    dynamic: Tensor
    dynamic_size: Tensor
    pillars: Tensor
    field_size: float
    num_maps: int

    def outcomes(self) -> list[str]:
        """Per drone, one of OUTCOMES: "collided", else "reached" (within the goal radius
        at its end), else "out of bounds" (it ended below or above the height band), else
        "timed out" (truncated, or still flying when the evaluation stopped)."""
        reach = self.stats[:, STAT_KEYS.index("reach_goal")] > 0.5
        collision = self.stats[:, STAT_KEYS.index("collision")] > 0.5
        last_z = self.positions[self.steps.long(), torch.arange(self.steps.shape[0]), 2]
        out = (last_z < Z_MIN) | (last_z > Z_MAX)
        return [
            "collided" if c else "reached" if r else "out of bounds" if o else "timed out"
            for r, c, o in zip(reach.tolist(), collision.tolist(), out.tolist(), strict=True)
        ]

    def codes(self) -> str:
        """`outcomes` one character per drone, as `outcome_codes` writes an evaluation's
        (the first letters of OUTCOMES): the string `analysis/paired.py` compares."""
        return "".join(name[0].upper() for name in self.outcomes())


# Told (steps done, envs whose first episode has finished) every CHECK_EVERY steps.
Progress = Callable[[int, int], None]
CHECK_EVERY = 16  # steps between the host syncs that check whether every env finished


@torch.no_grad()
def evaluate(
    env: EnvBase,
    policy: NavRLPolicy,
    *,
    seed: int,
    max_steps: int,
    progress: Progress | None = None,
) -> dict[str, float]:
    """Mean stats over the envs' first episodes.

    The env is reseeded and fully reset, so the same weights always give the same numbers.
    Stepping stops once every env has finished its first episode (later steps cannot change
    the result). An env still running after `max_steps` reports its stats so far and counts
    in `unfinished`. Captured where the env's steps are (`Evaluation.for_env`); a caller
    that evaluates again and again keeps one `Evaluation` instead (one capture).
    """
    return Evaluation.for_env(env, seed=seed, max_steps=max_steps)(policy, progress)


@torch.no_grad()
def evaluate_outcomes(
    env: EnvBase, policy: NavRLPolicy, *, seed: int, max_steps: int
) -> tuple[dict[str, float], str]:
    """`evaluate`, and each drone's outcome (`Evaluation.outcomes`)."""
    evaluation = Evaluation.for_env(env, seed=seed, max_steps=max_steps)
    return evaluation(policy), evaluation.outcomes()


class Evaluation:
    """`evaluate` of one env for any policy: `Evaluation(env, ...)(policy)`. With
    `capture` (`for_env` picks it) each step after the first evaluation's warm-up is a
    graph replay; on CUDA it runs on a stream of its own. Same numbers either way."""

    def __init__(
        self,
        env: EnvBase,
        *,
        seed: int,
        max_steps: int,
        capture: Capture | None = None,
        fallback: bool = False,
        warmup_runs: int = WARMUP_RUNS,
    ) -> None:
        """`fallback`: a capture that fails is remembered in `capture_error` (and warned
        about) and evaluations go on op by op, instead of raising."""
        self.env = env
        self.seed = seed
        self.max_steps = max_steps
        self.capture = (
            None
            if capture is None
            else StepCapture(
                capture,
                fallback=fallback,
                failure="evaluation step capture failed, evaluating op by op",
                warmup_runs=warmup_runs,
            )
        )
        self.warmup_runs = warmup_runs
        device = env.device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        n = env.batch_size[0]
        self._first = torch.zeros(n, len(STAT_KEYS), device=device)
        self._last = torch.zeros(n, len(STAT_KEYS), device=device)
        self._finished = torch.zeros(n, dtype=torch.bool, device=device)
        self._held: tuple[Any, ...] | None = None
        self._td: TensorDictBase | None = None
        self._step: Callable[[], None] | None = None
        self._replay: Replay | None = None

    @classmethod
    def for_env(cls, env: EnvBase, *, seed: int, max_steps: int) -> Evaluation:
        """Captured where the env's steps are (a `CapturableEnv`'s `collect_path`)."""
        if not isinstance(env, CapturableEnv) or env.collect_path == "eager":
            return cls(env, seed=seed, max_steps=max_steps)
        fallback = env.collect_fallback
        capture = cuda_capture(env.device)
        return cls(env, seed=seed, max_steps=max_steps, capture=capture, fallback=fallback)

    @property
    def capture_error(self) -> str | None:
        """Why the step's capture failed, where `fallback` went on op by op."""
        return None if self.capture is None else self.capture.capture_error

    @property
    def captures(self) -> int:
        return 0 if self.capture is None else self.capture.captures

    @torch.no_grad()
    def __call__(self, policy: NavRLPolicy, progress: Progress | None = None) -> dict[str, float]:
        """The evaluation of `policy`; `progress` is told every CHECK_EVERY steps."""
        with self._own_stream():
            self.env.set_seed(self.seed)
            start = self.env.reset()
            step = self._step_of(policy, start)
            self._first.zero_()
            self._last.zero_()
            self._finished.zero_()
            taken = 0
            capture = self.capture
            if (
                capture is not None
                and capture.capture_error is None
                and self._replay is None
                and self.max_steps > self.warmup_runs
            ):
                self._replay = capture(step, _generators(self.env))
                taken = self.warmup_runs
            run = self._replay if self._replay is not None else step
            while taken < self.max_steps:
                run()
                taken += 1
                if taken % CHECK_EVERY == 0 and _all_finished(self._finished, taken, progress):
                    break
            return _results(self._first, self._last, self._finished)

    def outcomes(self) -> str:
        """The last evaluation's outcome per drone (`outcome_codes`): which drones it
        failed, so two policies flown on the same drones compare drone by drone
        (`analysis/paired.py`)."""
        with self._own_stream():  # the stream the buffers were written on
            return outcome_codes(self._first, self._last, self._finished)

    def _step_of(self, policy: NavRLPolicy, start: TensorDictBase) -> Callable[[], None]:
        """The evaluation step on fixed tensors (made again for another policy or env
        state storage, which drops the captured graph); `start` copied into its td."""
        held = _graph_key(self.env, policy)
        if held != self._held:
            self._replay = None
            self._held = held
            self._td = policy.act(start.clone(), deterministic=True)  # the td's layout
            self._step = _evaluation_step(
                self.env, policy, self._td, self._first, self._last, self._finished
            )
        assert self._td is not None and self._step is not None
        self._td.update_(start)
        return self._step

    @contextlib.contextmanager
    def _own_stream(self) -> Iterator[None]:
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.env.device))  # the weights
        with torch.cuda.stream(self.stream):
            yield


def _evaluation_step(
    env: EnvBase,
    policy: NavRLPolicy,
    td: TensorDictBase,
    first: Tensor,
    last: Tensor,
    finished: Tensor,
) -> Callable[[], None]:
    """One step of every env, and each env's first-episode stats kept, all in place."""

    def step() -> None:
        record, following = env.step_and_maybe_reset(policy.act(td.copy(), deterministic=True))
        last.copy_(torch.cat([record["next", "stats", k] for k in STAT_KEYS], dim=-1))
        newly = record["next", "done"].squeeze(-1) & ~finished
        torch.where(newly[:, None], last, first, out=first)
        finished.logical_or_(newly)
        td.update_(following)

    return step


def _all_finished(finished: Tensor, steps: int, progress: Progress | None) -> bool:
    """Whether every env finished its first episode (a host read); `progress` is told."""
    done = int(finished.sum())
    if progress is not None:
        progress(steps, done)
    return done == finished.shape[0]


def _results(first: Tensor, last: Tensor, finished: Tensor) -> dict[str, float]:
    """Means of the first episodes' stats; envs still running count with their last.

    `out_of_bounds`: the share of episodes that ended neither by a collision nor by the time
    limit, i.e. by flying below or above the height band (navrl-task §1.9), which NavRL's
    stats count nowhere."""
    stats = torch.where(finished[:, None], first, last)
    means = stats.mean(dim=0).tolist()
    left = finished & out_of_bounds(stats)
    return {
        "episodes": first.shape[0],
        **dict(zip(STAT_KEYS, means, strict=True)),
        "out_of_bounds": float(left.float().mean()),
        "unfinished": int((~finished).sum()),
    }


def outcome_codes(first: Tensor, last: Tensor, finished: Tensor) -> str:
    """One character per env for its first episode, as `_results` counts it: "C" collided,
    else "R" reached its goal, else "O" left the height band, else "T" timed out (or was
    still flying when the evaluation stopped); `Trajectories.outcomes`' order."""
    stats = torch.where(finished[:, None], first, last)
    collided = stats[:, STAT_KEYS.index("collision")] > 0.5
    reached = stats[:, STAT_KEYS.index("reach_goal")] > 0.5
    left = finished & out_of_bounds(stats)
    codes = torch.where(
        collided,
        ord("C"),
        torch.where(reached, ord("R"), torch.where(left, ord("O"), ord("T"))),
    )
    return bytes(codes.to(torch.uint8).tolist()).decode("ascii")


def _graph_key(env: EnvBase, policy: NavRLPolicy) -> tuple[Any, ...]:
    """What a captured evaluation step holds: the env, its LiDAR, the policy, and the
    storage of every tensor it reads or writes in place."""
    weights = tuple(t.data_ptr() for t in (*policy.parameters(), *policy.buffers()))
    if not isinstance(env, CapturableEnv):
        return (SameObjects(env, policy), (), weights)
    tensors = tuple(t.data_ptr() for t in env.state_tensors().values())
    return (SameObjects(env, *env.graph_objects(), policy), tensors, weights)


def _generators(env: EnvBase) -> list[torch.Generator]:
    return [env.generator] if isinstance(env, CapturableEnv) else []


@torch.no_grad()
def evaluate_recorded(
    env: RecordableEnv,
    policy: NavRLPolicy,
    *,
    seed: int,
    max_steps: int,
    progress: Progress | None = None,
) -> tuple[dict[str, float], Trajectories]:
    """`evaluate`, plus every drone's path and the obstacles (a `RecordableEnv`): the
    same numbers as `evaluate`, at the cost of a copy of the positions per step."""
    assert isinstance(env, EnvBase)
    recorder = _Recorder(env)
    results = _evaluate(
        env, policy, seed=seed, max_steps=max_steps, recorder=recorder, progress=progress
    )
    return results, recorder.trajectories()


@torch.no_grad()
def evaluate_op_by_op(
    env: EnvBase,
    policy: NavRLPolicy,
    *,
    seed: int,
    max_steps: int,
    progress: Progress | None = None,
) -> dict[str, float]:
    """`evaluate` never captured: for objects that act like a policy but read values on the
    host in their `act` (the probes' wrappers), which a captured step cannot hold."""
    return _evaluate(env, policy, seed=seed, max_steps=max_steps, recorder=None, progress=progress)


def _evaluate(
    env: EnvBase,
    policy: NavRLPolicy,
    *,
    seed: int,
    max_steps: int,
    recorder: _Recorder | None,
    progress: Progress | None,
) -> dict[str, float]:
    """`evaluate`'s loop op by op; with a recorder, the step is split in two so the
    positions are read before the reset."""
    env.set_seed(seed)
    td = env.reset()
    n = env.batch_size[0]
    first = torch.zeros(n, len(STAT_KEYS), device=env.device)
    last = torch.zeros_like(first)
    finished = torch.zeros(n, dtype=torch.bool, device=env.device)
    if recorder is not None:
        recorder.start()
    for step in range(max_steps):
        td = policy.act(td, deterministic=True)
        if recorder is None:
            record, td = env.step_and_maybe_reset(td)
        else:
            record = env.step(td)
            recorder.step(finished)
            td = env.maybe_reset(step_mdp(record))
        last = torch.cat([record["next", "stats", k] for k in STAT_KEYS], dim=-1)
        newly = record["next", "done"].squeeze(-1) & ~finished
        first = torch.where(newly[:, None], last, first)
        finished |= newly
        if step % CHECK_EVERY == CHECK_EVERY - 1 and _all_finished(finished, step + 1, progress):
            break
    if recorder is not None:
        recorder.stats = torch.where(finished[:, None], first, last)
    return _results(first, last, finished)


def eval_rank(record: dict[str, Any]) -> tuple[float, float, float, float]:
    """How evaluation results compare (higher is better): the later curriculum stage (a
    harder task), then reach_goal, then fewer collisions, then the later iteration. The
    one rule for `export/best.pt`, `checkpoints list` and the report's best evaluation."""

    def number(key: str) -> float:
        v = record.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0

    return (
        number("curriculum_stage"),
        number("reach_goal"),
        -number("collision"),
        number("iteration"),
    )


class _Recorder:
    """Reads where the env's drones and obstacles are between step and reset."""

    def __init__(self, env: RecordableEnv) -> None:
        self.env = env
        now = env.whereabouts()
        self.positions: list[Tensor] = []
        self.dynamic: list[Tensor] = []
        self.steps = torch.zeros(now.drones.shape[0], dtype=torch.long, device=now.drones.device)
        self.goal = now.goals
        self.stats: Tensor | None = None

    def start(self) -> None:
        now = self.env.whereabouts()
        self.positions = [now.drones.clone()]
        self.goal = now.goals.clone()  # the first episodes' (a reset draws new ones)
        self.dynamic = [now.moving.clone()]

    def step(self, finished: Tensor) -> None:
        """After a step; `finished`: drones whose first episode ended before this step."""
        now = self.env.whereabouts()
        self.positions.append(now.drones.clone())
        self.dynamic.append(now.moving.clone())
        self.steps += (~finished).long()

    def trajectories(self) -> Trajectories:
        scene = self.env.scene()
        assert self.stats is not None, "trajectories() before the evaluation ran"
        return Trajectories(
            positions=torch.stack(self.positions).cpu(),
            steps=self.steps.cpu(),
            goal=self.goal.cpu(),
            map_id=scene.map_id.cpu(),
            stats=self.stats.cpu(),
            dynamic=torch.stack(self.dynamic).cpu(),
            dynamic_size=scene.moving_size.cpu(),
            pillars=scene.pillars,
            field_size=scene.field_size,
            num_maps=scene.num_maps,
        )
