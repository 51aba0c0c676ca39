"""benchmarks/learning.py keeps a sitting whose daemon fails: when the daemon does not stop
cleanly after the budget's SIGTERM (a trainer that misses `run.shutdown_timeout_s`, or one
that ignores the signal), the evaluations on disk still become the JSON, the final policy
is the newest valid checkpoint's (never a stale export of an earlier sitting), and the exit
status says the run failed. Before, the whole sitting's report was lost."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import learning
import pytest
import torch

from navrl_daemon.config import load_config
from navrl_daemon.storage.policy_file import load_any_policy_state
from navrl_daemon.testing.command_line import navrl_cli

REPO = Path(__file__).resolve().parents[2]

NAVRL_FILE = REPO / "tests" / "data" / "navrl_checkpoint.pt"
ROW = {"iteration": 50, "frames": 409600, "reach_goal": 0.25, "collision": 0.75, "return": -9.0}

# A stand-in for `navrl-daemon run`: it writes one evaluation row, then either exits 1 on
# SIGTERM as a daemon whose trainer missed its shutdown timeout does, or ignores SIGTERM.
STAND_IN = """
import json, signal, sys, time
from pathlib import Path
mode, args = sys.argv[1], sys.argv[2:]
state = Path(args[args.index("--state-dir") + 1])
(state / "eval").mkdir(parents=True, exist_ok=True)
row = dict(ROW_VALUE, time=time.time())
(state / "eval" / "results.jsonl").write_text(json.dumps(row) + "\\n")
def stop(*_):
    sys.stderr.write("trainer did not stop within run.shutdown_timeout_s = 60.0\\n")
    sys.stderr.flush()
    sys.exit(1)
def clean(*_):
    (state / "stopped").write_text("SIGTERM")
    sys.exit(0)
handlers = {"fail": stop, "clean": clean, "ignore": signal.SIG_IGN}
if mode in ("hang", "chatty"):  # silent, or a log line every 0.1 s; stacks on SIGUSR2
    import faulthandler
    faulthandler.register(signal.SIGUSR2, file=2, all_threads=True)
    signal.signal(signal.SIGTERM, clean)
else:
    signal.signal(signal.SIGTERM, handlers[mode])
while True:
    time.sleep(0.05 if mode != "chatty" else 0.1)
    if mode == "chatty":
        sys.stderr.write("{}\\n")
        sys.stderr.flush()
""".replace("ROW_VALUE", repr(ROW))


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    script = tmp_path / "daemon.py"
    script.write_text(STAND_IN)

    def use(mode: str) -> None:
        monkeypatch.setattr(learning, "DAEMON", [sys.executable, str(script), mode])

    return use


def test_a_failed_stop_is_reported_not_raised(stand_in, tmp_path: Path) -> None:
    stand_in("fail")
    state = tmp_path / "state"
    budget = learning.train(Path("c.toml"), [], state, 1.0, None, tmp_path / "daemon.log")
    assert budget["ended_by"] == "budget"
    assert budget["exit_code"] == 1
    assert "trainer did not stop within run.shutdown_timeout_s" in budget["error"]
    assert (state / "eval" / "results.jsonl").exists()


def test_a_daemon_that_ignores_sigterm_is_killed_after_the_wait(
    stand_in, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in("ignore")
    monkeypatch.setattr(learning, "STOP_WAIT_S", 1.0)
    budget = learning.train(Path("c.toml"), [], tmp_path / "s", 1.0, None, tmp_path / "d.log")
    assert budget["exit_code"] == -9
    assert budget["error"].startswith("daemon exited with -9")


def test_a_silent_daemon_is_stalled_dumps_its_stacks_and_is_stopped(
    stand_in, tmp_path: Path
) -> None:
    """A daemon whose log stays silent for --stall-s (the 2026-12-04 H200 start-ups that
    never reached their first iteration) ends the sitting well before the budget, with
    its threads' tracebacks in the log and in the error."""
    stand_in("hang")
    state, log = tmp_path / "state", tmp_path / "d.log"
    t0 = time.monotonic()
    budget = learning.train(Path("c.toml"), [], state, 120.0, None, log, stall_s=1.0)
    assert time.monotonic() - t0 < 30
    assert budget["ended_by"] == "stalled"
    assert budget["exit_code"] == 0  # its own clean stop after the dump
    assert (state / "stopped").read_text() == "SIGTERM"
    assert budget["error"].startswith("daemon stalled (log silent for 1 s), exited with 0")
    dump = log.read_text()
    assert "(most recent call first)" in dump and 'daemon.py", line' in dump
    assert dump in budget["error"]


def test_a_daemon_that_keeps_logging_is_not_stalled(stand_in, tmp_path: Path) -> None:
    stand_in("chatty")
    budget = learning.train(
        Path("c.toml"), [], tmp_path / "s", 3.0, None, tmp_path / "d.log", stall_s=1.0
    )
    assert budget["ended_by"] == "budget" and "error" not in budget


