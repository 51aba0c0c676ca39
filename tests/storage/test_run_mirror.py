"""The mirror of a run's resume point (storage/run_mirror.py): written into a new folder,
then switched by replacing MIRROR.json, so that no torn write ever becomes current.

Real files: a real full disk (a small tmpfs), a real SIGKILL between copying a point and
switching to it, fsspec's in-memory file system for URLs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from navrl_daemon.errors import DataError
from navrl_daemon.storage.checkpoint import CheckpointDir, encode_checkpoint
from navrl_daemon.storage.run_mirror import (
    POINTER,
    FsspecFolder,
    LocalFolder,
    RunMirror,
    open_location,
    resume_files,
)
from tests.conftest import REPO, SUBPROCESS_ENV


def a_state_dir(state: Path, iteration: int, weights: int = 1000) -> Path:
    """A state dir with what a run leaves (random weights: a checkpoint LZ4 cannot
    shrink); returns its newest checkpoint."""
    torch.manual_seed(iteration)
    data = encode_checkpoint(
        {"w": torch.randn(weights)}, iteration=iteration, frames=64 * iteration, policy_version=1
    )
    path = CheckpointDir(state / "checkpoints").write(data, iteration)
    rows = "".join(json.dumps({"iteration": i}) + "\n" for i in range(1, iteration + 1))
    (state / "history.jsonl").write_text(rows + '{"iteration": 99')  # a row being written
    (state / "eval").mkdir(exist_ok=True)
    (state / "eval" / "results.jsonl").write_text(rows)
    (state / "export").mkdir(exist_ok=True)
    (state / "export" / "policy.pt").write_bytes(b"policy %d" % iteration)
    (state / "export" / ".tmp-abc").write_bytes(b"half an export")
    (state / "config.toml").write_text("[run]\nseed = 0\n")
    return path


def test_a_point_holds_what_resume_needs_and_reads_back_checked(tmp_path: Path) -> None:
    state = tmp_path / "state"
    newest = a_state_dir(state, 3)
    mirror = RunMirror(LocalFolder(tmp_path / "mirror"))
    assert mirror.current() is None
    point = mirror.write(state, newest)
    assert point is not None and (point.iteration, point.frames) == (3, 192)
    assert mirror.current() == point
    files = mirror.fetch(point)
    assert sorted(files) == [
        "checkpoints/ckpt-000000003.nrc",
        "config.toml",
        "eval/results.jsonl",
        "export/policy.pt",
        "history.jsonl",
    ]
    assert files["checkpoints/ckpt-000000003.nrc"] == newest.read_bytes()
    assert not files["history.jsonl"].endswith(b'{"iteration": 99')  # whole rows only
    assert mirror.write(state, newest) is None  # the same files: nothing rewritten

    newest = a_state_dir(state, 6)
    second = mirror.write(state, newest)
    assert second is not None and second.iteration == 6
    assert mirror.remove_others(second) == [point.folder]
    assert sorted(p.name for p in (tmp_path / "mirror").iterdir()) == [POINTER, second.folder]


def test_a_changed_file_in_the_mirror_is_refused_by_name(tmp_path: Path) -> None:
    state = tmp_path / "state"
    mirror = RunMirror(LocalFolder(tmp_path / "mirror"))
    point = mirror.write(state, a_state_dir(state, 3))
    assert point is not None
    copy = tmp_path / "mirror" / point.folder / point.checkpoint
    data = bytearray(copy.read_bytes())
    data[-100] ^= 1  # one bit of the payload
    copy.write_bytes(data)
    with pytest.raises(DataError, match=r"ckpt-000000003\.nrc: .* do not match MIRROR\.json"):
        mirror.fetch(point)


def test_a_full_disk_mid_copy_never_replaces_the_good_point(tmp_path: Path, small_disk) -> None:
    disk = small_disk("1m")
    state = tmp_path / "state"
    mirror = RunMirror(LocalFolder(disk / "mirror"))
    good = mirror.write(state, a_state_dir(state, 3, weights=10_000))  # about 40 kB
    assert good is not None
    pointer = (disk / "mirror" / POINTER).read_bytes()
    with pytest.raises(OSError, match="No space left"):
        mirror.write(state, a_state_dir(state, 6, weights=400_000))  # 1.6 MB: torn mid-copy
    assert (disk / "mirror" / POINTER).read_bytes() == pointer
    assert mirror.current() == good
    assert mirror.fetch(good)["checkpoints/ckpt-000000003.nrc"]
    assert sorted(p.name for p in (disk / "mirror").iterdir()) == [POINTER, good.folder]


KILLED_MID_WRITE = """
import os, signal, sys
from pathlib import Path
from navrl_daemon.storage.run_mirror import RunMirror, open_location

