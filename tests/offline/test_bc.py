"""Behaviour cloning: on a synthetic dataset whose actions are a known policy of joint
and camera images, the image+joint encoder cuts the held-out action error far below
both the untrained policy and the best joint-only linear fit (so it uses the images);
the Beta NLL term pulls the NavRL policy's actions towards recorded ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from navrl_daemon.offline.bc import ImageJointPolicy, bc_step, beta_bc_loss, mse_bc_loss
from navrl_daemon.offline.dataset_synth import SynthSpec, write_synth
from navrl_daemon.offline.datasets import ImageReader, MultimodalDataset
from navrl_daemon.rl.policy import NavRLPolicy
from tests.rl.conftest import random_observation

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py
SIZE = 16


def load_all(path: Path) -> tuple[MultimodalDataset, TensorDict]:
    data = MultimodalDataset.load([path])
    reader = ImageReader(data.files, data.offsets, size=SIZE, cache_bytes=1 << 20)
    images = torch.empty((len(data), 3, 3, SIZE, SIZE), dtype=torch.uint8)
    reader.read_into(np.arange(len(data)), images)
    reader.close()
    td = TensorDict({**data.lowdim(np.arange(len(data))), "images": images}, batch_size=[len(data)])
    return data, td


@pytest.fixture(scope="module")
def train_test(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[TensorDict, TensorDict, MultimodalDataset]:
    root = tmp_path_factory.mktemp("bc")
    for name, n, seed in (("train", 1500, 0), ("test", 300, 1)):
        write_synth(root / f"{name}.h5", SynthSpec(samples=n, height=24, width=24, seed=seed))
    data, train = load_all(root / "train.h5")
    _, test = load_all(root / "test.h5")
    return train, test, data


def held_out_mse(policy: ImageJointPolicy, test: TensorDict) -> float:
    with torch.no_grad():
        return float(mse_bc_loss(policy, test))


def test_bc_learns_the_known_policy_from_images_and_joint(
    train_test: tuple[TensorDict, TensorDict, MultimodalDataset],
) -> None:
    train, test, data = train_test
    torch.manual_seed(0)
    mean, std = torch.from_numpy(data.action_mean), torch.from_numpy(data.action_std)
    policy = ImageJointPolicy(16, 4, mean, std)
    untrained = held_out_mse(policy, test)

    # Best joint-only linear fit (least squares with bias) on normalised actions.
    def design(td: TensorDict) -> np.ndarray:
        return np.c_[td["joint"].numpy(), np.ones(len(td))]

    target = lambda td: ((td["action"] - mean) / std).numpy()  # noqa: E731
    w, *_ = np.linalg.lstsq(design(train), target(train), rcond=None)
    joint_only = float(((design(test) @ w - target(test)) ** 2).mean())

    optimizer = torch.optim.Adam(policy.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(600):
        batch = train[torch.randint(0, len(train), (64,), generator=g)]
        stats = bc_step(lambda b=batch: mse_bc_loss(policy, b), list(policy.parameters()),
                        optimizer, max_grad_norm=5.0)  # fmt: skip
        assert stats["skipped"] == 0.0
    trained = held_out_mse(policy, test)
    print(f"held-out MSE untrained {untrained:.3f} joint-only {joint_only:.3f} BC {trained:.3f}")
    assert trained < 0.2 * untrained
    assert trained < 0.5 * joint_only  # it reads the cameras, not only the joint
    with torch.no_grad():
        raw = policy.act(test["images"], test["joint"])
    assert float(((raw - test["action"]) ** 2).mean()) < 0.2 * float(test["action"].var(0).mean())


def test_beta_bc_pulls_navrl_actions_towards_recorded_ones() -> None:
    torch.manual_seed(0)
    policy = NavRLPolicy()
    g = torch.Generator().manual_seed(1)
    td = TensorDict({"agents": {"observation": random_observation((256,), g)}}, batch_size=[256])
    # Recorded actions: a fixed function of the state, inside (0, 1)³.
    recorded = torch.sigmoid(td["agents", "observation", "state"][:, :3])
    td["agents", "action_normalized"] = recorded

    def mean_error() -> float:
        with torch.no_grad():
            return float((policy.distribution(policy.observe(td)).mean - recorded).abs().mean())

    before_err = mean_error()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    key = ("agents", "action_normalized")
    first = bc_step(
        lambda: beta_bc_loss(policy, td, key), list(policy.parameters()), optimizer, 5.0
    )
    for _ in range(150):
        last = bc_step(
            lambda: beta_bc_loss(policy, td, key), list(policy.parameters()), optimizer, 5.0
        )
    assert last["bc_loss"] < first["bc_loss"] - 1.0
    assert mean_error() < 0.5 * before_err


def test_non_finite_loss_skips_the_step() -> None:
    layer = torch.nn.Linear(2, 1)
    before = layer.weight.detach().clone()
    optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    stats = bc_step(lambda: layer(torch.tensor([[float("nan"), 1.0]])).sum(),
                    list(layer.parameters()), optimizer, 1.0)  # fmt: skip
    assert stats["skipped"] == 1.0 and torch.equal(layer.weight, before)


def test_ppo_update_adds_and_reports_aux_terms() -> None:
    """`aux_loss` terms join the PPO loss of every minibatch and come back by name: a
    constant term changes no weight, one with a gradient does."""
    import copy

    from navrl_daemon.config import load_config
    from navrl_daemon.rl import ppo
    from navrl_daemon.rl.training import Training
    from tests.conftest import TINY

    training = Training.build(load_config(None, TINY), "cpu")
    training.collector.collect(training.buffer)
    cfg = training.cfg.ppo

    def updated(aux) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        policy = copy.deepcopy(training.policy)
        optimizers = ppo.make_optimizers(policy, cfg)
        g = torch.Generator().manual_seed(0)
        stats = ppo.update(policy, optimizers, training.buffer, cfg, g, aux_loss=aux)
        return policy.state_dict(), stats

    plain, plain_stats = updated(None)
    same, stats = updated(lambda p, mb: {"bc_loss": torch.tensor(2.5)})
    assert "bc_loss" not in plain_stats and stats["bc_loss"] == 2.5
    assert all(torch.equal(plain[k], same[k]) for k in plain)
    pulled, _ = updated(
        lambda p, mb: {"bc_loss": 10.0 * p.beta_head.alpha_layer.bias.square().sum()}
    )
    key = "actor.module.0.module.alpha_layer.bias"
    assert not torch.equal(plain[key], pulled[key])


def test_bc_learner_state_round_trip_continues_identically(
    train_test: tuple[TensorDict, TensorDict, MultimodalDataset],
) -> None:
    """What a checkpoint holds of a BC learner (policy, Adam, steps) continues bit for bit."""
    from navrl_daemon.offline.bc import BCLearner

    train, _, data = train_test
    mean, std = torch.from_numpy(data.action_mean), torch.from_numpy(data.action_std)

    def learner() -> BCLearner:
        torch.manual_seed(0)
        policy = ImageJointPolicy(16, 4, mean, std)
        return BCLearner.build("image_joint", policy, lr=2e-3, max_grad_norm=5.0,
                               max_nonfinite=3, device=torch.device("cpu"))  # fmt: skip

    batches = [train[i * 32 : (i + 1) * 32] for i in range(6)]
    a, b = learner(), learner()
    for batch in batches[:3]:
        a.step(batch)
    b.load(copy_state(a.state()))
    for batch in batches[3:]:
        a.step(batch)
        b.step(batch)
    assert a.steps == b.steps == 6
    sa, sb = a.policy.state_dict(), b.policy.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    with pytest.raises(ValueError, match="navigation"):
        a.load({**a.state(), "offline": {**a.state()["offline"], "kind": "navigation"}})


def copy_state(state: object) -> object:
    """A deep copy through torch.save, as a checkpoint round trip makes it."""
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)
