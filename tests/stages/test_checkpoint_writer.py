"""CheckpointWriter on real files: coalescing, failures that training survives, retention."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import structlog
import torch

from navrl_daemon.config import CheckpointConfig
from navrl_daemon.pipeline.messages import Snapshot
from navrl_daemon.runtime.channels import Channel, Overflow
from navrl_daemon.stages.checkpoint_writer import CheckpointWriter
from navrl_daemon.storage.checkpoint import CheckpointDir, load_checkpoint
from navrl_daemon.storage.staging import SnapshotStaging


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Harness:
    def __init__(self, path: Path, **cfg: int) -> None:
        self.staging = SnapshotStaging(8)
        self.channel: Channel[Snapshot] = Channel(
            "snapshots",
            cfg.pop("queue_size", 2),
            Overflow.DROP_OLDEST,
            on_drop=lambda s: s.staged.release(),
        )
        self.sender = self.channel.sender()
        self.written: list[tuple[float, int, int]] = []
        self.failed = 0
        self.writer = CheckpointWriter(
            self.channel.receiver(),
            CheckpointDir(path),
            CheckpointConfig(**cfg),
            meta={},
            on_written=lambda *a: self.written.append(a),
            on_failed=self._failed,
        )

    def _failed(self) -> None:
        self.failed += 1

    def snapshot(self, iteration: int, value: float = 0.0) -> Snapshot:
        staged = self.staging.stage({"w": torch.full((1000,), value), "it": iteration})
        return Snapshot(iteration, iteration * 10, staged)


@pytest.mark.anyio
async def test_a_full_queue_drops_the_oldest_never_the_newest(tmp_path: Path) -> None:
    h = Harness(tmp_path, queue_size=2)
    for it in range(1, 6):  # the writer is not running yet: a disk that is very slow
        assert await h.sender.send(h.snapshot(it))
    h.sender.close()
    await h.writer.run()
    files = [p.name for p in CheckpointDir(tmp_path).files()]
    assert files == ["ckpt-000000004.nrc", "ckpt-000000005.nrc"]
    assert h.channel.stats.dropped == 3
    assert h.staging.slots_in_use == 0  # dropped and written snapshots gave their slots back
    assert [w[1] > 0 for w in h.written] == [True, True]


@pytest.mark.anyio
async def test_a_failed_write_is_counted_and_the_next_one_succeeds(tmp_path: Path) -> None:
    blocker = tmp_path / "checkpoints"
    blocker.write_text("a file where the checkpoint directory should be")
    h = Harness(blocker)
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.writer.run)
        await h.sender.send(h.snapshot(1))
        with anyio.fail_after(10):
            while h.failed == 0:
                await anyio.sleep(0.01)
        blocker.unlink()  # the operator frees the path; the next interval retries
        await h.sender.send(h.snapshot(2, value=2.0))
        h.sender.close()
    assert (h.failed, h.writer.failures, len(h.written)) == (1, 1, 1)
    header, state = load_checkpoint(blocker / "ckpt-000000002.nrc")
    assert header.iteration == 2 and torch.equal(state["w"], torch.full((1000,), 2.0))
    assert h.staging.slots_in_use == 0


@pytest.mark.anyio
async def test_a_non_finite_snapshot_is_never_written(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.sender.send(h.snapshot(1, value=float("nan")))
    await h.sender.send(h.snapshot(2, value=1.0))
    h.sender.close()
    await h.writer.run()
    assert h.failed == 1
    assert [p.name for p in CheckpointDir(tmp_path).files()] == ["ckpt-000000002.nrc"]


@pytest.mark.anyio
async def test_keep_last_and_keep_best_by_eval_reach_goal(tmp_path: Path) -> None:
    h = Harness(tmp_path, keep_last=2, keep_best=1, queue_size=16)
    h.writer.record_eval(2, 0.9)
    h.writer.record_eval(4, 0.3)
    h.writer.record_eval(6, 0.5)
    for it in range(1, 9):
        await h.sender.send(h.snapshot(it))
    h.sender.close()
    await h.writer.run()
    kept = [p.name for p in CheckpointDir(tmp_path).files()]
    assert kept == ["ckpt-000000002.nrc", "ckpt-000000007.nrc", "ckpt-000000008.nrc"]


@pytest.mark.anyio
async def test_keep_every_keeps_milestones_beside_keep_last(tmp_path: Path) -> None:
    h = Harness(tmp_path, interval=2, keep_last=1, keep_best=0, keep_every=4, queue_size=16)
    for it in range(2, 15, 2):
        await h.sender.send(h.snapshot(it))
    h.sender.close()
    await h.writer.run()
    kept = [p.name for p in CheckpointDir(tmp_path).files()]
    assert kept == [f"ckpt-{it:09d}.nrc" for it in (4, 8, 12, 14)]


@pytest.mark.anyio
async def test_flush_writes_what_run_left_in_the_queue(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.sender.send(h.snapshot(3))
    await h.writer.flush(deadline=float("inf"))  # run was cancelled before it got there
    assert [p.name for p in CheckpointDir(tmp_path).files()] == ["ckpt-000000003.nrc"]


@pytest.mark.anyio
async def test_scores_stay_as_few_as_the_files_that_can_use_them(tmp_path: Path) -> None:
    """A week of evaluations must not pile up in memory: only the scores of kept files and
    of iterations not written yet stay, and keep_best still finds the best file."""
    h = Harness(tmp_path, keep_last=2, keep_best=1, queue_size=64)
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.writer.run)
        for it in range(1, 201):
            h.writer.record_eval(it, 0.99 if it == 30 else it / 1000)  # 30 is the best
            h.writer.record_eval(it + 1, 0.0)  # an evaluation that lands before its file
            await h.sender.send(h.snapshot(it))
            with anyio.fail_after(30):
                while not (tmp_path / f"ckpt-{it:09d}.nrc").exists():
                    await anyio.sleep(0.005)
        h.sender.close()
    kept = [p.name for p in CheckpointDir(tmp_path).files()]
    assert kept == ["ckpt-000000030.nrc", "ckpt-000000199.nrc", "ckpt-000000200.nrc"]
    assert sorted(h.writer.scores) == [30, 199, 200, 201]


@pytest.mark.anyio
async def test_one_log_line_per_checkpoint_names_the_files_it_replaced(tmp_path: Path) -> None:
    h = Harness(tmp_path, keep_last=1, queue_size=8)
    with structlog.testing.capture_logs() as logs:
        for it in (1, 2):
            await h.sender.send(h.snapshot(it))
        h.sender.close()
        await h.writer.run()
    assert [e["event"] for e in logs] == ["checkpoint written", "checkpoint written"]
    assert "removed" not in logs[0] and logs[1]["removed"] == ["ckpt-000000001.nrc"]
