"""How far a run got, said once: the lines a stop logs (each stage's last, the final
checkpoint, the export, `stopped`) and the end summary name the same iteration, the
newest checkpoint's, however often history rows are written."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from navrl_daemon.commands.run_summary import render, run_summary
from navrl_daemon.config import load_config
from navrl_daemon.storage.history import HISTORY_FILE
from navrl_daemon.testing.daemon_process import Daemon
from tests.conftest import TINY, navrl_cli


def test_every_line_of_a_stop_names_the_same_last_iteration(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "run.total_frames=100000000", "log.summary_interval=4")
    d.wait_for("updating", count=7)
    d.proc.send_signal(signal.SIGINT)
    code, _ = d.finish()
    assert code == 0, d.events[-5:]
    trained = d.names().count("updating")
    of = {e["event"]: e for e in d.events}
    finished = {e["finished_stage"]: e for e in d.events if e["event"] == "stage finished"}
    final = [e for e in d.events if e["event"] == "checkpoint written" and e["final"]]
    said = {
        "producer's last": finished["producer"]["iteration"],
        "trainer's last": finished["trainer"]["iteration"],
        "final checkpoint": final[-1]["iteration"],
        "policy exported": of["policy exported"]["iteration"],
        "stopped": of["stopped"].get("iteration"),
        "run summary": of["run summary"]["iteration"],
    }
    assert set(said.values()) == {trained}, said
    assert of["stopped"].get("frames") == of["run summary"]["frames"] == final[-1]["frames"]


def test_the_summary_says_the_newest_checkpoint_when_history_lags(tmp_path: Path) -> None:
    """History rows behind the checkpoints (rows are written every log.summary_interval,
    and a row may fail to be written): the summary still says where training got to."""
    state = tmp_path / "state"
    args = [*TINY, "checkpoint.interval=2", "eval.interval=0", "run.total_frames=640"]
    proc = navrl_cli("run", "--state-dir", str(state), *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    history = state / HISTORY_FILE
    first_row = history.read_text().splitlines()[0]
    assert json.loads(first_row)["iteration"] == 1
    history.write_text(first_row + "\n")  # the later rows never made it
    doc = run_summary(load_config(None, args), state)
    assert (doc["iteration"], doc["frames"]) == (10, 640)
    assert doc["outcome"] == "finished run.total_frames"
    assert "at iteration 10 (640 of 640 frames)" in render(doc)
    for ckpt in (state / "checkpoints").glob("ckpt-*.nrc"):
        ckpt.unlink()
    doc = run_summary(load_config(None, args), state)
    assert doc[
        "iteration"
    ] is None and "run stopped before run.total_frames with no checkpoint" in render(doc)
