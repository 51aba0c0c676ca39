"""RolloutArchiver stage: real leases from a real pool, real files on disk."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import anyio
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from navrl_daemon.config import ArchiveConfig, ConfigError, load_config
from navrl_daemon.rl.training import Training
from navrl_daemon.runtime.leases import Lease, LeasePool
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.stages.archiver import RolloutArchiver, archive_channel
from navrl_daemon.storage.archive import ArchiveFile, archive_files
from navrl_daemon.storage.episode_store import rollout_arrays
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
) -> tuple[RolloutArchiver, list[tuple[int, int, int]], dict[int, dict[str, np.ndarray]]]:
    """Produce `rollouts` leases through the archive channel into a RolloutArchiver."""
    written: list[tuple[int, int, int]] = []
    expected: dict[int, dict[str, np.ndarray]] = {}
    channel = archive_channel(cfg, on_dropped=lambda n: None)
    sender = channel.sender()
    archiver = RolloutArchiver(
        cfg,
        directory,
        channel.receiver(),
        shutdown=Shutdown(),
        on_written=lambda *a: written.append(a),
    )

    async def produce() -> None:
        async with sender:
            for iteration in range(rollouts):
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


@pytest.mark.anyio
async def test_rotates_files_and_removes_the_oldest_past_the_total_cap(tmp_path: Path) -> None:
    mib = 1 << 20
    cfg = ArchiveConfig(
        interval=1, max_file_bytes=mib, max_total_bytes=3 * mib, workers=2, on_full="block"
    )
    pool = LeasePool([random_rollout(), random_rollout()])

    def fill(buffer: TensorDict, iteration: int) -> None:
        buffer.update_(random_rollout())

    await run_archiver(cfg, tmp_path, pool, 6, fill)
    files = archive_files(tmp_path)
    assert sum(p.stat().st_size for p in files) <= 3 * mib
    assert [p.name for p in files] == [f"rollouts-{i:06d}.h5" for i in range(6 - len(files), 6)]
    for p in files:  # one rollout per file: each pushed its file past 1 MiB
        with ArchiveFile.open(p) as f:
            assert f.complete and set(f.rows["iteration"].tolist()) == {int(p.stem[-6:])}
    # A new archiver on the same directory continues the numbering.
    await run_archiver(cfg, tmp_path, pool, 1, fill)
    assert archive_files(tmp_path)[-1].name == "rollouts-000006.h5"


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
