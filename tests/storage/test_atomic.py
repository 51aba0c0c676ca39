"""Appends to JSON-lines files are all or nothing, on a real full disk too."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from navrl_daemon.storage import atomic
from navrl_daemon.storage.atomic import append_line
from navrl_daemon.storage.history import JsonLinesFile, read_jsonl
from navrl_daemon.testing.full_disk import fill


def row(i: int) -> str:
    return json.dumps({"iteration": i, "reach_goal": 0.5})


def test_append_cuts_a_torn_tail_before_writing(tmp_path: Path) -> None:
    """What a crash or a full disk mid-append leaves: a last line without its newline.
    The next row must not be glued to it (that made `report` exit 65)."""
    path = tmp_path / "results.jsonl"
    path.write_text(row(1) + "\n" + row(2)[:9])
    append_line(path, row(3))
    assert path.read_text() == row(1) + "\n" + row(3) + "\n"
    got = read_jsonl(path, required=("iteration",))
    assert got.bad == [] and [r["iteration"] for r in got.rows] == [1, 3]


def test_a_torn_first_line_is_cut_too(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text("x" * 100_000)  # longer than one read-back block, no newline at all
    append_line(path, row(1))
    assert path.read_text() == row(1) + "\n"


def test_a_failed_append_leaves_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: the write gets half the line out, then the disk is full."""
    path = tmp_path / "results.jsonl"
    append_line(path, row(1))
    real_write = os.write

    def half_then_enospc(fd: int, data: bytes) -> int:
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "write", half_then_enospc)
    with pytest.raises(OSError, match="No space"):
        append_line(path, row(2))
    monkeypatch.undo()
    assert path.read_text() == row(1) + "\n"
    append_line(path, row(3))
    assert path.read_text() == row(1) + "\n" + row(3) + "\n"


def test_appends_on_a_real_full_disk_are_all_or_nothing_and_retried(
    small_disk,
) -> None:
    disk = small_disk("1m")
    path = disk / "eval" / "results.jsonl"
    results = JsonLinesFile(path)
    assert results.append({"iteration": 1}) is None
    filler = fill(disk)
    long_row = {"iteration": 2, "pad": "x" * 20_000}  # more than a page: a partial write
    error = results.append(long_row)
    assert error is not None and error.errno == errno.ENOSPC
    assert results.append({"iteration": 3}) is not None  # waits behind row 2
    assert path.read_text() == '{"iteration": 1}\n'  # nothing torn, nothing glued
    assert len(results.waiting) == 2
    filler.unlink()
    assert results.append({"iteration": 4}) is None  # the waiting rows go first, in order
    got = read_jsonl(path)
    assert got.bad == [] and [r["iteration"] for r in got.rows] == [1, 2, 3, 4]
