"""N ranks × E envs compute the PPO update of one process with N·E envs (issue #9).

The ranks run as real processes over gloo; the single-process reference runs here on the
concatenated rollout with the minibatches the ranks drew (each rank draws the same
permutation of its own rows, so global minibatch j is rank 0's rows j ∪ rank 1's rows j).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from navrl_daemon.config import load_config
from navrl_daemon.rl import ppo
from navrl_daemon.rl.policy import make_policy
from navrl_daemon.rl.training import Training
from tests.distributed.ranks import free_port, rank_env

OVERRIDES = [
    "env.num_envs=8",
    "env.num_obstacles=20",
    "env.num_dynamic_obstacles=8",
    "env.field_size=10.0",
    "env.max_episode_length=6",  # episodes end inside the rollout: truncation, resets
    "ppo.rollout_length=8",
    "ppo.minibatches=4",
    "ppo.epochs=2",
    "run.device=cpu",
]
WORLD = 2


def _rollout(tmp_path: Path, updates: int) -> dict:
    cfg = load_config(overrides=OVERRIDES, environ={})
    training = Training.build(cfg, "cpu")
    training.collector.collect(training.buffer)
    saved = {
        "overrides": OVERRIDES,
        "policy": {k: v.clone() for k, v in training.policy.state_dict().items()},
        "batch": training.buffer.clone(),
        "seed": 1234,
        "updates": updates,
    }
    torch.save(saved, tmp_path / "batch.pt")
    return saved


def _run_ranks(tmp_path: Path) -> list[dict]:
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.distributed.update_worker", str(tmp_path)],
            env=rank_env(rank, WORLD, port),
        )
        for rank in range(WORLD)
    ]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _reference(saved: dict, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, list[dict]]:
    cfg = load_config(overrides=saved["overrides"], environ={})
    policy = make_policy(cfg, "cpu")
    policy.load_state_dict(saved["policy"])
    batch = saved["batch"]
    rows_per_rank = batch[: batch.shape[0] // WORLD].numel()
    draw = ppo.minibatch_indices

    def global_minibatches(num_rows, num_minibatches, generator, device):  # type: ignore[no-untyped-def]
        local = draw(num_rows // WORLD, num_minibatches, generator, device)
        return torch.cat([local + r * rows_per_rank for r in range(WORLD)], dim=1)

    monkeypatch.setattr(ppo, "minibatch_indices", global_minibatches)
    generator = torch.Generator().manual_seed(saved["seed"])
    optimizers = ppo.make_optimizers(policy, cfg.ppo)
    stats = [
        ppo.update(policy, optimizers, batch, cfg.ppo, generator) for _ in range(saved["updates"])
    ]
    return policy.state_dict(), stats


def test_two_ranks_compute_the_one_process_update(tmp_path: Path, monkeypatch) -> None:
    saved = _rollout(tmp_path, updates=3)
    ranks = _run_ranks(tmp_path)
    expected, expected_stats = _reference(saved, monkeypatch)

    # The ranks never drift: bit-identical weights (and ValueNorm buffers) ...
    for key, value in ranks[0]["policy"].items():
        assert torch.equal(value, ranks[1]["policy"][key]), key
    # ... and when one does (by one ulp, planted after the updates), both ranks say which.
    for r in ranks:
        assert r["diverged"] is not None and "rank(s) [1] differ from rank 0" in r["diverged"]
    # And they are the one-process update, to float tolerance; the weights did move.
    # Summing gradients in another order changes them in the last bits, and Adam turns a
    # last-bit change of a near-zero gradient into a step of up to lr: so a few elements may
    # differ by that much, while all but one in a thousand agree to 2e-6.
    moved = loose = total = 0
    for key, value in expected.items():
        got = ranks[0]["policy"][key]
        torch.testing.assert_close(got, value, rtol=1e-4, atol=1e-4)
        loose += int(((got - value).abs() > 2e-6 + 1e-4 * value.abs()).sum())
        total += value.numel()
        moved += not torch.equal(value, saved["policy"][key])
    assert loose <= total // 1000, f"{loose} of {total} elements differ by more than 2e-6"
    assert moved > len(expected) // 2
    for got, want in zip(ranks[0]["stats"], expected_stats, strict=True):
        assert got["minibatch_updates"] == want["minibatch_updates"] == 8
        for name in ("actor_loss", "critic_loss", "entropy_loss", "actor_grad_norm"):
            assert got[name] == pytest.approx(want[name], rel=1e-4, abs=1e-6), name
