"""A loss term added in the loss alone reaches every sink: Prometheus, the console's
summary block, history.jsonl, TensorBoard, W&B (the same tags as TensorBoard) and the
report, through a real update and the daemon's real telemetry (ops/statistics.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from prometheus_client import generate_latest

from navrl_daemon.analysis import report
from navrl_daemon.config import load_config
from navrl_daemon.ops.console import progress_table
from navrl_daemon.ops.progress import IterationRecord
from navrl_daemon.ops.tensorboard import history_scalars
from navrl_daemon.pipeline.telemetry import Telemetry
from navrl_daemon.rl import ppo
from navrl_daemon.rl.rollout import EPISODE_KEYS
from navrl_daemon.rl.training import Training
from tests.conftest import TINY


@pytest.mark.usefixtures("one_torch_thread")
def test_a_loss_term_added_in_the_loss_alone_reaches_every_sink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tensor_losses = ppo.tensor_losses

    def with_probe(policy, *inputs):  # type: ignore[no-untyped-def]
        terms, value, measured = tensor_losses(policy, *inputs)
        return {**terms, "probe_loss": 0.0 * terms["actor_loss"]}, value, measured

    monkeypatch.setattr(ppo, "tensor_losses", with_probe)  # the one place it is added
    cfg = load_config(None, [*TINY, "log.tensorboard=true"], environ={})
    result = Training.build(cfg, "cpu").step()
    assert result.losses["probe_loss"] == 0.0
    assert "policy_entropy" in result.losses and "entropy_loss" in result.losses

    telemetry = Telemetry(cfg, torch.device("cpu"))
    telemetry.run_starts(tmp_path, 0, 0)
    episodes = (torch.zeros(len(EPISODE_KEYS), dtype=torch.float64), torch.zeros(()))
    record = IterationRecord(1, result.frames, 0, 0.1, 0.2, result.losses, episodes)
    telemetry.iteration(record)
    telemetry.close()

    scraped = generate_latest(telemetry.metrics.registry).decode()
    assert 'navrl_loss{term="probe"} 0.0' in scraped
    assert 'navrl_update_statistic{name="policy_entropy"}' in scraped
    (row,) = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert row["probe_loss"] == 0.0 and "policy_entropy" in row
    assert "probe 0" in progress_table(row).split("losses", 1)[1].splitlines()[0]
    assert "policy_entropy" in progress_table(row)
    assert "loss/probe_loss" in history_scalars(row)  # TensorBoard's tags and W&B's
    events = b"".join(p.read_bytes() for p in (tmp_path / "tensorboard").rglob("events.*"))
    assert b"loss/probe_loss" in events and b"loss/policy_entropy" in events

    titles: list[str] = []

    def curves(panels, **_):  # type: ignore[no-untyped-def]
        titles.extend(panel.title for panel in panels)
        return b""

    monkeypatch.setattr(report, "curves_plot", curves)
    report.learning_curves([row], [])
    assert "probe loss" in titles and "policy_entropy" in titles
