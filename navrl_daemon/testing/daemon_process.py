"""A real `navrl-daemon run` process (forked.py) whose JSON log lines are read as they
come."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from navrl_daemon.testing import TINY, forked


class Daemon:
    def __init__(self, state: Path, *overrides: str, **popen: Any) -> None:
        self.proc = forked.start(
            [
                "run",
                "--state-dir",
                str(state),
                *TINY,
                "log.level=debug",
                "eval.interval=0",
                *overrides,
            ],
            stderr=subprocess.PIPE,
            text=True,
            **popen,
        )
        self.events: list[dict] = []
        self.text: list[str] = []  # stderr lines that are not JSON (a SIGUSR2 stack dump)

    def wait_for(self, event: str, count: int = 1) -> None:
        assert self.proc.stderr is not None
        seen = 0
        for line in self.proc.stderr:
            if not line.startswith("{"):
                self.text.append(line.rstrip("\n"))
                continue
            self.events.append(json.loads(line))
            if self.events[-1]["event"] == event:
                seen += 1
                if seen == count:
                    return
        raise AssertionError(f"daemon ended before {event!r}: {self.events[-5:]}")

    def finish(self, timeout: float = 60) -> tuple[int, float]:
        t0 = time.monotonic()
        assert self.proc.stderr is not None
        rest = self.proc.stderr.read()
        code = self.proc.wait(timeout=timeout)
        self.events += [json.loads(x) for x in rest.splitlines() if x.startswith("{")]
        self.text += [x for x in rest.splitlines() if not x.startswith("{")]
        return code, time.monotonic() - t0

    def names(self) -> list[str]:
        return [e["event"] for e in self.events]


def last_trained_is_kept(events: list[dict]) -> bool:
    """The stop kept the last trained iteration on disk: the newest checkpoint written is
    it, the final one or, when the stop came right after a checkpoint interval, that
    interval's own (no final one is written then: it would be the same weights). Needs
    a "progress" line per iteration (`log.summary_interval=1`, as TINY sets)."""
    trained = [e["iteration"] for e in events if e["event"] == "progress"]
    written = [e["iteration"] for e in events if e["event"] == "checkpoint written"]
    return bool(trained and written) and written[-1] == trained[-1]


CKPT = "ckpt-*.nrc"


def newest_valid_name(checkpoints: Path) -> str | None:
    from navrl_daemon.storage.checkpoint import verify

    valid = [p for p, why in verify(sorted(checkpoints.glob(CKPT))) if why is None]
    return max(valid, key=lambda p: p.name).name if valid else None


def crash_and_resume(
    state: Path,
    trials: int,
    *,
    seed: int = 0,
    max_delay_s: float = 3.0,
    plant_temp_at: int | None = None,
    overrides: tuple[str, ...] = (),
) -> dict:
    """Start `run` on `state`, kill -9 it after a random delay, `trials` times; check after
    every start and every kill what a user relies on. Returns counts for a report; raises
    AssertionError naming the trial at the first broken promise.

    Promises: every start resumes from the newest valid checkpoint there was (never a
    temp file, never an older one), removes and logs the temp files an earlier crash left;
    iterations only go forward (the checkpoint a start resumes from is never older than
    the one the start before resumed from, nor the newest on disk); after every kill each
    `ckpt-*.nrc` on disk is valid, the rollout archive (every iteration archived) verifies
    (`archive verify`'s check: index rows and blobs) and holds no (iteration, env) twice."""
    import random

    from navrl_daemon.storage.checkpoint import read_header, verify

    rng = random.Random(seed)
    checkpoints = state / "checkpoints"
    counts = {"trials": 0, "resumed": 0, "fresh_starts": 0, "killed_before_resume": 0}
    counts |= {"temp_files_left": 0, "temp_files_removed": 0, "checkpoints_valid_after_kill": 0}
    counts |= {"archive_verified_after_kill": 0, "archived_segments": 0, "newest_iteration": 0}
    resumed_from, newest_on_disk = 0, 0
    for trial in range(trials):
        # A log per trial: nothing a killed daemon left running can write into the next one.
        log_path = state.parent / f"{state.name}.{trial}.log"
        state.mkdir(parents=True, exist_ok=True)
        if plant_temp_at == trial:
            checkpoints.mkdir(exist_ok=True)
            (checkpoints / ".tmp-planted").write_bytes(b"NRC1 half a checkpoint")
        left = sorted(p.name for p in checkpoints.glob(".tmp-*")) if checkpoints.is_dir() else []
        expected = newest_valid_name(checkpoints) if checkpoints.is_dir() else None
        args = ["run", "--state-dir", str(state), *TINY, "eval.interval=0"]
        args += ["checkpoint.interval=1", "checkpoint.keep_last=3", "run.total_frames=100000000"]
        args += ["archive.interval=1"]
        with log_path.open("w") as log:
            proc = forked.start([*args, *overrides], stderr=log, stdout=subprocess.DEVNULL)
            # One kill in five lands during start-up (config, lock, resume: the imports are
            # done in a fork, forked.py); the others while training and writing.
            if rng.random() < 0.2:
                time.sleep(rng.uniform(0.1, 3.0))
            else:
                _wait_for_line(log_path, '"state": "running"', proc, timeout=300)
                time.sleep(rng.uniform(0.0, max_delay_s))
            proc.kill()
            proc.wait(timeout=30)
        events = [json.loads(x) for x in log_path.read_text().splitlines() if x.startswith("{")]
        where = f"trial {trial}"
        starts = ("resumed from checkpoint", "no checkpoint: starting a new run")
        started = next((e for e in events if e["event"] in starts), None)
        removed = next((e for e in events if e["event"].startswith("removed temp files")), None)
        counts["trials"] += 1
        if removed is not None or started is not None:  # removed first: a kill may land between
            counts["temp_files_left"] += len(left)
            if left:
                assert removed is not None and sorted(removed["files"]) == left, where
                counts["temp_files_removed"] += len(left)
        if started is None:
            counts["killed_before_resume"] += 1  # its leftovers are checked next trial
        else:
            if expected is None:
                assert started["event"].startswith("no checkpoint"), (where, started)
                counts["fresh_starts"] += 1
            else:
                assert Path(started["path"]).name == expected, (where, started, expected)
                counts["resumed"] += 1
                assert started["iteration"] >= max(resumed_from, newest_on_disk), (
                    where,
                    started,
                    resumed_from,
                    newest_on_disk,
                )
                resumed_from = started["iteration"]
        files = sorted(checkpoints.glob(CKPT))
        bad = [(p.name, why) for p, why in verify(files) if why]
        assert not bad, (where, bad)
        counts["checkpoints_valid_after_kill"] += 1
        if files:
            newest = read_header(files[-1]).iteration
            assert newest >= newest_on_disk, (where, "newest checkpoint went back", newest)
            newest_on_disk = newest
        counts["archived_segments"] = archive_checked(state / "archive", where)
        counts["archive_verified_after_kill"] += 1
    counts["newest_iteration"] = newest_on_disk
    return counts


def archive_checked(directory: Path, where: str) -> int:
    """Verify every archive file as `archive verify` does (a file a kill left open reads
    up to its last whole segment) and check that no (iteration, env) is in it twice;
    returns the segments it holds."""
    from collections import Counter

    from navrl_daemon.storage.archive import ArchiveFile, archive_files

    seen: Counter = Counter()
    for path in archive_files(directory):
        with ArchiveFile.open(path) as f:
            f.verify()  # DataError names the file and row or segment
            seen.update(zip(f.rows["iteration"].tolist(), f.rows["env"].tolist(), strict=True))
    twice = sorted(k for k, n in seen.items() if n > 1)
    assert not twice, (where, "archived twice (iteration, env)", twice[:10])
    return sum(seen.values())


def _wait_for_line(path: Path, needle: str, proc: forked.Process, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while needle not in path.read_text():
        if proc.poll() is not None:
            tail = path.read_text()[-2000:]
            raise AssertionError(f"daemon exited with {proc.returncode}: {tail}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {needle!r} after {timeout} s")
        time.sleep(0.05)
