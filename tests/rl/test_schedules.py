"""Learning-rate and entropy schedules: values against a plain reference, NavRL's constant
setting bit for bit as before, the learner's optimisers over updates, and exact resume."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from navrl_daemon.config import Config, load_config
from navrl_daemon.errors import ConfigError
from navrl_daemon.rl import ppo, schedules
from navrl_daemon.rl.learner import Learner
from navrl_daemon.rl.policy import NavRLPolicy
from tests.conftest import navrl_cli
from tests.test_resume import exported
from tests.test_resume import run as run_daemon

NUM_ENVS, STEPS = 8, 8  # 64 frames per update
SPAN = 256  # frames: the schedules end after 4 updates
LINEAR = [
    'ppo.lr_schedule="linear"',
    'ppo.entropy_schedule="linear"',
    f"ppo.schedule_frames={SPAN}",
]


def config(*extra: str) -> Config:
    base = [f"env.num_envs={NUM_ENVS}", f"ppo.rollout_length={STEPS}", "ppo.epochs=1"]
    return load_config(None, [*base, "ppo.minibatches=4", *extra], environ={})


def params(policy: NavRLPolicy) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def lrs(learner: Learner) -> dict[str, float]:
    return {name: opt.param_groups[0]["lr"] for name, opt in learner.optimizers.items()}


@pytest.fixture
def start() -> NavRLPolicy:
    torch.manual_seed(0)
    return NavRLPolicy()


@pytest.fixture
def batch(start: NavRLPolicy, make_batch: Callable[..., TensorDict]) -> TensorDict:
    return make_batch(start, NUM_ENVS, STEPS, seed=1)


def trained(cfg: Config, start: NavRLPolicy, batch: TensorDict, updates: int) -> Learner:
    learner = Learner.build(cfg, copy.deepcopy(start), "cpu")
    for _ in range(updates):
        learner.update(batch)
    return learner


# ---------------------------------------------------------------------------- the maths


@pytest.mark.parametrize(
    ("frames", "done"),
    [(0, 0.0), (SPAN // 2, 0.5), (SPAN, 1.0), (3 * SPAN, 1.0)],
    ids=["start", "half", "end", "past-end"],
)
def test_linear_values_at_start_half_end_and_past_end(frames: int, done: float) -> None:
    ppo_cfg = config(*LINEAR, "ppo.lr_final_fraction=0.2", "ppo.entropy_coef_final=1e-4").ppo
    assert schedules.progress(frames, SPAN) == done
    # Plain reference: lr·(1 − (1 − f)·p) and c0 + (c1 − c0)·p.
    assert schedules.lr_scale(ppo_cfg, frames, SPAN) == pytest.approx(1.0 - 0.8 * done)
    want = 1e-3 + (1e-4 - 1e-3) * done
    assert schedules.entropy_coef(ppo_cfg, frames, SPAN) == pytest.approx(want)


@pytest.mark.parametrize("frames", [0, 100, SPAN, 10**9])
def test_constant_is_navrls_numbers_at_any_frame(frames: int) -> None:
    ppo_cfg = config().ppo
    assert schedules.lr_scale(ppo_cfg, frames, SPAN) == 1.0
    assert schedules.entropy_coef(ppo_cfg, frames, SPAN) == ppo_cfg.entropy_coef == 1e-3


def test_a_schedule_needs_a_span() -> None:
    with pytest.raises(ValueError, match="span"):
        schedules.progress(10, 0)


# ---------------------------------------------------------------------------- the learner


def test_default_update_is_bitwise_the_plain_ppo_update(
    start: NavRLPolicy, batch: TensorDict, one_torch_thread: None
) -> None:
    """NavRL's constant schedules: exactly what Learner.update did before schedules."""
    cfg = config()
    learner = trained(cfg, start, batch, updates=2)

    policy = copy.deepcopy(start)
    optimizers = ppo.make_optimizers(policy, cfg.ppo)
    generator = torch.Generator().manual_seed(cfg.run.seed)
    for _ in range(2):
        ppo.update(policy, optimizers, batch, cfg.ppo, generator)
    assert same(params(learner.policy), params(policy))
    assert lrs(learner) == ppo.learning_rates(cfg.ppo)


def test_linear_schedules_that_end_where_they_start_change_nothing(
    start: NavRLPolicy, batch: TensorDict, one_torch_thread: None
) -> None:
    flat = [*LINEAR, "ppo.lr_final_fraction=1.0", "ppo.entropy_coef_final=1e-3"]
    constant = trained(config(), start, batch, updates=2)
    linear = trained(config(*flat), start, batch, updates=2)
    assert same(params(constant.policy), params(linear.policy))
    decayed = trained(config(*LINEAR), start, batch, updates=2)  # the check can tell
    assert not same(params(constant.policy), params(decayed.policy))