def test_a_stop_wait_of_its_own_bounds_the_wait_for_a_hung_daemon(stand_in, tmp_path: Path) -> None:
    stand_in("ignore")
    t0 = time.monotonic()
    budget = learning.train(
        Path("c.toml"), [], tmp_path / "s", 1.0, None, tmp_path / "d.log", stop_wait_s=1.0
    )
    assert budget["exit_code"] == -9 and time.monotonic() - t0 < 30


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_script_stops_its_daemon_and_ends_the_sitting(
    stand_in, tmp_path: Path, signum: int
) -> None:
    """SIGTERM or Ctrl-C to learning.py ends the sitting as the budget would: the daemon
    gets its SIGTERM and stops cleanly, and the caller gets the result to report. Before,
    the script died and left its daemon training on its own."""
    stand_in("clean")
    state = tmp_path / "state"
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signum))
    timer.start()
    t0 = time.monotonic()
    try:
        budget = learning.train(Path("c.toml"), [], state, 120.0, None, tmp_path / "d.log")
    finally:
        timer.cancel()
    assert budget["ended_by"] == signal.Signals(signum).name
    assert budget["exit_code"] == 0 and "error" not in budget
    assert (state / "stopped").read_text() == "SIGTERM"  # the daemon's own clean stop
    assert time.monotonic() - t0 < 60
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_the_sitting_is_written_from_disk_with_the_newest_checkpoints_policy(
    stand_in, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    imported = navrl_cli(
        "checkpoints", "import", "--format", "navrl", str(NAVRL_FILE), "--state-dir", str(state)
    )
    assert imported.returncode == 0, imported.stderr[-2000:]
    # An export of an earlier sitting (here: an all-zero policy) must not be taken as the
    # policy this sitting ended with.
    (state / "export").mkdir()
    stale = {k: v * 0 for k, v in load_any_policy_state(NAVRL_FILE).items()}
    torch.save(stale, state / "export" / "policy.pt")
    stand_in("fail")
    out = tmp_path / "run.json"
    argv = ["learning.py", "--budget-s", "1", "--keep-state", str(state), "--resume"]
    argv += ["--out", str(out), "--navrl-checkpoint", str(NAVRL_FILE)]
    argv += ["--held-out-maps", "2", "--final-drones", "4"]
    argv += ["eval.num_envs=2", "eval.max_steps=20", "run.device=cpu"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stopped:
        learning.main()
    assert "trainer did not stop" in str(stopped.value.code)
    result = json.loads(out.read_text())
    assert result["budget"]["exit_code"] == 1 and "error" in result["budget"]
    assert [(r["frames"], r["reach_goal"]) for r in result["curve"][1:]] == [(409600, 0.25)]
    final = result["final"]
    assert final["source"].endswith(".nrc") and final["iteration"] == 0
    assert final["frames"] == 0
    # The checkpoint holds NavRL's policy: evaluated, it is not the zeroed export's policy.
    cfg = load_config(REPO / "config" / "default.toml", [*argv[-3:], "eval.num_envs=4"], environ={})
    zeroed = learning.evaluate_policy(cfg, stale)
    assert (final["return"], final["episode_len"]) != (zeroed["return"], zeroed["episode_len"])
    # --final-drones: the final evaluations fly 4 drones, the curve's 2 (its first point)
    assert final["episodes"] == 4 and result["held_out"]["final"]["episodes"] == 4
    assert result["held_out"]["untrained"]["episodes"] == 4
    assert (result["eval"]["episodes"], result["eval"]["final_episodes"]) == (2, 4)
    assert out.with_suffix(".png").exists()
    # Issue #23's CPU goal, read off the final export (the curve has no held-out numbers)
    goal = result["frames_goal"]
    assert (goal["bar"], goal["within_frames"], goal["first_eval_at_bar"]) == (0.9, 20e6, None)
    assert goal["final"]["frames"] == 0
    for maps, flown in (("training_maps", final), ("held_out", result["held_out"]["final"])):
        assert goal["final"][maps] == (flown["reach_goal"] >= 0.9 and flown["collision"] <= 0.1)
    assert goal["met"] == (goal["final"]["training_maps"] and goal["final"]["held_out"])
    # The checkpoint's policy is NavRL's: against NavRL's file drone by drone it flies the
    # very same outcomes on both map sets (the final evaluations fly the same drones).
    assert (
        final["outcomes"] == result["navrl_checkpoint"]["outcomes"] and len(final["outcomes"]) == 4
    )
    held = result["held_out"]
    assert held["final"]["outcomes"] == held["navrl_checkpoint"]["outcomes"]
    for maps in ("training_maps", "held_out"):
        for number in ("reach_goal", "collision"):
            paired = result["paired_with_navrl"][maps][number]
            assert (paired["drones"], paired["difference"], paired["p"]) == (4, 0.0, 1.0)
            assert paired["only_a"] == paired["only_b"] == 0


def test_a_clean_sitting_still_uses_the_daemons_export(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "export").mkdir(parents=True)
    shutil.copy(NAVRL_FILE, state / "export" / "policy.pt")
    log = tmp_path / "d.log"
    log.write_text(json.dumps({"event": "policy exported", "iteration": 7, "frames": 56}) + "\n")
    policy, at = learning.final_policy(state, log)
    assert at == {"iteration": 7, "frames": 56, "source": "export"}
    assert policy is not None and set(policy) == set(load_any_policy_state(NAVRL_FILE))
