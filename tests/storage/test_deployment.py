"""Deployment exports of the actor: ONNX run by ONNX Runtime and the torch.export program
give the action `NavRLPolicy.act(deterministic=True)` gives, on random observations of
NavRL's keys and shapes, for batch sizes other than the one traced."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from navrl_daemon.rl.deploy import OBSERVATION_SHAPES, DeployedActor, example_observation
from navrl_daemon.rl.policy import OBS_KEY, NavRLPolicy
from navrl_daemon.storage.deployment import export_actor


@pytest.fixture(scope="module")
def policy() -> NavRLPolicy:
    torch.manual_seed(0)
    p = NavRLPolicy()
    # Heads away from NavRL's near-zero init, so the actions differ between inputs.
    for layer in (p.beta_head.alpha_layer, p.beta_head.beta_layer):
        torch.nn.init.normal_(layer.weight, std=0.3)
    return p.eval()


def reference(policy: NavRLPolicy, obs: dict[str, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """What the rollouts and NavRL's runners compute: act() on the observation TensorDict."""
    n = obs["state"].shape[0]
    td = TensorDict({OBS_KEY: TensorDict(obs, batch_size=[n])}, batch_size=[n])
    with torch.no_grad():
        out = policy.act(td, deterministic=True)
    return out["agents", "action"].numpy(), out["agents", "action_normalized"].numpy()


def test_observation_shapes_are_the_envs() -> None:
    from navrl_daemon.config import Config
    from navrl_daemon.env import make_env

    cfg = Config().env.model_copy(update={"num_obstacles": 2, "num_dynamic_obstacles": 8})
    env = make_env(cfg, device="cpu", seed=0, num_envs=3)
    obs = env.reset()[OBS_KEY]
    assert {k: tuple(obs[k].shape[1:]) for k in OBSERVATION_SHAPES} == OBSERVATION_SHAPES


def test_onnx_matches_the_policy_on_random_inputs(policy: NavRLPolicy, tmp_path: Path) -> None:
    pytest.importorskip("onnxscript", reason="the export extra: pip install '.[export]'")
    ort = pytest.importorskip("onnxruntime", reason="the export extra: pip install '.[export]'")
    path = tmp_path / "actor.onnx"
    export_actor(DeployedActor(policy), "onnx", path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(OBSERVATION_SHAPES)
    assert [o.name for o in session.get_outputs()] == ["action", "action_normalized"]
    gen = torch.Generator().manual_seed(1)
    for batch in (1, 7, 64):
        obs = example_observation(batch, gen)
        obs["direction"][..., 2] = 0  # as the env gives it
        action, normalized = session.run(None, {k: v.numpy() for k, v in obs.items()})
        ref_action, ref_normalized = reference(policy, obs)
        assert action.shape == (batch, 1, 3)
        np.testing.assert_allclose(normalized, ref_normalized, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(action, ref_action, rtol=1e-5, atol=1e-5)
    assert np.ptp(ref_action) > 0.1  # the inputs made a difference: not a constant


def test_torch_export_program_matches_the_policy(policy: NavRLPolicy, tmp_path: Path) -> None:
    path = tmp_path / "actor.pt2"
    export_actor(DeployedActor(policy), "torch-export", path)
    program = torch.export.load(str(path)).module()
    obs = example_observation(5, torch.Generator().manual_seed(2))
    action, normalized = program(*obs.values())
    ref_action, ref_normalized = reference(policy, obs)
    np.testing.assert_allclose(action.detach().numpy(), ref_action, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(normalized.detach().numpy(), ref_normalized, rtol=1e-6, atol=1e-6)
