"""history.jsonl: the reader and the cut on resume (real files), and the daemon's history
across SIGTERM + resume and kill -9 + resume (real subprocesses)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from navrl_daemon.storage.history import HistoryFile, cut_rows, read_jsonl
from navrl_daemon.testing.daemon_process import Daemon


def rows_text(*iterations: int) -> str:
    return "".join(json.dumps({"iteration": i, "frames": 64 * i}) + "\n" for i in iterations)


def test_read_jsonl_names_bad_lines_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(
        rows_text(1)
        + '{"iteration": 2, "fra\n'  # torn
        + "[1, 2]\n"  # not an object
        + '{"frames": 5}\n'  # no iteration
        + '{"iteration": "4", "frames": 1}\n'  # not an integer
        + rows_text(6)
        + '{"iteration": 7'  # no newline yet: being written, not corrupt
    )
    got = read_jsonl(path, required=("iteration",))
    assert [r["iteration"] for r in got.rows] == [1, 6]
    assert [(b.line, b.reason) for b in got.bad] == [
        (2, "not JSON (Unterminated string starting at)"),
        (3, "not a JSON object"),
        (4, "missing iteration"),
        (5, "iteration is not an integer"),
    ]
    assert str(got.bad[0]) == f"{path}:2: not JSON (Unterminated string starting at)"
    assert read_jsonl(tmp_path / "absent.jsonl").rows == []


def test_cut_keeps_rows_up_to_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(rows_text(2, 4, 6, 8) + '{"iteration": 10, "fr')  # kill -9 mid-line
    assert cut_rows(path, 5) == 3  # rows 6 and 8, and the torn line
    assert path.read_text() == rows_text(2, 4)
    HistoryFile(path).append({"iteration": 6, "frames": 384})
    assert [r["iteration"] for r in read_jsonl(path).rows] == [2, 4, 6]


def test_cut_leaves_a_consistent_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(rows_text(1, 2, 3))
    inode = path.stat().st_ino
    assert cut_rows(path, 3) == 0
    assert path.stat().st_ino == inode  # not rewritten
    assert cut_rows(tmp_path / "none.jsonl", 0) == 0
    assert not (tmp_path / "none.jsonl").exists()


def history(state: Path) -> list[dict]:
    got = read_jsonl(state / "history.jsonl")
    assert got.bad == []
    return got.rows


def assert_tiles(rows: list[dict]) -> None:
    """Strictly increasing, and each row's window starts where the previous row ended: no
    iteration counted twice, none missing."""
    assert rows, "no history rows"
    ends = [0] + [r["iteration"] for r in rows]
    for prev_end, row in zip(ends, rows, strict=False):
        assert row["iterations"] >= 1
        assert row["iteration"] - row["iterations"] == prev_end, (prev_end, row)
    frames = [r["frames"] for r in rows]
    assert frames == sorted(set(frames))


def test_history_across_sigterm_and_resume(tmp_path: Path) -> None:
    state = tmp_path / "state"
    args = ("log.summary_interval=3", "checkpoint.interval=4", "run.total_frames=100000000")

    first = Daemon(state, *args)
    first.wait_for("progress", 2)
    first.proc.send_signal(signal.SIGTERM)
    code, _ = first.finish()
    assert code == 0, first.events[-5:]
    stopped_at = max(e["iteration"] for e in first.events if e["event"] == "checkpoint written")
    before = history(state)
    # The final (possibly partial) window has its row: the history reaches the checkpoint.
    assert before[-1]["iteration"] == stopped_at
    assert_tiles(before)

    second = Daemon(state, *args)
    second.wait_for("progress", 2)
    second.proc.send_signal(signal.SIGTERM)
    code, _ = second.finish()
    assert code == 0, second.events[-5:]
    resumed = next(e for e in second.events if e["event"] == "resumed from checkpoint")
    assert resumed["iteration"] == stopped_at

    rows = history(state)
    assert rows[: len(before)] == before  # nothing before the resume rewritten
    assert_tiles(rows)
    after = rows[len(before)]
    assert after["resumed_from"] == stopped_at
    assert [r for r in rows if "resumed_from" in r] == [after]
    assert len(rows) >= len(before) + 2


def test_history_after_kill_9_drops_the_rows_being_redone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    args = ("log.summary_interval=1", "checkpoint.interval=5", "run.total_frames=100000000")

    first = Daemon(state, *args)
    first.wait_for("progress", 8)
    first.proc.kill()
    first.proc.wait(timeout=30)
    lines = (state / "history.jsonl").read_text().split("\n")
    written = [json.loads(x)["iteration"] for x in lines[:-1]]  # the last may be torn
    assert written[:7] == list(range(1, 8))

    second = Daemon(state, *args)
    second.wait_for("progress", 2)
    second.proc.send_signal(signal.SIGTERM)
    assert second.finish()[0] == 0
    # The checkpoint of iteration 5, or none if the kill came before it was durable.
    resumed = [e["iteration"] for e in second.events if e["event"] == "resumed from checkpoint"]
    checkpoint = resumed[0] if resumed else 0
    assert checkpoint in (0, 5)
    cut = next(e for e in second.events if e["event"] == "history cut back to the checkpoint")
    redone = [i for i in written if i > checkpoint]
    assert cut["iteration"] == checkpoint
    assert cut["dropped"] == len(redone) + (lines[-1] != "")

    rows = history(state)
    assert [r["iteration"] for r in rows] == list(range(1, rows[-1]["iteration"] + 1))
    assert_tiles(rows)


def test_evaluations_after_kill_9_drop_the_ones_being_redone(tmp_path: Path) -> None:
    """Evaluations of iterations past the checkpoint a run resumes from judged weights
    the crash lost; the resumed run evaluates those iterations anew, so each iteration
    appears once in eval/results.jsonl."""
    state = tmp_path / "state"
    results = state / "eval" / "results.jsonl"
    args = ("eval.interval=1", "checkpoint.interval=5", "run.total_frames=100000000")

    first = Daemon(state, *args)
    first.wait_for("checkpoint written")
    first.wait_for("evaluation", 8)
    first.proc.kill()
    first.proc.wait(timeout=30)
    lines = results.read_text().split("\n")
    written = [json.loads(x)["iteration"] for x in lines[:-1]]  # the last may be torn

    second = Daemon(state, *args)
    second.wait_for("evaluation", 3)
    second.proc.send_signal(signal.SIGTERM)
    assert second.finish()[0] == 0
    [resumed] = [e["iteration"] for e in second.events if e["event"] == "resumed from checkpoint"]
    redone = [i for i in written if i > resumed]
    assert redone, (written, resumed)  # the first run evaluated past its checkpoint
    cut = next(e for e in second.events if e["event"] == "evaluations cut back to the checkpoint")
    assert (cut["iteration"], cut["dropped"]) == (resumed, len(redone) + (lines[-1] != ""))

    rows = [json.loads(x) for x in results.read_text().splitlines()]
    iterations = [r["iteration"] for r in rows]
    assert iterations[: len(written) - len(redone)] == [i for i in written if i <= resumed]
    assert iterations == sorted(set(iterations))  # no iteration twice
    assert iterations[-1] > resumed  # the resumed run's own evaluations follow
