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
    scale = float(expected.detach().abs().max().clamp(min=1e-12))
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


def _update(lowering: str, init: dict, batch, cfg: PPOConfig, path: str):
    policy = NavRLPolicy(lidar_conv=lowering)  # type: ignore[arg-type]
    policy.load_state_dict(init)
    opts = ppo.make_optimizers(policy, cfg)
    gen = torch.Generator().manual_seed(3)
    if path == "eager":
        stats = ppo.update(policy, opts, batch, cfg, gen)
    else:
        stats = FastUpdate(policy, opts, torch.device("cpu"), graphs=False)(batch, cfg, gen)
    return stats, policy.state_dict()


@pytest.mark.parametrize("path", ["eager", "fused"])
def test_update_matches_conv2d(path):
    """A whole PPO update (mirror, KL stop and trunk clip as in config/navrl.toml) from the
    same weights and batch: the same statistics, and weights as far apart as rounding
    alone takes them, measured here: the native update of the batch with every LiDAR value
    one float32 ulp away (Adam's steps carry a rounding-sized gradient of either sign on a
    near-zero component a whole step of its learning rate)."""
    cfg = PPOConfig(epochs=2, minibatches=4, mirror=True, target_kl=0.05)
    cfg = cfg.model_copy(update={"feature_extractor_max_grad_norm": 5.0})
    torch.manual_seed(0)
    init = copy.deepcopy(NavRLPolicy(lidar_conv="native").state_dict())
    batch = synthetic_batch(NavRLPolicy(), num_envs=8, steps=6, seed=2)
    ulp = batch.clone()
    lidar = ulp.get(("agents", "observation", "lidar"))
    lidar.copy_(torch.nextafter(lidar, torch.full_like(lidar, float("inf"))))

    stats_native, native = _update("native", init, batch, cfg, path)
    stats_matmul, matmul = _update("matmul", init, batch, cfg, path)
    _, rounded = _update("native", init, ulp, cfg, path)
    assert stats_matmul["minibatch_updates"] == stats_native["minibatch_updates"] == 8
    for name in ppo.STAT_NAMES:
        slack = 0.011 if name == "value_clipped" else 1e-5  # a row may sit on the bar
        assert stats_matmul[name] == pytest.approx(stats_native[name], rel=1e-4, abs=slack), name
    off = max(float((matmul[k] - v).abs().max()) for k, v in native.items())
    yardstick = max(float((rounded[k] - v).abs().max()) for k, v in native.items())
    assert 0 < yardstick < 1e-4
    assert off <= 5 * yardstick, f"matmul {off:.3g} from conv2d; one ulp of input: {yardstick:.3g}"


@pytest.mark.parametrize("stride", [1, 2])
def test_conv_rows_ops_are_sound(stride):
    """The custom ops' schema, fake (shape) functions and autograd registration, as
    torch.compile relies on them (torch.library.opcheck)."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(3, 8, 12, generator=g, requires_grad=True)
    weight = torch.randn(5 // stride + (5 % stride > 0), stride * 12, 10, generator=g)
    bias = torch.randn(10, generator=g)
    torch.library.opcheck(
        torch.ops.navrl.conv_rows.default, (rows, weight.requires_grad_(), bias, stride)
    )


def test_compiled_matmul_matches_eager():
    """Under torch.compile (ppo.compile, fullgraph) the ops run as they are: the same
    outputs and gradients as the eager matmul forward."""
    native, matmul = _pair()
    compiled = torch.compile(matmul, fullgraph=True, dynamic=False)
    lidar = _lidar(64)
    grad = torch.randn(64, 128)
    (matmul(lidar) * grad).sum().backward()
    eager_grads = [p.grad.clone() for p in matmul.parameters()]
    matmul.zero_grad(set_to_none=True)
    out = compiled(lidar)
    (out * grad).sum().backward()
    _assert_close_at_scale(out, native(lidar), "output")
    for (name, p), expected in zip(matmul.named_parameters(), eager_grads, strict=True):
        assert p.grad is not None
        _assert_close_at_scale(p.grad, expected, name)