def test_linear_lr_and_entropy_follow_the_schedule_update_by_update(
    start: NavRLPolicy, batch: TensorDict, one_torch_thread: None
) -> None:
    cfg = config(*LINEAR, "ppo.actor_lr=2e-4", "ppo.feature_extractor_lr=1e-3")
    learner = Learner.build(cfg, copy.deepcopy(start), "cpu")
    for update in range(6):  # past the end (4 updates) the values hold
        losses = learner.update(batch)
        done = min(1.0, update * NUM_ENVS * STEPS / SPAN)  # frames trained before it
        scale = 1.0 - 0.9 * done
        assert lrs(learner) == pytest.approx(
            {"feature_extractor": 1e-3 * scale, "actor": 2e-4 * scale, "critic": 2e-4 * scale}
        )
        assert losses["lr"] == pytest.approx(2e-4 * scale)
        assert losses["entropy_coef"] == pytest.approx(1e-3 * (1.0 - done))
    assert learner.trained_frames == 6 * NUM_ENVS * STEPS


def test_default_losses_report_navrls_lr_and_entropy_coef(
    start: NavRLPolicy, batch: TensorDict, one_torch_thread: None
) -> None:
    losses = Learner.build(config(), copy.deepcopy(start), "cpu").update(batch)
    assert losses["lr"] == 5e-4 and losses["entropy_coef"] == 1e-3


def test_a_learner_restored_from_a_snapshot_continues_the_schedule_exactly(
    start: NavRLPolicy, batch: TensorDict, one_torch_thread: None
) -> None:
    cfg = config(*LINEAR)
    original = trained(cfg, start, batch, updates=2)
    saved = copy.deepcopy(original.state_dict())

    resumed = Learner.build(cfg, copy.deepcopy(start), "cpu")
    resumed.load_state_dict(saved)
    assert resumed.apply_schedules() == original.apply_schedules()
    assert lrs(resumed) == lrs(original)
    for _ in range(2):
        assert original.update(batch) == resumed.update(batch)
    assert same(params(original.policy), params(resumed.policy))


