"""The console a person sees: a real `navrl-daemon run` on a pseudo-terminal, its output
fed to a terminal emulator (pyte), and the screen read back: the progress bar and the log
lines never share a line, each summary is a table, and the run ends with a summary of
where the results are. Off a terminal the lines stay JSON with every field."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pyte
import pytest
import structlog

from navrl_daemon.config import LogConfig
from navrl_daemon.ops.console import ProgressTableRenderer, progress_table
from navrl_daemon.ops.logging import configure_logging
from tests.conftest import REPO, SUBPROCESS_ENV, TINY, navrl_cli

COLUMNS, LINES = 160, 3000  # tall enough that nothing scrolls off the emulated screen
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
BAR = re.compile(r"\d+%\|")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
RUN = [*TINY, "log.summary_interval=2", "eval.interval=2", "checkpoint.interval=2"]


class Terminal:
    """A process on a pty whose output is played into a pyte screen."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        master, slave = pty.openpty()
        fcntl_size = struct.pack("HHHH", 50, COLUMNS, 0, 0)
        import fcntl

        fcntl.ioctl(slave, termios.TIOCSWINSZ, fcntl_size)
        env = {**SUBPROCESS_ENV, "COLUMNS": str(COLUMNS), "TERM": "xterm"}
        self.proc = subprocess.Popen(
            args, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, close_fds=True
        )
        os.close(slave)
        self.master = master
        self.raw = bytearray()
        self.screen = pyte.Screen(COLUMNS, LINES)
        self.stream = pyte.ByteStream(self.screen)

    def read_until(self, needle: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.raw.decode(errors="replace"):
                return True
            if not self._read(0.5):
                return needle in self.raw.decode(errors="replace")
        return False

    def finish(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._read(0.5):
            pass
        code = self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        os.close(self.master)
        return code

    def _read(self, wait: float) -> bool:
        """Read what is there; False once the process closed the pty."""
        ready, _, _ = select.select([self.master], [], [], wait)
        if not ready:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: every writer closed
            return False
        if not data:
            return False
        self.raw += data
        self.stream.feed(data)
        return True

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display if line.strip()]


def run_on_terminal(state: Path, *extra: str) -> Terminal:
    cmd = [sys.executable, "-m", "navrl_daemon", "run", "--state-dir", str(state), *RUN, *extra]
    return Terminal(cmd, REPO)


def check_screen(lines: list[str]) -> None:
    """Every log line starts at the left edge, alone; the bar is alone on its line."""
    assert lines, "nothing on the screen"
    for line in lines:
        assert not TIMESTAMP.search(line[1:]), f"a log line starts mid-line: {line!r}"
        if BAR.search(line):
            assert not TIMESTAMP.search(line), f"bar and log share a line: {line!r}"


@pytest.mark.slow
def test_bar_and_logs_never_share_a_line_and_summaries_are_tables(tmp_path: Path) -> None:
    term = run_on_terminal(tmp_path / "state", "run.total_frames=384")  # 6 iterations
    code = term.finish(timeout=900)
    lines = term.lines()
    assert code == 0, "\n".join(lines[-30:])
    check_screen(lines)
    tables = [i for i, x in enumerate(lines) if x.startswith("─── iteration ")]
    assert len(tables) >= 3, "\n".join(lines)
    block = lines[tables[0] : tables[0] + 4]
    assert block[1].lstrip().startswith("throughput") and "frames/s" in block[1]
    assert "ETA" in block[1]
    assert block[2].lstrip().startswith("episodes")
    assert not any("phases=" in x for x in lines), "the key=value wall is back"
    # The end-of-run summary: where things are, the best evaluation, what to run next.
    text = "\n".join(lines)
    assert "run finished run.total_frames at iteration 6" in text
    assert "exit 0" in text and "best eval" in text
    # `.venv/bin/tensorboard` by its path unless PATH finds the same one.
    assert re.search(r"TensorBoard  \S*tensorboard --logdir ", text), text
    nxt = lines[next(i for i, x in enumerate(lines) if x.strip() == "next:") + 1 :]
    assert any(" report --state-dir " in x for x in nxt)
    assert any("-m navrl_daemon" in x or "navrl-daemon" in x for x in nxt)


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_with_exit_0_and_says_so(tmp_path: Path) -> None:
    term = run_on_terminal(tmp_path / "state", "run.total_frames=100000000")
    assert term.read_until("─── iteration 2", timeout=600), term.raw.decode(errors="replace")
    term.proc.send_signal(signal.SIGINT)
    code = term.finish(timeout=300)
    lines = term.lines()
    assert code == 0, "\n".join(lines[-30:])
    check_screen(lines)
    assert "run stopped before run.total_frames" in "\n".join(lines)


# The bar as tqdm draws it: "3.20k/10.0M [00:05<4:12:31, 187frame/s]".
# The bar's postfix (", collecting 8 steps ...") follows the rate when the bar shows one.
BAR_STATE = re.compile(r"/[\d.]+[kMG]? \[[\d:]+<([\d:]+), ([\d.]+)([kMG]?)frame/s(?:, [^\]\n]*)?\]")
BLOCK = re.compile(
    r"─── iteration \d+ · ([\d,]+) / ([\d,]+) frames.*?\n.*?ETA ((?:\d+ days?, )?[\d:]+)"
)
SCALE = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}


