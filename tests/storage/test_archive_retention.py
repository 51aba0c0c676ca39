"""Archive retention: real files, real locks, a real reader in another process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from navrl_daemon.storage.archive import (
    ArchiveFile,
    ArchiveWriter,
    Schema,
    archive_files,
    archive_name,
    encode_segments,
)
from navrl_daemon.storage.archive_retention import ArchiveRetention
from tests.conftest import REPO, SUBPROCESS_ENV

KIB = 1 << 10


def write_archives(directory: Path, count: int, kib: int = 64) -> list[Path]:
    """`count` complete archive files of about `kib` KiB each (incompressible)."""
    rng = np.random.default_rng(0)
    arrays = {"x": rng.random((1, 8, kib * KIB // 64), dtype=np.float64).astype(np.float64)}
    schema = Schema.for_rollout(arrays)
    paths = []
    for seq in range(count):
        writer = ArchiveWriter(directory / archive_name(seq), schema)
        writer.append(encode_segments(schema, arrays, [0], iteration=seq, policy_version=seq))
        writer.close()
        paths.append(writer.path)
    return paths


def retention(directory: Path, cap: int, *, rotate: bool = True, free: int = 1 << 40):
    return ArchiveRetention(
        directory,
        max_total_bytes=cap,
        reserve_bytes=0,
        rotate=rotate,
        free_bytes=lambda _: free,
    )


def test_rotate_deletes_the_oldest_files_until_the_next_rollout_fits(tmp_path: Path) -> None:
    paths = write_archives(tmp_path, 5)
    size = paths[0].stat().st_size
    keeper = retention(tmp_path, cap=3 * size + size // 2)
    why, rotated = keeper.make_room(size, size, writing=None)
    assert why is None
    assert rotated.files == (paths[0].name, paths[1].name, paths[2].name)
    assert archive_files(tmp_path) == paths[3:]
    assert (keeper.rotated_files, keeper.rotated_bytes) == (3, rotated.bytes)
    assert rotated.bytes == 3 * size
    assert keeper.usage().files == 2


def test_the_file_being_written_is_never_deleted(tmp_path: Path) -> None:
    paths = write_archives(tmp_path, 2)
    size = paths[0].stat().st_size
    keeper = retention(tmp_path, cap=2 * size)
    why, rotated = keeper.make_room(2 * size, 0, writing=paths[0])
    assert rotated.files == (paths[1].name,)  # the newer one: the older is being written
    assert why is not None and "no finished archive file" in why
    assert archive_files(tmp_path) == [paths[0]]


def test_a_file_a_reader_holds_is_skipped_even_in_another_process(tmp_path: Path) -> None:
    paths = write_archives(tmp_path, 4)
    size = paths[0].stat().st_size
    keeper = retention(tmp_path, cap=2 * size)
    with ArchiveFile.open(paths[0]):  # a reader in this process holds the oldest
        # ... and one in another process holds the second oldest, until we close its stdin.
        reader = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys\nfrom pathlib import Path\n"
                "from navrl_daemon.storage.archive import ArchiveFile\n"
                f"f = ArchiveFile.open(Path({str(paths[1])!r}))\n"
                "print('open', flush=True)\nsys.stdin.read()\nf.segment(0)\n",
            ],
            cwd=REPO,
            env=SUBPROCESS_ENV,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert reader.stdout is not None and reader.stdout.readline() == "open\n"
            why, rotated = keeper.make_room(size, size, writing=None)
            assert rotated.files == (paths[2].name, paths[3].name)
            assert why is not None  # the two held files alone are at the cap
            assert archive_files(tmp_path) == paths[:2]
        finally:
            reader.communicate("", timeout=60)
        assert reader.returncode == 0  # it read its file after we tried to delete it
    why, rotated = keeper.make_room(size, size, writing=None)  # nobody holds them now
    assert why is None and rotated.files == (paths[0].name,)


def test_without_rotate_nothing_is_deleted_and_the_answer_says_why(tmp_path: Path) -> None:
    paths = write_archives(tmp_path, 3)
    size = paths[0].stat().st_size
    keeper = retention(tmp_path, cap=3 * size, rotate=False)
    why, rotated = keeper.make_room(size, size, writing=None)
    assert why is not None and "archive.max_total_bytes" in why
    assert rotated.files == () and archive_files(tmp_path) == paths
    assert keeper.make_room(0, 0, writing=None)[0] is None


def test_a_nearly_full_disk_rotates_old_files_out_too(tmp_path: Path) -> None:
    paths = write_archives(tmp_path, 3)
    size = paths[0].stat().st_size
    disk = {"free": size // 2}

    def free(_: Path) -> int:  # the disk frees what the deleted files held
        return disk["free"] + size * sum(not p.exists() for p in paths)

    keeper = ArchiveRetention(
        tmp_path, max_total_bytes=1 << 40, reserve_bytes=size, rotate=True, free_bytes=free
    )
    why, rotated = keeper.make_room(size // 4, size // 4, writing=None)
    assert why is None and rotated.files == (paths[0].name,)
    keeper = ArchiveRetention(
        tmp_path, max_total_bytes=1 << 40, reserve_bytes=size, rotate=False, free_bytes=free
    )
    why, _ = keeper.make_room(10 * size, 10 * size, writing=None)
    assert why is not None and "free on the archive's disk" in why