mirror = RunMirror(open_location(sys.argv[1]))
location, at = mirror.location, sys.argv[4]
def kill(*_):
    os.kill(os.getpid(), signal.SIGKILL)
if at == "switch":  # every file of the new point copied and synced, MIRROR.json not replaced
    location.replace = kill
else:  # the first file of the new point copied, the next not
    write = location.write
    location.write = lambda *a: (write(*a), setattr(location, "write", kill))
mirror.write(Path(sys.argv[2]), Path(sys.argv[3]))
"""


def kill_mid_write(mirror: Path, state: Path, checkpoint: Path, at: str = "switch") -> None:
    """Write a new point into `mirror` in a process killed (SIGKILL) mid-way: `at`
    "switch", right before MIRROR.json would be replaced; "file", after one file."""
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_MID_WRITE, str(mirror), str(state), str(checkpoint), at],
        cwd=REPO,
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


@pytest.mark.parametrize("at", ["file", "switch"])
def test_a_process_killed_mid_write_leaves_the_old_point(tmp_path: Path, at: str) -> None:
    state = tmp_path / "state"
    mirror = RunMirror(LocalFolder(tmp_path / "mirror"))
    good = mirror.write(state, a_state_dir(state, 3))
    assert good is not None
    kill_mid_write(tmp_path / "mirror", state, a_state_dir(state, 6), at)
    torn = [p.name for p in (tmp_path / "mirror").glob("point-000000006-*")]
    assert len(torn) == 1  # the new point's folder, never pointed to
    assert mirror.current() == good
    assert mirror.fetch(good)["checkpoints/ckpt-000000003.nrc"]
    newer = mirror.write(state, a_state_dir(state, 9))
    assert newer is not None
    assert sorted(mirror.remove_others(newer)) == sorted([good.folder, *torn])


def test_an_fsspec_url_holds_a_point_and_keeps_it_through_a_failed_write(
    tmp_path: Path,
) -> None:
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://mirror-test-{tmp_path.name}/run"
    location = open_location(url)
    assert isinstance(location, FsspecFolder)
    mirror = RunMirror(location)
    state = tmp_path / "state"
    good = mirror.write(state, a_state_dir(state, 3))
    assert good is not None and mirror.current() == good
    assert mirror.fetch(good) == resume_files(state, state / "checkpoints" / good.checkpoint[12:])

    real = location.fs.pipe_file

    def full(path: str, data: bytes, **kw) -> None:
        if path.endswith(".nrc"):
            raise OSError(28, "No space left on device")
        real(path, data, **kw)

    location.fs.pipe_file = full
    with pytest.raises(OSError):
        mirror.write(state, a_state_dir(state, 6))
    location.fs.pipe_file = real
    assert mirror.current() == good
    newer = mirror.write(state, a_state_dir(state, 9))
    assert newer is not None
    mirror.remove_others(newer)
    assert location.names() == sorted([POINTER, newer.folder])
    fsspec.filesystem("memory").rm(url.removeprefix("memory://").split("/")[0], recursive=True)


def test_a_path_or_file_url_is_a_local_folder(tmp_path: Path) -> None:
    assert isinstance(open_location(str(tmp_path)), LocalFolder)
    local = open_location(f"file://{tmp_path}")
    assert isinstance(local, LocalFolder) and local.root == tmp_path
