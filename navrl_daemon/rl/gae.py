"""Generalised advantage estimation over a [N, T, 1] rollout window (navrl-task §3).

NavRL cuts the recursion only at `terminated`; a time-out still bootstraps from V(s_T) but
lets A_t leak across the auto-reset into the next episode. `cut_truncation=True` (our
default, `ppo.gae_cut_truncation`) also stops the recursion there; δ_t is the same either way.
"""

from __future__ import annotations

import torch
from torch import nn


def compute_gae(
    reward: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    lmbda: float,
    cut_truncation: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each [N, T, 1]; values are in return units (denormalised).

    δ_t = r_t + γ·V(s_{t+1})·(1−term_t) − V(s_t);  A_t = δ_t + γλ·(1−cut_t)·A_{t+1}
    with cut = term (NavRL) or term | trunc. Vectorised over envs, a loop over time.
    """
    not_term = 1.0 - terminated.to(value.dtype)
    cut = terminated | truncated if cut_truncation else terminated
    carry = gamma * lmbda * (1.0 - cut.to(value.dtype))
    delta = reward + gamma * next_value * not_term - value
    advantages = torch.empty_like(delta)
    gae = torch.zeros_like(delta[:, 0])
    for t in reversed(range(delta.shape[1])):
        gae = delta[:, t] + carry[:, t] * gae
        advantages[:, t] = gae
    return advantages, advantages + value


class GAE(nn.Module):
    """Holds γ and λ as buffers only so the state_dict has NavRL's `gae.gamma`/`gae.lmbda`.

    `ppo.update` takes γ and λ from the PPO config, the explicit source of truth; these
    buffers are exported with the checkpoint for NavRL compatibility.
    """

    gamma: torch.Tensor
    lmbda: torch.Tensor

    def __init__(self, gamma: float = 0.99, lmbda: float = 0.95) -> None:
        super().__init__()
        self.register_buffer("gamma", torch.tensor(gamma))
        self.register_buffer("lmbda", torch.tensor(lmbda))
