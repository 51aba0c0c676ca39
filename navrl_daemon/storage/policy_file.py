"""NavRL-layout policy files: a plain state_dict, `torch.load(weights_only=True)`-safe.

The one reader of a policy for every command (`eval`, `checkpoints import|export`,
`report`) and for `run`'s check of a checkpoint: a `.pt` state_dict or a `.nrc`
checkpoint's `learner.policy`, checked alike (`policy_tensors`). Whatever a file holds
instead is a DataError (exit 65) naming the file and the reason; no code in it runs.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from navrl_daemon.errors import DataError
from navrl_daemon.rl.policy import navrl_layout
from navrl_daemon.storage.atomic import write_atomic

_ZIP = b"PK\x03\x04"  # torch.save's format since torch 1.6
_PICKLE = b"\x80"  # the legacy format: a pickle (protocol 2 and later start with PROTO)


def save_policy_state(path: Path, state: dict[str, torch.Tensor]) -> None:
    """Write `state` in NavRL's layout: an own critic's extractor (ppo.separate_critic)
    stays in the run's checkpoints, not in policy files."""
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in navrl_layout(state).items()}, buf)
    write_atomic(path, buf.getvalue())


def load_policy_state(path: Path) -> dict[str, torch.Tensor]:
    """Read a NavRL state_dict (e.g. the published checkpoint) onto the CPU, checked."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_ZIP))
    except FileNotFoundError:
        raise DataError(f"checkpoint {path}: not found") from None
    except OSError as e:
        raise DataError(f"checkpoint {path}: unreadable: {e.strerror or e}") from None
    if not head:
        raise DataError(f"checkpoint {path}: empty file")
    if head != _ZIP and head[:1] != _PICKLE:
        # Neither torch.save's zip nor its legacy pickle: say what it starts with instead
        # of what the unpickler trips over (a KeyError for text, an IndexError for noise).
        raise DataError(
            f"checkpoint {path}: not a policy file (a torch state_dict) nor a checkpoint "
            f"(.nrc): it starts with {head!r}, neither torch's zip archive nor a pickle"
        )
    from navrl_daemon.storage.checkpoint import torch_refusal

    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # the trust boundary: whatever torch refuses, we refuse
        raise DataError(
            f"checkpoint {path}: not a policy file (a torch state_dict) nor a checkpoint "
            f"(.nrc): torch.load(weights_only=True) refused it: {torch_refusal(e)}"
        ) from None
    return policy_tensors(state, f"checkpoint {path}")


def load_any_policy_state(path: Path) -> dict[str, torch.Tensor]:
    """The policy of a NavRL-layout `.pt` file or of a `.nrc` checkpoint, told apart by
    magic, in NavRL's layout (a checkpoint's own critic extractor, ppo.separate_critic,
    left out: what acting needs)."""
    return load_any_policy(path)[0]


def load_any_policy(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """`load_any_policy_state`, and for a `.nrc` checkpoint the whole state it holds (its
    run's config, the env's state; None for a `.pt` file), read once."""
    from navrl_daemon.storage.checkpoint import MAGIC, load_checkpoint

    try:
        with open(path, "rb") as f:
            magic = f.read(len(MAGIC))
    except FileNotFoundError:
        raise DataError(f"checkpoint {path}: not found") from None
    except OSError as e:
        raise DataError(f"checkpoint {path}: unreadable: {e.strerror or e}") from None
    if magic != MAGIC:
        return load_policy_state(path), None
    _, state = load_checkpoint(path)
    return navrl_layout(checkpoint_policy(state, path)), state


def checkpoint_policy(state: dict[str, Any], path: Path) -> dict[str, torch.Tensor]:
    """The `learner.policy` of a loaded checkpoint's state, checked (`policy_tensors`)."""
    learner = state.get("learner")
    if learner is None:
        raise DataError(f"checkpoint {path}: holds no learner.policy (kind {state.get('kind')!r})")
    if type(learner) not in (dict, OrderedDict):
        raise DataError(f"checkpoint {path}: learner is a {type(learner).__name__}, not a dict")
    if "policy" not in learner:
        raise DataError(f"checkpoint {path}: holds no learner.policy")
    return policy_tensors(learner["policy"], f"checkpoint {path}: learner.policy")


def policy_tensors(state: Any, where: str) -> dict[str, torch.Tensor]:
    """`state` as a policy's state_dict: str keys to dense CPU tensors of real floats, all
    finite, as float32 (the policy's dtype: float16, bfloat16 and float64 are converted,
    and a float64 value beyond float32's range counts as non-finite). Anything else is a
    DataError saying what `where` holds instead."""
    if type(state) not in (dict, OrderedDict):
        raise DataError(
            f"{where} is a {type(state).__name__}, not a state_dict (a dict of tensors)"
        )
    out = {}
    for key, value in state.items():
        if not isinstance(key, str):
            raise DataError(f"{where}: key {key!r} is not a str ({type(key).__name__})")
        out[key] = _weight(value, f"{where}: {key}")
    return out


def _weight(value: Any, where: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise DataError(f"{where} is a {type(value).__name__}, not a tensor")
    if value.layout != torch.strided or value.is_nested:
        raise DataError(f"{where}: a {value.layout} tensor; a policy's weights are dense")
    if value.device.type != "cpu":  # a meta tensor: a shape without data
        raise DataError(f"{where}: a {value.device.type} tensor, without data to load")
    if not value.dtype.is_floating_point:
        raise DataError(
            f"{where}: dtype {value.dtype}; expected float32 (float16, bfloat16 and float64 "
            "are read as float32)"
        )
    weight = value.detach().to(torch.float32)
    bad = int((~torch.isfinite(weight)).sum())
    if bad:
        raise DataError(f"{where}: {bad} non-finite values (NaN or beyond float32's range)")
    return weight


def check_policy_layout(
    state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], path: Path
) -> None:
    """Refuse (exit 65) a state_dict whose keys or shapes differ from NavRL's layout. The
    own critic's extractor (ppo.separate_critic) is not part of it, in either."""
    state, expected = navrl_layout(state), navrl_layout(expected)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(k for k in expected if k in state and state[k].shape != expected[k].shape)
    if missing or unexpected or wrong:
        raise DataError(
            f"checkpoint {path}: not NavRL's policy layout "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}, wrong shape {wrong[:3]})"
        )
