"""A full disk under a real daemon: training never stops, nothing already safe is lost.

The state dir lives on a real small filesystem (an 8 MB tmpfs: `tests/small_disk.py`;
skipped where mounting is not permitted) that fills during the run. A TINY checkpoint is
about 2 MB, so keep_last=5 of them cannot fit.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from navrl_daemon.storage.checkpoint import CheckpointDir, read_header, verify
from navrl_daemon.storage.history import read_jsonl
from navrl_daemon.testing.daemon_process import Daemon, last_trained_is_kept
from navrl_daemon.testing.full_disk import fill
from tests.conftest import TINY, navrl_cli


def events(stderr: str) -> list[dict]:
    return [json.loads(x) for x in stderr.splitlines() if x.startswith("{")]


def test_checkpoints_make_room_when_keep_last_does_not_fit(small_disk) -> None:
    """Before: once keep_last files no longer fitted, every write failed for good (and a
    restart went back to the same old iteration). Now older checkpoints go first."""
    state = small_disk("8m") / "state"
    proc = navrl_cli(
        "run",
        "--state-dir",
        str(state),
        *TINY,
        "run.total_frames=640",  # 10 iterations
        "checkpoint.interval=1",
        "checkpoint.keep_last=5",
        "eval.interval=2",
        timeout=1800,  # ten iterations and five evaluations on a busy 2-core machine
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = events(proc.stderr)
    assert not [e for e in log if e["event"].startswith("checkpoint write failed")]
    assert any(e["event"].startswith("low disk space") for e in log)
    written = [e["iteration"] for e in log if e["event"] == "checkpoint written"]
    assert written == list(range(1, 11))
    files = CheckpointDir(state / "checkpoints").files()
    assert read_header(files[-1]).iteration == 10
    assert all(why is None for _, why in verify(files))
    evals = read_jsonl(state / "eval" / "results.jsonl")
    assert evals.bad == [] and [r["iteration"] for r in evals.rows] == [1, 2, 4, 6, 8, 10]


def test_evaluation_results_wait_for_space_and_training_goes_on(small_disk) -> None:
    """Before: ENOSPC on results.jsonl stopped the daemon (exit 1) and tore the file."""
    disk = small_disk("8m")
    state = disk / "state"
    d = Daemon(
        state,
        "run.total_frames=100000000",
        "checkpoint.interval=100000",  # only the final checkpoint: nothing makes room
        "eval.interval=1",
        "log.summary_interval=1",
    )
    try:
        d.wait_for("evaluation", count=2)
        filler = fill(disk)
        d.wait_for("evaluation result not written: kept, retried with the next one", count=2)
        failed_at = len(d.events)
        filler.unlink()
        d.wait_for("evaluation", count=2)  # the next one writes every waiting row too
        d.proc.send_signal(signal.SIGTERM)
        code, _ = d.finish()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    assert code == 0, d.events[-5:]
    evaluated = [e["iteration"] for e in d.events if e["event"] == "evaluation"]
    progress = [e["iteration"] for e in d.events[failed_at:] if e["event"] == "progress"]
    assert progress, "training stopped while the disk was full"
    rows = read_jsonl(state / "eval" / "results.jsonl")
    assert rows.bad == []
    assert [r["iteration"] for r in rows.rows] == evaluated  # every one, once, in order
    history = read_jsonl(state / "history.jsonl")
    assert history.bad == [] and history.rows
    assert last_trained_is_kept(d.events), [e for e in d.events if "iteration" in e][-4:]
    metrics_failed = [e for e in d.events if e["event"].startswith("evaluation result not")]
    assert metrics_failed[-1]["waiting"] >= 1


def test_a_failed_export_on_shutdown_keeps_the_final_checkpoint_and_exits_0(
    tmp_path: Path,
) -> None:
    """Before: a failed export (disk full, here a directory in its place) made the daemon
    exit 1. The final checkpoint is written first and the export is a copy of its policy."""
    state = tmp_path / "state"
    (state / "export" / "policy.pt").mkdir(parents=True)
    proc = navrl_cli("run", "--state-dir", str(state), *TINY, "run.total_frames=192", timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = events(proc.stderr)
    failed = [e for e in log if e["event"].startswith("policy export failed")]
    assert len(failed) == 1 and failed[0]["iteration"] == 3
    final = CheckpointDir(state / "checkpoints").files()[-1]
    assert read_header(final).iteration == 3 and verify([final]) == [(final, None)]
    assert failed[0]["checkpoint"] == str(final)  # what the log says holds the policy
    again = navrl_cli(
        "checkpoints", "export", "--state-dir", str(state), "--out", str(tmp_path / "p.pt")
    )
    assert again.returncode == 0, again.stderr
