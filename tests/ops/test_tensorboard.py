"""TensorBoard event files, read back with TensorBoard's own reader: the tags and values of
the rows written, and a resumed run's points replacing the earlier run's from its
checkpoint on. (That a real run's files hold exactly `history.jsonl`'s scalars is checked
in tests/test_cli_first_hour.py, on a real run.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from navrl_daemon.ops.tensorboard import TensorBoardLog, history_tag, scalars

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
event_file_writer = pytest.importorskip("tensorboard.summary.writer.event_file_writer")


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag → [(step, value)] as TensorBoard shows them (purged points dropped)."""
    acc = event_accumulator.EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def row(iteration: int, value: float) -> dict:
    return {
        "iteration": iteration,
        "iterations": 1,
        "frames": 64 * iteration,
        "time": 1.8e9 + iteration,
        "frames_per_second": 100.0 + value,
        "busy": {"producer": 0.25, "trainer": 0.5},
        "train_reach_goal": value,
        "actor_loss": -value,
        "checkpoint_age_s": None,  # not a number: no point
        "resumed_from": None,
    }


def test_tags_group_history_keys_and_skip_step_and_time() -> None:
    assert history_tag("train_reach_goal") == "train/reach_goal"
    assert history_tag("critic_loss") == "loss/critic_loss"
    assert history_tag("busy_trainer") == "throughput/busy_trainer"
    assert history_tag("checkpoint_stall_s") == "checkpoint/stall_s"
    assert history_tag("iterations") == "run/iterations"
    assert history_tag("frames") is None and history_tag("time") is None
    assert scalars({"busy": {"producer": 0.5}, "ok": True, "n": 2})["busy_producer"] == 0.5


def test_rows_read_back_and_a_resume_replaces_the_points_after_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    board = TensorBoardLog(tmp_path)
    for i in range(1, 7):
        board.history_row(row(i, 0.1 * i))
    board.evaluation({"iteration": 4, "frames": 256, "time": 1.8e9, "reach_goal": 0.5})
    board.close()
    first = read_scalars(tmp_path)
    assert first["train/reach_goal"] == [(64 * i, pytest.approx(0.1 * i)) for i in range(1, 7)]
    assert first["throughput/busy_trainer"][0] == (64, 0.5)
    assert first["eval/reach_goal"] == [(256, 0.5)]
    assert "checkpoint/age_s" not in first

    # Resumed from the checkpoint of iteration 4: iterations 5.. are trained again. TensorBoard
    # reads a directory's files in name order: the second a file was opened, then the host,
    # the pid and a counter (as text, so "10" sorts before "9"). A resumed daemon opens its
    # file seconds after the run it resumes; so does this writer, not in the same second.
    with monkeypatch.context() as later:
        opened = time.time() + 2.0
        later.setattr(event_file_writer.time, "time", lambda: opened)
        again = TensorBoardLog(tmp_path, resumed_at_frames=256)
    assert sorted(tmp_path.iterdir())[-1].name.startswith(f"events.out.tfevents.{int(opened)}.")
    for i in range(5, 9):
        again.history_row(row(i, 0.9))
    again.close()
    points = read_scalars(tmp_path)["train/reach_goal"]
    assert [step for step, _ in points] == [64 * i for i in range(1, 9)]  # no step twice
    assert [v for _, v in points[4:]] == [pytest.approx(0.9)] * 4


class _BrokenWriter:
    """A SummaryWriter whose writer thread died (its directory removed, a full disk)."""

    def __init__(self) -> None:
        self.calls = 0

    def add_scalar(self, *args: object, **kwargs: object) -> None:
        self.calls += 1
        raise FileNotFoundError("events.out.tfevents: No such file or directory")

    def close(self) -> None:
        raise AssertionError("close after a failure must not reach the dead writer")


def test_a_failing_writer_is_logged_once_and_turned_off(tmp_path: Path, capsys) -> None:
    board = TensorBoardLog(tmp_path / "tb")
    board.writer.close()
    broken = _BrokenWriter()
    board.writer = broken  # type: ignore[assignment]
    row = {"frames": 64, "iteration": 1, "time": 1.0, "train_reach_goal": 0.5, "entropy": 0.1}
    for _ in range(3):
        board.history_row(row)  # never raises: training must not notice
    board.evaluation({"frames": 64, "iteration": 1, "reach_goal": 0.25})
    board.close()
    assert board.failed is not None and "FileNotFoundError" in board.failed
    assert broken.calls == 1  # off after the first failure


def test_an_exception_that_ends_a_thread_is_one_json_log_line() -> None:
    import io
    import json
    import threading

    from navrl_daemon.config import LogConfig
    from navrl_daemon.ops.logging import configure_logging

    stream = io.StringIO()
    saved = threading.excepthook
    try:
        configure_logging(LogConfig(format="json"), stream=stream)

        def boom() -> None:
            raise OSError("the writer's directory is gone")

        t = threading.Thread(target=boom, name="writer")
        t.start()
        t.join()
    finally:
        threading.excepthook = saved
    lines = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert len(lines) == 1
    assert lines[0]["event"] == "uncaught exception in a thread"
    assert lines[0]["thread"] == "writer"
    assert "the writer's directory is gone" in lines[0]["exception"]