# ---------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ('ppo.lr_schedule="cosine"', "ppo.lr_schedule"),
        ("ppo.lr_final_fraction=1.5", "ppo.lr_final_fraction"),
        ("ppo.lr_final_fraction=-0.1", "ppo.lr_final_fraction"),
        ('ppo.entropy_schedule="exp"', "ppo.entropy_schedule"),
        ("ppo.entropy_coef_final=2.0", "ppo.entropy_coef_final"),
        ("ppo.schedule_frames=0", "ppo.schedule_frames"),
        ("ppo.schedule_frames=1.5", "ppo.schedule_frames"),
    ],
)
def test_bad_schedule_setting_is_a_config_error(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config(None, [override], environ={})


def test_cli_refuses_a_bad_schedule_with_exit_78() -> None:
    proc = navrl_cli("config", "show", "ppo.lr_final_fraction=2")
    assert proc.returncode == 78, proc.stderr
    assert "ppo.lr_final_fraction" in proc.stderr


def test_daemon_resumed_mid_schedule_ends_bitwise_where_one_run_does(tmp_path: Path) -> None:
    """The real `run`: a crash at iteration 9 of 15 under both linear schedules, resumed
    from iteration 8's checkpoint, exports the same policy as one uninterrupted run."""
    linear = [k for k in LINEAR if not k.startswith("ppo.schedule_frames")]
    common = (*linear, "ppo.schedule_frames=640", "checkpoint.interval=2")  # TINY: 64/it.
    run_daemon(tmp_path / "a", *common, "run.total_frames=640")
    (tmp_path / "a" / "checkpoints" / "ckpt-000000010.nrc").unlink()  # as if killed at 9
    resumed = run_daemon(tmp_path / "a", *common, "run.total_frames=960")
    start = next(e for e in resumed if e["event"] == "resumed from checkpoint")
    assert start["iteration"] == 8
    run_daemon(tmp_path / "b", *common, "run.total_frames=960")
    a, b = exported(tmp_path / "a"), exported(tmp_path / "b")
    assert same(a, b)


# ---------------------------------------------------------------------------- kl_adaptive

KL = ['ppo.lr_schedule="kl_adaptive"']


@pytest.mark.parametrize(
    ("kl", "want"),
    [(0.05, 1e-3 / 1.5), (0.02, 1e-3), (0.01, 1e-3), (0.005, 1e-3), (0.001, 1.5e-3)],
    ids=["far", "edge-above", "on-target", "edge-below", "near"],
)
def test_kl_adaptive_rule_against_rsl_rls(kl: float, want: float) -> None:
    """÷1.5 above 2·desired_kl, ×1.5 below desired_kl/2 (strictly), else unchanged."""
    ppo_cfg = config(*KL, "ppo.desired_kl=0.01", "ppo.actor_lr=1e-3").ppo
    assert schedules.kl_adapted_lr(ppo_cfg, 1e-3, kl) == pytest.approx(want)


def test_kl_adaptive_stays_within_its_bounds_and_ignores_a_nan() -> None:
    ppo_cfg = config(*KL, "ppo.lr_min=1e-4", "ppo.lr_max=2e-3", "ppo.actor_lr=1e-3").ppo
    assert schedules.kl_adapted_lr(ppo_cfg, 1.9e-3, 0.0) == 2e-3
    assert schedules.kl_adapted_lr(ppo_cfg, 1.2e-4, 1.0) == 1e-4
    assert schedules.kl_adapted_lr(ppo_cfg, 1e-3, float("nan")) == 1e-3


def test_approx_kl_is_zero_before_an_update_and_positive_after(
    start: NavRLPolicy, batch: TensorDict, one_torch_thread: None
) -> None:
    assert ppo.approx_kl(start, batch, 16).abs() < 1e-5  # the rollout's own policy
    moved = trained(config(), start, batch, updates=1).policy
    kl = ppo.approx_kl(moved, batch, 64)
    # The plain k3 estimate on every frame of the batch.
    flat = batch.reshape(-1)
    with torch.no_grad():
        logp = moved.distribution(moved.observe(flat)).log_prob(
            flat.get(("agents", "action_normalized"))
        )
    log_ratio = logp - flat.get("sample_log_prob")
    want = float(((log_ratio.exp() - 1) - log_ratio).mean())
    assert float(kl) > 0 and float(kl) == pytest.approx(want, rel=1e-5)


def test_the_learner_scales_every_lr_by_the_kl_rule_and_reports_the_kl(
    start: NavRLPolicy, batch: TensorDict, one_torch_thread: None
) -> None:
    """Every optimiser's lr moves by the same factor, keeping their ratios; a huge
    desired_kl makes every update "too small", so the rates grow ×1.5 per update."""
    cfg = config(*KL, "ppo.desired_kl=1.0", "ppo.actor_lr=2e-4", "ppo.feature_extractor_lr=1e-3")
    learner = Learner.build(cfg, copy.deepcopy(start), "cpu")
    for update in range(3):
        losses = learner.update(batch)
        assert losses["lr"] == pytest.approx(2e-4 * 1.5**update)  # the rate this update used
        assert 0.0 <= losses["approx_kl"] < 0.5
        scale = 1.5 ** (update + 1)
        assert lrs(learner) == pytest.approx(
            {"feature_extractor": 1e-3 * scale, "actor": 2e-4 * scale, "critic": 2e-4 * scale}
        )


def test_a_learner_restored_from_a_snapshot_keeps_its_adapted_rates(
    start: NavRLPolicy, batch: TensorDict, one_torch_thread: None
) -> None:
    cfg = config(*KL, "ppo.desired_kl=1.0")
    original = trained(cfg, start, batch, updates=2)
    resumed = Learner.build(cfg, copy.deepcopy(start), "cpu")
    resumed.load_state_dict(copy.deepcopy(original.state_dict()))
    assert lrs(resumed) == lrs(original) != ppo.learning_rates(cfg.ppo)
    for _ in range(2):
        assert original.update(batch) == resumed.update(batch)
    assert same(params(original.policy), params(resumed.policy))


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ([*KL, "ppo.desired_kl=0"], "ppo.desired_kl"),
        ([*KL, "ppo.lr_min=0"], "ppo.lr_min"),
        ([*KL, "ppo.actor_lr=0.1"], "ppo.actor_lr: the kl_adaptive schedule starts from it"),
        ([*KL, "pipeline.compress_rollouts=true"], "ppo.lr_schedule"),
    ],
)
def test_cli_refuses_a_bad_kl_adaptive_setting_with_exit_78(
    overrides: list[str], needle: str
) -> None:
    proc = navrl_cli("config", "show", *overrides)
    assert proc.returncode == 78, proc.stderr
    assert needle in proc.stderr


def test_daemon_resumed_under_kl_adaptive_ends_bitwise_where_one_run_does(
    tmp_path: Path,
) -> None:
    common = (*KL, "checkpoint.interval=2")
    run_daemon(tmp_path / "a", *common, "run.total_frames=640")
    (tmp_path / "a" / "checkpoints" / "ckpt-000000010.nrc").unlink()  # as if killed at 9
    resumed = run_daemon(tmp_path / "a", *common, "run.total_frames=960")
    assert any(e.get("approx_kl") is not None for e in resumed if e["event"] == "progress")
    run_daemon(tmp_path / "b", *common, "run.total_frames=960")
    assert same(exported(tmp_path / "a"), exported(tmp_path / "b"))
