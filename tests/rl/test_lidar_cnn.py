"""The LiDAR CNN's convolutions as matrix products against torch's conv2d: the same
network, outputs, gradients and PPO updates, to float rounding."""

from __future__ import annotations

import copy

import pytest
import torch

from navrl_daemon.config import PPOConfig
from navrl_daemon.rl import ppo
from navrl_daemon.rl.fast_update import FastUpdate
from navrl_daemon.rl.lidar_cnn import LidarCNN
from navrl_daemon.rl.policy import NavRLPolicy
from tests.rl.conftest import synthetic_batch

# float32 sums in another order: a few ulps of the outputs' scale.
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _assert_close_at_scale(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """Within 1e-5 of the tensor's largest magnitude: a weight gradient sums thousands of
    products of both signs, so an element near 0 carries the rounding of the large ones."""
    scale = float(expected.abs().max().clamp(min=1e-12))
    error = float((actual - expected).abs().max())
    assert error <= 1e-5 * scale, f"{name}: {error:.3g} off at scale {scale:.3g}"


def _pair() -> tuple[LidarCNN, LidarCNN]:
    torch.manual_seed(0)
    native = LidarCNN("native")
    matmul = LidarCNN("matmul")
    matmul.load_state_dict(native.state_dict())
    return native, matmul


def _lidar(rows: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lidar = 4.0 * torch.rand(rows, 1, 36, 4, generator=g)
    lidar[lidar < 1.0] = 0.0  # most beams hit nothing: exact zeros, as the env's
    return lidar


@pytest.mark.parametrize("rows", [1, 7, 256])
def test_outputs_and_gradients_match_conv2d(rows):
    native, matmul = _pair()
    lidar = _lidar(rows)
    out_native, out_matmul = native(lidar), matmul(lidar)
    torch.testing.assert_close(out_matmul, out_native, **TOL)

    grad = torch.randn_like(out_native)
    (out_native * grad).sum().backward()
    (out_matmul * grad).sum().backward()
    for (name, a), b in zip(native.named_parameters(), matmul.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None, name
        _assert_close_at_scale(b.grad, a.grad, name)


def test_input_gradient_matches_conv2d():
    """What a layer after the first receives: the gradient through the unfold."""
    native, matmul = _pair()
    lidar = _lidar(16).requires_grad_(True)
    lidar_again = lidar.detach().clone().requires_grad_(True)
    grad = torch.randn(16, 128)
    (native(lidar) * grad).sum().backward()
    (matmul(lidar_again) * grad).sum().backward()
    assert lidar.grad is not None and lidar_again.grad is not None
    _assert_close_at_scale(lidar_again.grad, lidar.grad, "lidar")


def test_auto_is_matmul_on_the_cpu_and_keeps_navrl_keys():
    native, matmul = _pair()
    auto = LidarCNN("auto")
    auto.load_state_dict(native.state_dict(), strict=True)
    lidar = _lidar(32)
    assert torch.equal(auto(lidar), matmul(lidar))
    assert not torch.equal(auto(lidar), native(lidar))  # another order of sums
    assert list(auto.state_dict()) == list(native.state_dict())
    with pytest.raises(ValueError, match="lowering"):
        LidarCNN("winograd")  # type: ignore[arg-type]


@pytest.mark.parametrize("path", ["eager", "fused"])
def test_update_matches_conv2d(path):
    """A whole PPO update (mirror, KL stop and trunk clip as in config/navrl.toml) from the
    same weights and batch: the same statistics and weights, to float rounding."""
    cfg = PPOConfig(epochs=2, minibatches=4, mirror=True, target_kl=0.05)
    cfg = cfg.model_copy(update={"feature_extractor_max_grad_norm": 5.0})
    torch.manual_seed(0)
    native = NavRLPolicy(lidar_conv="native")
    batch = synthetic_batch(native, num_envs=8, steps=6, seed=2)
    matmul = NavRLPolicy(lidar_conv="matmul")
    matmul.load_state_dict(copy.deepcopy(native.state_dict()))

    results = []
    for policy in (native, matmul):
        opts = ppo.make_optimizers(policy, cfg)
        gen = torch.Generator().manual_seed(3)
        if path == "eager":
            results.append(ppo.update(policy, opts, batch, cfg, gen))
        else:
            results.append(
                FastUpdate(policy, opts, torch.device("cpu"), graphs=False)(batch, cfg, gen)
            )
    stats_native, stats_matmul = results
    assert stats_matmul["minibatch_updates"] == stats_native["minibatch_updates"] == 8
    for name in ppo.STAT_NAMES:
        slack = 0.011 if name == "value_clipped" else 1e-5  # a row may sit on the bar
        assert stats_matmul[name] == pytest.approx(stats_native[name], rel=1e-4, abs=slack), name
    for key, value in native.state_dict().items():
        torch.testing.assert_close(matmul.state_dict()[key], value, **TOL, msg=key)
