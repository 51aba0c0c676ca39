"""The conformance suite: steps a backend's envs through the contract of `contract.py`.

Small probes, cheap enough to run at every start-up of `run`: envs of `PROBE_ENVS` drones
with `max_episode_length` cut to `PROBE_EPISODE` steps, so every probe ends an episode and
starts the next within a few dozen steps. Each check is reported by name:

  build        the factory returns a TorchRL EnvBase
  batch        batch size [num_envs]          device       the requested device
  keys         required keys declared and emitted (contract.REQUIRED)
  shapes       their per-env shapes           dtypes       their dtypes
  step         reset and step run; observations and reward are finite
  stats        episode_len counts the steps since reset; flags are 0 or 1
  done         done = terminated | truncated; every env is done by max_episode_length
  auto_reset   a done env restarts (episode_len 1 next step); the others do not
  eval_layout  layout "navrl" builds, with the keys, shapes and dtypes above
  determinism  a second env with the same seed gives the same outputs for the same actions
  state        optional state_dict_env / load_state_dict_env replay exactly

`measure_throughput` is separate: it times steps at the config's own num_envs.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from tensordict import TensorDictBase
from torch import Tensor
from torchrl.envs import EnvBase

from navrl_daemon.config import EnvConfig
from navrl_daemon.env.contract import (
    ACTION_KEY,
    OBS,
    OUTPUT_KEYS,
    REWARD_KEY,
    STAT_FLAGS,
    STEP_KEYS,
    Determinism,
    EnvFactory,
    Failure,
    Layout,
    ResumableEnv,
    check_output,
    check_specs,
)
from navrl_daemon.errors import ConfigError

CHECKS = (
    "build",
    "batch",
    "device",
    "keys",
    "shapes",
    "dtypes",
    "step",
    "stats",
    "done",
    "auto_reset",
    "eval_layout",
    "determinism",
    "state",
)
PROBE_ENVS = 4
PROBE_EVAL_ENVS = 3  # differs from PROBE_ENVS so a backend that ignores num_envs shows
PROBE_EPISODE = 8
STATE_REPLAY_STEPS = 4
# Determinism is compared to this tolerance: a different seed or spawn is far outside it,
# while CUDA kernels may reorder float sums between two envs.
TOLERANCE = 1e-5

Status = Literal["pass", "fail", "skip"]


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str = ""


@dataclass
class Report:
    backend: str
    device: str
    results: list[CheckResult]
    # Filled by `measure_throughput` (env check), not by the start-up suite.
    throughput: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.status != "fail" for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "fail"]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


class _Skip(Exception):
    """The outputs break the contract: stepping on would only repeat it; skip the rest."""


def run_conformance(
    factory: EnvFactory,
    cfg: EnvConfig,
    *,
    backend: str,
    device: torch.device | str,
    seed: int,
) -> Report:
    """Run every check of the module docstring on probes built by `factory`.

    A `ConfigError` from the factory (bad `env.options`, a missing install) propagates:
    it is a configuration problem, not a contract result.
    """
    suite = _Suite(factory, cfg, device=torch.device(device), seed=seed)
    suite.run()
    return Report(backend, str(device), suite.results())


def measure_throughput(
    factory: EnvFactory, cfg: EnvConfig, *, device: torch.device | str, seed: int, steps: int
) -> dict[str, float]:
    """Batched env steps per second (and frames per second) at cfg.num_envs."""
    env = factory(cfg, device=device, seed=seed, num_envs=cfg.num_envs, layout="train")
    actions = _actions(cfg, steps + 3, cfg.num_envs, seed, env.device)
    env.set_seed(seed)
    td = env.reset()
    for t in range(3):  # warm-up: lazy allocations, first kernels
        td.set(ACTION_KEY, actions[t])
        _, td = env.step_and_maybe_reset(td)
    _sync(env.device)
    t0 = time.perf_counter()
    for t in range(3, steps + 3):
        td.set(ACTION_KEY, actions[t])
        _, td = env.step_and_maybe_reset(td)
    _sync(env.device)
    seconds = time.perf_counter() - t0
    return {
        "num_envs": cfg.num_envs,
        "steps": steps,
        "seconds": round(seconds, 4),
        "steps_per_second": round(steps / seconds, 2),
        "frames_per_second": round(steps * cfg.num_envs / seconds, 1),
    }


class _Suite:
    def __init__(
        self, factory: EnvFactory, cfg: EnvConfig, *, device: torch.device, seed: int
    ) -> None:
        self.factory = factory
        self.cfg = cfg.model_copy(
            update={"max_episode_length": min(cfg.max_episode_length, PROBE_EPISODE)}
        )
        self.device = device
        self.seed = seed
        self.failures: list[Failure] = []
        self.skipped: dict[str, str] = {}
        # Envs reported for running past max_episode_length: not followed any further.
        self._overdue = torch.zeros(PROBE_ENVS, dtype=torch.bool)

    def results(self) -> list[CheckResult]:
        out = []
        for name in CHECKS:
            details = [f.detail for f in self.failures if f.check == name]
            if details:
                more = f" (+{len(details) - 3} more)" if len(details) > 3 else ""
                out.append(CheckResult(name, "fail", "; ".join(details[:3]) + more))
            elif name in self.skipped:
                out.append(CheckResult(name, "skip", self.skipped[name]))
            else:
                out.append(CheckResult(name, "pass"))
        return out

    def fail(self, check: str, detail: str) -> None:
        self.failures.append(Failure(check, detail))

    def skip(self, checks: tuple[str, ...], why: str) -> None:
        for name in checks:
            if not any(f.check == name for f in self.failures):
                self.skipped.setdefault(name, why)

    # ------------------------------------------------------------------------------ groups

    def run(self) -> None:
        env = self._build(PROBE_ENVS, "train")
        if env is None:
            self.skip(CHECKS[1:], "the env did not build")
            return
        self.failures += check_specs(env, num_envs=PROBE_ENVS, device=self.device)
        behaviour = ("step", "stats", "done", "auto_reset", "determinism", "state")
        try:
            trajectory, td = self._rollout(env)
        except _Skip as why:
            self.skip(behaviour, str(why))
        except Exception as e:  # a backend bug: report it by name, do not crash the check
            self.fail("step", f"stepping raised {type(e).__name__}: {e}")
            self.skip(behaviour, "stepping failed")
        else:
            self._determinism(env, trajectory)
            self._state(env, td)
        self._eval_layout()

    def _build(self, num_envs: int, layout: Layout, check: str = "build") -> EnvBase | None:
        try:
            env = self.factory(
                self.cfg, device=self.device, seed=self.seed, num_envs=num_envs, layout=layout
            )
        except ConfigError:
            raise
        except Exception as e:
            self.fail(check, f"factory raised {type(e).__name__}: {e}")
            return None
        if not isinstance(env, EnvBase):
            self.fail(check, f"factory returned {type(env).__name__}, not a TorchRL EnvBase")
            return None
        return env

    def _rollout(self, env: EnvBase) -> tuple[list[TensorDictBase], TensorDictBase]:
        """2·max_episode_length + 2 steps with auto-reset, checking stats/done/auto_reset."""
        n, limit = PROBE_ENVS, self.cfg.max_episode_length
        steps = 2 * limit + 2
        actions = _actions(self.cfg, steps, n, self.seed, env.device)
        env.set_seed(self.seed)
        td = env.reset()
        problems = check_output(td, OUTPUT_KEYS, num_envs=n, where="reset")
        self.failures += problems
        if problems:
            raise _Skip("the reset output breaks the contract (keys, shapes, dtypes)")
        trajectory = [_outputs(td, OUTPUT_KEYS)]
        length = td["stats", "episode_len"].reshape(n)
        if (length != 0).any():
            self.fail("stats", f"reset output episode_len {length.tolist()}, need 0")
        since_reset = torch.zeros(n, dtype=torch.long)
        was_done = torch.zeros(n, dtype=torch.bool)
        for t in range(steps):
            td.set(ACTION_KEY, actions[t])
            record, td = env.step_and_maybe_reset(td)
            nxt = record["next"]
            if t == 0:
                problems = check_output(nxt, STEP_KEYS, num_envs=n, where="step")
                self.failures += problems
                if problems:
                    raise _Skip("the step output breaks the contract (keys, shapes, dtypes)")
            trajectory.append(_outputs(nxt, STEP_KEYS))
            since_reset = torch.where(was_done, 1, since_reset + 1)
            was_done = self._check_step(t, nxt, since_reset, limit)
        return trajectory, td

    def _check_step(self, t: int, nxt: TensorDictBase, since_reset: Tensor, limit: int) -> Tensor:
        n = PROBE_ENVS
        for key in (*(k.key for k in OUTPUT_KEYS if k.key[:2] == OBS), REWARD_KEY):
            if not torch.isfinite(nxt[key]).all():
                self.fail("step", f"step {t}: non-finite values in {'.'.join(key)}")
        done, terminated, truncated = (nxt[k].reshape(n).cpu() for k in _DONE)
        if not torch.equal(done, terminated | truncated):
            self.fail("done", f"step {t}: done {done.tolist()} != terminated | truncated")
        over = (since_reset >= limit) & ~done & ~self._overdue
        if over.any():
            envs = over.nonzero().flatten().tolist()
            self.fail(
                "done",
                f"envs {envs} ran {limit} steps without done (env.max_episode_length = {limit})",
            )
            self._overdue |= over
        length = nxt["stats", "episode_len"].reshape(n).cpu()
        wrong = (length != since_reset.to(length.dtype)) & ~self._overdue
        restarted = since_reset == 1
        for i in wrong.nonzero().flatten().tolist():
            got, want = length[i].item(), since_reset[i].item()
            if restarted[i]:
                self.fail(
                    "auto_reset", f"step {t}: env {i} was done, then episode_len {got}, need 1"
                )
            elif got == 1:
                self.fail("auto_reset", f"step {t}: env {i} restarted although it was not done")
            else:
                self.fail("stats", f"step {t}: env {i} episode_len {got}, need {want}")
        for flag in STAT_FLAGS:
            value = nxt["stats", flag]
            if not ((value == 0) | (value == 1)).all():
                self.fail("stats", f"step {t}: stats.{flag} not 0 or 1")
        return done

    def _determinism(self, env: EnvBase, trajectory: list[TensorDictBase]) -> None:
        if isinstance(env, Determinism) and env.deterministic is False:
            self.skip(("determinism",), "the backend declares deterministic = False")
            return
        twin = self._build(PROBE_ENVS, "train", check="determinism")
        if twin is None:
            return
        n = PROBE_ENVS
        actions = _actions(self.cfg, len(trajectory) - 1, n, self.seed, twin.device)
        try:
            twin.set_seed(self.seed)
            td = twin.reset()
            replay = [_outputs(td, OUTPUT_KEYS)]
            for t in range(len(trajectory) - 1):
                td.set(ACTION_KEY, actions[t])
                record, td = twin.step_and_maybe_reset(td)
                replay.append(_outputs(record["next"], STEP_KEYS))
        except Exception as e:
            self.fail("determinism", f"the second env raised {type(e).__name__}: {e}")
            return
        where = _first_difference(trajectory, replay)
        if where is not None:
            self.fail(
                "determinism",
                f"two envs with seed {self.seed} and the same actions differ at {where}",
            )

    def _state(self, env: EnvBase, td: TensorDictBase) -> None:
        if not isinstance(env, ResumableEnv):
            self.skip(
                ("state",),
                "no state_dict_env/load_state_dict_env: a resumed run restarts its episodes",
            )
            return
        try:
            state = env.state_dict_env()
            bad = [k for k, v in state.items() if not isinstance(v, Tensor)]
            if bad:
                self.fail("state", f"state_dict_env values must be tensors; not: {bad[:5]}")
                return
            actions = _actions(self.cfg, STATE_REPLAY_STEPS, PROBE_ENVS, self.seed + 1, env.device)
            first = _replay(env, td.clone(), actions)
            env.load_state_dict_env(state)
            second = _replay(env, td.clone(), actions)
        except Exception as e:
            self.fail("state", f"save/restore raised {type(e).__name__}: {e}")
            return
        where = _first_difference(first, second)
        if where is not None:
            self.fail("state", f"replay after load_state_dict_env differs at {where}")

    def _eval_layout(self) -> None:
        n = PROBE_EVAL_ENVS
        if any(f.check in ("batch", "device", "keys", "shapes", "dtypes") for f in self.failures):
            self.skip(("eval_layout",), "the train layout already breaks the specs")
            return
        env = self._build(n, "navrl", check="eval_layout")
        if env is None:
            return
        problems = check_specs(env, num_envs=n, device=self.device)
        try:
            env.set_seed(self.seed)
            td = env.reset()
            problems += check_output(td, OUTPUT_KEYS, num_envs=n, where="reset")
            td.set(ACTION_KEY, _actions(self.cfg, 1, n, self.seed, env.device)[0])
            record, _ = env.step_and_maybe_reset(td)
            problems += check_output(record["next"], STEP_KEYS, num_envs=n, where="step")
        except Exception as e:
            problems.append(Failure("step", f"stepping raised {type(e).__name__}: {e}"))
        for p in problems:
            self.fail("eval_layout", f"layout navrl: {p}")


_DONE = ("done", "terminated", "truncated")


def _actions(cfg: EnvConfig, steps: int, n: int, seed: int, device: torch.device) -> Tensor:
    """World-frame velocity commands [steps, n, 1, 3] within ±action_limit/2, from `seed`."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.rand(steps, n, 1, 3, generator=g) * 2 - 1) * (cfg.action_limit / 2)
    return a.to(device)


def _outputs(td: TensorDictBase, keys: tuple[Any, ...]) -> TensorDictBase:
    return td.select(*(k.key for k in keys)).clone()


def _replay(env: EnvBase, td: TensorDictBase, actions: Tensor) -> list[TensorDictBase]:
    out = []
    for a in actions:
        td.set(ACTION_KEY, a)
        record, td = env.step_and_maybe_reset(td)
        out.append(_outputs(record["next"], STEP_KEYS))
    return out


def _first_difference(a: list[TensorDictBase], b: list[TensorDictBase]) -> str | None:
    """'step t, key' of the first output that differs beyond TOLERANCE (step 0 = reset)."""
    for t, (x, y) in enumerate(zip(a, b, strict=True)):
        for key, value in x.items(include_nested=True, leaves_only=True):
            other = y.get(key)
            if value.dtype == torch.bool:
                same = torch.equal(value, other)
            else:
                same = torch.allclose(value, other, rtol=TOLERANCE, atol=TOLERANCE)
            if not same:
                name = key if isinstance(key, str) else ".".join(key)
                return f"step {t}, {name}"
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
