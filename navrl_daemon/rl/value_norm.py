"""NavRL's ValueNorm (navrl-task §2): a debiased running mean/variance of the value targets.

The critic predicts values in normalised units; GAE works in denormalised (return) units.
The three buffers are part of the policy's state_dict, under `value_norm.*`.
"""

from __future__ import annotations

import torch
from torch import nn


class ValueNorm(nn.Module):
    """Exponential moving averages of mean(x) and mean(x²), debiased like Adam's moments."""

    running_mean: torch.Tensor
    running_mean_sq: torch.Tensor
    debiasing_term: torch.Tensor

    def __init__(self, beta: float = 0.995, epsilon: float = 1e-5) -> None:
        super().__init__()
        self.beta = beta
        self.epsilon = epsilon
        self.register_buffer("running_mean", torch.zeros(1))
        self.register_buffer("running_mean_sq", torch.zeros(1))
        self.register_buffer("debiasing_term", torch.zeros(()))

    @torch.no_grad()
    def update(
        self, x: torch.Tensor, moments: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> None:
        """Fold in one batch of returns ([..., 1]); every element weighs the same.

        `moments` = (mean(x), mean(x²)) of a larger batch x is part of (data parallelism)."""
        w = self.beta
        mean, mean_sq = moments if moments is not None else (x.mean(), x.square().mean())
        self.running_mean.mul_(w).add_((1.0 - w) * mean)
        self.running_mean_sq.mul_(w).add_((1.0 - w) * mean_sq)
        self.debiasing_term.mul_(w).add_(1.0 - w)

    def mean_var(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Debiased mean and variance; the variance floor 1e-2 keeps 1/std bounded."""
        d = self.debiasing_term.clamp(min=self.epsilon)
        mean = self.running_mean / d
        var = (self.running_mean_sq / d - mean.square()).clamp(min=1e-2)
        return mean, var

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        mean, var = self.mean_var()
        return (x - mean) / var.sqrt()

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        mean, var = self.mean_var()
        return x * var.sqrt() + mean
