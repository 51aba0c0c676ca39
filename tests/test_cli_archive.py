"""`navrl-daemon archive list|info|verify` as a user runs it: JSON totals, incomplete
files read up to their last whole segment, bad files exit 65 naming the file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from navrl_daemon.storage.archive import ArchiveWriter, Schema, archive_name, encode_segments
from tests.conftest import REPO, navrl_cli


def write_archive(
    path: Path, iterations: range, num_envs: int = 3, steps: int = 5, version: int = 2
) -> None:
    rng = np.random.default_rng(iterations.start)
    arrays = {
        "agents/observation/lidar": rng.random((num_envs, steps, 1, 36, 4), dtype=np.float32),
        "next/done": rng.random((num_envs, steps, 1)) < 0.2,
    }
    schema = Schema.for_rollout(arrays, default_filter="shuffle", version=version)
    writer = ArchiveWriter(path, schema)
    for i in iterations:
        segments = encode_segments(
            schema, arrays, range(num_envs), iteration=i, policy_version=i + 1
        )
        writer.append(segments)
    writer.close()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    # An archive directory from before and after the upgrade to format 2.
    write_archive(tmp_path / "archive" / archive_name(0), range(0, 4), version=1)
    write_archive(tmp_path / "archive" / archive_name(1), range(4, 6), version=2)
    return tmp_path


def test_info_json_totals_over_the_state_dir(state_dir: Path) -> None:
    result = navrl_cli("archive", "info", "--state-dir", str(state_dir), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert len(doc["files"]) == 2 and doc["bad_files"] == 0 and doc["incomplete_files"] == 0
    assert [f["format_version"] for f in doc["files"]] == [1, 2]
    assert doc["segments"] == 6 * 3 and doc["frames"] == 6 * 3 * 5
    assert doc["iterations"] == [0, 5] and doc["policy_versions"] == [1, 6]
    per_segment_raw = 5 * (36 * 4 * 4 + 1)
    assert doc["raw_bytes"] == 18 * per_segment_raw
    assert 0 < doc["stored_bytes"] == sum(f["stored_bytes"] for f in doc["files"])
    assert [k["path"] for k in doc["keys"]] == ["agents/observation/lidar", "next/done"]


def test_list_and_verify_print_one_line_per_file(state_dir: Path) -> None:
    listed = navrl_cli("archive", "list", "--state-dir", str(state_dir))
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [
        str(state_dir / "archive" / archive_name(i)) for i in (0, 1)
    ]
    verified = navrl_cli("archive", "verify", "--state-dir", str(state_dir), "--json")
    assert verified.returncode == 0, verified.stderr
    assert all(f["verified"] for f in json.loads(verified.stdout)["files"])


def test_verify_exits_65_naming_a_corrupt_file(state_dir: Path) -> None:
    bad = state_dir / "archive" / archive_name(1)
    with h5py.File(bad, "r") as f:
        start = f["segments"].id.get_chunk_info(0).byte_offset
    data = bytearray(bad.read_bytes())
    data[start + 100 : start + 108] = bytes(8 * [0xAB])
    bad.write_bytes(bytes(data))
    result = navrl_cli("archive", "verify", "--state-dir", str(state_dir), "--json")
    assert result.returncode == 65
    assert str(bad) in result.stderr and "checksum mismatch" in result.stderr
    doc = json.loads(result.stdout)
    assert doc["bad_files"] == 1 and "error" in doc["files"][1] and "error" not in doc["files"][0]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (lambda good: good[: len(good) // 3], "truncated"),
        (lambda good: b"", "empty file"),
        (lambda good: b"not hdf5 at all" * 100, "not an HDF5 file"),
    ],
)
def test_truncated_empty_and_foreign_files_exit_65(tmp_path: Path, content, why: str) -> None:
    good = tmp_path / "good.h5"
    write_archive(good, range(3))
    bad = tmp_path / "bad.h5"
    bad.write_bytes(content(good.read_bytes()))
    result = navrl_cli("archive", "list", str(good), str(bad))
    assert result.returncode == 65
    assert f"archive {bad}: " in result.stderr and why in result.stderr
    assert str(good) in result.stdout  # the good file is still listed


def test_foreign_hdf5_file_exits_65(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["data"] = np.arange(10)
    result = navrl_cli("archive", "verify", str(foreign))
    assert result.returncode == 65
    assert f"archive {foreign}: not a navrl archive" in result.stderr


def test_file_of_a_killed_writer_is_listed_incomplete_and_verifies(tmp_path: Path) -> None:
    path = tmp_path / archive_name(0)
    writer = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        from tests.test_cli_archive import write_archive
        import navrl_daemon.storage.archive as archive
        close = archive.ArchiveWriter.close
        archive.ArchiveWriter.close = lambda self: (print("written", flush=True), sys.stdin.read())
        write_archive(Path({str(path)!r}), range(7))
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", writer], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "written\n"
    os.kill(proc.pid, signal.SIGKILL)  # every append flushed, close never ran
    proc.wait()
    result = navrl_cli("archive", "verify", str(path), "--json")
    assert result.returncode == 0, result.stderr
    (entry,) = json.loads(result.stdout)["files"]
    assert entry["complete"] is False and entry["segments"] == 7 * 3 and entry["verified"]


def test_verify_catches_a_changed_index_row(state_dir: Path) -> None:
    """Only the blobs had checksums: an index row's iteration overwritten with 123456789
    verified "ok". Now every row has one (new files)."""
    changed = state_dir / "archive" / archive_name(1)
    with h5py.File(changed, "r+") as f:
        f["index/iteration"][3] = 123456789
    result = navrl_cli("archive", "verify", "--state-dir", str(state_dir), "--json")
    assert result.returncode == 65, result.stdout
    assert f"archive {changed}: index row 3 (iteration 123456789, env 0)" in result.stderr
    assert "checksum mismatch: the index was changed after it was written" in result.stderr
    listed = navrl_cli("archive", "list", "--state-dir", str(state_dir), "--json")
    entry = next(e for e in json.loads(listed.stdout)["files"] if e["path"] == str(changed))
    assert entry["bad_index_rows"] == 1  # left out of its segments


def test_verify_says_what_a_file_without_index_checksums_cannot_check(state_dir: Path) -> None:
    old = state_dir / "archive" / archive_name(0)
    with h5py.File(old, "r+") as f:  # as written before index checksums existed
        del f["index/row_crc32"]
        f["index/iteration"][0] = 123456789  # unnoticeable there
    result = navrl_cli("archive", "verify", "--state-dir", str(state_dir), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [f["index_checked"] for f in doc["files"]] == [False, True]
    assert doc["unchecked_index_files"] == 1
    text = navrl_cli("archive", "verify", "--state-dir", str(state_dir)).stdout
    assert "index not checksummed (written before index checksums)" in text
    assert "iteration, env, policy_version and raw_bytes columns cannot be checked" in text
