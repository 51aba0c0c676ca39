"""NavRLPolicy against NavRL's published checkpoint and an independent functional forward."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict

from navrl_daemon.rl.policy import NavRLPolicy

KEYS_FILE = Path(__file__).resolve().parents[1] / "data" / "navrl_checkpoint_keys.txt"


def reference_forward(
    sd: dict[str, torch.Tensor], state: torch.Tensor, lidar: torch.Tensor, dyn: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NavRL's network from navrl-task §2 in functional ops on the raw state_dict: (α, β, value)."""

    def p(name: str) -> torch.Tensor:
        return sd[name]

    def linear(x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.linear(x, p(f"{prefix}.weight"), p(f"{prefix}.bias"))

    def norm(x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], p(f"{prefix}.weight"), p(f"{prefix}.bias"), 1e-5)

    def mlp_block(x: torch.Tensor, lin: str, ln: str) -> torch.Tensor:
        return norm(F.leaky_relu(linear(x, lin), 0.01), ln)

    cnn = "feature_extractor.module.0.module"
    x = lidar
    for i, stride in ((0, (1, 1)), (2, (2, 1)), (4, (2, 2))):
        x = F.elu(F.conv2d(x, p(f"{cnn}.{i}.weight"), p(f"{cnn}.{i}.bias"), stride, (2, 1)))
    x = norm(linear(x.flatten(1), f"{cnn}.7"), f"{cnn}.8")

    dmlp = "feature_extractor.module.1.module.1"
    d = mlp_block(dyn.flatten(1), f"{dmlp}.0", f"{dmlp}.2")
    d = mlp_block(d, f"{dmlp}.3", f"{dmlp}.5")

    trunk = "feature_extractor.module.3.module"
    f = torch.cat([x, d, state], dim=1)
    f = mlp_block(f, f"{trunk}.0", f"{trunk}.2")
    f = mlp_block(f, f"{trunk}.3", f"{trunk}.5")

    head = "actor.module.0.module"
    alpha = 1 + F.softplus(linear(f, f"{head}.alpha_layer")) + 1e-6
    beta = 1 + F.softplus(linear(f, f"{head}.beta_layer")) + 1e-6
    return alpha, beta, linear(f, "critic.module")


def observation_td(state, lidar, dyn, direction) -> TensorDict:
    obs = {"state": state, "lidar": lidar, "dynamic_obstacle": dyn, "direction": direction}
    return TensorDict({"agents": {"observation": obs}}, batch_size=state.shape[:-1])


# ---------------------------------------------------------------------------- layout


def test_fresh_state_dict_has_navrl_keys_and_shapes(navrl_state_dict):
    ours = NavRLPolicy().state_dict()
    assert list(ours) == list(navrl_state_dict)
    assert {k: v.shape for k, v in ours.items()} == {
        k: v.shape for k, v in navrl_state_dict.items()
    }


def test_key_list_matches_the_published_key_file():
    rows = [ln.split("\t") for ln in KEYS_FILE.read_text().splitlines() if not ln.startswith("#")]
    expected = {
        k: tuple(int(n) for n in shape.strip("()").split(",") if n) for k, shape, *_ in rows
    }
    ours = {k: tuple(v.shape) for k, v in NavRLPolicy().state_dict().items()}
    assert ours == expected
    assert len(ours) == 37
    assert sum(v.numel() for v in NavRLPolicy().state_dict().values()) == 177_388


