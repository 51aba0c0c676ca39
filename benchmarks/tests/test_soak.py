"""The CI-sized soak (benchmarks/soak.py runs the hours-long one): what can honestly be
asserted in a minute or two of a daemon with every stage busy.

- No container held by a daemon object grows with the iterations: every list, dict, set
  and deque in the attributes of every live `navrl_daemon` object is measured at three
  points of one run, 10 iterations apart, and none may grow by more than 3 twice (a
  per-iteration or per-evaluation list grows by 10 or 5; windows that reset, such as
  the progress window, stay within the summary interval of 3).
- Threads, open fds and child processes of a real `navrl-daemon run` process do not
  grow: sampled from /proc ten times a second (children once a second) while every
  stage works a dozen times or more, the second half's least fd count is at most the first
  half's (a failure names what the fds point at), the threads' peak rises by at most
  one worker of a pool started on demand, and there are never any children.
A slope of RSS cannot be told from noise in this time; the soak benchmark measures it.
"""

from __future__ import annotations

import collections
import gc
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import soak
import torch

from navrl_daemon.config import load_config
from navrl_daemon.ops.progress import IterationRecord
from navrl_daemon.pipeline.daemon import serve
from navrl_daemon.storage.checkpoint import CheckpointDir, encode_checkpoint
from navrl_daemon.testing import TINY, forked

REPO = Path(__file__).resolve().parents[2]

# Every stage busy on the tiny config; the archive cap is reached within a few rollouts.
BUSY = [
    *TINY,
    "checkpoint.interval=1",
    "checkpoint.keep_last=2",
    "checkpoint.keep_best=1",
    "archive.interval=1",
    "archive.max_file_bytes=1048576",
    "archive.max_total_bytes=2097152",
    "eval.interval=2",
    "log.summary_interval=3",
    "log.level=warning",
]
CONTAINERS = (list, dict, set, collections.deque)
# The /proc sampling window: this many checkpoints (iterations), 12 in each half.
CHECKPOINTS = 24


def container_sizes() -> dict[tuple[str, str, int], int]:
    """len() of every container attribute of every live navrl_daemon object."""
    sizes = {}
    for obj in gc.get_objects():
        kind = type(obj)
        module = getattr(kind, "__module__", None)
        if not (isinstance(module, str) and module.startswith("navrl_daemon")):
            continue
        try:
            attrs = vars(obj)
        except TypeError:
            continue  # __slots__ only: none of ours holds a container that way
        for name, value in attrs.items():
            if isinstance(value, CONTAINERS):
                sizes[(kind.__qualname__, name, id(obj))] = len(value)
    return sizes


def test_no_container_of_the_daemon_grows_with_iterations(tmp_path: Path) -> None:
    points = (10, 20, 30)
    cfg = load_config(None, [*BUSY, f"run.total_frames={8 * 8 * points[-1]}"], environ={})
    census: dict[int, dict[tuple[str, str, int], int]] = {}

    def observe(record: IterationRecord) -> None:
        if record.iteration in points:
            census[record.iteration] = container_sizes()

    anyio.run(serve, cfg, tmp_path / "state", observe)
    assert sorted(census) == list(points)
    a, b, c = (census[p] for p in points)
    growing = {
        f"{key[0]}.{key[1]}": (a[key], b[key], c[key])
        for key in a.keys() & b.keys() & c.keys()
        if b[key] - a[key] > 3 and c[key] - b[key] > 3
    }
    assert not growing, f"containers that grow with iterations: {growing}"
    # The census saw the stages (it would pass vacuously otherwise).
    seen = {key[0] for key in c}
    assert {"CheckpointWriter", "RolloutArchiver", "ProgressLog", "Telemetry"} <= seen


def test_threads_fds_and_children_do_not_grow(tmp_path: Path) -> None:
    state, log_path = tmp_path / "state", tmp_path / "daemon.log"
    args = [*BUSY, "log.level=info", "run.total_frames=100000000"]
    with log_path.open("w") as log:
        proc = forked.start(
            ["run", "--state-dir", str(state), *args], stderr=log, stdout=subprocess.DEVNULL
        )
        try:
            samples, children = _sample_after_warmup(proc, log_path, CHECKPOINTS)
        finally:
            proc.terminate()
            code = proc.wait(timeout=120)
    assert code == 0, log_path.read_text()[-2000:]
    half = len(samples) // 2
    first, second = samples[:half], samples[half:]
    # Every stage worked CHECKPOINTS times or more meanwhile, so a thread or fd lost per
    # iteration, checkpoint or evaluation would show as many, not one.
    # Threads: the checkpoint, archive and anyio pools start workers on demand, up to
    # their caps, the first time calls overlap; under load that can first happen late,
    # and anyio retires a worker idle for 10 s. So the count may rise by one per pool
    # between the halves' peaks (by two in a CI run beside a learning run, 2026-11-28); a
    # leak adds one per event: ten or more over a half that writes ten checkpoints.
    grown = max(s["threads"] for s in second) - max(s["threads"] for s in first)
    assert grown <= 3, ("threads", [s["threads"] for s in samples])
    # Fds: a leak raises the floor; a file open at one sample (a checkpoint being written,
    # an event file being flushed) is not one, so compare the least counts of the two
    # halves. At ten samples a second each half sees moments with none of those open.
    least = [min(half, key=lambda s: len(s["fds"])) for half in (first, second)]
    assert len(least[1]["fds"]) <= len(least[0]["fds"]), (
        "open fds grew; at the fewest of each half:",
        sorted(least[0]["fds"].values()),
        sorted(least[1]["fds"].values()),
    )
    assert children and all(n == 0 for n in children), children


