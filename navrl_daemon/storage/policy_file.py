"""NavRL-layout policy files: a plain state_dict, `torch.load(weights_only=True)`-safe."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from navrl_daemon.errors import DataError
from navrl_daemon.rl.policy import navrl_layout
from navrl_daemon.storage.atomic import write_atomic


def save_policy_state(path: Path, state: dict[str, torch.Tensor]) -> None:
    """Write `state` in NavRL's layout: an own critic's extractor (ppo.separate_critic)
    stays in the run's checkpoints, not in policy files."""
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in navrl_layout(state).items()}, buf)
    write_atomic(path, buf.getvalue())


def load_policy_state(path: Path) -> dict[str, torch.Tensor]:
    """Read a NavRL state_dict (e.g. the published checkpoint) onto the CPU."""
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise DataError(f"checkpoint {path}: not found") from None
    except (pickle.UnpicklingError, RuntimeError, zipfile.BadZipFile, EOFError, OSError) as e:
        from navrl_daemon.storage.checkpoint import torch_refusal

        raise DataError(
            f"checkpoint {path}: not a policy file (a torch state_dict) nor a checkpoint "
            f"(.nrc): torch.load(weights_only=True) refused it: {torch_refusal(e)}"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise DataError(f"checkpoint {path}: expected a state_dict of tensors")
    return state


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
    try:
        policy = state["learner"]["policy"]
    except (KeyError, TypeError):
        raise DataError(f"checkpoint {path}: holds no learner.policy") from None
    return navrl_layout(policy), state


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
