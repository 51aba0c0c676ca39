"""The progress summary: means over a window that holds a rolled-back iteration."""

from __future__ import annotations

import torch

from navrl_daemon.ops.progress import IterationRecord, ProgressLog


def record(iteration: int, losses: dict[str, float], rolled_back: bool = False) -> IterationRecord:
    from navrl_daemon.rl.rollout import EPISODE_KEYS

    episodes = (
        torch.zeros(len(EPISODE_KEYS), dtype=torch.float64),
        torch.zeros((), dtype=torch.float64),
    )
    return IterationRecord(
        iteration, 64 * iteration, 0, 0.1, 0.2, losses, episodes, rolled_back=rolled_back
    )


def test_a_rolled_back_iteration_in_the_window_does_not_break_the_means() -> None:
    summaries: list[dict] = []
    progress = ProgressLog(
        summary_interval=3, total_frames=10_000, device="cpu", on_summary=summaries.append
    )
    try:
        progress(record(1, {"actor_loss": 1.0, "lr": 5e-4}))
        progress(record(2, {"rolled_back": 1.0}, rolled_back=True))
        progress(record(3, {"actor_loss": 3.0, "lr": 4.5e-5}))
    finally:
        progress.close()
    (summary,) = summaries
    assert summary["actor_loss"] == 2.0
    assert summary["rolled_back"] == 1.0
    assert summary["lr"] == 0.0002725  # small values keep 4 significant digits