def _seconds(text: str) -> float:
    """Seconds of tqdm's "H:MM:SS"/"MM:SS" or timedelta's "N days, H:MM:SS"."""
    days, _, clock = text.rpartition(", ")
    parts = [int(x) for x in clock.split(":")]
    clock_s = sum(v * 60**i for i, v in enumerate(reversed(parts)))
    return (86400.0 * int(days.split()[0]) if days else 0.0) + clock_s


@pytest.mark.slow
def test_after_a_resume_the_bar_and_the_summary_count_this_sittings_frames(
    tmp_path: Path,
) -> None:
    """A run resumed at 640 frames: the bar's rate and ETA are this sitting's (not the
    resumed frames over this sitting's seconds), and agree with the summary's ETA."""
    state = tmp_path / "state"
    first = navrl_cli("run", "--state-dir", str(state), *RUN, "run.total_frames=640")
    assert first.returncode == 0, first.stderr[-2000:]
    term = run_on_terminal(state, "run.total_frames=5000000", "log.summary_interval=4")
    assert term.read_until("─── iteration 24 ", timeout=600), term.raw.decode(errors="replace")
    term.proc.send_signal(signal.SIGINT)
    assert term.finish(timeout=300) == 0, "\n".join(term.lines()[-30:])
    raw = term.raw.decode(errors="replace").replace("\r\n", "\n")
    # Every key=value line is a whole log line, and narrower than the terminal.
    log_lines = [ANSI.sub("", x.rsplit("\r", 1)[-1]) for x in raw.split("\n")]
    log_lines = [x for x in log_lines if "=" in x and not x.startswith((" ", "─"))]
    assert all(TIMESTAMP.match(x) and len(x) <= COLUMNS for x in log_lines), log_lines
    compared = 0
    for block in BLOCK.finditer(raw):
        frames, total = (int(x.replace(",", "")) for x in block.group(1, 2))
        eta = _seconds(block.group(3))
        bar = BAR_STATE.search(raw, block.end())  # redrawn under the block as it was logged
        assert bar is not None, raw[block.start() :]
        bar_eta = _seconds(bar.group(1))
        bar_rate = float(bar.group(2)) * SCALE[bar.group(3)]
        # The summary's ETA is the remaining frames at this sitting's rate: the bar's rate.
        assert bar_rate == pytest.approx((total - frames) / eta, rel=0.2), (block[0], bar[0])
        assert bar_eta == pytest.approx(eta, rel=0.2), (block[0], bar[0])
        compared += 1
    assert compared >= 3, raw