def test_checkpoint_loads_strict_and_round_trips(navrl_state_dict, tmp_path):
    policy = NavRLPolicy()
    result = policy.load_state_dict(navrl_state_dict, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    path = tmp_path / "policy.pt"
    torch.save(policy.state_dict(), path)
    again = torch.load(path, weights_only=True, map_location="cpu")
    assert list(again) == list(navrl_state_dict)
    for key, value in navrl_state_dict.items():
        assert torch.equal(again[key], value), key


def test_trainable_parameter_count():
    assert sum(p.numel() for p in NavRLPolicy().parameters()) == 177_383


# ---------------------------------------------------------------------------- forward


# The matmul lowering sums the convolutions' products in another order (rl/lidar_cnn.py).
@pytest.mark.parametrize(
    ("lidar_conv", "tol"),
    [("native", {}), ("matmul", {"rtol": 1e-5, "atol": 1e-4})],
)
def test_matches_independent_functional_forward(navrl_state_dict, lidar_conv, tol):
    navrl_policy = NavRLPolicy(lidar_conv=lidar_conv)
    navrl_policy.load_state_dict(navrl_state_dict, strict=True)
    g = torch.Generator().manual_seed(0)
    n, t = 3, 5
    state = torch.randn(n, t, 8, generator=g) * 5
    lidar = 4 * torch.rand(n, t, 1, 36, 4, generator=g)
    dyn = torch.randn(n, t, 1, 5, 10, generator=g)
    with torch.no_grad():
        feature = navrl_policy.features(state, lidar, dyn)
        dist = navrl_policy.distribution(feature)
        value = navrl_policy.value(feature)
        alpha, beta, v_ref = reference_forward(
            navrl_state_dict,
            state.reshape(-1, 8),
            lidar.reshape(-1, 1, 36, 4),
            dyn.reshape(-1, 1, 5, 10),
        )
    assert feature.shape == (n, t, 256)
    torch.testing.assert_close(dist.base_dist.concentration1.reshape(-1, 3), alpha, **tol)
    torch.testing.assert_close(dist.base_dist.concentration0.reshape(-1, 3), beta, **tol)
    torch.testing.assert_close(value.reshape(-1, 1), v_ref, **tol)


def _close_to_printed(actual: list[float], printed: list[str]) -> None:
    """Each value equals the printed one to the printed number of decimals."""
    for a, s in zip(actual, printed, strict=True):
        decimals = len(s.split(".")[1])
        assert abs(a - float(s)) <= 0.5 * 10**-decimals * 1.01, (actual, printed)


SPEC_ROWS = [
    # state, lidar[0,0,:], α, β, mean a_n, v_goal (L=2), critic (normalised)
    (
        [0.0] * 8,
        0.0,
        ["649.10", "270.32", "546.51"],
        ["573.47", "262.01", "381.50"],
        ["0.5309", "0.5078", "0.5889"],
        ["0.124", "0.031", "0.356"],
        "-1.0824",
    ),
    (
        [1, 0, 0, 20, 0, 0, 0, 0],
        0.0,
        ["1604.83", "176.91", "72.81"],
        ["29.87", "153.09", "68.02"],
        ["0.9817", "0.5361", "0.5170"],
        ["1.927", "0.144", "0.068"],
        "0.9531",
    ),
    (
        [1, 0, 0, 20, 0, 0, 0, 0],
        3.0,
        ["23.32", "1.002", "6.79"],
        ["9.94", "27.56", "9.52"],
        ["0.7011", "0.0351", "0.4163"],
        ["0.804", "-1.860", "-0.335"],
        "-0.0923",
    ),
]


@pytest.mark.parametrize("row", SPEC_ROWS, ids=["zeros", "goal_ahead", "pillar_ahead"])
def test_spec_reference_forward_passes(navrl_policy, row):
    state, lidar_front, alpha, beta, mean, v_goal, critic = row
    lidar = torch.zeros(1, 1, 36, 4)
    lidar[0, 0, 0, :] = lidar_front
    td = observation_td(
        torch.tensor([state], dtype=torch.float32),
        lidar,
        torch.zeros(1, 1, 5, 10),
        torch.tensor([[[1.0, 0.0, 0.0]]]),  # goal frame = world frame
    )
    with torch.no_grad():
        dist = navrl_policy.distribution(navrl_policy.observe(td))
        navrl_policy.act(td, deterministic=True)
    _close_to_printed(dist.base_dist.concentration1[0].tolist(), alpha)
    _close_to_printed(dist.base_dist.concentration0[0].tolist(), beta)
    _close_to_printed(td["agents", "action_normalized"][0].tolist(), mean)
    _close_to_printed(td["agents", "action"][0, 0].tolist(), v_goal)
    _close_to_printed([td["state_value"].item()], [critic])


def test_goal_ahead_value_denormalises_to_about_514(navrl_policy):
    td = observation_td(
        torch.tensor([[1.0, 0, 0, 20, 0, 0, 0, 0]]),
        torch.zeros(1, 1, 36, 4),
        torch.zeros(1, 1, 5, 10),
        torch.tensor([[[1.0, 0.0, 0.0]]]),
    )
    with torch.no_grad():
        navrl_policy.act(td, deterministic=True)
        value = navrl_policy.value_norm.denormalize(td["state_value"]).item()
    assert value == pytest.approx(514.3, abs=0.1)


# ---------------------------------------------------------------------------- act


@pytest.mark.parametrize("batch", [(7,), (3, 4)])
def test_act_shapes_and_consistency(batch):
    torch.manual_seed(0)
    policy = NavRLPolicy()
    td = observation_td(
        torch.randn(*batch, 8),
        4 * torch.rand(*batch, 1, 36, 4),
        torch.randn(*batch, 1, 5, 10),
        torch.randn(*batch, 1, 3) * torch.tensor([1.0, 1.0, 0.0]),
    )
    out = policy.act(td, deterministic=False)
    assert out is td
    assert td["agents", "action_normalized"].shape == (*batch, 3)
    assert td["agents", "action"].shape == (*batch, 1, 3)
    assert td["sample_log_prob"].shape == batch
    assert td["state_value"].shape == (*batch, 1)
    a = td["agents", "action_normalized"]
    assert ((a > 0) & (a < 1)).all()
    assert a.requires_grad  # rsample: reparameterised under the caller's grad mode
    dist = policy.distribution(policy.observe(td))
    torch.testing.assert_close(td["sample_log_prob"], dist.log_prob(a))
    torch.testing.assert_close(td["state_value"], policy.value(policy.observe(td)))

    with torch.no_grad():
        policy.act(td, deterministic=True)
    assert not td["agents", "action_normalized"].requires_grad
    torch.testing.assert_close(td["agents", "action_normalized"], dist.mean.detach())


def test_fresh_policy_starts_at_zero_velocity():
    torch.manual_seed(0)
    policy = NavRLPolicy()
    feature = policy.features(
        torch.randn(64, 8), torch.rand(64, 1, 36, 4), torch.randn(64, 1, 5, 10)
    )
    dist = policy.distribution(feature)
    alpha = dist.base_dist.concentration1
    assert torch.allclose(alpha, torch.full_like(alpha, 1 + math.log(2)), atol=0.05)
    assert torch.allclose(dist.mean, torch.full_like(dist.mean, 0.5), atol=0.01)
    assert policy.value(feature).abs().max() < 0.1


def test_to_world_rotates_goal_frame_velocity():
    policy = NavRLPolicy(action_limit=2.0)
    a = torch.tensor([[1.0, 0.5, 0.75]])  # v_goal = (2, 0, 1)
    facing_y = torch.tensor([[[0.0, 3.0, 0.0]]])
    torch.testing.assert_close(policy.to_world(a, facing_y), torch.tensor([[[0.0, 2.0, 1.0]]]))
    facing_minus_x = torch.tensor([[[-1.0, 0.0, 0.0]]])
    torch.testing.assert_close(
        policy.to_world(a, facing_minus_x), torch.tensor([[[-2.0, 0.0, 1.0]]]), atol=1e-6, rtol=0
    )


def test_to_world_is_a_rotation_about_z():
    g = torch.Generator().manual_seed(1)
    policy = NavRLPolicy(action_limit=1.0)
    a = torch.rand(10, 3, generator=g)
    direction = torch.randn(10, 1, 3, generator=g) * torch.tensor([1.0, 1.0, 0.0])
    world = policy.to_world(a, direction)[:, 0]
    v_goal = 2 * a - 1
    torch.testing.assert_close(world.norm(dim=-1), v_goal.norm(dim=-1))
    torch.testing.assert_close(world[:, 2], v_goal[:, 2])
    # x component of the goal frame is along the (horizontal) direction
    heading = direction[:, 0, :2] / direction[:, 0, :2].norm(dim=-1, keepdim=True)
    torch.testing.assert_close((world[:, :2] * heading).sum(-1), v_goal[:, 0])
