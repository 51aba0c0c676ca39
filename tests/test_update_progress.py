"""Progress inside a long update: the learner reports its minibatch steps as they are
done, on every update path, and the progress log shows them (the bar on a terminal; a
log line every `log.summary_seconds` off one)."""

from __future__ import annotations

import time

import pytest
import structlog

from navrl_daemon.config import load_config
from navrl_daemon.ops.progress import ProgressLog
from navrl_daemon.rl.training import Training
from tests.conftest import TINY


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("path", ["eager", "fused"])
def test_the_update_reports_each_minibatch_step(path: str) -> None:
    cfg = load_config(None, [*TINY, "ppo.epochs=2", f"ppo.update_path={path}"], environ={})
    training = Training.build(cfg, "cpu")
    training.collector.collect(training.buffer)
    seen: list[tuple[int, int]] = []
    training.learner.update(training.buffer, progress=lambda *done: seen.append(done))
    assert seen == [(n, 8) for n in range(1, 9)]  # 2 epochs x 4 minibatches


def test_a_long_update_logs_its_steps_off_a_terminal() -> None:
    progress = ProgressLog(summary_interval=10, total_frames=64, device="cpu", summary_seconds=0.05)
    progress.phase("update", True)
    progress.phase_progress("update", 3, 16)
    with structlog.testing.capture_logs() as logs:
        progress.tick()  # too soon: nothing
        time.sleep(0.1)
        progress.tick()
    (line,) = [e for e in logs if e["event"] == "update in progress"]
    assert (line["done"], line["total"]) == (3, 16)
    progress.phase("update", False)
    time.sleep(0.1)
    with structlog.testing.capture_logs() as logs:
        progress.tick()  # the update ended: nothing more
    assert not logs
