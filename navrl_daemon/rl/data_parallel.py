"""Data-parallel PPO across torch.distributed ranks: what `ppo.update` reduces, and how.

Each rank holds its own [E, T] rollout; together the ranks compute the update one process
with N·E envs would compute on the same data (to float tolerance), because every quantity
PPO takes over the whole batch is reduced:

- advantage mean and std (sums of x and x², and the count, over all ranks);
- the ValueNorm update (mean of returns and of their squares over all ranks);
- "are the returns finite" (one rank's NaN return keeps ValueNorm still on every rank);
- the critic loss, NavRL's max of two *mean* Huber losses: the two means are averaged
  over ranks first, and each rank back-propagates its own share of the larger one;
- gradients: averaged after every minibatch's backward in buckets (one all-reduce per
  ~`bucket_bytes` of gradients, launched together, then waited on), never one flat copy
  of all of them; a rank whose loss was not finite poisons the reduced gradients, so every
  rank skips that step together;
- the logged loss statistics, once per update.

Ranks stay bit-identical: the reduced gradients are the same bytes on every rank and so
are the optimiser steps; `checksum` lets the caller verify it cheaply.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket size


class RanksDiverged(RuntimeError):
    """The ranks' parameters are no longer the same."""


class DataParallel:
    """Collectives over `group` (None: the default process group) for one trainer."""

    def __init__(self, group: dist.ProcessGroup | None = None, bucket_bytes: int = BUCKET_BYTES):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.bucket_bytes = bucket_bytes

    # ------------------------------------------------------------------ batch statistics

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks (a new tensor; `values` is left alone)."""
        out = values.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
        return out

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise mean over ranks (a new tensor; `values` is left alone)."""
        return self.sum(values) / self.world_size

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(x − mean) / std with mean and (unbiased) std over every rank's x."""
        x64 = x.double()
        n_s_ss = self.sum(torch.stack([x64.new_tensor(x.numel()), x64.sum(), x64.square().sum()]))
        n, s, ss = n_s_ss.unbind()
        mean = s / n
        var = (ss - n * mean.square()) / (n - 1).clamp(min=1)
        std = var.clamp(min=0).sqrt()
        return (x - mean.to(x.dtype)) / std.to(x.dtype).clamp(min=1e-7)

    def mean_and_mean_sq(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """mean(x) and mean(x²) over every rank's x (equal sizes or not)."""
        x64 = x.double()
        n, s, ss = self.sum(
            torch.stack([x64.new_tensor(x.numel()), x64.sum(), x64.square().sum()])
        ).unbind()
        return (s / n).to(x.dtype), (ss / n).to(x.dtype)

    def all_finite(self, x: torch.Tensor) -> bool:
        bad = (~torch.isfinite(x)).any().to(torch.float32).reshape(1)
        return not bool(self.sum(bad).item())

    def max_of_means(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """This rank's share of max(mean_over_ranks(a), mean_over_ranks(b)).

        `a`, `b` are this rank's scalar means (equal minibatch sizes on every rank); the
        returned scalar's gradient, averaged over ranks, is the gradient of the global max.
        No host sync: the choice is a `torch.where` on device.
        """
        both = self.sum(torch.stack([a.detach(), b.detach()]))
        return torch.where(both[0] >= both[1], a, b)

    # ------------------------------------------------------------------ gradients

    def average_gradients(self, params: Sequence[torch.nn.Parameter], loss: torch.Tensor) -> None:
        """Average every parameter's .grad over ranks in place. A rank whose `loss` is not
        finite turns every rank's gradients into NaN, so all skip the step together."""
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        poison = torch.where(torch.isfinite(loss.detach()), 0.0, float("nan")).reshape(1)
        buckets = list(self._buckets(grads))
        flats = [_flatten_dense_tensors(bucket) for bucket in buckets]
        flats[-1] = torch.cat([flats[-1], poison.to(flats[-1].dtype)])
        works = [
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            for flat in flats
        ]
        for work in works:
            work.wait()
        poisoned = flats[-1][-1:]
        flats[-1] = flats[-1][:-1]
        scale = 1.0 / self.world_size
        for bucket, flat in zip(buckets, flats, strict=True):
            flat.mul_(scale).add_(poisoned)  # + 0.0, or + NaN everywhere
            for grad, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                grad.copy_(reduced)

    def _buckets(self, grads: Iterable[torch.Tensor]) -> Iterable[list[torch.Tensor]]:
        bucket: list[torch.Tensor] = []
        size = 0
        for g in grads:
            if bucket and (
                size + g.numel() * g.element_size() > self.bucket_bytes
                or g.dtype != bucket[0].dtype
            ):
                yield bucket
                bucket, size = [], 0
            bucket.append(g)
            size += g.numel() * g.element_size()
        if bucket:
            yield bucket

    # ------------------------------------------------------------------ drift

    def broadcast_module(self, module: torch.nn.Module, src: int = 0) -> None:
        """Rank `src`'s parameters and buffers onto every rank."""
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=src, group=self.group)

    def check_same(self, module: torch.nn.Module) -> None:
        """Raise RanksDiverged naming the ranks whose parameters differ from rank 0's."""
        mine = checksum(module)
        every = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine, group=self.group)
        reference = every[0]
        odd = [r for r, c in enumerate(every) if not torch.equal(c, reference)]
        if odd:
            raise RanksDiverged(
                f"parameters of rank(s) {odd} differ from rank 0's "
                f"(checksums {[c.tolist() for c in every]})"
            )


def checksum(module: torch.nn.Module) -> torch.Tensor:
    """Two float64 numbers that change with any parameter or buffer: the sum, and a sum
    weighted by position (so swapped values are caught too). One pass, no host sync."""
    total = torch.zeros(2, dtype=torch.float64, device=next(module.parameters()).device)
    for i, t in enumerate([*module.parameters(), *module.buffers()]):
        flat = t.detach().reshape(-1).double()
        weights = torch.arange(1, flat.numel() + 1, device=flat.device, dtype=torch.float64)
        total[0] += flat.sum()
        total[1] += (flat * weights).sum() * (i + 1)
    return total
