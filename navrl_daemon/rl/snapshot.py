"""What the learner's and the collector's states are made of, as `torch.load(weights_only=True)`
can read them: no modules, no TensorDicts, no numpy objects. The process RNGs (torch, CUDA,
numpy, python) as tensors and plain values and back, a TensorDict flattened to host
tensors by path, and which saved optimiser a learner loads (rl/learner.py,
rl/collector.py own their states; rl/run_state.py gathers them).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from navrl_daemon.host_copy import host_copy
from navrl_daemon.rl.policy import has_own_critic
from navrl_daemon.rl.ppo import CRITIC_EXTRACTOR_OPT


def saved_optimizer(learner_state: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The file's state of optimiser `name`. None for the critic's own extractor in a file
    from a run without one (ppo.separate_critic turned on at a resume: the extractor
    starts as a copy of the shared one, its optimiser afresh). KeyError otherwise."""
    optimizers = learner_state["optimizers"]
    own = has_own_critic(learner_state["policy"])
    if name == CRITIC_EXTRACTOR_OPT and name not in optimizers and not own:
        return None
    return optimizers[name]


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


def flatten(td: TensorDictBase) -> dict[str, torch.Tensor]:
    return {
        "/".join((k,) if isinstance(k, str) else k): host_copy(v)
        for k, v in td.items(include_nested=True, leaves_only=True)
    }
