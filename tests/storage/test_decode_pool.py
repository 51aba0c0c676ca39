"""Archive segments decoded in worker processes (storage/decode_pool.py): the same bits as
the in-process reader, errors named, workers and shared memory cleaned up."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from navrl_daemon.errors import DataError
from navrl_daemon.storage.archive import (
    ArchiveFile,
    ArchiveWriter,
    Schema,
    archive_name,
    encode_segments,
)
from navrl_daemon.storage.decode_pool import DecodePool
from navrl_daemon.storage.episode_store import ArchiveReader


def rollout(seed: int, envs: int = 6, steps: int = 9) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs/lidar": rng.random((envs, steps, 1, 36, 4), dtype=np.float32),
        "obs/tag": (seed * 1000 + np.arange(envs * steps)).reshape(envs, steps, 1),
        "done": rng.random((envs, steps, 1)) < 0.2,
    }


@pytest.fixture
def archives(tmp_path: Path) -> list[Path]:
    """A format-1 file (shuffled) and a format-2 file: a directory across an upgrade."""
    paths = []
    for i, schema_args in enumerate([{"version": 1, "default_filter": "shuffle"}, {}]):
        path = tmp_path / archive_name(i)
        schema = Schema.for_rollout(rollout(0), **schema_args)  # type: ignore[arg-type]
        writer = ArchiveWriter(path, schema)
        for r in range(2):
            arrays = rollout(10 * i + r)
            writer.append(encode_segments(schema, arrays, range(6), iteration=r, policy_version=r))
        writer.close()
        paths.append(path)
    return paths


def same(a: object, b: object) -> bool:
    return all(
        (x.numpy().tobytes(), x.dtype, x.shape) == (y.numpy().tobytes(), y.dtype, y.shape)
        for x, y in zip(a.values(True, True), b.values(True, True), strict=True)  # type: ignore[attr-defined]
    )


@pytest.mark.parametrize("cache_bytes", [0, 1 << 20])
def test_processes_sample_the_same_bits_as_threads(archives: list[Path], cache_bytes: int) -> None:
    with (
        ArchiveReader(archives, workers=1, cache_bytes=0) as threads,
        ArchiveReader(archives, workers=2, cache_bytes=cache_bytes, processes=True) as procs,
    ):
        assert procs.frames == threads.frames == 4 * 6 * 9
        for seed in range(4):  # later batches overwrite the arena earlier ones came from
            a, b = np.random.default_rng(seed), np.random.default_rng(seed)
            assert same(procs.sample(64, a), threads.sample(64, b))
            assert same(procs.windows(8, 4, a), threads.windows(8, 4, b))
        whole = procs.segment(7)
        procs.sample(64, np.random.default_rng(9))  # must not change a segment handed out
        assert same(whole, threads.segment(7))


def test_a_corrupt_segment_is_a_data_error_naming_file_and_segment(archives: list[Path]) -> None:
    with h5py.File(archives[1], "r") as f:
        start = f["segments"].id.get_chunk_info(0).byte_offset
    data = bytearray(archives[1].read_bytes())
    data[start + 20] ^= 0xFF
    archives[1].write_bytes(bytes(data))
    with ArchiveReader(archives, workers=2, cache_bytes=0, processes=True) as reader:
        with pytest.raises(DataError, match=rf"{archives[1]}: segment 0 packed blob: checksum"):
            reader.gather(np.arange(reader.frames))
        # The workers live on: the good file still reads.
        assert reader.gather(np.arange(54)).batch_size[0] == 54


def test_a_dead_worker_is_reported_and_close_cleans_up(archives: list[Path]) -> None:
    with ArchiveFile.open(archives[1]) as f:
        layout = f.schema.layout
    pool = DecodePool(archives, 2)
    try:
        (first,) = pool.decode([(1, 0, 9)], layout)
        arena = pool._arena
        assert arena is not None and os.path.exists(f"/dev/shm/{arena.name}")
        del first
        os.kill(pool.pids[1], signal.SIGKILL)
        time.sleep(0.2)
        with pytest.raises(RuntimeError, match=r"decode worker 1 \(pid \d+\) exited"):
            pool.decode([(1, s, 9) for s in range(12)], layout)
        assert not os.path.exists(f"/dev/shm/{arena.name}")  # the failure closed the pool
        assert all(not os.path.exists(f"/proc/{pid}") for pid in pool.pids)
    finally:
        pool.close()


def test_an_unreadable_file_stops_the_start_with_a_data_error(tmp_path: Path) -> None:
    bad = tmp_path / archive_name(0)
    bad.write_bytes(b"not an archive" * 100)
    with pytest.raises(DataError, match=str(bad)):
        DecodePool([bad], 1)
