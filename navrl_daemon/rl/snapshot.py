"""The full state of a training run as nested dicts of tensors and plain values, and back.

What `torch.load(weights_only=True)` can read, and nothing more: no modules, no
TensorDicts, no numpy objects. Two halves, because two stages own them:

- the learner's: policy (with its ValueNorm), every optimiser, the minibatch RNG, the
  policy version and the non-finite streak;
- the collector's: the env's `state_dict_env`, the running TensorDict the next rollout
  starts from, the episode-stat sums, the generator actions are drawn from (`sampler`),
  and the process RNGs (torch, CUDA, numpy, python).

For the run to continue bit for bit, the collector half must be captured right after the
rollout that the learner half was last trained on (see stages/producer.py).
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from navrl_daemon.env.contract import ResumableEnv
from navrl_daemon.host_copy import host_copy
from navrl_daemon.rl.collector import Collector
from navrl_daemon.rl.learner import Learner
from navrl_daemon.rl.policy import has_own_critic
from navrl_daemon.rl.ppo import CRITIC_EXTRACTOR_OPT, learning_rates

SNAPSHOT_VERSION = 1


def learner_state(learner: Learner) -> dict[str, Any]:
    """References, not copies: stage them (storage/staging.py) before the next update."""
    return {
        "policy": learner.policy.state_dict(),
        "optimizers": {k: opt.state_dict() for k, opt in learner.optimizers.items()},
        "generator": learner.generator.get_state(),
        "version": learner.version,
        "nonfinite_streak": learner.nonfinite_streak,
    }


def saved_optimizer(learner_state: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The file's state of optimiser `name`. None for the critic's own extractor in a file
    from a run without one (ppo.separate_critic turned on at a resume: the extractor
    starts as a copy of the shared one, its optimiser afresh). KeyError otherwise."""
    optimizers = learner_state["optimizers"]
    own = has_own_critic(learner_state["policy"])
    if name == CRITIC_EXTRACTOR_OPT and name not in optimizers and not own:
        return None
    return optimizers[name]


def restore_learner(learner: Learner, state: dict[str, Any], *, counters: bool = True) -> None:
    """Load policy, optimisers and minibatch RNG; `counters=False` keeps the version (a
    rollback continues numbering versions forward). Learning rates come from the config,
    not the file: a user who changes `ppo.actor_lr` and restarts gets the new one; except
    under `ppo.lr_schedule = "kl_adaptive"`, where the adapted rates are the run's state
    and go on from the file's."""
    learner.policy.load_state_dict(state["policy"])
    lrs = learning_rates(learner.cfg.ppo)
    adapted = learner.cfg.ppo.lr_schedule == "kl_adaptive"
    for name, opt in learner.optimizers.items():
        saved = saved_optimizer(state, name)
        if saved is None:  # a new own critic: fresh moments, at the critic's rate
            opt.state.clear()  # (a rollback to such a file drops the ones trained since)
            for group in opt.param_groups:
                group["lr"] = learner.optimizers["critic"].param_groups[0]["lr"]
            continue
        opt.load_state_dict(saved)
        for group in opt.param_groups if not adapted else ():
            group["lr"] = lrs[name]
    learner.generator.set_state(state["generator"].cpu())
    if counters:
        learner.version = int(state["version"])
    learner.nonfinite_streak = 0


def collector_state(collector: Collector) -> dict[str, Any] | None:
    """Copies on the CPU: the producer goes on collecting into the originals. None for an
    env backend that cannot save its state (a resume then starts new episodes)."""
    if not isinstance(collector.env, ResumableEnv):
        return None
    td = collector.td
    env_state = collector.env.state_dict_env()
    return {
        # Already the env's own copies (the contract; conformance's replay-after-load
        # check fails a backend whose saved tensors change as it steps): host only.
        "env": {k: v.detach().cpu() for k, v in env_state.items()},
        "td": _flatten(td),
        "sampler": collector.sampler.get_state(),
        "rng": rng_state(),
    }


def restore_collector(collector: Collector, state: dict[str, Any]) -> None:
    """Raises ValueError (leaving the collector as it was) when the env does not match."""
    env = collector.env
    if not isinstance(env, ResumableEnv):
        raise ValueError(f"{type(env).__name__} is no ResumableEnv: it cannot load env state")
    current = collector.td
    stored = state["td"]
    missing = sorted(set(_flatten(current)) - set(stored))
    if missing:
        raise ValueError(f"env keys {missing} are not in the saved state")
    td = TensorDict({}, batch_size=current.batch_size, device=current.device)
    for key, value in stored.items():
        path = tuple(key.split("/"))
        if path in current.keys(include_nested=True) and current.get(path).shape != value.shape:
            raise ValueError(f"env key {key}: saved shape {tuple(value.shape)} differs")
        td.set(path, value.to(current.device))
    env.load_state_dict_env(state["env"])
    collector.td = td
    # No episode counts: the episodes the checkpoint's rollout ended are in its
    # iteration's history row, and counting them again would report them twice (earlier
    # snapshots hold them under "episodes": left unread).
    restore_rng(state["rng"])
    _restore_sampler(collector.sampler, state)


def _restore_sampler(sampler: torch.Generator, state: dict[str, Any]) -> None:
    """The action generator's state; from a snapshot written before it existed, the
    default generator's that actions were drawn from then. A snapshot of another device
    kind (a CUDA run resumed on a CPU) cannot set it: the generator then goes on as built."""
    saved = state.get("sampler")
    if saved is None:
        rng = state["rng"]
        cuda = sampler.device.type == "cuda" and len(rng["cuda"]) > (sampler.device.index or 0)
        saved = rng["cuda"][sampler.device.index or 0] if cuda else rng["torch"]
    with contextlib.suppress(RuntimeError):
        sampler.set_state(saved.cpu())


def rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {
            "version": version,
            "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss": gauss,
        },
    }


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        cuda = list(state["cuda"])[: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(cuda)
    n = state["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(int(x) for x in p["internal"].tolist()), p["gauss"]))


def _flatten(td: TensorDictBase) -> dict[str, torch.Tensor]:
    return {
        "/".join((k,) if isinstance(k, str) else k): host_copy(v)
        for k, v in td.items(include_nested=True, leaves_only=True)
    }
