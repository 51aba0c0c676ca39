"""RolloutArchiver stage: real leases from a real pool, real files on disk."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import anyio
import h5py
import numpy as np
import pytest
import structlog
import torch
from tensordict import TensorDict

from navrl_daemon.config import ArchiveConfig, ConfigError, load_config
from navrl_daemon.ops.metrics import Metrics
from navrl_daemon.rl.training import Training
from navrl_daemon.runtime.leases import Lease, LeasePool
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.stages.archiver import ArchiverEvents, RolloutArchiver, archive_channel
from navrl_daemon.storage.archive import ArchiveFile, archive_files
from navrl_daemon.storage.episode_store import ArchiveReader, rollout_arrays
from tests.conftest import TINY


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def random_rollout(num_envs: int = 4, steps: int = 8, width: int = 8192) -> TensorDict:
    """Incompressible: 1 MiB of random floats per rollout at the defaults."""
    return TensorDict(
        {
            "obs": {"x": torch.rand(num_envs, steps, width)},
            "done": torch.zeros(num_envs, steps, 1, dtype=torch.bool),
        },
        batch_size=[num_envs, steps],
    )


async def run_archiver(
    cfg: ArchiveConfig,
    directory: Path,
    pool: LeasePool,
    rollouts: int,
    fill: Callable[[TensorDict, int], None],
    sent: list[Lease] | None = None,
    metrics: Metrics | None = None,
    first: int = 0,
) -> tuple[RolloutArchiver, list[tuple[int, int, int]], dict[int, dict[str, np.ndarray]]]:
    """Produce `rollouts` leases (iterations from `first`) through the archive channel into
    a RolloutArchiver. A later archiver on the same directory goes on from the iteration
    after the last one archived: the ones up to it count as archived before a restart."""
    written: list[tuple[int, int, int]] = []
    expected: dict[int, dict[str, np.ndarray]] = {}
    metrics = metrics or Metrics(version="0", torch_version="0", device="cpu")
    channel = archive_channel(cfg, on_dropped=metrics.archive_dropped)
    sender = channel.sender()
    archiver = RolloutArchiver(
        cfg,
        directory,
        channel.receiver(),
        shutdown=Shutdown(),
        events=ArchiverEvents(
            on_written=lambda *a: written.append(a),
            on_failed=metrics.archive_dropped,
            on_rotated=metrics.archive_rotated,
            on_usage=metrics.archive_usage,
        ),
    )

    async def produce() -> None:
        async with sender:
            for iteration in range(first, first + rollouts):
                lease = await pool.acquire()
                fill(lease.buffer, iteration)
                lease.meta.update(iteration=iteration, policy_version=100 + iteration)
                expected[iteration] = rollout_arrays(lease.buffer, copy=True)
                if sent is not None:
                    sent.append(lease)
                await sender.send(lease)

    async with anyio.create_task_group() as tg:
        tg.start_soon(produce)
        tg.start_soon(archiver.run)
    await archiver.flush(math.inf)
    return archiver, written, expected


@pytest.mark.anyio
@pytest.mark.parametrize("file_format", [1, 2])
async def test_archives_every_interval_th_real_rollout_bit_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_format: int
) -> None:
    training = Training.build(load_config(None, [*TINY, "env.num_obstacles=30"]), "cpu")
    pool = LeasePool([training.buffer])  # one buffer: nothing moves unless leases come back
    cfg = ArchiveConfig(interval=2, workers=2, on_full="block", format=file_format)
    sent: list[Lease] = []
    released_before_compression: list[bool] = []

    def fill(buffer: TensorDict, iteration: int) -> None:
        training.collector.collect(buffer)

    original = RolloutArchiver._archive

    def spy(self: RolloutArchiver, arrays: dict, iteration: int, version: int) -> tuple:
        released_before_compression.append(sent[iteration].released)
        return original(self, arrays, iteration, version)

    monkeypatch.setattr(RolloutArchiver, "_archive", spy)  # records, then does the real work
    archiver, written, expected = await run_archiver(cfg, tmp_path, pool, 5, fill, sent)

    # Every lease handed to the archiver was back before it began compressing.
    assert released_before_compression == [True, True, True]
    assert pool.free == 1 and archiver.archived == 3
    (path,) = archive_files(tmp_path)
    n = training.buffer.batch_size[0]
    with ArchiveFile.open(path) as f:
        assert f.complete and f.schema.version == file_format
        assert f.rows["iteration"].tolist() == [i for i in (0, 2, 4) for _ in range(n)]
        assert f.rows["policy_version"].tolist() == [100 + i for i in (0, 2, 4) for _ in range(n)]
        for s in range(f.segments):
            source = expected[int(f.rows["iteration"][s])]
            decoded = f.segment(s)
            assert decoded.keys() == source.keys()
            for key, array in source.items():
                assert decoded[key].tobytes() == array[s % n].tobytes(), key
        assert [w[2] for w in written] == [n, n, n]
        assert sum(w[0] for w in written) == int(f.rows["raw_bytes"].sum())
        assert sum(w[1] for w in written) == int(f.rows["stored_bytes"].sum())


def fill_random(buffer: TensorDict, iteration: int) -> None:
    buffer.update_(random_rollout())


def sample(m: Metrics, name: str) -> float:
    found = m.registry.get_sample_value(name)
    assert found is not None, name
    return found


@pytest.mark.anyio
async def test_rotate_keeps_the_newest_files_under_the_total_cap(tmp_path: Path) -> None:
    mib = 1 << 20
    cfg = ArchiveConfig(
        interval=1,
        max_file_bytes=mib,
        max_total_bytes=3 * mib,
        workers=2,
        on_full="rotate",
        queue_size=2,  # as many as the pool's buffers: the queue never drops one
    )
    pool = LeasePool([random_rollout(), random_rollout()])
    m = Metrics(version="0", torch_version="0", device="cpu")
    archiver, written, _ = await run_archiver(cfg, tmp_path, pool, 6, fill_random, metrics=m)
    files = archive_files(tmp_path)
    assert sum(p.stat().st_size for p in files) <= 3 * mib
    assert [p.name for p in files] == [f"rollouts-{i:06d}.h5" for i in range(6 - len(files), 6)]
    for p in files:  # one rollout per file: each pushed its file past 1 MiB
        with ArchiveFile.open(p) as f:
            assert f.complete and set(f.rows["iteration"].tolist()) == {int(p.stem[-6:])}
    assert archiver.archived == 6 and len(written) == 6  # every rollout made it in
    rotated = 6 - len(files)
    assert sample(m, "navrl_archive_rotated_files_total") == rotated >= 3
    assert sample(m, "navrl_archive_rotated_bytes_total") == archiver.retention.rotated_bytes
    assert sample(m, "navrl_archive_files") == len(files)
    assert sample(m, "navrl_archive_disk_bytes") == sum(p.stat().st_size for p in files)
    assert sample(m, "navrl_archive_dropped_total") == 0
    # A new archiver on the same directory continues the numbering.
    await run_archiver(cfg, tmp_path, pool, 1, fill_random, first=6)
    assert archive_files(tmp_path)[-1].name == "rollouts-000006.h5"


@pytest.mark.anyio
@pytest.mark.parametrize("on_full", ["drop", "block"])
async def test_drop_and_block_never_delete_and_skip_what_does_not_fit(
    tmp_path: Path, on_full: str
) -> None:
    mib = 1 << 20
    cfg = ArchiveConfig(
        interval=1,
        max_file_bytes=mib,
        max_total_bytes=3 * mib,
        workers=2,
        on_full=on_full,
        queue_size=2,
    )
    pool = LeasePool([random_rollout(), random_rollout()])
    m = Metrics(version="0", torch_version="0", device="cpu")
    with structlog.testing.capture_logs() as logs:
        archiver, _, _ = await run_archiver(cfg, tmp_path, pool, 6, fill_random, metrics=m)
    files = archive_files(tmp_path)
    assert [p.name for p in files] == [f"rollouts-{i:06d}.h5" for i in range(len(files))]
    assert sum(p.stat().st_size for p in files) <= 3 * mib
    assert archiver.archived == len(files) == 2  # the oldest kept; the rest skipped
    assert sample(m, "navrl_archive_dropped_total") == 4
    assert sample(m, "navrl_archive_rotated_files_total") == 0
    full = [e for e in logs if e["event"].startswith("archive full")]
    assert len(full) == 1 and "max_total_bytes" in full[0]["reason"]  # said once, not 4 times


@pytest.mark.anyio
async def test_rotation_skips_the_files_a_reader_holds(tmp_path: Path) -> None:
    """The prefetcher (any ArchiveFile reader) holds its files open: rotation deletes
    around them, and the reader goes on reading every segment it indexed."""
    mib = 1 << 20
    cfg = ArchiveConfig(
        interval=1,
        max_file_bytes=mib,
        max_total_bytes=4 * mib,
        workers=2,
        on_full="rotate",
        queue_size=2,
    )
    pool = LeasePool([random_rollout(), random_rollout()])
    await run_archiver(cfg, tmp_path, pool, 2, fill_random)
    held = archive_files(tmp_path)
    assert [p.name for p in held] == ["rollouts-000000.h5", "rollouts-000001.h5"]
    with ArchiveReader(held, workers=1) as reader:
        await run_archiver(cfg, tmp_path, pool, 6, fill_random, first=2)
        names = [p.name for p in archive_files(tmp_path)]
        assert names[:2] == ["rollouts-000000.h5", "rollouts-000001.h5"]  # still there
        assert names[-1] == "rollouts-000007.h5" and len(names) < 8  # newer ones rotated
        for f in reader.files:
            f.verify()


@pytest.mark.anyio
async def test_a_restart_archives_on_past_an_index_row_that_fails_its_checksum(
    tmp_path: Path,
) -> None:
    """One high bit flipped in the newest file's last index row: the restart used to take
    2**40 + 2 for the last archived rollout, call every later one "already archived" and
    archive nothing more. The bad row is left out, said in the log, and archiving goes on
    after the last rollout the trusted rows hold."""
    cfg = ArchiveConfig(interval=1, on_full="block", queue_size=1)
    pool = LeasePool([random_rollout()])
    await run_archiver(cfg, tmp_path, pool, 3, fill_random)  # rollouts 0..2, 4 envs each
    (first,) = archive_files(tmp_path)
    with h5py.File(first, "r+") as f:
        f["index/iteration"][11] ^= 1 << 40
    with structlog.testing.capture_logs() as logs:
        archiver, _, _ = await run_archiver(cfg, tmp_path, pool, 4, fill_random, first=1)
    damaged = [e for e in logs if e["event"].startswith("archive damaged")]
    assert len(damaged) == 1 and f"archive {first}: index row 11 (iteration" in damaged[0]["error"]
    start = next(e for e in logs if e["event"].startswith("archive holds rollouts"))
    assert start["archived_through"] == 2
    assert archiver.archived == 2  # rollouts 3 and 4; 1 and 2 were archived before
    with ArchiveFile.open(archive_files(tmp_path)[-1]) as f:
        assert sorted(set(f.rows["iteration"].tolist())) == [3, 4]


@pytest.mark.anyio
async def test_full_drop_queue_releases_and_counts_only_due_rollouts() -> None:
    cfg = ArchiveConfig(interval=2, on_full="drop", queue_size=1)
    dropped: list[int] = []
    channel = archive_channel(cfg, on_dropped=dropped.append)
    pool = LeasePool([random_rollout(1, 1, 1) for _ in range(3)])
    async with channel.sender() as sender, channel.receiver() as receiver:
        for iteration in range(3):
            lease = await pool.acquire()
            lease.meta.update(iteration=iteration, policy_version=0)
            await sender.send(lease)
        assert dropped == [1]  # iteration 2 (due) counted, iteration 1 (not due) not
        assert pool.free == 2  # both dropped leases went back to the pool
        receiver.receive_nowait().release()
    assert pool.free == 3


@pytest.mark.anyio
async def test_after_abort_leases_are_released_without_archiving(tmp_path: Path) -> None:
    cfg = ArchiveConfig(interval=1, on_full="block")
    channel = archive_channel(cfg, on_dropped=lambda n: None)
    pool = LeasePool([random_rollout(2, 2, 2)])
    shutdown = Shutdown()
    shutdown.abort.set()
    archiver = RolloutArchiver(cfg, tmp_path, channel.receiver(), shutdown=shutdown)
    async with anyio.create_task_group() as tg:
        tg.start_soon(archiver.run)
        async with channel.sender() as sender:
            for iteration in range(3):
                lease = await pool.acquire()  # only possible once the last one came back
                lease.meta.update(iteration=iteration, policy_version=0)
                await sender.send(lease)
    await archiver.flush(math.inf)
    assert pool.free == 1 and archiver.archived == 0 and archive_files(tmp_path) == []


def test_config_rejects_inconsistent_archive_settings() -> None:
    with pytest.raises(ConfigError, match="delta filters"):
        load_config(None, ["archive.mode=frame", 'archive.key_filters=["*/lidar=delta"]'])
    with pytest.raises(ConfigError, match="max_total_bytes"):
        load_config(None, ["archive.max_file_bytes=4000000", "archive.max_total_bytes=2000000"])
    with pytest.raises(ConfigError, match=r"archive.key_filters\[0\]"):
        load_config(None, ['archive.key_filters=["lidar"]'])
    with pytest.raises(ConfigError, match=r"archive\.format"):
        load_config(None, ["archive.format=3"])
    assert load_config(None, ["archive.format=1"]).archive.format == 1
    assert load_config(None, ["archive.interval=5"]).archive.interval == 5