def test_table_counts_episodes_and_flags_few() -> None:
    summary = {
        "event": "progress",
        "iteration": 20,
        "frames": 40960,
        "total_frames": 2_000_000,
        "eta_s": 750.0,
        "frames_per_second": 2612.4,
        "policy_lag": 0.0,
        "busy": {"producer": 0.41, "trainer": 0.55},
        "train_episodes": 1,
        "train_reach_goal": 1.0,
        "train_collision": 0.0,
        "train_truncated": 1.0,
        "train_return": 180.0,
        "train_episode_len": 200.0,
        "actor_loss": -0.01,
        "critic_loss": 0.5,
        "entropy_loss": -2.3,
        "policy_entropy": 2.3e3,
    }
    table = progress_table(summary)
    # The loss's term among the losses, the policy's entropy among the statistics.
    assert re.search(r"losses +actor -0.01 +critic 0.5 +entropy -2.3\n", table), table
    assert "policy_entropy 2,300" in table
    assert "1 finished (few: noisy means)" in table
    assert "reached 1.000" in table and "timed out 0.000" in table  # not "truncated 1.0"
    assert "0:12:30" in table and "2,612 frames/s" in table and "(2.0 %)" in table
    none = progress_table({**summary, "train_episodes": 0})
    assert "none finished yet" in none and "reached" not in none
    mixed = {**summary, "train_episodes": 20, "train_reach_goal": 0.5, "train_collision": 0.25}
    table = progress_table({**mixed, "train_out_of_bounds": 0.15})
    assert "out of bounds 0.150" in table and "timed out 0.100" in table
    assert "timed out 0.250" in progress_table(mixed)  # a summary without the stat


def test_json_lines_keep_every_summary_field() -> None:
    out = io.StringIO()
    configure_logging(LogConfig(format="json"), stream=out)
    summary = {"iteration": 3, "frames": 192, "frames_per_second": 9.5, "busy": {"trainer": 0.5}}
    structlog.get_logger("progress").info("progress", **summary)
    line = json.loads(out.getvalue())
    assert {k: line[k] for k in summary} == summary and line["event"] == "progress"


def test_a_window_without_episodes_shows_the_last_outcomes_and_since_when() -> None:
    """NavRL's episodes last up to 2,200 steps: most windows end none. Their blocks show
    the last window's outcomes that had some, and its iteration."""
    renderer = ProgressTableRenderer(lambda *_: "")
    window = {"event": "progress", "frames_per_second": 100.0, "frames": 64, "train_episodes": 0}
    first = renderer(None, "info", {**window, "iteration": 10})
    assert "none finished yet" in first and "outcomes" not in first
    ended = {"train_episodes": 12, "train_reach_goal": 0.5, "train_collision": 0.25}
    renderer(None, "info", {**window, "iteration": 20, **ended})
    later = renderer(None, "info", {**window, "iteration": 30})
    assert "no outcomes to show" not in later
    assert "none since iteration 20, when 12 had:" in later
    assert "reached 0.500" in later and "collided 0.250" in later and "timed out 0.250" in later


class TerminalStream(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_an_info_line_fits_the_terminal_and_a_warning_keeps_every_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    out = TerminalStream()
    configure_logging(LogConfig(format="console"), stream=out)
    log = structlog.get_logger("checkpoint_writer")
    written = {
        "path": "/var/lib/navrl/state/checkpoints/ckpt-000000216.nrc",
        "iteration": 216,
        "frames": 13824,
        "final": False,
        "raw_bytes": 2224737,
        "stored_bytes": 2157587,
        "seconds": 0.0377,
        "removed": ["ckpt-000000214.nrc"],
    }
    log.info("checkpoint written", **written)
    log.warning("checkpoint written", **written)
    info, warning = (ANSI.sub("", x) for x in out.getvalue().splitlines())
    assert len(info) <= 100 and TIMESTAMP.match(info) and "checkpoint written" in info, info
    assert "iteration=216" in info and "raw_bytes" not in info and "fields)" in info
    assert all(f"{key}=" in warning for key in written), warning
