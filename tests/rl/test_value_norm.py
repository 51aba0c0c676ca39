"""ValueNorm against a plain-Python restatement of navrl-task §2 and the checkpoint's buffers."""

from __future__ import annotations

import math

import pytest
import torch

from navrl_daemon.rl.value_norm import ValueNorm


class PlainValueNorm:
    """navrl-task §2 in floats."""

    def __init__(self) -> None:
        self.m = self.s = self.d = 0.0

    def update(self, xs: list[float]) -> None:
        b = 0.995
        self.m = b * self.m + (1 - b) * sum(xs) / len(xs)
        self.s = b * self.s + (1 - b) * sum(x * x for x in xs) / len(xs)
        self.d = b * self.d + (1 - b)

    def mean_std(self) -> tuple[float, float]:
        d = max(self.d, 1e-5)
        mean = self.m / d
        return mean, math.sqrt(max(self.s / d - mean * mean, 1e-2))


def test_matches_plain_reference_over_updates():
    g = torch.Generator().manual_seed(0)
    ours, plain = ValueNorm().double(), PlainValueNorm()
    for i in range(5):
        x = (torch.randn(4, 6, 1, generator=g) * (i + 1) + 10 * i).double()
        ours.update(x)
        plain.update(x.flatten().tolist())
        mean, std = plain.mean_std()
        probe = torch.tensor([[-3.0], [0.5], [42.0]], dtype=torch.float64)
        expected_norm = [(v - mean) / std for v in probe.flatten().tolist()]
        assert ours.normalize(probe).flatten().tolist() == pytest.approx(expected_norm)
        expected_denorm = [v * std + mean for v in probe.flatten().tolist()]
        assert ours.denormalize(probe).flatten().tolist() == pytest.approx(expected_denorm)
        torch.testing.assert_close(ours.denormalize(ours.normalize(probe)), probe)


def test_buffer_shapes_and_fresh_state():
    vn = ValueNorm()
    assert vn.running_mean.shape == (1,)
    assert vn.running_mean_sq.shape == (1,)
    assert vn.debiasing_term.shape == ()
    # Nothing seen yet: mean 0 and the variance floor 1e-2, so std 0.1.
    torch.testing.assert_close(vn.normalize(torch.tensor([1.0])), torch.tensor([10.0]))


def test_variance_floor_on_constant_input():
    vn = ValueNorm()
    vn.update(torch.full((8, 1), 3.0))
    mean, var = vn.mean_var()
    torch.testing.assert_close(mean, torch.tensor([3.0]))
    torch.testing.assert_close(var, torch.tensor([1e-2]))


def test_checkpoint_buffers(navrl_state_dict):
    vn = ValueNorm()
    vn.load_state_dict(
        {k.removeprefix("value_norm."): v for k, v in navrl_state_dict.items() if "value_norm" in k}
    )
    mean, var = vn.mean_var()
    assert mean.item() == pytest.approx(447.2, abs=0.05)
    assert var.sqrt().item() == pytest.approx(70.42, abs=0.005)