def _sample_after_warmup(
    proc: forked.Process, log_path: Path, checkpoints: int
) -> tuple[list[Any], list[int]]:
    """Wait until every stage has done its work once, then sample /proc until `checkpoints`
    more are written (an iteration each, an evaluation every other): fds and threads ten
    times a second, child processes once a second (walking /proc costs more)."""
    deadline = time.monotonic() + 300
    warm = ('"archive file started"', '"evaluation"', '"checkpoint written"')
    while not all(w in log_path.read_text() for w in warm):
        assert proc.poll() is None, log_path.read_text()[-2000:]
        assert time.monotonic() < deadline, log_path.read_text()[-2000:]
        time.sleep(0.5)
    samples, children = [], []
    at_start = log_path.read_text().count('"checkpoint written"')
    written = 0
    while written < checkpoints:
        assert proc.poll() is None, log_path.read_text()[-2000:]
        assert time.monotonic() < deadline, ("checkpoints written", written)
        samples.append(_fds_and_threads(proc.pid))
        if len(samples) % 10 == 1:
            children.append(len(soak.descendants(proc.pid)))
            written = log_path.read_text().count('"checkpoint written"') - at_start
        time.sleep(0.1)
    return samples, children


def _fds_and_threads(pid: int) -> dict[str, Any]:
    """Open fds (number → what it points at) and the thread count of `pid`, from /proc."""
    fds = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed since listdir
    return {"fds": fds, "threads": soak.status_fields(pid)["Threads"]}


def test_the_soaks_checkpoint_cap_holds_what_retention_keeps(tmp_path: Path) -> None:
    """The benchmark's cap counts the best-scored file kept beside the newest ones: with
    keep_best = 1 a 16-env soak held five files at once and failed a cap of four."""
    cfg = load_config(REPO / "config/default.toml", ["checkpoint.keep_last=3"], environ={})
    directory = CheckpointDir(tmp_path)
    scores: dict[Path, float] = {}
    most = 0
    for iteration in range(1, 10):
        state = {"w": torch.full((4,), float(iteration))}
        blob = encode_checkpoint(state, iteration=iteration, frames=iteration, policy_version=1)
        path = directory.write(blob, iteration)
        scores[path] = 1.0 if iteration == 1 else 0.1  # the first one stays the best
        most = max(most, len(directory.files()))  # the new file, before the oldest goes
        directory.prune(cfg.checkpoint.keep_last, cfg.checkpoint.keep_best, scores, path)
    assert most == soak.kept_checkpoints(cfg.checkpoint) == 5
    with pytest.raises(SystemExit, match="keep_every"):
        soak.kept_checkpoints(cfg.checkpoint.model_copy(update={"keep_every": 20}))


def test_rss_drift_tells_a_step_from_a_leak() -> None:
    """Two and a half hours sampled every 10 s: a 1 MB step 30 minutes in is one steep
    hour then a flat one, a 1.5 MB/h leak is 1.5 in every hour; the net change between the
    first and last 10-minute medians is 1 MB and 3.5 MB (their centres 8,400 s apart)."""
    t = [300.0 + 10.0 * i for i in range(901)]  # 5 min of warm-up, then 9,000 s
    step = [500e6 + (1e6 if x >= 300.0 + 1800.0 else 0.0) for x in t]
    leak = [500e6 + 1.5e6 * (x - 300.0) / 3600.0 for x in t]
    stepped = soak.rss_drift(t, step)
    leaking = soak.rss_drift(t, leak)
    assert len(stepped["slope_mb_per_h_by_hour"]) == len(leaking["slope_mb_per_h_by_hour"]) == 2
    assert stepped["slope_mb_per_h_by_hour"][0] > 1.0
    assert stepped["slope_mb_per_h_by_hour"][1] == 0.0
    assert leaking["slope_mb_per_h_by_hour"] == pytest.approx([1.5, 1.5], abs=1e-3)
    assert stepped["net_mb"] == pytest.approx(1.0)
    assert leaking["net_mb"] == pytest.approx(3.5, abs=0.01)
    samples = [
        {
            "t": x,
            "rss_bytes": y,
            "rss_anon_bytes": y,
            "fds": 9,
            "threads": 20,
            "children": 0,
            "state_dir_bytes": 0,
            "records_bytes": 0,
            "log_bytes": 0,
            "state_dir": {},
        }
        for x, y in zip(t, step, strict=True)
    ]
    report = soak.analyse(samples, 300.0, {"archive": 1, "checkpoints": 1})
    assert report["rss_drift_after_warmup"] == stepped
